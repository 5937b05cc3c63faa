"""Corrections of the model's label lean that need nothing from the user.

A small model leans towards some labels whatever the document says (:mod:`pcd_engine.calibrate.calibrator` explains the
prior correction ``p(y|x) ~ q(y|x) / b(y)``). A fitted :class:`~pcd_engine.calibrate.calibrator.Calibrator` estimates
the lean ``b`` from the user's unlabelled documents; the corrections here estimate it from what the call already has:

* ``"batch"``: the documents decided together. Wave by wave, once every document of the batch has read the
  wave, each closed field's ``b`` is the EM prior of the batch's distributions (:func:`em_bias`: the prior under
  which the corrected distributions average to uniform), and every document's answer is decided with it divided
  out before the next wave reads the answers. No second reading, no stored state; a batch of fewer than
  :data:`MIN_BATCH` documents is left uncorrected (with a warning), since EM on a handful of documents mostly
  undoes their own evidence. The answers do not depend on the order of the documents within a batch.
* ``"content_free"``: the mean distribution on :data:`CONTENT_FREE_TEXTS`, inputs that say nothing (Zhao et al.,
  2021), read once per schema and prompt format and kept with the engine (:func:`pcd_engine.run.opening.content_free`):
  it works for a single call.
* ``"auto"`` (the engine's default), the best of ``benchmarks/bench_corrections.py``'s table on each path, for
  the single-choice fields of up to ``marginal_max_labels`` labels, whose every label is cheap to read:

  - in a batch of at least :data:`MIN_BATCH` documents of one schema (``extract_many``, ``pcd tag``, a collected
    server batch) those fields are read exact and whole, and corrected with the batch's EM lean (BBC News: +21
    points over the model's own decisions, against +18 from their marginal reading);
  - alone, they are read as a plain call reads them (marginal: no extra nodes) and corrected with the
    content-free lean read the same way.

  Larger label sets keep their cost-planned reading (the greedy walk, staged where it pays) and are decided as
  read, as are multi-label fields (the table measures single-choice fields only) and every field under a strategy
  asked for by name other than ``"marginal"``; staging never changes a decision. A batch of a schema that drops
  below :data:`MIN_BATCH` documents (some failed) is decided uncorrected, with a warning.

A lean is only ever divided out of a distribution that gives every label its probability (:func:`correctable`): a
staged reading's bounds or the greedy walk's distribution are decided as read.

All of them assume the labels are about equally common among the documents; a batch that is mostly one label is pulled
towards the others (``benchmarks/bench_corrections.py`` measures it). A calibration given with ``labelled``
examples is the remedy there.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from pcd_engine.calibrate.calibrator import Calibrator, FieldPrior
from pcd_engine.decide.decoding import Decision
from pcd_engine.schema import FieldSpec, Schema

if TYPE_CHECKING:
    from pcd_engine.options import ExtractOptions

__all__ = [
    "CONTENT_FREE_TEXTS",
    "CORRECTION_WINDOW",
    "MIN_BATCH",
    "batch_priors",
    "field_rows",
    "auto_corrects",
    "correctable",
    "full_distribution",
    "reads_content_free",
    "reads_whole_in_batch",
]

MIN_BATCH = 16
"""The fewest documents a batch correction estimates a lean from; smaller batches are decided uncorrected."""

CORRECTION_WINDOW = 64
"""The most documents :meth:`~pcd_engine.engine.Engine.extract_many` decides together under ``"batch"`` (a
longer call is cut into equal windows of at most this many, each its own batch)."""

CONTENT_FREE_TEXTS = ("N/A", "[MASK]", "(no text)")
"""The inputs the ``"content_free"`` lean is read from."""


WHOLE_METHODS = ("marginal", "exact")
"""The strategies whose decisions give every label its probability (when no label was left to a bound)."""


def full_distribution(decisions: Sequence[Decision]) -> bool:
    """Whether one field's decisions (one, or one per label of a multi-label field) give every label its
    probability, so that a lean can be divided out of them: decided by the marginal or the exact strategy, with no
    label scored by a staged reading's bound."""
    return bool(decisions) and all(d.method in WHOLE_METHODS and not d.bounded for d in decisions)


def auto_corrects(spec: FieldSpec, call: ExtractOptions, *, marginal_max_labels: int) -> bool:
    """Whether ``"auto"`` corrects field ``spec``: a single-choice field (not multi-label: its yes/no flags are
    not measured) with at most ``marginal_max_labels`` labels under the engine's choice of strategy, or any
    single-choice field under ``"marginal"``. Larger label sets, multi-label fields and any other strategy asked
    for are decided as read."""
    if spec.kind == "multi":
        return False
    return call.strategy == "marginal" or (call.strategy is None and len(spec.labels) <= marginal_max_labels)


def correctable(
    spec: FieldSpec, decisions: Sequence[Decision], call: ExtractOptions, *, correction: str | None,
    marginal_max_labels: int,
) -> bool:  # fmt: skip
    """Whether a lean may be divided out of field ``spec``'s decisions: their reading gives every label its
    probability (:func:`full_distribution`), and under ``"auto"`` the field is one auto corrects
    (:func:`auto_corrects`)."""
    if correction == "auto" and not auto_corrects(spec, call, marginal_max_labels=marginal_max_labels):
        return False
    return full_distribution(decisions)


def reads_whole_in_batch(spec: FieldSpec, call: ExtractOptions, *, marginal_max_labels: int) -> bool:
    """Whether ``"auto"`` in a batch of at least :data:`MIN_BATCH` documents reads field ``spec``'s questions
    exact and in one pass (a multi-label field's too): the fields it corrects, under the engine's choice of
    strategy (the batch's lean is estimated from their whole distributions)."""
    return call.strategy is None and auto_corrects(spec, call, marginal_max_labels=marginal_max_labels)


def reads_content_free(schema: Schema, call: ExtractOptions, *, marginal_max_labels: int, batched: bool) -> bool:
    """Whether a call reads the content-free lean of ``schema`` when it opens: under ``"content_free"`` when the
    schema has a closed field with several labels; under ``"auto"`` when it is not in a batch of at least
    :data:`MIN_BATCH` documents (``batched``; the batch's lean serves there) and some closed field is one auto
    corrects."""
    closed = [s for s in schema.fields if s.scored and len(s.labels) > 1]
    if call.correction == "content_free":
        return bool(closed)
    if call.correction != "auto" or batched:
        return False
    return any(auto_corrects(s, call, marginal_max_labels=marginal_max_labels) for s in closed)


def field_rows(spec: FieldSpec, decisions: Sequence[Decision]) -> list[float]:
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
