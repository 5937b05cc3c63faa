"""``pcd calibrate``: fit a calibration on unlabelled documents and save it."""

from __future__ import annotations

import argparse
import json
from typing import Any

from pcd_engine.calibrate.calibrator import CALIBRATION_METHODS
from pcd_engine.errors import OptionError
from pcd_engine.tools.cli import common
from pcd_engine.tools.cli.trust import add_trust_flags, check_trust_flags, show_thresholds, write_risk_plot
from pcd_engine.tools.terminal import chunk_sizes, progress, show_table

__all__ = ["add", "cmd_calibrate"]


def add(sub: Any) -> None:
    p = sub.add_parser("calibrate", help="fit a label-prior calibration on unlabelled documents (--input)")
    common.with_model(p)
    p.add_argument("--schema", metavar="S.json", help="JSON Schema or preset dict")
    p.add_argument("--preset", metavar="PRESET", help="example preset name or preset .json file (instead of --schema)")
    p.add_argument("--input", required=True, help="the documents: .jsonl, .csv, .parquet or a folder (as pcd tag)")
    p.add_argument("--text-column", default="text", help="the column holding the text (default: text)")
    p.add_argument("--limit", type=common.count, default=None, help="read only the first N documents")
    p.add_argument("--method", default="em", choices=CALIBRATION_METHODS, help="default: em")
    p.add_argument("--examples", default=None, metavar="LABELLED", help="labelled documents, read as pcd fit --input "
                   "reads them (a text column, a column per field): their labels set the prior the corrected answers "
                   "are aimed at, and their held-out evidence is kept for thresholds and prediction sets")  # fmt: skip
    p.add_argument("-o", "--output", required=True, metavar="CAL.json", help="where to write the calibration")
    p.add_argument("--json", action="store_true", help="print the calibration as JSON")
    add_trust_flags(p, keep=True)
    common.with_decoding(p)
    p.set_defaults(func=cmd_calibrate)


def cmd_calibrate(args: argparse.Namespace) -> int:
    from pcd_engine.calibrate.calibrator import FIT_CHUNK, Calibrator
    from pcd_engine.tagging.corpus import read_corpus
    from pcd_engine.tools.cli.fit import labelled_examples

    common.check_output(args.output)
    check_trust_flags(args)
    if args.examples is None and (args.accuracy is not None or args.risk_plot is not None):
        given = "--accuracy" if args.accuracy is not None else "--risk-plot"
        raise OptionError(f"{given}: expected --examples too (thresholds are chosen on labelled examples).")
    schema = common.read_schema(args)
    docs = read_corpus(args.input, text_column=args.text_column, limit=args.limit)
    examples = []
    if args.examples is not None:
        table = argparse.Namespace(input=args.examples, labels=None, text_column=args.text_column, field=None,
                                   limit=None, id_column=None)  # fmt: skip
        examples = labelled_examples(table, schema)
    options = common.extract_options(args)
    engine = common.load_engine(args)
    total = len(docs) + len(examples)
    with progress(total, quiet=args.quiet, unit="doc", sizes=chunk_sizes(total, FIT_CHUNK)) as tick:
        cal = Calibrator.fit(engine, [d.text for d in docs], schema, method=args.method, options=options,
                             progress=tick, examples=examples)  # fmt: skip
    if args.accuracy is not None:
        cal = cal.with_thresholds(accuracy=args.accuracy)
    path = cal.save(args.output)
    if args.json:
        print(json.dumps(cal.to_json(), indent=2, ensure_ascii=False))
        return 0
    labelled = f", {cal.examples} labelled" if cal.examples else ""
    counts = f"{args.method}, {cal.documents} documents{labelled}"
    print(f"calibration of {schema.title!r} for {engine.model_id} ({counts}): {path}")
    show_table(
        ("field", "label", "model's lean", "corrected towards"),
        [
            (f.name, json.dumps(v), f"{b:.3f}", f"{p:.3f}")
            for f in cal.fields
            for v, b, p in zip(f.labels, f.bias, f.prior, strict=True)
        ],
    )
    evidence = {f.name: f.held_out for f in cal.fields}
    show_thresholds(evidence, extra=args.accuracy)
    if args.accuracy is not None:
        kept = [f"{f.name} abstains below {f.min_probability:.3f}" for f in cal.fields if f.min_probability is not None]
        print(f"\nkept with the calibration for {args.accuracy:.0%}: " + ", ".join(kept))
    write_risk_plot(args, evidence, title=f"Calibration of {schema.title!r}, held-out examples ({engine.model_id})")
    return 0
