"""Backend-independent decisions over a scored trie.

Input: one :class:`~pcd_engine.decide.compiler.FieldTrie` and the log-probability of every tree node given its parent
(``logprobs[node] = log p(token(node) | context up to parent(node))``). Output: a :class:`Decision`.

All masses are measured from the field's decision point (the first token where its labels differ), so they are
conditional on the model having written the key. Four strategies share one ABC:

* :class:`Marginal` - the probability of reaching each label's identifying token, summed over surface forms;
* :class:`Exact` - the probability of each label's full token sequence, summed over surface forms;
* :class:`TrieWalk` - walks the trie greedily, token by token, and switches to :class:`Exact` once at most
  ``switch_at`` labels remain below the current node;
* :class:`Fixed` - a field with a single allowed value; nothing to score.

``temperature`` divides the log-scores before they are normalized, so it reshapes the reported probabilities
and never changes the winner.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from pcd_engine.decide.compiler import FieldTrie, LabelPath
from pcd_engine.errors import OptionError
from pcd_engine.options import STRATEGIES

__all__ = [
    "Decision",
    "Exact",
    "Fixed",
    "Marginal",
    "Strategy",
    "TrieWalk",
    "choose_strategy",
    "sequence_scores",
    "split_paths",
]


@dataclass(frozen=True)
class Decision:
    """The outcome of one field.

    Attributes:
        label: Index of the chosen label.
        probabilities: Probability of each label, in label order, renormalized over the allowed labels.
        candidate_mass: Unnormalized probability that the model's own continuation reaches an allowed label,
            or ``None`` for a fixed field.
        method: Name of the strategy that decided.
        bounded: How many labels were scored by an upper bound instead of their full tokens: a staged reading
            (:mod:`pcd_engine.decide.staging`) proved they lose without reading their tails, so their probabilities
            (and ``candidate_mass``) are upper bounds. 0 when every label was read.
    """

    label: int
    probabilities: tuple[float, ...]
    candidate_mass: float | None
    method: str
    bounded: int = 0


def _logsumexp(values: Sequence[float]) -> float:
    if not values:
        return -math.inf
    top = max(values)
    if top == -math.inf:
        return -math.inf
    return top + math.log(sum(math.exp(v - top) for v in values))


def _softmax(scores: np.ndarray, temperature: float) -> np.ndarray:
    scaled = scores / temperature
    finite = np.isfinite(scaled)
    if not finite.any():
        return np.full(len(scores), 1.0 / len(scores))
    out = np.exp(scaled - scaled[finite].max())
    out[~finite] = 0.0
    return out / out.sum()


def _span(path: LabelPath, logprobs: np.ndarray, start: int, stop: int) -> float:
    return float(sum(logprobs[n] for n in path.nodes[start:stop]))


def _exact_scores(trie: FieldTrie, logprobs: np.ndarray, paths: Sequence[LabelPath], start: int) -> np.ndarray:
    per_label: dict[int, list[float]] = {}
    for path in paths:
        per_label.setdefault(path.label, []).append(_span(path, logprobs, start, len(path.nodes)))
    scores = np.full(len(trie.spec.labels), -math.inf)
    for label, values in per_label.items():
        scores[label] = _logsumexp(values)
    return scores


def sequence_scores(trie: FieldTrie, logprobs: np.ndarray) -> np.ndarray:
    """Each label's log-probability from the decision point over its full tokens, summed over its surface forms
    (``-inf`` for a label with no path)."""
    return _exact_scores(trie, logprobs, trie.paths, trie.decision_depth)


class Strategy(ABC):
    """How a field's label is chosen from its scored trie."""

    name: str

    @abstractmethod
    def decide(self, trie: FieldTrie, logprobs: np.ndarray, *, temperature: float = 1.0) -> Decision:
        """Choose a label.

        Args:
            trie: The field's paths.
            logprobs: Log-probability of each tree node given its parent.
            temperature: Divides the log-scores before normalizing; must be > 0.

        Returns:
            The decision.
        """


def _from_scores(scores: np.ndarray, temperature: float, method: str) -> Decision:
    probs = _softmax(scores, temperature)
    mass = float(np.exp(scores[np.isfinite(scores)]).sum())
    return Decision(int(np.argmax(scores)), tuple(float(p) for p in probs), mass, method)


class Marginal(Strategy):
    """Probability of reaching each label's identifying token, summed over its distinct surface forms."""

    name = "marginal"

    def decide(self, trie: FieldTrie, logprobs: np.ndarray, *, temperature: float = 1.0) -> Decision:
        per_label: dict[int, dict[int, float]] = {}
        for path in trie.paths:
            ident_node = path.nodes[path.ident]
            per_label.setdefault(path.label, {})[ident_node] = _span(
                path, logprobs, trie.decision_depth, path.ident + 1
            )
        scores = np.full(len(trie.spec.labels), -math.inf)
        for label, by_node in per_label.items():
            scores[label] = _logsumexp(list(by_node.values()))
        return _from_scores(scores, temperature, self.name)


class Exact(Strategy):
    """Probability of each label's full token sequence, summed over its surface forms."""

    name = "exact"

    def decide(self, trie: FieldTrie, logprobs: np.ndarray, *, temperature: float = 1.0) -> Decision:
        return _from_scores(sequence_scores(trie, logprobs), temperature, self.name)


@dataclass(frozen=True)
class TrieWalk(Strategy):
    """Greedy walk down the trie, then exact scoring once few labels survive.

    The reported distribution is the walk's own: at a node with more than ``switch_at`` labels below it, the
    mass splits over its children by their (tempered, renormalized) token probabilities; at a node with at most
    ``switch_at`` labels, it splits by the labels' exact sequence probabilities from that node down. The winner
    follows the most probable child at each step, so it can differ from the label with the highest reported
    probability when the greedy walk commits early.

    Attributes:
        switch_at: Switch to exact scoring once at most this many labels remain.
    """

    switch_at: int = 8
    name = "trie_walk"

    def decide(self, trie: FieldTrie, logprobs: np.ndarray, *, temperature: float = 1.0) -> Decision:
        n = len(trie.spec.labels)
        probs = np.zeros(n)
        winner = self._walk(trie, logprobs, list(trie.paths), trie.decision_depth, 1.0, temperature, probs, True)
        if winner is None:  # unreachable: the greedy branch always ends in an exact block
            winner = int(np.argmax(probs))
        exact = sequence_scores(trie, logprobs)
        mass = float(np.exp(exact[np.isfinite(exact)]).sum())
        return Decision(winner, tuple(float(p) for p in probs), mass, self.name)

    def _walk(
        self,
        trie: FieldTrie,
        logprobs: np.ndarray,
        paths: list[LabelPath],
        depth: int,
        weight: float,
        temperature: float,
        probs: np.ndarray,
        greedy: bool,
    ) -> int | None:
        if len({p.label for p in paths}) <= self.switch_at:
            scores = _exact_scores(trie, logprobs, paths, depth)
            within = _softmax(scores, temperature)
            probs += weight * within
            return int(np.argmax(scores)) if greedy else None
        groups, depth = split_paths(paths, depth)
        children = list(groups)
        split = _softmax(np.array([logprobs[c] for c in children], dtype=float), temperature)
        best = children[int(np.argmax([logprobs[c] for c in children]))]
        winner = None
        for child, share in zip(children, split, strict=True):
            found = self._walk(
                trie, logprobs, groups[child], depth + 1, weight * share, temperature, probs, greedy and child == best
            )
            if found is not None:
                winner = found
        return winner


def split_paths(paths: Sequence[LabelPath], depth: int) -> tuple[dict[int, list[LabelPath]], int]:
    """``paths`` grouped by their node at the first depth from ``depth`` where they part, and that depth (a chain
    every path shares has probability 1 from here: it is stepped over)."""
    groups: dict[int, list[LabelPath]] = {}
    while len(groups) < 2:
        groups = {}
        for path in paths:
            groups.setdefault(path.nodes[depth], []).append(path)
        depth += len(groups) < 2
    return groups, depth


class Fixed(Strategy):
    """A field with one allowed value: decided without scoring."""

    name = "fixed"

    def decide(self, trie: FieldTrie, logprobs: np.ndarray, *, temperature: float = 1.0) -> Decision:
        return Decision(0, (1.0,), None, self.name)


# Keyed by the names ExtractOptions accepts (options.STRATEGIES, where option parsing checks them first).
_STRATEGIES: dict[str, type[Strategy]] = {cls.name: cls for cls in (Marginal, Exact, TrieWalk)}


def choose_strategy(n_labels: int, *, name: str | None = None, marginal_max_labels: int = 32) -> Strategy:
    """The strategy for a field with ``n_labels`` labels.

    Args:
        n_labels: Number of allowed values.
        name: Force ``"marginal"``, ``"exact"`` or ``"trie_walk"``; ``None`` picks marginal for up to
            ``marginal_max_labels`` labels and trie walk above.
        marginal_max_labels: The largest label set decided by the marginal strategy by default.

    Returns:
        The strategy.

    Raises:
        OptionError: If ``name`` is not a known strategy.
    """
    if n_labels == 1:
        return Fixed()
    if name is None:
        return Marginal() if n_labels <= marginal_max_labels else TrieWalk()
    if name not in _STRATEGIES:
        raise OptionError(f"Strategy: expected one of {list(STRATEGIES)}, but got {name!r}.")
    return _STRATEGIES[name]()
