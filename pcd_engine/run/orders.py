"""Answers that do not depend on the order of the labels (issue 58): a call with ``label_orders=k`` reads every
document in ``k`` label orders, all in one batch (its passes shared: one pass per wave for every order of every
document), and decides each single-label closed field from the mean of the orders' distributions, put back in the
schema's order.

The orders (:func:`label_orders`): the schema's own, then its reverse, then cyclic shifts of both, so that two orders
already put every label at the other end of the list. Multi-label and open fields are the schema order's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from pcd_engine.errors import OptionError
from pcd_engine.options import ExtractOptions
from pcd_engine.result import Alternative, ExtractionResult, FieldResult, abstain
from pcd_engine.schema import FieldSpec, Schema
from pcd_engine.schema.fields import build_schema

__all__ = ["averaged", "label_orders", "ordered_call", "orders_of", "reordered"]


def _averages(spec: FieldSpec) -> bool:
    """Whether the orders decide field ``spec`` together: a single-label closed field of two labels or more."""
    return spec.scored and spec.kind != "multi" and len(spec.labels) > 1


def label_orders(count: int) -> list[tuple[bool, int]]:
    """The first ``count`` orders as ``(reversed, shift)``: the schema's own, its reverse, then each shifted by one,
    two, ... labels (a shift wraps around a field's labels)."""
    return [(k % 2 == 1, k // 2) for k in range(count)]


def reordered(schema: Schema, order: tuple[bool, int]) -> Schema:
    """``schema`` with every single-label closed field's labels in ``order`` (:func:`label_orders`); the other fields
    as they are. The schema's own order is ``schema`` itself."""
    flip, shift = order
    if not flip and not shift:
        return schema
    specs = []
    for spec in schema.fields:
        if _averages(spec):
            labels = list(reversed(spec.labels)) if flip else list(spec.labels)
            k = shift % len(labels)
            spec = replace(spec, labels=tuple(labels[k:] + labels[:k]))
        specs.append(spec)
    return build_schema(schema.title, schema.description, specs, model=schema.model)


def orders_of(schema: Schema, call: ExtractOptions) -> tuple[list[Schema], ExtractOptions]:
    """The schemas a call reads a document with (``[schema]`` without ``label_orders``) and the options each is read
    with (:func:`ordered_call` when there are several).

    Raises:
        OptionError: As :func:`ordered_call`.
    """
    orders = [reordered(schema, order) for order in label_orders(call.label_orders or 1)]
    return orders, ordered_call(call) if len(orders) > 1 else call


def ordered_call(call: ExtractOptions) -> ExtractOptions:
    """The options each order is read with: no abstaining (it is done once, on the mean) and no further orders.

    Raises:
        OptionError: If the call has a head or a calibration: each is fitted on one label order's prompt.
    """
    if call.decider.fitted_on_order:
        raise OptionError("label_orders: expected no head or calibration (each is fitted on one label order of the "
                          "schema's prompt); use one or the other.")  # fmt: skip
    return replace(call, label_orders=None, min_probability=None, prediction_set=None)


def averaged(
    schema: Schema, call: ExtractOptions, results: Sequence[ExtractionResult], schemas: Sequence[Schema], *, top_k: int
) -> ExtractionResult:
    """One document's result from its orders' ``results`` (read with ``schemas``, the schema's own first): each
    single-label closed field decided by the mean of the orders' distributions put back in the schema's order (the
    model's own ones averaged alike), then abstained below the call's threshold; every other field, the warnings
    and the statistics are the first order's."""
    first = results[0]
    fields = dict(first.fields)
    for spec in filter(_averages, schema.fields):
        readings = [(r.fields[spec.name], s.field(spec.name).values) for r, s in zip(results, schemas, strict=True)]
        fields[spec.name] = _mean_field(spec, readings, top_k)
    warnings = list(first.warnings)
    thresholds = call.thresholds(schema.fields)
    if thresholds:
        fields = abstain(schema.fields, fields, thresholds, warnings)
    values = {name: f.value for name, f in fields.items()}
    return ExtractionResult(values, fields, tuple(warnings), first.stats, schema)


def _in_schema_order(distribution: Sequence[float] | None, listed: Sequence[object], value: object,
                     values: Sequence[object]) -> list[float]:  # fmt: skip
    """A distribution over ``listed`` labels in the schema's order (``values``); ``None`` (one label was certain):
    all on ``value``."""
    if distribution is None:
        return [1.0 if v == value else 0.0 for v in values]
    at = {(type(v), v): p for v, p in zip(listed, distribution, strict=True)}  # typed: True is not 1
    return [at[type(v), v] for v in values]


def _mean_field(spec: FieldSpec, readings: Sequence[tuple[FieldResult, Sequence[object]]], top_k: int) -> FieldResult:
    values = list(spec.values)
    mean = _mean([_in_schema_order(f.label_distribution, listed, f.value, values) for f, listed in readings])
    best = max(range(len(values)), key=lambda i: (mean[i], -i))
    order = sorted(range(len(values)), key=lambda i: (-mean[i], i))[:top_k]
    first = readings[0][0]
    raw = None
    if all(f.raw_distribution is not None for f, _ in readings):
        raw = _mean([_in_schema_order(f.raw_distribution, listed, f.value, values) for f, listed in readings])
    return replace(
        first,
        value=values[best],
        probability=mean[best],
        alternatives=tuple(Alternative(values[i], mean[i]) for i in order),
        label_distribution=tuple(mean),
        raw_distribution=None if raw is None else tuple(raw),
        raw_probability=None if raw is None else raw[best],
        abstained=False,
    )


def _mean(rows: Sequence[Sequence[float]]) -> list[float]:
    return [sum(column) / len(rows) for column in zip(*rows, strict=True)]
