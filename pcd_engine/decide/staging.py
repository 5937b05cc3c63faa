"""Cost-planned reading of a wave's tree: feed only the nodes its decisions can need.

One pass over a wave's whole tree feeds every token of every label. With a large label set almost all of them are
the *tails* of labels (the tokens below each label's identifying token) that already lost at that token, and on a
CPU a pass costs about as much per fed node as a plain forward. Each question of a wave is read one of two ways:

* **Stems only** (every ``marginal`` question, always): the marginal strategy scores each label by the probability
  of reaching its identifying token (its stem: the nodes from the decision point down to that token), so nothing
  below those tokens is read.
* **Staged** (``exact`` and ``trie_walk`` questions, when the cost model says it is cheaper): the first stage reads
  every label's stem, as above; later stages read the tails of the labels that can still win, in as few passes as
  the bound allows:

  - ``exact``: a label's sequence log-probability is at most the log-probability of the part read so far (every
    further token adds a log-probability <= 0). Once some label is read in full with score ``s``, every unread
    label whose bound is below ``s`` is proven to lose. Stage 2 reads the labels whose bound is within
    :data:`FIRST_MARGIN` nats of the best; each later stage reads every unread label whose bound still reaches the
    best read score, until none does. The winner is the one-pass winner.
  - ``trie_walk``: the greedy descent compares only children of nodes with more than ``switch_at`` labels, all
    of them at or above the identifying tokens. Each stage reads the walk's next few levels below its greedy
    position (as many as pay for their pass under the cost model; all of them down to the identifying tokens
    when no cost is known), the walk steps down while its splits are read, and the last stage reads the tails
    of the at most ``switch_at`` labels where it ends. The winner, and its probability, are the one-pass ones.

  An unread node counts as probability 1, so an unread label scores at most its bound; such labels are counted
  in :attr:`~pcd_engine.decide.decoding.Decision.bounded`, their reported probabilities use the bound, and the
  candidate mass is :func:`mass_bound` (exact when everything was read).

The cost model (:class:`PassCost`) prices a pass as ``fixed_ms + node_ms * fed nodes``, measured at the first wave
that could be staged with a few timed passes of different sizes (or pinned by ``EngineOptions.pass_cost``). A
question is staged under ``staging="auto"`` only when the nodes it saves outweigh the extra passes: on a CPU, where
each node costs about a token's forward, large label sets with long labels are staged; on a GPU, where a pass costs
about the same up to thousands of nodes, the default stays one pass. The first pcd's alternative, a greedy walk
that spends one pass per label token (:mod:`pcd_engine.tools.greedy_walk`), is kept as a benchmark baseline.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from pcd_engine.backends.contract import Backend, RequestState
from pcd_engine.decide.compiler import CompiledWave, FieldTrie, LabelPath
from pcd_engine.decide.decoding import Decision, Exact, Marginal, Strategy, TrieWalk, sequence_scores, split_paths
from pcd_engine.trees import TreeBatch

__all__ = [
    "FIRST_MARGIN",
    "PassCost",
    "QuestionReading",
    "WaveSearch",
    "mass_bound",
    "measure_pass_cost",
    "plan_reading",
]

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

    Each pass feeds a chain of ``n`` nodes after the last state token, each node reading one log-probability (as a
    wave's packed nodes do); a chain is one row for a backend that scores rows, so no cache is copied. The fastest
    of ``repeats`` timings of each size is kept.

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
            parents=tuple(range(-1, n - 1)),
            depths=tuple(range(n)),
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
        stems: Nodes from the decision point down to each path's identifying node (what stage 1 reads).
        tails: For each label, the nodes below its identifying nodes, over all its surface forms (empty for a
            label whose identifying token is its last).
        staged: Whether the tails are read in later stages (else stage 1 reads them too; a marginal question
            never reads them).
    """

    trie: FieldTrie
    strategy: Strategy
    stems: frozenset[int]
    tails: tuple[tuple[int, ...], ...]
    staged: bool

    @property
    def reads_tails(self) -> bool:
        """Whether the strategy needs any tail at all (every strategy but marginal)."""
        return not isinstance(self.strategy, Marginal)

    def first(self) -> set[int]:
        """The nodes stage 1 reads: the stems, plus every tail unless the tails are staged or unneeded (the tokens
        every path shares before the decision point are fed, not read: no decision uses them)."""
        out = set(self.stems)
        if self.reads_tails and not self.staged:
            for tail in self.tails:
                out.update(tail)
        return out


def _reading(trie: FieldTrie, strategy: Strategy, *, staged: bool) -> QuestionReading:
    stems: set[int] = set()
    tails: list[set[int]] = [set() for _ in trie.spec.labels]
    for path in trie.paths:
        stems.update(path.nodes[trie.decision_depth : path.ident + 1])
        tails[path.label].update(path.nodes[path.ident + 1 :])
    return QuestionReading(trie, strategy, frozenset(stems), tuple(tuple(sorted(t)) for t in tails), staged)


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
    wave: CompiledWave,
    strategies: Sequence[Strategy],
    *,
    staging: str,
    cost: Callable[[], PassCost | None],
    whole: Sequence[bool] = (),
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
        whole: Per question, whether it is read in one pass whatever ``staging`` says (a question whose whole
            distribution a lean correction needs); missing entries are False.

    Returns:
        One reading per question.
    """
    plain = tuple(_reading(t, s, staged=False) for t, s in zip(wave.fields, strategies, strict=True))
    kept = set(i for i, w in enumerate(whole) if w)
    eligible = [i for i, r in enumerate(plain) if r.reads_tails and any(r.tails) and i not in kept]
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
class _Walk:
    """Where a staged trie walk stands: the paths below its greedy position, and the depth they part from."""

    paths: list[LabelPath]
    depth: int


@dataclass
class WaveSearch:
    """One request's reading of one wave: what each stage reads, and the decisions at the end.

    Drive it with :meth:`first`, then :meth:`next` after each stage until it returns nothing; unread nodes are
    ``NaN`` in the log-probabilities it is given.

    A staged ``trie_walk`` question reads ahead of its greedy position by as many levels as ``cost`` says pay for
    themselves (each pass costs ``fixed_ms``, each fed node ``node_ms``; without a cost, down to every label's
    identifying token at once), steps down while the children of each split are read, and reads the tails of the
    at most ``switch_at`` labels where it ends.

    Attributes:
        readings: The questions' readings, in the wave's order.
        cost: The pass cost that sizes a trie walk's look-ahead (``None``: read every stem in the first stage).
        expanded: For each staged exact question, the labels whose tails were asked for so far.
        stages: Stages asked for so far.
    """

    readings: tuple[QuestionReading, ...]
    cost: PassCost | None = None
    expanded: list[set[int]] = field(default_factory=list)
    stages: int = 0
    _walks: dict[int, _Walk] = field(default_factory=dict, repr=False)
    _first: frozenset[int] = field(default_factory=frozenset, repr=False)

    def __post_init__(self) -> None:
        self.expanded = [{li for li, tail in enumerate(r.tails) if not tail} for r in self.readings]
        first: set[int] = set()
        unread = np.full(1 + max((n for r in self.readings for p in r.trie.paths for n in p.nodes), default=0), np.nan)
        for i, reading in enumerate(self.readings):
            if reading.staged and isinstance(reading.strategy, TrieWalk):
                self._walks[i] = _Walk(list(reading.trie.paths), reading.trie.decision_depth)
                first |= self._step(reading.strategy, self._walks[i], unread)
            else:
                first |= reading.first()
        self._first = frozenset(first)

    @property
    def staged(self) -> bool:
        """Whether any question is read in stages."""
        return any(r.staged for r in self.readings)

    def first(self) -> frozenset[int]:
        """The nodes stage 1 reads (the same set for the same wave read the same way: it keys the cached passes)."""
        self.stages = 1
        return self._first

    def next(self, logprobs: np.ndarray) -> set[int]:
        """The nodes the next stage reads, given what the stages so far read; empty when the decisions are proven."""
        filled = np.nan_to_num(logprobs, nan=0.0)
        out: set[int] = set()
        for i, (reading, expanded) in enumerate(zip(self.readings, self.expanded, strict=True)):
            if not reading.staged:
                continue
            if i in self._walks:
                assert isinstance(reading.strategy, TrieWalk)
                out |= self._step(reading.strategy, self._walks[i], logprobs)
                continue
            labels = self._wanted(reading, expanded, filled)
            expanded.update(labels)
            for li in labels:
                out.update(reading.tails[li])
        out = {n for n in out if np.isnan(logprobs[n])}
        if out:
            self.stages += 1
        return out

    def _step(self, walk_strategy: TrieWalk, walk: _Walk, logprobs: np.ndarray) -> set[int]:
        """Step a trie walk down while its splits are read; the nodes it needs next (none once it is decided)."""
        while len({p.label for p in walk.paths}) > walk_strategy.switch_at:
            groups, split = split_paths(walk.paths, walk.depth)
            if any(np.isnan(logprobs[child]) for child in groups):
                return self._look_ahead(walk, logprobs)
            best = max(groups, key=lambda child: logprobs[child])  # TrieWalk's own tie rule: the first best
            walk.paths, walk.depth = groups[best], split + 1
        return {n for p in walk.paths for n in p.nodes[walk.depth :] if np.isnan(logprobs[n])}

    def _look_ahead(self, walk: _Walk, logprobs: np.ndarray) -> set[int]:
        """The unread nodes of the walk's paths in the next ``L`` levels, ``L`` chosen to minimize the predicted
        cost per level (down to the identifying tokens, the most a greedy split can need)."""
        deepest = max(p.ident for p in walk.paths) + 1
        levels = range(1, max(1, deepest - walk.depth) + 1)
        if self.cost is None:
            levels = range(levels[-1], levels[-1] + 1)
        best: tuple[float, set[int]] | None = None
        for n in levels:
            queries = {p.nodes[d] for p in walk.paths for d in range(walk.depth, min(walk.depth + n, len(p.nodes)))}
            fed = {
                p.nodes[d]
                for p in walk.paths
                for d in range(max(0, walk.depth - 1), min(walk.depth + n - 1, len(p.nodes)))
            }
            per_level = (self.cost.ms(nodes=len(fed) + walk.depth) if self.cost else 0.0) / n
            if best is None or per_level < best[0]:
                best = (per_level, queries)
        assert best is not None
        return {q for q in best[1] if np.isnan(logprobs[q])}

    @staticmethod
    def _wanted(reading: QuestionReading, expanded: set[int], filled: np.ndarray) -> set[int]:
        """The labels of a staged exact question whose tails the next stage must read."""
        bound = sequence_scores(reading.trie, filled)  # an unread tail counts as probability 1: an upper bound
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
        """Each question's decision from what was read. An unread node counts as probability 1, so an unread label
        scores at most its bound (:attr:`~pcd_engine.decide.decoding.Decision.bounded` counts them) and a staged
        question's candidate mass is :func:`mass_bound`."""
        filled = np.nan_to_num(logprobs, nan=0.0)
        out = []
        for reading in self.readings:
            decision = reading.strategy.decide(reading.trie, filled, temperature=temperature)
            if reading.staged:
                trie = reading.trie
                unread = {p.label for p in trie.paths if np.isnan(logprobs[list(p.nodes[trie.decision_depth :])]).any()}
                decision = replace(decision, bounded=len(unread), candidate_mass=mass_bound(trie, logprobs))
            out.append(decision)
        return out


def mass_bound(trie: FieldTrie, logprobs: np.ndarray) -> float:
    """An upper bound of the probability, from the decision point, of reaching any of the field's labels, from the
    nodes read (``NaN`` for unread): the read labels' own probabilities, plus, below every read node with unread
    children, what its read children leave of its mass. Equal to the exact mass when everything is read."""
    children: dict[int, set[int]] = {}
    ends: set[int] = set()
    for path in trie.paths:
        chain = path.nodes[trie.decision_depth :]
        for parent, child in zip((-1, *chain[:-1]), chain, strict=True):
            children.setdefault(parent, set()).add(child)
        ends.add(chain[-1])
    total = 0.0
    stack: list[tuple[int, float]] = [(-1, 0.0)]
    while stack:
        node, cum = stack.pop()
        if node in ends:
            total += math.exp(cum)
            continue
        kids = children.get(node, set())
        read = [k for k in kids if not np.isnan(logprobs[k])]
        if len(read) < len(kids):
            total += max(0.0, math.exp(cum) - sum(math.exp(cum + logprobs[k]) for k in read))
        stack.extend((k, cum + float(logprobs[k])) for k in read)
    return total
