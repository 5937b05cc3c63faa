"""``pcd check``: does this model work? The conformance checks, the presets and one extraction."""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING, Any

from pcd_engine.tools.cli import common
from pcd_engine.tools.terminal import progress, show_table

if TYPE_CHECKING:
    pass


__all__ = ["add", "cmd_check"]


def add(sub: Any) -> None:
    p = sub.add_parser("check", help="does this model work? conformance checks, presets, one extraction")
    common.with_model(p)
    p.add_argument(
        "--tol", type=float, default=None, help="largest log-prob difference allowed (default: 2e-3 fp32, 0.15 else)"
    )
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(func=cmd_check)


def cmd_check(args: argparse.Namespace) -> int:
    from pcd_engine.tools.check import CHECKS, check_backend

    engine = common.load_engine(args)
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
    print(f"model: {args.model}; {common.describe(engine)}; tolerance {report.tolerance:.0e}\n")
    show_table(
        ("check", "result", "detail", "ms"),
        [(c.name, "pass" if c.passed else "FAIL", c.detail, f"{c.ms:.0f}") for c in report.checks],
    )
    print(f"\n{len(report.checks) - len(report.failures)}/{len(report.checks)} checks passed")
    return 0 if report.passed else 1
