"""What every decider is: :class:`Decider`, and what it gives back, :class:`Reading`.

A decider is the one object that turns what a call's passes read into each closed field's decision. A call
resolves exactly one (:func:`pcd_engine.deciders.decider_for`, from the options' ``correction``, ``calibration``
and ``head``); the run layer asks it, and never tests which kind it is::

    options ──decider_for──> Decider ──open_lean──> Lean            (once per request: a fitted or content-free lean)
                               │      ──estimates_on_batch───────>  (the batch's leans, wave by wave)
                               └──────decide(spec, decisions, lean, features)──> Reading ──> FieldResult

It owns what it needs from the pass (whole or marginal readings, the hidden-state features a head reads, a lean
read once per schema or per batch), how it decides, and what it reports (the ``correction`` and ``method`` a
result shows, the model's own distribution beside its own). Adding a correction, a calibration kind or a head kind
is one subclass, its tests and its docs.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from pcd_engine.schema import FieldSpec, Schema

if TYPE_CHECKING:
    from pcd_engine.calibrate.calibrator import Calibrator, FieldPrior

__all__ = ["WHOLE_METHODS", "Decided", "Decider", "Lean", "Reading", "full_distribution", "own_distribution"]

WHOLE_METHODS = ("marginal", "exact")
"""The strategies whose decisions give every label its probability (when no label was left to a bound)."""


class Decided(Protocol):
    """What a decider reads of a decision (:class:`~pcd_engine.decide.decoding.Decision`)."""

    @property
    def method(self) -> str: ...

    @property
    def bounded(self) -> int: ...

    @property
    def probabilities(self) -> Sequence[float]: ...


def full_distribution(decisions: Sequence[Decided]) -> bool:
    """Whether one field's decisions (one, or one per label of a multi-label field) give every label its
    probability, so that a lean can be divided out of them: decided by the marginal or the exact strategy, with no
    label scored by a staged reading's bound."""
    return bool(decisions) and all(d.method in WHOLE_METHODS and not d.bounded for d in decisions)


def own_distribution(spec: FieldSpec, decisions: Sequence[Decided]) -> tuple[float, ...]:
    """The model's own reading of field ``spec``: its label distribution, or each label's probability of "yes" for
    a multi-label field (one decision per label)."""
    if spec.kind == "multi":
        return tuple(d.probabilities[0] for d in decisions)
    return tuple(decisions[0].probabilities)


@dataclass(frozen=True)
class Lean:
    """The lean a request opens with (:meth:`Decider.open_lean`).

    Attributes:
        source: What a field corrected with it reports as its ``correction`` (the decider's
            :attr:`Decider.source`); ``None`` when nothing is divided out.
        priors: The per-field leans (a :class:`~pcd_engine.calibrate.calibrator.Calibrator`: the call's, or the
            content-free one); ``None`` when there are none, or they come with each wave (a batch's).
        passes: Forward passes spent reading it (0 when it was kept or not needed).
        ms: Milliseconds spent on it.
    """

    source: str | None = None
    priors: Calibrator | None = None
    passes: int = 0
    ms: float = 0.0

    def field(self, name: str) -> FieldPrior | None:
        """Field ``name``'s lean, or ``None``."""
        return None if self.priors is None else self.priors.field(name)


@dataclass(frozen=True)
class Reading:
    """One field's distribution as its decider decides it.

    Attributes:
        probabilities: What decides: the label distribution (a multi-label field: each label's probability of
            "yes"), in label order.
        raw: The model's own reading of the same pass, in the same shape.
        by: What the result reports as its ``correction`` (``"calibration"``, ``"content_free"``, ``"batch"``,
            ``"head"``); ``None`` when the model's own reading decides (``probabilities`` is then ``raw``).
        lean: The lean divided out (the prior over the labels; a multi-label field: each label's prior of "yes"),
            or ``None``.
        method: The method the result reports in place of the decision's own (``"head"``), or ``None``.
    """

    probabilities: tuple[float, ...]
    raw: tuple[float, ...]
    by: str | None = None
    lean: tuple[float, ...] | None = None
    method: str | None = None

    @property
    def own(self) -> bool:
        """Whether the model's own reading decides."""
        return self.by is None


LeanReader = Callable[[str | None], "Calibrator"]
"""Reads the content-free lean of a call's schema with a strategy (``None``: the engine's choice); given by the run
layer, which owns the passes (:func:`~pcd_engine.run.batch.open_lean`)."""


class Decider(ABC):
    """How a call decides its closed fields from what its passes read.

    Every method takes the call's ``strategy`` (``None``: the engine's choice) and the engine's
    ``marginal_max_labels`` where how a field is read matters.
    """

    @property
    @abstractmethod
    def name(self) -> str:
        """How messages and cache keys name this decider."""

    @property
    def source(self) -> str | None:
        """What a field this decider corrects reports as its ``correction`` (``None``: it corrects nothing)."""
        return None

    @property
    def reads_whole(self) -> bool:
        """The call reads every closed field whole (``staging="one_pass"``, the trie walk as ``"exact"``), so that
        every label has its probability."""
        return False

    @property
    def estimates_on_batch(self) -> bool:
        """The lean is estimated on the documents one caller decides together, wave by wave, not read when a
        request opens."""
        return False

    @property
    def fitted_on_order(self) -> bool:
        """The decider was fitted on one schema's prompt, its labels in their order (a calibration, a head): it
        cannot decide the same schema with its labels listed in another order (``label_orders``)."""
        return False

    @property
    def reads_features(self) -> bool:
        """The call keeps the hidden-state features of its passes (what a decision head reads)."""
        return False

    def check(self, schema: Schema, model: str) -> None:  # noqa: B027 - most deciders are fitted on nothing
        """Refuse a schema or model this decider was not fitted on.

        Raises:
            OptionError: If it was fitted on another schema or model.
        """

    @abstractmethod
    def corrects(self, spec: FieldSpec, *, strategy: str | None, marginal_max_labels: int) -> bool:
        """Whether this decider divides a lean out of field ``spec`` read under ``strategy``, when its reading
        gives every label its probability."""

    def correctable(
        self, spec: FieldSpec, decisions: Sequence[Decided], *, strategy: str | None, marginal_max_labels: int
    ) -> bool:
        """Whether a lean may be divided out of field ``spec``'s ``decisions``: a field this decider corrects, read
        so that every label has its probability (:func:`full_distribution`)."""
        return self.corrects(spec, strategy=strategy, marginal_max_labels=marginal_max_labels) and full_distribution(
            decisions
        )

    def open_lean(self, schema: Schema, *, strategy: str | None, marginal_max_labels: int, read: LeanReader) -> Lean:
        """The lean a request of ``schema`` opens with; ``read`` reads the content-free one, for a decider that
        divides it out (none by default)."""
        return Lean()

    def threshold(self, spec: FieldSpec) -> float | None:
        """Field ``spec``'s own abstention threshold, kept with what decides it (a head's,
        :attr:`~pcd_engine.heads.fields.FieldHead.min_probability`); ``None`` by default."""
        return None

    def set_cutoff(self, spec: FieldSpec, level: float) -> float | None:
        """The probability a label of field ``spec`` needs to join its prediction set at ``level``, from held-out
        evidence of how this decider decides it (a head's folds); ``None`` where it has none (the default)."""
        return None

    def small_batch_warning(self, documents: int) -> str | None:
        """The warning a request gets when its batch had ``documents`` documents, too few for the lean; ``None``
        when the lean is not the batch's or the batch was large enough."""
        return None

    def decide(
        self,
        spec: FieldSpec,
        decisions: Sequence[Decided],
        *,
        lean: FieldPrior | None,
        features: Any,
        strategy: str | None,
        marginal_max_labels: int,
    ) -> Reading:
        """Field ``spec``'s reading from its ``decisions`` (one, or one per label of a multi-label field).

        Args:
            spec: The field.
            decisions: Its decisions from the call's passes.
            lean: The field's lean, from the request's :class:`Lean` or the batch's wave (``None``: none).
            features: The field's hidden-state features (``None``: not kept).
            strategy: The call's strategy.
            marginal_max_labels: The engine's ``marginal_max_labels``.

        Returns:
            The lean divided out where this decider corrects the field and its reading allows it; else the model's
            own reading.
        """
        raw = own_distribution(spec, decisions)
        if lean is None or self.source is None or (spec.kind != "multi" and len(raw) <= 1):
            return Reading(raw, raw)
        if not self.correctable(spec, decisions, strategy=strategy, marginal_max_labels=marginal_max_labels):
            return Reading(raw, raw)
        if spec.kind == "multi":
            corrected = tuple(lean.correct_yes(i, p) for i, p in enumerate(raw))
        else:
            corrected = tuple(lean.correct(raw))
        return Reading(corrected, raw, by=self.source, lean=tuple(lean.bias))
