"""``pcd bench``: pcd against the model writing the JSON (plain and under outlines)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from pcd_engine.tools.cli import common
from pcd_engine.tools.examples import EXAMPLE_PRESETS
from pcd_engine.tools.terminal import progress, read_preset, show_table, versions, write_json

if TYPE_CHECKING:
    pass


__all__ = ["add", "cmd_bench"]


def add(sub: Any) -> None:
    p = sub.add_parser("bench", help="time pcd against autoregressive generation and outlines")
    common.with_model(p)
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


def _measured(row: Any) -> None:
    """A preset's figures as soon as they are measured, on one line (the table follows when every preset is done)."""
    others = "".join(f"; {b.method} {b.ms:.0f} ms ({b.speedup:.1f}x slower)" for b in row.baselines)
    print(f"{row.preset}: pcd {row.pcd_ms:.0f} ms in {row.passes} passes{others}", flush=True)


def cmd_bench(args: argparse.Namespace) -> int:
    from pcd_engine.tools.bench import bench_presets
    from pcd_engine.tools.comparators import parse_against

    against = parse_against(args.against)
    presets = [read_preset(ref) for ref in args.presets]
    engine = common.load_engine(args)
    steps = len(presets) * (1 + len(against) + ("ar" in against))
    with progress(steps, quiet=args.quiet) as tick:
        rows = bench_presets(engine, presets, against=against, repeats=args.repeats, progress=tick, on_row=_measured)
    print()
    print(f"model: {args.model}; {common.describe(engine)}; medians of {args.repeats}")
    print(versions() + "\n")
    columns = ["preset", "fields", "pcd ms", "passes", "nodes (saved)", "pcd 1-wave ms", "unstaged ms", "no drafts ms"]
    columns += ["tokens/step (accepted)"]
    for method in against:
        columns += [f"{method} ms", f"{method} tokens", f"{method} valid", f"{method} agree", f"speed-up vs {method}"]
    if "ar" in against:
        columns += ["full-answer AR ms", "speed-up vs full-answer AR"]
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
    show_table(columns, rows_out)
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
