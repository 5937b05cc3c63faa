"""Corrections of the model's label lean that need nothing from the user: one object per correction.

A small model leans towards some labels whatever the document says (:mod:`pcd_engine.calibrate.calibrator` explains
the prior correction ``p(y|x) ~ q(y|x) / b(y)``). Two different quantities hide in a batch's raw distributions: the
model's **lean** ``b`` (a preference for some labels whatever the text) and the documents' **label mix** (a queue
that is 80% billing). Only the lean is a defect to divide out. A lean estimated on the batch itself mixes the two,
and dividing it out forces every batch towards uniform labels, which makes a capable model wrong on a skewed batch.

Each correction is a :class:`Correction`: what it reads (which fields, read how), where its lean comes from, and
what it reports; each is a :class:`~pcd_engine.deciders.base.Decider`. The options name one (:data:`CORRECTIONS`);
:func:`correction_named` gives the object, and no other module compares correction names. Adding a correction is a
subclass here, its tests and its docs.

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
(:func:`~pcd_engine.deciders.base.full_distribution`): a staged reading's bounds or the greedy walk's distribution
are decided as read. The batch's label mix is estimated apart, for the user to see
(:mod:`pcd_engine.calibrate.shares`).
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Mapping, Sequence

from pcd_engine.calibrate.calibrator import Calibrator, FieldPrior
from pcd_engine.deciders.base import Decided, Decider, Lean, LeanReader
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
    "NoCorrection",
    "batch_priors",
    "content_free_fit",
    "correction_named",
    "field_rows",
    "lean_favours_others",
]

MIN_BATCH = 16
"""The fewest documents the ``"batch"`` correction estimates a lean from; smaller batches are decided uncorrected."""

CORRECTION_WINDOW = 64
"""The most documents :meth:`~pcd_engine.engine.Engine.extract_many` decides together under ``"batch"`` (a
longer call is cut into equal windows of at most this many, each its own batch)."""

CONTENT_FREE_TEXTS = ("N/A", "[MASK]", "(no text)")
"""The inputs the content-free lean is read from."""


class Correction(Decider):
    """A decider that divides the model's lean out of some closed fields' distributions, with no fitted file: the
    content-free lean, the batch's, or none.

    Attributes:
        name: The name the options give it (one of :data:`CORRECTIONS`).
        source: What a field it corrects reports as its ``correction``.
        reads_whole: The call reads every closed field whole (``staging="one_pass"``, the trie walk as
            ``"exact"``), as a calibrated call does, so that every field can be corrected.
        estimates_on_batch: The lean is estimated on the documents one caller decides together, wave by wave
            (:func:`batch_priors`), not read when a request opens.
    """

    name: str = ""
    source: str | None = None
    reads_whole: bool = False
    estimates_on_batch: bool = False

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

    def open_lean(self, schema: Schema, *, strategy: str | None, marginal_max_labels: int, read: LeanReader) -> Lean:
        """The batch's source with no priors yet (they come with each wave), the content-free lean where this
        correction reads one (:meth:`reads_content_free`), else none."""
        if self.estimates_on_batch:
            return Lean(self.source)
        if not self.reads_content_free(schema, strategy=strategy, marginal_max_labels=marginal_max_labels):
            return Lean()
        return Lean(self.source, read(self.content_free_strategy(strategy)))


class NoCorrection(Correction):
    """``"none"``: the model's own distributions decide."""

    name = "none"
    source = None

    def corrects(self, spec: FieldSpec, *, strategy: str | None, marginal_max_labels: int) -> bool:
        return False


class Auto(Correction):
    """``"auto"``, the default: the content-free lean divided out of the single-choice fields a plain call reads
    whole (up to ``marginal_max_labels`` labels under the engine's choice of strategy, or any under
    ``"marginal"``), read as that call reads them. Larger label sets keep their cost-planned reading and multi-label
    flags are decided as read; any other strategy asked for is decided as read."""

    name = "auto"
    source = "content_free"

    def corrects(self, spec: FieldSpec, *, strategy: str | None, marginal_max_labels: int) -> bool:
        if spec.kind == "multi":
            return False
        return strategy == "marginal" or (strategy is None and len(spec.labels) <= marginal_max_labels)

    def content_free_strategy(self, strategy: str | None) -> str | None:
        return "marginal"


class ContentFree(Correction):
    """``"content_free"``: the content-free lean divided out of every closed field, each read whole."""

    name = "content_free"
    source = "content_free"
    reads_whole = True

    def corrects(self, spec: FieldSpec, *, strategy: str | None, marginal_max_labels: int) -> bool:
        return True


class Batch(Correction):
    """``"batch"``: the lean estimated on the documents one caller decides together, every closed field read whole;
    it assumes their labels are about equally common."""

    name = "batch"
    source = "batch"
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


def field_rows(spec: FieldSpec, decisions: Sequence[Decided]) -> list[float]:
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


def lean_favours_others(correction: str | None, lean: Sequence[float] | None, keep: int) -> bool:
    """Whether the lean divided out of a field (its result's ``correction`` and ``lean``) favours some label over
    label ``keep``. For the content-free lean that is a reading of the model asked nothing: where it prefers
    ``keep`` (answering, for a tool choice), the model showed no lean away from it. True for any other source
    (a calibration's, a batch's or a head's correction is the user's choice), False where nothing was corrected.
    """
    if correction != ContentFree.source or lean is None:
        return correction is not None
    return max(p for i, p in enumerate(lean) if i != keep) > lean[keep]
