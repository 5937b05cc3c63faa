"""One builder of replies: tool-call ids come from the decided ToolCall (call_ and 24 hex digits) on every
surface, token usage from TokenUsage, and ChatPCD gathers its replies from its stream path."""

from __future__ import annotations

import re

import pytest
from pydantic import BaseModel

from pcd_engine.result import TokenUsage
from pcd_engine.tool_calls import ToolCall, call_id

CALL_ID = re.compile(r"call_[0-9a-f]{24}")


def test_call_ids_are_fresh_and_openai_shaped_and_not_part_of_equality():
    a, b = ToolCall("lookup", {"id": 1}, None), ToolCall("lookup", {"id": 1}, None)
    assert CALL_ID.fullmatch(a.id) and CALL_ID.fullmatch(call_id())
    assert a.id != b.id and a == b


def test_token_usage_in_each_apis_shape():
    usage = TokenUsage(prompt_tokens=12, completion_tokens=5)
    assert usage.chat_completions() == {"prompt_tokens": 12, "completion_tokens": 5, "total_tokens": 17}
    assert usage.input_output() == {"input_tokens": 12, "output_tokens": 5, "total_tokens": 17}


class Route(BaseModel):
    """Where a ticket goes."""

    urgent: bool
    team: str


def test_chat_pcd_invoke_equals_its_stream_for_text_json_and_tool_calls(tiny_engine):
    """_generate gathers _stream: the same reply either way, a tool target's call included (it streams as a
    tool-call chunk), with the engine's call ids."""
    pytest.importorskip("langchain_core")
    from pcd_integrations.langchain import ChatPCD

    text = "The printer is on fire, send someone now."
    chat = ChatPCD(engine=tiny_engine, max_tokens=4)
    invoked = chat.invoke(text)
    chunks = list(chat.stream(text))
    joined = sum(chunks[1:], chunks[0])
    assert (joined.content, joined.usage_metadata) == (invoked.content, invoked.usage_metadata)
    assert invoked.usage_metadata["total_tokens"] == sum(
        invoked.usage_metadata[k] for k in ("input_tokens", "output_tokens")
    )
    for method in ("json_schema", "function_calling"):
        runnable = chat.with_structured_output(Route, method=method)
        assert list(runnable.stream(text))[-1] == runnable.invoke(text), method
    tools = chat.bind_tools([Route], tool_choice="Route")
    called = tools.invoke(text)
    streamed = list(tools.stream(text))
    assert [c["name"] for c in called.tool_calls] == ["Route"] and CALL_ID.fullmatch(called.tool_calls[0]["id"])
    assert [(c["name"], c["args"]) for c in streamed[-1].tool_calls] == [("Route", called.tool_calls[0]["args"])]
