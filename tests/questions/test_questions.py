"""Question types as objects (pcd_engine.questions): each of yes/no, choice and score owns its closed field, how its
answer reads back and how each wire format writes it; questions arrive from both wire formats through their type;
states read as text; and no module outside the types compares a question's kind (a static test)."""

from __future__ import annotations

import ast
import math
from pathlib import Path

import pytest

from pcd_engine.errors import ContextError, QuestionError, SchemaError
from pcd_engine.questions import (
    CHOICE,
    SCORE,
    TYPES,
    YES_NO,
    Question,
    QuestionAnswer,
    concentration,
    questions_schema,
    state_text,
    wire_type,
)
from pcd_engine.questions.kinds import WIRES

ROOT = Path(__file__).resolve().parents[2]
OWNER = ROOT / "pcd_engine" / "questions" / "kinds.py"
KIND_NAMES = {name for t in TYPES.values() for name in (t.name, *t.wire_names.values())}


def kind_comparisons(source: str, tree: ast.AST) -> list[str]:
    """Where ``tree`` compares with a question kind's name (pcd's or a wire's) or compares a ``.kind``."""
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Compare):
            continue
        for side in (node.left, *node.comparators):
            named = isinstance(side, ast.Constant) and side.value in KIND_NAMES
            named |= isinstance(side, (ast.Tuple, ast.List, ast.Set)) and any(
                isinstance(e, ast.Constant) and e.value in KIND_NAMES for e in side.elts
            )
            if named or (
                isinstance(side, ast.Attribute) and side.attr == "kind" and "question" in ast.dump(node).lower()
            ):
                found.append(f"{node.lineno}: {ast.get_source_segment(source, node)}")
                break
    return found


def test_no_module_but_the_question_types_compares_a_question_kind():
    found = []
    for path in sorted([*(ROOT / "pcd_engine").rglob("*.py"), *(ROOT / "pcd_integrations").rglob("*.py")]):
        if path == OWNER:
            continue
        source = path.read_text(encoding="utf-8")
        found += [f"{path.relative_to(ROOT)}:{hit}" for hit in kind_comparisons(source, ast.parse(source))]
    assert found == []


@pytest.mark.parametrize(
    "code",
    ["if answer.kind == 'yes_no':\n    pass", "x = kind in ('predicate', 'choice', 'score')", "y = t != 'noul'"],
)
def test_the_kind_check_can_fail(code):
    assert kind_comparisons(code, ast.parse(code))


def test_each_type_owns_its_closed_field():
    yes_no = Question.yes_no("Is it urgent?", yes="a deadline today", no=None)
    choice = Question.choice("Which team?", {"billing": "money", "tech": None, True: "other"})
    score = Question.score("How angry?", ["calm", "cross", "furious"])
    assert (yes_no.type, choice.type, score.type) == (YES_NO, CHOICE, SCORE)
    assert yes_no.values == (True, False) and choice.values == ("billing", "tech", True) and score.values == (0, 1, 2)
    assert yes_no.field_schema() == {"type": "boolean", "description": "Is it urgent? (true means: a deadline today)"}
    described = 'Which team? ("billing" means: money; true means: other)'
    assert choice.field_schema() == {"enum": ["billing", "tech", True], "description": described}
    assert score.field_schema()["description"] == (
        "How angry? (The levels, lowest first: 0 means: calm; 1 means: cross; 2 means: furious)"
    )
    schema = questions_schema({"u": yes_no, "team": choice, "anger": score})
    assert [f.name for f in schema.fields] == ["u", "team", "anger"]


@pytest.mark.parametrize(
    ("question", "message"),
    [
        (Question("yes_no", "q", ("a",), (None, None)), "no labels and two meanings"),
        (Question("choice", "q", (), ()), "at least one label"),
        (Question("choice", "q", (1,), (None,)), "a string or a boolean, but got 1"),
        (Question("score", "q", (), ("only",)), "at least two levels"),
        (Question("rank", "q", (), ()), r"expected a kind in \['yes_no', 'choice', 'score'\]"),  # type: ignore[arg-type]
    ],
)
def test_each_type_checks_its_questions(question, message):
    with pytest.raises(SchemaError, match=message):
        questions_schema({"q": question})


def answer_of(question: Question, probabilities: list[float]) -> QuestionAnswer:
    values = question.values
    best = max(range(len(values)), key=lambda i: probabilities[i])
    probs = dict(zip(values, probabilities, strict=True))
    return QuestionAnswer("q", question.kind, values[best], probs, concentration(probabilities), None)  # type: ignore[arg-type]


def test_each_type_writes_each_wire_format():
    """Every type in every wire format, against the shapes the clients parse (written out here by hand)."""
    yes = answer_of(Question.yes_no("?"), [0.8, 0.2])
    assert yes.yes == 0.8 and yes.score is None
    assert yes.wire("decisions") == {"type": "predicate", "probability": 0.8}
    assert yes.wire("systemone") == yes.wire("langchain") == {"type": "noul", "noul": 0.8}
    pick = answer_of(Question.choice("?", ["a", "b"]), [0.3, 0.7])
    c = pick.confidence
    assert pick.yes is None and pick.score is None
    assert pick.wire("decisions") == {"type": "choice", "choice": "b", "confidence": c,
                                      "probabilities": [{"value": "a", "probability": 0.3},
                                                        {"value": "b", "probability": 0.7}]}  # fmt: skip
    assert pick.wire("systemone") == pick.wire("langchain") == {
        "type": "choice", "choice": "b", "probabilities": {"a": 0.3, "b": 0.7}, "confidence": c}  # fmt: skip
    level = answer_of(Question.score("?", ["low", "mid", "high"]), [0.2, 0.5, 0.3])
    assert level.score == pytest.approx(1.1) and level.yes is None
    assert level.wire("decisions", legend=["low", "mid", "high"]) == {
        "type": "score", "score": level.score, "confidence": level.confidence,
        "probabilities": [{"value": 0, "label": "low", "probability": 0.2},
                          {"value": 1, "label": "mid", "probability": 0.5},
                          {"value": 2, "label": "high", "probability": 0.3}]}  # fmt: skip
    assert level.wire("systemone", legend=["low", "mid", "high"]) == {
        "type": "score", "score": level.score, "confidence": level.confidence,
        "legend": {"0": "low", "1": "mid", "2": "high"}, "probabilities": {"0": 0.2, "1": 0.5, "2": 0.3}}  # fmt: skip
    assert level.wire("langchain", legend=["low", "mid", "high"]) == {
        "type": "score", "score": level.score, "confidence": level.confidence,
        "legend": {0: "low", 1: "mid", 2: "high"}, "probabilities": {0: 0.2, 1: 0.5, 2: 0.3}}  # fmt: skip
    assert set(WIRES) == {"decisions", "systemone", "langchain"}


@pytest.mark.parametrize(
    ("wire", "raw", "want"),
    [
        ("decisions", {"type": "predicate", "instructions": "Urgent?"}, Question.yes_no("Urgent?")),
        ("decisions", {"type": "choice", "instructions": "Team?", "choices": [{"value": "a", "description": "x"},
                                                                              {"value": True}]},
         Question.choice("Team?", {"a": "x", True: None})),
        ("decisions", {"type": "score", "instructions": "Anger?", "levels": [{"label": "calm"},
                                                                             {"label": "mad", "description": "loud"}]},
         Question.score("Anger?", ["calm", "mad: loud"])),
        ("systemone", {"type": "noul", "instructions": "Urgent?", "criteria": {"true": "today"}},
         Question.yes_no("Urgent?", yes="today")),
        ("systemone", {"type": "choice", "instructions": "Team?", "criteria": {"a": "x", "b": None}},
         Question.choice("Team?", {"a": "x", "b": None})),
        ("systemone", {"type": "score", "instructions": [{"type": "text", "text": "Anger?"}],
                       "criteria": ["calm", "mad"]}, Question.score("Anger?", ["calm", "mad"])),
    ],
)  # fmt: skip
def test_questions_arrive_from_each_wire_through_their_type(wire, raw, want):
    kind = wire_type(wire, raw["type"], where="q")
    assert Question.from_wire(kind, wire, raw, "q") == want


@pytest.mark.parametrize(
    ("wire", "raw", "param", "message"),
    [
        ("decisions", {"type": "noul"}, "q.type", "expected 'predicate', 'choice' or 'score', but got 'noul'"),
        ("systemone", {"type": "predicate"}, "q.type", "expected 'noul', 'choice' or 'score', but got 'predicate'"),
        ("decisions", {"type": "choice", "instructions": "?", "choices": [{"value": 3}]}, "q.choices[0].value",
         "used once, but got 3"),
        ("decisions", {"type": "score", "instructions": "?", "levels": [{"label": "a"}]}, "q.levels",
         "a list of at least 2"),
        ("systemone", {"type": "noul", "instructions": "?", "criteria": ["yes"]}, "q.criteria", "'true' and 'false'"),
        ("systemone", {"type": "choice", "instructions": [{"type": "image_url", "image_url": "x"}],
                       "criteria": {"a": None}}, "q.instructions", "media"),
    ],
)  # fmt: skip
def test_a_bad_wire_question_names_the_part_at_fault(wire, raw, param, message):
    with pytest.raises(QuestionError, match=message) as caught:
        kind = wire_type(wire, raw.get("type"), where="q")
        Question.from_wire(kind, wire, raw, "q")
    assert caught.value.param == param


def test_confidence_is_concentration_not_probability():
    assert concentration([1.0, 0.0]) == 1.0 and concentration([0.5, 0.5]) == 0.0 and concentration([1.0]) == 1.0
    p = [0.84, 0.16]
    assert concentration(p) == pytest.approx(1 + sum(x * math.log(x) for x in p) / math.log(2))


def test_a_state_reads_as_text_json_or_a_transcript():
    assert state_text("plain") == "plain"
    assert state_text({"a": [1, 2]}) == '{\n  "a": [\n    1,\n    2\n  ]\n}'
    talk = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "Where is order 7?"}]},
        {"role": "assistant", "content": None,
         "tool_calls": [{"id": "c1", "function": {"name": "track", "arguments": '{"order": 7}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "shipped"},
    ]  # fmt: skip
    text = state_text(talk)
    assert text.startswith("System: Be brief.\n\nUser: Where is order 7?\n\nAssistant: Called track(")
    assert "Tool result (track): shipped" in text
    with pytest.raises(ContextError, match="media"):
        state_text([{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}])
    with pytest.raises(ContextError, match="expected state to be text, a JSON object or array"):
        state_text(3)
