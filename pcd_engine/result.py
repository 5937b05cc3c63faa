"""What an extraction returns: values, per-field evidence (scored or generated), warnings and statistics."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from pcd_engine.schema import LabelValue, Schema

__all__ = ["Alternative", "ExtractionResult", "ExtractionStats", "FieldResult"]


@dataclass(frozen=True)
class Alternative:
    """One label and its probability.

    Attributes:
        value: The label's value.
        probability: Its probability, renormalized over the field's allowed labels (for a multi-label field, its
            probability of applying).
    """

    value: LabelValue
    probability: float


@dataclass(frozen=True)
class FieldResult:
    """The answer for one field, with the evidence for it.

    ``probability``, ``candidate_mass`` and ``mean_logprob`` are the model's own beliefs, not calibrated
    confidences.

    Attributes:
        name: The field's key.
        value: The chosen value (an enum's value, not its member; a real bool for boolean fields; a list of
            labels for a multi-label field; any JSON value for an open field).
        probability: For a scored field, the model's probability of ``value``, renormalized over the allowed
            labels and summed over surface forms (``true`` / ``"true"``), after ``temperature``. For a
            multi-label field, the probability of the least certain of its yes/no decisions. ``None`` for a
            generated field.
        candidate_mass: The unconstrained probability that the model's own continuation reaches an allowed label
            (for a multi-label field, the lowest over its yes/no questions); low means the model wanted to write
            something else. ``None`` for a field with one allowed value and for generated fields.
        method: How it was decided: ``"marginal"``, ``"exact"``, ``"trie_walk"``, ``"fixed"`` or
            ``"generated"``.
        alternatives: The most probable labels, best first, the chosen one included. For a multi-label field,
            every label with its probability of applying; empty for a generated field.
        wave: The wave the field was decided in (0 is first; generated fields come after the last wave).
        source: ``"scored"`` (decided from a token trie) or ``"generated"`` (written under its JSON Schema).
        label_probabilities: For a multi-label field, each label's probability of applying, in label order;
            otherwise ``None``.
        mean_logprob: For a generated field, the mean log-probability of its tokens under the model's
            unconstrained distribution (labelled as such: it is not a probability of the value); else ``None``.
        tokens: For a generated field, the tokens generated; else 0.
        truncated: True when a generated value hit its token limit and was cut (strings are closed where cut;
            a value that cannot be completed validly is ``None``).
    """

    name: str
    value: Any
    probability: float | None
    candidate_mass: float | None
    method: str
    alternatives: tuple[Alternative, ...]
    wave: int
    source: Literal["scored", "generated"] = "scored"
    label_probabilities: Mapping[LabelValue, float] | None = None
    mean_logprob: float | None = None
    tokens: int = 0
    truncated: bool = False


@dataclass(frozen=True)
class ExtractionStats:
    """Where the time went.

    Attributes:
        phases_ms: Milliseconds per phase: ``tokenize``, ``prefill`` (0 when the head cache hit), ``compile``,
            ``forward``, ``decode``, ``generate`` (open fields) and ``total``.
        prompt_tokens: Tokens in the request's prompt (head, document and tail).
        cached_tokens: Of those, tokens served from the head's KV cache.
        forward_passes: Forward passes the backend ran for this request, the head prefill included.
        nodes_scored: Tree nodes fed to the model, over all passes.
        waves: Number of waves of scored fields.
        generation_passes: Forward passes spent generating open fields (all rows advance together, so this is
            the longest row's length, not the sum).
        generated_tokens: Tokens generated over all open fields.
        prefill_passes: Of ``forward_passes``, those that prefilled the schema head (0 when its cache hit; more
            than 1 when the memory budget split a long head into chunks).
    """

    phases_ms: Mapping[str, float]
    prompt_tokens: int
    cached_tokens: int
    forward_passes: int
    nodes_scored: int
    waves: int
    generation_passes: int = 0
    generated_tokens: int = 0
    prefill_passes: int = 0


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
        fields: dict[str, Any] = {}
        for name, f in self.fields.items():
            entry: dict[str, Any] = {
                "value": f.value,
                "source": f.source,
                "probability": f.probability,
                "candidate_mass": f.candidate_mass,
                "alternatives": [[a.value, a.probability] for a in f.alternatives],
                "method": f.method,
                "wave": f.wave,
            }
            if f.label_probabilities is not None:
                entry["label_probabilities"] = [[v, p] for v, p in f.label_probabilities.items()]
            if f.source == "generated":
                entry.update(mean_logprob=f.mean_logprob, tokens=f.tokens, truncated=f.truncated)
            fields[name] = entry
        s = self.stats
        stats = {
            "phases_ms": dict(s.phases_ms),
            "prompt_tokens": s.prompt_tokens,
            "cached_tokens": s.cached_tokens,
            "forward_passes": s.forward_passes,
            "nodes_scored": s.nodes_scored,
            "waves": s.waves,
            "generation_passes": s.generation_passes,
            "generated_tokens": s.generated_tokens,
            "prefill_passes": s.prefill_passes,
        }
        return {"values": dict(self.values), "fields": fields, "warnings": list(self.warnings), "stats": stats}

    def low_confidence(self, *, min_probability: float = 0.5, min_candidate_mass: float = 0.2) -> list[FieldResult]:
        """Scored fields whose probability or candidate mass is below a threshold, and generated fields that
        were cut or could not be completed.

        Args:
            min_probability: Fields with a lower ``probability`` are returned.
            min_candidate_mass: Fields with a lower ``candidate_mass`` are returned.

        Returns:
            The flagged fields, in schema order.
        """
        return [
            f
            for f in self.fields.values()
            if (f.probability is not None and f.probability < min_probability)
            or (f.candidate_mass is not None and f.candidate_mass < min_candidate_mass)
            or f.truncated
        ]
