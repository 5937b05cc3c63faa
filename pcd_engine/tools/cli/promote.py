"""``pcd promote``: replace a served head with its shadow candidate only when the outcomes say it is better.

Reads the requests a ``pcd serve --head NAME=LIVE --shadow NAME=CANDIDATE --log LOG`` server logged with both heads'
decisions and that got outcomes, reports the candidate against the live head per field (accuracy, macro-F1, ECE, the
gain with a 95% paired bootstrap interval; :mod:`pcd_engine.heads.promotion`), and writes the candidate over the
live head's file only when it is better, saying why not otherwise (exit 1). No model is loaded: both decisions are in
the log.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path
from typing import Any

from pcd_engine.errors import InputError, PCDError

__all__ = ["NotPromoted", "add", "cmd_promote"]


class NotPromoted(PCDError):
    """The candidate is not better than the live head on the logged outcomes (the message says why)."""


def add(sub: Any) -> None:
    p = sub.add_parser("promote", help="replace a served head with its shadow candidate if the outcomes favour it")
    p.add_argument("--log", required=True, metavar="LOG.jsonl", help="the pcd serve --log file")
    p.add_argument("--live", required=True, metavar="LIVE.head.json", help="the live head's file (written over)")
    p.add_argument("--candidate", required=True, metavar="CANDIDATE.head.json", help="the shadow candidate's file")
    p.add_argument("--served", default=None, metavar="NAME", help="the requests that named this served head only")
    p.add_argument("--dry-run", action="store_true", help="report, and write nothing")
    p.add_argument("-q", "--quiet", action="store_true", help="no table, only the verdict")
    p.set_defaults(func=cmd_promote)


def cmd_promote(args: argparse.Namespace) -> int:
    from pcd_engine.heads.head import Head
    from pcd_engine.heads.promotion import Shadowed, compare
    from pcd_engine.tools.serve.outcomes import shadowed_outcomes
    from pcd_engine.tools.terminal import show_table

    live, candidate = Head.load(args.live), Head.load(args.candidate)
    wanted = Path(args.candidate).resolve()
    logged = [
        Shadowed(entry.get("probabilities") or {}, entry["shadow"].get("probabilities") or {}, values)
        for entry, values in shadowed_outcomes(args.log, served=args.served)
        if Path(str(entry["shadow"].get("head", ""))).resolve() == wanted
        and (entry.get("schema") or {}).get("fingerprint") == live.schema_fingerprint
    ]
    if not logged:
        raise InputError(f"Log {args.log!r}: expected requests shadowed by {args.candidate!r} with outcomes, but "
                         "found none (serve it with --shadow NAME=FILE and --log, and post outcomes).")  # fmt: skip
    verdict = compare(live, candidate, logged)
    if not args.quiet:
        show_table(
            ("field", "outcomes", "live accuracy", "candidate accuracy", "gain, points (95% interval)",
             "live / candidate macro-F1", "live / candidate ECE"),
            [(g.field, str(g.held_out), f"{g.zero_shot.accuracy:.1%}", f"{g.head.accuracy:.1%}",
              f"{g.gain * 100:+.1f} ({g.interval[0] * 100:+.1f} to {g.interval[1] * 100:+.1f})",
              f"{g.zero_shot.macro_f1:.2f} / {g.head.macro_f1:.2f}", f"{g.zero_shot.ece:.2f} / {g.head.ece:.2f}")
             for g in verdict.gates],
        )  # fmt: skip
    if not verdict.promote:
        raise NotPromoted(f"kept {args.live}: {verdict.why}.")
    if args.dry_run:
        print(f"would promote {args.candidate} over {args.live} (--dry-run): {verdict.why}.")
        return 0
    _replace(Path(args.live), Path(args.candidate).read_bytes())
    print(f"promoted {args.candidate} over {args.live}: {verdict.why}. Restart pcd serve to serve it.")
    return 0


def _replace(path: Path, data: bytes) -> None:
    """Write ``data`` over ``path`` at once (a temporary file beside it, renamed over it): a reader never sees half
    a head."""
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
