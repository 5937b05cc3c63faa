"""``pcd eval``: accuracy on a labelled dataset, against the baselines, calibrations and corrections, with the
accuracy-coverage curve, the thresholds that reach target accuracies (with their intervals) and a risk-coverage
plot."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from pcd_engine.calibrate.calibrator import CALIBRATION_METHODS
from pcd_engine.errors import OptionError
from pcd_engine.tools.cli import common
from pcd_engine.tools.cli.trust import add_trust_flags, check_trust_flags, show_thresholds, write_risk_plot
from pcd_engine.tools.terminal import chunk_sizes, dataset_name, progress, read_json, show_table, versions, write_json

if TYPE_CHECKING:
    from pcd_engine.engine import Engine


__all__ = ["add", "cmd_eval"]


def add(sub: Any) -> None:
    p = sub.add_parser("eval", help="accuracy on labelled data against the baselines")
    common.with_model(p)
    p.add_argument(
        "dataset",
        metavar="DATASET",
        help="a JSONL file of {text, label}, a folder of label folders, bbc-news or rotten-tomatoes",
    )
    p.add_argument("--field", required=True, help="the field to decide (its labels are the dataset's)")
    p.add_argument("--schema", metavar="S.json", help="decide --field inside this schema instead")
    p.add_argument("--description", help="description of the field shown to the model")
    p.add_argument("--against", default="none", help="comma-separated baselines: ar, outlines (default: none)")
    p.add_argument("--limit", type=common.count, default=None, help="a seeded random sample of this many documents")
    p.add_argument("--seed", type=int, default=0, help="sample seed (default: 0)")
    p.add_argument("--max-chars", type=int, default=None, help="cut each document to this many characters")
    p.add_argument("--plot", metavar="OUT.png", help="write accuracy against latency")
    p.add_argument("--json", metavar="OUT.json", help="write the report with every prediction")
    add_trust_flags(p, keep=False)
    p.add_argument("--order-flips", action="store_true", help="decide again with the labels listed in reverse and "
                   "report how many answers each method changes (doubles the work)")  # fmt: skip
    p.add_argument(
        "--calibrate",
        action="store_true",
        help="also pcd calibrated on the evaluated texts (transductive) and on other documents (inductive)",
    )
    p.add_argument("--calibrate-method", default="em", choices=CALIBRATION_METHODS, help="default: em")
    p.add_argument(
        "--corrections",
        default="",
        metavar="LIST",
        help="also pcd with each of these lean corrections, comma-separated (none, batch, content_free, auto; or "
        "all; the one pcd's own row uses is not repeated)",
    )
    common.with_decoding(p)
    p.set_defaults(func=cmd_eval)


def cmd_eval(args: argparse.Namespace) -> int:
    from pcd_engine.tools.comparators import parse_against
    from pcd_engine.tools.datasets import load_dataset
    from pcd_engine.tools.eval import COVERAGE_THRESHOLDS, eval_chunk_size, eval_schema, evaluate, parse_corrections

    against = parse_against(args.against)
    if args.calibrate and args.calibration:
        raise OptionError("pcd eval: expected either --calibrate or --calibration CAL.json, but got both.")
    check_trust_flags(args)
    docs = load_dataset(args.dataset, limit=args.limit, seed=args.seed)
    given = read_json(args.schema, "Schema") if args.schema else None
    schema = eval_schema(args.field, [d.label for d in docs], description=args.description, schema=given)
    options = common.extract_options(args).set_fields()
    engine = common.load_engine(args)
    calibrations, fitted = _eval_calibrations(args, engine, docs, schema, options)
    # one step per chunk of documents decided together (the step's name says which documents)
    sizes = chunk_sizes(len(docs), eval_chunk_size(engine))
    with progress(len(docs), quiet=args.quiet, unit="doc", sizes=sizes) as tick:
        report = evaluate(
            engine, docs, schema, args.field, against=against, max_chars=args.max_chars, progress=tick,
            calibrations=calibrations, corrections=parse_corrections(args.corrections), **options,
        )  # fmt: skip
    print(f"model: {args.model}; {common.describe(engine)}; {len(docs)} documents (seed {args.seed})")
    if fitted:
        print(fitted)
    print(versions() + "\n")
    show_table(
        ("method", "accuracy", "macro-F1", "ECE", "Brier", "mean ms / doc", "invalid", "agreement with pcd"),
        [
            (
                m.method,
                f"{m.metrics.accuracy:.1%}",
                f"{m.metrics.macro_f1:.3f}",
                "-" if m.ece is None else f"{m.ece:.3f}",
                "-" if m.brier is None else f"{m.brier:.3f}",
                f"{m.mean_ms:.0f}",
                m.invalid,
                f"{m.agreement_with_pcd:.1%}",
            )
            for m in report.methods
        ],
    )
    if report.shares is not None:
        _show_shares(report.shares, report.gold)
    curves = [(m.method, report.coverage(m)) for m in report.methods if m.probabilities]
    print("\naccuracy-coverage: answering only where the probability reaches min_probability\n")
    show_table(
        ("min_probability", *(f"{name}: coverage / accuracy" for name, _ in curves)),
        [
            (
                f"{threshold:.1f}",
                *(
                    f"{c[i].coverage:.0%} / " + ("-" if c[i].accuracy is None else f"{c[i].accuracy:.1%}")
                    for _, c in curves
                ),
            )
            for i, threshold in enumerate(COVERAGE_THRESHOLDS)
        ],
    )
    evidence = {m.method: report.held_out(m) for m in report.methods if m.distributions}
    show_thresholds(evidence)
    if args.order_flips:
        _show_flips(args, engine, docs, schema, report, against, options)
    for m in report.methods:
        print(f"\nconfusion matrix, {m.method} (rows: gold, columns: predicted)\n")
        rows = [(gold, *counts) for gold, counts in zip(m.metrics.labels, m.metrics.confusion, strict=True)]
        show_table(("gold \\ predicted", *m.metrics.columns), rows)
    if args.json:
        write_json(args.json, {"model": args.model, "versions": versions(), "report": report.to_json()})
    if args.plot:
        from pcd_engine.tools.plots import plot_eval

        title = f"{args.model} ({engine.backend.name}) on {dataset_name(args.dataset)}, field {args.field!r}"
        print(f"\nplot: {plot_eval(report, args.plot, title=title)}")
    write_risk_plot(args, evidence, title=f"{args.model} on {dataset_name(args.dataset)}, field {args.field!r}")
    return 0


def _show_flips(
    args: argparse.Namespace, engine: Engine, docs: Sequence[Any], schema: Any, report: Any, against: Any,
    options: dict[str, Any],
) -> None:  # fmt: skip
    """``--order-flips``: every method (but a calibration, fitted on the schema's own order) decides again with the
    field's labels listed in reverse; print the share of documents whose answer changed."""
    from pcd_engine.run.orders import reordered
    from pcd_engine.schema import compile_schema
    from pcd_engine.tools.eval import eval_chunk_size, evaluate, parse_corrections

    back = reordered(compile_schema(schema), (True, 0))
    with progress(
        len(docs), quiet=args.quiet, unit="doc", sizes=chunk_sizes(len(docs), eval_chunk_size(engine))
    ) as tick:
        again = evaluate(engine, docs, back, args.field, against=against, max_chars=args.max_chars, progress=tick,
                         corrections=parse_corrections(args.corrections), **options)  # fmt: skip
    redone = {m.method: m.predictions for m in again.methods}
    print("\nlabel order: answers that change when the labels are listed in reverse\n")
    show_table(
        ("method, labels reversed", "answers changed"),
        [(m.method, "-" if m.method not in redone else
          f"{sum(a != b for a, b in zip(m.predictions, redone[m.method], strict=True)) / len(docs):.1%}")
         for m in report.methods],
    )  # fmt: skip


def _show_shares(shares: Any, gold: Sequence[str]) -> None:
    """Print pcd's estimate of the evaluated documents' label mix beside the gold mix."""
    print(f"\nlabel shares of {shares.field!r} among the {shares.documents} documents (pcd's estimate, EM)\n")
    show_table(
        ("label", "gold share", "estimated share", "95% interval"),
        [
            (label, f"{gold.count(str(label)) / len(gold):.1%}", f"{share:.1%}", f"{low:.1%} - {high:.1%}")
            for label, share, low, high in zip(shares.labels, shares.shares, shares.low, shares.high, strict=True)
        ],
    )


def _eval_calibrations(
    args: argparse.Namespace, engine: Engine, docs: Sequence[Any], schema: Any, options: dict[str, Any]
) -> tuple[dict[str, Any], str]:
    """``pcd eval --calibrate``: a calibrator fitted on the evaluated texts themselves (their labels unused:
    transductive) and one on as many other documents of the dataset (seed + 1: inductive), with what was done."""
    if not args.calibrate:
        return {}, ""
    import random

    from pcd_engine.calibrate.calibrator import Calibrator
    from pcd_engine.tools.datasets import load_dataset

    def fit(texts: list[str]) -> Calibrator:
        cut = [t[: args.max_chars] for t in texts]
        return Calibrator.fit(engine, cut, schema, method=args.calibrate_method, options=options)

    seen = {d.text for d in docs}
    rest = [d for d in load_dataset(args.dataset) if d.text not in seen]
    held = random.Random(args.seed + 1).sample(rest, min(len(docs), len(rest)))
    with progress(2 if held else 1, quiet=args.quiet, unit="fit") as tick:
        tick(f"calibration on the {len(docs)} evaluated texts")
        found = {"pcd calibrated (transductive)": fit([d.text for d in docs])}
        if held:
            tick(f"calibration on {len(held)} other documents")
            found["pcd calibrated (inductive)"] = fit([d.text for d in held])
    note = (
        f"calibration ({args.calibrate_method}): transductive fitted on the {len(docs)} evaluated texts, labels "
        f"unused; inductive on {len(held)} other documents of the dataset (seed {args.seed + 1})"
    )
    return found, note if held else note.split("; inductive")[0] + "; no other documents for an inductive fit"
