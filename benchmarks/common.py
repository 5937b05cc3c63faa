"""Helpers shared by the benchmark scripts (no tensor library imported here)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from pcd_engine.decide.planner import one_wave
from pcd_engine.tools.comparators import median_ms

__all__ = ["floor_ms", "median_ms", "one_wave", "peak_rss"]


def peak_rss(fn: Callable[[], Any]) -> tuple[float, float, Any]:
    """Run ``fn`` while a thread samples this process's resident set every 2 ms.

    Returns:
        ``(seconds, peak growth in MiB, outcome)``: the outcome is ``fn``'s result, or the exception it raised.
    """
    import psutil

    proc = psutil.Process()
    base = peak = proc.memory_info().rss
    done = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, proc.memory_info().rss)
            time.sleep(0.002)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    started = time.perf_counter()
    try:
        outcome: Any = fn()
    except Exception as exc:  # noqa: BLE001 - returned for the caller to report
        outcome = exc
    finally:
        seconds = time.perf_counter() - started
        done.set()
        sampler.join()
    return seconds, (peak - base) / 2**20, outcome


def floor_ms(engine: Any, preset: Any, out: Any, repeats: int, sync: Any = lambda: None) -> float:
    """ONE plain causal pass over (document + tail + tree nodes) new tokens on the warm preamble, with the model's
    own causal mask, reading as many output rows as the 1-pass extract ``out`` read."""
    prompt, prefix = engine.schema_prompt(out.schema)
    new = out.stats.prompt_tokens - out.stats.cached_tokens + out.stats.nodes_scored
    ids = engine.prompt_for(preset.context, out.schema)[len(prompt.chat.preamble_ids) :]
    tokens = (ids * (new // max(len(ids), 1) + 1))[:new]
    run = engine.backend.plain_pass(prefix, tokens, rows=out.stats.nodes_scored + 1)
    run()
    return median_ms(run, repeats, sync)


def labelled_arguments(parser: Any, datasets: Any) -> None:
    """The arguments of the few-label benchmarks (``study_head_features.py``, ``bench_heads.py``): how many documents,
    their first characters, how many seeded draws, which datasets."""
    parser.add_argument("--docs", type=int, default=300)
    parser.add_argument("--max-chars", type=int, default=600)
    parser.add_argument("--draws", type=int, default=5)
    parser.add_argument("--datasets", nargs="+", default=list(datasets))
