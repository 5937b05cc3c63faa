"""Plots for ``pcd bench``, ``pcd eval`` and ``pcd fit``, drawn with matplotlib (the ``bench`` extra): the figures, and
the image files ``--plot`` and ``--risk-plot`` write."""

from __future__ import annotations

import textwrap
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pcd_engine.errors import pip_install, require

__all__ = ["bench_figure", "eval_figure", "plot_bench", "plot_eval", "plot_risk", "risk_figure"]


def _pyplot() -> Any:
    (matplotlib,) = require("matplotlib", what="Plot", install=pip_install("bench"))
    matplotlib.use("Agg")  # files only; never open a window
    import matplotlib.pyplot as plt

    return plt


def _save(plt: Any, fig: Any, path: str | Path) -> Path:
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


def bench_figure(rows: Sequence[Any], *, title: str = "pcd against its baselines") -> Any:
    """The bar chart of :func:`plot_bench`, as a matplotlib figure (not saved, not closed).

    Milliseconds per document on a linear axis, one group of bars per preset: pcd, pcd in one pass, each baseline
    and AR writing the full answer. Every bar carries its value (and, past pcd's own two, how many times pcd's
    time it is); a baseline whose answer was invalid is hatched and says so, with how many fields agreed.

    Args:
        rows: :class:`~pcd_engine.tools.bench.BenchRow` items.
        title: The figure title (name the model, presets and settings).
    """
    plt = _pyplot()
    series: list[tuple[str, list[float], list[Any]]] = [
        ("pcd", [r.pcd_ms for r in rows], [None] * len(rows)),
        ("pcd 1-pass", [r.one_pass_ms for r in rows], [None] * len(rows)),
    ]
    for i, run in enumerate(rows[0].baselines if rows else ()):
        series.append((run.method, [r.baselines[i].ms for r in rows], [r.baselines[i] for r in rows]))
    if rows and rows[0].full_answer_ms is not None:
        series.append(("ar (full answer)", [r.full_answer_ms or 0.0 for r in rows], [None] * len(rows)))
    from matplotlib.patches import Patch

    width = 0.8 / len(series)
    fig, ax = plt.subplots(figsize=(max(7.0, 2.2 * len(rows) + 3), 5.0))
    handles = []
    invalid = False
    for k, (label, values, runs) in enumerate(series):
        xs = [i + (k - (len(series) - 1) / 2) * width for i in range(len(rows))]
        bars = ax.bar(xs, values, width, label=label)
        handles.append(Patch(facecolor=bars[0].get_facecolor(), label=label))
        for bar, row, value, run in zip(bars, rows, values, runs, strict=True):
            text = f"{value:.0f} ms" + (f"\n{value / row.pcd_ms:.1f}x" if k >= 2 else "")
            if run is not None and not run.valid:
                bar.set_hatch("//")
                bar.set_edgecolor("black")
                text += f"\ninvalid\n{run.agree}/{row.fields} agree"
                invalid = True
            ax.annotate(
                text,
                (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                ha="center",
                va="bottom",
                fontsize=7,
            )
    ax.set_xticks(range(len(rows)), [f"{r.preset}\n({r.fields} fields)" for r in rows], fontsize=8)
    ax.set_ylabel("ms per document (median)")
    ax.margins(y=0.25)  # room for the values on the bars
    ax.set_title("\n".join(textwrap.wrap(title, 90)), fontsize=10)
    if invalid:
        handles.append(Patch(facecolor="white", edgecolor="black", hatch="//", label="invalid answer"))
    ax.legend(handles=handles, fontsize=8)
    return fig


def plot_bench(rows: Sequence[Any], path: str | Path, *, title: str = "pcd against its baselines") -> Path:
    """Write :func:`bench_figure` to an image file.

    Args:
        rows: :class:`~pcd_engine.tools.bench.BenchRow` items.
        path: The image file to write (the suffix picks the format, e.g. ``.png`` or ``.svg``).
        title: The figure title.

    Returns:
        The path written.
    """
    return _save(_pyplot(), bench_figure(rows, title=title), path)


def eval_figure(report: Any, *, title: str = "Accuracy against latency") -> Any:
    """The scatter of :func:`plot_eval`, as a matplotlib figure (not saved, not closed): accuracy against mean ms
    per document on a linear axis, each point labelled with its method, accuracy and macro-F1.

    Args:
        report: An :class:`~pcd_engine.tools.eval.EvalReport`.
        title: The figure title (the document count is added).
    """
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    for score in report.methods:
        ax.scatter([score.mean_ms], [score.metrics.accuracy], s=60, label=score.method)
        ax.annotate(
            f"{score.method}\nacc {score.metrics.accuracy:.1%}, F1 {score.metrics.macro_f1:.2f}",
            (score.mean_ms, score.metrics.accuracy),
            textcoords="offset points",
            xytext=(6, 6),
            fontsize=8,
        )
    ax.set_xlim(0, max((s.mean_ms for s in report.methods), default=1.0) * 1.4)  # room for the labels
    ax.set_xlabel("mean ms per document")
    ax.set_ylabel(f"accuracy on {report.field!r}")
    ax.set_ylim(0, 1.05)
    ax.set_title("\n".join(textwrap.wrap(f"{title} ({len(report.gold)} documents)", 80)), fontsize=10)
    ax.grid(alpha=0.3)
    return fig


def plot_eval(report: Any, path: str | Path, *, title: str = "Accuracy against latency") -> Path:
    """Write :func:`eval_figure` to an image file.

    Args:
        report: An :class:`~pcd_engine.tools.eval.EvalReport`.
        path: The image file to write.
        title: The figure title.

    Returns:
        The path written.
    """
    return _save(_pyplot(), eval_figure(report, title=title), path)


def risk_figure(curves: Mapping[str, Any], *, targets: Sequence[float] = (), title: str = "Risk-coverage") -> Any:
    """The risk-coverage plot of :func:`plot_risk`, as a matplotlib figure (not saved, not closed): for each reader,
    the accuracy of the answers kept against the share kept, as the abstention threshold rises
    (:func:`~pcd_engine.heads.thresholds.risk_coverage`), with a dashed line at each target accuracy.

    Args:
        curves: Held-out evidence (:data:`~pcd_engine.heads.thresholds.HeldOut`) by the name of what it reads (a
            field, or a method).
        targets: Target accuracies to draw.
        title: The figure title.
    """
    from pcd_engine.heads.thresholds import risk_coverage

    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    for name, held_out in curves.items():
        points = risk_coverage(held_out)
        ax.step([c for _, c, _ in points], [a for _, _, a in points], where="post", label=f"{name} ({len(held_out)})")
    for target in targets:
        ax.axhline(target, linestyle="--", linewidth=0.8, color="grey")
    ax.set_xlabel("coverage (share answered)")
    ax.set_ylabel("accuracy of the answers kept")
    ax.set_xlim(0, 1.02)
    ax.set_ylim(0, 1.02)
    ax.set_title("\n".join(textwrap.wrap(title, 80)), fontsize=10)
    ax.legend(fontsize=8, loc="lower left")
    ax.grid(alpha=0.3)
    return fig


def plot_risk(
    curves: Mapping[str, Any], path: str | Path, *, targets: Sequence[float] = (), title: str = "Risk-coverage"
) -> Path:
    """Write :func:`risk_figure` to an image file, and return its path."""
    return _save(_pyplot(), risk_figure(curves, targets=targets, title=title), path)
