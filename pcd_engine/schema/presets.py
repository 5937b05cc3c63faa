"""Preset dicts (``{"field": {"type": "enum", "choices": [...]}}``) and preset files (``{"title", "schema",
"context"}``), and :func:`load_preset` for a path or a mapping.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pcd_engine.errors import SchemaError
from pcd_engine.schema.fields import Preset, Schema, boolean_field, build_schema, enum_field, multi_field
from pcd_engine.schema.json_reader import from_json_schema
from pcd_engine.schema.open_values import open_field

__all__ = ["PRESET_FILE_KEYS", "PRESET_KEYS", "PRESET_TYPES", "from_preset", "is_preset_field", "load_preset"]

PRESET_TYPES = ("enum", "boolean", "multi", "string")
PRESET_KEYS = {
    "boolean": {"type", "description", "depends_on"},
    "enum": {"type", "choices", "description", "depends_on"},
    "multi": {"type", "choices", "min_items", "max_items", "description", "depends_on"},
    "string": {"type", "max_length", "pattern", "max_tokens", "description", "depends_on"},
}
PRESET_FILE_KEYS = {"title", "schema", "context", "description"}


def is_preset_field(value: Any) -> bool:
    return isinstance(value, Mapping) and value.get("type") in PRESET_TYPES


def from_preset(preset: Mapping[str, Any], *, title: str, description: str | None) -> Schema:
    specs = []
    for name, spec in preset.items():
        if not isinstance(spec, Mapping):
            raise SchemaError(
                f"Field {name!r}: expected a dict like {{'type': 'enum', 'choices': [...]}}, but got "
                f"{type(spec).__name__}."
            )
        kind = spec.get("type")
        allowed_keys = PRESET_KEYS.get(str(kind), PRESET_KEYS["enum"])
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
            specs.append(boolean_field(name, about, depends_on))
        elif kind in ("enum", "multi"):
            choices = spec.get("choices")
            if not isinstance(choices, list):
                raise SchemaError(
                    f"Field {name!r}: expected 'choices' to be a list of allowed values, but got "
                    f"{type(choices).__name__}."
                )
            if kind == "enum":
                specs.append(enum_field(name, choices, about, depends_on))
            else:
                bounds = {"min_items": spec.get("min_items"), "max_items": spec.get("max_items")}
                specs.append(multi_field(name, choices, about, depends_on, **bounds))
        elif kind == "string":
            node: dict[str, Any] = {"type": "string"}
            for key, json_key in (("max_length", "maxLength"), ("pattern", "pattern"), ("max_tokens", "x-max-tokens")):
                if spec.get(key) is not None:
                    node[json_key] = spec[key]
            specs.append(open_field(name, node, {}, about, depends_on))
        else:
            raise SchemaError(
                f"Field {name!r}: expected type 'enum', 'boolean', 'multi' or 'string', but got {kind!r}. Use a "
                "JSON Schema for other open types."
            )
    return build_schema(title, description, specs)


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
    if all(is_preset_field(v) for v in inner.values()) and inner:
        schema = from_preset(inner, title=title, description=data.get("description"))
    else:
        schema = from_json_schema(inner)
    context = data.get("context")
    if context is not None and not isinstance(context, str):
        raise SchemaError(f"{where}: expected 'context' to be a string, but got {type(context).__name__}.")
    return Preset(title=title, schema=schema, context=context)
