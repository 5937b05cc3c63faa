"""Helpers shared by the benchmark scripts (no tensor library imported here)."""

from __future__ import annotations

import dataclasses
import statistics
import time
from typing import Any

from pcd_engine.schema import Schema


def median_ms(fn: Any, repeats: int, sync: Any = lambda: None) -> float:
    """Median wall time of ``fn()`` over ``repeats`` runs, in ms; ``sync`` waits for the device around each."""
    times = []
    for _ in range(repeats):
        sync()
        t = time.perf_counter()
        fn()
        sync()
        times.append((time.perf_counter() - t) * 1000)
    return statistics.median(times)


def one_wave(schema: Schema) -> Schema:
    """The schema with ``depends_on`` dropped, so that with ``anchor=False`` every field is in ONE wave."""
    return dataclasses.replace(
        schema,
        fields=tuple(dataclasses.replace(f, depends_on=()) for f in schema.fields),
        fingerprint=schema.fingerprint + "-flat",
    )
