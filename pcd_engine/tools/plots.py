"""Plots for ``pcd bench`` and ``pcd eval``, drawn with matplotlib (the ``bench`` extra) into image files."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pcd_engine.errors import pip_install, require

__all__ = ["plot_bench", "plot_eval"]


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


def plot_bench(rows: Sequence[Any], path: str | Path, *, title: str = "pcd against its baselines") -> Path:
    """Bar chart of milliseconds per preset (log scale): pcd, pcd one-pass, and each baseline, speed-ups on top.

    Args:
        rows: :class:`~pcd_engine.tools.bench.BenchRow` items.
        path: The image file to write (the suffix picks the format, e.g. ``.png`` or ``.svg``).
        title: The figure title.

    Returns:
        The path written.
    """
    plt = _pyplot()
    series: dict[str, list[float]] = {"pcd": [r.pcd_ms for r in rows], "pcd 1-pass": [r.one_pass_ms for r in rows]}
    for i, run in enumerate(rows[0].baselines if rows else ()):
        series[run.method] = [r.baselines[i].ms for r in rows]
    if rows and rows[0].full_answer_ms is not None:
        series["ar (full answer)"] = [r.full_answer_ms or 0.0 for r in rows]
    width = 0.8 / len(series)
    fig, ax = plt.subplots(figsize=(max(6.0, 1.8 * len(rows) + 2), 4.5))
    for k, (label, values) in enumerate(series.items()):
        xs = [i + (k - (len(series) - 1) / 2) * width for i in range(len(rows))]
        bars = ax.bar(xs, values, width, label=label)
        if k >= 2:
            for bar, row, value in zip(bars, rows, values, strict=True):
                ax.annotate(
                    f"{value / row.pcd_ms:.1f}x",
                    (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                    ha="center",
                    va="bottom",
                    fontsize=7,
                )
    ax.set_xticks(range(len(rows)), [f"{r.preset}\n({r.fields} fields)" for r in rows], fontsize=8)
    ax.set_yscale("log")
    ax.set_ylabel("ms per document (median, log scale)")
    ax.set_title(title)
    ax.legend(fontsize=8)
    return _save(plt, fig, path)


def plot_eval(report: Any, path: str | Path, *, title: str = "Accuracy against latency") -> Path:
    """Scatter of accuracy against mean ms per document (log scale), one point per method.

    Args:
        report: An :class:`~pcd_engine.tools.eval.EvalReport`.
        path: The image file to write.
        title: The figure title.

    Returns:
        The path written.
    """
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 4.5))
    for score in report.methods:
        ax.scatter([score.mean_ms], [score.metrics.accuracy], s=60, label=score.method)
        ax.annotate(
            f"{score.method}\nacc {score.metrics.accuracy:.1%}, F1 {score.metrics.macro_f1:.2f}",
            (score.mean_ms, score.metrics.accuracy),
            textcoords="offset points",
            xytext=(6, 6),
            fontsize=8,
        )
    ax.set_xscale("log")
    ax.margins(x=0.35)  # room for the labels
    ax.set_xlabel("mean ms per document (log scale)")
    ax.set_ylabel(f"accuracy on {report.field!r}")
    ax.set_ylim(0, 1.05)
    ax.set_title(f"{title} ({len(report.gold)} documents)")
    ax.grid(alpha=0.3)
    return _save(plt, fig, path)
