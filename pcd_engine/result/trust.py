"""What a call does with its fields' results once they are decided, so that a user knows when to trust them
(issue 58): abstaining below a threshold (:func:`abstain`: the call's ``min_probability``, or a head's threshold
kept with it), and answering a prediction set where held-out evidence gives one a guarantee
(:func:`with_prediction_sets`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from pcd_engine.heads.thresholds import prediction_set
from pcd_engine.result.evidence import FieldResult
from pcd_engine.schema import FieldSpec

__all__ = ["abstain", "with_prediction_sets"]


def abstain(
    specs: Sequence[FieldSpec],
    fields: Mapping[str, FieldResult],
    thresholds: Mapping[str, tuple[float, str]],
    warnings: list[str],
) -> dict[str, FieldResult]:
    """``fields`` with every scored field below its threshold marked ``abstained``: an Optional single-label field
    answers ``None``, any other keeps its label. Each is named in ``warnings``.

    Args:
        specs: The schema's fields, in order.
        fields: Their results, by name.
        thresholds: Per field that has one, its threshold and what set it, in the warning's words
            (``"min_probability 0.9"``).
        warnings: The result's warnings, appended to.
    """
    out = dict(fields)
    for spec in specs:
        f = fields[spec.name]
        if spec.name not in thresholds or f.source != "scored" or f.probability is None:
            continue
        threshold, said = thresholds[spec.name]
        if f.probability >= threshold:
            continue
        nullable = spec.kind != "multi" and any(label.value is None for label in spec.labels)
        out[spec.name] = replace(f, value=None if nullable else f.value, abstained=True)
        outcome = "answered null" if nullable else "kept its best label, flagged (the field cannot be null)"
        warnings.append(f"Field {spec.name!r}: probability {f.probability:.3f} is below {said}; {outcome}.")
    return out


def with_prediction_sets(
    specs: Sequence[FieldSpec],
    fields: Mapping[str, FieldResult],
    cutoffs: Mapping[str, float],
    level: float,
    warnings: list[str],
) -> dict[str, FieldResult]:
    """``fields`` with a prediction set on every scored single-label field that has a cutoff (its labels whose
    probability reaches it, most probable first: :func:`~pcd_engine.heads.thresholds.prediction_set`), and on every
    field with one label (that label); the other scored single-label fields are named in one warning.

    Args:
        specs: The schema's fields, in order.
        fields: Their results, by name.
        cutoffs: Per field, the probability a label needs to join its set at ``level``
            (:func:`~pcd_engine.heads.thresholds.set_cutoff` on the decider's held-out evidence).
        level: The level asked for (for the warning).
        warnings: The result's warnings, appended to.
    """
    out = dict(fields)
    missing = []
    for spec in specs:
        f = fields[spec.name]
        if f.source != "scored" or spec.kind == "multi":
            continue
        labels = [label.value for label in spec.labels]
        if f.label_distribution is None:  # one label: the set is certain
            out[spec.name] = replace(f, prediction_set=(labels[0],))
        elif spec.name in cutoffs:
            out[spec.name] = replace(f, prediction_set=prediction_set(labels, f.label_distribution, cutoffs[spec.name]))
        else:
            missing.append(spec.name)
    if missing:
        warnings.append(
            f"Fields {missing}: no prediction set at {level} (it needs held-out evidence from labelled examples: a "
            "head fitted with Head.fit or pcd fit keeps it, and so does a calibration fitted with examples)."
        )
    return out
