"""``pcd calibrate``: fit a calibration on unlabelled documents and save it."""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING, Any

from pcd_engine.calibrate.calibrator import CALIBRATION_METHODS
from pcd_engine.tools.cli import common
from pcd_engine.tools.terminal import chunk_sizes, progress, show_table

if TYPE_CHECKING:
    pass


__all__ = ["add", "cmd_calibrate"]


def add(sub: Any) -> None:
    p = sub.add_parser("calibrate", help="fit a label-prior calibration on unlabelled documents (--input)")
    common.with_model(p)
    p.add_argument("--schema", metavar="S.json", help="JSON Schema or preset dict")
    p.add_argument("--preset", metavar="PRESET", help="example preset name or preset .json file (instead of --schema)")
    p.add_argument("--input", required=True, help="the documents: .jsonl, .csv, .parquet or a folder (as pcd tag)")
    p.add_argument("--text-column", default="text", help="the column holding the text (default: text)")
    p.add_argument("--limit", type=int, default=None, help="read only the first N documents")
    p.add_argument("--method", default="em", choices=CALIBRATION_METHODS, help="default: em")
    p.add_argument("-o", "--output", required=True, metavar="CAL.json", help="where to write the calibration")
    p.add_argument("--json", action="store_true", help="print the calibration as JSON")
    common.with_decoding(p)
    p.set_defaults(func=cmd_calibrate)


def cmd_calibrate(args: argparse.Namespace) -> int:
    from pcd_engine.calibrate.calibrator import FIT_CHUNK, Calibrator
    from pcd_engine.tagging.corpus import read_corpus

    schema = common.read_schema(args)
    docs = read_corpus(args.input, text_column=args.text_column, limit=args.limit)
    options = common.extract_options(args)
    engine = common.load_engine(args)
    with progress(len(docs), quiet=args.quiet, unit="doc", sizes=chunk_sizes(len(docs), FIT_CHUNK)) as tick:
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
