"""The compiled form of a schema: :class:`Label`, :class:`FieldSpec`, :class:`Schema`, :class:`Preset`, and the
builders every reader shares (labels from values, boolean / enum / multi fields, the checked schema with its
fingerprint).
"""

from __future__ import annotations

import hashlib
import json
import unicodedata
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from pcd_engine.errors import SchemaError
from pcd_engine.schema.constraints import is_valid

__all__ = [
    "FieldSpec",
    "Grade",
    "Label",
    "LabelValue",
    "Preset",
    "Schema",
    "boolean_field",
    "build_schema",
    "enum_field",
    "flag_key",
    "label_of",
    "labels_of",
    "multi_field",
]

LabelValue = str | int | bool | None


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
        default_json: For ``open``: the field's default value (its schema's ``default``) as JSON text, or ``None``:
            what the field holds when nothing the model wrote can be completed into a valid value.
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
    default_json: str | None = None

    @property
    def default(self) -> tuple[bool, Any]:
        """``(True, value)`` for a field with a default (:attr:`default_json`), else ``(False, None)``."""
        return (False, None) if self.default_json is None else (True, json.loads(self.default_json))

    def token_limit(self, default: int) -> int:
        """The most tokens this open field's value may take: its own :attr:`max_tokens`, else ``default`` (the
        call's). The one place the fallback is worked out."""
        return self.max_tokens or default

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

    def grade(self, values: Mapping[str, Any]) -> Grade:
        """How a written answer (a JSON object's pairs) measures up: each field ok, missing or invalid, and the
        keys the schema does not have."""
        status = {}
        for spec in self.fields:
            if spec.name not in values:
                status[spec.name] = "missing"
            else:
                status[spec.name] = "ok" if spec.allows(spec.read(values[spec.name])) else "invalid"
        known = {f.name for f in self.fields}
        return Grade(status, tuple(k for k in values if k not in known))


@dataclass(frozen=True)
class Grade:
    """A written answer graded against a schema (:meth:`Schema.grade`).

    Attributes:
        status: Per field of the schema, in order: ``"ok"``, ``"missing"`` or ``"invalid"``.
        extra: Keys written that the schema does not have, in the order written.
    """

    status: Mapping[str, str]
    extra: tuple[str, ...]

    @property
    def valid(self) -> bool:
        """Every field present and allowed, and no other key."""
        return not self.extra and all(s == "ok" for s in self.status.values())

    def having(self, status: str) -> list[str]:
        """The fields with ``status``, in order."""
        return [name for name, s in self.status.items() if s == status]

    def errors(self, values: Mapping[str, Any]) -> list[str]:
        """What makes the answer invalid, in words (``values`` is the graded answer)."""
        out = []
        for name, s in self.status.items():
            if s == "missing":
                out.append(f"missing key {name!r}")
            elif s == "invalid":
                out.append(f"invalid value for {name!r}: {values[name]!r}")
        return out + [f"extra key {k!r}" for k in self.extra]


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


def label_of(value: Any, *, field_name: str) -> Label:
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


def _reading(text: str) -> str:
    """A label as a reader tells it from others: compatibility-normalized (NFKC: full-width and ligature forms),
    without invisible format characters (zero-width spaces and joiners, direction marks), stripped and case-folded."""
    shown = "".join(ch for ch in unicodedata.normalize("NFKC", text) if unicodedata.category(ch) != "Cf")
    return shown.strip().casefold()


def labels_of(values: Sequence[Any], *, field_name: str) -> tuple[Label, ...]:
    if len(values) == 0:
        raise SchemaError(
            f"Field {field_name!r}: expected at least one allowed value, but got an empty list of choices."
        )
    labels = tuple(label_of(v, field_name=field_name) for v in values)
    seen: dict[Any, Any] = {}
    for v in values:
        # bool is an int in Python: keep True and 1 apart.
        key = (type(v).__name__ if isinstance(v, bool) else "n", _reading(v) if isinstance(v, str) else v)
        if key in seen:
            other = seen[key]
            how = (
                "twice"
                if other == v
                else f"as {other!r} and {v!r}, which differ only by case, width, surrounding whitespace or invisible "
                "characters (a reader cannot tell which is meant)"
            )
            raise SchemaError(
                f"Field {field_name!r}: expected distinct allowed values, but got {v!r} {how}. Remove the duplicate."
            )
        seen[key] = v
    # `1` may also be written "1", but when the string "1" is a label of its own that text is its answer.
    owned = {label.surfaces[0] for label in labels}
    return tuple(
        Label(label.value, (label.surfaces[0], *(t for t in label.surfaces[1:] if t not in owned))) for label in labels
    )


def boolean_field(name: str, description: str | None, depends_on: Sequence[str] = ()) -> FieldSpec:
    return FieldSpec(name, "boolean", labels_of([True, False], field_name=name), description, tuple(depends_on))


def enum_field(name: str, values: Sequence[Any], description: str | None, depends_on: Sequence[str] = ()) -> FieldSpec:
    return FieldSpec(name, "enum", labels_of(list(values), field_name=name), description, tuple(depends_on))


def multi_field(
    name: str,
    values: Sequence[Any],
    description: str | None,
    depends_on: Sequence[str],
    *,
    min_items: Any = 0,
    max_items: Any = None,
) -> FieldSpec:
    labels = labels_of(list(values), field_name=name)
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


def build_schema(title: str, description: str | None, specs: list[FieldSpec], *, model: type | None = None) -> Schema:
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
                    *([] if s.default_json is None else [s.default_json]),  # older fingerprints unchanged
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
