"""Pydantic v2 models read into fields: closed types become labels (filtered by the field's own validation),
lists and sets of them multi-label fields, anything else an open field under Pydantic's JSON Schema.
"""

from __future__ import annotations

import collections.abc
import enum
import math
import types
import typing
from collections.abc import Sequence
from dataclasses import replace
from typing import Any, Literal, Union

from pcd_engine.errors import SchemaError
from pcd_engine.schema.constraints import WideRange, int_values, number_bound
from pcd_engine.schema.fields import FieldSpec, Schema, boolean_field, build_schema, enum_field, labels_of, multi_field
from pcd_engine.schema.open_values import UNCONSTRAINED_HINT, NotClosed, open_field, resolve_ref

__all__ = ["from_pydantic"]


def _int_range(name: str, lo: Any, hi: Any, step: Any = None) -> list[int]:
    """The integers of a bounded range of at most :data:`MAX_INT_LABELS` values (counted before any is built);
    wider or open ones are open."""
    try:
        return list(int_values(name, lo, hi, step=step))
    except WideRange:
        raise NotClosed from None


def _bounds(name: str, metadata: Sequence[Any]) -> tuple[Any, Any, Any]:
    """Inclusive bounds and the step from Pydantic / annotated-types constraints (ge, gt, le, lt, Interval,
    multiple_of); an exclusive bound moves to the next integer inside."""
    lo = hi = step = None
    for item in metadata:
        for inner in [item, *getattr(item, "metadata", ())]:
            if getattr(inner, "ge", None) is not None:
                lo = number_bound(name, "ge", inner.ge)
            if getattr(inner, "gt", None) is not None:
                lo = math.floor(number_bound(name, "gt", inner.gt)) + 1
            if getattr(inner, "le", None) is not None:
                hi = number_bound(name, "le", inner.le)
            if getattr(inner, "lt", None) is not None:
                hi = math.ceil(number_bound(name, "lt", inner.lt)) - 1
            if getattr(inner, "multiple_of", None) is not None:
                step = inner.multiple_of
    return lo, hi, step


def _lengths(metadata: Sequence[Any]) -> tuple[int, int | None]:
    """``min_length`` / ``max_length`` constraints (Pydantic's names for a list's item bounds)."""
    lo, hi = 0, None
    for item in metadata:
        for inner in [item, *getattr(item, "metadata", ())]:
            if getattr(inner, "min_length", None) is not None:
                lo = int(inner.min_length)
            if getattr(inner, "max_length", None) is not None:
                hi = int(inner.max_length)
    return lo, hi


def _closed_values(name: str, annotation: Any, metadata: Sequence[Any]) -> list[Any]:
    """The allowed values of a closed single-choice annotation; raises :class:`NotClosed` for any other."""
    spec = _from_annotation(name, annotation, None, metadata)
    if spec.kind == "multi":
        raise NotClosed
    return list(spec.values)


def _from_annotation(name: str, annotation: Any, description: str | None, metadata: Sequence[Any] = ()) -> FieldSpec:
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        inner, *extra = typing.get_args(annotation)
        return _from_annotation(name, inner, description, [*metadata, *extra])
    if origin in (Union, types.UnionType):
        # A union of closed choices is one closed field (None becomes the null label); any open member makes the
        # whole field open.
        collected: list[Any] = []
        for option in typing.get_args(annotation):
            collected.extend([None] if option is type(None) else _closed_values(name, option, metadata))
        spec = enum_field(name, collected, description)
        if all(isinstance(v, bool) for v in spec.values):
            return FieldSpec(name, "boolean", spec.labels, description)
        return spec
    if origin in (list, set, frozenset, Sequence, collections.abc.Set) or annotation in (list, set):
        args = typing.get_args(annotation)
        if len(args) != 1:
            raise NotClosed
        choices = _closed_values(name, args[0], ())
        lo, hi = _lengths(metadata)
        return multi_field(name, choices, description, (), min_items=lo, max_items=hi)
    if annotation is bool:
        return boolean_field(name, description)
    if annotation is int:
        return enum_field(name, _int_range(name, *_bounds(name, metadata)), description)
    if origin is Literal:
        values = typing.get_args(annotation)
        if values and all(isinstance(v, bool) for v in values):
            return FieldSpec(name, "boolean", labels_of(list(values), field_name=name), description)
        if any(isinstance(v, enum.Enum) for v in values):
            values = tuple(v.value if isinstance(v, enum.Enum) else v for v in values)
        return enum_field(name, values, description)
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        members = list(annotation)
        return enum_field(name, [m.value for m in members], description)
    raise NotClosed


def from_pydantic(model: type) -> Schema:
    specs = []
    root: dict[str, Any] | None = None
    for name, info in model.model_fields.items():  # type: ignore[attr-defined]
        key = info.alias or name
        try:
            spec = _from_annotation(key, info.annotation, info.description, info.metadata)
            specs.append(_constrain_pydantic(spec, info.annotation, info.metadata))
        except NotClosed:
            if root is None:
                root = _model_json_schema(model, key)
            if "properties" not in root:  # the model's own schema is a $ref to itself: it contains itself
                own = resolve_ref(root, root, field_name=key)
                through = [k for k, node in own.get("properties", {}).items() if str(root["$ref"]) in str(node)]
                raise SchemaError(
                    f"Field {through[0] if through else key!r}: expected a non-recursive schema, but "
                    f"{model.__name__!r} contains itself through it. pcd cannot bound a recursive value; flatten the "
                    "model or cut the recursion at a fixed depth."
                ) from None
            specs.append(open_field(key, root["properties"][key], root, info.description))
    doc = model.__doc__
    if doc is not None:
        doc = _clean_doc(doc)
    return build_schema(model.__name__, doc, specs, model=model)


def _constrain_pydantic(spec: FieldSpec, annotation: Any, metadata: Sequence[Any]) -> FieldSpec:
    """Keep the labels that the field's own Pydantic validation accepts (``multiple_of``, string constraints,
    anything its metadata adds); a multi-label field's values are checked against its item type."""
    from pydantic import TypeAdapter, ValidationError

    target: Any = typing.Annotated[(annotation, *metadata)] if metadata else annotation
    if spec.kind == "multi":
        inner = annotation
        while typing.get_origin(inner) is typing.Annotated:
            inner = typing.get_args(inner)[0]
        args = typing.get_args(inner)
        if len(args) != 1:
            return spec
        target = args[0]
    try:
        adapter = TypeAdapter(target)
    except Exception:  # noqa: BLE001 - an annotation Pydantic cannot adapt alone is checked by the model itself
        return spec
    kept = []
    for label in spec.labels:
        try:
            adapter.validate_python(label.value)
        except ValidationError:
            continue
        kept.append(label)
    if not kept or (spec.kind == "multi" and len(kept) < spec.min_items):
        shown = ", ".join(repr(v) for v in spec.values[:5]) + (", ..." if len(spec.labels) > 5 else "")
        raise SchemaError(
            f"Field {spec.name!r}: expected allowed values that satisfy the field's constraints, but too few of "
            f"[{shown}] do. Loosen the constraints or change the values."
        )
    return spec if len(kept) == len(spec.labels) else replace(spec, labels=tuple(kept))


def _model_json_schema(model: Any, field_name: str) -> dict[str, Any]:
    try:
        return dict(model.model_json_schema(by_alias=True))
    except Exception as exc:  # noqa: BLE001 - Pydantic raises several types for types it cannot describe
        raise SchemaError(
            f"Field {field_name!r}: expected a type with a JSON Schema, but Pydantic could not describe it: "
            f"{str(exc).splitlines()[0]}. " + UNCONSTRAINED_HINT
        ) from None


def _clean_doc(doc: str) -> str | None:
    import inspect

    cleaned = inspect.cleandoc(doc).strip()
    # Pydantic's own BaseModel docstring is not the user's description.
    if cleaned.startswith("!!! abstract") or cleaned.startswith("Usage docs:"):
        return None
    return cleaned or None
