"""What the adapters share: one engine per (model, backend) in a process."""

from __future__ import annotations

import functools

from pcd_engine import Engine


@functools.lru_cache(maxsize=4)
def shared_engine(model: str | None, backend: str) -> Engine:
    """Load an engine once per process: adapters are cheap to build, models are not."""
    return Engine.load(model, backend=backend)
