"""Building a field's result: from its decisions and the reading its decider made of them (a scored field), from
its grown row (a generated one). Abstaining and prediction sets come after (:mod:`~pcd_engine.result.trust`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from pcd_engine.result.evidence import Alternative, FieldResult
from pcd_engine.schema import FieldSpec

if TYPE_CHECKING:
    from pcd_engine.decide.decoding import Decision
    from pcd_engine.deciders import Reading
    from pcd_engine.generate.open_rows import Generated

__all__ = ["field_result", "generated_result", "multi_result", "scored_result"]


def field_result(
    spec: FieldSpec,
    decisions: Sequence[Decision],
    reading: Reading,
    wave: int,
    warnings: list[str],
    *,
    top_k: int,
    low_mass_warning: float,
) -> FieldResult:
    """A closed field's result from its ``decisions`` (one, or one per label of a multi-label field) and the
    ``reading`` its call's decider made of them (:meth:`~pcd_engine.deciders.Decider.decide`): a multi-label
    field's by :func:`multi_result`, any other's by :func:`scored_result`."""
    if spec.kind == "multi":
        return multi_result(spec, decisions, reading, wave, warnings, top_k=top_k, low_mass_warning=low_mass_warning)
    return scored_result(spec, decisions[0], reading, wave, warnings, top_k=top_k, low_mass_warning=low_mass_warning)


def multi_result(
    spec: FieldSpec,
    decisions: Sequence[Decision],
    reading: Reading,
    wave: int,
    warnings: list[str],
    *,
    top_k: int,
    low_mass_warning: float,
) -> FieldResult:
    """One yes/no decision per label, then ``min_items`` / ``max_items``: the most probable labels are added
    or kept, and the list is in label order. Each label's "yes" is the ``reading``'s (the model's own, or its
    decider's: a lean divided out, or a head's)."""
    raw, yes = reading.raw, reading.probabilities
    by_yes = sorted(range(len(yes)), key=lambda i: (-yes[i], i))
    chosen = {i for i in by_yes if yes[i] >= 0.5}
    chosen |= set(by_yes[: spec.min_items])
    if spec.max_items is not None and len(chosen) > spec.max_items:
        chosen = set([i for i in by_yes if i in chosen][: spec.max_items])
    masses = [d.candidate_mass for d in decisions if d.candidate_mass is not None]
    mass = min(masses) if masses else None
    if mass is not None and mass < low_mass_warning:
        warnings.append(
            f"Field {spec.name!r}: the model put only {mass:.1%} of its probability on true or false for some "
            "of the labels; it wanted to write something else."
        )
    sure = [yes[i] if i in chosen else 1.0 - yes[i] for i in range(len(yes))]
    least = min(range(len(yes)), key=lambda i: (sure[i], i))
    return FieldResult(
        name=spec.name,
        value=[spec.labels[i].value for i in sorted(chosen)],
        probability=sure[least],
        candidate_mass=mass,
        method=reading.method or decisions[0].method,
        alternatives=tuple(Alternative(spec.labels[i].value, yes[i]) for i in by_yes[:top_k]),
        wave=wave,
        label_probabilities={label.value: p for label, p in zip(spec.labels, yes, strict=True)},
        raw_probability=None if reading.own else (raw[least] if least in chosen else 1 - raw[least]),
        correction=reading.by,
        lean=reading.lean,
    )


_FILLED = {
    "default": "the field's default",
    "smallest": "the smallest value its schema accepts",
    "none": "null: its schema has no smallest value pcd can build",
}
"""What a generated value that could not be completed holds, by :attr:`~pcd_engine.generate.open_rows.Generated.how`,
in the warning's words."""


def generated_result(
    spec: FieldSpec, generated: Generated, wave: int, default_limit: int, warnings: list[str]
) -> FieldResult:
    """A generated field's result; a cut or invalid value adds a warning."""
    if generated.truncated:
        limit = spec.token_limit(default_limit)
        what = {"closed": "it was closed where it was cut", "cut back": "it was cut back to its last complete item"}
        said = what.get(generated.how) or f"it could not be completed and is {_FILLED[generated.how]}"
        warnings.append(f"Field {spec.name!r}: the value reached its limit of {limit} tokens; {said}.")
    elif generated.how != "written":
        warnings.append(
            f"Field {spec.name!r}: the generated value {generated.text!r} is not valid; it is {_FILLED[generated.how]}."
        )
    return FieldResult(
        name=spec.name,
        value=generated.value,
        probability=None,
        candidate_mass=None,
        method="generated",
        alternatives=(),
        wave=wave,
        source="generated",
        mean_logprob=generated.mean_logprob,
        tokens=generated.tokens,
        truncated=generated.truncated,
    )


def scored_result(
    spec: FieldSpec,
    decision: Decision,
    reading: Reading,
    wave: int,
    warnings: list[str],
    *,
    top_k: int,
    low_mass_warning: float,
) -> FieldResult:
    """A scored field's result: its label, probability, mass and alternatives; a low mass or a near tie adds a
    warning. Where the ``reading`` is its decider's (a lean divided out, or a head's distribution), that
    distribution decides (its argmax, the lowest index on a tie) and the model's own is kept as the raw one; else
    the decision's own label stands."""
    corrected = not reading.own
    probs = reading.probabilities if corrected else decision.probabilities
    label = max(range(len(probs)), key=lambda i: (probs[i], -i)) if corrected else decision.label
    order = sorted(range(len(probs)), key=lambda i: (-probs[i], i))[:top_k]
    alternatives = tuple(Alternative(spec.labels[i].value, probs[i]) for i in order)
    mass = decision.candidate_mass
    if mass is not None and mass < low_mass_warning:
        warnings.append(
            f"Field {spec.name!r}: the model put only {mass:.1%} of its probability on the allowed labels; "
            "it wanted to write something else."
        )
    if len(order) > 1 and probs[order[0]] - probs[order[1]] < 0.02:
        warnings.append(
            f"Field {spec.name!r}: {spec.labels[order[0]].value!r} and {spec.labels[order[1]].value!r} are "
            f"nearly tied ({probs[order[0]]:.2f} vs {probs[order[1]]:.2f})."
        )
    return FieldResult(
        name=spec.name,
        value=spec.labels[label].value,
        probability=probs[label],
        candidate_mass=mass,
        method=reading.method or decision.method,
        alternatives=alternatives,
        wave=wave,
        bounded_labels=decision.bounded,
        raw_probability=decision.probabilities[label] if corrected else None,
        label_distribution=tuple(probs) if len(probs) > 1 else None,
        correction=reading.by,
        lean=reading.lean,
        raw_distribution=tuple(decision.probabilities) if corrected else None,
    )
