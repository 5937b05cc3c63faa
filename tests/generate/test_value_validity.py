"""Every value valid (issue 45): the one rule for open values that cannot be completed, and a property test of it.

A value is kept as written when complete and valid; a cut one is closed where it was cut, or else cut back to its
last complete item; otherwise it is the field's default, or else the smallest value its schema accepts
(:func:`~pcd_engine.schema.smallest.smallest_value`). The property test draws Pydantic models of the shapes that
came back invalid before (tuples of Literals, nested models, datetimes, UUIDs, dicts, unions, Optionals), decides
them on a tiny random model (whose values run into any limit) with random small token limits, and checks the
result validates as the user's own model.
"""

from __future__ import annotations

import datetime
import json
import uuid
from typing import Any, Literal

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, ValidationError, create_model

from pcd_engine import compile_schema
from pcd_engine.errors import SchemaError
from pcd_engine.generate.values import cut_backs
from pcd_engine.schema.constraints import is_valid
from pcd_engine.schema.smallest import smallest_value

TEXT = "Order 1182 arrived broken on 2024-03-05 at 10:00; ticket 6f1c. The customer wants a refund."


# ------------------------------------------------------------------------------------------------ the pieces


@pytest.mark.parametrize(
    ("schema", "expected"),
    [
        ({"type": "string", "format": "date-time"}, "1970-01-01T00:00:00Z"),
        ({"type": "string", "format": "uuid"}, "00000000-0000-0000-0000-000000000000"),
        ({"type": "string", "minLength": 3}, "aaa"),
        ({"type": ["integer", "null"]}, None),
        ({"type": "integer", "minimum": 3, "multipleOf": 2}, 4),
        ({"type": "integer", "exclusiveMaximum": -2}, -3),
        ({"type": "number", "minimum": 0.5}, 0.5),
        ({"anyOf": [{"type": "string"}, {"type": "null"}]}, None),
        ({"type": "array", "prefixItems": [{"enum": ["x", "y"]}, {"type": "integer"}], "minItems": 2}, ["x", 0]),
        ({"type": "array", "items": {"const": "a"}}, []),
        (
            {"type": "object", "properties": {"a": {"type": "boolean"}, "b": {"type": "string"}}, "required": ["a"]},
            {"a": False},
        ),  # fmt: skip
        ({"type": "object", "additionalProperties": {"type": "integer"}}, {}),
    ],
)
def test_the_smallest_value_of_a_schema(schema, expected):
    found, value = smallest_value(schema)
    assert found and value == expected and type(value) is type(expected)
    assert is_valid(schema, value)


def test_a_schema_whose_smallest_value_cannot_be_built_has_none():
    assert smallest_value({"type": "string", "pattern": "^[0-9]{3}$"}) == (False, None)
    assert smallest_value(False) == (False, None)


def test_date_times_and_times_are_checked_as_iso_8601():
    date_time, time = {"type": "string", "format": "date-time"}, {"type": "string", "format": "time"}
    assert is_valid(date_time, "2024-03-05T10:00:00Z") and is_valid(date_time, "2024-03-05T10:00:00.5+02:00")
    for cut in ("202", "2024-03", "2024-03-05", "2024-03-05T1"):  # what a cut value looked like
        assert not is_valid(date_time, cut)
    assert is_valid(time, "10:00:00Z") and not is_valid(time, "10:0")


def test_a_cut_text_is_cut_back_to_each_complete_item_longest_first():
    assert cut_backs('["a", "b", "c') == ['["a", "b"]', '["a"]', "[]"]
    nested = cut_backs('{"x": [1, 2], "y": {"z": "a,')  # the comma inside the string is not a boundary
    assert nested == ['{"x": [1, 2], "y": {}}', '{"x": [1, 2]}', '{"x": [1]}', '{"x": []}', "{}"]


class Leaf(BaseModel):
    v: int


class Mid(BaseModel):
    inner: Leaf


class Outer(BaseModel):
    inner: Mid


class Shapes(BaseModel):
    tags: tuple[Literal["a", "b"], ...]
    pair: tuple[Literal["x", "y"], int]
    when: datetime.datetime
    ident: uuid.UUID
    deep: Outer
    counts: dict[str, int]
    either: int | str
    note: str = "none given"


@pytest.mark.parametrize("limit", [1, 2, 3, 5, 8])
def test_every_shape_is_a_valid_value_at_any_token_limit(tiny_engine, limit):
    """The quoted defects: each of these came back None or invalid under a small limit, and ``result.model``
    raised pydantic's ValidationError. Now every field validates, and each value that was not written as it is
    says how it was made."""
    out = tiny_engine.extract(TEXT, Shapes, max_tokens=limit)
    Shapes.model_validate(out.values)
    assert out.model is not None
    for name, field in out.fields.items():
        if field.truncated:
            assert any(f"Field {name!r}: the value reached its limit of {limit} tokens" in w for w in out.warnings)


def test_a_field_with_a_default_holds_it_when_nothing_written_is_valid(tiny_engine):
    class Dated(BaseModel):
        when: datetime.datetime = datetime.datetime(2000, 1, 1)

    out = tiny_engine.extract(TEXT, Dated, max_tokens=2)
    assert out.values["when"] == "2000-01-01T00:00:00"
    assert any("could not be completed and is the field's default" in w for w in out.warnings)


def test_a_recursive_model_is_a_schema_error_naming_the_field():
    class Node(BaseModel):
        name: str
        children: list[Node] = []

    class Tree(BaseModel):
        root: Node

    with pytest.raises(SchemaError, match=r"Field 'children': expected a non-recursive schema, but 'Node' contains"):
        compile_schema(Node)
    with pytest.raises(SchemaError, match="expected a non-recursive schema"):
        compile_schema(Tree)


# ------------------------------------------------------------------------------------------------ property

LEAVES: list[Any] = [
    bool,
    int,
    str,
    float,
    datetime.datetime,
    datetime.date,
    uuid.UUID,
    Literal["a", "b"],
    int | None,
    int | str,
]


@st.composite
def annotations(draw: Any, depth: int = 0) -> Any:
    leaf = st.sampled_from(LEAVES)
    if depth >= 2:
        return draw(leaf)
    kind = draw(st.sampled_from(["leaf", "leaf", "list", "tuple", "pair", "dict", "model", "optional"]))
    if kind == "leaf":
        return draw(leaf)
    inner = draw(annotations(depth + 1))
    if kind == "list":
        return list[inner]
    if kind == "tuple":
        return tuple[inner, ...]
    if kind == "pair":
        return tuple[inner, draw(leaf)]
    if kind == "dict":
        return dict[str, inner]
    if kind == "optional":
        return inner | None
    return create_model(f"M{draw(st.integers(0, 999))}", x=(inner, ...), y=(draw(leaf), ...))


@settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(annotation=annotations(), limit=st.integers(1, 12), nullable=st.booleans())
def test_property_any_shape_at_any_limit_validates_as_the_user_s_model(tiny_engine, annotation, limit, nullable):
    model = create_model("Drawn", value=(annotation | None if nullable else annotation, ...), flag=(bool, ...))
    try:
        out = tiny_engine.extract(TEXT, model, max_tokens=limit)
    except SchemaError:  # a shape pcd refuses is refused before any work, with a typed error
        return
    try:
        model.model_validate(out.values)
    except ValidationError as exc:
        raise AssertionError(f"{json.dumps(out.values)} does not validate: {exc}\nwarnings: {out.warnings}") from None
    for field in out.fields.values():
        if field.source == "generated":
            assert compile_schema(model).field(field.name).allows(field.value)


def test_the_property_check_can_fail(tiny_engine, monkeypatch):
    """Without the last steps of the rule (no default, no smallest value) the same check finds invalid values."""
    import pcd_engine.generate.values as values

    monkeypatch.setattr(values, "smallest_value", lambda schema: (False, None))
    out = tiny_engine.extract(TEXT, Shapes, max_tokens=2)
    with pytest.raises(ValidationError):
        Shapes.model_validate(out.values)
