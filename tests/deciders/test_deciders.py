"""Deciders (pcd_engine.deciders): one object per call decides the closed fields, and nothing else chooses.

What the options resolve to (a head over a calibration over a correction), what each decider asks of a call (read
whole, features, a lean per request or per batch) and reports, and two static tests that hold the rest of the house
to it: no module outside the deciders tests which of head, calibration or correction a call carries, and none writes
or compares a decider's source name.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from pcd_engine import ExtractOptions, compile_schema
from pcd_engine.calibrate.calibrator import Calibrator
from pcd_engine.decide.decoding import Decision
from pcd_engine.deciders import Decider, Lean, Reading, decider_for
from pcd_engine.deciders.base import own_distribution
from pcd_engine.deciders.corrections import CORRECTIONS, Auto, Batch, ContentFree, NoCorrection, lean_favours_others
from pcd_engine.deciders.fitted import Calibrated, Headed
from pcd_engine.errors import OptionError

ROOT = Path(__file__).resolve().parents[2]
OWNERS = (ROOT / "pcd_engine" / "deciders",)
RESOLVER = ROOT / "pcd_engine" / "options" / "extract.py"  # resolves the one decider from the three options
SCHEMA = {
    "tone": {"type": "enum", "choices": ["calm", "angry", "sad"]},
    "tags": {"type": "multi", "choices": ["a", "b"]},
    "only": {"type": "enum", "choices": ["x"]},
}


def sources() -> set[str]:
    """Every name a decider reports as a field's ``correction``."""
    found = {c.source for c in CORRECTIONS.values()} | {Calibrated.source, Headed.source}
    return {s for s in found if s is not None}


DECIDER_CLASSES = {"Decider", "Correction", "NoCorrection", "Auto", "ContentFree", "Batch", "Calibrated", "Headed"}
CARRIERS = ("call", "options", "given", "keyed", "extract_options", "engine.options")  # objects holding the options
FITTED = {"calibration", "head", "correction", "corrector"}


def sources_outside_owners() -> list[Path]:
    paths = [*(ROOT / "pcd_engine").rglob("*.py"), *(ROOT / "pcd_integrations").rglob("*.py")]
    return sorted(p for p in paths if not any(p.is_relative_to(o) for o in OWNERS))


def branches_of(tree: ast.AST) -> list[ast.expr]:
    """Every expression ``tree`` branches on or compares: comparisons, conditions, boolean operands, ``not``."""
    out: list[ast.expr] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            out.append(node)
        elif isinstance(node, (ast.If, ast.IfExp, ast.While, ast.Assert)):
            out.append(node.test)
        elif isinstance(node, ast.BoolOp):
            out.extend(node.values)
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            out.append(node.operand)
        elif isinstance(node, ast.comprehension):
            out.extend(node.ifs)
    return out


def which_is_set(source: str, tree: ast.AST) -> list[str]:
    """Where ``tree`` tests a call's ``calibration``, ``head``, ``correction`` (or their decider) through the
    options object that carries them."""
    found = []
    for test in branches_of(tree):
        for node in ast.walk(test):
            if isinstance(node, ast.Attribute) and node.attr in FITTED:
                owner = ast.get_source_segment(source, node.value) or ""
                if owner.endswith(CARRIERS):
                    found.append(f"{node.lineno}: {ast.get_source_segment(source, test)}")
    return sorted(set(found))


def source_names(source: str, tree: ast.AST) -> list[str]:
    """Where ``tree`` compares with a decider's source name (one side of a comparison) or branches on a decider
    class's ``name`` or ``source``, or writes a source name as a result's ``correction`` or ``method``, a lean's
    ``source`` or a reading's ``by``. An option's key that shares a source's name (``raw.get("head")``) is not
    one."""
    names = sources()
    found = []

    def literal(node: ast.AST) -> bool:
        return isinstance(node, ast.Constant) and node.value in names

    compared = [side for n in ast.walk(tree) if isinstance(n, ast.Compare) for side in (n.left, *n.comparators)]
    for node in compared:
        if literal(node) or (isinstance(node, (ast.Tuple, ast.List, ast.Set)) and any(literal(e) for e in node.elts)):
            found.append(f"{node.lineno}: {ast.get_source_segment(source, node)}")
    for test in branches_of(tree):
        for node in ast.walk(test):
            decider_attr = (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id in DECIDER_CLASSES
                and node.attr in {"name", "source"}
            )
            if decider_attr:
                found.append(f"{node.lineno}: {ast.get_source_segment(source, test)}")
    for node in ast.walk(tree):
        if isinstance(node, ast.keyword) and node.arg in {"correction", "method", "source", "by"}:
            if any(literal(n) for n in ast.walk(node.value)):
                found.append(f"{node.lineno}: {ast.get_source_segment(source, node)}")
        elif isinstance(node, ast.Call) and getattr(node.func, "id", None) in {"Lean", "Reading"}:
            if any(literal(a) for a in node.args):
                found.append(f"{node.lineno}: {ast.get_source_segment(source, node)}")
    return sorted(set(found))


def scan(check) -> list[str]:
    found = []
    for path in sources_outside_owners():
        source = path.read_text(encoding="utf-8")
        if check is which_is_set and path == RESOLVER:
            continue
        found += [f"{path.relative_to(ROOT)}:{hit}" for hit in check(source, ast.parse(source))]
    return found


def test_no_module_but_the_deciders_tests_which_decider_a_call_carries():
    assert scan(which_is_set) == []


def test_no_module_but_the_deciders_writes_or_compares_a_source_name():
    assert scan(source_names) == []


@pytest.mark.parametrize(
    "code",
    [
        "if call.head is not None:\n    pass",
        "x = 1 if self.call.calibration is None else 2",
        "ok = request.call.corrector.estimates_on_batch and call.calibration is None",
        "y = [s for s in specs if not options.head]",
        "z = extract_options.get('c') or engine.options.correction",
    ],
)
def test_the_carried_decider_check_can_fail(code):
    assert which_is_set(code, ast.parse(code))


@pytest.mark.parametrize(
    "code",
    [
        "how = 'batch' if leans is not None else None\nif how == 'batch':\n    pass",
        "r = FieldResult(method='head' if h else m, correction='head')",
        "lean = Lean('calibration', cal)",
        "same = evidence.correction != ContentFree.name",
        "ok = f.correction in ('content_free', 'batch')",
    ],
)
def test_the_source_name_check_can_fail(code):
    assert source_names(code, ast.parse(code))


def test_the_options_resolve_one_decider_a_head_over_a_calibration_over_a_correction():
    schema = compile_schema(SCHEMA)
    cal = Calibrator.from_distributions(schema, {"tone": [[0.5, 0.3, 0.2]] * 3}, model="m", method="mean")
    assert decider_for(correction=None, calibration=None, head=None) is CORRECTIONS["none"]
    assert decider_for(correction="batch", calibration=None, head=None) is CORRECTIONS["batch"]
    calibrated = decider_for(correction="batch", calibration=cal, head=None)
    assert isinstance(calibrated, Calibrated) and calibrated.calibrator is cal and calibrated.reads_whole
    assert not calibrated.estimates_on_batch  # a calibration wins over the batch's lean
    options = ExtractOptions(correction="auto")
    assert options.decider is CORRECTIONS["auto"] and options.decider is options.decider  # resolved once
    with pytest.raises(OptionError, match="correction: expected one of"):
        decider_for(correction="bogus", calibration=None, head=None)


def test_what_each_decider_asks_of_a_call():
    rows = {
        "none": (False, False, False, None),
        "auto": (False, False, False, "content_free"),
        "content_free": (True, False, False, "content_free"),
        "batch": (True, True, False, "batch"),
    }
    for name, (whole, on_batch, features, source) in rows.items():
        d = CORRECTIONS[name]
        assert (d.reads_whole, d.estimates_on_batch, d.reads_features, d.source) == (whole, on_batch, features, source)
    headed = Headed(object(), CORRECTIONS["batch"])  # type: ignore[arg-type]
    assert headed.reads_whole and headed.reads_features and headed.estimates_on_batch
    assert headed.small_batch_warning(3) == CORRECTIONS["batch"].small_batch_warning(3) is not None
    assert not Headed(object(), NoCorrection()).estimates_on_batch  # type: ignore[arg-type]
    assert headed.name == "head over batch"


def decided(probabilities, method="exact", bounded=0):
    return Decision(label=max(range(len(probabilities)), key=lambda i: probabilities[i]),
                    probabilities=tuple(probabilities), candidate_mass=0.9, method=method, bounded=bounded)  # fmt: skip


def test_a_correction_divides_its_lean_out_only_where_it_corrects_and_the_reading_is_whole():
    """The obvious computation: p * prior / bias, renormalized, where the decider corrects the field, read whole."""
    schema = compile_schema(SCHEMA)
    tone = schema.field("tone")
    cal = Calibrator.from_distributions(schema, {"tone": [[0.6, 0.3, 0.1]] * 2}, model="m", method="mean")
    lean = cal.field("tone")
    raw = (0.5, 0.3, 0.2)
    weights = [p * q / b for p, q, b in zip(raw, lean.prior, lean.bias, strict=True)]
    want = tuple(w / sum(weights) for w in weights)
    kw = {"features": None, "strategy": None, "marginal_max_labels": 8}
    got = ContentFree().decide(tone, [decided(raw)], lean=lean, **kw)
    assert got.by == "content_free" and got.raw == raw and got.lean == lean.bias
    assert got.probabilities == pytest.approx(want, abs=1e-15)
    assert NoCorrection().decide(tone, [decided(raw)], lean=lean, **kw) == Reading(raw, raw)
    assert ContentFree().decide(tone, [decided(raw, "trie_walk")], lean=lean, **kw).own  # not whole: as read
    assert ContentFree().decide(tone, [decided(raw, bounded=1)], lean=lean, **kw).own  # a bound: as read
    assert Auto().decide(tone, [decided(raw)], lean=lean, **{**kw, "marginal_max_labels": 2}).own  # too many labels
    assert Batch().decide(tone, [decided(raw)], lean=None, **kw).own  # a batch too small: no lean
    only = schema.field("only")
    fixed = Decision(label=0, probabilities=(1.0,), candidate_mass=None, method="fixed")
    assert Calibrated(cal).decide(only, [fixed], lean=lean, **kw).own  # one label: nothing to correct


def test_a_head_decides_the_fields_it_has_and_falls_back_for_the_others():
    class OneHead:
        def __init__(self, name):
            self.name = name

        def field(self, name):
            return self if name == self.name else None

        def probabilities(self, features):
            return [0.1, 0.2, 0.7]

        def yes(self, features):
            return [0.9, 0.2]

    schema = compile_schema(SCHEMA)
    tone, tags = schema.field("tone"), schema.field("tags")
    kw = {"strategy": None, "marginal_max_labels": 8, "lean": None}
    raw = (0.5, 0.3, 0.2)
    headed = Headed(OneHead("tone"), CORRECTIONS["auto"])  # type: ignore[arg-type]
    got = headed.decide(tone, [decided(raw)], features=[1.0], **kw)
    assert got == Reading((0.1, 0.2, 0.7), raw, by="head", method="head")
    assert headed.decide(tone, [decided(raw)], features=None, **kw).own  # no features kept: the fallback
    flags = [decided((0.3, 0.7)), decided((0.6, 0.4))]
    assert headed.decide(tags, flags, features=[[1.0], [2.0]], **kw) == Reading((0.3, 0.6), (0.3, 0.6))
    multi = Headed(OneHead("tags"), CORRECTIONS["none"])  # type: ignore[arg-type]
    assert multi.decide(tags, flags, features=[[1.0], [2.0]], **kw) == Reading((0.9, 0.2), (0.3, 0.6), by="head",
                                                                                   method="head")  # fmt: skip
    assert own_distribution(tags, flags) == (0.3, 0.6)


def test_open_lean_reads_the_content_free_lean_only_where_a_correction_needs_it():
    schema = compile_schema(SCHEMA)
    cal = Calibrator.from_distributions(schema, {"tone": [[0.6, 0.3, 0.1]]}, model="m", method="mean")
    asked: list[object] = []

    def read(strategy):
        asked.append(strategy)
        return cal

    kw = {"strategy": None, "marginal_max_labels": 8, "read": read}
    assert CORRECTIONS["none"].open_lean(schema, **kw) == Lean()
    assert CORRECTIONS["batch"].open_lean(schema, **kw) == Lean("batch")  # its leans come with each wave
    assert Calibrated(cal).open_lean(schema, **kw) == Lean("calibration", cal)
    assert asked == []
    assert CORRECTIONS["auto"].open_lean(schema, **kw) == Lean("content_free", cal)
    assert CORRECTIONS["content_free"].open_lean(schema, **{**kw, "strategy": "trie_walk"}).priors is cal
    assert asked == ["marginal", "trie_walk"]  # auto reads as a plain call reads; content_free as the call asks


def test_a_tool_choice_keeps_its_own_reading_where_the_content_free_lean_prefers_answering():
    assert lean_favours_others("content_free", (0.2, 0.5, 0.3), keep=1) is False
    assert lean_favours_others("content_free", (0.6, 0.1, 0.3), keep=1) is True
    assert lean_favours_others("calibration", (0.2, 0.5, 0.3), keep=1) is True  # the user's choice
    assert lean_favours_others(None, None, keep=0) is False  # nothing corrected


def test_every_decider_is_one_kind_of_object():
    assert all(isinstance(d, Decider) for d in CORRECTIONS.values())
    assert issubclass(Calibrated, Decider) and issubclass(Headed, Decider)
