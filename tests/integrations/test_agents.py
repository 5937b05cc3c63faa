"""Tool decisions against brute force, and real agent loops (LangChain ``create_agent``, LlamaIndex
``FunctionAgent``) that call a real Python tool, read its result and answer.

The agent loops run on an oracle that reads its context as text (:class:`tests.support.ScriptedLM`): it wants to
call the tool until a tool result is in the conversation, then to answer; and it wants the order number the user
gave as the tool's argument. So the loop's path is fixed, and everything on it is real: the frameworks, the
adapters, the engine's prompts, tries, packing, scoring and generation.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any, Literal

import pytest
from pydantic import BaseModel

from pcd_engine import Engine, compile_schema
from pcd_engine.prompt.chat_prompt import ChatPrompt, TokenizerView
from pcd_engine.result import FieldResult
from pcd_engine.tool_calls import ANSWER, Tool, as_read, choice_schema, decide_tools, leans_to_calling
from tests.support import OracleBackend, OracleLM, enumerate_paths, oracle_brute_force, order_status_engine

ORDER = "Where is my order 5521? It has not arrived."
STATUS = Tool(
    "get_order_status",
    "Look up the shipping status of an order by its number.",
    {"type": "object", "properties": {"order_id": {"type": "string"}}, "required": ["order_id"]},
)
REFUND = Tool(
    "refund",
    "Refund an amount of money for an order.",
    {"type": "object", "properties": {"amount": {"type": "integer", "minimum": 1, "maximum": 9}}, "required": []},
)
PING = Tool("ping", "Check that the service is up.")


class Ticket(BaseModel):
    """The state of a customer's order."""

    status: Literal["shipped", "lost", "unknown"]
    order_id: str


# ------------------------------------------------------------------------------------------ brute force


def _brute_force(lm: OracleLM, tokenizer: Any, text: str, schema: dict) -> tuple[Any, dict[Any, float]]:
    """The winner and every option's probability of the schema's one closed field, by scoring each option's
    whole token path on the oracle (no trie, no packing)."""
    compiled = compile_schema(schema)
    (spec,) = compiled.fields
    prompt = ChatPrompt.build(TokenizerView(tokenizer), compiled)
    context = prompt.prefix_text + text + prompt.suffix_text
    winner, probs, _ = oracle_brute_force(lm, enumerate_paths(tokenizer, context, spec), "marginal")
    return spec.labels[winner].value, {label.value: float(probs[i]) for i, label in enumerate(spec.labels)}


@pytest.mark.parametrize("choice", ["auto", "required"])
def test_tool_choice_equals_brute_force(smol_tokenizer, choice):
    tools = [STATUS, REFUND, PING]
    for salt in ("a", "b", "c"):
        lm = OracleLM(len(smol_tokenizer), salt=salt)
        engine = Engine(OracleBackend(smol_tokenizer, lm), correction="none")  # brute force reads the model's own
        decision = decide_tools(engine, ORDER, tools, choice=choice)
        winner, probs = _brute_force(lm, smol_tokenizer, ORDER, choice_schema(tools, choice=choice))
        assert decision.choice is not None and decision.choice.method == "marginal"
        assert decision.choice.value == winner
        assert decision.choice.probability == pytest.approx(probs[winner], abs=1e-9)
        assert {a.value: a.probability for a in decision.choice.alternatives} == pytest.approx(probs, abs=1e-9)
        assert [c.name for c in decision.calls] == ([] if winner == ANSWER else [winner])


def test_auto_answers_when_answer_wins_and_calls_when_a_tool_wins(smol_tokenizer):
    """Over many oracles, ``auto`` answers exactly when brute force puts "answer" first, and ``required`` never
    answers; a called tool's arguments validate against its parameters."""
    import jsonschema

    tools = [STATUS, REFUND]
    seen = set()
    for salt in range(12):
        lm = OracleLM(len(smol_tokenizer), salt=str(salt))
        engine = Engine(OracleBackend(smol_tokenizer, lm), correction="none")
        winner, _ = _brute_force(lm, smol_tokenizer, ORDER, choice_schema(tools, choice="auto"))
        decision = decide_tools(engine, ORDER, tools, choice="auto")
        assert decision.answer == (winner == ANSWER)
        seen.add(decision.answer)
        for call in decision.calls:
            jsonschema.validate(call.arguments, next(t for t in tools if t.name == call.name).parameters)
        assert not decide_tools(engine, ORDER, tools, choice="required").answer
    assert seen == {True, False}  # both outcomes were exercised


def test_forced_none_and_argumentless_tools_need_no_choice(smol_tokenizer):
    engine = Engine(OracleBackend(smol_tokenizer, OracleLM(len(smol_tokenizer))))
    assert decide_tools(engine, ORDER, [STATUS, REFUND], choice="none").calls == ()
    forced = decide_tools(engine, ORDER, [STATUS, REFUND], choice="refund")
    assert forced.choice is None and [c.name for c in forced.calls] == ["refund"]
    assert 1 <= forced.calls[0].arguments.get("amount", 1) <= 9
    only = decide_tools(engine, ORDER, [PING], choice="any")
    assert only.calls[0].arguments == {} and only.calls[0].result is None


# ------------------------------------------------------------------------------------------ agent loops


@pytest.mark.parametrize("strategy", [None, "tool", "provider"])
def test_langchain_agent_calls_the_tool_reads_the_result_and_answers(smol_tokenizer, strategy):
    from langchain.agents import create_agent
    from langchain.agents.structured_output import ProviderStrategy, ToolStrategy
    from langchain_core.callbacks import BaseCallbackHandler
    from langchain_core.messages import AIMessage, ToolMessage
    from langchain_core.tools import tool

    from pcd_integrations.langchain import ChatPCD

    looked_up: list[str] = []

    @tool
    def get_order_status(order_id: str) -> str:
        """Look up the shipping status of an order by its number."""
        looked_up.append(order_id)
        return f"Order {order_id} shipped on Monday and arrives Friday."

    class Counter(BaseCallbackHandler):
        model_calls = 0

        def on_chat_model_start(self, *args: Any, **kwargs: Any) -> None:
            Counter.model_calls += 1

    fmt = {None: None, "tool": ToolStrategy(Ticket), "provider": ProviderStrategy(Ticket)}[strategy]
    engine = order_status_engine(smol_tokenizer, "Ticket" if strategy == "tool" else ANSWER)
    agent = create_agent(ChatPCD(engine=engine, max_tokens=6), tools=[get_order_status], response_format=fmt)
    out = agent.invoke({"messages": [("user", ORDER)]}, {"callbacks": [Counter()], "recursion_limit": 10})

    assert looked_up == ["5521"]  # one tool call, with the number the user gave
    assert Counter.model_calls == 2  # the call, then the answer after reading the result
    kinds = [type(m).__name__ for m in out["messages"]]
    assert kinds[:3] == ["HumanMessage", "AIMessage", "ToolMessage"]
    call = out["messages"][1]
    assert call.tool_calls[0]["name"] == "get_order_status"
    assert call.response_metadata["pcd"]["tool_choice"]["value"] == "get_order_status"
    assert isinstance(out["messages"][2], ToolMessage) and "shipped" in out["messages"][2].content
    if strategy is None:
        assert isinstance(out["messages"][-1], AIMessage) and not out["messages"][-1].tool_calls
    else:
        assert out["structured_response"] == Ticket(status="shipped", order_id="5521")


@pytest.mark.parametrize("streaming", [False, True])
def test_llamaindex_function_agent_calls_the_tool_reads_the_result_and_answers(smol_tokenizer, streaming, monkeypatch):
    pytest.importorskip("llama_index.core")
    from llama_index.core.agent.workflow import FunctionAgent
    from llama_index.core.tools import FunctionTool

    import pcd_integrations.llamaindex.llm as adapter

    looked_up: list[str] = []

    def get_order_status(order_id: str) -> str:
        """Look up the shipping status of an order by its number."""
        looked_up.append(order_id)
        return f"Order {order_id} shipped on Monday and arrives Friday."

    decisions: list[str] = []
    real = adapter.decide_tools

    def counting(engine: Engine, text: str, tools: Any, **kwargs: Any) -> Any:
        decided = real(engine, text, tools, **kwargs)
        decisions.append("answer" if decided.answer else decided.calls[0].name)
        return decided

    monkeypatch.setattr(adapter, "decide_tools", counting)
    llm = adapter.PCDLLM(engine=order_status_engine(smol_tokenizer, ANSWER), max_tokens=6)
    agent = FunctionAgent(
        tools=[FunctionTool.from_defaults(get_order_status)], llm=llm, output_cls=Ticket, streaming=streaming
    )

    async def run() -> Any:
        return await agent.run(user_msg=ORDER)

    out = asyncio.run(run())

    assert looked_up == ["5521"]
    assert decisions == ["get_order_status", "answer"]  # two model turns: the call, then the answer
    assert [c.tool_name for c in out.tool_calls] == ["get_order_status"]
    assert "shipped" in str(out.tool_calls[0].tool_output.content)
    assert Ticket.model_validate(out.structured_response) == Ticket(status="shipped", order_id="5521")


def test_llamaindex_function_calling_api(smol_tokenizer):
    """``chat_with_tools`` replies with tool-call blocks carrying ids and the choice's evidence;
    ``predict_and_call`` runs the real function; ``tool_required`` and a named ``tool_choice`` reach the decision;
    with the result in the history the model answers, and ``error_on_no_tool_call`` is honoured."""
    pytest.importorskip("llama_index.core")
    from llama_index.core.base.llms.types import ChatMessage, ToolCallBlock
    from llama_index.core.tools import FunctionTool

    from pcd_integrations.llamaindex import PCDLLM

    def get_order_status(order_id: str) -> str:
        """Look up the shipping status of an order by its number."""
        return f"Order {order_id} shipped on Monday and arrives Friday."

    def refund(amount: int) -> str:
        """Refund an amount of money for an order."""
        return f"Refunded {amount}."

    tools = [FunctionTool.from_defaults(get_order_status), FunctionTool.from_defaults(refund)]
    llm = PCDLLM(engine=order_status_engine(smol_tokenizer, ANSWER), max_tokens=8)  # bounds the arguments too
    assert llm.metadata.is_function_calling_model and llm.metadata.is_chat_model

    reply = llm.chat_with_tools(tools, user_msg=ORDER)
    (block,) = [b for b in reply.message.blocks if isinstance(b, ToolCallBlock)]
    assert block.tool_name == "get_order_status" and block.tool_kwargs == {"order_id": "5521"}
    assert block.tool_call_id and block.tool_call_id.startswith("call_")
    evidence = reply.additional_kwargs["pcd"]["tool_choice"]
    assert evidence["value"] == "get_order_status" and set(dict(evidence["alternatives"])) == {
        "get_order_status",
        "refund",
        ANSWER,
    }
    (selection,) = llm.get_tool_calls_from_response(reply)
    assert (selection.tool_id, selection.tool_name, selection.tool_kwargs) == (
        block.tool_call_id,
        "get_order_status",
        {"order_id": "5521"},
    )

    called = llm.predict_and_call(tools, user_msg=ORDER)
    assert called.response == "Order 5521 shipped on Monday and arrives Friday."

    forced = llm.chat_with_tools(tools, user_msg=ORDER, tool_choice="refund")
    assert [s.tool_name for s in llm.get_tool_calls_from_response(forced)] == ["refund"]
    required = llm.chat_with_tools(tools, user_msg=ORDER, tool_required=True)
    assert required.additional_kwargs["pcd"]["tool_choice"]["value"] in ("get_order_status", "refund")
    assert ANSWER not in dict(required.additional_kwargs["pcd"]["tool_choice"]["alternatives"])

    history = [ChatMessage(role="user", content=ORDER), reply.message]
    history.append(
        ChatMessage(role="tool", content=called.response, additional_kwargs={"tool_call_id": block.tool_call_id})
    )
    answered = llm.chat_with_tools(tools, chat_history=history)
    assert not answered.message.blocks or not any(isinstance(b, ToolCallBlock) for b in answered.message.blocks)
    assert llm.get_tool_calls_from_response(answered, error_on_no_tool_call=False) == []
    choice = answered.additional_kwargs["pcd"]["tool_choice"]  # the decision to answer keeps its evidence
    assert choice["value"] == "answer" and {a[0] for a in choice["alternatives"]} >= {"answer", "get_order_status"}
    with pytest.raises(ValueError, match="expected a tool call"):
        llm.get_tool_calls_from_response(answered)
    with pytest.raises(ValueError, match="tool_choice: expected"):
        llm.chat_with_tools(tools, user_msg=ORDER, tool_choice="search")


# ------------------------------------------------------------------------------------------ loops that end


def test_a_call_already_answered_is_not_made_again(smol_tokenizer):
    """A model that wants the same call again after its result is in the conversation (the scripted one wants
    get_order_status at every turn) is passed over for the next option: under auto, answering."""
    engine = order_status_engine(smol_tokenizer, "get_order_status")
    after = f'{ORDER}\n\nCalled get_order_status({{"order_id": "5521"}})\n\nTool result (get_order_status): shipped'
    again = decide_tools(engine, after, [STATUS, REFUND], choice="auto")
    assert [c.name for c in again.calls] == ["get_order_status"]  # nothing said it was answered: the model's call
    moved_on = decide_tools(
        engine, after, [STATUS, REFUND], choice="auto", done=[("get_order_status", {"order_id": "5521"})]
    )
    assert moved_on.choice.value == "get_order_status" and moved_on.passed_over == ("get_order_status",)
    ranked = sorted(moved_on.choice.alternatives, key=lambda a: -a.probability)
    following = next(a.value for a in ranked if a.value != "get_order_status")
    assert [c.name for c in moved_on.calls] == ([] if following == ANSWER else [following])
    assert moved_on.evidence()["passed_over"] == ["get_order_status"]
    other = decide_tools(engine, after, [STATUS, REFUND], choice="auto", done=[("get_order_status", {"order_id": "1"})])
    assert [c.name for c in other.calls] == ["get_order_status"]  # other arguments: a new call
    forced = decide_tools(engine, after, [STATUS], choice="required", done=[("get_order_status", {"order_id": "5521"})])
    assert [c.name for c in forced.calls] == ["get_order_status"]  # required, and nothing else to call


def test_the_tool_choice_divides_the_lean_out_only_when_it_leans_to_calling(smol_tokenizer):
    """Under the engine's default correction the choice is the content-free-corrected one when the model, asked
    nothing, would call a tool, and the model's own when it would answer (answering is right on a turn that says
    nothing); a correction named in the options decides as named. Checked against both readings, on oracles with
    both kinds of lean."""
    seen = set()
    for salt in ("lean", "a", "b", "c", "d", "e", "f", "g"):
        engine = Engine(OracleBackend(smol_tokenizer, OracleLM(len(smol_tokenizer), salt=salt)))
        tools = [STATUS, REFUND, PING]
        own = decide_tools(engine, ORDER, tools, choice="auto", options={"correction": "none"}).choice
        always = decide_tools(engine, ORDER, tools, choice="auto", options={"correction": "auto"}).choice
        default = decide_tools(engine, ORDER, tools, choice="auto").choice
        assert always.correction == "content_free" and own.correction is None
        assert always.raw_distribution == pytest.approx(own.label_distribution, abs=1e-9)
        labels = [*(t.name for t in tools), ANSWER]
        lean = dict(zip(labels, always.lean, strict=True))
        calls = max(lean[t.name] for t in tools) > lean[ANSWER]
        assert leans_to_calling(always, labels) == calls
        expected = always if calls else own
        assert (default.value, default.correction) == (expected.value, expected.correction)
        assert default.label_distribution == pytest.approx(expected.label_distribution, abs=1e-9)
        assert [a.value for a in default.alternatives] == [a.value for a in expected.alternatives]
        seen.add(calls)
    assert seen == {True, False}  # both kinds of lean were met


def test_leans_to_calling_reads_the_lean_divided_out():
    def field(correction, lean):
        return FieldResult("next", "answer", 0.5, 1.0, "marginal", (), 0, correction=correction, lean=lean)

    labels = ["get_order_status", "refund", ANSWER]
    assert leans_to_calling(field("content_free", (0.5, 0.1, 0.4)), labels)
    assert not leans_to_calling(field("content_free", (0.2, 0.1, 0.7)), labels)
    assert not leans_to_calling(field(None, None), labels)  # nothing was divided out
    assert leans_to_calling(field("calibration", (0.2, 0.1, 0.7)), labels)  # a calibration is the user's choice
    raw = FieldResult(
        "next", "refund", 0.6, 1.0, "marginal", (), 0, correction="content_free", lean=(0.2, 0.1, 0.7),
        label_distribution=(0.3, 0.6, 0.1), raw_distribution=(0.5, 0.1, 0.4),
    )  # fmt: skip
    read = as_read(raw, labels)
    assert (read.value, read.probability, read.correction, read.lean) == ("get_order_status", 0.5, None, None)
    assert read.label_distribution == (0.5, 0.1, 0.4)


@pytest.mark.real_model
def test_langchain_agent_with_two_tools_ends_on_the_embedded_model(default_engine):
    from langchain.agents import create_agent
    from langchain_core.messages import AIMessage
    from langchain_core.tools import tool

    from pcd_integrations.langchain import ChatPCD

    @tool
    def get_order_status(order_id: str) -> str:
        """Look up the shipping status of an order by its number."""
        return f"Order {order_id} shipped on Monday and arrives Friday."

    @tool
    def refund(order_id: str) -> str:
        """Refund an order by its number."""
        return f"Refund for order {order_id} issued."

    agent = create_agent(ChatPCD(engine=default_engine, max_tokens=16), tools=[get_order_status, refund])
    for ask in (ORDER, "Please refund order 5521, it arrived broken."):
        out = agent.invoke({"messages": [("user", ask)]}, {"recursion_limit": 8})  # at most 3 model turns
        made = [(c["name"], json.dumps(c["args"], sort_keys=True)) for m in out["messages"] for c in
                getattr(m, "tool_calls", None) or []]  # fmt: skip
        assert len(made) == len(set(made)) <= 2  # no call twice
        assert isinstance(out["messages"][-1], AIMessage) and not out["messages"][-1].tool_calls


@pytest.mark.real_model
def test_llamaindex_function_agent_ends_on_the_embedded_model(default_engine):
    pytest.importorskip("llama_index.core")
    from llama_index.core.agent.workflow import FunctionAgent
    from llama_index.core.tools import FunctionTool

    from pcd_integrations.llamaindex import PCDLLM

    made: list[tuple[str, str]] = []

    def get_order_status(order_id: str) -> str:
        """Look up the shipping status of an order by its number."""
        made.append(("get_order_status", order_id))
        return f"Order {order_id} shipped on Monday and arrives Friday."

    def refund(order_id: str) -> str:
        """Refund an order by its number."""
        made.append(("refund", order_id))
        return f"Refund for order {order_id} issued."

    tools = [FunctionTool.from_defaults(get_order_status), FunctionTool.from_defaults(refund)]
    agent = FunctionAgent(tools=tools, llm=PCDLLM(engine=default_engine, max_tokens=16))

    async def run() -> Any:
        return await agent.run(user_msg=ORDER, max_iterations=4)  # raises if the loop does not end in 4 steps

    out = asyncio.run(run())
    assert len(made) == len(set(made)) <= 2
    assert out.response.content is not None


def test_the_servers_next_auto_turn_after_a_tool_result_moves_on(smol_tokenizer):
    """pcd serve reads which calls the conversation answered: the next ``auto`` turn answers or calls something
    new, even for a model that wants the same call again (the scripted one always wants get_order_status)."""
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from pcd_engine.tools.serve import create_app

    app = create_app(order_status_engine(smol_tokenizer, "get_order_status"), model_name="m")
    functions = [
        {"name": t.name, "description": t.description, "parameters": dict(t.parameters)} for t in (STATUS, REFUND)
    ]
    tools = [{"type": "function", "function": f} for f in functions]
    call = {"id": "call_1", "type": "function",
            "function": {"name": "get_order_status", "arguments": '{"order_id": "5521"}'}}  # fmt: skip
    messages = [
        {"role": "user", "content": ORDER},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "Order 5521 shipped on Monday."},
    ]
    with TestClient(app, base_url="http://localhost") as client:
        for parallel in (True, False):
            body = {"model": "m", "messages": messages, "tools": tools, "tool_choice": "auto", "max_tokens": 16,
                    "parallel_tool_calls": parallel}  # fmt: skip
            reply = client.post("/v1/chat/completions", json=body).json()
            message = reply["choices"][0]["message"]
            repeated = [c for c in message.get("tool_calls") or [] if c["function"]["name"] == "get_order_status"
                        and json.loads(c["function"]["arguments"]) == {"order_id": "5521"}]  # fmt: skip
            assert not repeated
            if not parallel:  # one choice: the model's first option was passed over for its next
                assert reply["pcd"]["passed_over"] == ["get_order_status"]
