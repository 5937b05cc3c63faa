"""Knowing when to trust a decision (issue 58), from held-out evidence: per example, the probability the reader
gave its decided label and the probability it gave the true one (:data:`HeldOut`; a head keeps its folds' as
:attr:`~pcd_engine.heads.fields.FieldHead.held_out`, ``pcd eval`` reads them from labelled documents).

- :func:`choose_threshold`: the probability below which to abstain so that the answered examples reach a target
  accuracy, with the coverage it leaves and a 95% interval of the accuracy at it (a bootstrap's, widened to the
  Wilson interval where that is wider; :class:`Threshold`);
- :func:`risk_coverage`: accuracy against coverage at every threshold the examples distinguish (the curve a
  risk-coverage plot draws);
- :func:`set_cutoff` and :func:`prediction_set`: split conformal prediction sets, the smallest set of labels that
  holds the true label with a chosen probability;
- :class:`KeepsHeldOut`: ``threshold``, ``with_thresholds`` and ``set_cutoff`` for a fitted value whose fields keep
  their evidence (a :class:`~pcd_engine.heads.head.Head`, a :class:`~pcd_engine.calibrate.calibrator.Calibrator`
  fitted with labelled examples).

Plain statistics over numbers; nothing here reads a model.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

from pcd_engine.errors import OptionError

__all__ = [
    "HeldOut",
    "KeepsHeldOut",
    "Threshold",
    "checked_floor",
    "checked_held_out",
    "choose_threshold",
    "prediction_set",
    "risk_coverage",
    "set_cutoff",
    "wilson",
]

HeldOut = Sequence[tuple[float, float]]
"""Held-out evidence: per example, ``(probability of the decided label, probability of the true label)``. An example
was decided right when the two are equal (the true label is the decided one)."""


def _right(pair: tuple[float, float]) -> bool:
    return pair[1] >= pair[0]


@dataclass(frozen=True)
class Threshold:
    """An abstention threshold chosen for a target accuracy on held-out examples (:func:`choose_threshold`).

    Attributes:
        field: The field's key.
        accuracy: The target accuracy (a fraction).
        probability: Answer where the decided label's probability is at least this; abstain below it (the
            ``min_probability`` that reaches the target). 1.0 where no threshold reached it.
        coverage: The share of the held-out examples answered at it.
        achieved: Their accuracy, the share answered right.
        interval: A 95% interval of ``achieved``: the wider of a bootstrap interval (the examples resampled, the
            threshold fixed) and the Wilson score interval of the answers kept (:func:`wilson`), so that a few kept
            answers, all right, do not give a zero-width interval.
        held_out: How many held-out examples it was chosen on.
        reached: Whether ``achieved`` reaches ``accuracy`` (else ``probability`` is 1.0 and little is answered).
    """

    field: str
    accuracy: float
    probability: float
    coverage: float
    achieved: float
    interval: tuple[float, float]
    held_out: int
    reached: bool

    def to_json(self) -> dict[str, Any]:
        """As plain JSON data (fractions, as the attributes are)."""
        return {"field": self.field, "accuracy": self.accuracy, "probability": self.probability,
                "coverage": self.coverage, "achieved": self.achieved, "interval": list(self.interval),
                "held_out": self.held_out, "reached": self.reached}  # fmt: skip


def _check(name: str, held_out: HeldOut) -> list[tuple[float, float]]:
    pairs = [(float(a), float(b)) for a, b in held_out]
    if not pairs:
        raise OptionError(f"Threshold for {name!r}: expected held-out examples, but there are none.")
    if not all(0.0 <= a <= 1.0 and 0.0 <= b <= 1.0 for a, b in pairs):
        raise OptionError(f"Threshold for {name!r}: expected probabilities in [0, 1].")
    return pairs


def _fraction(name: str, what: str, value: Any, *, closed: bool) -> float:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or not (0 < value < 1 or (closed and value == 1)):
        span = "(0, 1]" if closed else "(0, 1)"
        raise OptionError(f"{name}: {what}: expected a number in {span}, but got {value!r}.")
    return float(value)


def risk_coverage(held_out: HeldOut) -> list[tuple[float, float, float]]:
    """``(threshold, coverage, accuracy)`` at each distinct decided-label probability, highest threshold first:
    answering only the examples whose probability reaches the threshold covers that share of them at that accuracy.

    Raises:
        OptionError: If there are no examples or a probability is outside [0, 1].
    """
    return _curve(_check("risk-coverage", held_out))


def _curve(pairs: list[tuple[float, float]]) -> list[tuple[float, float, float]]:
    pairs = sorted(pairs, key=lambda pair: -pair[0])
    out: list[tuple[float, float, float]] = []
    right = 0
    for i, pair in enumerate(pairs):
        right += _right(pair)
        if i + 1 == len(pairs) or pairs[i + 1][0] < pair[0]:  # the last example at this probability
            out.append((pair[0], (i + 1) / len(pairs), right / (i + 1)))
    return out


def choose_threshold(name: str, held_out: HeldOut, *, accuracy: float, draws: int = 1000, seed: int = 0) -> Threshold:
    """The lowest threshold from which the answered held-out examples stay at or above ``accuracy`` (at that
    threshold and every higher one the examples distinguish: a threshold that reaches the target only by a lucky
    dip is not chosen), its coverage, and a 95% interval of the accuracy there (:attr:`Threshold.interval`).

    Args:
        name: The field's key (for the result and messages).
        held_out: The examples' evidence (:data:`HeldOut`).
        accuracy: The target accuracy, in (0, 1].
        draws: Bootstrap resamples.
        seed: Seeds the bootstrap.

    Raises:
        OptionError: If there are no examples, a probability is outside [0, 1], or ``accuracy`` is not in (0, 1].
    """
    import numpy as np

    target = _fraction(f"Threshold for {name!r}", "accuracy", accuracy, closed=True)
    pairs = _check(name, held_out)
    chosen = None
    for threshold, _, reached in _curve(pairs):  # highest first: stop at the first that falls short
        if reached < target:
            break
        chosen = threshold
    probability = 1.0 if chosen is None else chosen
    top = np.asarray([a for a, _ in pairs])
    right = np.asarray([_right(pair) for pair in pairs], dtype=np.float64)
    kept = top >= probability
    if not kept.any():
        return Threshold(name, target, probability, 0.0, 0.0, (0.0, 0.0), len(pairs), False)
    picks = np.random.default_rng(seed).integers(0, len(pairs), size=(draws, len(pairs)))
    answered = kept[picks].sum(axis=1)
    good = (kept[picks] * right[picks]).sum(axis=1)
    rates = good[answered > 0] / answered[answered > 0]
    low, high = np.percentile(rates, [2.5, 97.5])
    achieved = float(right[kept].mean())
    floor, ceiling = wilson(int(right[kept].sum()), int(kept.sum()))
    interval = (min(float(low), floor), max(float(high), ceiling))
    return Threshold(name, target, float(probability), float(kept.mean()), achieved, interval, len(pairs),
                     chosen is not None)  # fmt: skip


def wilson(successes: int, trials: int, *, z: float = 1.96) -> tuple[float, float]:
    """The Wilson score interval of a proportion (95% at the default ``z``): never zero-width, also where every
    trial succeeded or none did."""
    if trials <= 0:
        return 0.0, 1.0
    p = successes / trials
    centre = (p + z * z / (2 * trials)) / (1 + z * z / trials)
    half = z * math.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials)) / (1 + z * z / trials)
    return max(0.0, centre - half), min(1.0, centre + half)


def set_cutoff(held_out: HeldOut, level: float) -> float:
    """Split conformal: the probability a label needs to join a prediction set so that the set holds the true label
    with probability at least ``level`` (on exchangeable examples). With ``n`` held-out examples scored
    ``1 - p(true label)``, the cutoff is one minus the ``ceil((n + 1) * level)``-th smallest score (0: every label,
    when ``n`` is too small for the level).

    Raises:
        OptionError: If there are no examples, a probability is outside [0, 1], or ``level`` is not in (0, 1).
    """
    level = _fraction("Prediction set", "level", level, closed=False)
    truths = sorted((truth for _, truth in _check("prediction set", held_out)), reverse=True)
    rank = math.ceil((len(truths) + 1) * level)
    return 0.0 if rank > len(truths) else truths[rank - 1]


def prediction_set(labels: Sequence[Any], distribution: Sequence[float], cutoff: float) -> tuple[Any, ...]:
    """The labels whose probability reaches ``cutoff``, most probable first; the most probable label always (a set is
    never empty)."""
    order = sorted(range(len(labels)), key=lambda i: -distribution[i])
    return tuple(labels[i] for k, i in enumerate(order) if k == 0 or distribution[i] >= cutoff)


def _probability(where: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise OptionError(f"{where}: expected a finite number, but got {value!r}.")
    return float(value)


def checked_held_out(where: str, pairs: Any) -> tuple[tuple[float, float], ...]:
    """``pairs`` as held-out evidence (:data:`HeldOut`): pairs of probabilities in [0, 1], the true label's at most
    the decided one's.

    Raises:
        OptionError: Naming ``where``, if they are not.
    """
    if not isinstance(pairs, (list, tuple)):
        raise OptionError(f"{where} held_out: expected a list of [decided, true] probability pairs.")
    out = []
    for pair in pairs:
        if not isinstance(pair, (list, tuple)) or len(pair) != 2:
            raise OptionError(f"{where} held_out: expected [decided, true] probability pairs, but got {pair!r}.")
        top, truth = (_probability(f"{where} held_out", v) for v in pair)
        if not 0 <= truth <= top <= 1:
            raise OptionError(f"{where} held_out: expected 0 <= true <= decided <= 1, but got {list(pair)!r}.")
        out.append((top, truth))
    return tuple(out)


def checked_floor(where: str, value: Any) -> float | None:
    """``value`` as an abstention threshold kept with a fitted field: ``None`` or a number in (0, 1].

    Raises:
        OptionError: Naming ``where``, if it is neither.
    """
    if value is None:
        return None
    if not 0 < _probability(f"{where} min_probability", value) <= 1:
        raise OptionError(f"{where} min_probability: expected a number in (0, 1] or None, but got {value!r}.")
    return float(value)


_Kept = TypeVar("_Kept", bound="KeepsHeldOut")


class KeepsHeldOut:
    """Thresholds and prediction sets for a frozen fitted value whose ``fields`` keep ``held_out`` evidence
    (:data:`HeldOut`) and a ``min_probability`` each, found by name with ``field(name)``.

    A subclass names itself in messages (:attr:`kept_by`) and says why a field has no evidence
    (:meth:`_why_none`)."""

    kept_by: ClassVar[str] = "fitted value"
    fields: tuple[Any, ...]

    def field(self, name: str) -> Any:  # pragma: no cover - every subclass has its own
        raise NotImplementedError

    def _why_none(self, entry: Any) -> str:
        return "saved without them; refit it"

    def threshold(self, field: str, *, accuracy: float = 0.95, seed: int = 0) -> Threshold:
        """The abstention threshold at which field ``field``'s held-out examples reach ``accuracy``, with the coverage
        it leaves and a 95% interval of the accuracy there (bootstrap, at least Wilson's; :func:`choose_threshold`
        on the field's ``held_out`` evidence).

        Raises:
            OptionError: If there is no such field, the field keeps no held-out evidence, or ``accuracy`` is not in
                (0, 1].
        """
        return choose_threshold(field, self._held_out(field, "a threshold"), accuracy=accuracy, seed=seed)

    def with_thresholds(self: _Kept, *, accuracy: float, fields: Sequence[str] | None = None, seed: int = 0) -> _Kept:
        """A copy with an abstention threshold (each field's ``min_probability``) chosen for ``accuracy`` by
        :meth:`threshold`; saved with it, and used by every call that decides with it and gives no
        ``min_probability`` of its own.

        Args:
            accuracy: The target accuracy, in (0, 1].
            fields: The fields to set (``None``: every field that keeps held-out evidence).
            seed: Seeds the bootstrap.

        Raises:
            OptionError: As :meth:`threshold`, for a field named in ``fields``.
        """
        named = [f.name for f in self.fields if f.held_out] if fields is None else list(fields)
        chosen = {name: self.threshold(name, accuracy=accuracy, seed=seed).probability for name in named}
        kept = tuple(
            dataclasses.replace(f, min_probability=chosen[f.name]) if f.name in chosen else f for f in self.fields
        )
        return dataclasses.replace(self, fields=kept)  # type: ignore[type-var]

    def set_cutoff(self, field: str, level: float) -> float:
        """The probability a label of field ``field`` needs to join its prediction set at ``level``
        (:func:`set_cutoff`, split conformal on the field's ``held_out`` evidence).

        Raises:
            OptionError: As :meth:`threshold`, or if ``level`` is not in (0, 1).
        """
        return set_cutoff(self._held_out(field, "a prediction set"), level)

    def _held_out(self, field: str, what: str) -> tuple[tuple[float, float], ...]:
        entry = self.field(field)
        if entry is None:
            raise OptionError(
                f"{self.kept_by}: expected one of its fields {[f.name for f in self.fields]}, but got {field!r}."
            )
        if not entry.held_out:
            raise OptionError(f"{self.kept_by} field {field!r}: {what} needs the {self.kept_by.lower()}'s held-out "
                              f"evidence, but it has none ({self._why_none(entry)}).")  # fmt: skip
        return tuple(entry.held_out)
