"""What to ask: schemas compiled to closed fields and their allowed labels.

Three inputs are accepted and all end up as one :class:`Schema`:

* a Pydantic v2 model whose fields are ``bool``, ``Literal[...]`` of str or int, an ``Enum`` of str or int, a
  bounded ``int`` (``ge``/``gt`` and ``le``/``lt``, at most :data:`MAX_INT_LABELS` values), or ``Optional`` of one
  of those (``None`` becomes one more label, written as JSON ``null``);
* a JSON Schema object with ``boolean``, ``enum``, ``const``, bounded ``integer``, ``null``, ``type`` lists and
  ``anyOf``/``oneOf`` of those, with ``$ref``;
* a preset dict ``{"field": {"type": "enum" | "boolean", "choices": [...], "description": ..., "depends_on": [...]}}``
  (a ``null`` choice makes the field optional), or a preset file ``{"title": ..., "schema": {...}, "context": ...}``.

Anything else raises :class:`~pcd_engine.errors.SchemaError` naming the field, before any model work.
"""

from __future__ import annotations

import enum
import hashlib
import json
import types
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Union

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
# A bounded integer field becomes one label per value; wider ranges need a Literal of the values that matter.
MAX_INT_LABELS = 256
_PRESET_TYPES = ("enum", "boolean")
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


@dataclass(frozen=True)
class FieldSpec:
    """One closed field to decide.

    Attributes:
        name: The JSON key.
        kind: ``"boolean"`` or ``"enum"``.
        labels: The allowed values, in schema order.
        description: Text shown to the model next to the key, or ``None``.
        depends_on: Names of fields that must be decided (and written into the prompt) first.
    """

    name: str
    kind: Literal["boolean", "enum"]
    labels: tuple[Label, ...]
    description: str | None = None
    depends_on: tuple[str, ...] = ()

    @property
    def values(self) -> tuple[LabelValue, ...]:
        """The allowed values, in order."""
        return tuple(label.value for label in self.labels)

    def allows(self, value: Any) -> bool:
        """Whether ``value`` is one of the allowed values, type included (``1`` is not ``True``, ``"1"`` not ``1``)."""
        return any(type(value) is type(v) and value == v for v in self.values)


@dataclass(frozen=True)
class Schema:
    """A compiled schema: ordered closed fields plus what the prompt says about them.

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
        to write the same object pcd decides; compiling it back gives the same fields and labels.
        """
        properties: dict[str, Any] = {}
        for spec in self.fields:
            node: dict[str, Any] = {"type": "boolean"} if spec.kind == "boolean" else {"enum": list(spec.values)}
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
    return labels


def _boolean(name: str, description: str | None, depends_on: Sequence[str] = ()) -> FieldSpec:
    return FieldSpec(name, "boolean", _labels([True, False], field_name=name), description, tuple(depends_on))


def _enum(name: str, values: Sequence[Any], description: str | None, depends_on: Sequence[str] = ()) -> FieldSpec:
    return FieldSpec(name, "enum", _labels(list(values), field_name=name), description, tuple(depends_on))


# ---------------------------------------------------------------------------------------------------- pydantic


def _type_name(annotation: Any) -> str:
    if isinstance(annotation, type):
        return annotation.__name__
    return str(annotation).replace("typing.", "")


def _int_range(name: str, lo: Any, hi: Any) -> list[int]:
    """The integers of a bounded range, checked against :data:`MAX_INT_LABELS`."""
    if lo is None or hi is None:
        side = "lower" if lo is None else "upper"
        raise SchemaError(
            f"Field {name!r}: expected an int with both bounds (ge/gt and le/lt), but it has no {side} bound. "
            f"Bound it (at most {MAX_INT_LABELS} values) or use a Literal of the allowed numbers."
        )
    values = list(range(int(lo), int(hi) + 1))
    if not values:
        raise SchemaError(f"Field {name!r}: expected a non-empty integer range, but got {lo}..{hi}.")
    if len(values) > MAX_INT_LABELS:
        raise SchemaError(
            f"Field {name!r}: expected a bounded int of at most {MAX_INT_LABELS} values, but got {len(values)} "
            f"({lo}..{hi}). Narrow the range or use a Literal of the allowed numbers."
        )
    return values


def _bounds(metadata: Sequence[Any]) -> tuple[Any, Any]:
    """Inclusive integer bounds from Pydantic / annotated-types constraints (ge, gt, le, lt, Interval)."""
    lo = hi = None
    for item in metadata:
        for inner in [item, *getattr(item, "metadata", ())]:
            if getattr(inner, "ge", None) is not None:
                lo = inner.ge
            if getattr(inner, "gt", None) is not None:
                lo = inner.gt + 1
            if getattr(inner, "le", None) is not None:
                hi = inner.le
            if getattr(inner, "lt", None) is not None:
                hi = inner.lt - 1
    return lo, hi


def _from_annotation(name: str, annotation: Any, description: str | None, metadata: Sequence[Any] = ()) -> FieldSpec:
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        inner, *extra = typing.get_args(annotation)
        return _from_annotation(name, inner, description, [*metadata, *extra])
    if origin in (Union, types.UnionType):
        options = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(options) == 1 and len(options) < len(typing.get_args(annotation)):
            inner_spec = _from_annotation(name, options[0], description, metadata)
            labels = _labels([*inner_spec.values, None], field_name=name)
            return FieldSpec(name, "enum", labels, description)
        raise SchemaError(
            f"Field {name!r}: expected a bool, Literal, Enum, bounded int, or Optional of one of them, but got "
            f"{_type_name(annotation)}. Merge the choices into one Literal[...]."
        )
    if annotation is bool:
        return _boolean(name, description)
    if annotation is int:
        return _enum(name, _int_range(name, *_bounds(metadata)), description)
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
    received = _type_name(annotation)
    raise SchemaError(
        f"Field {name!r}: expected a bool, Literal, Enum or bounded int type, but got {received}. "
        "Use a Literal[...] of the allowed values."
    )


def _from_pydantic(model: type) -> Schema:
    specs = []
    for name, info in model.model_fields.items():  # type: ignore[attr-defined]
        key = info.alias or name
        specs.append(_from_annotation(key, info.annotation, info.description, info.metadata))
    doc = model.__doc__
    if doc is not None:
        doc = _clean_doc(doc)
    return _finish(model.__name__, doc, specs, model=model)


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
    node = _resolve(node, root, field_name=name)
    description = node.get("description")
    depends_on = node.get("x-depends-on", ())
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
                collected.extend(_json_values(name, {**option, "description": None}, root, key))
            return _enum(name, collected, description, depends_on)
    kinds = node.get("type")
    if isinstance(kinds, list):
        collected = [v for kind in kinds for v in _json_values(name, {**node, "type": kind}, root, "type")]
        return _enum(name, collected, description, depends_on)
    if kinds == "boolean":
        return _boolean(name, description, depends_on)
    if kinds == "integer":
        return _enum(name, _json_int_range(name, node), description, depends_on)
    if kinds == "null":
        return _enum(name, [None], description, depends_on)
    received = node.get("type", "a schema without enum, const or type")
    raise SchemaError(
        f"Field {name!r}: expected a boolean, enum, const, bounded integer, null, or anyOf/oneOf of those, but got "
        f"{received!r}. Give the field an 'enum' of its allowed values."
    )


def _json_int_range(name: str, node: Mapping[str, Any]) -> list[int]:
    lo, hi = node.get("minimum"), node.get("maximum")
    if node.get("exclusiveMinimum") is not None:
        lo = int(node["exclusiveMinimum"]) + 1
    if node.get("exclusiveMaximum") is not None:
        hi = int(node["exclusiveMaximum"]) - 1
    return _int_range(name, lo, hi)


def _json_values(name: str, option: Mapping[str, Any], root: Mapping[str, Any], where: str) -> list[Any]:
    """The allowed values of one anyOf / oneOf option or one entry of a ``type`` list."""
    try:
        return list(_from_json_property(name, option, root).values)
    except SchemaError as exc:
        raise SchemaError(
            f"Field {name!r}: expected every {where} option to be a const, enum, boolean, bounded integer or null, "
            f"but got {json.dumps(option, default=str)[:80]} ({exc})."
        ) from None


def _from_json_schema(schema: Mapping[str, Any]) -> Schema:
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
        unknown = set(spec) - {"type", "choices", "description", "depends_on"}
        if unknown:
            raise SchemaError(
                f"Field {name!r}: expected only the keys type, choices, description and depends_on, but got "
                f"{sorted(unknown)}."
            )
        depends_on = spec.get("depends_on") or ()
        if isinstance(depends_on, str) or not isinstance(depends_on, Sequence):
            raise SchemaError(
                f"Field {name!r}: expected depends_on to be a list of field names, but got {depends_on!r}."
            )
        if kind == "boolean":
            specs.append(_boolean(name, spec.get("description"), depends_on))
        elif kind == "enum":
            choices = spec.get("choices")
            if not isinstance(choices, list):
                raise SchemaError(
                    f"Field {name!r}: expected 'choices' to be a list of allowed values, but got "
                    f"{type(choices).__name__}."
                )
            specs.append(_enum(name, choices, spec.get("description"), depends_on))
        else:
            raise SchemaError(
                f"Field {name!r}: expected type 'enum' or 'boolean', but got {kind!r}. Other field types are not "
                "supported yet."
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
    _check_acyclic(specs)
    payload = json.dumps(
        [
            title,
            description,
            [[s.name, s.kind, [l.surfaces for l in s.labels], s.description, s.depends_on] for s in specs],
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
            "Schema: expected a JSON Schema with 'properties', a preset dict of {'type': 'enum'|'boolean', ...} "
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
