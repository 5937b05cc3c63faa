"""Schemas from Pydantic, JSON Schema and presets; bad schemas fail before any model work, naming the field."""

from __future__ import annotations

import enum
import json
import re
from typing import Annotated, Literal, Optional

import pytest
from pydantic import BaseModel, Field, conint

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
    ("annotation", "message"),
    [
        (str, "expected a bool, Literal, Enum or bounded int type, but got str"),
        (Address, "expected a bool, Literal, Enum or bounded int type, but got Address"),
        (int, "expected an int with both bounds (ge/gt and le/lt), but it has no lower bound"),
        (Annotated[int, Field(ge=0)], "it has no upper bound"),
        (Annotated[int, Field(ge=0, le=1000)], "at most 256 values, but got 1001 (0..1000)"),
        (Annotated[int, Field(ge=5, le=1)], "expected a non-empty integer range, but got 5..1"),
        (Optional[str], "expected a bool, Literal, Enum or bounded int type, but got str"),  # noqa: UP045
        (Literal["a"] | Literal["b"] | None, "expected a bool, Literal, Enum, bounded int, or Optional of one"),
        (bool | Literal["a"], "Merge the choices into one Literal"),
    ],
)
def test_unsupported_pydantic_fields(annotation, message):
    model = type("M", (BaseModel,), {"__annotations__": {"good": bool, "bad": annotation}})
    with pytest.raises(SchemaError, match=re.escape("Field 'bad': ") + ".*" + re.escape(message)):
        compile_schema(model)


class Closed(BaseModel):
    """Optional fields and bounded integers are closed fields too."""

    maybe: Optional[Literal["x", "y"]]  # noqa: UP045
    flag: bool | None
    stars: Annotated[int, Field(ge=1, le=5)]
    level: conint(ge=0, lt=3)
    count: int = Field(gt=0, le=3)
    size: Optional[Annotated[int, Field(ge=1, le=2)]] = None  # noqa: UP045


def test_optional_and_bounded_int_fields():
    schema = compile_schema(Closed)
    assert [(f.name, f.kind, f.values) for f in schema.fields] == [
        ("maybe", "enum", ("x", "y", None)),
        ("flag", "enum", (True, False, None)),
        ("stars", "enum", (1, 2, 3, 4, 5)),
        ("level", "enum", (0, 1, 2)),
        ("count", "enum", (1, 2, 3)),
        ("size", "enum", (1, 2, None)),
    ]
    assert schema.field("maybe").labels[2].surfaces == ("null",)
    assert schema.field("stars").labels[0].surfaces == ("1", '"1"')
    # Pydantic's own JSON Schema of the model, and pcd's export, compile to the same fields.
    for exported in (Closed.model_json_schema(), schema.json_schema()):
        assert [(f.name, f.values) for f in compile_schema(exported).fields] == [
            (f.name, f.values) for f in schema.fields
        ]


@pytest.mark.parametrize(
    ("node", "values"),
    [
        ({"type": ["boolean", "null"]}, (True, False, None)),
        ({"anyOf": [{"enum": ["a", "b"]}, {"type": "null"}]}, ("a", "b", None)),
        ({"enum": ["a", None]}, ("a", None)),
        ({"type": "integer", "minimum": 1, "maximum": 3}, (1, 2, 3)),
        ({"type": "integer", "exclusiveMinimum": 0, "exclusiveMaximum": 3}, (1, 2)),
        ({"type": ["integer", "null"], "minimum": 0, "maximum": 1}, (0, 1, None)),
        ({"type": "null"}, (None,)),
    ],
)
def test_json_schema_nullable_and_integer_fields(node, values):
    schema = compile_schema({"type": "object", "properties": {"x": node}})
    assert schema.fields[0].values == values


def test_json_schema_unbounded_integer_is_a_typed_error():
    with pytest.raises(SchemaError, match="Field 'n': expected an int with both bounds"):
        compile_schema({"type": "object", "properties": {"n": {"type": "integer", "minimum": 0}}})
    with pytest.raises(SchemaError, match="Field 'n': expected every anyOf option"):
        compile_schema({"type": "object", "properties": {"n": {"anyOf": [{"type": "string"}, {"type": "null"}]}}})


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
            r"Field 'x': expected every allowed value to be a str, int, bool or null",
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
        ({"type": "object", "properties": {"n": {"type": "integer"}}}, r"Field 'n': expected an int with both bounds"),
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
