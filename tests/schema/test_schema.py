"""Schemas from Pydantic, JSON Schema and presets; bad schemas fail before any model work, naming the field."""

from __future__ import annotations

import enum
import json
import re
from typing import Annotated, Any, Literal, Optional

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


class Node(BaseModel):
    name: str
    children: list[Node]


class Pair(BaseModel):
    left: Other


class Other(BaseModel):
    back: list[Pair]


@pytest.mark.parametrize(
    ("annotation", "message"),
    [
        (Any, "expected a constrained type, but got an unconstrained value (Any)"),
        (dict[str, Any], "takes any keys with any values (dict[str, Any])"),
        (dict, "takes any keys with any values (dict[str, Any])"),
        (list, "expected a constrained type at [], but got an unconstrained value (Any)"),
        (list[Any], "expected a constrained type at [], but got an unconstrained value (Any)"),
        (Node, "expected a non-recursive schema, but 'Node' contains itself"),
        (Pair, "expected a non-recursive schema, but 'Pair' contains itself"),
        (Optional[Node], "expected a non-recursive schema"),  # noqa: UP045
        (Annotated[int, Field(ge=5, le=1)], "expected a non-empty integer range, but got 5..1"),
        (Annotated[list[Literal["a", "b"]], Field(min_length=3)], "min_items <= 2 (the number of values)"),
    ],
)
def test_unsupported_pydantic_fields(annotation, message):
    model = type("M", (BaseModel,), {"__annotations__": {"good": bool, "bad": annotation}})
    with pytest.raises(SchemaError, match=re.escape("Field 'bad': ") + ".*" + re.escape(message)):
        compile_schema(model)


class Mixed(BaseModel):
    """Closed, multi-label and open fields side by side."""

    pick: Literal["a"] | Literal["b"] | None
    either: bool | Literal["maybe"]
    tags: list[Literal["x", "y", "z"]] = Field(min_length=1, max_length=2)
    colours: set[Color]
    summary: str = Field(max_length=40, description="One line")
    code: Annotated[str, Field(pattern=r"^[A-Z]{3}$")]
    count: int
    wide: Annotated[int, Field(ge=0, le=1000)]
    price: float | None
    address: Address
    addresses: list[Address]
    scores: dict[str, int]
    note: Optional[str] = Field(default=None, json_schema_extra={"x-max-tokens": 12})  # noqa: UP045


def test_multi_and_open_fields():
    schema = compile_schema(Mixed)
    kinds = {f.name: f.kind for f in schema.fields}
    assert kinds == {
        "pick": "enum",
        "either": "enum",
        "tags": "multi",
        "colours": "multi",
        "summary": "open",
        "code": "open",
        "count": "open",
        "wide": "open",
        "price": "open",
        "address": "open",
        "addresses": "open",
        "scores": "open",
        "note": "open",
    }
    assert schema.field("pick").values == ("a", "b", None)
    assert schema.field("either").values == (True, False, "maybe")
    tags = schema.field("tags")
    assert (tags.values, tags.min_items, tags.max_items) == (("x", "y", "z"), 1, 2)
    assert schema.field("colours").values == ("red", "green")
    assert schema.field("summary").value_schema == {"type": "string", "maxLength": 40}
    assert schema.field("summary").description == "One line"
    assert schema.field("code").value_schema == {"type": "string", "pattern": "^[A-Z]{3}$"}
    assert schema.field("wide").value_schema == {"type": "integer", "minimum": 0, "maximum": 1000}
    address = schema.field("address").value_schema
    assert address["properties"]["city"]["enum"] == ["a", "b"] and "$ref" not in json.dumps(address)
    assert schema.field("scores").value_schema == {"type": "object", "additionalProperties": {"type": "integer"}}
    assert schema.field("note").max_tokens == 12 and "x-max-tokens" not in schema.field("note").schema_json
    assert [f.scored for f in schema.fields].count(False) == 9
    # Pydantic's own JSON Schema and pcd's export compile to the same fields.
    for exported in (Mixed.model_json_schema(), schema.json_schema()):
        again = compile_schema(exported)
        assert [(f.name, f.kind, f.values, f.min_items, f.max_items) for f in again.fields] == [
            (f.name, f.kind, f.values, f.min_items, f.max_items) for f in schema.fields
        ]
        assert [f.value_schema for f in again.fields if not f.scored] == [
            f.value_schema for f in schema.fields if not f.scored
        ]


def test_open_value_schema_keeps_the_key_order():
    class Person(BaseModel):
        zeta: str
        alpha: int
        mid: bool

    class Holder(BaseModel):
        person: Person

    schema = compile_schema(Holder)
    assert list(schema.field("person").value_schema["properties"]) == ["zeta", "alpha", "mid"]


def test_allows_checks_every_kind():
    schema = compile_schema(Mixed)
    tags, summary, address = schema.field("tags"), schema.field("summary"), schema.field("address")
    assert tags.allows(["x"]) and tags.allows(["x", "z"])
    assert not tags.allows([]) and not tags.allows(["x", "y", "z"]) and not tags.allows(["x", "x"])
    assert not tags.allows(["w"]) and not tags.allows("x")
    assert summary.allows("short") and not summary.allows("x" * 41) and not summary.allows(3)
    assert address.allows({"city": "a"}) and not address.allows({"city": "c"}) and not address.allows({})


def test_open_field_dependencies_are_typed_errors():
    with pytest.raises(SchemaError, match=r"Field 'b': expected depends_on to name closed fields, but 'a' is gen"):
        compile_schema({"properties": {"a": {"type": "string"}, "b": {"type": "boolean", "x-depends-on": ["a"]}}})


def test_presets_take_multi_and_string_fields():
    schema = compile_schema(
        {
            "tags": {"type": "multi", "choices": ["a", "b"], "max_items": 1},
            "summary": {"type": "string", "max_length": 30, "max_tokens": 16},
        }
    )
    assert schema.field("tags").kind == "multi" and schema.field("tags").max_items == 1
    assert schema.field("summary").value_schema == {"type": "string", "maxLength": 30}
    assert schema.field("summary").max_tokens == 16
    with pytest.raises(SchemaError, match=r"Field 's': expected only the keys .* for type 'string'"):
        compile_schema({"s": {"type": "string", "choices": ["a"]}})


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


@pytest.mark.parametrize(
    ("node", "kind"),
    [
        ({"type": "integer", "minimum": 0}, "open"),
        ({"anyOf": [{"type": "string"}, {"type": "null"}]}, "open"),
        ({"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 1}, "multi"),
        ({"type": "array", "items": {"type": "string"}}, "open"),
        ({"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]}, "open"),
    ],
)
def test_json_schema_open_and_multi_fields(node, kind):
    assert compile_schema({"type": "object", "properties": {"n": node}}).fields[0].kind == kind


@pytest.mark.parametrize(
    ("preset", "match"),
    [
        ({"x": {"type": "enum", "choices": []}}, r"Field 'x': expected at least one allowed value, but got an empty"),
        (
            {"x": {"type": "enum", "choices": ["a", "a"]}},
            r"Field 'x': expected distinct allowed values, but got 'a' twice",
        ),
        ({"x": {"type": "enum", "choices": ["a", " a "]}}, r"differ only by .*surrounding whitespace"),
        ({"x": {"type": "enum", "choices": ["Refund", "refund"]}}, r"'Refund' and 'refund', which differ only by case"),
        ({"x": {"type": "enum", "choices": ["ok", "o\u200bk"]}}, r"differ only by .*invisible characters"),
        ({"x": {"type": "multi", "choices": ["\uff21", "A"]}}, r"differ only by case, width"),  # full-width A
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
        ({"type": "object", "properties": {"s": {}}}, r"Field 's': expected a constrained type"),
        (
            {"type": "object", "properties": {"o": {"type": "object", "properties": {}}}},
            r"Field 'o': .*dict\[str, Any\]",
        ),
        ({"type": "object", "properties": {"l": {"type": "array"}}}, r"Field 'l': expected a list of a known type"),
        (
            {
                "type": "object",
                "properties": {"r": {"$ref": "#/$defs/R"}},
                "$defs": {"R": {"type": "object", "properties": {"r": {"$ref": "#/$defs/R"}}}},
            },
            r"Field 'r': expected a non-recursive schema",
        ),
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


def test_field_bounds_on_an_optional_int_keep_it_closed():
    class Rated(BaseModel):
        stars: Optional[int] = Field(default=None, ge=1, le=3)  # noqa: UP045

    assert compile_schema(Rated).field("stars").values == (1, 2, 3, None)


def test_multi_label_flags_use_one_key_for_every_label_type():
    """The flags a question asks, the flags written into the prompt and the flags read back name labels alike."""
    from pcd_engine.decide.compiler import questions, written_value

    spec = compile_schema({"m": {"type": "multi", "choices": ["a b", 7, True, None]}}).field("m")
    asked = [json.loads(q.labels[0].surfaces[0]) for q in questions(spec)]
    written = json.loads(written_value(spec, [7, None]))
    assert [next(iter(a)) for a in asked] == list(written) == ["a b", "7", "true", "null"]
    assert written == {"a b": False, "7": True, "true": False, "null": True}
    assert spec.read(written) == [7, None]


def test_grade_an_answer_against_the_schema():
    schema = compile_schema(
        {
            "mood": {"type": "enum", "choices": ["happy", "sad"]},
            "urgent": {"type": "boolean"},
            "note": {"type": "string"},
        }
    )
    ok = schema.grade({"mood": "sad", "urgent": True, "note": "x"})
    assert ok.valid and ok.errors({}) == []
    answer = {"mood": "angry", "note": "x", "extra": 1}
    bad = schema.grade(answer)
    assert dict(bad.status) == {"mood": "invalid", "urgent": "missing", "note": "ok"}
    assert bad.extra == ("extra",) and not bad.valid
    assert bad.having("missing") == ["urgent"]
    assert bad.errors(answer) == ["invalid value for 'mood': 'angry'", "missing key 'urgent'", "extra key 'extra'"]


def test_messages_name_the_thing_refused(tiny_engine):
    """Issue 45: a pattern the generator cannot compile, number bounds it cannot write, a discriminated union and a
    preset type typo each get a message naming the thing (before: a reason cut mid-word, a grammar parse failure,
    an unknown 'mapping' keyword, a dict's keys)."""
    text = "Order ABC123 for 0.7 euros, a cat."
    look = {"properties": {"code": {"type": "string", "pattern": "^(?=.*[0-9])[A-Z]{3}$"}}}
    before = tiny_engine.backend.forward_passes
    with pytest.raises(SchemaError, match=r"cannot compile the pattern '\^\(\?=\.\*\[0-9\]\)\[A-Z\]\{3\}\$': look-ar"):
        tiny_engine.extract(text, look)
    tiny = {"properties": {"amount": {"type": "number", "minimum": 1e-320}}}
    with pytest.raises(SchemaError, match=r"cannot write the number bounds \(minimum 1e-320\) as a pattern"):
        tiny_engine.extract(text, tiny)
    assert tiny_engine.backend.forward_passes == before

    class Cat(BaseModel):
        kind: Literal["cat"]
        meow: bool

    class Dog(BaseModel):
        kind: Literal["dog"]
        bark: bool

    class Pet(BaseModel):
        pet: Annotated[Cat | Dog, Field(discriminator="kind")]

    out = tiny_engine.extract(text, Pet, max_tokens=24)
    assert Pet.model_validate(out.values).pet.kind in ("cat", "dog")
    with pytest.raises(SchemaError, match=r"Field 'x': .* but got type 'enmu'\. Did you mean 'enum'\?"):
        compile_schema({"x": {"type": "enmu", "choices": ["a"]}, "y": {"type": "boolean"}})
