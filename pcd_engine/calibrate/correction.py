"""Corrections of the model's label lean that need nothing from the user: one object per correction.

A small model leans towards some labels whatever the document says (:mod:`pcd_engine.calibrate.calibrator` explains
the prior correction ``p(y|x) ~ q(y|x) / b(y)``). Two different quantities hide in a batch's raw distributions: the
model's **lean** ``b`` (a preference for some labels whatever the text) and the documents' **label mix** (a queue
that is 80% billing). Only the lean is a defect to divide out. A lean estimated on the batch itself mixes the two,
and dividing it out forces every batch towards uniform labels, which makes a capable model wrong on a skewed batch.

Each correction is a :class:`Correction`: what it reads (which fields, read how), where its lean comes from, and
what it reports. The options name one (:data:`CORRECTIONS`); :func:`correction_named` gives the object, and no
other module compares correction names. Adding a correction is a subclass here, its tests and its docs.

* ``"auto"`` (:class:`Auto`, the engine's default): the **content-free lean**, the mean distribution on
  :data:`CONTENT_FREE_TEXTS` (inputs that say nothing, Zhao et al. 2021), read once per schema and kept with the
  engine, divided out of the single-choice fields of up to ``marginal_max_labels`` labels, read as a plain call
  reads them (marginal: no extra nodes per call). It never depends on the other documents of a call, so a
  document's answer is the same alone, in any batch, and on the server whoever else is asking.
  ``benchmarks/bench_corrections.py`` measures it on balanced and skewed batches of weak and capable readers.
* ``"content_free"`` (:class:`ContentFree`): the same lean, with every closed field read whole and corrected.
* ``"batch"`` (:class:`Batch`): the lean estimated on the documents one caller decides together (``extract_many``,
  ``pcd tag``): wave by wave, each closed field's ``b`` is the EM prior of the batch's distributions
  (:func:`~pcd_engine.calibrate.calibrator.em_bias`: the prior under which the corrected distributions average to
  uniform). It **assumes the labels are about equally common in the batch**: on a balanced batch it is the
  strongest correction measured for a weak model, on a skewed one it pulls answers away from the majority label.
  A batch of fewer than :data:`MIN_BATCH` documents is left uncorrected, with a warning. Documents of different
  callers are never pooled (the server corrects each request on its own).
* ``"none"`` (:class:`NoCorrection`): the model's own distributions.

A lean is only ever divided out of a distribution that gives every label its probability
(:func:`full_distribution`): a staged reading's bounds or the greedy walk's distribution are decided as read.
The batch's label mix is estimated apart, for the user to see (:mod:`pcd_engine.calibrate.shares`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar, Protocol

from pcd_engine.calibrate.calibrator import Calibrator, FieldPrior
from pcd_engine.errors import OptionError
from pcd_engine.schema import FieldSpec, Schema

__all__ = [
    "CONTENT_FREE_TEXTS",
    "CORRECTIONS",
    "CORRECTION_WINDOW",
    "MIN_BATCH",
    "Auto",
    "Batch",
    "ContentFree",
    "Correction",
    "Lean",
    "NoCorrection",
    "batch_priors",
    "content_free_fit",
    "correction_named",
    "field_rows",
    "full_distribution",
]

MIN_BATCH = 16
"""The fewest documents the ``"batch"`` correction estimates a lean from; smaller batches are decided uncorrected."""

CORRECTION_WINDOW = 64
"""The most documents :meth:`~pcd_engine.engine.Engine.extract_many` decides together under ``"batch"`` (a
longer call is cut into equal windows of at most this many, each its own batch)."""

CONTENT_FREE_TEXTS = ("N/A", "[MASK]", "(no text)")
"""The inputs the content-free lean is read from."""

WHOLE_METHODS = ("marginal", "exact")
"""The strategies whose decisions give every label its probability (when no label was left to a bound)."""


class _Decided(Protocol):
    """What a correction reads of a decision (:class:`~pcd_engine.decide.decoding.Decision`)."""

    @property
    def method(self) -> str: ...

    @property
    def bounded(self) -> int: ...

    @property
    def probabilities(self) -> Sequence[float]: ...


def full_distribution(decisions: Sequence[_Decided]) -> bool:
    """Whether one field's decisions (one, or one per label of a multi-label field) give every label its
    probability, so that a lean can be divided out of them: decided by the marginal or the exact strategy, with no
    label scored by a staged reading's bound."""
    return bool(decisions) and all(d.method in WHOLE_METHODS and not d.bounded for d in decisions)


@dataclass(frozen=True)
class Lean:
    """The lean a request opens with.

    Attributes:
        source: What fields report as their ``correction``: ``"calibration"``, ``"content_free"`` or ``"batch"``;
            ``None`` when nothing is divided out.
        priors: The per-field leans (a :class:`Calibrator`: the call's, or the content-free one); ``None`` for a
            batch correction, whose leans come with each wave.
        passes: Forward passes spent reading the content-free lean (0 when it was kept or not needed).
        ms: Milliseconds spent on it.
    """

    source: str | None = None
    priors: Calibrator | None = None
    passes: int = 0
    ms: float = 0.0

    def field(self, name: str) -> FieldPrior | None:
        """Field ``name``'s lean, or ``None``."""
        return None if self.priors is None else self.priors.field(name)


class Correction(ABC):
    """How a call divides the model's lean out of its closed fields' distributions.

    Attributes:
        name: The name the options give it (one of :data:`CORRECTIONS`).
        reads_whole: The call reads every closed field whole (``staging="one_pass"``, the trie walk as
            ``"exact"``), as a calibrated call does, so that every field can be corrected.
        estimates_on_batch: The lean is estimated on the documents one caller decides together, wave by wave
            (:func:`batch_priors`), not read when a request opens.
    """

    name: ClassVar[str]
    reads_whole: ClassVar[bool] = False
    estimates_on_batch: ClassVar[bool] = False

    @abstractmethod
    def corrects(self, spec: FieldSpec, *, strategy: str | None, marginal_max_labels: int) -> bool:
        """Whether this correction divides a lean out of field ``spec`` read under the call's ``strategy``
        (``None``: the engine's choice), when its reading gives every label its probability."""

    def content_free_strategy(self, strategy: str | None) -> str | None:
        """The strategy the content-free lean is read with under the call's ``strategy``, as the call reads the
        fields it corrects; meaningful only where :meth:`reads_content_free`."""
        return strategy

    def reads_content_free(self, schema: Schema, *, strategy: str | None, marginal_max_labels: int) -> bool:
        """Whether a call of ``schema`` opens with the content-free lean: some closed field of several labels is
        one this correction corrects, and its lean is not the batch's."""
        if self.estimates_on_batch:
            return False
        closed = [s for s in schema.fields if s.scored and len(s.labels) > 1]
        return any(self.corrects(s, strategy=strategy, marginal_max_labels=marginal_max_labels) for s in closed)

    def correctable(
        self, spec: FieldSpec, decisions: Sequence[_Decided], *, strategy: str | None, marginal_max_labels: int
    ) -> bool:
        """Whether a lean may be divided out of field ``spec``'s ``decisions``: a field this correction corrects,
        read so that every label has its probability (:func:`full_distribution`)."""
        return self.corrects(spec, strategy=strategy, marginal_max_labels=marginal_max_labels) and full_distribution(
            decisions
        )

    def small_batch_warning(self, documents: int) -> str | None:
        """The warning a request gets when its batch had ``documents`` documents, too few for the lean; ``None``
        when the lean is not the batch's or the batch was large enough."""
        return None


class NoCorrection(Correction):
    """``"none"``: the model's own distributions decide."""

    name = "none"

    def corrects(self, spec: FieldSpec, *, strategy: str | None, marginal_max_labels: int) -> bool:
        return False


class Auto(Correction):
    """``"auto"``, the default: the content-free lean divided out of the single-choice fields a plain call reads
    whole (up to ``marginal_max_labels`` labels under the engine's choice of strategy, or any under
    ``"marginal"``), read as that call reads them. Larger label sets keep their cost-planned reading and multi-label
    flags are decided as read; any other strategy asked for is decided as read."""

    name = "auto"

    def corrects(self, spec: FieldSpec, *, strategy: str | None, marginal_max_labels: int) -> bool:
        if spec.kind == "multi":
            return False
        return strategy == "marginal" or (strategy is None and len(spec.labels) <= marginal_max_labels)

    def content_free_strategy(self, strategy: str | None) -> str | None:
        return "marginal"


class ContentFree(Correction):
    """``"content_free"``: the content-free lean divided out of every closed field, each read whole."""

    name = "content_free"
    reads_whole = True

    def corrects(self, spec: FieldSpec, *, strategy: str | None, marginal_max_labels: int) -> bool:
        return True


class Batch(Correction):
    """``"batch"``: the lean estimated on the documents one caller decides together, every closed field read whole;
    it assumes their labels are about equally common."""

    name = "batch"
    reads_whole = True
    estimates_on_batch = True

    def corrects(self, spec: FieldSpec, *, strategy: str | None, marginal_max_labels: int) -> bool:
        return True

    def small_batch_warning(self, documents: int) -> str | None:
        if documents >= MIN_BATCH:
            return None
        return (
            f"Correction '{self.name}': expected at least {MIN_BATCH} documents decided together to estimate the "
            f"model's lean, but this batch had {documents}; the answers are the model's own."
        )


CORRECTIONS: Mapping[str, Correction] = {c.name: c for c in (NoCorrection(), Batch(), ContentFree(), Auto())}
"""Every correction by name, in the order messages list them."""


def correction_named(name: str | None) -> Correction:
    """The correction called ``name`` (``None``: ``"none"``).

    Raises:
        OptionError: If no correction has that name.
    """
    if name is None:
        return CORRECTIONS[NoCorrection.name]
    found = CORRECTIONS.get(name) if isinstance(name, str) else None
    if found is None:
        raise OptionError(f"correction: expected one of {list(CORRECTIONS)}, but got {name!r}.")
    return found


def field_rows(spec: FieldSpec, decisions: Sequence[_Decided]) -> list[float]:
    """One document's row for ``spec``: its label distribution, or each label's probability of "yes" for a
    multi-label field (one decision per label)."""
    if spec.kind == "multi":
        return [d.probabilities[0] for d in decisions]
    return list(decisions[0].probabilities)


def batch_priors(schema: Schema, model: str, rows: Mapping[str, Sequence[Sequence[float]]]) -> dict[str, FieldPrior]:
    """Each field's lean estimated on the batch's rows (one per document, :func:`field_rows`), as the EM
    prior: what a :class:`Calibrator` fitted with ``method="em"`` on these documents would divide out."""
    fitted = Calibrator.from_distributions(schema, rows, model=model, method="em")
    return {prior.name: prior for prior in fitted.fields}


def content_free_fit(schema: Schema, rows: Mapping[str, Sequence[Sequence[float]]], *, model: str) -> Calibrator:
    """The content-free lean from each closed field's rows on :data:`CONTENT_FREE_TEXTS`: their mean."""
    return Calibrator.from_distributions(schema, rows, model=model, method="mean")
