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

import difflib
from collections.abc import Mapping
from typing import Any

from pcd_engine.errors import SchemaError
from pcd_engine.schema.constraints import MAX_INT_LABELS
from pcd_engine.schema.fields import FieldSpec, Label, LabelValue, Preset, Schema, flag_key
from pcd_engine.schema.json_reader import from_json_schema
from pcd_engine.schema.presets import PRESET_FILE_KEYS, PRESET_TYPES, from_preset, is_preset_field, load_preset
from pcd_engine.schema.pydantic_reader import from_pydantic

__all__ = [
    "MAX_INT_LABELS",
    "FieldSpec",
    "Label",
    "LabelValue",
    "Preset",
    "Schema",
    "compile_schema",
    "flag_key",
    "load_preset",
]


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
        return from_pydantic(schema)
    if isinstance(schema, Mapping):
        if schema and all(is_preset_field(v) for v in schema.values()):
            return from_preset(schema, title="Preset", description=None)
        if "schema" in schema and set(schema) <= PRESET_FILE_KEYS:
            return load_preset(schema).schema
        if "properties" in schema or "$ref" in schema or schema.get("type") == "object":
            return from_json_schema(schema)
        if schema and all(isinstance(v, Mapping) for v in schema.values()):  # field -> options: a preset dict
            name, field = next((k, v) for k, v in schema.items() if not is_preset_field(v))
            given = field.get("type")
            close = difflib.get_close_matches(str(given), PRESET_TYPES, n=1) if given is not None else []
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise SchemaError(
                f"Field {str(name)!r}: expected a preset field whose 'type' is one of {list(PRESET_TYPES)}, but got "
                f"{'no type' if given is None else f'type {given!r}'}.{hint}"
            )
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
