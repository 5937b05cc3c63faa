"""What to ask: schemas compiled to fields, each closed (scored from a token trie) or open (generated).

Field kinds:

* ``boolean`` and ``enum``: closed, one label per allowed value;
* ``multi``: a list or set of allowed values (``list[Literal[...]]``, ``set[Enum]``, a JSON Schema array of an
  enum), decided as one yes/no question per value, with optional ``min_items`` / ``max_items``;
* ``open``: anything else a JSON Schema can constrain (``str`` with ``max_length`` / ``pattern``, unbounded or wide
  ``int``, ``float``, nested models and lists of them). Open fields are generated under their JSON Schema.

Three inputs are accepted and all end up as one :class:`Schema`:

* a Pydantic v2 model. Closed: ``bool``, ``Literal[...]`` of str or int, an ``Enum`` of str or int, a bounded
  ``int`` (``ge``/``gt`` and ``le``/``lt``, at most :data:`MAX_INT_LABELS` values), unions and ``Optional`` of
  those (``None`` becomes one more label, written as JSON ``null``); multi: ``list`` / ``set`` of a closed type.
  Any other type is open, described by Pydantic's own JSON Schema of the field;
* a JSON Schema object: ``boolean``, ``enum``, ``const``, bounded ``integer``, ``null``, ``type`` lists and
  ``anyOf``/``oneOf`` of those are closed, an ``array`` of those is multi, anything else is open; ``$ref`` works;
* a preset dict ``{"field": {"type": "enum" | "boolean", "choices": [...], "description": ..., "depends_on": [...]}}``
  (a ``null`` choice makes the field optional; ``"multi"`` takes ``min_items`` / ``max_items``, ``"string"`` takes
  ``max_length``, ``pattern`` and ``max_tokens``), or a preset file ``{"title": ..., "schema": {...}, "context": ...}``.

A field pcd cannot constrain (``Any``, ``dict[str, Any]``, a recursive model) raises
:class:`~pcd_engine.errors.SchemaError` naming the field, before any model work.
"""

from __future__ import annotations

import collections.abc
import enum
import hashlib
import json
import math
import types
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal, Union

from pcd_engine.constraints import (
    MAX_INT_LABELS,
    MAX_SCHEMA_DEPTH,
    WideRange,
    check_depth,
    check_keywords,
    filter_values,
    int_values,
    is_valid,
    number_bound,
    too_deep,
)
from pcd_engine.errors import SchemaError

__all__ = [
    "MAX_INT_LABELS",
    "FieldSpec",
    "Label",
    "Preset",
    "Schema",
    "compile_schema",
    "load_preset",
]

LabelValue = str | int | bool | None
_PRESET_TYPES = ("enum", "boolean", "multi", "string")
_PRESET_KEYS = {
    "boolean": {"type", "description", "depends_on"},
    "enum": {"type", "choices", "description", "depends_on"},
    "multi": {"type", "choices", "min_items", "max_items", "description", "depends_on"},
    "string": {"type", "max_length", "pattern", "max_tokens", "description", "depends_on"},
}
_PRESET_FILE_KEYS = {"title", "schema", "context", "description"}


@dataclass(frozen=True)
class Label:
    """One allowed value of a field.

    Attributes:
        value: The value as it appears in the output dict (a str, int, bool, or ``None`` for an optional field's
            null; enum values, not members).
        surfaces: The JSON texts the model may write for it, canonical first. ``True`` has ``true`` and
            ``"true"``; ``3`` has ``3`` and ``"3"``; a string has its JSON-quoted form only; ``None`` has ``null``.
    """

    value: LabelValue
    surfaces: tuple[str, ...]


FieldKind = Literal["boolean", "enum", "multi", "open"]


@dataclass(frozen=True)
class FieldSpec:
    """One field to fill in.

    Attributes:
        name: The JSON key.
        kind: ``"boolean"`` or ``"enum"`` (one label), ``"multi"`` (any number of labels, one yes/no question
            each) or ``"open"`` (generated under :attr:`value_schema`).
        labels: The allowed values, in schema order (for ``multi``, the values the list may hold; empty for
            ``open``).
        description: Text shown to the model next to the key, or ``None``.
        depends_on: Names of fields that must be decided (and written into the prompt) first.
        min_items: For ``multi``: the fewest values the list holds (0 when unset).
        max_items: For ``multi``: the most values the list holds, or ``None`` for no limit.
        schema_json: For ``open``: the value's self-contained JSON Schema, as canonical JSON text.
        max_tokens: For ``open``: the most tokens to generate for the value, or ``None`` for the engine's default.
    """

    name: str
    kind: FieldKind
    labels: tuple[Label, ...]
    description: str | None = None
    depends_on: tuple[str, ...] = ()
    min_items: int = 0
    max_items: int | None = None
    schema_json: str | None = None
    max_tokens: int | None = None

    @property
    def values(self) -> tuple[LabelValue, ...]:
        """The allowed values, in order."""
        return tuple(label.value for label in self.labels)

    @property
    def scored(self) -> bool:
        """True for closed fields (scored from tries), False for open ones (generated)."""
        return self.kind != "open"

    @property
    def value_schema(self) -> dict[str, Any]:
        """The JSON Schema of one value of this field (what a constrained generator must write)."""
        if self.schema_json is not None:
            return dict(json.loads(self.schema_json))
        if self.kind == "boolean":
            return {"type": "boolean"}
        if self.kind == "enum":
            return {"enum": list(self.values)}
        out: dict[str, Any] = {"type": "array", "items": {"enum": list(self.values)}, "uniqueItems": True}
        if self.min_items:
            out["minItems"] = self.min_items
        if self.max_items is not None:
            out["maxItems"] = self.max_items
        return out

    def allows(self, value: Any) -> bool:
        """Whether ``value`` is a valid value of this field.

        Closed fields compare types too (``1`` is not ``True``, ``"1"`` not ``1``); a multi-label field takes a
        list of distinct allowed values within its bounds; an open field's value is validated against its JSON
        Schema.
        """
        if self.kind == "multi":
            if not isinstance(value, (list, tuple, set, frozenset)):
                return False
            items = list(value)
            if not all(self._is_label(v) for v in items) or len({json.dumps(v) for v in items}) != len(items):
                return False
            return self.min_items <= len(items) and (self.max_items is None or len(items) <= self.max_items)
        if self.kind == "open":
            return is_valid(self.value_schema, value)
        return self._is_label(value)

    def read(self, value: Any) -> Any:
        """A value as a model following pcd's instructions writes it, in output form: a multi-label field's
        flags object (``{"x": true, "y": false}``) becomes the list of its true labels; others are unchanged."""
        if self.kind == "multi" and isinstance(value, Mapping):
            by_key = {flag_key(v): v for v in self.values}
            return [by_key.get(k, k) for k, flag in value.items() if flag is True or flag == "true"]
        return value

    def label_index(self, value: Any) -> int | None:
        """The index of the label whose value is ``value``, type included, or ``None``."""
        return next((i for i, v in enumerate(self.values) if type(value) is type(v) and value == v), None)

    def _is_label(self, value: Any) -> bool:
        return self.label_index(value) is not None


def flag_key(value: LabelValue) -> str:
    """The key of a label in a multi-label field's flags object: a string label itself, any other its JSON."""
    return value if isinstance(value, str) else json.dumps(value)


@dataclass(frozen=True)
class Schema:
    """A compiled schema: ordered fields plus what the prompt says about them.

    Attributes:
        title: A short name for the schema (the model's class name, the JSON Schema or preset title).
        description: The model docstring or schema description, shown to the model; may be ``None``.
        fields: The fields, in output order.
        model: The Pydantic model the values validate into, when the schema came from one.
        fingerprint: A stable hash of everything the prompt and compiler depend on; caches key on it.
    """

    title: str
    description: str | None
    fields: tuple[FieldSpec, ...]
    model: type | None = field(default=None, compare=False)
    fingerprint: str = ""

    def field(self, name: str) -> FieldSpec:
        """Return the field called ``name``.

        Raises:
            KeyError: If there is no such field.
        """
        for spec in self.fields:
            if spec.name == name:
                return spec
        raise KeyError(name)

    def json_schema(self) -> dict[str, Any]:
        """The schema as a JSON Schema object: every field required, no other keys, values restricted to labels.

        This is what a JSON-constrained generator (outlines, llguidance, an OpenAI-style ``response_format``) needs
        to write the same object pcd fills in; compiling it back gives the same fields and labels. A multi-label
        field is an array of its labels, an open field its value schema.
        """
        properties: dict[str, Any] = {}
        for spec in self.fields:
            node = spec.value_schema
            if spec.description:
                node["description"] = spec.description
            properties[spec.name] = node
        out: dict[str, Any] = {"title": self.title, "type": "object"}
        if self.description:
            out["description"] = self.description
        out.update(properties=properties, required=[s.name for s in self.fields], additionalProperties=False)
        return out


@dataclass(frozen=True)
class Preset:
    """A preset file: a schema together with an example input.

    Attributes:
        title: The preset's title.
        schema: The compiled schema.
        context: The example text to classify, or ``None``.
    """

    title: str
    schema: Schema
    context: str | None


# ---------------------------------------------------------------------------------------------------- labels


def _label(value: Any, *, field_name: str) -> Label:
    if value is None:
        return Label(None, ("null",))
    if isinstance(value, bool):
        return Label(value, (json.dumps(value), json.dumps(json.dumps(value))))
    if isinstance(value, int):
        return Label(value, (json.dumps(value), json.dumps(str(value))))
    if isinstance(value, str):
        return Label(value, (json.dumps(value, ensure_ascii=False),))
    raise SchemaError(
        f"Field {field_name!r}: expected every allowed value to be a str, int, bool or null, but got "
        f"{type(value).__name__} {value!r}. Use string or integer labels."
    )


def _labels(values: Sequence[Any], *, field_name: str) -> tuple[Label, ...]:
    if len(values) == 0:
        raise SchemaError(
            f"Field {field_name!r}: expected at least one allowed value, but got an empty list of choices."
        )
    labels = tuple(_label(v, field_name=field_name) for v in values)
    seen: dict[Any, Any] = {}
    for v in values:
        # bool is an int in Python: keep True and 1 apart.
        key = (type(v).__name__ if isinstance(v, bool) else "n", v.strip() if isinstance(v, str) else v)
        if key in seen:
            other = seen[key]
            how = "twice" if other == v else f"as {other!r} and {v!r}, which differ only by surrounding whitespace"
            raise SchemaError(
                f"Field {field_name!r}: expected distinct allowed values, but got {v!r} {how}. Remove the duplicate."
            )
        seen[key] = v
    # `1` may also be written "1", but when the string "1" is a label of its own that text is its answer.
    owned = {label.surfaces[0] for label in labels}
    return tuple(
        Label(label.value, (label.surfaces[0], *(t for t in label.surfaces[1:] if t not in owned))) for label in labels
    )


def _boolean(name: str, description: str | None, depends_on: Sequence[str] = ()) -> FieldSpec:
    return FieldSpec(name, "boolean", _labels([True, False], field_name=name), description, tuple(depends_on))


def _enum(name: str, values: Sequence[Any], description: str | None, depends_on: Sequence[str] = ()) -> FieldSpec:
    return FieldSpec(name, "enum", _labels(list(values), field_name=name), description, tuple(depends_on))


# ---------------------------------------------------------------------------------------------------- open values


class _NotClosed(Exception):
    """Internal: the annotation or node is not a closed choice; the field is open (generated)."""


_UNCONSTRAINED_HINT = "Give it a concrete type (str, int, a nested model, a list of one) or a Literal of the values."


def _open_field(
    name: str, node: Mapping[str, Any], root: Mapping[str, Any], description: str | None, depends_on: Sequence[str] = ()
) -> FieldSpec:
    """An open field from its JSON Schema node: references inlined, constraints checked, prompt text kept apart."""
    value = _inline(node, root, field_name=name, trail=())
    max_tokens = value.pop("x-max-tokens", None) if isinstance(value, dict) else None
    if max_tokens is not None and (isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1):
        raise SchemaError(f"Field {name!r}: expected x-max-tokens to be a positive integer, but got {max_tokens!r}.")
    for key in ("title", "default", "description", "x-depends-on", "examples"):
        value.pop(key, None)
    check_keywords(name, value)
    _check_constrained(name, value, where="")
    text = json.dumps(value, ensure_ascii=False)  # key order kept: it is the order the value is written in
    return FieldSpec(name, "open", (), description, tuple(depends_on), schema_json=text, max_tokens=max_tokens)


def _inline(node: Any, root: Mapping[str, Any], *, field_name: str, trail: tuple[str, ...], depth: int = 0) -> Any:
    """``node`` with every local ``$ref`` replaced by its target; a reference to itself is a recursive model."""
    if depth > MAX_SCHEMA_DEPTH:
        raise too_deep(field_name)
    if isinstance(node, list):
        return [_inline(v, root, field_name=field_name, trail=trail, depth=depth + 1) for v in node]
    if not isinstance(node, Mapping):
        return node
    if "$ref" in node:
        ref = node["$ref"]
        if ref in trail:
            model = str(ref).rsplit("/", 1)[-1]
            raise SchemaError(
                f"Field {field_name!r}: expected a non-recursive schema, but {model!r} contains itself "
                f"({' -> '.join([*trail, ref])}). pcd cannot bound a recursive value; flatten the model or cut the "
                "recursion at a fixed depth."
            )
        target = _resolve({"$ref": ref}, root, field_name=field_name)
        merged = {**target, **{k: v for k, v in node.items() if k != "$ref"}}
        return _inline(merged, root, field_name=field_name, trail=(*trail, ref), depth=depth)
    return {
        k: _inline(v, root, field_name=field_name, trail=trail, depth=depth + 1)
        for k, v in node.items()
        if k != "$defs"
    }


_ANNOTATION_KEYS = {"title", "description", "default", "examples", "x-max-tokens", "deprecated", "readOnly"}


def _check_constrained(name: str, node: Any, *, where: str) -> None:
    """Raise when some part of an open value accepts any JSON at all (``Any``, ``dict[str, Any]``, bare lists)."""
    at = f" at {where}" if where else ""
    if node is True or (isinstance(node, Mapping) and not (set(node) - _ANNOTATION_KEYS)):
        raise SchemaError(
            f"Field {name!r}: expected a constrained type{at}, but got an unconstrained value (Any). "
            + _UNCONSTRAINED_HINT
        )
    if not isinstance(node, Mapping):
        return
    for key in ("anyOf", "oneOf", "allOf", "prefixItems"):
        for i, option in enumerate(node.get(key) or []):
            _check_constrained(name, option, where=f"{where}{key}[{i}]")
    kinds = node.get("type")
    kinds = kinds if isinstance(kinds, list) else [kinds]
    if "object" in kinds:
        props = node.get("properties") or {}
        extra = node.get("additionalProperties", True if not props and "patternProperties" not in node else False)
        if extra is True or (isinstance(extra, Mapping) and not (set(extra) - _ANNOTATION_KEYS)):
            raise SchemaError(
                f"Field {name!r}: expected an object with known keys or typed values{at}, but got an object that "
                "takes any keys with any values (dict[str, Any]). Use a nested model or dict[str, <type>]."
            )
        if isinstance(extra, Mapping):
            _check_constrained(name, extra, where=f"{where}{{*}}")
        for key, sub in props.items():
            _check_constrained(name, sub, where=f"{where}.{key}")
    if "array" in kinds:
        items = node.get("items")
        if items is None and "prefixItems" not in node:
            raise SchemaError(
                f"Field {name!r}: expected a list of a known type{at}, but got a list of anything. Use list[<type>]."
            )
        if items is not None and items is not False:
            _check_constrained(name, items, where=f"{where}[]")


# ---------------------------------------------------------------------------------------------------- pydantic


def _int_range(name: str, lo: Any, hi: Any, step: Any = None) -> list[int]:
    """The integers of a bounded range of at most :data:`MAX_INT_LABELS` values (counted before any is built);
    wider or open ones are open."""
    try:
        return list(int_values(name, lo, hi, step=step))
    except WideRange:
        raise _NotClosed from None


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


def _multi(
    name: str,
    values: Sequence[Any],
    description: str | None,
    depends_on: Sequence[str],
    *,
    min_items: Any = 0,
    max_items: Any = None,
) -> FieldSpec:
    labels = _labels(list(values), field_name=name)
    for key, bound in (("min_items", min_items), ("max_items", max_items)):
        if bound is not None and (isinstance(bound, bool) or not isinstance(bound, int)):
            raise SchemaError(f"Field {name!r}: expected {key} to be an integer, but got {bound!r}.")
    lo = int(min_items or 0)
    hi = None if max_items is None else int(max_items)
    if lo < 0 or (hi is not None and (hi < lo or hi < 1)) or lo > len(labels):
        raise SchemaError(
            f"Field {name!r}: expected 0 <= min_items <= max_items and min_items <= {len(labels)} (the number of "
            f"values), but got min_items={lo}, max_items={hi}."
        )
    return FieldSpec(name, "multi", labels, description, tuple(depends_on), min_items=lo, max_items=hi)


def _closed_values(name: str, annotation: Any, metadata: Sequence[Any]) -> list[Any]:
    """The allowed values of a closed single-choice annotation; raises :class:`_NotClosed` for any other."""
    spec = _from_annotation(name, annotation, None, metadata)
    if spec.kind == "multi":
        raise _NotClosed
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
        spec = _enum(name, collected, description)
        if all(isinstance(v, bool) for v in spec.values):
            return FieldSpec(name, "boolean", spec.labels, description)
        return spec
    if origin in (list, set, frozenset, Sequence, collections.abc.Set) or annotation in (list, set):
        args = typing.get_args(annotation)
        if len(args) != 1:
            raise _NotClosed
        choices = _closed_values(name, args[0], ())
        lo, hi = _lengths(metadata)
        return _multi(name, choices, description, (), min_items=lo, max_items=hi)
    if annotation is bool:
        return _boolean(name, description)
    if annotation is int:
        return _enum(name, _int_range(name, *_bounds(name, metadata)), description)
    if origin is Literal:
        values = typing.get_args(annotation)
        if values and all(isinstance(v, bool) for v in values):
            return FieldSpec(name, "boolean", _labels(list(values), field_name=name), description)
        if any(isinstance(v, enum.Enum) for v in values):
            values = tuple(v.value if isinstance(v, enum.Enum) else v for v in values)
        return _enum(name, values, description)
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        members = list(annotation)
        return _enum(name, [m.value for m in members], description)
    raise _NotClosed


def _from_pydantic(model: type) -> Schema:
    specs = []
    root: dict[str, Any] | None = None
    for name, info in model.model_fields.items():  # type: ignore[attr-defined]
        key = info.alias or name
        try:
            spec = _from_annotation(key, info.annotation, info.description, info.metadata)
            specs.append(_constrain_pydantic(spec, info.annotation, info.metadata))
        except _NotClosed:
            if root is None:
                root = _model_json_schema(model, key)
            specs.append(_open_field(key, root["properties"][key], root, info.description))
    doc = model.__doc__
    if doc is not None:
        doc = _clean_doc(doc)
    return _finish(model.__name__, doc, specs, model=model)


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
            f"{str(exc).splitlines()[0]}. " + _UNCONSTRAINED_HINT
        ) from None


def _clean_doc(doc: str) -> str | None:
    import inspect

    cleaned = inspect.cleandoc(doc).strip()
    # Pydantic's own BaseModel docstring is not the user's description.
    if cleaned.startswith("!!! abstract") or cleaned.startswith("Usage docs:"):
        return None
    return cleaned or None


# ---------------------------------------------------------------------------------------------------- JSON Schema


def _resolve(node: Mapping[str, Any], root: Mapping[str, Any], *, field_name: str, depth: int = 0) -> Mapping[str, Any]:
    if depth > 32:
        raise SchemaError(f"Field {field_name!r}: expected a finite $ref chain, but got a reference cycle.")
    if "$ref" in node:
        ref = node["$ref"]
        if not isinstance(ref, str) or not ref.startswith("#/"):
            raise SchemaError(f"Field {field_name!r}: expected a local $ref like '#/$defs/Name', but got {ref!r}.")
        target: Any = root
        for part in ref[2:].split("/"):
            part = part.replace("~1", "/").replace("~0", "~")
            if not isinstance(target, Mapping) or part not in target:
                raise SchemaError(f"Field {field_name!r}: $ref {ref!r} points at nothing in the schema.")
            target = target[part]
        merged = {**target, **{k: v for k, v in node.items() if k != "$ref"}}
        return _resolve(merged, root, field_name=field_name, depth=depth + 1)
    all_of = node.get("allOf")
    if isinstance(all_of, list) and len(all_of) == 1 and isinstance(all_of[0], Mapping):
        merged = {**_resolve(all_of[0], root, field_name=field_name, depth=depth + 1)}
        merged.update({k: v for k, v in node.items() if k != "allOf"})
        return merged
    return node


def _from_json_property(name: str, node: Mapping[str, Any], root: Mapping[str, Any]) -> FieldSpec:
    if not isinstance(node, Mapping):
        raise SchemaError(f"Field {name!r}: expected a JSON Schema object, but got {type(node).__name__}.")
    check_depth(name, node)
    resolved = _resolve(node, root, field_name=name)
    description = resolved.get("description")
    if description is not None and not isinstance(description, str):
        raise SchemaError(f"Field {name!r}: expected 'description' to be a string, but got {description!r}.")
    depends_on = resolved.get("x-depends-on", ())
    try:
        spec = _closed_json(name, resolved, root, description, depends_on)
    except _NotClosed:
        return _open_field(name, node, root, description, depends_on)
    return _constrain_json(spec, _inline(node, root, field_name=name, trail=()))


def _constrain_json(spec: FieldSpec, node: Mapping[str, Any]) -> FieldSpec:
    """Keep the labels that satisfy every keyword of the field's schema; refuse keywords nobody checks."""
    check_keywords(spec.name, node, multi=spec.kind == "multi")
    if spec.kind == "multi":
        items = node.get("items", {})
        kept = filter_values(spec.name, spec.values, items if isinstance(items, Mapping) else {})
    else:
        kept = filter_values(spec.name, spec.values, node)
    if len(kept) == len(spec.labels):
        return spec
    labels = tuple(l for l in spec.labels if any(type(v) is type(l.value) and v == l.value for v in kept))
    if spec.kind == "multi" and spec.min_items > len(labels):
        raise SchemaError(
            f"Field {spec.name!r}: expected at least min_items={spec.min_items} values to satisfy the items' "
            f"constraints, but only {len(labels)} do."
        )
    return replace(spec, labels=labels)


def _closed_json(
    name: str, node: Mapping[str, Any], root: Mapping[str, Any], description: str | None, depends_on: Sequence[str]
) -> FieldSpec:
    """A closed field from a resolved JSON Schema node; raises :class:`_NotClosed` when the node is open."""
    if "const" in node:
        return _enum(name, [node["const"]], description, depends_on)
    if "enum" in node:
        values = node["enum"]
        if not isinstance(values, list):
            raise SchemaError(f"Field {name!r}: expected 'enum' to be a list, but got {type(values).__name__}.")
        if values and all(isinstance(v, bool) for v in values):
            return FieldSpec(name, "boolean", _labels(values, field_name=name), description, tuple(depends_on))
        return _enum(name, values, description, depends_on)
    for key in ("anyOf", "oneOf"):
        if key in node:
            options = node[key]
            if not isinstance(options, list) or not options:
                raise SchemaError(f"Field {name!r}: expected {key!r} to be a non-empty list of options.")
            collected: list[Any] = []
            for option in options:
                if not isinstance(option, Mapping):
                    raise SchemaError(f"Field {name!r}: expected every {key} option to be an object.")
                collected.extend(_json_values(name, option, root))
            return _enum(name, collected, description, depends_on)
    kinds = node.get("type")
    if isinstance(kinds, list):
        collected = [v for kind in kinds for v in _json_values(name, {**node, "type": kind}, root)]
        return _enum(name, collected, description, depends_on)
    if kinds == "boolean":
        return _boolean(name, description, depends_on)
    if kinds == "integer":
        return _enum(name, _json_int_range(name, node), description, depends_on)
    if kinds == "null":
        return _enum(name, [None], description, depends_on)
    if kinds == "array" and isinstance(node.get("items"), Mapping) and "prefixItems" not in node:
        values = _json_values(name, node["items"], root)
        return _multi(
            name, values, description, depends_on, min_items=node.get("minItems"), max_items=node.get("maxItems")
        )
    raise _NotClosed


def _json_int_range(name: str, node: Mapping[str, Any]) -> list[int]:
    bounds = {
        k: number_bound(name, k, node.get(k)) for k in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")
    }
    lo, hi = bounds["minimum"], bounds["maximum"]
    low_open = high_open = False
    if bounds["exclusiveMinimum"] is not None and (lo is None or bounds["exclusiveMinimum"] >= lo):
        lo, low_open = bounds["exclusiveMinimum"], True
    if bounds["exclusiveMaximum"] is not None and (hi is None or bounds["exclusiveMaximum"] <= hi):
        hi, high_open = bounds["exclusiveMaximum"], True
    try:
        return list(int_values(name, lo, hi, step=node.get("multipleOf"), exclusive=(low_open, high_open)))
    except WideRange:
        raise _NotClosed from None


def _json_values(name: str, option: Mapping[str, Any], root: Mapping[str, Any]) -> list[Any]:
    """The allowed values of one anyOf / oneOf option, a ``type`` list entry or an array's items; raises
    :class:`_NotClosed` when the option is open."""
    spec = _closed_json(name, _resolve(option, root, field_name=name), root, None, ())
    if spec.kind == "multi":
        raise _NotClosed
    return list(spec.values)


def _from_json_schema(schema: Mapping[str, Any]) -> Schema:
    check_depth("<root>", schema)
    root = schema
    schema = _resolve(schema, root, field_name="<root>")
    props = schema.get("properties")
    if not isinstance(props, Mapping) or not props:
        raise SchemaError(
            "Schema: expected a JSON Schema object with at least one entry in 'properties', but got "
            f"{'no properties' if not props else type(props).__name__}."
        )
    specs = [_from_json_property(name, node, root) for name, node in props.items()]
    return _finish(schema.get("title") or "Schema", schema.get("description"), specs)


# ---------------------------------------------------------------------------------------------------- presets


def _is_preset_field(value: Any) -> bool:
    return isinstance(value, Mapping) and value.get("type") in _PRESET_TYPES


def _from_preset(preset: Mapping[str, Any], *, title: str, description: str | None) -> Schema:
    specs = []
    for name, spec in preset.items():
        if not isinstance(spec, Mapping):
            raise SchemaError(
                f"Field {name!r}: expected a dict like {{'type': 'enum', 'choices': [...]}}, but got "
                f"{type(spec).__name__}."
            )
        kind = spec.get("type")
        allowed_keys = _PRESET_KEYS.get(str(kind), _PRESET_KEYS["enum"])
        unknown = set(spec) - allowed_keys
        if unknown:
            raise SchemaError(
                f"Field {name!r}: expected only the keys {', '.join(sorted(allowed_keys))} for type {kind!r}, but "
                f"got {sorted(unknown)}."
            )
        depends_on = spec.get("depends_on") or ()
        if isinstance(depends_on, str) or not isinstance(depends_on, Sequence):
            raise SchemaError(
                f"Field {name!r}: expected depends_on to be a list of field names, but got {depends_on!r}."
            )
        about = spec.get("description")
        if about is not None and not isinstance(about, str):
            raise SchemaError(f"Field {name!r}: expected 'description' to be a string, but got {about!r}.")
        if kind == "boolean":
            specs.append(_boolean(name, about, depends_on))
        elif kind in ("enum", "multi"):
            choices = spec.get("choices")
            if not isinstance(choices, list):
                raise SchemaError(
                    f"Field {name!r}: expected 'choices' to be a list of allowed values, but got "
                    f"{type(choices).__name__}."
                )
            if kind == "enum":
                specs.append(_enum(name, choices, about, depends_on))
            else:
                bounds = {"min_items": spec.get("min_items"), "max_items": spec.get("max_items")}
                specs.append(_multi(name, choices, about, depends_on, **bounds))
        elif kind == "string":
            node: dict[str, Any] = {"type": "string"}
            for key, json_key in (("max_length", "maxLength"), ("pattern", "pattern"), ("max_tokens", "x-max-tokens")):
                if spec.get(key) is not None:
                    node[json_key] = spec[key]
            specs.append(_open_field(name, node, {}, about, depends_on))
        else:
            raise SchemaError(
                f"Field {name!r}: expected type 'enum', 'boolean', 'multi' or 'string', but got {kind!r}. Use a "
                "JSON Schema for other open types."
            )
    return _finish(title, description, specs)


def load_preset(source: str | Path | Mapping[str, Any]) -> Preset:
    """Load a preset file ``{"title", "schema", "context"}`` from a path or an already parsed dict.

    Args:
        source: A path to a JSON file, or the parsed dict.

    Returns:
        The preset with its schema compiled.

    Raises:
        SchemaError: If the file is missing, is not JSON, or does not hold a valid preset.
    """
    data: Any = source
    where = "preset"
    if isinstance(source, (str, Path)):
        path = Path(source)
        where = f"Preset file {str(path)!r}"
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise SchemaError(f"{where}: expected an existing JSON file, but it does not exist.") from None
        except json.JSONDecodeError as exc:
            raise SchemaError(f"{where}: expected valid JSON, but got a parse error: {exc}.") from None
    if not isinstance(data, Mapping) or not isinstance(data.get("schema"), Mapping):
        raise SchemaError(
            f"{where}: expected a dict with a 'schema' dict, 'title' and 'context', but got {type(data).__name__}."
        )
    title = data.get("title") or "Preset"
    inner = data["schema"]
    if all(_is_preset_field(v) for v in inner.values()) and inner:
        schema = _from_preset(inner, title=title, description=data.get("description"))
    else:
        schema = _from_json_schema(inner)
    context = data.get("context")
    if context is not None and not isinstance(context, str):
        raise SchemaError(f"{where}: expected 'context' to be a string, but got {type(context).__name__}.")
    return Preset(title=title, schema=schema, context=context)


# ---------------------------------------------------------------------------------------------------- entry point


def _finish(title: str, description: str | None, specs: list[FieldSpec], *, model: type | None = None) -> Schema:
    if not specs:
        raise SchemaError(f"Schema {title!r}: expected at least one field, but got none.")
    names = [s.name for s in specs]
    seen: set[str] = set()
    for spec in specs:
        if spec.name in seen:
            raise SchemaError(
                f"Field {spec.name!r}: expected every key (field name or alias) to be unique, but two fields write "
                f"{spec.name!r}; one answer would be lost. Give them distinct aliases."
            )
        seen.add(spec.name)
    for spec in specs:
        for dep in spec.depends_on:
            if dep == spec.name:
                raise SchemaError(
                    f"Field {spec.name!r}: expected depends_on to name other fields, but it names itself."
                )
            if dep not in names:
                raise SchemaError(
                    f"Field {spec.name!r}: expected depends_on to name fields of this schema, but got {dep!r}. "
                    f"Known fields: {names}."
                )
            if not next(o for o in specs if o.name == dep).scored:
                raise SchemaError(
                    f"Field {spec.name!r}: expected depends_on to name closed fields, but {dep!r} is generated. "
                    "Open fields are generated last, in parallel, and already see every closed answer."
                )
    _check_acyclic(specs)
    payload = json.dumps(
        [
            title,
            description,
            [
                [
                    s.name,
                    s.kind,
                    [l.surfaces for l in s.labels],
                    s.description,
                    s.depends_on,
                    s.min_items,
                    s.max_items,
                    s.schema_json,
                    s.max_tokens,
                ]
                for s in specs
            ],
        ],
        ensure_ascii=False,
    )
    fingerprint = hashlib.sha256(payload.encode("utf-8")).hexdigest()[:16]
    return Schema(title=title, description=description, fields=tuple(specs), model=model, fingerprint=fingerprint)


def _check_acyclic(specs: list[FieldSpec]) -> None:
    deps = {s.name: s.depends_on for s in specs}
    state: dict[str, int] = {}

    def visit(name: str, trail: list[str]) -> None:
        if state.get(name) == 2:
            return
        if state.get(name) == 1:
            cycle = " -> ".join([*trail[trail.index(name) :], name])
            raise SchemaError(f"Field {name!r}: expected depends_on without cycles, but got {cycle}.")
        state[name] = 1
        for dep in deps[name]:
            visit(dep, [*trail, name])
        state[name] = 2

    for s in specs:
        visit(s.name, [])


def compile_schema(schema: Any) -> Schema:
    """Compile a Pydantic model, JSON Schema, preset dict or preset file into a :class:`Schema`.

    Args:
        schema: A Pydantic v2 model class, a JSON Schema dict, a preset dict, a preset file dict, a
            :class:`Preset`, or an already compiled :class:`Schema`.

    Returns:
        The compiled schema.

    Raises:
        SchemaError: If the schema or any field cannot be decided; the message names the field.
    """
    if isinstance(schema, Schema):
        return schema
    if isinstance(schema, Preset):
        return schema.schema
    if isinstance(schema, type) and hasattr(schema, "model_fields") and hasattr(schema, "model_validate"):
        return _from_pydantic(schema)
    if isinstance(schema, Mapping):
        if schema and all(_is_preset_field(v) for v in schema.values()):
            return _from_preset(schema, title="Preset", description=None)
        if "schema" in schema and set(schema) <= _PRESET_FILE_KEYS:
            return load_preset(schema).schema
        if "properties" in schema or "$ref" in schema or schema.get("type") == "object":
            return _from_json_schema(schema)
        raise SchemaError(
            "Schema: expected a JSON Schema with 'properties', a preset dict of {'type': 'enum'|'boolean'|...} "
            f"fields, or a preset file with 'schema', but got a dict with keys {sorted(schema)[:8]}."
        )
    if isinstance(schema, type):
        raise SchemaError(
            f"Schema: expected a Pydantic v2 model class, but got class {schema.__name__}. Subclass pydantic.BaseModel."
        )
    raise SchemaError(
        "Schema: expected a Pydantic model class, a JSON Schema dict or a preset dict, but got "
        f"{type(schema).__name__}."
    )
