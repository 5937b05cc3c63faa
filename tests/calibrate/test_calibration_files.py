"""A calibration file is untrusted input (issue 45): every number, label and field it holds is checked where it is
read and against the schema it is used with, so a tampered or damaged file is a typed error naming the thing, before
any model work, and never a silent change of probabilities. A fuzz test mutates a real file every way JSON allows."""

from __future__ import annotations

import copy
import json
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pcd_engine import Engine, compile_schema
from pcd_engine.calibrate.calibrator import Calibrator, FieldPrior
from pcd_engine.errors import InputError, OptionError, PCDError
from pcd_engine.options import ExtractOptions
from tests.support import OracleBackend, OracleLM, json_mutations

TEXT = "Order 1182 arrived broken; the customer wants their money back today."
SCHEMA = {
    "urgent": {"type": "boolean"},
    "deadline": {"type": "enum", "choices": ["1_HOUR", "12_HOURS", "1_WEEK", "NONE"]},
    "tags": {"type": "multi", "choices": ["billing", "shipping", "broken"]},
}


@pytest.fixture(scope="module")
def engine(smol_tokenizer):
    return Engine(OracleBackend(smol_tokenizer, OracleLM(len(smol_tokenizer))), anchor=False, correction="none")


@pytest.fixture(scope="module")
def good(engine) -> dict:
    rows = {"urgent": [[0.9, 0.1]], "deadline": [[0.55, 0.05, 0.1, 0.3]], "tags": [[0.9, 0.2, 0.5]]}
    return Calibrator.from_distributions(compile_schema(SCHEMA), rows, model=engine.model_id).to_json()


def edited(data: dict, field: int, key: str, value) -> dict:
    out = copy.deepcopy(data)
    out["fields"][field][key] = value
    return out


@pytest.mark.parametrize(
    ("field", "key", "value", "needle"),
    [
        (1, "bias", [math.nan, 0.3, 0.3, 0.4], r"each bias value in \(0, 1\], but got nan"),
        (1, "bias", [-0.2, 0.4, 0.4, 0.4], "but got -0.2"),
        (1, "bias", [0.0, 0.3, 0.3, 0.4], "but got 0.0"),
        (1, "prior", [math.inf, 0.3, 0.3, 0.4], "each prior value in .* but got inf"),
        (1, "bias", [10**400, 0.3, 0.3, 0.4], r"but got 1000000"),  # too large for a float: not an OverflowError
        (1, "bias", ["0.25", 0.25, 0.25, 0.25], "but got '0.25'"),
        (0, "bias", [True, 0.5], "but got True"),
        (1, "bias", [0.5, 0.5], r"expected 4 bias values, one per label"),
        (1, "labels", [["1_HOUR"], "12_HOURS", "1_WEEK", "NONE"], "expected a list of labels"),
        (1, "labels", "1_HOUR", "expected a list of labels"),
        (1, "labels", ["NONE", "NONE", "1_WEEK", "12_HOURS"], "expected distinct labels"),
        (1, "name", 7, "name: expected a non-empty string"),
    ],
)
def test_a_bad_number_or_label_in_the_file_is_an_input_error_naming_it(good, tmp_path, field, key, value, needle):
    path = tmp_path / "cal.json"
    path.write_text(json.dumps(edited(good, field, key, value)))  # NaN and Infinity as Python's json writes them
    with pytest.raises(InputError, match=needle) as caught:
        Calibrator.load(path)
    assert str(path) in str(caught.value)
    with pytest.raises(OptionError, match=needle):  # given as the option's JSON (the server's and adapters' way)
        ExtractOptions(calibration=edited(good, field, key, value))
    with pytest.raises(OptionError, match=needle):
        FieldPrior(**{"name": "deadline", "labels": good["fields"][1]["labels"], "bias": good["fields"][1]["bias"],
                      "prior": good["fields"][1]["prior"], key: value})  # fmt: skip


def test_a_file_that_does_not_fit_the_schema_is_refused_before_any_model_work(engine, good):
    renamed = edited(good, 1, "labels", ["1_HOUR", "12_HOURS", "1_WEEK", "never"])
    retyped = edited(good, 0, "labels", [1, 0])  # true/false written as numbers
    unknown = copy.deepcopy(good)
    unknown["fields"][1]["name"] = "deadlines"
    unsummed = edited(good, 1, "bias", [0.5, 0.5, 0.5, 0.5])
    multi_certain = edited(good, 2, "bias", [1.0, 0.2, 0.5])
    cases = [
        (renamed, r"'deadline': expected the schema's labels \['1_HOUR', '12_HOURS', '1_WEEK', 'NONE'\], but got"),
        (retyped, r"'urgent': expected the schema's labels \[True, False\], but got \[1, 0\]"),
        (unknown, r"expected a field of .*, but got 'deadlines'"),
        (unsummed, "expected bias values summing to 1, but they sum to 2.0"),
        (multi_certain, "expected each bias value of a multi-label field below 1"),
    ]
    before = engine.backend.forward_passes
    for data, needle in cases:
        with pytest.raises(OptionError, match=needle):
            engine.extract(TEXT, SCHEMA, calibration=data)
    assert engine.backend.forward_passes == before
    twice = copy.deepcopy(good)
    twice["fields"].append(twice["fields"][0])
    with pytest.raises(InputError, match="expected each field once"):
        Calibrator.from_json(twice)


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("[" * 100_000, "expected a JSON file"),  # nested too deep for the parser
        ('{"x": ' + "9" * 5000 + "}", "expected a JSON file"),  # an integer with more digits than Python reads
        (b"\xff\xfe{}", "expected a JSON file"),
        ("[1, 2]", "expected a pcd calibration .* but got format 'list'"),
        ('{"format": "pcd-calibration/1"}', "it has no 'schema' entry"),
        (
            json.dumps(
                {
                    "format": "pcd-calibration/1",
                    "fields": 3,
                    "schema": {"fingerprint": "f", "title": "t"},
                    "model": "m",
                    "method": "mean",
                    "documents": 1,
                }
            ),
            "malformed .*not iterable",
        ),  # fmt: skip
    ],
)
def test_an_unreadable_file_is_an_input_error(tmp_path, text, needle):
    path = tmp_path / "cal.json"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(InputError, match=needle):
        Calibrator.load(path)


def test_a_fit_never_writes_a_lean_its_own_file_refuses(engine):
    rows = {"deadline": [[1.0, 0.0, 0.0, 0.0]], "tags": [[1.0, 0.0, 0.5]]}  # labels that never got any probability
    cal = Calibrator.from_distributions(compile_schema(SCHEMA), rows, model=engine.model_id, method="em")
    assert all(0 < b <= 1 for f in cal.fields for b in f.bias)
    assert all(b < 1 for b in cal.field("tags").bias)
    assert Calibrator.from_json(json.loads(json.dumps(cal.to_json()))) == cal
    engine.extract(TEXT, SCHEMA, calibration=cal)  # fits its schema


# ------------------------------------------------------------------------------------------------ fuzz


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_fuzz_a_mutated_file_is_a_typed_error_or_a_calibration_that_fits(engine, good, data):
    mutated = data.draw(json_mutations(good))
    try:
        cal = Calibrator.from_json(mutated)
    except InputError:
        return
    # what loaded is a calibration whose every number can be divided by; used, it fits the schema or is refused
    for f in cal.fields:
        assert all(0 < v <= 1 and math.isfinite(v) for v in (*f.bias, *f.prior))
        assert len(f.bias) == len(f.prior) == len(f.labels)
    try:
        cal.check(compile_schema(SCHEMA), engine.model_id)
    except OptionError:
        return
    out = engine.extract(TEXT, SCHEMA, calibration=cal)
    assert set(out.values) == set(SCHEMA)
    for name, result in out.fields.items():
        assert all(math.isfinite(p) for p in (result.label_distribution or ()))
        assert result.value is not None or name == "tags"


@settings(max_examples=200, deadline=None)
@given(blob=st.binary(max_size=64) | st.text(max_size=64).map(str.encode))
def test_fuzz_any_bytes_load_as_a_calibration_or_an_input_error(tmp_path_factory, blob):
    path = tmp_path_factory.mktemp("fuzz") / "cal.json"
    path.write_bytes(blob)
    with pytest.raises(PCDError):
        Calibrator.load(path)
