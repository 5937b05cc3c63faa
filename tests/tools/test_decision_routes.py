"""``pcd serve``'s decision routes driven by the real, unchanged clients on a live loopback port:
``langchain_openai.decisions``' ``OpenAIDecisions`` and ``OpenAIClassifier`` (``POST /v1/decisions``),
``langchain_typesafe``'s ``TypeSafeClassifier`` (``POST /v1/systemone``), and a LangChain agent whose model is
chosen by ``OpenAIModelRouterMiddleware`` through the server.

Every answer is checked against :func:`pcd_engine.decide_questions` on the same engine (a tiny random Llama with the
real SmolLM2 tokenizer), for the state's text as :func:`pcd_engine.state_text` reads it.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

pytest.importorskip("fastapi", reason="pip install 'pcd-llm[serve]'")
pytest.importorskip("langchain_openai.decisions", reason="langchain-openai >= 1.8 (the dev extra)")
pytest.importorskip("langchain_typesafe", reason="langchain-typesafe (the dev extra)")

import httpx  # noqa: E402
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage  # noqa: E402

from pcd_engine import Question, decide_questions  # noqa: E402
from pcd_engine.tools.serve import create_app  # noqa: E402
from tests.support import order_status_engine, serve_on_loopback  # noqa: E402

MODEL = "smollm2-135m"
TICKET = "I was charged twice for order 5521. Refund the second charge today or I will dispute it with my bank."
ENGINE_QUESTIONS = {
    "urgent": Question.yes_no("Is this urgent?"),
    "team": Question.choice("Which team should handle this?", {"billing and payments": "Charges.", "tech": None}),
    "anger": Question.score("How frustrated is the customer?", ["Calm", "Annoyed: raised voice", "Furious"]),
}


@pytest.fixture(scope="module")
def base(tiny_engine):
    with serve_on_loopback(create_app(tiny_engine, model_name=MODEL, aliases=["pcd"])) as port:
        yield f"http://127.0.0.1:{port}"


def _want(engine: Any, state: Any) -> Any:
    return decide_questions(engine, [state], ENGINE_QUESTIONS)[0].answers


def test_openai_decisions(base, tiny_engine):
    from langchain_openai.decisions import Choice, Level, OpenAIDecisions, Predicate, Score

    client = OpenAIDecisions(model=MODEL, base_url=f"{base}/v1", api_key="unused", max_retries=0)
    response = client.invoke({"input": TICKET, "questions": {
        "urgent": Predicate(instructions="Is this urgent?"),
        "team": Choice(instructions="Which team should handle this?",
                       choices={"billing and payments": "Charges.", "tech": None}),
        "anger": Score(instructions="How frustrated is the customer?",
                       levels=["Calm", Level(label="Annoyed", description="raised voice"), "Furious"]),
    }})  # fmt: skip
    want = _want(tiny_engine, TICKET)
    assert response.model == MODEL and response.request_id.startswith("req_")
    assert response.predicates["urgent"].probability == pytest.approx(want["urgent"].yes, abs=1e-6)
    team = response.choices["team"]
    assert team.choice == want["team"].value
    assert team.probabilities == pytest.approx(dict(want["team"].probabilities), abs=1e-6)
    assert team.confidence == pytest.approx(want["team"].confidence, abs=1e-6)
    anger = response.scores["anger"]
    assert anger.legend == {0: "Calm", 1: "Annoyed", 2: "Furious"}
    assert anger.score == pytest.approx(want["anger"].score, abs=1e-6)
    assert response.usage.input_tokens > 0 and response.usage.output_tokens == 0


def test_openai_classifier_with_conversation_and_json_state(base, tiny_engine):
    from langchain_core.decisions import Choice, Noul, Score
    from langchain_openai.decisions import OpenAIClassifier

    client = OpenAIClassifier(model="pcd", base_url=f"{base}/v1", api_key="unused", max_retries=0)
    questions = {
        "urgent": Noul(instructions="Is this urgent?"),
        "team": Choice(instructions="Which team should handle this?",
                       criteria={"billing and payments": "Charges.", "tech": None}),
        "anger": Score(instructions="How frustrated is the customer?",
                       criteria=["Calm", "Annoyed: raised voice", "Furious"]),
    }  # fmt: skip
    conversation = [
        HumanMessage(TICKET),
        AIMessage("", tool_calls=[{"name": "lookup", "args": {"order": "5521"}, "id": "c1"}]),
        ToolMessage("charged twice", tool_call_id="c1"),
    ]
    got = client.invoke({"state": conversation, "questions": questions})
    text = f'User: {TICKET}\n\nAssistant: Called lookup({{"order": "5521"}})\n\nTool result (lookup): charged twice'
    want = _want(tiny_engine, text)
    assert got.nouls["urgent"].noul == pytest.approx(want["urgent"].yes, abs=1e-6)
    assert got.choices["team"].probabilities == pytest.approx(dict(want["team"].probabilities), abs=1e-6)
    assert got.scores["anger"].probabilities == pytest.approx(dict(want["anger"].probabilities), abs=1e-6)

    state = {"customer": "Ada", "ticket": TICKET}  # sent as an input_json part
    got = client.invoke({"state": state, "questions": questions})
    want = _want(tiny_engine, json.dumps(state))  # one user turn reads as its text alone
    assert got.choices["team"].probabilities == pytest.approx(dict(want["team"].probabilities), abs=1e-6)


def test_typesafe_classifier(base, tiny_engine):
    from langchain_typesafe import Choice, Noul, NoulCriteria, Score, TypeSafeClassifier

    client = TypeSafeClassifier(model=MODEL, base_url=base, api_key="unused")
    state = {"history": [HumanMessage(TICKET)], "tier": 2}
    got = client.invoke({"state": state, "questions": {
        "urgent": Noul(instructions="Is this urgent?", criteria=NoulCriteria(true="reply today")),
        "team": Choice(instructions="Which team should handle this?",
                       criteria={"billing and payments": "Charges.", "tech": None}),
        "anger": Score(instructions="How frustrated is the customer?",
                       criteria=["Calm", "Annoyed: raised voice", {"label": "Furious"}]),
    }})  # fmt: skip
    plain = {"history": [{"role": "user", "content": TICKET}], "tier": 2}
    asked = dict(ENGINE_QUESTIONS, urgent=Question.yes_no("Is this urgent?", yes="reply today"),
                 anger=Question.score("How frustrated is the customer?",
                                      ["Calm", "Annoyed: raised voice", '{"label": "Furious"}']))  # fmt: skip
    want = decide_questions(tiny_engine, [plain], asked)[0].answers
    assert got.request_id.startswith("req_")
    assert got.nouls["urgent"].noul == pytest.approx(want["urgent"].yes, abs=1e-6)
    assert got.choices["team"].choice == want["team"].value
    assert got.scores["anger"].legend == {0: "Calm", 1: "Annoyed: raised voice", 2: {"label": "Furious"}}
    assert got.scores["anger"].score == pytest.approx(want["anger"].score, abs=1e-6)


@pytest.mark.parametrize(
    ("route", "body", "param", "status"),
    [
        ("decisions", {"input": "x", "questions": [{"type": "box", "name": "a", "instructions": "x"}]},
         "questions[0].type", 400),
        ("decisions", {"input": "x", "questions": [{"type": "choice", "name": "a", "instructions": "x"}]},
         "questions[0].choices", 400),
        ("decisions", {"input": "x", "questions": [{"type": "score", "name": "a", "instructions": "x",
                                                     "levels": [{"label": "low"}]}]}, "questions[0].levels", 400),
        ("decisions", {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "data:x"}]}],
                       "questions": [{"type": "predicate", "name": "a", "instructions": "x"}]}, "input", 400),
        ("decisions", {"input": "x", "questions": []}, "questions", 400),
        ("decisions", {"model": "gpt-6-luna", "input": "x",
                       "questions": [{"type": "predicate", "name": "a", "instructions": "x"}]}, "model", 404),
        ("systemone", {"state": "x", "questions": {"a": {"type": "choice", "instructions": "x", "criteria": {}}}},
         "questions.a.criteria", 400),
        ("systemone", {"state": 3, "questions": {"a": {"type": "noul", "instructions": "x"}}}, "state", 400),
        ("systemone", {"state": "x", "questions": {"a": {"type": "noul", "instructions": ""}}}, None, 400),
        ("systemone", {"state": "x", "questions": {"a": {"type": "noul", "instructions": "x"}}, "seed": 1},
         "seed", 400),
    ],
)  # fmt: skip
def test_bad_requests_are_4xx_naming_the_field(base, route, body, param, status):
    reply = httpx.post(f"{base}/v1/{route}", json=body, timeout=60)
    assert reply.status_code == status, reply.text
    error = reply.json()["error"]
    assert error["message"]
    if param is not None:
        assert error["param"] == param
    else:
        assert "Question 'a'" in error["message"]


def test_concurrent_requests_share_passes(base):
    import concurrent.futures

    body = {"input": TICKET, "questions": [{"type": "predicate", "name": "a", "instructions": "Is it urgent?"}]}
    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        replies = list(pool.map(lambda _: httpx.post(f"{base}/v1/decisions", json=body, timeout=60).json(), range(6)))
    assert len({round(r["answers"][0]["probability"], 6) for r in replies}) == 1  # the same answer for each
    assert max(max(r["pcd"]["documents_per_pass"]) for r in replies) > 1  # some were decided together


def test_agent_model_router_decides_through_pcd_serve(smol_tokenizer):
    """A LangChain 1.x agent on ChatPCD whose model for the run is chosen by OpenAIModelRouterMiddleware asking
    pcd serve's /v1/decisions: the route is the server's decision, and the chosen model runs the loop to its end."""
    from langchain.agents import create_agent
    from langchain_core.tools import tool
    from langchain_openai.decisions import OpenAIDecisions
    from langchain_openai.middleware import ModelChoice, OpenAIModelRouterMiddleware

    from pcd_integrations.langchain import ChatPCD

    router_engine = order_status_engine(smol_tokenizer, "answer")  # the script reads no routes: any route is valid
    looked_up: list[str] = []

    @tool
    def get_order_status(order_id: str) -> str:
        """Look up the shipping status of an order by its number."""
        looked_up.append(order_id)
        return f"Order {order_id} shipped on Monday."

    models = {name: ChatPCD(engine=order_status_engine(smol_tokenizer, "answer"), max_tokens=6)
              for name in ("quick", "careful")}  # fmt: skip
    with serve_on_loopback(create_app(router_engine, model_name=MODEL)) as port:
        decisions = OpenAIDecisions(model=MODEL, base_url=f"http://127.0.0.1:{port}/v1", api_key="unused")
        router = OpenAIModelRouterMiddleware(
            choices={"quick": ModelChoice(model=models["quick"], criteria="Simple lookups."),
                     "careful": ModelChoice(model=models["careful"], criteria="Disputes and refunds.")},
            instructions="Which model should handle this request?", model=decisions,
        )  # fmt: skip
        agent = create_agent(models["quick"], tools=[get_order_status], middleware=[router])
        out = agent.invoke({"messages": [("user", "Where is my order 5521?")]}, {"recursion_limit": 10})
    route = out["model_route"]
    assert route["choice"] in ("quick", "careful")
    assert set(route["probabilities"]) == {"quick", "careful"} and 0 <= route["confidence"] <= 1
    asked = Question.choice("Which model should handle this request?",
                            {"quick": "Simple lookups.", "careful": "Disputes and refunds."})  # fmt: skip
    want = decide_questions(router_engine, ["Where is my order 5521?"], {"model_route": asked})
    assert route["choice"] == want[0].answers["model_route"].value
    assert looked_up == ["5521"] and isinstance(out["messages"][-1], AIMessage) and not out["messages"][-1].tool_calls
