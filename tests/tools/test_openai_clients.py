"""The popular OpenAI clients pointed at ``pcd serve`` on a live loopback port: LangChain's ``ChatOpenAI`` and
instructor, on the embedded model; an agent loop through ``ChatOpenAI`` on the scripted support agent of
:func:`tests.support.order_status_engine` (whose path through the loop is fixed, so the counts can be asserted)."""

from __future__ import annotations

from typing import Any, Literal

import pytest
from pydantic import BaseModel

pytest.importorskip("fastapi", reason="pip install 'pcd-llm[serve]'")

from pcd_engine.run.collector import Collector  # noqa: E402
from pcd_engine.tools.serve import create_app  # noqa: E402
from tests.support import order_status_engine, serve_on_loopback  # noqa: E402

pytestmark = pytest.mark.real_model

MODEL = "smollm2-135m"
TEXT = "I was charged twice for order 5521. Refund the second charge today or I go to my bank."


class Ticket(BaseModel):
    sentiment: Literal["POSITIVE", "NEUTRAL", "NEGATIVE"]
    wants_refund: bool


@pytest.fixture(scope="module")
def base(default_engine):
    with serve_on_loopback(create_app(default_engine, model_name=MODEL)) as port:
        yield f"http://127.0.0.1:{port}/v1"


@pytest.mark.parametrize("method", ["json_schema", "function_calling"])
def test_chat_openai_structured_output(base, default_engine, method):
    pytest.importorskip("langchain_openai")
    from langchain_openai import ChatOpenAI

    llm = ChatOpenAI(model=MODEL, base_url=base, api_key="unused", max_retries=0)
    got = llm.with_structured_output(Ticket, method=method).invoke(TEXT)
    assert got == Ticket(**default_engine.extract(TEXT, Ticket).values)  # the engine's answer, whatever the route
    raw = llm.with_structured_output(Ticket, method=method, include_raw=True).invoke(TEXT)["raw"]
    if method == "function_calling":
        assert raw.tool_calls[0]["name"] == "Ticket" and raw.response_metadata["finish_reason"] == "tool_calls"


def test_chat_openai_json_mode_gets_a_json_object(base):
    """JSON mode sends no schema, so the model writes the object it chooses under a JSON grammar: a JSON object,
    unless cut at max_tokens; whether its keys are the schema's is up to the model (the 135M one often writes
    others, or keeps adding keys until the limit)."""
    pytest.importorskip("langchain_openai")
    import openai
    from langchain_core.exceptions import OutputParserException
    from langchain_openai import ChatOpenAI

    import pcd_engine.tools.serve.answers as api

    replies = []
    real = api.json_chat

    def spy(*args: Any, **kwargs: Any) -> Any:
        replies.append(real(*args, **kwargs))
        return replies[-1]

    llm = ChatOpenAI(model=MODEL, base_url=base, api_key="unused", max_retries=0, max_tokens=48)
    ask = f"{TEXT}\nAnswer as a JSON object with keys sentiment and wants_refund."
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(api, "json_chat", spy)
        try:
            parsed = llm.with_structured_output(Ticket, method="json_mode").invoke(ask)
        except (openai.LengthFinishReasonError, OutputParserException, ValueError):
            parsed = None  # the model's object was cut or had other keys: a typed error, never a wrong Ticket
    (reply,) = replies  # the request was answered under the JSON grammar
    assert reply.finish_reason == "length" or isinstance(reply.value, dict)
    assert parsed is None or isinstance(parsed, Ticket)


@pytest.mark.parametrize("mode", ["JSON_SCHEMA", "TOOLS", "JSON"])
def test_instructor(base, default_engine, mode):
    instructor = pytest.importorskip("instructor")
    import openai

    client = instructor.from_openai(
        openai.OpenAI(base_url=base, api_key="unused", max_retries=0), mode=getattr(instructor.Mode, mode)
    )
    messages = [{"role": "user", "content": TEXT}]
    seen: list[tuple[str, dict[str, Any]]] = []
    # Scored answers go through the server's collector; a forced tool call's arguments through the engine.
    collect, extract = Collector.extract, default_engine.extract

    def collected(self: Collector, text: str, *args: Any, **kwargs: Any) -> Any:
        result = collect(self, text, *args, **kwargs)
        seen.append((text, result.values))
        return result

    def extracted(text: str, *args: Any, **kwargs: Any) -> Any:
        result = extract(text, *args, **kwargs)
        seen.append((text, result.values))
        return result

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Collector, "extract", collected)
        patch.setattr(default_engine, "extract", extracted)
        got = client.chat.completions.create(model=MODEL, response_model=Ticket, messages=messages, max_retries=0)
    ((document, values),) = seen  # one scored extraction answered the request
    assert got.model_dump() == values
    if mode == "JSON":  # the schema travelled in instructor's system turn: the server found it and cut it out
        assert TEXT in document and '"properties"' not in document
        return
    assert got.model_dump() == default_engine.extract(TEXT, Ticket).values


def test_chat_openai_agent_loop_through_the_server(smol_tokenizer):
    pytest.importorskip("langchain_openai")
    from langchain.agents import create_agent
    from langchain_core.messages import AIMessage, ToolMessage
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    import pcd_engine.tools.serve.answers as api

    looked_up: list[str] = []

    @tool
    def get_order_status(order_id: str) -> str:
        """Look up the shipping status of an order by its number."""
        looked_up.append(order_id)
        return f"Order {order_id} shipped on Monday and arrives Friday."

    decisions: list[bool] = []
    real = api.decide_tools

    def counting(*args: Any, **kwargs: Any) -> Any:
        decided = real(*args, **kwargs)
        decisions.append(decided.answer)
        return decided

    engine = order_status_engine(smol_tokenizer, "answer")
    with pytest.MonkeyPatch.context() as patch, serve_on_loopback(create_app(engine, model_name=MODEL)) as port:
        patch.setattr(api, "decide_tools", counting)
        llm = ChatOpenAI(model=MODEL, base_url=f"http://127.0.0.1:{port}/v1", api_key="x", max_retries=0, max_tokens=6)
        agent = create_agent(llm, tools=[get_order_status])
        out = agent.invoke({"messages": [("user", "Where is my order 5521?")]}, {"recursion_limit": 10})
    assert looked_up == ["5521"] and decisions == [False, True]  # called once, then answered
    kinds = [type(m) for m in out["messages"]]
    assert kinds == [kinds[0], AIMessage, ToolMessage, AIMessage]
    assert out["messages"][1].tool_calls[0]["args"] == {"order_id": "5521"}
    assert not out["messages"][-1].tool_calls


def test_llamaindex_openai_like_function_calling_chat_model(base, default_engine):
    """OpenAILike with is_chat_model and is_function_calling_model: structured_predict and as_structured_llm go
    through a forced tool call, which the engine answers. (With is_chat_model=False, OpenAILike passes ``tools``
    to the openai SDK's legacy Completions.create, which refuses them client-side; with is_function_calling_model
    False it asks the model to write the JSON as free text; see the README's client table.)"""
    pytest.importorskip("llama_index.llms.openai_like")
    from llama_index.core.llms import ChatMessage
    from llama_index.core.prompts import PromptTemplate
    from llama_index.llms.openai_like import OpenAILike

    llm = OpenAILike(
        model=MODEL, api_base=base, api_key="unused", is_chat_model=True, is_function_calling_model=True, max_tokens=64
    )
    expected = default_engine.extract(TEXT, Ticket).values
    assert llm.structured_predict(Ticket, PromptTemplate("{text}"), text=TEXT).model_dump() == expected
    reply = llm.as_structured_llm(Ticket).chat([ChatMessage(role="user", content=TEXT)])
    assert reply.raw.model_dump() == expected


def test_chat_openai_on_the_responses_api(base, default_engine):
    pytest.importorskip("langchain_openai")
    from langchain_openai import ChatOpenAI

    llm = ChatOpenAI(model=MODEL, base_url=base, api_key="unused", max_retries=0, use_responses_api=True, max_tokens=8)
    said = llm.invoke("Say hi").text
    assert said and "".join(chunk.text for chunk in llm.stream("Say hi")) == said  # the Responses stream
    got = llm.with_structured_output(Ticket, method="json_schema").invoke(TEXT)
    assert got == Ticket(**default_engine.extract(TEXT, Ticket).values)
    reply = llm.bind_tools([Ticket], tool_choice="Ticket").invoke(TEXT)
    assert reply.tool_calls[0]["name"] == "Ticket"
    assert Ticket(**reply.tool_calls[0]["args"]) == got


def test_chat_openai_surfaces_the_evidence_as_logprobs(base, default_engine):
    """ChatOpenAI keeps only standard fields; with logprobs=True each scored field's probability reaches
    response_metadata["logprobs"]."""
    pytest.importorskip("langchain_openai")
    import math

    from langchain_openai import ChatOpenAI

    llm = ChatOpenAI(model=MODEL, base_url=base, api_key="unused", max_retries=0, logprobs=True)
    raw = llm.with_structured_output(Ticket, method="json_schema", include_raw=True).invoke(TEXT)["raw"]
    entries = raw.response_metadata["logprobs"]["content"]
    fields = default_engine.extract(TEXT, Ticket).fields
    assert [e["token"].split("=")[0] for e in entries] == list(fields)
    assert [e["logprob"] for e in entries] == pytest.approx([math.log(f.probability) for f in fields.values()])
