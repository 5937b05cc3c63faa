"""JSON Schema objects read into fields: ``boolean``, ``enum``, ``const``, bounded ``integer``, ``null`` and their
unions are closed, an ``array`` of those is multi-label, anything else is open; local ``$ref`` is followed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from pcd_engine.errors import SchemaError
from pcd_engine.schema.constraints import (
    WideRange,
    check_depth,
    check_keywords,
    filter_values,
    int_values,
    number_bound,
)
from pcd_engine.schema.fields import FieldSpec, Schema, boolean_field, build_schema, enum_field, labels_of, multi_field
from pcd_engine.schema.open_values import NotClosed, inline_refs, open_field, resolve_ref

__all__ = ["from_json_schema"]


def _from_json_property(name: str, node: Mapping[str, Any], root: Mapping[str, Any]) -> FieldSpec:
    if not isinstance(node, Mapping):
        raise SchemaError(f"Field {name!r}: expected a JSON Schema object, but got {type(node).__name__}.")
    check_depth(name, node)
    resolved = resolve_ref(node, root, field_name=name)
    description = resolved.get("description")
    if description is not None and not isinstance(description, str):
        raise SchemaError(f"Field {name!r}: expected 'description' to be a string, but got {description!r}.")
    depends_on = resolved.get("x-depends-on", ())
    try:
        spec = _closed_json(name, resolved, root, description, depends_on)
    except NotClosed:
        return open_field(name, node, root, description, depends_on)
    return _constrain_json(spec, inline_refs(node, root, field_name=name, trail=()))


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
    """A closed field from a resolved JSON Schema node; raises :class:`NotClosed` when the node is open."""
    if "const" in node:
        return enum_field(name, [node["const"]], description, depends_on)
    if "enum" in node:
        values = node["enum"]
        if not isinstance(values, list):
            raise SchemaError(f"Field {name!r}: expected 'enum' to be a list, but got {type(values).__name__}.")
        if values and all(isinstance(v, bool) for v in values):
            return FieldSpec(name, "boolean", labels_of(values, field_name=name), description, tuple(depends_on))
        return enum_field(name, values, description, depends_on)
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
            return enum_field(name, collected, description, depends_on)
    kinds = node.get("type")
    if isinstance(kinds, list):
        collected = [v for kind in kinds for v in _json_values(name, {**node, "type": kind}, root)]
        return enum_field(name, collected, description, depends_on)
    if kinds == "boolean":
        return boolean_field(name, description, depends_on)
    if kinds == "integer":
        return enum_field(name, _json_int_range(name, node), description, depends_on)
    if kinds == "null":
        return enum_field(name, [None], description, depends_on)
    if kinds == "array" and isinstance(node.get("items"), Mapping) and "prefixItems" not in node:
        values = _json_values(name, node["items"], root)
        return multi_field(
            name, values, description, depends_on, min_items=node.get("minItems"), max_items=node.get("maxItems")
        )
    raise NotClosed


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
        raise NotClosed from None


def _json_values(name: str, option: Mapping[str, Any], root: Mapping[str, Any]) -> list[Any]:
    """The allowed values of one anyOf / oneOf option, a ``type`` list entry or an array's items; raises
    :class:`NotClosed` when the option is open."""
    spec = _closed_json(name, resolve_ref(option, root, field_name=name), root, None, ())
    if spec.kind == "multi":
        raise NotClosed
    return list(spec.values)


def from_json_schema(schema: Mapping[str, Any]) -> Schema:
    check_depth("<root>", schema)
    root = schema
    schema = resolve_ref(schema, root, field_name="<root>")
    props = schema.get("properties")
    if not isinstance(props, Mapping) or not props:
        raise SchemaError(
            "Schema: expected a JSON Schema object with at least one entry in 'properties', but got "
            f"{'no properties' if not props else type(props).__name__}."
        )
    specs = [_from_json_property(name, node, root) for name, node in props.items()]
    return build_schema(schema.get("title") or "Schema", schema.get("description"), specs)
