"""Corrections of the model's label lean that need nothing from the user.

A small model leans towards some labels whatever the document says (:mod:`pcd_engine.calibration` explains the
prior correction ``p(y|x) ~ q(y|x) / b(y)``). A fitted :class:`~pcd_engine.calibration.Calibrator` estimates the
lean ``b`` from the user's unlabelled documents; the corrections here estimate it from what the call already has:

* ``"batch"``: the documents decided together. Wave by wave, once every document of the batch has read the
  wave, each closed field's ``b`` is the EM prior of the batch's distributions (:func:`em_bias`: the prior under
  which the corrected distributions average to uniform), and every document's answer is decided with it divided
  out before the next wave reads the answers. No second reading, no stored state; a batch of fewer than
  :data:`MIN_BATCH` documents is left uncorrected (with a warning), since EM on a handful of documents mostly
  undoes their own evidence. The answers do not depend on the order of the documents within a batch.
* ``"content_free"``: the mean distribution on :data:`CONTENT_FREE_TEXTS`, inputs that say nothing (Zhao et al.,
  2021), read once per schema and prompt format and kept with the engine: it works for a single call.
* ``"auto"``: ``"batch"`` in a batch of at least :data:`MIN_BATCH` documents, ``"content_free"`` otherwise (the
  choice ``benchmarks/bench_corrections.py`` measured best on each path).

Both assume the labels are about equally common among the documents; a batch that is mostly one label is pulled
towards the others (``benchmarks/bench_corrections.py`` measures it). A calibration given with ``labelled``
examples is the remedy there.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from pcd_engine.calibration import Calibrator, FieldPrior
from pcd_engine.decoding import Decision
from pcd_engine.schema import FieldSpec, Schema

if TYPE_CHECKING:
    from pcd_engine.engine import Engine
    from pcd_engine.options import ExtractOptions

__all__ = ["CONTENT_FREE_TEXTS", "CORRECTION_WINDOW", "MIN_BATCH", "batch_priors", "content_free", "field_rows"]

MIN_BATCH = 16
"""The fewest documents a batch correction estimates a lean from; smaller batches are decided uncorrected."""

CORRECTION_WINDOW = 64
"""The most documents :meth:`~pcd_engine.engine.Engine.extract_many` decides together under ``"batch"`` (a
longer call is cut into equal windows of at most this many, each its own batch)."""

CONTENT_FREE_TEXTS = ("N/A", "[MASK]", "(no text)")
"""The inputs the ``"content_free"`` lean is read from."""


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


def content_free(engine: Engine, schema: Schema, call: ExtractOptions) -> Calibrator:
    """The ``"content_free"`` lean of ``schema`` in this call's prompt format: a mean-prior
    :class:`Calibrator` fitted on :data:`CONTENT_FREE_TEXTS`, fitted once and kept in the engine's compile cache."""
    from dataclasses import replace

    plain = replace(call, calibration=None, correction="none", min_probability=None)
    key = (schema.fingerprint, call.prompt_format.key, call.temperature, call.anchor, call.strategy)

    def fit() -> Any:
        return Calibrator.fit(engine, CONTENT_FREE_TEXTS, schema, method="mean", options=plain)

    lean: Calibrator = engine.cache.leans.get_or_build(key, fit)
    return lean
