"""What an extraction returns: values, per-field evidence (scored or generated), warnings and statistics."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from pcd_engine.schema import LabelValue, Schema

__all__ = ["Alternative", "ExtractionResult", "ExtractionStats", "FieldResult", "TokenUsage"]


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
        method: How it was decided: ``"marginal"``, ``"exact"``, ``"trie_walk"``, ``"fixed"``, ``"generated"``, or
            ``"head"`` (a decision head, :mod:`pcd_engine.heads.head`, read from the same pass).
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
        bounded_labels: For a field read in stages (:mod:`pcd_engine.decide.staging`), how many labels were proven to
            lose without reading their last tokens: their probabilities (and so ``candidate_mass`` and the
            renormalized ``probability``) use an upper bound of their score. 0 when every label was read in full.
        raw_probability: With a calibration (:mod:`pcd_engine.calibrate.calibrator`), the model's own probability of
            ``value`` before the correction (``probability``, ``alternatives`` and ``label_probabilities`` are
            the calibrated ones, and the decision follows them); ``None`` without one.
        label_distribution: For a scored single-label field, every label's probability in label order (what
            ``alternatives`` shows the top of; calibrated with a calibration); ``None`` otherwise.
        abstained: True when the call's ``min_probability`` (or, without one, the head's threshold for the field,
            :attr:`~pcd_engine.heads.fields.FieldHead.min_probability`) was above ``probability``: an Optional field's
            ``value`` is then ``None`` (``alternatives`` keep the labels the model preferred), any other field
            keeps its best label, flagged.
        correction: Which correction decided the field: ``"calibration"`` (the call's fitted calibrator),
            ``"batch"`` or ``"content_free"`` (:mod:`pcd_engine.deciders.corrections`), or ``"head"`` (the call's
            decision head); ``None`` when the model's own distribution decided it. With one, ``raw_probability``
            and ``raw_distribution`` are the model's own figures.
        lean: With a correction, the lean divided out: the prior ``b`` over the labels in label order (for a
            multi-label field, each label's prior of "yes"); ``None`` otherwise.
        raw_distribution: With a correction of a single-label field, the model's own distribution over the
            labels before it, in label order (from the same pass); ``None`` otherwise.
        prediction_set: With the call option ``prediction_set`` (a level, e.g. 0.9) and held-out evidence for the
            field (a head's), the smallest set of labels that holds the true one with at least that probability
            (split conformal, :func:`~pcd_engine.heads.thresholds.set_cutoff`; on documents exchangeable with the
            head's examples), most probable first; ``None`` otherwise.
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
    bounded_labels: int = 0
    raw_probability: float | None = None
    label_distribution: tuple[float, ...] | None = None
    abstained: bool = False
    correction: str | None = None
    lean: tuple[float, ...] | None = None
    raw_distribution: tuple[float, ...] | None = None
    prediction_set: tuple[LabelValue, ...] | None = None

    def runners_up(self, n: int = 2) -> tuple[Alternative, ...]:
        """The ``n`` most probable alternatives that are not the answer, best first: for a multi-label field the
        labels it did not choose, for the others the labels other than ``value``."""
        chosen = self.value if isinstance(self.value, list) else [self.value]
        return tuple(a for a in self.alternatives if a.value not in chosen)[:n]


@dataclass(frozen=True)
class TokenUsage:
    """The tokens a reply read and wrote, in the shapes the APIs report them (one builder for every surface).

    Attributes:
        prompt_tokens: Tokens of the prompt.
        completion_tokens: Tokens written (generated).
    """

    prompt_tokens: int
    completion_tokens: int

    @property
    def total_tokens(self) -> int:
        """Prompt and completion together."""
        return self.prompt_tokens + self.completion_tokens

    def chat_completions(self) -> dict[str, int]:
        """As OpenAI's Chat Completions report it: ``prompt_tokens``, ``completion_tokens``, ``total_tokens``."""
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                "total_tokens": self.total_tokens}  # fmt: skip

    def input_output(self) -> dict[str, int]:
        """As LangChain's ``usage_metadata`` and OpenAI's Responses API report it: ``input_tokens``,
        ``output_tokens``, ``total_tokens``."""
        return {"input_tokens": self.prompt_tokens, "output_tokens": self.completion_tokens,
                "total_tokens": self.total_tokens}  # fmt: skip


@dataclass(frozen=True)
class ExtractionStats:
    """Where the time went.

    Attributes:
        phases_ms: Milliseconds per phase: ``tokenize``, ``prefill`` (0 when the preamble cache hit), ``correction``
            (reading the content-free lean; 0 when the engine had it), ``compile``, ``forward``, ``decode``,
            ``generate`` (open fields) and ``total``.
        prompt_tokens: Tokens in the request's prompt (head, document and tail).
        cached_tokens: Of those, tokens served from the preamble's KV cache.
        forward_passes: Forward passes the backend ran for this request, the preamble prefill and the content-free
            lean's reading included.
        nodes_scored: Tree nodes fed to the model, over all passes.
        nodes_saved: Tree nodes a one-pass reading of every wave's whole tree would have fed beyond
            ``nodes_scored``: the tails below the identifying tokens of marginal fields, and the tails of labels a
            staged wave proved cannot win (see :mod:`pcd_engine.decide.staging`).
        stage_passes: Scoring passes spent on the later stages of staged waves (included in ``forward_passes``).
        waves: Number of waves of scored fields.
        generation_passes: Forward passes spent generating open fields (all rows advance together, so this is
            the longest row's length, not the sum).
        generated_tokens: Tokens generated over all open fields.
        prefill_passes: Of ``forward_passes``, those that prefilled the schema preamble (0 when its cache hit; more
            than 1 when the memory budget split a long head into chunks).
        correction_passes: Of ``forward_passes``, those that read the schema's content-free lean
            (:mod:`pcd_engine.deciders.corrections`; 0 when the engine had it already, or the call has no such
        correction).
        documents_per_pass: For each scoring pass of the request, how many documents shared it (1 when it ran
            alone; more in a batch of :meth:`~pcd_engine.engine.Engine.extract_many`).
        draft_tokens: Tokens the open rows proposed from the document (checked in the rows' own passes; see
            :mod:`pcd_engine.generate.drafting`).
        accepted_tokens: Of those, the tokens the model chose as proposed: each saved a generation pass.
    """

    phases_ms: Mapping[str, float]
    prompt_tokens: int
    cached_tokens: int
    forward_passes: int
    nodes_scored: int
    waves: int
    nodes_saved: int = 0
    stage_passes: int = 0
    generation_passes: int = 0
    generated_tokens: int = 0
    prefill_passes: int = 0
    correction_passes: int = 0
    documents_per_pass: tuple[int, ...] = ()
    draft_tokens: int = 0
    accepted_tokens: int = 0

    @property
    def tokens_per_step(self) -> float:
        """Generated tokens per generation pass (0 without open fields); above 1 when drafts or forced tokens
        let a row advance by several tokens in one pass."""
        return self.generated_tokens / self.generation_passes if self.generation_passes else 0.0


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

        Alternatives are ``[value, probability]`` pairs, best first; a calibrated or corrected field adds
        ``raw_probability``, ``correction`` and ``lean``.
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
            if f.raw_probability is not None:  # calibrated: the model's own figure too
                entry["raw_probability"] = f.raw_probability
            if f.correction is not None:  # which lean was divided out, and the lean itself
                entry["correction"] = f.correction
                entry["lean"] = list(f.lean or ())
            if f.abstained:
                entry["abstained"] = True
            if f.prediction_set is not None:
                entry["prediction_set"] = list(f.prediction_set)
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
            "correction_passes": s.correction_passes,
            "documents_per_pass": list(s.documents_per_pass),
            "draft_tokens": s.draft_tokens,
            "accepted_tokens": s.accepted_tokens,
        }
        return {"values": dict(self.values), "fields": fields, "warnings": list(self.warnings), "stats": stats}

    def evidence(self) -> dict[str, Any]:
        """The part of :meth:`to_json` a chat reply carries in its metadata: ``fields``, ``warnings``, the number
        of ``forward_passes`` and ``documents_per_pass`` (how many documents shared each scoring pass)."""
        data = self.to_json()
        return {
            "fields": data["fields"],
            "warnings": data["warnings"],
            "forward_passes": self.stats.forward_passes,
            "documents_per_pass": list(self.stats.documents_per_pass),
        }

    def low_confidence(self, *, min_probability: float = 0.5, min_candidate_mass: float = 0.2) -> list[FieldResult]:
        """Scored fields whose probability or candidate mass is below a threshold or that abstained (the call's
        ``min_probability``), and generated fields that were cut or could not be completed.

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
            or f.abstained
        ]
