"""Per-request limits and the watch that enforces them at every pass boundary.

Sizes (labels, generated tokens, memory) are checked before any model work. Time and cancellation cannot be
known up front, so the engine asks a :class:`Watch` before every forward pass: a request past its time limit
raises :class:`~pcd_engine.errors.RequestTimeout`, one whose client went away raises
:class:`~pcd_engine.errors.RequestCancelled`. Work stops there; the engine's caches are untouched.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from pcd_engine.errors import OptionError, RequestCancelled, RequestTimeout, check_count

__all__ = ["DEFAULT_LIMITS", "DEFAULT_TIME_LIMIT_S", "SERVER_LIMITS", "SERVER_MAX_NEW_TOKENS", "RequestLimits", "Watch"]

DEFAULT_TIME_LIMIT_S = 600.0
"""Seconds one request may run unless its options say otherwise: a document of :meth:`Engine.extract
<pcd_engine.engine.Engine.extract>` (in :meth:`~pcd_engine.engine.Engine.extract_many`, each document's clock runs
from the start of its window, at most four batches), a free-text reply, a ``pcd`` command's document. Generous for
the embedded model (a few seconds a document); it stops a schema or a model that would otherwise run on unbounded.
``timeout=`` (or ``limits=RequestLimits(time_limit_s=...)``) sets another; ``RequestLimits()`` lifts it. ``pcd
serve`` uses :data:`SERVER_LIMITS` instead."""


@dataclass(frozen=True)
class RequestLimits:
    """Bounds on one request; ``None`` means unbounded.

    Attributes:
        max_labels: The most labels (allowed values, over every closed field; a multi-label field counts two per
            label, its yes and no) one request may score.
        max_generated_tokens: The most tokens one request may generate over all its open fields, counted from
            each field's token limit before any work; also the most any one field may ask for.
        time_limit_s: Seconds a request may run before it stops at the next pass boundary.
    """

    max_labels: int | None = None
    max_generated_tokens: int | None = None
    time_limit_s: float | None = None

    def __post_init__(self) -> None:
        for name in ("max_labels", "max_generated_tokens"):
            check_count(getattr(self, name), name)
        t = self.time_limit_s
        if t is not None and (isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t <= 0):
            raise OptionError(f"time_limit_s: expected a positive number of seconds or None, but got {t!r}.")


DEFAULT_LIMITS = RequestLimits(time_limit_s=DEFAULT_TIME_LIMIT_S)
"""An engine's limits unless it is given others: :data:`DEFAULT_TIME_LIMIT_S`, sizes unbounded (the memory budget
and the model's window bound them)."""

SERVER_LIMITS = RequestLimits(max_labels=2048, max_generated_tokens=1024, time_limit_s=120.0)
"""What one request to ``pcd serve`` may ask for unless its flags say otherwise."""

SERVER_MAX_NEW_TOKENS = 512
"""The most tokens of one free-text reply from ``pcd serve``, and the most a request's ``max_tokens`` may ask for,
unless ``--max-new-tokens`` says otherwise."""


class Watch:
    """Checks a request's deadline and cancellation flag; call :meth:`check` before each pass.

    Args:
        time_limit_s: Seconds from now until the request times out, or ``None``.
        cancelled: Returns True once the request should stop (for example, its client disconnected).
    """

    def __init__(self, time_limit_s: float | None = None, cancelled: Callable[[], bool] | None = None) -> None:
        self._limit = time_limit_s
        self._deadline = None if time_limit_s is None else time.monotonic() + time_limit_s
        self._cancelled = cancelled

    def check(self, where: str) -> None:
        """Raise if the request should stop now.

        Args:
            where: What was about to run, for the message.

        Raises:
            RequestCancelled: If the cancellation flag is set.
            RequestTimeout: If the time limit has passed.
        """
        if self._cancelled is not None and self._cancelled():
            raise RequestCancelled(f"Request: cancelled before {where}; the work stopped at that pass boundary.")
        if self._deadline is not None and time.monotonic() > self._deadline:
            raise RequestTimeout(
                f"Request: expected to finish within its time limit of {self._limit:g} s, but it was still running "
                f"before {where}. Raise the limit (timeout=, or limits=RequestLimits(time_limit_s=...)) or send a "
                "smaller request."
            )
