"""What a backend may do beyond the contract: optional capabilities, each a mixin of abstract hooks it implements.

:class:`~pcd_engine.backends.contract.Backend` is what every backend must do (six abstract methods: a remote scorer
implements those and declares nothing else). A backend declares a capability by inheriting its class here, which
requires its hooks and gives it the shared machinery of :mod:`pcd_engine.backends.growth` on top of them:

* :class:`PackedTrees`: trees tree-packed into one sequence over a forked cache, and open rows grown as one tree;
* :class:`RowBroadcast`: the fallback for caches that cannot branch by masking (recurrent layers): one batch row per
  label path, and open rows broadcast over a batch;
* :class:`BatchedDocuments`: several requests in ONE packed pass, one batch row each over a shared buffer;
* :class:`FeatureTaps`: the hidden states a decision head reads, kept from the passes a request runs anyway;
* :class:`PlainReference`: the plain causal pass ``pcd check`` and the benchmarks' floor measure against.

Open rows (:meth:`Backend.generate_rows`) come with either scorer, or from a backend's own ``generate_rows``;
:attr:`Backend.capabilities` lists what a backend declares, and a call that needs what its backend lacks gets a
:class:`~pcd_engine.errors.BackendCapabilityError` before any pass.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Any, cast

import numpy as np

from pcd_engine.backends.contract import Backend, RequestState, serialized
from pcd_engine.backends.growth import (
    Chooser,
    Drafter,
    Growth,
    Hooks,
    append_and_score,
    batched_pass,
    generate_each,
    grow_many,
    no_check,
    packed_generate,
    rows_generate,
)
from pcd_engine.backends.taps import FeatureTap, Seen
from pcd_engine.errors import PromptAlignmentError
from pcd_engine.trees import TreeBatch

__all__ = [
    "BatchedDocuments",
    "FeatureTaps",
    "GrownRows",
    "PackedTrees",
    "PlainReference",
    "RowBroadcast",
    "feature_taps",
    "plain_reference",
]


class GrownRows(Backend):
    """Open rows grown by the shared machinery, packed as one tree (:class:`PackedTrees`) or broadcast over a batch
    (:class:`RowBroadcast`), as :attr:`Backend.scorer` says."""

    capability = "open rows"

    def generate_rows(
        self,
        state: RequestState,
        *,
        causal: Sequence[int],
        prefixes: Sequence[Sequence[int]],
        choose: Chooser,
        before_pass: Callable[[], None] | None = None,
        draft: Drafter | None = None,
    ) -> int:
        """See :meth:`Backend.generate_rows`: the packed scorer grows the rows as branches of one tree in a fork of
        the state's cache (every node sees the state, the causal block and its ancestors, and stays in the fork);
        the rows fallback extends the state's own cache and repeats it over one batch row per prefix, every row
        feeding one token per pass (rows never need padding, which recurrent layers could not ignore)."""
        if any(len(p) == 0 for p in prefixes):
            raise PromptAlignmentError("generate_rows: expected every row to start with at least one token.")
        tokens = [int(t) for t in causal]
        rows = [[int(t) for t in p] for p in prefixes]
        before = self.forward_passes
        if rows and self.scorer == "rows":
            self._rows_generate(state, tokens, rows, choose, before_pass or no_check)
        elif rows:
            self._packed_generate(state, Growth(state.length, tokens, rows, choose, draft), before_pass or no_check)
        return self.forward_passes - before

    def _packed_generate(self, state: Any, growth: Growth, before_pass: Callable[[], None]) -> None:
        """Rows as branches of one growing tree in a fork of the state's cache (:func:`growth.packed_generate`)."""
        packed_generate(cast(Hooks, self), state, growth, before_pass)

    def _rows_generate(
        self, state: Any, causal: list[int], prefixes: list[list[int]], choose: Chooser, before_pass: Callable[[], None]
    ) -> None:
        """Rows broadcast over one batch row each (:func:`growth.rows_generate`)."""
        rows_generate(cast(Hooks, self), state, causal, prefixes, choose, before_pass)

    def _append_and_score(self, state: Any, causal: Sequence[int], batch: TreeBatch) -> np.ndarray:
        """The body of :meth:`Backend.score_tree` for a backend with a packed scorer and a rows fallback: the packed
        pass leaves the causal tokens in the cache; the rows pass also updates the state."""
        return append_and_score(cast(Hooks, self), state, causal, batch)


class PackedTrees(GrownRows):
    """Capability: a packed scorer. Every tree node sees the state, the causal tokens and its own ancestors, at the
    position after the last causal token plus its depth, all in one forward pass."""

    capability = "packed trees"

    @abstractmethod
    def _packed_pass(
        self, cache: Any, past: int, causal: list[int], batch: TreeBatch, *, tap: FeatureTap | None = None
    ) -> np.ndarray:
        """One tree-packed forward pass that leaves the causal tokens in ``cache``; it hands ``tap`` (the request's
        :class:`~pcd_engine.backends.taps.FeatureTap`, if any) the rows it wants."""

    @abstractmethod
    def _fork(self, cache: Any) -> Any:
        """A cache that shares ``cache``'s tensors and never writes into them."""

    @abstractmethod
    def _grow_pass(
        self, cache: Any, tokens: list[int], visible: np.ndarray, qpos: np.ndarray, kpos: np.ndarray, read: list[int]
    ) -> np.ndarray:
        """One pass that appends ``tokens`` to ``cache`` under ``visible`` and keeps them; returns the
        log-softmax of the rows ``read``, ``[len(read), vocab]``."""


class RowBroadcast(GrownRows):
    """Capability: the rows fallback, for caches that cannot branch by masking: one batch row per label path."""

    capability = "row broadcast"

    @abstractmethod
    def _rows_pass(self, state: Any, causal: list[int], batch: TreeBatch) -> np.ndarray:
        """Score ``batch`` one batch row per label path on top of the state extended by ``causal`` (which stays in
        the state); it feeds ``state.tap`` as the packed pass does."""

    @abstractmethod
    def _rows_start(self, state: Any, causal: list[int], rows: int) -> Any:
        """Extend the state's own cache by ``causal`` and return a copy repeated over ``rows`` batch rows."""

    @abstractmethod
    def _rows_step(self, cache: Any, tokens: list[int]) -> np.ndarray:
        """Feed one token per batch row; returns each row's next-token log-softmax, ``[rows, vocab]``."""


class BatchedDocuments(PackedTrees):
    """Capability: several requests in ONE packed pass, one batch row each over its own cache (what
    :meth:`score_trees` and :meth:`generate_rows_many` then do whenever :attr:`batches_documents` holds)."""

    capability = "batched documents"

    @property
    def batches_documents(self) -> bool:
        """Whether the backend batches now: with its packed scorer (the rows fallback scores one at a time)."""
        return self.scorer == "packed"

    def score_trees(
        self, states: Sequence[RequestState], *, causals: Sequence[Sequence[int]], batches: Sequence[TreeBatch]
    ) -> list[np.ndarray]:
        """See :meth:`Backend.score_trees`: in ONE forward pass when :attr:`batches_documents`.

        Raises:
            TypeError: If a state is given twice.
            PromptAlignmentError: If a batched request reads the root distribution but has no causal tokens.
        """
        if not self.batches_documents or len(states) < 2:
            return super().score_trees(states, causals=causals, batches=batches)
        if len({id(s) for s in states}) != len(states):
            raise TypeError("score_trees: expected distinct request states, but one was given twice.")
        causal = [[int(t) for t in c] for c in causals]
        for c, b in zip(causal, batches, strict=True):
            if not c and -1 in b.query_rows:
                raise PromptAlignmentError(
                    "score_trees: expected causal tokens to read the root distribution from, but got none."
                )
        return self._batched_pass(list(states), causal, list(batches))

    @serialized
    def _batched_pass(self, states: list[Any], causal: list[list[int]], batches: list[TreeBatch]) -> list[np.ndarray]:
        """One packed pass for several requests, one batch row each.

        Every layer gets one buffer of ``[rows, heads, P + C + N, dim]`` slots (``P`` the longest cache, ``C`` the
        longest causal block, ``N`` the largest tree; :meth:`_buffered_cache`). Row ``i`` holds its cache
        left-padded to ``P`` slots, then its causal block, then (from slot ``P + C``) its tree nodes. The mask is
        request ``i``'s own :meth:`~pcd_engine.trees.TreeBatch.visibility` moved to those slots (padding is never
        seen; a padding query sees only itself), positions are each request's own, and only the rows read are
        projected onto the vocabulary. Afterwards state ``i`` holds its own slots (its cache, then its causal
        block; :meth:`_buffered_adopt`), so the states are exactly what one :meth:`score_tree` call each would
        leave.
        """
        return batched_pass(cast(Hooks, self), states, causal, batches)

    def generate_rows_many(
        self,
        states: Sequence[RequestState],
        *,
        causals: Sequence[Sequence[int]],
        prefixes: Sequence[Sequence[Sequence[int]]],
        chooses: Sequence[Chooser],
        before_passes: Sequence[Callable[[], None]],
        drafts: Sequence[Drafter | None] | None = None,
    ) -> list[tuple[int, Exception | None]]:
        """See :meth:`Backend.generate_rows_many`: every request's rows advance together, one pass per step, when
        :attr:`batches_documents`."""
        drafters = list(drafts) if drafts is not None else [None] * len(states)
        if not self.batches_documents or len(states) < 2:
            return generate_each(self, states, causals, prefixes, chooses, before_passes, drafters)
        for rows in prefixes:
            if any(len(p) == 0 for p in rows):
                raise PromptAlignmentError("generate_rows_many: expected every row to start with at least one token.")
        growths = [
            Growth(s.length, [int(t) for t in c], [[int(t) for t in p] for p in rows], choose, draft)
            for s, c, rows, choose, draft in zip(states, causals, prefixes, chooses, drafters, strict=True)
        ]
        return self._grow_many(list(states), growths, list(before_passes))

    @serialized
    def _grow_many(
        self, states: list[Any], growths: list[Growth], before_passes: list[Callable[[], None]]
    ) -> list[tuple[int, Exception | None]]:
        """Several requests' rows grown together, one batch row per request. One buffer per layer holds every
        request's cache left-padded to the longest (``P`` slots); each pass appends as many slots as the request
        feeding the most tokens needs, and request ``i`` puts its tokens in the first of them. Request ``i``'s
        visibility (from its :class:`~pcd_engine.backends.growth.Growth`) is moved to the slots its keys sit in; a
        request that has finished, or feeds fewer tokens, pads with queries that see only themselves."""
        return grow_many(cast(Hooks, self), states, growths, before_passes)

    @abstractmethod
    def _buffered_cache(self, states: list[Any], widest: int, room: int) -> Any:
        """A cache of one batch row per state: each layer's buffer holds the state's cache right-aligned in the
        first ``widest`` slots, with room for ``room`` more slots after."""

    @abstractmethod
    def _buffered_room(self, cache: Any, more: int) -> int:
        """Make room for ``more`` slots in a buffered cache; return how many slots are filled."""

    @abstractmethod
    def _buffered_pass(
        self,
        cache: Any,
        ids: np.ndarray,
        qpos: np.ndarray,
        visible: np.ndarray,
        kpos: np.ndarray,
        keep: np.ndarray,
        *,
        picks: Sequence[tuple[int, int]] | None = None,
    ) -> np.ndarray:
        """One forward pass of batch rows (``ids``, ``qpos``: ``[rows, new]``) on a buffered cache under
        ``visible`` (``[rows, new, keys]``), which keeps the new slots. Only the ``keep`` rows reach the
        vocabulary, in (row, slot) order. Returns their log-softmax (``float32 [kept, vocab]``), or, given
        ``picks`` (kept row, token), just those log-probabilities (``float64``)."""

    @abstractmethod
    def _buffered_adopt(self, state: Any, cache: Any, row: int, lo: int, hi: int) -> None:
        """Make ``state``'s cache the slots ``lo:hi`` of batch row ``row`` of a buffered cache."""


class FeatureTaps(Backend):
    """Capability: hidden states kept from the scoring passes a request runs anyway (what a decision head reads;
    :mod:`pcd_engine.backends.taps`)."""

    capability = "feature taps"

    @abstractmethod
    def _tapping(self, layer: int | None, *, keep: np.ndarray | None = None) -> AbstractContextManager[Seen | None]:
        """Expose the hidden states of the forward calls run inside the block: hidden-state ``layer``'s output and
        the final states the vocabulary projection reads (:class:`~pcd_engine.backends.taps.Seen`, read after the
        call; ``keep`` is a batched pass's ``[rows, new]`` mask of rows read). ``None`` taps nothing and costs
        nothing."""

    @property
    @abstractmethod
    def hidden_layers(self) -> int:
        """How many decoder layers the model has (what :func:`~pcd_engine.backends.taps.middle_layer` halves)."""


class PlainReference(Backend):
    """Capability: the model run the way its own library runs it, what ``pcd check`` and the benchmarks' floor
    measure the packed passes against."""

    capability = "plain reference"

    @abstractmethod
    def sequence_logprobs(self, ids: Sequence[int]) -> np.ndarray:
        """``log p(ids[i] | ids[:i])`` for ``i >= 1`` (``float64``, ``len(ids) - 1`` values) from ONE causal
        forward pass of at least two ids: no prompt cache, no tree mask and no custom positions."""

    @abstractmethod
    def plain_pass(self, prefix: Any, tokens: Sequence[int], *, rows: int) -> Callable[[], None]:
        """Prepare ONE plain causal pass of ``tokens`` after ``prefix`` (left unchanged), with the model's own
        cache and causal mask, computing the last ``rows`` output rows. Returns a function that runs the pass
        once, on a fresh copy of the preamble's cache."""

    @property
    @abstractmethod
    def weights_dtype(self) -> str:
        """The weights' precision: ``"float32"``, ``"bfloat16"``, ``"float16"``, or ``"mixed"``."""


def feature_taps(backend: Backend, needed: str) -> FeatureTaps:
    """``backend`` as a :class:`FeatureTaps`, for a call that needs its hidden states (``needed`` says what for).

    Raises:
        BackendCapabilityError: If it does not declare them.
    """
    return cast(FeatureTaps, _declared(backend, FeatureTaps, needed))


def plain_reference(backend: Backend, needed: str) -> PlainReference:
    """``backend`` as a :class:`PlainReference`, for a call that measures against it (``needed`` says what for).

    Raises:
        BackendCapabilityError: If it does not declare one.
    """
    return cast(PlainReference, _declared(backend, PlainReference, needed))


def _declared(backend: Backend, capability: type, needed: str) -> Backend:
    if not isinstance(backend, capability):
        backend.require(capability.__dict__["capability"], needed)
    return backend
