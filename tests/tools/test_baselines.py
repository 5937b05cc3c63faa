"""The outlines baseline, the JSON Schema a schema exports for it, the result's JSON form, and the validity check
both baselines share."""

from __future__ import annotations

import json
import sys
from typing import Literal

import jsonschema
import pytest
from pydantic import BaseModel, Field

from pcd_engine import BackendUnavailableError, compile_schema
from pcd_engine.tools.baseline import _check, generate_outlines
from pcd_engine.tools.examples import EXAMPLE_PRESETS, example_preset


class Ticket(BaseModel):
    """A support ticket."""

    sentiment: Literal["POSITIVE", "NEUTRAL", "NEGATIVE"]
    wants_refund: bool = Field(description="Whether the customer asks for money back")
    level: Literal[1, 2, 3]


TEXT = "I was charged twice for order 5521. Refund the second charge today or I go to my bank."


@pytest.mark.parametrize("name", EXAMPLE_PRESETS)
def test_json_schema_round_trips(name):
    schema = example_preset(name).schema
    exported = schema.json_schema()
    jsonschema.Draft202012Validator.check_schema(exported)
    again = compile_schema(exported)
    assert [(f.name, f.kind, f.values, f.description) for f in again.fields] == [
        (f.name, f.kind, f.values, f.description) for f in schema.fields
    ]
    assert exported["required"] == [f.name for f in schema.fields] and exported["additionalProperties"] is False


def test_json_schema_accepts_exactly_the_allowed_objects():
    exported = compile_schema(Ticket).json_schema()
    validator = jsonschema.Draft202012Validator(exported)
    assert validator.is_valid({"sentiment": "NEUTRAL", "wants_refund": False, "level": 2})
    for bad in (
        {"sentiment": "NEUTRAL", "wants_refund": False},
        {"sentiment": "neutral", "wants_refund": False, "level": 2},
        {"sentiment": "NEUTRAL", "wants_refund": "false", "level": 2},
        {"sentiment": "NEUTRAL", "wants_refund": False, "level": 2, "extra": 1},
    ):
        assert not validator.is_valid(bad)


def test_validity_check_names_each_problem():
    schema = compile_schema(Ticket)
    values, errors = _check(schema, '{"sentiment": "NEUTRAL", "wants_refund": false, "level": 2}')
    assert values == {"sentiment": "NEUTRAL", "wants_refund": False, "level": 2} and errors == []
    _, errors = _check(schema, '{"sentiment": "MEH", "wants_refund": 1, "bonus": true}')
    assert errors == [
        "invalid value for 'sentiment': 'MEH'",
        "invalid value for 'wants_refund': 1",
        "missing key 'level'",
        "extra key 'bonus'",
    ]
    values, errors = _check(schema, '{"sentiment": "NEU')
    assert values is None and errors[0].startswith("parse error")
    _, errors = _check(schema, "[1]")
    assert errors == ["expected a JSON object, but got list"]


@pytest.mark.real_model
def test_outlines_writes_a_valid_object_on_the_real_model(default_engine):
    first = generate_outlines(default_engine, TEXT, Ticket)
    assert first.valid, first.errors
    assert first.text.startswith("{")
    Ticket.model_validate(first.values)
    assert first.tokens == first.forward_passes > 5
    assert first.setup_ms > 0
    again = generate_outlines(default_engine, TEXT, Ticket)
    assert again.setup_ms == 0.0  # the compiled index is cached per engine and schema
    assert again.values == first.values  # greedy
    # The prompt is pcd's, minus the "{" the grammar writes itself.
    assert json.loads(first.text) == first.values


@pytest.mark.real_model
def test_outlines_cut_by_the_token_limit_is_invalid(default_engine):
    out = generate_outlines(default_engine, TEXT, Ticket, max_new_tokens=6)
    assert out.tokens == 6 and not out.valid and out.errors[0].startswith("parse error")


def test_outlines_needs_the_package_and_the_torch_backend(default_engine, monkeypatch):
    class FakeMLX:
        name = "mlx"

    class Engine:
        backend = FakeMLX()

    with pytest.raises(BackendUnavailableError, match="torch backend"):
        generate_outlines(Engine(), TEXT, Ticket)
    monkeypatch.setitem(sys.modules, "outlines", None)
    with pytest.raises(BackendUnavailableError, match=r"pip install \"pcd-llm\[bench\]\""):
        generate_outlines(default_engine, TEXT, Ticket)


@pytest.mark.real_model
def test_result_to_json(default_engine):
    out = default_engine.extract(TEXT, Ticket)
    data = json.loads(json.dumps(out.to_json()))
    assert data["values"] == out.values
    assert list(data["fields"]) == list(out.fields)
    for name, f in out.fields.items():
        d = data["fields"][name]
        assert (d["value"], d["probability"], d["method"], d["wave"]) == (f.value, f.probability, f.method, f.wave)
        assert d["alternatives"] == [[a.value, a.probability] for a in f.alternatives]
    assert data["stats"]["forward_passes"] == out.stats.forward_passes
    assert data["warnings"] == list(out.warnings)


def test_partial_pairs_reads_what_a_broken_answer_wrote():
    from pcd_engine.tools.baseline import partial_pairs

    assert partial_pairs('{"a": 1, "b": "hel') == {"a": 1}  # a string cut in the middle is not an answer
    assert partial_pairs('{"a": 1, "b": {"c": 2}, "d": tru') == {"a": 1, "b": {"c": 2}}
    assert partial_pairs('{"a": true} and then more text') == {"a": True}
    assert partial_pairs('{"tags": ["x", "y", "z') == {"tags": ["x", "y"]}
    assert partial_pairs("no object here") == {} and partial_pairs("[1, 2]") == {}


def test_bench_fails_on_a_preset_that_cannot_run_before_timing_anything(smol_tokenizer):
    from pcd_engine import Engine
    from pcd_engine.errors import ContextError
    from pcd_engine.tools.bench import bench_presets
    from pcd_engine.tools.examples import example_preset
    from tests.support import OracleBackend, OracleLM

    engine = Engine(OracleBackend(smol_tokenizer, OracleLM(len(smol_tokenizer)), max_context=2000))
    steps: list[str] = []
    presets = [("support_triage", example_preset("support_triage")), ("customs_255", example_preset("customs_255"))]
    with pytest.raises(ContextError, match="window"):
        bench_presets(engine, presets, against=("ar",), repeats=1, progress=steps.append)
    assert steps == []  # nothing was timed
