"""What a request feeds the model: the causal tokens it queues and feeds (ahead, in chunks that fit the memory
budget, when a tree and its document would not fit one pass), the passes that read a wave's tree, the hidden states
kept for decision heads (:meth:`Feeding.tap_wave`), and what each scoring pass leaves in the request
(:class:`Feeding`, the part of :class:`~pcd_engine.run.request.Request` that talks to the backend's cache).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from pcd_engine.backends.contract import Backend, RequestState
from pcd_engine.decide.compiler import CompiledWave
from pcd_engine.errors import PromptAlignmentError
from pcd_engine.limits import Watch
from pcd_engine.options import ExtractOptions
from pcd_engine.run.budget import PassBudget
from pcd_engine.run.host import Host
from pcd_engine.schema import FieldSpec
from pcd_engine.trees import TreeBatch

__all__ = ["Feeding"]

_EMPTY = TreeBatch((), (), (), (), (), ())


class Feeding:
    """The feeding steps of a request (a base of :class:`~pcd_engine.run.request.Request`, whose dataclass fields
    these are; see its attributes)."""

    engine: Host
    state: RequestState
    pending: list[int]
    committed: tuple[int, ...]
    watch: Watch
    budget: PassBudget
    nodes_scored: int
    documents_per_pass: list[int]
    call: ExtractOptions
    tapped_nodes: dict[str, list[int]]
    feature_fields: frozenset[str]

    @property
    def backend(self) -> Backend:
        """The engine's backend."""
        return self.engine.backend

    def score(self, passes: Sequence[TreeBatch], logprobs: np.ndarray, index: int) -> None:
        """Feed the pending tokens and the passes; the log-prob of every node they read into ``logprobs``."""
        for batch in passes:
            self.watch.check(f"a scoring pass of wave {index}")
            scored = self.backend.score_tree(self.state, causal=self.pending, batch=batch)
            self.absorb(batch, scored, logprobs, documents=1)

    def absorb(self, batch: TreeBatch, scored: np.ndarray, logprobs: np.ndarray, *, documents: int) -> None:
        """Record one scoring pass of this request (its pending tokens are now fed): the queried nodes'
        log-probs into ``logprobs``, and how many ``documents`` shared the pass."""
        logprobs[list(batch.query_nodes)] = scored
        self.pending = []
        self.nodes_scored += len(batch.tokens)
        self.documents_per_pass.append(documents)

    def extend(self, tail_ids: Sequence[int], causal_len: int, *, where: str, need_new: bool) -> None:
        """Queue the tail tokens a compiled wave or row plan needs after what the state already holds.

        Args:
            tail_ids: The plan's tail tokens.
            causal_len: How many of them come before the tree or the rows.
            where: The plan, for messages.
            need_new: A scored tree reads its root distribution from the last new token, so it needs one; open
                rows start from their own prefix tokens and do not.

        Raises:
            PromptAlignmentError: If the written answers re-tokenized the tail before them, or a tree would get
                no new token to read its root from.
        """
        if tuple(tail_ids[: len(self.committed)]) != self.committed or causal_len < len(self.committed):
            raise PromptAlignmentError(
                f"{where}: expected the written answers to extend the tail's tokens, but they re-tokenized the text "
                "before them."
            )
        self.pending = [*self.pending, *tail_ids[len(self.committed) : causal_len]]
        if not self.pending and need_new:
            raise PromptAlignmentError(
                f"{where}: expected new prompt tokens before the tree (the root distribution is read from the last "
                "one), but the written answers added none."
            )
        self.committed = tuple(tail_ids[:causal_len])

    def fit_causal(self, *, extra: int, keep: int) -> None:
        """Feed the pending causal tokens ahead, in chunks that fit the budget, when they would not fit in one pass
        with ``extra`` tree tokens; ``keep`` tokens stay pending (a tree reads its root from the last one).

        Raises:
            LimitError: If one root-to-leaf chain cannot fit even after feeding ahead.
        """
        if not self.budget.fits(past=self.state.length, new=len(self.pending) + extra, rows=extra + 1):
            self.feed_ahead(keep=keep)
            if not self.budget.fits(past=self.state.length, new=len(self.pending) + extra, rows=extra + 1):
                raise self.budget.over("one root-to-leaf chain of the answers")

    def feed_ahead(self, *, keep: int) -> None:
        """Feed all pending causal tokens but the last ``keep`` into the state, in chunks that fit the budget."""
        while len(self.pending) > keep:
            chunk = min(self.budget.fit(self.state.length), len(self.pending) - keep)
            if chunk < 1:
                raise self.budget.over("the text")
            self.watch.check("a document pass")
            self.backend.score_tree(self.state, causal=self.pending[:chunk], batch=_EMPTY)
            self.pending = self.pending[chunk:]

    def tree_passes(self, wave: CompiledWave, queries: frozenset[int]) -> list[TreeBatch]:
        """The passes that read ``queries`` of the wave's tree within the budget. The document
        block rides in the first pass unless feeding it ahead (in causal chunks) saves passes, or is the only way
        one root-to-leaf chain fits beside it."""
        cache, packed = self.engine.cache, wave.tree.packed
        longest = 1 + max((wave.tree.depths[n] for n in packed), default=0)
        self.fit_causal(extra=longest, keep=1)
        past, pending = self.state.length, len(self.pending)
        passes = cache.passes(wave, self.budget.max_nodes(past, pending), queries)
        if len(passes) > 1 and pending > 1:
            ahead = cache.passes(wave, self.budget.max_nodes(past + pending - 1, 1), queries)
            chunks = -(-(pending - 1) // max(1, self.budget.fit(past)))
            if chunks + len(ahead) < len(passes):
                self.feed_ahead(keep=1)
                passes = ahead
        return passes

    def tap_wave(self, wave: CompiledWave) -> None:
        """Point the request's feature tap (if any) at the decision nodes of this wave's fields that have a head or
        whose features are asked for: the first token where each field's labels differ, whose reading row's state
        a head reads."""
        tap, head = self.state.tap, self.call.head
        if tap is None:
            return
        self.tapped_nodes = {}
        for t in wave.fields:  # a multi-label field asks one yes/no question per label, in label order
            if t.spec.name in self.feature_fields or (head is not None and head.field(t.spec.name) is not None):
                self.tapped_nodes.setdefault(t.spec.name, []).append(t.paths[0].nodes[t.decision_depth])
        tap.nodes, tap.answers = frozenset(n for nodes in self.tapped_nodes.values() for n in nodes), {}

    def field_features(self, spec: FieldSpec) -> np.ndarray | None:
        """The features a head of ``spec`` reads, from this wave's passes: the last layer's state where the field's
        decision was read, then the middle layer's mean over the document; for a multi-label field one such row per
        label, read where that label's flag is decided (``None`` when the field is not tapped, or a decision was not
        read from the tree)."""
        tap, nodes = self.state.tap, self.tapped_nodes.get(spec.name, [])
        if tap is None or not nodes or any(node not in tap.answers for node in nodes):
            return None
        mean = tap.document_mean(len(tap.answers[nodes[0]]))
        rows = np.stack([np.concatenate([tap.answers[node], mean]) for node in nodes])
        return rows if spec.kind == "multi" else rows[0]
