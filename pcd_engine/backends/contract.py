"""The backend contract: the only layer that touches tensors.

A backend owns a model and its tokenizer and offers these operations, in this order in every backend file:

1. :meth:`Backend.prefill` runs a schema's preamble once and returns an immutable :class:`Prefix` (its KV cache);
2. :meth:`Backend.start` opens a per-request :class:`RequestState` on top of a prefix, never modifying it;
3. :meth:`Backend.score_tree` appends causal tokens to the state and reads the log-probabilities of a packed
   token tree in the same forward pass; the tree never stays in the state (:meth:`Backend.score_trees` does the
   same for several requests, in one pass where the backend can batch them);
4. :meth:`Backend.generate_rows` grows one row per open field on top of a state, one forward pass per step
   for all rows (shared, in :mod:`pcd_engine.backends.growth`: the packed path grows the rows as a tree in one
   sequence, the fallback broadcasts the model's own cache over a batch);
5. :meth:`Backend.stream_greedy` writes text token by token (free text and the autoregressive baseline);
6. :meth:`Backend.pass_bytes` estimates one pass's memory, so the engine can split very large trees.

Every forward call is counted in :attr:`Backend.forward_passes`, and per thread in :attr:`Backend.thread_passes`.

Concurrency: one backend may be used from many threads. Every method that runs the model holds
:attr:`Backend.model_lock` for the pass (a streamed or generated sequence takes it pass by pass), so requests
interleave at pass boundaries and each pass sees only its own request's cache. Prefixes are read-only.
"""

from __future__ import annotations

import functools
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar

import numpy as np

from pcd_engine.backends.growth import (
    Chooser,
    Drafter,
    Growth,
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

__all__ = ["Backend", "Prefix", "RequestState", "serialized"]

_F = TypeVar("_F", bound=Callable[..., Any])


def serialized(method: _F) -> _F:
    """Run a backend method under the backend's :attr:`Backend.model_lock` (one pass at a time per model)."""

    @functools.wraps(method)
    def wrapper(self: Backend, *args: Any, **kwargs: Any) -> Any:
        with self.model_lock:
            return method(self, *args, **kwargs)

    return wrapper  # type: ignore[return-value]


class Prefix(ABC):
    """A prefilled, read-only preamble, reused across requests. What every backend's prefix holds:

    Attributes:
        ids: The head's token ids.
        cache: The backend's own KV state of the head (never written to after the prefill).
        length: How many tokens it holds.
    """

    ids: tuple[int, ...]
    cache: Any
    length: int


class RequestState(ABC):
    """One request's view of the model: a prefix plus the causal tokens appended so far.

    Attributes:
        ids: Every token the state holds (the head's, then the causal ones).
        cache: The backend's KV state for this request only (a fork of the prefix's).
        length: How many tokens it holds.
        tap: What the request keeps of its passes' hidden states (:class:`~pcd_engine.backends.taps.FeatureTap`;
            ``None``: nothing, the default).
    """

    ids: list[int]
    cache: Any
    length: int
    tap: FeatureTap | None = None


class Backend(ABC):
    """A model that can score packed token trees on top of a cached preamble.

    Attributes:
        name: Short backend name, e.g. ``"torch"``.
        tokenizer: The model's Hugging Face tokenizer.
        forward_passes: Number of model forward calls run so far, of every kind.
        scorer: ``"packed"`` when trees are tree-packed into one sequence, ``"rows"`` for the fallback that
            scores one row per label path.
    """

    name: str
    tokenizer: Any
    scorer: str

    @property
    def forward_passes(self) -> int:
        """Model forward calls run so far by this backend, from every thread."""
        return int(self.__dict__.get("_passes_total", 0))

    @forward_passes.setter
    def forward_passes(self, value: int) -> None:
        # Backends count with ``self.forward_passes += 1``; the increase is also credited to the calling thread.
        delta = int(value) - self.forward_passes
        self.__dict__["_passes_total"] = int(value)
        if delta > 0:
            local = self._local()
            local.passes = getattr(local, "passes", 0) + delta

    @property
    def thread_passes(self) -> int:
        """Model forward calls run so far on the calling thread (what one request's statistics count)."""
        return int(getattr(self._local(), "passes", 0))

    @property
    def model_lock(self) -> threading.RLock:
        """The lock held while the model runs a pass."""
        lock = self.__dict__.get("_model_lock")
        if lock is None:
            lock = self.__dict__.setdefault("_model_lock", threading.RLock())
        return lock  # type: ignore[no-any-return]

    def _local(self) -> threading.local:
        local = self.__dict__.get("_thread_local")
        if local is None:
            local = self.__dict__.setdefault("_thread_local", threading.local())
        return local  # type: ignore[no-any-return]

    @property
    @abstractmethod
    def max_context(self) -> int:
        """The longest sequence, in tokens, the model accepts."""

    @abstractmethod
    def prefill(self, ids: Sequence[int], *, chunk: int | None = None) -> Prefix:
        """Run ``ids`` through the model once and keep their KV cache.

        Args:
            ids: Token ids of the head; may be empty.
            chunk: Feed at most this many tokens per pass (causally, one after another), so that a long head
                stays within the memory budget; ``None`` feeds them all in one pass.

        Returns:
            A prefix that later requests start from.
        """

    @abstractmethod
    def start(self, prefix: Prefix) -> RequestState:
        """Open a request on top of ``prefix`` without copying or modifying it."""

    @abstractmethod
    def score_tree(self, state: RequestState, *, causal: Sequence[int], batch: TreeBatch) -> np.ndarray:
        """Append ``causal`` to ``state`` and score ``batch`` after it, in one forward pass.

        Each fed tree node sees the whole state, every causal token and its own ancestors; its position is the
        position after the last causal token plus its depth. After the call the state holds the causal tokens
        but none of the tree.

        Args:
            state: The request state; grows by ``len(causal)``.
            causal: Tokens to append causally (the document, written answers); may be empty only when no query
                reads row -1.
            batch: The tree nodes to feed and the log-probabilities to read.

        Returns:
            ``float64`` array: for each query, ``log p(query_token | row's context)``.
        """

    @property
    def batches_documents(self) -> bool:
        """Whether :meth:`score_trees` runs several requests in ONE forward pass (else one pass each)."""
        return False

    @property
    def default_batch_size(self) -> int:
        """How many documents one pass holds when the caller does not say (1 where documents are not batched)."""
        return 1

    def score_trees(
        self,
        states: Sequence[RequestState],
        *,
        causals: Sequence[Sequence[int]],
        batches: Sequence[TreeBatch],
    ) -> list[np.ndarray]:
        """:meth:`score_tree` for several requests: in ONE forward pass when :attr:`batches_documents` (each
        request a batch row over its own cache, see :meth:`_batched_pass`), else one pass each. Each request's
        answer equals its own :meth:`score_tree` call, and each state grows by its own causal tokens only.

        Args:
            states: The requests' states (distinct objects).
            causals: Per request, the tokens to append causally.
            batches: Per request, its tree batch.

        Returns:
            Per request, the log-probabilities of its queries.

        Raises:
            TypeError: If a state is given twice.
            PromptAlignmentError: If a batched request reads the root distribution but has no causal tokens.
        """
        if len({id(s) for s in states}) != len(states):
            raise TypeError("score_trees: expected distinct request states, but one was given twice.")
        if not self.batches_documents or self.scorer != "packed" or len(states) < 2:
            return [self.score_tree(s, causal=c, batch=b) for s, c, b in zip(states, causals, batches, strict=True)]
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
        return batched_pass(self, states, causal, batches)

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
        """Append ``causal``, then grow one row per prefix, all rows advancing together one token per pass.

        Each row sees the state, the causal tokens, its own prefix and its own tokens, never another row's.
        The first pass feeds the causal tokens and every prefix (shared prefix tokens once); each later pass
        feeds the new tokens of every row that is still going. ``choose`` picks each row's next tokens from its
        log-probabilities (several when a grammar forces them, which then cost no pass of their own), so a
        schema's rows take as many passes as the longest row has choices.

        Args:
            state: The request state; it is consumed (do not score on it afterwards).
            causal: Tokens to append causally before the rows; may be empty.
            prefixes: Per row, the non-empty tokens it starts with.
            choose: ``(row, logprobs) -> (tokens, done)``; a done row's tokens are kept but never fed.
            before_pass: Called before every pass after the first; it may raise to stop the rows (a time limit, a
                cancelled request), and then no further pass runs.
            draft: ``(row, row tokens so far) -> proposed continuation``: the packed scorer checks each row's
                proposal in the row's own pass and advances it by the tokens the chooser agrees with (see
                :class:`Growth`; the rows are the same, in fewer passes). The rows fallback does not draft.

        Returns:
            The number of forward passes run.

        Raises:
            PromptAlignmentError: If a prefix is empty.
        """
        if any(len(p) == 0 for p in prefixes):
            raise PromptAlignmentError("generate_rows: expected every row to start with at least one token.")
        tokens = [int(t) for t in causal]
        rows = [[int(t) for t in p] for p in prefixes]
        before = self.forward_passes
        if rows:
            if self.scorer == "rows":
                self._rows_generate(state, tokens, rows, choose, before_pass or no_check)
            else:
                self._packed_generate(state, Growth(state.length, tokens, rows, choose, draft), before_pass or no_check)
        return self.forward_passes - before

    def _packed_generate(self, state: Any, growth: Growth, before_pass: Callable[[], None]) -> None:
        """Rows as branches of one growing tree in a fork of the state's cache: every node sees the state, the
        causal block and its ancestors (the same visibility as a scored tree), and stays in the fork."""
        packed_generate(self, state, growth, before_pass)

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
        """:meth:`generate_rows` for several requests: their rows advance together, one pass per step for every
        row of every request, where the backend batches documents (each request a batch row over its own cache);
        else one request after the other. Each request's rows get exactly what :meth:`generate_rows` gives them.

        Args:
            states: The requests' states (consumed).
            causals: Per request, tokens to append before its rows.
            prefixes: Per request, its rows' non-empty prefixes.
            chooses: Per request, its chooser.
            before_passes: Per request, called before each pass it takes part in after its first; what it raises
                stops that request's rows only.
            drafts: Per request, its drafter or ``None`` (see :meth:`generate_rows`).

        Returns:
            Per request, the passes it took part in and the exception that stopped it (``None`` when it finished).
        """
        drafters = list(drafts) if drafts is not None else [None] * len(states)
        if not self.batches_documents or self.scorer != "packed" or len(states) < 2:
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
        """Several requests' rows grown together, one batch row per request (see :meth:`generate_rows_many`).

        One buffer per layer holds every request's cache left-padded to the longest (``P`` slots); each pass
        appends as many slots as the request feeding the most tokens needs, and request ``i`` puts its tokens in
        the first of them. Request ``i``'s visibility (from its :class:`Growth`, over its keys in feeding order)
        is moved to the slots its keys sit in; a request that has finished, or feeds fewer tokens, pads with
        queries that see only themselves. Only the rows read are projected onto the vocabulary.
        """
        return grow_many(self, states, growths, before_passes)

    # Batch rows over a shared buffer (backends that batch documents implement these four).

    def _buffered_cache(self, states: list[Any], widest: int, room: int) -> Any:
        """A cache of one batch row per state: each layer's buffer holds the state's cache right-aligned in the
        first ``widest`` slots, with room for ``room`` more slots after."""
        raise NotImplementedError(f"{type(self).__name__} does not batch documents.")

    def _buffered_room(self, cache: Any, more: int) -> int:
        """Make room for ``more`` slots in a buffered cache; return how many slots are filled."""
        raise NotImplementedError(f"{type(self).__name__} does not batch documents.")

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
        raise NotImplementedError(f"{type(self).__name__} does not batch documents.")

    def _buffered_adopt(self, state: Any, cache: Any, row: int, lo: int, hi: int) -> None:
        """Make ``state``'s cache the slots ``lo:hi`` of batch row ``row`` of a buffered cache."""
        raise NotImplementedError(f"{type(self).__name__} does not batch documents.")

    def _rows_generate(
        self, state: Any, causal: list[int], prefixes: list[list[int]], choose: Chooser, before_pass: Callable[[], None]
    ) -> None:
        """Row broadcast for caches that cannot branch by masking: the state's own cache is extended by the
        causal tokens and repeated over one batch row per prefix; every row feeds one token per pass (its
        prefix first, then its choices, forced tokens one by one), so rows never need padding, which recurrent
        layers could not ignore."""
        rows_generate(self, state, causal, prefixes, choose, before_pass)

    def _grow_pass(
        self, cache: Any, tokens: list[int], visible: np.ndarray, qpos: np.ndarray, kpos: np.ndarray, read: list[int]
    ) -> np.ndarray:
        """One pass that appends ``tokens`` to ``cache`` under ``visible`` and keeps them; returns the
        log-softmax of the rows ``read``, ``[len(read), vocab]``."""
        raise NotImplementedError(f"{type(self).__name__} has no packed row generator.")

    def _rows_start(self, state: Any, causal: list[int], rows: int) -> Any:
        """Extend the state's own cache by ``causal`` and return a copy repeated over ``rows`` batch rows."""
        raise NotImplementedError(f"{type(self).__name__} has no rows generator.")

    def _rows_step(self, cache: Any, tokens: list[int]) -> np.ndarray:
        """Feed one token per batch row; returns each row's next-token log-softmax, ``[rows, vocab]``."""
        raise NotImplementedError(f"{type(self).__name__} has no rows generator.")

    def _fork(self, cache: Any) -> Any:
        """A cache that shares ``cache``'s tensors and never writes into them."""
        raise NotImplementedError(f"{type(self).__name__} has no packed scorer.")

    @abstractmethod
    def stream_greedy(self, ids: Sequence[int], *, max_new_tokens: int) -> Iterator[int]:
        """Greedy autoregressive decoding with a KV cache, yielding each token as soon as it is chosen.

        Args:
            ids: The prompt.
            max_new_tokens: Upper bound on generated tokens.

        Yields:
            The generated token ids, one per forward pass (the prompt is not repeated).
        """

    def sequence_logprobs(self, ids: Sequence[int]) -> np.ndarray:
        """The plain reference: ``log p(ids[i] | ids[:i])`` for ``i >= 1`` (``float64``, ``len(ids) - 1`` values)
        from ONE causal forward pass of at least two ids: no prompt cache, no tree mask and no custom positions, the
        model run the way its library runs it by itself. ``pcd check`` compares tree-packed scores against this."""
        raise NotImplementedError(f"Backend {self.name!r} has no plain reference scorer.")

    def plain_pass(self, prefix: Prefix, tokens: Sequence[int], *, rows: int) -> Callable[[], None]:
        """Prepare the floor a tree pass is measured against: ONE plain causal pass of ``tokens`` after ``prefix``
        (left unchanged), with the model's own cache and causal mask, computing the last ``rows`` output rows.
        Returns a function that runs the pass once, on a fresh copy of the preamble's cache."""
        raise NotImplementedError(f"Backend {self.name!r} has no plain causal pass.")

    @property
    def weights_dtype(self) -> str:
        """The weights' precision: ``"float32"``, ``"bfloat16"``, ``"float16"``, or ``"mixed"`` (quantized or
        mixed weights)."""
        raise NotImplementedError(f"Backend {self.name!r} does not report its weights' precision.")

    def generate_greedy(
        self, ids: Sequence[int], *, max_new_tokens: int, stop: Callable[[list[int]], bool]
    ) -> list[int]:
        """Greedy decoding (:meth:`stream_greedy`) of at most ``max_new_tokens`` after ``ids``, until ``stop`` (called
        with the tokens so far after each step) returns True; returns the generated ids, without the prompt."""
        out: list[int] = []
        for token in self.stream_greedy(ids, max_new_tokens=max_new_tokens):
            out.append(token)
            if stop(out):
                break
        return out

    def _append_and_score(self, state: Any, causal: Sequence[int], batch: TreeBatch) -> np.ndarray:
        """The body of :meth:`score_tree` shared by backends with a packed scorer and a rows fallback.

        ``state`` has ``ids``, ``length`` and ``cache``; the backend provides ``_packed_pass(cache, past, causal,
        batch)``, which leaves the causal tokens in the cache, and ``_rows_pass(state, causal, batch)``, which
        also updates the state.
        """
        return append_and_score(self, state, causal, batch)

    def _packed_pass(
        self, cache: Any, past: int, causal: list[int], batch: TreeBatch, *, tap: FeatureTap | None = None
    ) -> np.ndarray:
        """One tree-packed forward pass (see :meth:`_append_and_score`); it hands ``tap`` (the request's
        :class:`~pcd_engine.backends.taps.FeatureTap`, if any) the rows it wants."""
        raise NotImplementedError(f"{type(self).__name__} has no packed scorer.")

    def _rows_pass(self, state: Any, causal: list[int], batch: TreeBatch) -> np.ndarray:
        """The row-broadcast fallback (see :meth:`_append_and_score`); it feeds ``state.tap`` as the packed pass
        does."""
        raise NotImplementedError(f"{type(self).__name__} has no rows scorer.")

    @contextmanager
    def _tapping(self, layer: int | None, *, keep: np.ndarray | None = None) -> Iterator[Seen | None]:
        """Expose the hidden states of the forward calls run inside the block: hidden-state ``layer``'s output and
        the final states the vocabulary projection reads (:class:`~pcd_engine.backends.taps.Seen`, read after the
        call; ``keep`` is a batched pass's ``[rows, new]`` mask of rows read). ``None`` taps nothing and costs
        nothing."""
        if layer is not None:
            raise NotImplementedError(f"Backend {self.name!r} cannot read hidden states.")
        yield None

    @property
    def hidden_layers(self) -> int:
        """How many decoder layers the model has (what :func:`~pcd_engine.backends.taps.middle_layer` halves)."""
        raise NotImplementedError(f"Backend {self.name!r} does not report its layers.")

    @property
    def default_memory_budget_mb(self) -> float:
        """The per-pass memory budget used when the engine is given none."""
        return 1024.0

    @abstractmethod
    def pass_bytes(self, *, past: int, new: int, rows: int) -> int:
        """Estimated peak extra memory, in bytes, of one pass of ``new`` tokens after ``past`` cached ones,
        reading ``rows`` output distributions."""
