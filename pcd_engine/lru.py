"""One bounded, thread-safe least-recently-used map: the only eviction policy in pcd.

The engine's schema preambles, compiled waves, pass plans and row plans (:mod:`pcd_engine.run.compile_cache`) and the
open-field grammars (:class:`~pcd_engine.generate.open_rows.Grammars`) are each one :class:`LRU`. Values are built
outside the lock, so a slow build never blocks other threads' lookups; two threads that miss at once both build, and
the last one stored wins (builds are pure, so either is right).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

__all__ = ["LRU"]

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class LRU(Generic[K, V]):
    """A bounded map that drops the least recently used entry; safe to share between threads.

    Args:
        capacity: How many entries to keep (at least 1).
    """

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"LRU capacity: expected an integer >= 1, but got {capacity}.")
        self.capacity = capacity
        self._items: OrderedDict[K, V] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: K) -> V | None:
        """The value under ``key`` (now the most recently used), or ``None``."""
        with self._lock:
            hit = self._items.get(key)
            if hit is not None:
                self._items.move_to_end(key)
            return hit

    def put(self, key: K, value: V) -> None:
        """Store ``value`` under ``key``, dropping the least recently used entries beyond the capacity."""
        with self._lock:
            self._items[key] = value
            self._items.move_to_end(key)
            while len(self._items) > self.capacity:
                self._items.popitem(last=False)

    def get_or_build(self, key: K, build: Callable[[], V]) -> V:
        """``self[key]``, built by ``build`` (outside the lock) and stored on a miss."""
        hit = self.get(key)
        if hit is not None:
            return hit
        value = build()
        self.put(key, value)
        return value

    def __contains__(self, key: object) -> bool:
        with self._lock:
            return key in self._items

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)
