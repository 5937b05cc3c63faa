"""Open fields: values generated under their own JSON Schema, with local ``$ref`` inlined and every keyword
checked (a keyword no validator checks is a :class:`~pcd_engine.errors.SchemaError`, not a silent no-op).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from pcd_engine.errors import SchemaError
from pcd_engine.schema.constraints import MAX_SCHEMA_DEPTH, check_keywords, too_deep
from pcd_engine.schema.fields import FieldSpec

__all__ = ["NotClosed", "UNCONSTRAINED_HINT", "inline_refs", "open_field", "resolve_ref"]


class NotClosed(Exception):
    """Internal: the annotation or node is not a closed choice; the field is open (generated)."""


_NONE = object()
UNCONSTRAINED_HINT = "Give it a concrete type (str, int, a nested model, a list of one) or a Literal of the values."


def open_field(
    name: str, node: Mapping[str, Any], root: Mapping[str, Any], description: str | None, depends_on: Sequence[str] = ()
) -> FieldSpec:
    """An open field from its JSON Schema node: references inlined, constraints checked, prompt text kept apart."""
    value = _without_discriminators(inline_refs(node, root, field_name=name, trail=()))
    max_tokens = value.pop("x-max-tokens", None) if isinstance(value, dict) else None
    if max_tokens is not None and (isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1):
        raise SchemaError(f"Field {name!r}: expected x-max-tokens to be a positive integer, but got {max_tokens!r}.")
    default = value.get("default", _NONE) if isinstance(value, dict) else _NONE
    for key in ("title", "default", "description", "x-depends-on", "examples"):
        value.pop(key, None)
    check_keywords(name, value)
    _check_constrained(name, value, where="")
    text = json.dumps(value, ensure_ascii=False)  # key order kept: it is the order the value is written in
    try:  # kept apart from the value's schema (it is not written into the prompt), used when nothing else is valid
        default_json = None if default is _NONE else json.dumps(default, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError):
        default_json = None
    return FieldSpec(
        name, "open", (), description, tuple(depends_on), schema_json=text, max_tokens=max_tokens,
        default_json=default_json,
    )  # fmt: skip


def _without_discriminators(node: Any) -> Any:
    """``node`` without OpenAPI's ``discriminator`` (what Pydantic writes for a discriminated union): not a JSON
    Schema keyword, and redundant beside the ``oneOf``/``anyOf`` it annotates, whose branches each fix the tag
    property to their own value; kept where there is no such union to do its work."""
    if isinstance(node, list):
        return [_without_discriminators(v) for v in node]
    if not isinstance(node, Mapping):
        return node
    union = "oneOf" in node or "anyOf" in node
    return {k: _without_discriminators(v) for k, v in node.items() if not (k == "discriminator" and union)}


def inline_refs(node: Any, root: Mapping[str, Any], *, field_name: str, trail: tuple[str, ...], depth: int = 0) -> Any:
    """``node`` with every local ``$ref`` replaced by its target; a reference to itself is a recursive model."""
    if depth > MAX_SCHEMA_DEPTH:
        raise too_deep(field_name)
    if isinstance(node, list):
        return [inline_refs(v, root, field_name=field_name, trail=trail, depth=depth + 1) for v in node]
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
        target = resolve_ref({"$ref": ref}, root, field_name=field_name)
        merged = {**target, **{k: v for k, v in node.items() if k != "$ref"}}
        return inline_refs(merged, root, field_name=field_name, trail=(*trail, ref), depth=depth)
    return {
        k: inline_refs(v, root, field_name=field_name, trail=trail, depth=depth + 1)
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
            + UNCONSTRAINED_HINT
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


def resolve_ref(
    node: Mapping[str, Any], root: Mapping[str, Any], *, field_name: str, depth: int = 0
) -> Mapping[str, Any]:
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
        return resolve_ref(merged, root, field_name=field_name, depth=depth + 1)
    all_of = node.get("allOf")
    if isinstance(all_of, list) and len(all_of) == 1 and isinstance(all_of[0], Mapping):
        merged = {**resolve_ref(all_of[0], root, field_name=field_name, depth=depth + 1)}
        merged.update({k: v for k, v in node.items() if k != "allOf"})
        return merged
    return node
