"""What an extraction returns: values, per-field evidence, warnings and statistics."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pcd_engine.schema import LabelValue, Schema

__all__ = ["Alternative", "ExtractionResult", "ExtractionStats", "FieldResult"]


@dataclass(frozen=True)
class Alternative:
    """One label and its probability.

    Attributes:
        value: The label's value.
        probability: Its probability, renormalized over the field's allowed labels.
    """

    value: LabelValue
    probability: float


@dataclass(frozen=True)
class FieldResult:
    """The decision on one field, with the evidence for it.

    ``probability`` and ``candidate_mass`` are the model's own beliefs, not calibrated confidences.

    Attributes:
        name: The field's key.
        value: The chosen value (an enum's value, not its member; a real bool for boolean fields).
        probability: The model's probability of ``value``, renormalized over the allowed labels and summed over
            surface forms (``true`` / ``"true"``), after ``temperature``.
        candidate_mass: The unconstrained probability that the model's own continuation reaches an allowed label;
            low means the model wanted to write something else. ``None`` for a field with one allowed value.
        method: The strategy that decided: ``"marginal"``, ``"exact"``, ``"trie_walk"`` or ``"fixed"``.
        alternatives: The most probable labels, best first, the chosen one included.
        wave: The wave the field was decided in (0 is first).
    """

    name: str
    value: LabelValue
    probability: float
    candidate_mass: float | None
    method: str
    alternatives: tuple[Alternative, ...]
    wave: int


@dataclass(frozen=True)
class ExtractionStats:
    """Where the time went.

    Attributes:
        phases_ms: Milliseconds per phase: ``tokenize``, ``prefill`` (0 when the head cache hit), ``compile``,
            ``forward``, ``decode`` and ``total``.
        prompt_tokens: Tokens in the request's prompt (head, document and tail).
        cached_tokens: Of those, tokens served from the head's KV cache.
        forward_passes: Forward passes the backend ran for this request, the head prefill included.
        nodes_scored: Tree nodes fed to the model, over all passes.
        waves: Number of waves.
    """

    phases_ms: Mapping[str, float]
    prompt_tokens: int
    cached_tokens: int
    forward_passes: int
    nodes_scored: int
    waves: int


@dataclass(frozen=True)
class ExtractionResult:
    """The outcome of one extraction.

    Attributes:
        values: Field name to value, in schema order; every key present, every value allowed.
        fields: Field name to its :class:`FieldResult`, in schema order.
        warnings: Anything unusual, in words.
        stats: Timings and counts.
        schema: The compiled schema.
    """

    values: dict[str, Any]
    fields: Mapping[str, FieldResult]
    warnings: tuple[str, ...]
    stats: ExtractionStats
    schema: Schema = field(repr=False)

    @property
    def model(self) -> Any:
        """The values validated into the schema's Pydantic model, or ``None`` when it has none."""
        model: Any = self.schema.model
        if model is None:
            return None
        return model.model_validate(self.values)

    def to_json(self) -> dict[str, Any]:
        """The result as plain JSON-ready data: values, per-field evidence, warnings and statistics.

        Alternatives are ``[value, probability]`` pairs, best first.
        """
        fields = {
            name: {
                "value": f.value,
                "probability": f.probability,
                "candidate_mass": f.candidate_mass,
                "alternatives": [[a.value, a.probability] for a in f.alternatives],
                "method": f.method,
                "wave": f.wave,
            }
            for name, f in self.fields.items()
        }
        s = self.stats
        stats = {
            "phases_ms": dict(s.phases_ms),
            "prompt_tokens": s.prompt_tokens,
            "cached_tokens": s.cached_tokens,
            "forward_passes": s.forward_passes,
            "nodes_scored": s.nodes_scored,
            "waves": s.waves,
        }
        return {"values": dict(self.values), "fields": fields, "warnings": list(self.warnings), "stats": stats}

    def low_confidence(self, *, min_probability: float = 0.5, min_candidate_mass: float = 0.2) -> list[FieldResult]:
        """Fields whose probability or candidate mass is below a threshold.

        Args:
            min_probability: Fields with a lower ``probability`` are returned.
            min_candidate_mass: Fields with a lower ``candidate_mass`` are returned.

        Returns:
            The flagged fields, in schema order.
        """
        return [
            f
            for f in self.fields.values()
            if f.probability < min_probability
            or (f.candidate_mass is not None and f.candidate_mass < min_candidate_mass)
        ]
