"""Cost-planned reading of a wave's tree: feed only the nodes its decisions can need.

One pass over a wave's whole tree feeds every token of every label. With a large label set almost all of them are
the *tails* of labels (the tokens below each label's identifying token) that already lost at that token, and on a
CPU a pass costs about as much per fed node as a plain forward. Each question of a wave is read one of two ways:

* **Head only** (every ``marginal`` question, always): the marginal strategy scores each label by the probability
  of reaching its identifying token, so nothing below those tokens is read.
* **Staged** (``exact`` and ``trie_walk`` questions, when the cost model says it is cheaper): the first stage reads
  every label's head, as above; later stages read the tails of the labels that can still win, in as few passes as
  the bound allows:

  - ``exact``: a label's sequence log-probability is at most the log-probability of the part read so far (every
    further token adds a log-probability <= 0). Once some label is read in full with score ``s``, every unread
    label whose bound is below ``s`` is proven to lose. Stage 2 reads the labels whose bound is within
    :data:`FIRST_MARGIN` nats of the best; each later stage reads every unread label whose bound still reaches the
    best read score, until none does. The winner is the one-pass winner.
  - ``trie_walk``: the greedy descent compares only children of nodes with more than ``switch_at`` labels, and
    those are all head nodes, so stage 1 fixes the path; stage 2 reads the tails of the labels where it ends.

  An unread label is scored by its bound (its tail read as probability 1) and counted in
  :attr:`~pcd_engine.decoding.Decision.bounded`: its reported probability is an upper bound.

The cost model (:class:`PassCost`) prices a pass as ``fixed_ms + node_ms * fed nodes``, measured at the first wave
that could be staged with a few timed passes of different sizes (or pinned by ``EngineOptions.pass_cost``). A
question is staged under ``staging="auto"`` only when the nodes it saves outweigh the extra passes: on a CPU, where
each node costs about a token's forward, large label sets with long labels are staged; on a GPU, where a pass costs
about the same up to thousands of nodes, the default stays one pass.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from pcd_engine.backends.base import Backend, RequestState
from pcd_engine.compiler import CompiledWave, FieldTrie
from pcd_engine.decoding import Decision, Exact, Marginal, Strategy, TrieWalk, sequence_scores
from pcd_engine.tree import TreeBatch

__all__ = ["FIRST_MARGIN", "PassCost", "QuestionReading", "WaveSearch", "measure_pass_cost", "plan_reading"]

# Stage 2 of an exact question reads every label whose bound is within this many nats of the best bound: a label's
# tail after its identifying token is usually near-certain, so the winner is almost always among them.
FIRST_MARGIN = 2.0
# The most labels stage 2 of an exact question reads on the margin alone (later stages read what the bound needs).
FIRST_MAX_LABELS = 8


@dataclass(frozen=True)
class PassCost:
    """What one forward pass costs: ``fixed_ms + node_ms * nodes``.

    Attributes:
        fixed_ms: Milliseconds of a pass that feeds nothing (reading the weights, the launch, the round trip).
        node_ms: Milliseconds per fed tree node.
        measured: Whether the figures were timed on this backend (else they were given).
    """

    fixed_ms: float
    node_ms: float
    measured: bool = False

    def ms(self, *, nodes: float, passes: float = 1.0) -> float:
        """The predicted milliseconds of ``passes`` passes feeding ``nodes`` nodes in all."""
        return passes * self.fixed_ms + nodes * self.node_ms


def measure_pass_cost(
    backend: Backend, state: RequestState, *, token: int, sizes: tuple[int, int] = (8, 128), repeats: int = 3
) -> PassCost:
    """Time passes of two sizes on ``state`` (nothing is added to it) and fit :class:`PassCost`.

    Each pass feeds ``n`` nodes as children of the last state token, each node reading one log-probability (as a
    wave's packed nodes do). The fastest of ``repeats`` timings of each size is kept.

    Args:
        backend: The backend to time.
        state: A request state (its length sets the attention cost, as in the real passes).
        token: The token each fed node holds.
        sizes: The two pass sizes, in nodes.
        repeats: Timings per size.

    Returns:
        The fitted cost, ``measured=True``.
    """
    best: list[float] = []
    for n in sizes:
        batch = TreeBatch(
            tokens=(token,) * n,
            parents=(-1,) * n,
            depths=(0,) * n,
            query_rows=tuple(range(n)),
            query_tokens=(token,) * n,
            query_nodes=tuple(range(n)),
        )
        times = []
        for _ in range(repeats):
            tick = time.perf_counter()
            backend.score_tree(state, causal=(), batch=batch)
            times.append((time.perf_counter() - tick) * 1000)
        best.append(min(times))
    (n1, n2), (t1, t2) = sizes, best
    node_ms = max(0.0, (t2 - t1) / (n2 - n1))
    return PassCost(fixed_ms=max(0.0, t1 - node_ms * n1), node_ms=node_ms, measured=True)


@dataclass(frozen=True)
class QuestionReading:
    """How one question of a wave is read.

    Attributes:
        trie: The question's paths.
        strategy: Its strategy.
        heads: Nodes from the decision point down to each path's identifying node (what stage 1 reads).
        tails: For each label, the nodes below its identifying nodes, over all its surface forms (empty for a
            label whose identifying token is its last).
        staged: Whether the tails are read in later stages (else stage 1 reads them too; a marginal question
            never reads them).
    """

    trie: FieldTrie
    strategy: Strategy
    heads: frozenset[int]
    tails: tuple[tuple[int, ...], ...]
    staged: bool

    @property
    def reads_tails(self) -> bool:
        """Whether the strategy needs any tail at all (every strategy but marginal)."""
        return not isinstance(self.strategy, Marginal)

    def first(self) -> set[int]:
        """The nodes stage 1 reads: the heads, plus every tail unless the tails are staged or unneeded (the tokens
        every path shares before the decision point are fed, not read: no decision uses them)."""
        out = set(self.heads)
        if self.reads_tails and not self.staged:
            for tail in self.tails:
                out.update(tail)
        return out


def _reading(trie: FieldTrie, strategy: Strategy, *, staged: bool) -> QuestionReading:
    heads: set[int] = set()
    tails: list[set[int]] = [set() for _ in trie.spec.labels]
    for path in trie.paths:
        heads.update(path.nodes[trie.decision_depth : path.ident + 1])
        tails[path.label].update(path.nodes[path.ident + 1 :])
    return QuestionReading(trie, strategy, frozenset(heads), tuple(tuple(sorted(t)) for t in tails), staged)


def _saving(reading: QuestionReading, packed: frozenset[int]) -> tuple[float, float]:
    """``(fed nodes a one-pass reading spends on the tails, fed nodes the staged reading is expected to spend
    on them)`` for one question."""
    spent = sum(1 for tail in reading.tails for n in tail if n in packed)
    spent += sum(1 for path in reading.trie.paths if path.nodes[path.ident] in packed)
    mean_path = float(np.mean([len(p.nodes) - 1 for p in reading.trie.paths]))
    surfaces = len(reading.trie.paths) / max(1, len(reading.trie.spec.labels))
    strategy = reading.strategy
    labels = strategy.switch_at if isinstance(strategy, TrieWalk) else FIRST_MAX_LABELS / 2
    expected = min(len(reading.trie.spec.labels), labels) * surfaces * mean_path
    return float(spent), expected


def plan_reading(
    wave: CompiledWave, strategies: Sequence[Strategy], *, staging: str, cost: Callable[[], PassCost | None]
) -> tuple[QuestionReading, ...]:
    """How each question of ``wave`` is read under ``staging`` (``"auto"``, ``"one_pass"`` or ``"staged"``).

    Under ``"auto"`` the staged questions are those whose tails would cost more fed nodes than their expected
    staged reading, and only when the nodes saved outweigh the extra passes (one for a trie walk, two for an exact
    question) under ``cost``.

    Args:
        wave: The compiled wave.
        strategies: Each question's strategy, in ``wave.fields`` order.
        staging: The call's staging.
        cost: Gives the pass cost; called only under ``"auto"`` when some question could be staged (it may time
            passes). ``None`` from it reads in one pass.

    Returns:
        One reading per question.
    """
    plain = tuple(_reading(t, s, staged=False) for t, s in zip(wave.fields, strategies, strict=True))
    eligible = [i for i, r in enumerate(plain) if r.reads_tails and any(r.tails)]
    if staging == "one_pass" or not eligible:
        return plain
    if staging == "staged":
        chosen = eligible
    else:
        packed = frozenset(wave.tree.packed)
        gains = {i: _saving(plain[i], packed) for i in eligible}
        chosen = [i for i in eligible if gains[i][0] > gains[i][1]]
        if not chosen:
            return plain
        price = cost()
        saved = sum(gains[i][0] - gains[i][1] for i in chosen)
        extra = 2.0 if any(isinstance(plain[i].strategy, Exact) for i in chosen) else 1.0
        if price is None or price.ms(nodes=saved, passes=0) <= price.ms(nodes=0, passes=extra):
            return plain
    return tuple(replace(r, staged=True) if i in chosen else r for i, r in enumerate(plain))


@dataclass
class WaveSearch:
    """One request's reading of one wave: what each stage reads, and the decisions at the end.

    Drive it with :meth:`first`, then :meth:`next` after each stage until it returns nothing; unread nodes are
    ``NaN`` in the log-probabilities it is given.

    Attributes:
        readings: The questions' readings, in the wave's order.
        expanded: For each staged question, the labels whose tails were asked for so far.
        stages: Stages asked for so far.
    """

    readings: tuple[QuestionReading, ...]
    expanded: list[set[int]] = field(default_factory=list)
    stages: int = 0

    def __post_init__(self) -> None:
        self.expanded = [{li for li, tail in enumerate(r.tails) if not tail} for r in self.readings]

    @property
    def key(self) -> tuple[str, ...]:
        """Names the first stage's reading (each question's strategy, and whether it is staged) for caching its
        passes: the same compiled wave read the same way reads the same nodes."""
        return tuple(f"{r.strategy.name}{'+' if r.staged else ''}" for r in self.readings)

    @property
    def staged(self) -> bool:
        """Whether any question is read in stages."""
        return any(r.staged for r in self.readings)

    def first(self) -> set[int]:
        """The nodes stage 1 reads."""
        self.stages = 1
        out: set[int] = set()
        for reading in self.readings:
            out |= reading.first()
        return out

    def next(self, logprobs: np.ndarray) -> set[int]:
        """The nodes the next stage reads, given what the stages so far read; empty when the decisions are proven."""
        filled = np.nan_to_num(logprobs, nan=0.0)
        out: set[int] = set()
        for reading, expanded in zip(self.readings, self.expanded, strict=True):
            if not reading.staged:
                continue
            labels = self._wanted(reading, expanded, filled)
            expanded.update(labels)
            for li in labels:
                out.update(reading.tails[li])
        out = {n for n in out if np.isnan(logprobs[n])}
        if out:
            self.stages += 1
        return out

    @staticmethod
    def _wanted(reading: QuestionReading, expanded: set[int], filled: np.ndarray) -> set[int]:
        """The labels of a staged question whose tails the next stage must read."""
        trie, strategy = reading.trie, reading.strategy
        if isinstance(strategy, TrieWalk):
            paths, _ = strategy.block(trie, filled)
            return {p.label for p in paths} - expanded
        bound = sequence_scores(trie, filled)  # an unread tail counts as probability 1: an upper bound
        unread = [li for li in range(len(bound)) if li not in expanded and bound[li] > -math.inf]
        if not unread:
            return set()
        read = [bound[li] for li in expanded]
        if not read or max(read) == -math.inf:  # nothing read in full yet: the labels near the best bound
            order = sorted(unread, key=lambda li: -bound[li])
            top = bound[order[0]]
            return {li for li in order[:FIRST_MAX_LABELS] if bound[li] >= top - FIRST_MARGIN} | {order[0]}
        best = max(read)
        return {li for li in unread if bound[li] >= best}

    def decide(self, logprobs: np.ndarray, *, temperature: float) -> list[Decision]:
        """Each question's decision from what was read (unread tails count as probability 1, so an unread label
        scores its bound; see :attr:`~pcd_engine.decoding.Decision.bounded`)."""
        filled = np.nan_to_num(logprobs, nan=0.0)
        out = []
        for reading, expanded in zip(self.readings, self.expanded, strict=True):
            decision = reading.strategy.decide(reading.trie, filled, temperature=temperature)
            if reading.staged:
                decision = replace(decision, bounded=len(reading.tails) - len(expanded))
            out.append(decision)
        return out
