"""The plots of ``pcd bench`` and ``pcd eval``, read back from the figure objects: axis scales, the values on the
bars, invalid baselines marked, titles and point labels. The bench plot is also saved under ``test-artifacts/``."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

pytest.importorskip("matplotlib", reason="pip install 'pcd-llm[bench]'")

from pcd_engine.tools.plots import bench_figure, eval_figure, plot_bench  # noqa: E402

ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"


def bench_row(preset: str, pcd_ms: float, ar_ms: float, *, valid: bool) -> SimpleNamespace:
    ar = SimpleNamespace(method="ar", ms=ar_ms, valid=valid, agree=0 if not valid else 28)
    return SimpleNamespace(
        preset=preset, fields=28, pcd_ms=pcd_ms, one_pass_ms=pcd_ms * 0.9, baselines=(ar,), full_answer_ms=5069.0
    )


def texts(ax) -> list[str]:
    return [t.get_text() for t in ax.texts]


def test_the_bench_plot_is_linear_with_values_on_bars_and_invalid_answers_marked(tmp_path):
    rows = [
        bench_row("support_triage", 1289.0, 4601.0, valid=False),
        bench_row("catalogue_255", 900.0, 3000.0, valid=True),
    ]
    title = "smollm2-135m: pcd against ar on support_triage, catalogue_255 (torch default dtype, medians of 3)"
    fig = bench_figure(rows, title=title)
    (ax,) = fig.axes
    assert ax.get_yscale() == "linear" and ax.get_title().replace("\n", " ") == title
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert legend == ["pcd", "pcd 1-pass", "ar", "ar (full answer)", "invalid answer"]
    labels = texts(ax)
    assert "1289 ms" in labels and "5069 ms\n3.9x" in labels
    assert "4601 ms\n3.6x\ninvalid\n0/28 agree" in labels  # the AR answer that was not valid says so
    assert "3000 ms\n3.3x" in labels  # a valid one does not
    ar_bars = ax.containers[2]
    assert [bar.get_hatch() for bar in ar_bars] == ["//", None]
    assert [bar.get_height() for bar in ar_bars] == [4601.0, 3000.0]  # true heights on a linear axis

    ARTIFACTS.mkdir(exist_ok=True)
    for path in (tmp_path / "bench.png", ARTIFACTS / "bench-plot.png"):
        written = plot_bench(rows, path, title=title)
        assert written.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_eval_plot_labels_each_point_on_a_linear_time_axis():
    def score(method: str, ms: float, accuracy: float) -> SimpleNamespace:
        return SimpleNamespace(method=method, mean_ms=ms, metrics=SimpleNamespace(accuracy=accuracy, macro_f1=0.5))

    report = SimpleNamespace(
        field="topic", gold=("a",) * 40, methods=(score("pcd", 300.0, 0.6), score("ar", 2500.0, 0.4))
    )
    fig = eval_figure(report, title="smollm2-135m (torch) on bbc-news, field 'topic'")
    (ax,) = fig.axes
    assert ax.get_xscale() == "linear" and ax.get_xlim()[0] == 0
    assert ax.get_title() == "smollm2-135m (torch) on bbc-news, field 'topic' (40 documents)"
    assert texts(ax) == ["pcd\nacc 60.0%, F1 0.50", "ar\nacc 40.0%, F1 0.50"]
