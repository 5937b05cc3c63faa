"""The memory budget of one forward pass, asked of the backend's own estimate (:meth:`Backend.pass_bytes`).

Every pass a request makes stays within its budget: the preamble prefill and the document are fed in causal chunks
that fit, a wave's tree is split into passes of at most :meth:`PassBudget.max_nodes` nodes, and what cannot fit
at all is refused with :class:`~pcd_engine.errors.LimitError` before any model work.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from pcd_engine.backends.contract import Backend
from pcd_engine.errors import LimitError

__all__ = ["PassBudget", "largest"]


def largest(fits: Callable[[int], bool], *, top: int = 1 << 17) -> int:
    """The largest ``n`` in ``[0, top]`` with ``fits(n)`` (``fits`` is monotone, and ``fits(0)`` is assumed)."""
    lo, hi = 0, top
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


@dataclass(frozen=True)
class PassBudget:
    """One request's memory budget per pass, on one backend.

    Attributes:
        backend: The backend whose estimate is used.
        bytes: The budget, in bytes.
    """

    backend: Backend
    bytes: int

    @classmethod
    def of(cls, backend: Backend, memory_budget_mb: float | None) -> PassBudget:
        """The budget of ``memory_budget_mb`` MiB, or the backend's default when ``None``."""
        return cls(backend, int((memory_budget_mb or backend.default_memory_budget_mb) * 2**20))

    @property
    def mib(self) -> float:
        """The budget, in MiB."""
        return self.bytes / 2**20

    def fits(self, *, past: int, new: int, rows: int) -> bool:
        """Whether a pass feeding ``new`` tokens (reading ``rows`` output rows) after ``past`` fits."""
        return self.backend.pass_bytes(past=past, new=new, rows=rows) <= self.bytes

    def fit(self, past: int, *, extra: int = 0) -> int:
        """The most causal tokens one pass after ``past`` can feed beside ``extra`` tree tokens (0 when none fits)."""
        return largest(lambda n: self.fits(past=past, new=n + extra, rows=extra + 1))

    def max_nodes(self, past: int, causal: int) -> int:
        """The most tree nodes a pass with ``causal`` tokens after ``past`` can feed (at least 1)."""
        return max(1, largest(lambda n: self.fits(past=past, new=causal + n, rows=n + 1)))

    def over(self, what: str) -> LimitError:
        """The error for ``what`` not fitting even one token per pass."""
        return LimitError(
            f"Memory budget: expected {what} to fit the budget of {self.mib:.0f} MiB per pass, but not even "
            "one token does. Raise memory_budget_mb or shorten the text."
        )
