"""The label shares of a batch or a corpus: how common each label of a closed field is among the documents.

The corrections of :mod:`pcd_engine.deciders.corrections` divide out the model's **lean** and never the documents'
**label mix**; the mix is estimated here, apart, for the user to see (the mix of a support queue, and how it drifts
between parts of a corpus), from the decided distributions (corrected ones where a correction decided them):

* ``"em"`` (the default): the shares ``pi`` under which the documents' distributions are most likely, by the EM
  iteration of Saerens, Latinne & Decaestecker (2002) (each document's distribution re-weighted by ``pi``, ``pi``
  the mean of the re-weighted ones, until it stops moving), with a Dirichlet prior of ``alpha`` per label
  (``alpha=2``: one pseudo-document per label, which keeps a handful of documents from driving a share to 0);
* ``"mean"``: the mean distribution (probabilistic classify-and-count);
* ``"count"``: the share of documents each label is the answer of (classify-and-count).

Each share has a 95% interval from a seeded bootstrap over the documents. ``benchmarks/bench_corrections.py``
measures the three estimators' error on batches of known mix.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from pcd_engine.errors import OptionError
from pcd_engine.schema import FieldSpec, Schema, compile_schema

__all__ = ["SHARE_METHODS", "LabelShares", "estimate_shares", "label_shares", "value_shares"]

SHARE_METHODS = ("em", "mean", "count")
"""How shares are estimated (see the module docstring)."""


@dataclass(frozen=True)
class LabelShares:
    """One closed field's estimated label shares among a set of documents.

    Attributes:
        field: The field's key.
        labels: Its labels' values, in schema order.
        shares: Each label's estimated share (summing to 1; for a multi-label field, the share of documents the
            label applies to, each on its own).
        low: The lower end of each share's 95% bootstrap interval.
        high: The upper end of each share's 95% bootstrap interval.
        documents: How many documents they were estimated on.
        method: One of :data:`SHARE_METHODS`.
    """

    field: str
    labels: tuple[Any, ...]
    shares: tuple[float, ...]
    low: tuple[float, ...]
    high: tuple[float, ...]
    documents: int
    method: str

    def to_json(self) -> dict[str, Any]:
        """Plain JSON data: each label with its share and interval."""
        return {
            "field": self.field,
            "documents": self.documents,
            "method": self.method,
            "labels": [
                {"value": v, "share": s, "low": lo, "high": hi}
                for v, s, lo, hi in zip(self.labels, self.shares, self.low, self.high, strict=True)
            ],
        }


def _point(rows: np.ndarray, method: str, alpha: float) -> np.ndarray:
    """One estimate of the shares of ``rows`` (documents x labels, each row a distribution)."""
    n, k = rows.shape
    if method == "count":
        return np.bincount(rows.argmax(axis=1), minlength=k) / n
    mean = rows.mean(axis=0)
    if method == "mean":
        return mean
    pi = np.full(k, 1.0 / k)
    for _ in range(500):
        weighted = rows * pi
        totals = weighted.sum(axis=1, keepdims=True)
        posterior = weighted / np.where(totals > 0, totals, 1.0)
        new = (posterior.sum(axis=0) + alpha - 1.0) / (n + k * (alpha - 1.0))
        new = np.clip(new, 1e-12, None)
        new /= new.sum()
        if np.abs(new - pi).max() < 1e-8:
            return new
        pi = new
    return pi


def estimate_shares(
    rows: Sequence[Sequence[float]],
    *,
    method: str = "em",
    alpha: float = 2.0,
    resamples: int = 200,
    seed: int = 0,
) -> tuple[tuple[float, ...], tuple[float, ...], tuple[float, ...]]:
    """The label shares of the documents whose distributions are ``rows``, with a 95% bootstrap interval.

    Args:
        rows: One distribution over the same labels per document.
        method: One of :data:`SHARE_METHODS`.
        alpha: The Dirichlet prior per label of ``"em"`` (1: none).
        resamples: Bootstrap resamples of the documents for the interval (0: no interval, the point twice).
        seed: The bootstrap's seed (the same rows give the same interval).

    Returns:
        ``(shares, low, high)``, each one value per label.

    Raises:
        OptionError: If there are no rows, they differ in length, a value is not a finite probability, or an
            option is out of range.
    """
    if method not in SHARE_METHODS:
        raise OptionError(f"Label shares method: expected one of {list(SHARE_METHODS)}, but got {method!r}.")
    if not math.isfinite(alpha) or alpha < 1:
        raise OptionError(f"Label shares alpha: expected a number >= 1, but got {alpha!r}.")
    if not rows:
        raise OptionError("Label shares: expected at least one document's distribution, but got none.")
    widths = {len(r) for r in rows}
    if len(widths) != 1 or 0 in widths:
        raise OptionError(f"Label shares: expected rows of one length, but got lengths {sorted(widths)}.")
    table = np.asarray(rows, dtype=float)
    if not np.isfinite(table).all() or (table < 0).any():
        raise OptionError("Label shares: expected probabilities (finite, >= 0), but a row has another value.")
    point = _point(table, method, alpha)
    if resamples <= 0 or len(table) < 2:
        return tuple(map(float, point)), tuple(map(float, point)), tuple(map(float, point))
    rng = np.random.default_rng(seed)
    draws = np.array([_point(table[rng.integers(0, len(table), len(table))], method, alpha) for _ in range(resamples)])
    low, high = np.percentile(draws, [2.5, 97.5], axis=0)
    return tuple(map(float, point)), tuple(map(float, low)), tuple(map(float, high))


def _closed_fields(schema: Any, fields: Sequence[str] | None) -> list[FieldSpec]:
    """The closed fields of several labels named by ``fields`` (default: all of them), each checked."""
    compiled: Schema = compile_schema(schema)
    closed = {s.name: s for s in compiled.fields if s.scored and len(s.labels) > 1}
    names = list(closed) if fields is None else list(fields)
    for name in names:
        if name not in closed:
            raise OptionError(
                f"Label shares: expected a closed field of several labels of {compiled.title!r} "
                f"({list(closed)}), but got {name!r}."
            )
    return [closed[name] for name in names]


def label_shares(
    results: Sequence[Any], schema: Any, *, method: str = "em", fields: Sequence[str] | None = None
) -> dict[str, LabelShares]:
    """Each closed field's label shares among decided documents: the mix of a batch or a corpus.

    Args:
        results: :class:`~pcd_engine.result.ExtractionResult` objects of one schema (``extract_many``'s; an
            exception in their place, from ``return_exceptions``, is skipped).
        schema: The schema they were decided with (anything :func:`~pcd_engine.schema.compile_schema` takes).
        method: One of :data:`SHARE_METHODS`.
        fields: The fields to estimate (default: every closed field of several labels).

    Returns:
        Field name to its :class:`LabelShares`, in schema order.

    Raises:
        OptionError: If a named field is not a closed field of several labels, no result is left, or the method
            is unknown.
    """
    specs = _closed_fields(schema, fields)
    done = [r for r in results if not isinstance(r, BaseException)]
    if not done:
        raise OptionError("Label shares: expected at least one decided document, but got none.")
    return {spec.name: _field_shares(spec, [_field(r, spec.name) for r in done], method) for spec in specs}


@dataclass(frozen=True)
class _Decided:
    """A decided value with no distribution (a row of a tag table): a one-hot distribution."""

    value: Any
    labels: tuple[Any, ...]
    label_distribution: None = None

    @property
    def label_probabilities(self) -> dict[Any, float]:
        chosen = self.value if isinstance(self.value, list) else [self.value]
        return {v: 1.0 if v in chosen else 0.0 for v in self.labels}


def value_shares(
    values: Sequence[Mapping[str, Any] | None], schema: Any, *, fields: Sequence[str] | None = None
) -> dict[str, LabelShares]:
    """Each closed field's label shares among documents known by their decided values only (the rows of a tag
    table, where no distribution is kept): the share of documents each label is the answer of (``"count"``),
    with its bootstrap interval.

    Args:
        values: One mapping of field to value per document (:attr:`~pcd_engine.result.ExtractionResult.values`,
            or :func:`~pcd_engine.tagging.table.row_values`); ``None`` for a document that failed (skipped).
        schema: The schema they were decided with.
        fields: The fields to estimate (default: every closed field of several labels).

    Returns:
        Field name to its :class:`LabelShares` (method ``"count"``), in schema order; empty when no document
        was decided.

    Raises:
        OptionError: If a named field is not a closed field of several labels.
    """
    specs = _closed_fields(schema, fields)
    done = [v for v in values if v is not None]
    if not done:
        return {}
    out = {}
    for spec in specs:
        labels = tuple(label.value for label in spec.labels)
        out[spec.name] = _field_shares(spec, [_Decided(v.get(spec.name), labels) for v in done], "count")
    return out


def _field_shares(spec: FieldSpec, decided: Sequence[Any], method: str) -> LabelShares:
    """``spec``'s shares among the documents whose field results (or :class:`_Decided` values) are ``decided``."""
    labels = tuple(label.value for label in spec.labels)
    if spec.kind == "multi":  # each label on its own: its share of "yes"
        shares, low, high = [], [], []
        for value in labels:
            yes = [float(f.label_probabilities[value]) for f in decided]
            s, lo, hi = estimate_shares([[p, 1.0 - p] for p in yes], method=method)
            shares.append(s[0])
            low.append(lo[0])
            high.append(hi[0])
        point: Mapping[str, tuple[float, ...]] = {"s": tuple(shares), "l": tuple(low), "h": tuple(high)}
    else:
        rows = [_distribution(f, labels) for f in decided]
        s, lo, hi = estimate_shares(rows, method=method)
        point = {"s": s, "l": lo, "h": hi}
    return LabelShares(spec.name, labels, point["s"], point["l"], point["h"], len(decided), method)


def _field(result: Any, name: str) -> Any:
    try:
        return result.fields[name]
    except (AttributeError, KeyError):
        raise OptionError(f"Label shares: expected results of the schema, but one has no field {name!r}.") from None


def _distribution(field: Any, labels: Sequence[Any]) -> list[float]:
    """A single-label field's distribution over ``labels``; a one-hot row for a field decided without one."""
    if field.label_distribution is not None and len(field.label_distribution) == len(labels):
        return list(field.label_distribution)
    return [1.0 if v == field.value else 0.0 for v in labels]
