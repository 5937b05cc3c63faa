"""One conversation, the same words on every surface: the decisions API's state, the OpenAI routes, ``ChatPCD``,
``PCDDecisionModel`` and ``PCDLLM`` each read their own shape of it (OpenAI-style dicts, LangChain messages,
LlamaIndex messages) into :mod:`pcd_engine.prompt.transcript`, and each gets the same document to decide on and the
same turns for a chat template. The readers are the real ones, driven with the real frameworks' message classes."""

from __future__ import annotations

import pytest

pytest.importorskip("langchain_core.decisions", reason="pip install 'pcd-llm[langchain]'")
pytest.importorskip("llama_index.core", reason="pip install 'pcd-llm[llamaindex]'")
pytest.importorskip("fastapi", reason="pip install 'pcd-llm[serve]'")

from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage  # noqa: E402
from llama_index.core.base.llms.types import ChatMessage as LIMessage  # noqa: E402
from llama_index.core.base.llms.types import TextBlock, ToolCallBlock  # noqa: E402

from pcd_engine import ChatMessage, state_text  # noqa: E402
from pcd_engine.tools.serve.answers import conversation as server_conversation  # noqa: E402
from pcd_integrations.langchain.decision_model import _state_text as decision_model_text  # noqa: E402
from pcd_integrations.langchain.messages import conversation as langchain_conversation  # noqa: E402
from pcd_integrations.llamaindex.llm import _conversation as llamaindex_conversation  # noqa: E402

TICKET = "I was charged twice for order 5521."
CALL = {"id": "c1", "type": "function", "function": {"name": "lookup", "arguments": '{"order": 5521}'}}
OPENAI = [
    {"role": "system", "content": "You triage tickets."},
    {"role": "user", "content": TICKET},
    {
        "role": "assistant",
        "content": "Let me look.",
        "tool_calls": [CALL],
    },
    {"role": "tool", "tool_call_id": "c1", "content": "charged twice"},
]
LANGCHAIN = [
    SystemMessage("You triage tickets."),
    HumanMessage(TICKET),
    AIMessage("Let me look.", tool_calls=[{"name": "lookup", "args": {"order": 5521}, "id": "c1"}]),
    ToolMessage("charged twice", tool_call_id="c1"),
]
LLAMAINDEX = [
    LIMessage(role="system", content="You triage tickets."),
    LIMessage(role="user", content=TICKET),
    LIMessage(
        role="assistant",
        blocks=[
            TextBlock(text="Let me look."),
            ToolCallBlock(tool_call_id="c1", tool_name="lookup", tool_kwargs={"order": 5521}),
        ],
    ),
    LIMessage(role="tool", content="charged twice", additional_kwargs={"tool_call_id": "c1"}),
]
DOCUMENT = (
    "System: You triage tickets.\n\n"
    f"User: {TICKET}\n\n"
    'Assistant: Let me look.\nCalled lookup({"order": 5521})\n\n'
    "Tool result (lookup): charged twice"
)
CHAT = [
    ChatMessage("system", "You triage tickets."),
    ChatMessage("user", TICKET),
    ChatMessage("assistant", 'Let me look.\nCalled lookup({"order": 5521})'),
    ChatMessage("user", "Tool result (lookup): charged twice"),
]


def test_every_surface_reads_a_conversation_in_the_same_words():
    readings = {
        "the OpenAI routes": server_conversation(OPENAI),
        "ChatPCD": langchain_conversation(LANGCHAIN),
        "PCDLLM": llamaindex_conversation(LLAMAINDEX),
    }
    for surface, talk in readings.items():
        assert talk.document == DOCUMENT, surface
        assert talk.chat() == CHAT, surface
        assert talk.answered_calls() == [("lookup", {"order": 5521})], surface
    assert state_text(OPENAI) == DOCUMENT  # the decisions API's state
    assert decision_model_text(LANGCHAIN) == DOCUMENT  # PCDDecisionModel's state


def test_instructions_and_a_users_text_read_as_their_texts_on_every_surface():
    asked = f"Route the ticket.\n\n{TICKET}"
    system = {"role": "system", "content": "Route the ticket."}
    assert server_conversation([system, {"role": "user", "content": TICKET}]).document == asked
    assert langchain_conversation([SystemMessage("Route the ticket."), HumanMessage(TICKET)]).document == asked
    both = [LIMessage(role="system", content="Route the ticket."), LIMessage(role="user", content=TICKET)]
    assert llamaindex_conversation(both).document == asked
    assert state_text([system, {"role": "user", "content": TICKET}]) == asked
    assert decision_model_text([SystemMessage("Route the ticket."), HumanMessage(TICKET)]) == asked


def test_one_user_message_is_its_text_on_every_surface():
    assert server_conversation([{"role": "user", "content": TICKET}]).document == TICKET
    assert langchain_conversation([HumanMessage(TICKET)]).document == TICKET
    assert llamaindex_conversation([LIMessage(role="user", content=TICKET)]).document == TICKET
    assert state_text({"role": "user", "content": TICKET}) == TICKET
    assert decision_model_text(HumanMessage(TICKET)) == TICKET
