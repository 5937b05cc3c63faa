"""Promotion: a candidate head replaces the live one only when it decides the outcomes that came in better.

A served head with a shadow (``pcd serve --head NAME=LIVE --shadow NAME=CANDIDATE --log LOG``) answers with the live
head and logs the candidate's decision beside it; the outcomes posted for those requests say which was right.
:func:`compare` scores both on them, field by field, with the gate's statistics
(:func:`~pcd_engine.heads.gates.gate`: accuracy, macro-F1, ECE, Brier, a 95% paired bootstrap interval of the
accuracy gained), and :class:`Promotion` says whether the candidate is better and, when it is not, why.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pcd_engine.errors import OptionError
from pcd_engine.heads.gates import Gate, gate
from pcd_engine.heads.head import Head

__all__ = ["Promotion", "Shadowed", "compare"]


@dataclass(frozen=True)
class Shadowed:
    """One shadowed decision with its outcome.

    Attributes:
        live: The live head's distribution per field (label order), as the log keeps it.
        candidate: The candidate's, on the same request.
        outcome: The right values of some fields, by name.
    """

    live: Mapping[str, Sequence[float]]
    candidate: Mapping[str, Sequence[float]]
    outcome: Mapping[str, Any]


@dataclass(frozen=True)
class Promotion:
    """The candidate against the live head on the same outcomes.

    Attributes:
        gates: Per field the candidate scored against the live head (the gate's ``head`` is the candidate, its
            ``zero_shot`` the live head).
        promote: Whether the candidate is better: no field's accuracy lower, and at least one field better beyond
            chance (its interval's lower end above 0).
        why: In words, why it is or is not promoted.
    """

    gates: tuple[Gate, ...]
    promote: bool
    why: str


def compare(live: Head, candidate: Head, shadowed: Sequence[Shadowed], *, seed: int = 0) -> Promotion:
    """Score the candidate against the live head on the shadowed decisions' outcomes (see the module docstring).

    Each field both heads decide is compared on the decisions whose outcome names it with one of its labels and
    whose log holds both distributions.

    Raises:
        OptionError: If the heads were fitted on different schemas.
    """
    if live.schema_fingerprint != candidate.schema_fingerprint:
        raise OptionError(f"Promotion: expected a candidate of the live head's schema ({live.schema_title!r}), but "
                          f"it was fitted on {candidate.schema_title!r}.")  # fmt: skip
    gates = []
    for field in live.fields:
        if candidate.field(field.name) is None or field.kind != "single":
            continue
        live_rows, candidate_rows, gold = [], [], []
        for case in shadowed:
            value = case.outcome.get(field.name)
            index = next((i for i, v in enumerate(field.labels) if v == value and type(v) is type(value)), None)
            p, q = case.live.get(field.name), case.candidate.get(field.name)
            if index is None or p is None or q is None or not len(p) == len(q) == len(field.labels):
                continue
            live_rows.append(list(p))
            candidate_rows.append(list(q))
            gold.append(index)
        if gold:
            gates.append(gate(field.name, candidate_rows, live_rows, gold, seed=seed))
    if not gates:
        return Promotion((), False, "no outcome names a field both heads decide, so nothing says which is better")
    worse = [g for g in gates if g.gain < 0]
    better = [g for g in gates if g.better]
    if worse:
        return Promotion(tuple(gates), False, "the candidate is worse on " + "; ".join(map(_said, worse)))
    if not better:
        why = "the candidate is not better beyond chance: " + "; ".join(map(_said, gates))
        return Promotion(tuple(gates), False, why)
    return Promotion(tuple(gates), True, "the candidate is better on " + "; ".join(map(_said, better)))


def _said(g: Gate) -> str:
    """A field's comparison in words, in points."""
    return (f"{g.field!r} ({g.gain * 100:+.1f} points, 95% interval {g.interval[0] * 100:+.1f} to "
            f"{g.interval[1] * 100:+.1f}, on {g.held_out} outcomes)")  # fmt: skip
