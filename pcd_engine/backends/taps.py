"""Feature taps: what a request keeps of the model's hidden states from the passes it runs anyway.

A decision head (:mod:`pcd_engine.heads.head`) reads two vectors per closed field, both from the scoring passes a
request already takes, so a head costs no forward pass of its own:

- the **document's middle state**: one layer's output (a hidden-state index, 1 for the first decoder layer's output)
  summed over the document's tokens, as they are fed (in one pass or in causal chunks, alone or as a batch row);
- each field's **answer state**: the last layer's state (after the model's final norm: what the vocabulary
  projection reads) at the row from which the field's decision is read, in the pass that reads it.

A request puts a :class:`FeatureTap` on its backend state (``state.tap``); every scoring path of a backend (the packed
pass, the batched pass, the rows fallback) then hands it those rows. This module owns the bookkeeping (which rows of a
pass to keep, the running sum) and imports nothing but numpy and the token trees, as the backends do.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from pcd_engine.trees import TreeBatch

__all__ = ["FeatureTap", "Seen", "middle_layer", "record_chains", "record_extension", "record_pass"]


def middle_layer(layers: int) -> int:
    """The hidden-state index a head averages over the document for a model of ``layers`` decoder layers: the
    middle one (``layers // 2``; at least 1, the first decoder layer's output)."""
    return max(1, layers // 2)


@dataclass
class FeatureTap:
    """What one request keeps of its passes' hidden states.

    Attributes:
        layer: The hidden-state index summed over the document (the output of decoder layer ``layer - 1``).
        span: The document's token positions in the request, ``[start, end)``.
        nodes: The tree nodes whose reading row's last-layer state is kept (set per wave by the request).
        total: The sum of the ``layer`` states over the document positions fed so far (``None`` before any).
        count: How many positions :attr:`total` sums.
        answers: Per node of :attr:`nodes` read so far, the last layer's state at the row it was read from.
    """

    layer: int
    span: tuple[int, int]
    nodes: frozenset[int] = frozenset()
    total: np.ndarray | None = None
    count: int = 0
    answers: dict[int, np.ndarray] = field(default_factory=dict)

    def document_rows(self, past: int, fed: int) -> list[int]:
        """The rows of a pass's causal block (``fed`` tokens after ``past`` in the request) that are document
        tokens."""
        lo, hi = max(self.span[0] - past, 0), min(self.span[1] - past, fed)
        return list(range(lo, hi))

    def answer_rows(self, batch: TreeBatch, fed: int) -> list[tuple[int, int]]:
        """``(node, row)`` for each wanted node a pass reads: the row of the pass's input (causal block first, then
        the tree's nodes) whose output it is read from."""
        out: dict[int, int] = {}
        for node, row in zip(batch.query_nodes, batch.query_rows, strict=True):
            if node in self.nodes and node not in out:
                out[node] = fed - 1 if row < 0 else fed + row
        return sorted(out.items())

    def add_document(self, states: np.ndarray) -> None:
        """Add ``[rows, hidden]`` document states to the running sum."""
        if len(states) == 0:
            return
        part = np.asarray(states, dtype=np.float64).sum(axis=0)
        self.total = part if self.total is None else self.total + part
        self.count += len(states)

    def document_mean(self, width: int) -> np.ndarray:
        """The document's mean ``layer`` state (zeros of ``width`` when no document token was fed)."""
        if self.total is None or not self.count:
            return np.zeros(width)
        return self.total / self.count


class Seen:
    """The hidden states one forward call exposed, as a backend hands them over (numpy, float64).

    Args:
        middle: ``(batch row, rows) -> [len(rows), hidden]``: the tapped layer's output at those input rows.
        last: ``(kept index) -> [hidden]``: the final state of the ``kept``-th row the vocabulary projection read
            (in the order the pass keeps its rows).
    """

    def __init__(self, middle: Callable[[int, list[int]], np.ndarray], last: Callable[[int], np.ndarray]) -> None:
        self.middle = middle
        self.last = last


def record_pass(
    tap: FeatureTap,
    seen: Seen,
    *,
    past: int,
    fed: int,
    batch: TreeBatch,
    row: int = 0,
    slot: Callable[[int], int] = lambda r: r,
    kept: Callable[[int], int],
) -> None:
    """Hand one pass's hidden states to ``tap``.

    Args:
        tap: The request's tap.
        seen: What the pass exposed.
        past: Tokens the request held before the pass.
        fed: Causal tokens the pass fed for it.
        batch: Its tree batch.
        row: Its batch row (0 when it ran alone).
        slot: Maps a row of the request's own input (causal block, then tree) to the input slot it sits in.
        kept: Maps an input slot to its index among the rows the vocabulary projection read.
    """
    rows = tap.document_rows(past, fed)
    if rows:
        tap.add_document(seen.middle(row, [slot(r) for r in rows]))
    for node, r in tap.answer_rows(batch, fed):
        tap.answers[node] = seen.last(kept(slot(r)))


def record_extension(tap: FeatureTap, seen: Seen, *, past: int, fed: int, batch: TreeBatch) -> None:
    """Hand ``tap`` what a rows fallback's causal extension exposed (``fed`` tokens after ``past``, reading only the
    last row): the document's rows, and the answers read from the root (the last causal token)."""
    if rows := tap.document_rows(past, fed):
        tap.add_document(seen.middle(0, rows))
    tap.answers.update((node, seen.last(0)) for node, row in tap.answer_rows(batch, fed) if row == fed - 1)


def record_chains(
    tap: FeatureTap,
    seen: Seen,
    *,
    fed: int,
    batch: TreeBatch,
    row_of: dict[int, tuple[int, int]],
    first: int,
    count: int,
    longest: int,
) -> None:
    """Hand ``tap`` the answers a rows fallback read from chains ``first`` to ``first + count`` (one batch row each,
    ``longest`` rows, every row projected; ``row_of`` as :meth:`~pcd_engine.trees.TreeBatch.chains` gives it)."""
    for node, row in tap.answer_rows(batch, fed):
        chain, offset = row_of.get(row - fed, (-1, 0))
        if row >= fed and first <= chain < first + count:
            tap.answers[node] = seen.last((chain - first) * longest + offset)
