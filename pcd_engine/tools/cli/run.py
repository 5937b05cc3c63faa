"""``pcd run``: fill in a schema from one text and print the values with their evidence."""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, Any

from pcd_engine.errors import OptionError
from pcd_engine.run.admission import check_text
from pcd_engine.tools.cli import common
from pcd_engine.tools.terminal import (
    RESULT_COLUMNS,
    read_json,
    read_preset,
    read_text,
    result_rows,
    shorten,
    show_table,
)

if TYPE_CHECKING:
    pass


__all__ = ["add", "cmd_run"]


def add(sub: Any) -> None:
    p = sub.add_parser("run", help="fill in a schema from a text and print values with probabilities")
    common.with_model(p)
    p.add_argument("positional_preset", nargs="?", metavar="PRESET", help="deprecated: use --preset PRESET")
    p.add_argument("--preset", metavar="PRESET", help="example preset name or preset .json file (instead of --schema)")
    p.add_argument("--schema", metavar="S.json", help="JSON Schema or preset dict (instead of --preset)")
    p.add_argument("--context", metavar="C.txt", help="the text to read ('-' for stdin)")
    p.add_argument("--text", help="the text itself")
    p.add_argument("--json", action="store_true", help="print the full result as JSON")
    common.with_decoding(p)
    p.set_defaults(func=cmd_run)


def cmd_run(args: argparse.Namespace) -> int:
    if args.positional_preset is not None:
        if args.preset is not None:
            raise OptionError(
                f"pcd run: expected one preset, but got {args.positional_preset!r} and --preset {args.preset!r}."
            )
        print("pcd run: note: PRESET as a positional argument is deprecated; use --preset PRESET, as pcd tag, "
              "calibrate and fit take it.", file=sys.stderr)  # fmt: skip
        args.preset = args.positional_preset
    if args.preset and args.schema:
        raise OptionError("pcd run: expected either --preset or --schema, but got both.")
    if args.preset:
        _, preset = read_preset(args.preset)
        schema, text = preset.schema, preset.context
    elif args.schema:
        from pcd_engine.schema import compile_schema

        schema, text = compile_schema(read_json(args.schema, "Schema")), None
    else:
        raise OptionError("pcd run: expected --preset PRESET or --schema S.json, but got neither.")
    if args.context is not None:
        text = read_text(args.context, "Context")
    elif args.text is not None:
        text = args.text
    if text is None:
        raise OptionError("pcd run: expected --context C.txt or --text TEXT (the schema has no example text).")

    check_text(text)  # before the model loads, as the options are
    options = common.extract_options(args)
    engine = common.load_engine(args)
    out = engine.extract(text, schema, options)
    if args.json:
        print(json.dumps(out.to_json(), indent=2, ensure_ascii=False))
        return 0
    print(f"text: {shorten(text)}\n")
    show_table(RESULT_COLUMNS, result_rows(out))
    s = out.stats
    print(
        f"\n{len(out.fields)} fields, {s.forward_passes} forward passes, {s.waves} waves, {s.prompt_tokens} prompt "
        f"tokens ({s.cached_tokens} cached), {s.phases_ms['total']:.0f} ms; {common.describe(engine)}"
    )
    for warning in out.warnings:
        print(f"warning: {warning}")
    return 0
