"""The gate a decision head passes before it is trusted (issue 46): how well a reader's distributions decide held-out
examples (:func:`scores`: accuracy, macro-F1, ECE, Brier), and a head against the model's own decision on the same
examples with a paired bootstrap interval of the accuracy gained (:func:`gate`), every figure a fraction of the
examples (printed as points where a person reads it). Plain statistics over distributions;
the held-out distributions come from :func:`~pcd_engine.heads.head.held_out_distributions`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pcd_engine.errors import OptionError

__all__ = ["Gate", "Scores", "gate", "scores"]


@dataclass(frozen=True)
class Scores:
    """How well one reader's distributions decide held-out examples.

    Attributes:
        accuracy: Share of examples whose most likely label is the gold one.
        macro_f1: F1 averaged over the labels that occur (in the gold labels or the decisions).
        ece: Expected calibration error of the decided label's probability, 10 equal-width bins.
        brier: Mean squared error of the whole distribution against the gold label.
    """

    accuracy: float
    macro_f1: float
    ece: float
    brier: float


def scores(distributions: Sequence[Sequence[float]], gold: Sequence[int], *, bins: int = 10) -> Scores:
    """:class:`Scores` of ``distributions`` (one per example, over the same labels) against ``gold`` (indices)."""
    import numpy as np

    p = np.asarray(distributions, dtype=np.float64)
    y = np.asarray(gold, dtype=np.int64)
    decided = p.argmax(axis=1)
    right = decided == y
    f1 = []
    for label in sorted(set(y.tolist()) | set(decided.tolist())):
        tp = float(np.sum(right & (y == label)))
        wrong = float(np.sum(decided == label)) - tp + float(np.sum(y == label)) - tp
        f1.append(2 * tp / (2 * tp + wrong) if tp or wrong else 0.0)
    confidence = p.max(axis=1)
    which = np.minimum((confidence * bins).astype(int), bins - 1)
    ece = sum(abs(confidence[which == b].mean() - right[which == b].mean()) * np.sum(which == b) for b in
              range(bins) if np.any(which == b)) / len(y)  # fmt: skip
    brier = float(np.mean(np.sum((p - np.eye(p.shape[1])[y]) ** 2, axis=1)))
    return Scores(float(right.mean()), float(np.mean(f1)), float(ece), brier)


@dataclass(frozen=True)
class Gate:
    """A head against the model's own (zero-shot) decision on the same held-out examples.

    Attributes:
        field: The field's key.
        held_out: How many examples were scored (each by a head fitted without it).
        head: The head's scores.
        zero_shot: The zero-shot decision's scores.
        gain: The head's accuracy minus the zero-shot accuracy, a fraction as the accuracies are (0.25: 25 points).
        interval: A 95% paired bootstrap interval of ``gain`` (the same resampled examples for both), fractions.
        folded: Examples left out before the gate as copies of another (the same text with the same labels): a
            copy in the training folds would let a head score its twin by heart.
        unscaled: The head's scores before its temperature (:attr:`~pcd_engine.heads.fields.FieldHead.temperature`)
            was fitted on these held-out distributions (``head`` is after); ``None`` where none was fitted.
    """

    field: str
    held_out: int
    head: Scores
    zero_shot: Scores
    gain: float
    interval: tuple[float, float]
    folded: int = 0
    unscaled: Scores | None = None

    @property
    def better(self) -> bool:
        """Whether the head is better than the zero-shot decision beyond chance: the interval's lower end > 0."""
        return self.interval[0] > 0


def gate(
    name: str, head: Sequence[Sequence[float]], zero_shot: Sequence[Sequence[float]], gold: Sequence[int], *,
    draws: int = 1000, seed: int = 0,
) -> Gate:  # fmt: skip
    """Compare a head's held-out distributions with the zero-shot ones on the same examples (:class:`Gate`).

    Raises:
        OptionError: If the three sequences differ in length or are empty.
    """
    import numpy as np

    if not gold or not len(head) == len(zero_shot) == len(gold):
        raise OptionError(f"Head gate {name!r}: expected one head and one zero-shot distribution per gold label.")
    y = np.asarray(gold)
    right_head = np.asarray(head).argmax(axis=1) == y
    right_zero = np.asarray(zero_shot).argmax(axis=1) == y
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, len(y), size=(draws, len(y)))
    gains = right_head[picks].mean(axis=1) - right_zero[picks].mean(axis=1)
    low, high = np.percentile(gains, [2.5, 97.5])
    return Gate(name, len(y), scores(head, gold), scores(zero_shot, gold),
                float(right_head.mean() - right_zero.mean()), (float(low), float(high)))  # fmt: skip
