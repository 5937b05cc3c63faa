"""Decision cases (:mod:`pcd_engine.questions.cases`): both routes' shapes read as the questions' schema and the
examples a head is fitted on, each expected answer read by its question's type, and every bad line refused by
number."""

from __future__ import annotations

import json

import pytest

from pcd_engine import Question, questions_schema
from pcd_engine.errors import InputError
from pcd_engine.questions import read_decision_cases, state_text

SYSTEMONE = {
    "urgent": {"type": "noul", "instructions": "Is this urgent?"},
    "team": {"type": "choice", "instructions": "Which team?", "criteria": {"billing": "Charges.", "tech": None}},
    "anger": {"type": "score", "instructions": "How angry?", "criteria": ["Calm", "Annoyed", "Furious"]},
}
DECISIONS = [
    {"type": "predicate", "name": "urgent", "instructions": "Is this urgent?"},
    {"type": "choice", "name": "team", "instructions": "Which team?",
     "choices": [{"value": "billing", "description": "Charges."}, {"value": "tech"}]},
    {"type": "score", "name": "anger", "instructions": "How angry?",
     "levels": [{"label": "Calm"}, {"label": "Annoyed", "description": "raised voice"}, {"label": "Furious"}]},
]  # fmt: skip


def write(tmp_path, lines) -> str:
    path = tmp_path / "cases.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
    return str(path)


def test_systemone_cases_read_as_the_questions_schema_and_field_values(tmp_path):
    conversation = [{"role": "user", "content": "Refund me now!"}]
    path = write(tmp_path, [
        {"state": "Charged twice!", "questions": SYSTEMONE, "expected": {"urgent": True, "team": "billing",
                                                                        "anger": 2}},
        {"state": conversation, "expected": {"urgent": 0, "anger": "Annoyed"}},  # shares the first line's questions
        {"state": {"ticket": "App crashes"}, "questions": SYSTEMONE, "expected": {"urgent": "no", "team": "tech"}},
    ])  # fmt: skip
    cases = read_decision_cases(path)
    want = {
        "urgent": Question.yes_no("Is this urgent?"),
        "team": Question.choice("Which team?", {"billing": "Charges.", "tech": None}),
        "anger": Question.score("How angry?", ["Calm", "Annoyed", "Furious"]),
    }
    assert cases.wire == "systemone" and dict(cases.questions) == want
    assert cases.schema.fingerprint == questions_schema(want).fingerprint
    assert [text for text, _ in cases.examples] == [
        "Charged twice!",
        state_text(conversation),
        state_text({"ticket": "App crashes"}),
    ]
    assert [dict(e) for _, e in cases.examples] == [
        {"urgent": True, "team": "billing", "anger": 2}, {"urgent": False, "anger": 1},
        {"urgent": False, "team": "tech"},
    ]  # fmt: skip


def test_decisions_cases_name_a_score_by_its_label(tmp_path):
    path = write(tmp_path, [{"input": "Charged twice!", "questions": DECISIONS,
                             "expected": {"urgent": "true", "team": "tech", "anger": "Annoyed"}}])  # fmt: skip
    cases = read_decision_cases(path)
    assert cases.wire == "decisions" and list(cases.questions) == ["urgent", "team", "anger"]
    assert cases.questions["anger"].descriptions == ("Calm", "Annoyed: raised voice", "Furious")
    assert dict(cases.examples[0][1]) == {"urgent": True, "team": "tech", "anger": 1}


@pytest.mark.parametrize(
    ("lines", "needle"),
    [
        ([{"state": "x", "expected": {"urgent": True}}], ":1: expected the first case to name its questions"),
        ([{"state": "x", "questions": SYSTEMONE, "expected": {"team": "sales"}}],
         ":1: expected.team: expected one of ['billing', 'tech'], but got 'sales'"),
        ([{"state": "x", "questions": SYSTEMONE, "expected": {"urgent": "maybe"}}],
         "expected.urgent: expected true or false"),
        ([{"state": "x", "questions": SYSTEMONE, "expected": {"anger": 3}}], "expected.anger: expected a level 0 to 2"),
        ([{"state": "x", "questions": SYSTEMONE, "expected": {"mood": 1}}], "expected.mood: expected a question of"),
        ([{"state": "x", "questions": SYSTEMONE, "expected": {}}], "expected answers by question name"),
        ([{"questions": SYSTEMONE, "expected": {"urgent": True}}], "expected a 'state' (or an 'input')"),
        ([{"state": "x", "questions": SYSTEMONE, "expected": {"urgent": True}},
          {"state": "y", "questions": {"urgent": SYSTEMONE["urgent"]}, "expected": {"urgent": True}}],
         ":2: expected the questions of the first case"),
        ([{"state": "x", "questions": {"a": {"type": "box", "instructions": "?"}}, "expected": {"a": 1}}],
         "questions.a.type: expected"),
        ([], "expected at least one case"),
    ],
)  # fmt: skip
def test_a_bad_case_is_refused_naming_its_line(tmp_path, lines, needle):
    with pytest.raises(InputError, match="Cases") as caught:
        read_decision_cases(write(tmp_path, lines))
    assert needle in str(caught.value), str(caught.value)


def test_a_missing_file_is_refused():
    with pytest.raises(InputError, match="expected a JSON-lines file of decision cases"):
        read_decision_cases("/nonexistent/cases.jsonl")
