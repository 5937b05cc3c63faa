"""The estimators of a model's label lean ``b`` from its distributions on unlabelled documents, and the re-weighting
that divides a lean out: what :class:`~pcd_engine.calibrate.calibrator.Calibrator` and the corrections compute with.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from pcd_engine.errors import OptionError

__all__ = ["em_bias", "mean_prior", "reweight"]


def mean_prior(distributions: Sequence[Sequence[float]]) -> tuple[float, ...]:
    """The mean of the rows: the model's average distribution over the labels on these documents."""
    if not distributions:
        raise OptionError("Calibration: expected at least one document's label distribution, but got none.")
    width = len(distributions[0])
    total = [0.0] * width
    for row in distributions:
        for i, p in enumerate(row):
            total[i] += p
    return _normalized([t / len(distributions) for t in total])


def em_bias(
    distributions: Sequence[Sequence[float]],
    *,
    target: Sequence[float] | None = None,
    iterations: int = 500,
    tolerance: float = 1e-9,
) -> tuple[float, ...]:
    """The label prior ``b`` under which these posteriors look computed, given the documents' own label shares
    ``target`` (uniform by default): correcting every row by ``target / b`` makes the rows average to ``target``.

    Saerens et al.'s EM with the roles swapped: start from the mean, correct every row by the current ``b``, and
    move each label's ``b`` by how far its corrected mean is from ``target``, until none is.

    Args:
        distributions: One posterior (over the same labels) per document.
        target: The labels' shares among these documents (positive, summing to 1); ``None``: uniform.
        iterations: The most steps.
        tolerance: Stop when every corrected mean is this close to ``target``.
    """
    bias = list(mean_prior(distributions))
    goal = list(target) if target is not None else [1.0 / len(bias)] * len(bias)
    for _ in range(iterations):
        weights = [g / b if b > 0 else 0.0 for g, b in zip(goal, bias, strict=True)]
        corrected = mean_prior([reweight(row, weights) for row in distributions])
        if max(abs(c - g) for c, g in zip(corrected, goal, strict=True)) < tolerance:
            break
        bias = list(_normalized([b * c / g for b, c, g in zip(bias, corrected, goal, strict=True)]))
    return tuple(bias)


def reweight(probabilities: Sequence[float], weights: Sequence[float]) -> tuple[float, ...]:
    """``probabilities * weights``, renormalized (all zero stays as it was)."""
    return _normalized([p * w for p, w in zip(probabilities, weights, strict=True)], fallback=probabilities)


def _normalized(values: Sequence[float], *, fallback: Sequence[float] | None = None) -> tuple[float, ...]:
    total = sum(values)
    if not total > 0 or not math.isfinite(total):
        return tuple(fallback) if fallback is not None else tuple(1.0 / len(values) for _ in values)
    return tuple(v / total for v in values)
