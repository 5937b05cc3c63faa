"""The backend contract: what every backend must do, and the only layer that touches tensors.

A backend owns a model and its tokenizer. Six abstract methods are all a backend must implement (a remote scorer
implements these and nothing else), in this order in every backend file:

1. :attr:`Backend.max_context`: the longest sequence the model accepts;
2. :meth:`Backend.prefill` runs a schema's preamble once and returns an immutable :class:`Prefix` (its KV cache);
3. :meth:`Backend.start` opens a per-request :class:`RequestState` on top of a prefix, never modifying it;
4. :meth:`Backend.score_tree` appends causal tokens to the state and reads the log-probabilities of a packed
   token tree in the same forward pass; the tree never stays in the state;
5. :meth:`Backend.stream_greedy` writes text token by token (free text and the autoregressive baseline);
6. :meth:`Backend.pass_bytes` estimates one pass's memory, so the engine can split very large trees.

What a backend may do beyond them it declares as capabilities (:mod:`pcd_engine.backends.capabilities`; listed by
:attr:`Backend.capabilities`): open rows (:meth:`Backend.generate_rows`, one row per open field grown on top of a
state, one forward pass per step for all rows), packed trees, the rows fallback, batched documents, feature taps
and the plain reference. A call that needs a capability its backend lacks gets a
:class:`~pcd_engine.errors.BackendCapabilityError` naming it, before any pass.

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
from contextlib import AbstractContextManager, nullcontext
from typing import Any, TypeVar

import numpy as np

from pcd_engine.backends.growth import Chooser, Drafter, generate_each
from pcd_engine.backends.taps import FeatureTap, Seen
from pcd_engine.errors import BackendCapabilityError
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
        ids: The preamble's token ids.
        cache: The backend's own KV state of the preamble (never written to after the prefill).
        length: How many tokens it holds.
    """

    ids: tuple[int, ...]
    cache: Any
    length: int


class RequestState(ABC):
    """One request's view of the model: a prefix plus the causal tokens appended so far.

    Attributes:
        ids: Every token the state holds (the preamble's, then the causal ones).
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
            ids: Token ids of the preamble; may be empty.
            chunk: Feed at most this many tokens per pass (causally, one after another), so that a long preamble
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
        """Whether :meth:`score_trees` runs several requests in ONE forward pass (else one pass each; see
        :class:`~pcd_engine.backends.capabilities.BatchedDocuments`)."""
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
        """:meth:`score_tree` for several requests, one pass each (in ONE pass on a backend that batches
        documents). Each request's answer equals its own :meth:`score_tree` call, and each state grows by its own
        causal tokens only.

        Args:
            states: The requests' states (distinct objects).
            causals: Per request, the tokens to append causally.
            batches: Per request, its tree batch.

        Returns:
            Per request, the log-probabilities of its queries.

        Raises:
            TypeError: If a state is given twice.
        """
        if len({id(s) for s in states}) != len(states):
            raise TypeError("score_trees: expected distinct request states, but one was given twice.")
        return [self.score_tree(s, causal=c, batch=b) for s, c, b in zip(states, causals, batches, strict=True)]

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
        """Append ``causal``, then grow one row per prefix, all rows advancing together one token per pass (the
        open rows capability: either scorer of :mod:`pcd_engine.backends.capabilities` gives it, or a backend
        overrides this method).

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
                :class:`~pcd_engine.backends.growth.Growth`; the rows are the same, in fewer passes).

        Returns:
            The number of forward passes run.

        Raises:
            PromptAlignmentError: If a prefix is empty.
            BackendCapabilityError: If the backend does not declare open rows.
        """
        self.require("open rows", "to generate open fields")
        raise AssertionError("unreachable")  # pragma: no cover

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
        """:meth:`generate_rows` for several requests, one after the other (together, one pass per step for every
        row of every request, on a backend that batches documents). Each request's rows get exactly what
        :meth:`generate_rows` gives them.

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
        return generate_each(self, states, causals, prefixes, chooses, before_passes, drafters)

    @abstractmethod
    def stream_greedy(self, ids: Sequence[int], *, max_new_tokens: int) -> Iterator[int]:
        """Greedy autoregressive decoding with a KV cache, yielding each token as soon as it is chosen.

        Args:
            ids: The prompt.
            max_new_tokens: Upper bound on generated tokens.

        Yields:
            The generated token ids, one per forward pass (the prompt is not repeated).
        """

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

    def _tapping(self, layer: int | None, *, keep: np.ndarray | None = None) -> AbstractContextManager[Seen | None]:
        """No hidden states: what a backend without :class:`~pcd_engine.backends.capabilities.FeatureTaps` gives
        the shared passes (``None``: nothing to tap)."""
        if layer is not None:
            self.require("feature taps", "to read hidden states")
        return nullcontext(None)

    @property
    def capabilities(self) -> frozenset[str]:
        """The optional capabilities this backend declares (:mod:`pcd_engine.backends.capabilities`): ``"open
        rows"``, ``"packed trees"``, ``"row broadcast"``, ``"batched documents"``, ``"feature taps"``, ``"plain
        reference"``; empty for a backend that implements the contract only."""
        return _declared_by(type(self))

    def require(self, capability: str, needed: str) -> None:
        """Check that this backend declares ``capability`` (``needed`` says what for).

        Raises:
            BackendCapabilityError: If it does not.
        """
        if capability not in self.capabilities:
            raise BackendCapabilityError(
                f"Backend {self.name!r}: expected the {capability!r} capability {needed}, but it declares "
                f"{sorted(self.capabilities) or 'none'} (pcd_engine.backends.capabilities)."
            )

    @property
    def default_memory_budget_mb(self) -> float:
        """The per-pass memory budget used when the engine is given none."""
        return 1024.0

    @abstractmethod
    def pass_bytes(self, *, past: int, new: int, rows: int) -> int:
        """Estimated peak extra memory, in bytes, of one pass of ``new`` tokens after ``past`` cached ones,
        reading ``rows`` output distributions."""


@functools.cache
def _declared_by(cls: type[Backend]) -> frozenset[str]:
    """The capabilities a backend class declares (:attr:`Backend.capabilities`), worked out once per class: the
    capability classes it inherits, and open rows where it gives its own ``generate_rows``."""
    found = {c.__dict__["capability"] for c in cls.__mro__ if "capability" in c.__dict__}
    if cls.generate_rows is not Backend.generate_rows:
        found.add("open rows")
    return frozenset(found)
