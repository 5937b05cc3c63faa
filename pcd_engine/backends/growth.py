"""The machinery every backend shares on top of its few primitives (:mod:`pcd_engine.backends.capabilities` says
which): open-field rows growing as one token tree (:class:`Growth`, :func:`packed_generate`) or broadcast over a
batch (:func:`rows_generate`), several requests in one batched pass (:func:`batched_pass`, :func:`grow_many`), and
the memory estimate of a pass (:func:`estimate_pass_bytes`).

The functions take the backend as :class:`Hooks`: the primitives a backend implements for them (the buffered batch
rows, the packed and rows passes, the fork of a cache), the hooks of the capabilities it declares
(:mod:`pcd_engine.backends.capabilities`, whose classes call them), so a backend implements hooks, never this
machinery.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol

import numpy as np

from pcd_engine.backends.taps import FeatureTap, Seen, record_pass
from pcd_engine.errors import PromptAlignmentError
from pcd_engine.trees import TreeBatch, TrieBuilder

__all__ = [
    "Chooser",
    "Drafter",
    "Growth",
    "Hooks",
    "Rows",
    "append_and_score",
    "batched_pass",
    "estimate_pass_bytes",
    "generate_each",
    "grow_many",
    "no_check",
    "packed_generate",
    "rows_generate",
]


class Rows(Protocol):
    """What :func:`generate_each` needs of a backend: its pass count and its open rows."""

    forward_passes: int

    def generate_rows(
        self, state: Any, *, causal: Sequence[int], prefixes: Sequence[Sequence[int]], choose: Chooser,
        before_pass: Callable[[], None] | None = None, draft: Drafter | None = None,
    ) -> int: ...  # fmt: skip


class Hooks(Rows, Protocol):
    """What the shared machinery needs of a backend: the hooks of its declared capabilities
    (:mod:`pcd_engine.backends.capabilities`, which documents each)."""

    scorer: str

    def _buffered_cache(self, states: list[Any], widest: int, room: int) -> Any: ...

    def _buffered_room(self, cache: Any, more: int) -> int: ...

    def _buffered_pass(
        self, cache: Any, ids: np.ndarray, qpos: np.ndarray, visible: np.ndarray, kpos: np.ndarray,
        keep: np.ndarray, *, picks: Sequence[tuple[int, int]] | None = None,
    ) -> np.ndarray: ...  # fmt: skip

    def _buffered_adopt(self, state: Any, cache: Any, row: int, lo: int, hi: int) -> None: ...

    def _grow_pass(
        self, cache: Any, tokens: list[int], visible: np.ndarray, qpos: np.ndarray, kpos: np.ndarray, read: list[int]
    ) -> np.ndarray: ...

    def _rows_start(self, state: Any, causal: list[int], rows: int) -> Any: ...

    def _rows_step(self, cache: Any, tokens: list[int]) -> np.ndarray: ...

    def _fork(self, cache: Any) -> Any: ...

    def _packed_pass(
        self, cache: Any, past: int, causal: list[int], batch: TreeBatch, *, tap: FeatureTap | None = None
    ) -> np.ndarray: ...

    def _tapping(self, layer: int | None, *, keep: np.ndarray | None = None) -> AbstractContextManager[Seen | None]: ...

    def _rows_pass(self, state: Any, causal: list[int], batch: TreeBatch) -> np.ndarray: ...


# Called with (row index, log-probabilities over the vocabulary); returns the row's next tokens (usually one; more
# when a grammar forces what follows) and whether the row ends with them.
Chooser = Callable[[int, np.ndarray], tuple[Sequence[int], bool]]

# Called with (row index, the row's tokens so far: its prefix, then its chosen tokens); returns the tokens it
# proposes to follow them, possibly none (see :mod:`pcd_engine.generate.drafting`).
Drafter = Callable[[int, Sequence[int]], Sequence[int]]


def no_check() -> None:
    """The ``before_pass`` of a call that gives none: nothing to check."""
    return None


class Growth:
    """One request's open rows growing as branches of one token tree, pass by pass: what each pass feeds and
    who sees whom (:meth:`inputs`), and what the chooser makes of the pass's log-probabilities (:meth:`absorb`).
    The first pass feeds the causal block and every row's prefix (shared prefix tokens once); each later pass
    feeds the tokens the rows still going were given.

    With a ``draft`` (:mod:`pcd_engine.generate.drafting`), each row's next fed token is followed by the continuation
    the drafter proposes, as a chain in the same pass; the row's distribution is read at the token and at every draft
    token, and :meth:`absorb` calls the chooser at each in turn while its choices equal the draft (the last
    accepted draft token's distribution gives one more choice). Every choice is made from the distribution of
    exactly the tokens chosen before it, so the rows are the undrafted rows, in fewer passes; rejected draft
    tokens stay in the cache, seen by no later token.

    Attributes:
        active: The rows still going.
        passes: Passes absorbed so far.
    """

    def __init__(
        self,
        past: int,
        causal: list[int],
        prefixes: list[list[int]],
        choose: Chooser,
        draft: Drafter | None = None,
    ) -> None:
        self.past, self.causal, self.choose, self.draft = past, causal, choose, draft
        self.trie = TrieBuilder()
        self.ends = [self.trie.add(prefix)[-1] for prefix in prefixes]
        self.new = list(range(len(self.trie.tokens)))
        self.active = list(range(len(prefixes)))
        self.passes = 0
        self._history = [list(p) for p in prefixes]  # each row's tokens so far, for the drafter
        self._drafts: dict[int, list[int]] = {}  # row -> its draft nodes in the coming pass
        for row in self.active:
            self._propose(row)

    def _propose(self, row: int) -> None:
        """Chain the drafter's proposal for ``row`` after its last token (fed in the coming pass)."""
        if self.draft is None:
            return
        node, chain = self.ends[row], []
        for token in self.draft(row, self._history[row]):
            node = self.trie.append(node, int(token))
            chain.append(node)
            self.new.append(node)
        if chain:
            self._drafts[row] = chain

    def _reads(self) -> list[int]:
        return [n for r in self.active for n in (self.ends[r], *self._drafts.get(r, ()))]

    def inputs(self) -> tuple[list[int], np.ndarray, np.ndarray, np.ndarray, list[int]]:
        """The next pass: the tokens fed, their visibility over every key so far and themselves (keys in feeding
        order after the ``past`` cached ones), query and key positions, and the fed rows to read (per active row,
        its last token, then its draft tokens)."""
        tokens = self.trie.tokens
        tree = self.trie.batch()
        if not self.passes:
            visible, qpos, kpos = tree.visibility(self.past, len(self.causal))
            return self.causal + tokens, visible, qpos, kpos, [len(self.causal) + n for n in self._reads()]
        # only the new nodes' rows: the whole matrix would grow with every step
        visible, qpos, kpos = tree.visibility_of(self.past + len(self.causal), self.new)
        offset = len(tokens) - len(self.new)
        return [tokens[n] for n in self.new], visible, qpos, kpos, [n - offset for n in self._reads()]

    def absorb(self, logprobs: np.ndarray) -> None:
        """Give each active row its log-probabilities (in :meth:`inputs`' read order), accept the draft tokens the
        chooser agrees with, and grow the tree by the tokens chosen."""
        self.passes += 1
        going, self.new = [], []
        at = 0
        for row in self.active:
            reads = [self.ends[row], *self._drafts.pop(row, ())]
            mine = logprobs[at : at + len(reads)]
            at += len(reads)
            k, node = 0, self.ends[row]
            while True:
                chosen, done = self.choose(row, mine[k])
                if done or not chosen:
                    break
                self._history[row].extend(int(t) for t in chosen)
                drafted = True
                for token in chosen:  # forced tokens form a chain: one pass reads the row after all of them
                    if drafted and k + 1 < len(reads) and self.trie.tokens[reads[k + 1]] == int(token):
                        k += 1
                        node = reads[k]  # a draft token, already fed and read
                    else:
                        drafted = False
                        node = self.trie.append(node, int(token))
                        self.new.append(node)
                self.ends[row] = node
                if not drafted:
                    going.append(row)
                    self._propose(row)
                    break
                # every token chosen was drafted: its distribution is already here, choose again
        self.active = going


def append_and_score(backend: Hooks, state: Any, causal: Sequence[int], batch: TreeBatch) -> np.ndarray:
    """The body of ``score_tree`` shared by backends with a packed scorer and a rows fallback (see
    :meth:`~pcd_engine.backends.capabilities.GrownRows._append_and_score`)."""
    causal = [int(t) for t in causal]
    if not causal and -1 in batch.query_rows:
        raise PromptAlignmentError(
            "score_tree: expected causal tokens to read the root distribution from, but got none."
        )
    if backend.scorer == "rows":
        return backend._rows_pass(state, causal, batch)
    out = backend._packed_pass(state.cache, state.length, causal, batch, tap=getattr(state, "tap", None))
    state.ids.extend(causal)
    state.length += len(causal)
    return out


def batched_pass(
    backend: Hooks, states: list[Any], causal: list[list[int]], batches: list[TreeBatch]
) -> list[np.ndarray]:
    """One packed pass for several requests, one batch row each (the body of
    :meth:`~pcd_engine.backends.capabilities.BatchedDocuments._batched_pass`, which documents the layout)."""
    pasts = [s.length for s in states]
    widest, c_max = max(pasts), max(len(c) for c in causal)
    t = c_max + max(len(b.tokens) for b in batches)
    rows = len(states)
    ids = np.zeros((rows, t), dtype=np.int64)
    qpos = np.zeros((rows, t), dtype=np.int64)
    kpos = np.zeros((rows, widest + t), dtype=np.int64)
    visible = np.zeros((rows, t, widest + t), dtype=bool)
    visible[:, np.arange(t), widest + np.arange(t)] = True  # padding queries see themselves only
    read = np.zeros((rows, t), dtype=bool)
    for i, (past, c, b) in enumerate(zip(pasts, causal, batches, strict=True)):
        v, q, k = b.visibility(past, len(c))
        qslots = np.concatenate([np.arange(len(c)), c_max + np.arange(len(b.tokens))])
        kslots = np.concatenate([widest - past + np.arange(past), widest + qslots])
        visible[i][np.ix_(qslots, kslots)] = v
        ids[i, qslots], qpos[i, qslots], kpos[i, kslots] = [*c, *b.tokens], q, k
        read[i, [len(c) - 1 if r < 0 else c_max + r for r in b.query_rows]] = True
    # Kept rows come in (row, slot) order; map each query to its kept row.
    kept = np.cumsum(read.ravel()) - 1
    picks = []
    for i, (c, b) in enumerate(zip(causal, batches, strict=True)):
        for r, token in zip(b.query_rows, b.query_tokens, strict=True):
            picks.append((int(kept[i * t + (len(c) - 1 if r < 0 else c_max + r)]), int(token)))
    cache = backend._buffered_cache(states, widest, t)
    taps: list[FeatureTap | None] = [getattr(s, "tap", None) for s in states]
    layer = next((tap.layer for tap in taps if tap is not None), None)
    with backend._tapping(layer, keep=read) as seen:
        picked = backend._buffered_pass(cache, ids, qpos, visible, kpos, read, picks=picks)
    for i, (tap, past, c, b) in enumerate(zip(taps, pasts, causal, batches, strict=True)):
        if tap is not None and seen is not None:
            record_pass(tap, seen, past=past, fed=len(c), batch=b, row=i, slot=_slots(len(c), c_max),
                        kept=_kept(kept, i * t))  # fmt: skip
    for i, (state, c) in enumerate(zip(states, causal, strict=True)):
        if c:
            backend._buffered_adopt(state, cache, i, widest - pasts[i], widest + len(c))
            state.ids.extend(c)
            state.length += len(c)
    bounds = np.cumsum([0, *(len(b.query_rows) for b in batches)])
    return [picked[bounds[i] : bounds[i + 1]] for i in range(len(batches))]


def _slots(fed: int, c_max: int) -> Callable[[int], int]:
    """A batch row's input slot of each row of its request (the causal block from slot 0, the tree from ``c_max``)."""
    return lambda r: r if r < fed else c_max + r - fed


def _kept(kept: np.ndarray, first: int) -> Callable[[int], int]:
    """The index among a batched pass's kept rows of each slot of the batch row starting at flat slot ``first``."""
    return lambda s: int(kept[first + s])


def packed_generate(backend: Hooks, state: Any, growth: Growth, before_pass: Callable[[], None]) -> None:
    """Rows as branches of one growing tree in a fork of the state's cache: every node sees the state, the
    causal block and its ancestors (the same visibility as a scored tree), and stays in the fork."""
    cache = backend._fork(state.cache)
    while growth.active:
        if growth.passes:
            before_pass()
        feed, visible, qpos, kpos, read = growth.inputs()
        growth.absorb(backend._grow_pass(cache, feed, visible, qpos, kpos, read))


def generate_each(
    backend: Rows,
    states: Sequence[Any],
    causals: Sequence[Sequence[int]],
    prefixes: Sequence[Sequence[Sequence[int]]],
    chooses: Sequence[Chooser],
    before_passes: Sequence[Callable[[], None]],
    drafters: Sequence[Drafter | None],
) -> list[tuple[int, Exception | None]]:
    """``generate_rows_many`` one request after the other (a backend that does not batch documents): per request,
    the passes it took and the exception that stopped it."""
    out: list[tuple[int, Exception | None]] = []
    for state, causal, rows, choose, check, draft in zip(
        states, causals, prefixes, chooses, before_passes, drafters, strict=True
    ):
        before = backend.forward_passes
        try:
            backend.generate_rows(state, causal=causal, prefixes=rows, choose=choose, before_pass=check, draft=draft)
        except Exception as exc:  # noqa: BLE001 - this request's failure, returned in its place
            out.append((backend.forward_passes - before, exc))
        else:
            out.append((backend.forward_passes - before, None))
    return out


def grow_many(
    backend: Hooks, states: list[Any], growths: list[Growth], before_passes: list[Callable[[], None]]
) -> list[tuple[int, Exception | None]]:
    """Several requests' rows grown together, one batch row per request (the body of
    :meth:`~pcd_engine.backends.capabilities.BatchedDocuments._grow_many`, which documents the layout)."""
    pasts = [s.length for s in states]
    widest = max(pasts)
    first = max(len(g.causal) + len(g.trie.tokens) for g in growths)
    cache = backend._buffered_cache(states, widest, first)
    slots = [list(range(widest - past, widest)) for past in pasts]
    passes = [0] * len(states)
    failed: list[Exception | None] = [None] * len(states)
    while True:
        going = []
        for i, growth in enumerate(growths):
            if failed[i] is None and growth.active:
                if growth.passes:
                    try:
                        before_passes[i]()
                    except Exception as exc:  # noqa: BLE001 - this request's failure only
                        failed[i] = exc
                        continue
                going.append(i)
        if not going:
            break
        step = {i: growths[i].inputs() for i in going}
        t = max(len(feed) for feed, *_ in step.values())
        filled = backend._buffered_room(cache, t)
        width = filled + t
        ids = np.zeros((len(states), t), dtype=np.int64)
        qpos = np.zeros((len(states), t), dtype=np.int64)
        kpos = np.zeros((len(states), width), dtype=np.int64)
        visible = np.zeros((len(states), t, width), dtype=bool)
        visible[:, np.arange(t), filled + np.arange(t)] = True  # padding queries see themselves only
        keep = np.zeros((len(states), t), dtype=bool)
        for i, (feed, v, q, k, read) in step.items():
            columns = slots[i] + list(range(filled, filled + len(feed)))
            visible[i][np.ix_(np.arange(len(feed)), np.asarray(columns, dtype=np.int64))] = v
            kpos[i, columns] = k
            ids[i, : len(feed)], qpos[i, : len(feed)] = feed, q
            keep[i, read] = True
            slots[i] = columns
        logprobs = backend._buffered_pass(cache, ids, qpos, visible, kpos, keep)
        at = 0
        for i in going:  # kept rows come in (request, slot) order, each slot once
            read = step[i][4]
            kept = sorted(set(read))
            mine = logprobs[at : at + len(kept)]
            at += len(kept)
            passes[i] += 1
            growths[i].absorb(mine[[kept.index(r) for r in read]])
    return list(zip(passes, failed, strict=True))


def rows_generate(
    backend: Hooks,
    state: Any,
    causal: list[int],
    prefixes: list[list[int]],
    choose: Chooser,
    before_pass: Callable[[], None],
) -> None:
    """Row broadcast (the body of :meth:`~pcd_engine.backends.capabilities.RowBroadcast._rows_generate`)."""
    start = backend.forward_passes
    cache = backend._rows_start(state, causal, len(prefixes))  # may run a pass of its own (the causal tokens)
    queues = [list(p) for p in prefixes]
    done = [False] * len(prefixes)
    feed = [q.pop(0) for q in queues]
    while not all(done):
        if backend.forward_passes > start:
            before_pass()
        logprobs = backend._rows_step(cache, feed)
        for row, queue in enumerate(queues):
            if done[row]:
                continue  # a finished row keeps feeding its last token; nothing reads it
            if not queue:
                chosen, done[row] = choose(row, logprobs[row])
                queue.extend(int(t) for t in chosen)
                if done[row] or not queue:
                    done[row] = True
                    continue
            feed[row] = queue.pop(0)


def estimate_pass_bytes(config: Any, *, past: int, new: int, rows: int, masks: int) -> int:
    """A backend-neutral estimate of one packed pass's peak extra memory, in bytes (fp32 working precision).

    Counts the attention mask(s), one layer's attention scores, the kept logits and their log-softmax, the
    activations of the new tokens, and their keys and values in every layer.

    Args:
        config: The model's text config: an object whose attributes may include ``num_attention_heads``,
            ``hidden_size``, ``intermediate_size``, ``vocab_size`` and ``num_hidden_layers``.
        past: Tokens already in the cache.
        new: Tokens fed in this pass.
        rows: Output distributions read.
        masks: Number of distinct masks built (2 for models with sliding-window layers).
    """
    attention_heads = int(getattr(config, "num_attention_heads", 8) or 8)
    hidden = int(getattr(config, "hidden_size", 512) or 512)
    inter = int(getattr(config, "intermediate_size", 4 * hidden) or 4 * hidden)
    vocab = int(getattr(config, "vocab_size", 32000) or 32000)
    layers = int(getattr(config, "num_hidden_layers", 1) or 1)
    width = past + new
    mask_bytes = masks * new * width * 4
    scores = attention_heads * new * width * 4 * 2
    logits = rows * vocab * 4 * 2
    acts = new * (4 * hidden + 2 * inter) * 4
    kv = 2 * layers * new * hidden * 4
    return mask_bytes + scores + logits + acts + kv
