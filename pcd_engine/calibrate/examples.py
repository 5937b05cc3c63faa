"""What a few labelled examples give a calibration (:meth:`~pcd_engine.calibrate.calibrator.Calibrator.fit`):

- :func:`example_counts` and :func:`example_priors`: each field's label counts among the examples and, add-one
  smoothed, the label shares the corrected distributions are given as their prior;
- :func:`held_out_evidence`: per example, the calibrated probability of the decided label and of the true one, the
  example's own label left out of the prior (:data:`~pcd_engine.heads.thresholds.HeldOut`): what a calibration's
  thresholds and prediction sets are chosen on.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pcd_engine.calibrate.estimators import reweight
from pcd_engine.errors import OptionError
from pcd_engine.schema import FieldSpec

__all__ = ["ExampleCounts", "corrected", "example_counts", "example_priors", "held_out_evidence"]

ExampleCounts = dict[str, tuple[list[int], list[list[int] | None]]]
"""Per field an example labels: per label, how many examples gave it; and per example (in order), the indices of
the labels it gave that field (``None`` where it did not label it; empty where it gave a multi-label field none)."""


def example_counts(closed: Sequence[FieldSpec], examples: Sequence[tuple[str, Mapping[str, Any]]]) -> ExampleCounts:
    """Each closed field's label counts among labelled ``examples`` (:data:`ExampleCounts`).

    Raises:
        OptionError: If an example is not ``(text, mapping)``, names a field that is not calibrated, or gives a
            value the field does not allow.
    """
    by_name = {spec.name: spec for spec in closed}
    out: ExampleCounts = {}
    for i, example in enumerate(examples):
        if not (isinstance(example, tuple) and len(example) == 2 and isinstance(example[1], Mapping)):
            raise OptionError(f"Calibration example {i}: expected (text, {{field: value}}), but got {example!r}.")
        for name, value in example[1].items():
            spec = by_name.get(name)
            if spec is None:
                raise OptionError(
                    f"Calibration example {i}: expected one of the calibrated fields {list(by_name)}, but got {name!r}."
                )
            values = [label.value for label in spec.labels]
            chosen = value if spec.kind == "multi" else [value]
            if not isinstance(chosen, list) or any(v not in values for v in chosen):
                raise OptionError(
                    f"Calibration example {i}, field {name!r}: expected "
                    f"{'a list of ' if spec.kind == 'multi' else ''}values from {values}, but got {value!r}."
                )
            tally, given = out.setdefault(name, ([0] * len(values), [None for _ in examples]))
            given[i] = [values.index(v) for v in chosen]
            for k in given[i] or ():
                tally[k] += 1
    return out


def _shares(tally: Sequence[int], seen: int, multi: bool) -> tuple[float, ...]:
    """Add-one smoothed shares: of each label among ``seen`` examples, or of each label's "yes" (multi-label)."""
    return tuple((c + 1) / (seen + (2 if multi else len(tally))) for c in tally)


def example_priors(closed: Sequence[FieldSpec], counts: ExampleCounts) -> dict[str, tuple[float, ...]]:
    """Each field's label shares among the examples that label it, add-one smoothed (for a multi-label field, each
    label's share of "yes"), for the fields any example labels."""
    multi = {spec.name: spec.kind == "multi" for spec in closed}
    return {
        name: _shares(tally, sum(g is not None for g in given), multi[name]) for name, (tally, given) in counts.items()
    }


def corrected(probabilities: Sequence[float], prior: Sequence[float], bias: Sequence[float]) -> tuple[float, ...]:
    """A single-label field's calibrated distribution: ``prior * p / bias``, renormalized."""
    return reweight(probabilities, [pi / b if b > 0 else 0.0 for pi, b in zip(prior, bias, strict=True)])


def held_out_evidence(
    bias: Sequence[float], tally: Sequence[int], given: Sequence[Sequence[int] | None], rows: Sequence[Sequence[float]]
) -> tuple[tuple[float, float], ...]:
    """A single-label field's held-out evidence from its labelled examples: for each example that labels it, the
    calibrated distribution of its reading (``rows[i]``, the model's own; :func:`corrected`) under the prior of
    the other examples' labels (its own left out of the counts), and from it ``(probability of the decided label,
    probability of the true one)``.

    Args:
        bias: The field's fitted lean (read from texts alone: no example's label enters it, except through an
            ``"em"`` fit's target shares).
        tally: Per label, how many examples gave it.
        given: Per example, the label index it gave (a list of one), or ``None`` where it did not label the field.
        rows: Per example, the model's own distribution over the labels.
    """
    seen = sum(g is not None for g in given)
    out = []
    for labels, row in zip(given, rows, strict=True):
        if labels is None:
            continue
        (truth,) = labels
        others = [c - (k == truth) for k, c in enumerate(tally)]
        prior = _shares(others, seen - 1, False)
        dist = corrected(row, prior, bias)
        out.append((max(dist), dist[truth]))
    return tuple(out)
