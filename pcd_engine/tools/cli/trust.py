"""What ``pcd fit`` and ``pcd eval`` share to say when a decision can be trusted (issue 58): the table of thresholds
for target accuracies with their coverage and interval, and the risk-coverage plot, with their flags checked before
any work."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pcd_engine.errors import InputError, OptionError, pip_install, require
from pcd_engine.heads.thresholds import HeldOut, Threshold, choose_threshold
from pcd_engine.tools.terminal import show_table

__all__ = ["TARGETS", "add_trust_flags", "check_trust_flags", "show_thresholds", "write_risk_plot"]

TARGETS = (0.9, 0.95)
"""The target accuracies the threshold table shows (besides ``--accuracy``)."""

_PLOT_SUFFIXES = (".png", ".svg", ".pdf")


def add_trust_flags(parser: Any, *, keep: bool) -> None:
    """``--risk-plot``, and with ``keep`` (``pcd fit``, ``pcd calibrate``) ``--accuracy``, which keeps the thresholds
    with what is fitted."""
    parser.add_argument("--risk-plot", default=None, metavar="PLOT.png", help="write a risk-coverage plot: the "
                        "accuracy of the answers kept against the share kept, as the threshold rises")  # fmt: skip
    if keep:
        parser.add_argument("--accuracy", type=float, default=None, metavar="A", help="keep with each field the "
                            "abstention threshold that reaches accuracy A (e.g. 0.95) on its held-out examples; "
                            "calls with what is fitted then abstain below it")  # fmt: skip


def check_trust_flags(args: argparse.Namespace) -> None:
    """Refuse bad ``--accuracy`` and ``--risk-plot`` values before any work.

    Raises:
        OptionError: If ``--accuracy`` is not in (0, 1].
        InputError: If the plot's folder does not exist or its suffix is not an image's.
        BackendUnavailableError: If a plot is asked for and matplotlib is not installed.
    """
    accuracy = getattr(args, "accuracy", None)
    if accuracy is not None and not 0 < accuracy <= 1:
        raise OptionError(f"--accuracy: expected a target accuracy in (0, 1] such as 0.95, but got {accuracy}.")
    if args.risk_plot is None:
        return
    path = Path(args.risk_plot)
    if path.is_dir() or not path.parent.is_dir() or path.suffix.lower() not in _PLOT_SUFFIXES:
        raise InputError(f"--risk-plot {args.risk_plot!r}: expected an image file ({', '.join(_PLOT_SUFFIXES)}) in "
                         "an existing folder.")  # fmt: skip
    require("matplotlib", what="--risk-plot", install=pip_install("bench"))


def show_thresholds(named: Mapping[str, HeldOut], *, extra: float | None = None) -> dict[tuple[str, float], Threshold]:
    """Print, for each reader's evidence and each target accuracy (:data:`TARGETS`, and ``extra``), the threshold
    that reaches it, its coverage and the accuracy there with its 95% interval
    (:func:`~pcd_engine.heads.thresholds.choose_threshold`); return them by (name, target)."""
    targets = sorted({*TARGETS, *([extra] if extra is not None else [])})
    found = {(name, t): choose_threshold(name, held, accuracy=t) for name, held in named.items() if held
             for t in targets}  # fmt: skip
    if not found:
        return found
    print("\nthresholds for a target accuracy (abstain below the threshold; chosen on these examples)\n")
    show_table(
        ("thresholds of", "examples", "target", "threshold", "coverage", "accuracy (95% interval)"),
        [(name, str(t.held_out), f"{target:.0%}", f"{t.probability:.3f}" if t.reached else "not reached",
          f"{t.coverage:.1%}", f"{t.achieved:.1%} ({t.interval[0]:.1%} to {t.interval[1]:.1%})")
         for (name, target), t in found.items()],
    )  # fmt: skip
    return found


def write_risk_plot(args: argparse.Namespace, named: Mapping[str, HeldOut], *, title: str) -> None:
    """With ``--risk-plot``, write the risk-coverage plot of ``named`` and say where."""
    if args.risk_plot is None:
        return
    from pcd_engine.tools.plots import plot_risk

    usable = {name: held for name, held in named.items() if held}
    if not usable:
        print("\nrisk-coverage plot: none written (no single-label field has held-out evidence)")
        return
    extra = getattr(args, "accuracy", None)
    targets = sorted({*TARGETS, *([extra] if extra is not None else [])})
    print(f"\nrisk-coverage plot: {plot_risk(usable, args.risk_plot, targets=targets, title=title)}")
