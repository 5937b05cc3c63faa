"""Typed questions (:mod:`pcd_engine.questions`) and LangChain's decision model on them (``PCDDecisionModel``).

Every answer is checked against the engine's own decision of the same field, written out here by hand: the JSON
Schema a question compiles to (its prompt's words pinned), extracted with ``Engine.extract``. The engine is a tiny
random Llama with the real SmolLM2 tokenizer: real tokenizing, tries, packing and scoring, no real weights.
"""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

pytest.importorskip("langchain_core.decisions", reason="pip install 'pcd-llm[langchain]' (langchain-core >= 1.8)")

from langchain_core.decisions import Box, Choice, Noul, NoulCriteria, Score  # noqa: E402
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage  # noqa: E402

from pcd_engine import (  # noqa: E402
    ContextError,
    OptionError,
    Question,
    SchemaError,
    decide_questions,
    questions_schema,
    state_text,
)
from pcd_integrations.langchain import PCDDecisionModel  # noqa: E402
from tests.support import forcing_head  # noqa: E402

TICKET = "I was charged twice for order 5521. Refund the second charge today or I will dispute it with my bank."
QUESTIONS = {
    "refund": Noul(
        instructions="Does the customer ask for money back?",
        criteria=NoulCriteria(true="A refund or a chargeback is asked for.", false=None),
    ),
    "team": Choice(
        instructions="Which team should handle this?",
        criteria={"billing and payments": "Charges, invoices.", "technical support": None, "sales": "Pricing."},
    ),
    "anger": Score(
        instructions="How frustrated is the customer?", criteria=["Calm.", "Annoyed.", {"level": "Furious"}]
    ),
}
SCHEMA = {  # what QUESTIONS compile to, by hand
    "title": "Decisions",
    "type": "object",
    "properties": {
        "refund": {
            "type": "boolean",
            "description": "Does the customer ask for money back? (true means: A refund or a chargeback is asked for.)",
        },
        "team": {
            "enum": ["billing and payments", "technical support", "sales"],
            "description": 'Which team should handle this? ("billing and payments" means: Charges, invoices.; '
            '"sales" means: Pricing.)',
        },
        "anger": {
            "enum": [0, 1, 2],
            "description": "How frustrated is the customer? (The levels, lowest first: 0 means: Calm.; 1 means: "
            'Annoyed.; 2 means: {"level": "Furious"})',
        },
    },
    "required": ["refund", "team", "anger"],
}


def _entropy_concentration(ps: list[float]) -> float:
    return 1 - (-sum(p * math.log(p) for p in ps if p > 0)) / math.log(len(ps))


def _check_against_engine(answers: Any, engine: Any, text: str) -> None:
    """The response's answers are the engine's decisions of :data:`SCHEMA` for ``text``, exactly."""
    want = engine.extract(text, SCHEMA)
    refund, team, anger = (want.fields[k] for k in ("refund", "team", "anger"))
    assert answers["refund"].noul == refund.label_distribution[0]
    assert answers["team"].choice == team.value
    assert list(answers["team"].probabilities.values()) == list(team.label_distribution)
    assert list(answers["team"].probabilities) == ["billing and payments", "technical support", "sales"]
    assert answers["anger"].probabilities == dict(enumerate(anger.label_distribution))
    assert answers["anger"].score == pytest.approx(sum(i * p for i, p in enumerate(anger.label_distribution)))
    assert answers["anger"].legend == {0: "Calm.", 1: "Annoyed.", 2: {"level": "Furious"}}
    for name, dist in (("team", team.label_distribution), ("anger", anger.label_distribution)):
        assert answers[name].confidence == pytest.approx(_entropy_concentration(list(dist)))


@pytest.fixture(scope="module")
def model(tiny_engine):
    return PCDDecisionModel(engine=tiny_engine)


def test_text_state_answers_are_the_engines_decisions(model, tiny_engine):
    response = model.invoke({"state": TICKET, "questions": QUESTIONS})
    _check_against_engine(response.answers, tiny_engine, TICKET)
    assert response.model == "smollm2-135m"
    assert response.usage["input_tokens"] == tiny_engine.extract(TICKET, SCHEMA).stats.prompt_tokens > 0
    assert response.usage["output_tokens"] == 0  # every answer is scored, nothing is written


def test_message_state_reads_as_a_transcript(model, tiny_engine):
    conversation = [
        SystemMessage("You triage tickets."),
        HumanMessage(TICKET),
        AIMessage("", tool_calls=[{"name": "lookup", "args": {"order": "5521"}, "id": "c1"}]),
        ToolMessage("charged twice", tool_call_id="c1", name="lookup"),
    ]
    text = (
        "System: You triage tickets.\n\nUser: " + TICKET + '\n\nAssistant: Called lookup({"order": "5521"})'
        "\n\nTool result (lookup): charged twice"
    )
    response = model.invoke({"state": conversation, "questions": QUESTIONS})
    _check_against_engine(response.answers, tiny_engine, text)


def test_json_state_with_nested_messages_reads_as_indented_json(model, tiny_engine):
    state = {"customer": "Ada", "tier": 2, "history": [HumanMessage(TICKET), AIMessage("Sorry to hear that.")]}
    history = [{"role": "user", "content": TICKET}, {"role": "assistant", "content": "Sorry to hear that."}]
    plain = {"customer": "Ada", "tier": 2, "history": history}
    response = model.invoke({"state": state, "questions": QUESTIONS})
    _check_against_engine(response.answers, tiny_engine, json.dumps(plain, ensure_ascii=False, indent=2))


def test_state_text():
    assert state_text("plain") == "plain"
    assert state_text({"role": "user", "content": [{"type": "text", "text": "hi"}]}) == "hi"  # one user turn: its text
    assert state_text([{"a": 1}]) == '[\n  {\n    "a": 1\n  }\n]'
    assert state_text({"role": "user", "content": [{"type": "input_json", "data": {"a": 1}}]}) == '{"a": 1}'
    for bad in (None, 3, True):
        with pytest.raises(ContextError, match="expected state to be text, a JSON object or array"):
            state_text(bad)
    image = {"type": "image", "base64": "AAAA", "mime_type": "image/png"}
    with pytest.raises(ContextError, match="got media \\(a 'image' block\\); pcd reads text only"):
        state_text({"photo": image})
    with pytest.raises(ContextError, match="media \\(a 'image_url' block"):
        state_text([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:x"}}]}])


def test_instructions_as_json(model, tiny_engine):
    asked = {"q": Noul(instructions={"ask": "Is a refund requested?", "strict": True})}
    answer = model.invoke({"state": TICKET, "questions": asked}).answers["q"]
    described = {"type": "boolean", "description": '{"ask": "Is a refund requested?", "strict": true}'}
    schema = {"properties": {"q": described}, "title": "Decisions", "type": "object", "required": ["q"]}
    assert answer.noul == tiny_engine.extract(TICKET, schema).fields["q"].label_distribution[0]


def test_many_questions_take_the_passes_of_as_many_closed_fields(tiny_engine):
    """32 questions are one schema of 32 closed fields: as many passes as extracting 32 such fields."""
    asked = {f"q{i}": Question.choice(f"Question {i}?", ["yes please", "no thanks", "maybe later"]) for i in range(32)}
    preset = {f"f{i}": {"type": "enum", "choices": ["yes please", "no thanks", "maybe later"]} for i in range(32)}
    got = decide_questions(tiny_engine, [TICKET], asked)[0].result.stats
    plain = tiny_engine.extract(TICKET, preset).stats
    assert got.waves == plain.waves and got.forward_passes == plain.forward_passes
    assert got.forward_passes - got.prefill_passes - got.correction_passes == got.waves  # one pass per wave


def test_batch_is_one_engine_call_and_equals_one_by_one(model, tiny_engine, monkeypatch):
    states = [TICKET, "My app crashes when I log in.", [HumanMessage("How much is the pro plan?")]]
    alone = [model.invoke({"state": s, "questions": QUESTIONS}) for s in states]
    calls = []
    real = tiny_engine.extract_many

    def spy(texts, *args, **kwargs):
        calls.append(list(texts))
        return real(texts, *args, **kwargs)

    monkeypatch.setattr(tiny_engine, "extract_many", spy)
    other = {"q": Noul(instructions="Is this about money?")}
    inputs = [{"state": s, "questions": QUESTIONS} for s in states] + [{"state": TICKET, "questions": other}]
    together = model.batch(inputs)
    assert sorted(len(c) for c in calls) == [1, 3]  # one call per distinct set of questions
    for got, want in zip(together, alone, strict=False):
        assert got.answers["team"].choice == want.answers["team"].choice
        for name in ("team", "anger"):
            assert got.answers[name].probabilities == pytest.approx(want.answers[name].probabilities, abs=1e-5)
    assert set(together[3].answers) == {"q"}


async def test_abatch_and_ainvoke(model):
    got = await model.abatch([{"state": TICKET, "questions": QUESTIONS}, {"state": " ", "questions": QUESTIONS}],
                             return_exceptions=True)  # fmt: skip
    assert got[0].answers["team"].choice in QUESTIONS["team"].criteria
    assert isinstance(got[1], ContextError) and "state" in str(got[1])
    one = await model.ainvoke({"state": TICKET, "questions": QUESTIONS})
    assert one.answers["team"].choice == got[0].answers["team"].choice


async def test_concurrent_ainvoke_calls_share_passes(model, monkeypatch):
    """ainvoke goes through the engine's collector: concurrent calls are decided in shared batches."""
    import asyncio

    import pcd_integrations.langchain.decision_model as adapter

    shared: list[int] = []
    real = adapter.read_decisions

    def spy(result, questions):
        shared.append(max(result.stats.documents_per_pass))
        return real(result, questions)

    monkeypatch.setattr(adapter, "read_decisions", spy)
    states = [TICKET, "My app crashes.", "How much is the pro plan?", "I cannot log in."]
    got = await asyncio.gather(*(model.ainvoke({"state": s, "questions": QUESTIONS}) for s in states))
    alone = [model.invoke({"state": s, "questions": QUESTIONS}) for s in states]
    assert max(shared) > 1  # some were decided together
    for a, b in zip(got, alone, strict=True):
        assert a.answers["team"].probabilities == pytest.approx(b.answers["team"].probabilities, abs=1e-5)


def test_refusals(model):
    with pytest.raises(SchemaError, match="Question 'where': a Box question"):
        model.invoke({"state": TICKET, "questions": {"where": Box(instructions="Where is the logo?")}})
    image = {"type": "image", "url": "https://example.com/a.png"}
    with pytest.raises(ContextError, match="media \\(a 'image_url' block"):
        model.invoke(
            {"state": [HumanMessage(content=[{"type": "text", "text": "see"}, image])], "questions": QUESTIONS}
        )
    with pytest.raises(SchemaError, match="Question 'q'.*media \\(a 'image' block"):
        model.invoke({"state": TICKET, "questions": {"q": Noul(instructions=[image])}})
    with pytest.raises(SchemaError, match="expected a non-empty mapping"):
        questions_schema({})
    with pytest.raises(SchemaError, match="Question 'c': expected every label to be a string or a boolean"):
        questions_schema({"c": Question.choice("Which?", [1, 2])})
    with pytest.raises(OptionError, match="unknown argument 'api_key'"):
        PCDDecisionModel(api_key="sk-...")
    with pytest.raises(OptionError, match="Did you mean 'temperature'"):
        PCDDecisionModel(temprature=0.5)


def test_options_are_honoured(tiny_engine):
    """A head fitted on the questions' schema decides its question; temperature reshapes the probabilities."""
    asked = {"team": QUESTIONS["team"]}
    plain = PCDDecisionModel(engine=tiny_engine).invoke({"state": TICKET, "questions": asked}).answers["team"]
    forced_value = next(label for label in QUESTIONS["team"].criteria if label != plain.choice)
    from pcd_integrations.langchain.decision_model import engine_questions

    head = forcing_head(tiny_engine, questions_schema(engine_questions(asked)), "team", forced_value)
    headed = PCDDecisionModel(engine=tiny_engine, head=head).invoke({"state": TICKET, "questions": asked})
    assert headed.answers["team"].choice == forced_value
    hot = PCDDecisionModel(engine=tiny_engine, temperature=5.0).invoke({"state": TICKET, "questions": asked})
    assert hot.answers["team"].confidence < plain.confidence  # flatter


def test_yes_no_and_score_read_from_the_engine_field(tiny_engine):
    asked = {"ok": Question.yes_no("Is it fine?", yes="all good"), "lvl": Question.score("How bad?", ["a", "b", "c"])}
    decided = decide_questions(tiny_engine, [TICKET], asked)[0]
    ok, lvl = decided.answers["ok"], decided.answers["lvl"]
    assert ok.yes == ok.field.label_distribution[0] and ok.score is None and ok.value in (True, False)
    assert lvl.score == pytest.approx(sum(i * p for i, p in enumerate(lvl.field.label_distribution)))
    assert lvl.yes is None
    assert lvl.value == max(range(3), key=lambda i: lvl.field.label_distribution[i])


def test_fit_makes_the_head_of_the_questions_as_langchain_asks_them(model, tiny_engine):
    """``PCDDecisionModel.fit`` reads LangChain states and each type's expected answers as the engine's fields and
    fits the same head as :meth:`Head.fit` on :func:`questions_schema` of the same questions; a model given it
    decides with it."""
    from langchain_core.messages import HumanMessage

    from pcd_engine import Head, decide_questions
    from pcd_engine.errors import QuestionError
    from pcd_integrations.langchain.decision_model import engine_questions

    examples = [
        (TICKET, {"refund": True, "team": "billing and payments", "anger": 2}),
        ([HumanMessage("The app crashes on login.")], {"refund": "no", "team": "technical support", "anger": 1}),
        ("What does the premium plan cost?", {"refund": 0, "team": "sales", "anger": "Calm."}),
        ("Charge me back for the double fee.", {"refund": 1, "team": "billing and payments"}),
    ]
    head = model.fit(QUESTIONS, examples)
    asked = engine_questions(QUESTIONS)
    plain = [
        (TICKET, {"refund": True, "team": "billing and payments", "anger": 2}),
        ("The app crashes on login.", {"refund": False, "team": "technical support", "anger": 1}),
        ("What does the premium plan cost?", {"refund": False, "team": "sales", "anger": 0}),
        ("Charge me back for the double fee.", {"refund": True, "team": "billing and payments"}),
    ]
    assert head == Head.fit(tiny_engine, questions_schema(asked), plain)
    assert [g.field for g in head.gates] == ["refund", "team", "anger"]
    fitted = PCDDecisionModel(engine=tiny_engine, head=head)
    got = fitted.invoke({"state": TICKET, "questions": QUESTIONS}).answers
    want = decide_questions(tiny_engine, [TICKET], asked, options={"head": head})[0].answers
    assert got["team"].probabilities == pytest.approx(dict(want["team"].probabilities), abs=1e-9)
    with pytest.raises(QuestionError, match=r"examples\[1\]\.team: expected one of"):
        model.fit(QUESTIONS, [(TICKET, {"team": "sales"}), (TICKET, {"team": "shipping"})])
