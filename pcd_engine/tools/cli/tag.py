"""``pcd tag``: tag a corpus into a table, resumably, in-process or on Ray Data."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pcd_engine.calibrate.calibrator import CALIBRATION_METHODS
from pcd_engine.errors import OptionError, check_count, pip_install
from pcd_engine.models.resolve import DEFAULT_MODEL
from pcd_engine.options import ExtractOptions, check_batch_size
from pcd_engine.tools.cli import common
from pcd_engine.tools.terminal import chunk_sizes, progress, read_json, read_preset

if TYPE_CHECKING:
    from pcd_engine.engine import Engine


__all__ = ["add", "cmd_tag"]


def add(sub: Any) -> None:
    p = sub.add_parser("tag", help="tag a corpus into a Parquet table, resumably; in-process or on Ray Data")
    common.with_model(p)
    p.add_argument("--schema", metavar="S.json", help="JSON Schema or preset dict")
    p.add_argument("--preset", metavar="PRESET", help="example preset name or preset .json file (instead of --schema)")
    p.add_argument(
        "--input", required=True, metavar="PATH", help="a .jsonl, .csv or .parquet file, or a folder of text files"
    )
    p.add_argument("--output", required=True, metavar="OUT.parquet", help="the table to write (resumed if there)")
    p.add_argument("--text-column", default="text", help="the column with the texts (default: text)")
    p.add_argument("--id-column", default=None, help="the column with unique ids (default: row number or file path)")
    p.add_argument("--limit", type=common.count, default=None, help="tag only the first N documents")
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
    common.with_decoding(p)
    p.set_defaults(func=cmd_tag)


def cmd_tag(args: argparse.Namespace) -> int:
    from pcd_engine.backends import select_backend
    from pcd_engine.models.resolve import resolve_model
    from pcd_engine.schema import compile_schema
    from pcd_engine.tagging.corpus import read_corpus
    from pcd_engine.tagging.job import engine_parts, run_tag_job
    from pcd_engine.tagging.output import check_output, job_identity, output_path
    from pcd_engine.tagging.table import tag_columns

    if args.preset and args.schema:
        raise OptionError("pcd tag: expected either --preset or --schema, but got both.")
    if not (args.preset or args.schema):
        raise OptionError("pcd tag: expected --schema S.json or --preset PRESET, but got neither.")
    for flag in ("part_size", "concurrency"):
        check_count(getattr(args, flag), f"pcd tag --{flag.replace('_', '-')}", optional=False)
    check_batch_size(args.batch_size)
    output_path(args.output)  # a path that cannot take the table, before anything loads or is fitted
    schema = compile_schema(read_preset(args.preset)[1].schema if args.preset else read_json(args.schema, "Schema"))
    tag_columns(schema, reserved=["id"])
    docs = read_corpus(args.input, text_column=args.text_column, id_column=args.id_column, limit=args.limit)
    options = common.extract_options(args)
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
        engine = engine or common.load_engine(args)
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
    for shares in summary.shares.values():
        mix = ", ".join(
            f"{label}: {share:.0%} ({low:.0%}-{high:.0%})"
            for label, share, low, high in zip(shares.labels, shares.shares, shares.low, shares.high, strict=True)
        )
        print(f"label shares of {shares.field!r} among {shares.documents} rows (95% interval): {mix}")
    return 0


def _tag_calibration(
    args: argparse.Namespace, schema: Any, docs: Sequence[Any], options: ExtractOptions, path: Path
) -> tuple[Engine | None, ExtractOptions]:
    """``pcd tag --calibrate N``: the calibration saved beside the output by an earlier run of the job (kept
    unless ``--overwrite``), or one fitted now on N documents sampled from the corpus (seed 0), with the engine
    loaded for it (``None`` when none was loaded)."""
    import random

    from pcd_engine.calibrate.calibrator import FIT_CHUNK, Calibrator

    if args.calibration:
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
    engine = common.load_engine(args)
    if not args.quiet:
        print(f"pcd tag: calibrating on {len(sample)} documents of the corpus first", file=sys.stderr)
    with progress(len(sample), quiet=args.quiet, unit="doc", sizes=chunk_sizes(len(sample), FIT_CHUNK)) as tick:
        cal = Calibrator.fit(
            engine, [d.text for d in sample], schema, method=args.calibrate_method, options=options,
            batch_size=args.batch_size, progress=tick,
        )  # fmt: skip
    return engine, replace(options, calibration=cal)


def _ray_runner(
    args: argparse.Namespace, schema: Any, options: ExtractOptions, *, name: str | None, backend: str
) -> Any:
    """The Ray runner, found by name among the installed ``pcd_engine.tag_runners`` (pcd_integrations registers
    it), so that the engine never imports the integrations."""
    from pcd_engine.errors import require
    from pcd_engine.tagging.job import tag_runner

    require("ray", what="pcd tag --ray", install=pip_install("ray"))
    factory = tag_runner("ray")
    return factory(
        schema, model=name, backend=backend, options=options, part_size=args.part_size, concurrency=args.concurrency,
        num_gpus=args.num_gpus, batch_size=args.batch_size, address=args.ray_address, quiet=args.quiet,
    )  # fmt: skip
