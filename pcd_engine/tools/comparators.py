"""What ``pcd bench`` and ``pcd eval`` run pcd against (``--against``): :data:`BASELINES`, the registry of
comparators by name (the same model writing the JSON token by token, :mod:`pcd_engine.tools.baseline`; the first
pcd's greedy walk, :mod:`pcd_engine.tools.greedy_walk`), how the names are parsed, and how a run is timed.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pcd_engine.errors import OptionError
from pcd_engine.tools.baseline import BaselineResult, generate_baseline, generate_outlines, outlines_model
from pcd_engine.tools.greedy_walk import generate_greedy_walk

if TYPE_CHECKING:
    from pcd_engine.engine import Engine

__all__ = ["BASELINES", "INVALID", "BaselineRun", "Progress", "generate_walk", "median_ms", "parse_against", "ready"]


def generate_walk(engine: Engine, text: str, schema: Any, *, max_new_tokens: int | None = None) -> BaselineResult:
    """The first pcd's staged greedy walk (see :mod:`pcd_engine.tools.greedy_walk`)."""
    return generate_greedy_walk(engine, text, schema, max_new_tokens=max_new_tokens)


BASELINES: dict[str, Callable[..., BaselineResult]] = {
    "ar": generate_baseline,
    "outlines": generate_outlines,
    "walk": generate_walk,
}
INVALID = "<invalid>"

Progress = Callable[[str], None]


def ready(engine: Engine, against: Sequence[str]) -> None:
    """Fail before any timing when a baseline cannot run on this engine."""
    parse_against(",".join(against))
    if "outlines" in against:
        outlines_model(engine)


def parse_against(text: str | None) -> tuple[str, ...]:
    """Parse ``--against``: comma-separated names from :data:`BASELINES`, or ``none``/empty for no baseline.

    Raises:
        OptionError: If a name is unknown.
    """
    if not text or text.strip().lower() == "none":
        return ()
    names = tuple(dict.fromkeys(n.strip().lower() for n in text.split(",") if n.strip()))
    unknown = [n for n in names if n not in BASELINES]
    if unknown:
        raise OptionError(f"--against: expected names from {sorted(BASELINES)} or 'none', but got {unknown}.")
    return names


def median_ms(fn: Callable[[], Any], repeats: int, sync: Callable[[], Any] = lambda: None) -> float:
    """Median wall time of ``fn()`` over ``repeats`` runs, in ms; ``sync`` waits for the device around each."""
    times = []
    for _ in range(repeats):
        sync()
        started = time.perf_counter()
        fn()
        sync()
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


@dataclass(frozen=True)
class BaselineRun:
    """One baseline on one preset.

    Attributes:
        method: The baseline's name in :data:`BASELINES`.
        ms: Median wall time of its generation.
        tokens: Tokens it wrote.
        forward_passes: Forward passes it ran (AR and outlines: one per written token).
        valid: Whether its object was a valid answer (parses, every key, allowed values, no extra keys).
        errors: What was invalid, in words.
        agree: How many fields equal pcd's default-settings decisions.
        setup_ms: One-off work excluded from ``ms`` (outlines' index compilation).
        speedup: ``ms`` divided by pcd's default-settings ms.
    """

    method: str
    ms: float
    tokens: int
    forward_passes: int
    valid: bool
    errors: tuple[str, ...]
    agree: int
    setup_ms: float
    speedup: float
