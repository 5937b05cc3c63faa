"""The smallest valid value of a JSON Schema: what an open field holds when what the model wrote cannot be completed
into a valid value (it reached its token limit, or the grammar allowed what the validator refuses) and the field has
no default.

"Smallest" means the least the schema asks for: ``null`` where null is allowed, the first ``const``/``enum`` value,
``false``, the number nearest 0 within the bounds, the shortest string (a fixed canonical one for the common formats),
the fewest items and only the required properties, each smallest. Every value found is checked against the schema
itself (:func:`~pcd_engine.schema.constraints.is_valid`); a schema whose smallest value cannot be built this way (a
``pattern`` the empty string does not match, say) has none.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from pcd_engine.schema.constraints import is_valid

__all__ = ["FORMAT_EXAMPLES", "smallest_value"]

FORMAT_EXAMPLES: dict[str, str] = {
    "date-time": "1970-01-01T00:00:00Z",
    "date": "1970-01-01",
    "time": "00:00:00Z",
    "duration": "P0D",
    "uuid": "00000000-0000-0000-0000-000000000000",
    "email": "user@example.com",
    "ipv4": "0.0.0.0",
    "ipv6": "::",
    "hostname": "localhost",
    "uri": "http://localhost",
}
"""The string a field of each ``format`` holds when nothing valid was written."""

_MISSING = object()
_DEPTH = 64


def smallest_value(schema: Mapping[str, Any] | bool) -> tuple[bool, Any]:
    """The smallest value ``schema`` accepts.

    Args:
        schema: A self-contained JSON Schema (references inlined, as an open field's value schema is).

    Returns:
        ``(True, value)``, or ``(False, None)`` when no value could be built that the schema accepts.
    """
    value = _smallest(schema, 0)
    if value is _MISSING or not is_valid(schema, value):
        return False, None
    return True, value


def _smallest(node: Any, depth: int) -> Any:
    if node is True or node == {}:
        return None
    if not isinstance(node, Mapping) or depth > _DEPTH:
        return _MISSING
    if "const" in node:
        return node["const"]
    if isinstance(node.get("enum"), list) and node["enum"]:
        return node["enum"][0]
    for key in ("anyOf", "oneOf"):
        branches = node.get(key)
        if isinstance(branches, list):
            return _first_branch(node, key, branches, depth)
    if isinstance(node.get("allOf"), list):
        merged: dict[str, Any] = {k: v for k, v in node.items() if k != "allOf"}
        for part in node["allOf"]:
            if isinstance(part, Mapping):
                merged.update(part)
        return _smallest(merged, depth + 1)
    kinds = node.get("type")
    if kinds is None:
        kinds = "object" if "properties" in node else "array" if ("items" in node or "prefixItems" in node) else None
    if kinds is None:
        return None
    options = [kinds] if isinstance(kinds, str) else list(kinds)
    if "null" in options:
        return None
    for kind in options:
        value = _of_type(node, kind, depth)
        if value is not _MISSING:
            return value
    return _MISSING


def _first_branch(node: Mapping[str, Any], key: str, branches: list[Any], depth: int) -> Any:
    rest = {k: v for k, v in node.items() if k != key}
    ordered = sorted(branches, key=lambda b: not (isinstance(b, Mapping) and b.get("type") == "null"))
    for branch in ordered:
        merged = {**rest, **branch} if isinstance(branch, Mapping) else branch
        value = _smallest(merged, depth + 1)
        if value is not _MISSING and is_valid(dict(node), value):
            return value
    return _MISSING


def _of_type(node: Mapping[str, Any], kind: str, depth: int) -> Any:
    if kind == "boolean":
        return False
    if kind in ("integer", "number"):
        return _number(node, integer=kind == "integer")
    if kind == "string":
        text = FORMAT_EXAMPLES.get(str(node.get("format")), "")
        return text + "a" * max(0, int(node.get("minLength", 0)) - len(text))
    if kind == "array":
        return _array(node, depth)
    if kind == "object":
        given = node.get("properties")
        properties: Mapping[str, Any] = given if isinstance(given, Mapping) else {}
        out = {}
        for name in node.get("required", []):
            value = _smallest(properties.get(name, {}), depth + 1)
            if value is _MISSING:
                return _MISSING
            out[name] = value
        return out
    return _MISSING


def _number(node: Mapping[str, Any], *, integer: bool) -> Any:
    step = node.get("multipleOf")
    low, high = node.get("minimum"), node.get("maximum")
    low_open, high_open = node.get("exclusiveMinimum"), node.get("exclusiveMaximum")
    unit = step if isinstance(step, (int, float)) and step > 0 else 1
    floor = max([v for v in (low, None if low_open is None else low_open + unit) if v is not None], default=None)
    value: float = 0 if floor is None or floor <= 0 else floor
    ceiling = min([v for v in (high, None if high_open is None else high_open - unit) if v is not None], default=None)
    if ceiling is not None and value > ceiling:
        value = ceiling
    if isinstance(step, (int, float)) and step > 0:
        value = math.ceil(value / step) * step
    return int(math.ceil(value)) if integer else float(value)


def _array(node: Mapping[str, Any], depth: int) -> Any:
    count = int(node.get("minItems", 0))
    found = node.get("prefixItems")
    prefix: list[Any] = found if isinstance(found, list) else []
    out = []
    for i in range(count):
        item = prefix[i] if i < len(prefix) else node.get("items", {})
        value = _smallest(item, depth + 1)
        if value is _MISSING:
            return _MISSING
        out.append(value)
    return out
