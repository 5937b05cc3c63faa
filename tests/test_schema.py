"""Schemas from Pydantic, JSON Schema and presets; bad schemas fail before any model work, naming the field."""

from __future__ import annotations

import enum
import json
from typing import Annotated, Literal, Optional

import pytest
from pydantic import BaseModel, Field

from pcd_engine import SchemaError, compile_schema, load_preset


class Color(str, enum.Enum):
    RED = "red"
    GREEN = "green"


class Level(enum.IntEnum):
    LOW = 1
    HIGH = 2


class Ticket(BaseModel):
    """A support ticket."""

    sentiment: Literal["POSITIVE", "NEUTRAL", "NEGATIVE"]
    wants_refund: bool = Field(description="Whether the customer asks for money back")
    color: Color
    level: Level
    stars: Literal[1, 2, 3]
    annotated: Annotated[Literal["a", "b"], Field(description="annotated")]


def test_pydantic_fields_labels_and_docs():
    schema = compile_schema(Ticket)
    assert [f.name for f in schema.fields] == ["sentiment", "wants_refund", "color", "level", "stars", "annotated"]
    assert schema.description == "A support ticket."
    assert schema.model is Ticket
    refund = schema.field("wants_refund")
    assert refund.kind == "boolean" and refund.values == (True, False)
    assert refund.labels[0].surfaces == ("true", '"true"')
    assert refund.description == "Whether the customer asks for money back"
    assert schema.field("color").values == ("red", "green")
    assert schema.field("level").values == (1, 2)
    assert schema.field("stars").labels[0].surfaces == ("1", '"1"')
    assert schema.field("annotated").description == "annotated"


def test_json_schema_from_pydantic_matches():
    from_json = compile_schema(Ticket.model_json_schema())
    from_model = compile_schema(Ticket)
    assert [(f.name, f.values) for f in from_json.fields] == [(f.name, f.values) for f in from_model.fields]
    assert from_json.field("wants_refund").description == "Whether the customer asks for money back"


def test_json_schema_forms():
    schema = compile_schema(
        {
            "title": "T",
            "type": "object",
            "$defs": {"Kind": {"enum": ["x", "y"]}},
            "properties": {
                "flag": {"type": "boolean"},
                "kind": {"$ref": "#/$defs/Kind", "description": "which kind"},
                "only": {"const": "fixed"},
                "any": {"anyOf": [{"const": "a"}, {"const": "b", "description": "bee"}]},
                "one": {"oneOf": [{"const": 1}, {"const": 2}]},
                "legacy": {"allOf": [{"$ref": "#/$defs/Kind"}]},
            },
        }
    )
    assert schema.title == "T"
    assert [f.values for f in schema.fields] == [(True, False), ("x", "y"), ("fixed",), ("a", "b"), (1, 2), ("x", "y")]
    assert schema.field("kind").description == "which kind"


def test_preset_dict_and_file(tmp_path):
    preset = {
        "topic": {"type": "enum", "choices": ["a", "b"], "description": "the topic"},
        "flag": {"type": "boolean", "depends_on": ["topic"]},
    }
    schema = compile_schema(preset)
    assert schema.field("flag").depends_on == ("topic",)
    path = tmp_path / "p.json"
    path.write_text(json.dumps({"title": "My preset", "schema": preset, "context": "some text"}))
    loaded = load_preset(path)
    assert loaded.title == "My preset" and loaded.context == "some text"
    assert loaded.schema.fingerprint == compile_schema({"title": "My preset", "schema": preset}).fingerprint


def test_awkward_field_names_and_labels():
    preset = {
        "schema": {"type": "enum", "choices": ["ü-ñ", 'say "hi"', "back\\slash", "日本"]},
        "properties": {"type": "boolean"},
        "type": {"type": "enum", "choices": [1, 10, 100]},
        "single": {"type": "enum", "choices": ["only"]},
    }
    schema = compile_schema(preset)
    assert [f.name for f in schema.fields] == ["schema", "properties", "type", "single"]
    assert schema.field("schema").labels[1].surfaces == ('"say \\"hi\\""',)


class Address(BaseModel):
    city: Literal["a", "b"]


@pytest.mark.parametrize(
    ("annotation", "received"),
    [(str, "got str"), (int, "got int"), (Address, "got Address"), (Optional[Literal["a"]], "Optional")],  # noqa: UP045
)
def test_unsupported_pydantic_fields(annotation, received):
    model = type("M", (BaseModel,), {"__annotations__": {"good": bool, "bad": annotation}})
    with pytest.raises(SchemaError, match=rf"Field 'bad': expected a bool, Literal or Enum type, but .*{received}"):
        compile_schema(model)


@pytest.mark.parametrize(
    ("preset", "match"),
    [
        ({"x": {"type": "enum", "choices": []}}, r"Field 'x': expected at least one allowed value, but got an empty"),
        (
            {"x": {"type": "enum", "choices": ["a", "a"]}},
            r"Field 'x': expected distinct allowed values, but got 'a' twice",
        ),
        ({"x": {"type": "enum", "choices": ["a", " a "]}}, r"differ only by surrounding whitespace"),
        (
            {"x": {"type": "enum", "choices": [1.5]}},
            r"Field 'x': expected every allowed value to be a str, int or bool",
        ),
        ({"x": {"type": "enum", "choices": "ab"}}, r"Field 'x': expected 'choices' to be a list"),
        (
            {"x": {"type": "enum", "choices": ["a"], "depends_on": ["y"]}},
            r"Field 'x': expected depends_on to name fields",
        ),
        ({"x": {"type": "boolean", "depends_on": ["x"]}}, r"names itself"),
        (
            {"x": {"type": "boolean", "depends_on": ["y"]}, "y": {"type": "boolean", "depends_on": ["x"]}},
            r"without cycles",
        ),
        ({"x": {"type": "enum", "choices": ["a"], "colour": 1}}, r"Field 'x': expected only the keys"),
    ],
)
def test_bad_presets(preset, match):
    with pytest.raises(SchemaError, match=match):
        compile_schema(preset)


@pytest.mark.parametrize(
    ("schema", "match"),
    [
        ({"type": "object", "properties": {"s": {"type": "string"}}}, r"Field 's': expected a boolean, enum, const"),
        ({"type": "object", "properties": {"n": {"type": "integer"}}}, r"Field 'n': .*but got 'integer'"),
        ({"type": "object", "properties": {"o": {"type": "object", "properties": {}}}}, r"Field 'o'"),
        ({"type": "object", "properties": {"r": {"$ref": "#/$defs/Nope"}}}, r"Field 'r': \$ref '#/\$defs/Nope'"),
        ({"type": "object", "properties": {}}, r"at least one entry in 'properties'"),
        ({"hello": 1}, r"expected a JSON Schema with 'properties'"),
        (42, r"but got int"),
        (dict, r"expected a Pydantic v2 model class"),
    ],
)
def test_bad_schemas(schema, match):
    with pytest.raises(SchemaError, match=match):
        compile_schema(schema)


def test_bad_preset_file(tmp_path):
    with pytest.raises(SchemaError, match="does not exist"):
        load_preset(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(SchemaError, match="expected valid JSON"):
        load_preset(bad)
