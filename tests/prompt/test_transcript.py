"""How pcd reads a conversation (:mod:`pcd_engine.prompt.transcript`): the document a decision is made on, the turns
a chat template renders, the calls already answered, and the refusals. The same conversation in every surface's
shape reads in the same words: tests/integrations/test_transcripts.py."""

from __future__ import annotations

import pytest

from pcd_engine import ContextError
from pcd_engine.prompt.transcript import (
    ChatMessage,
    Conversation,
    PastCall,
    Turn,
    called_text,
    content_text,
    openai_conversation,
    tool_result_text,
)

TICKET = "I was charged twice for order 5521."
CALL = {"id": "c1", "type": "function", "function": {"name": "lookup", "arguments": '{"order": "5521"}'}}
TALK = [
    {"role": "developer", "content": "You triage tickets."},
    {"role": "user", "content": TICKET},
    {"role": "assistant", "content": None, "tool_calls": [CALL]},
    {"role": "tool", "tool_call_id": "c1", "content": "charged twice"},
    {"role": "assistant", "content": "  "},  # says nothing: left out of the document
]


def test_instructions_and_a_users_text_read_as_their_texts():
    for one in ({"role": "user", "content": TICKET}, [{"role": "user", "content": [{"type": "text", "text": TICKET}]}]):
        talk = openai_conversation(one, where="state")
        assert talk.document == TICKET
        assert talk.chat() == [ChatMessage("user", TICKET)]
    # instructions and a user's text are their texts: a prompt template's system turn reads as instructions
    asked = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": f"  {TICKET}\n"}]
    assert openai_conversation(asked, where="m").document == f"Be brief.\n\n{TICKET}"
    assert not openai_conversation(asked, where="m").dialogue
    # a user turn beside turns with no text is still alone
    quiet = [{"role": "system", "content": ""}, {"role": "user", "content": f"  {TICKET}\n"}]
    assert openai_conversation(quiet, where="m").document == TICKET


def test_a_dialogue_names_every_turns_role():
    """An assistant's turn makes a dialogue, even one with no text of its own (a call), and even alone."""
    answered = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]
    assert openai_conversation(answered, where="m").document == "User: Hi\n\nAssistant: Hello"
    alone = [{"role": "assistant", "content": "Hello"}]
    assert openai_conversation(alone, where="m").document == "Assistant: Hello"
    silent = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]
    silent.append({"role": "assistant", "content": ""})
    assert openai_conversation(silent, where="m").document == "System: S\n\nUser: U"


def test_a_conversation_reads_as_a_transcript():
    talk = openai_conversation(TALK, where="state")
    assert talk.document == (
        "System: You triage tickets.\n\n"
        f"User: {TICKET}\n\n"
        'Assistant: Called lookup({"order": "5521"})\n\n'
        "Tool result (lookup): charged twice"
    )
    assert talk.chat() == [
        ChatMessage("system", "You triage tickets."),
        ChatMessage("user", TICKET),
        ChatMessage("assistant", 'Called lookup({"order": "5521"})'),
        ChatMessage("user", "Tool result (lookup): charged twice"),  # templates differ on tool turns: a user's
        ChatMessage("assistant", ""),
    ]
    assert talk.answered_calls() == [("lookup", {"order": "5521"})]


def test_tool_results_are_named_by_their_own_name_the_call_they_answer_or_its_id():
    turns = (
        Turn("assistant", "Looking.", (PastCall("lookup", {"order": 7}, "c1"), PastCall("refund", {}, "c2"))),
        Turn("tool", "shipped", answers="c1"),
        Turn("tool", "done", answers="c9", tool="refund"),
        Turn("tool", "lost", answers="c7"),
        Turn("tool", "?"),
    )
    talk = Conversation(turns)
    assert talk.bodies() == [
        'Looking.\nCalled lookup({"order": 7}); Called refund({})',
        "Tool result (lookup): shipped",
        "Tool result (refund): done",
        "Tool result (c7): lost",
        "Tool result (tool): ?",
    ]
    assert talk.answered_calls() == [("lookup", {"order": 7})]  # c2 was never answered


def test_the_words_of_calls_and_results():
    assert called_text([("a", {"x": "é"}), ("b", {})]) == 'Called a({"x": "é"}); Called b({})'
    assert tool_result_text("a", "ok") == "Tool result (a): ok"


def test_arguments_as_text_objects_or_not_json():
    calls = [
        {"id": "1", "function": {"name": "f", "arguments": {"a": 1}}},
        {"id": "2", "function": {"name": "g", "arguments": "not json"}},
        {"id": "3", "function": {"name": "h", "arguments": "[1, 2]"}},
        {"id": "4", "function": {"name": "k"}},
    ]
    (turn,) = openai_conversation([{"role": "assistant", "content": None, "tool_calls": calls}], where="m").turns
    assert [(c.name, dict(c.arguments), c.id) for c in turn.calls] == [
        ("f", {"a": 1}, "1"),
        ("g", {"arguments": "not json"}, "2"),
        ("h", {"arguments": [1, 2]}, "3"),
        ("k", {}, "4"),
    ]


def test_content_as_text_parts_or_json():
    assert content_text([{"type": "input_text", "text": "a"}, {"type": "text", "text": "b"}], where="c") == "ab"
    assert content_text([{"type": "input_json", "data": {"a": 1}}], where="c") == '{"a": 1}'
    assert content_text({"a": [1]}, where="c") == '{"a": [1]}'


@pytest.mark.parametrize(
    ("messages", "words"),
    [
        ([], r"expected m to be a non-empty list of messages, but got \[\]"),
        ("hi", r"expected m to be a non-empty list of messages, but got 'hi'"),
        ([{"role": "robot", "content": "x"}], r"expected m\[0\]\.role in \[.*\], but got 'robot'"),
        (["x"], r"expected m\[0\]\.role in \[.*\], but got 'str'"),
        ([{"role": "user", "content": None}], r"expected m\[0\]\.content to be text, but got None"),
        (
            [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}],
            r"m\[0\]\.content\[0\]: expected text, but got media \(a 'image_url' block\)",
        ),
        ([{"role": "user", "content": {"photo": {"type": "input_audio"}}}], r"m\[0\]\.content\.photo: expected text"),
    ],
)
def test_what_is_not_a_conversation_is_refused_by_name(messages, words):
    with pytest.raises(ContextError, match=words):
        openai_conversation(messages, where="m")


def test_a_frameworks_own_roles_read_as_the_role_it_names():
    critic = [{"role": "critic", "content": "Meh."}]
    assert openai_conversation(critic, where="m", other_roles_as="user").turns == (Turn("user", "Meh."),)
    with pytest.raises(ContextError, match=r"expected m\[0\]\.role in .*, but got 'critic'"):
        openai_conversation(critic, where="m")


def test_a_turn_has_one_of_four_roles():
    with pytest.raises(ContextError, match=r"expected a turn's role in \['system', 'user', 'assistant', 'tool'\]"):
        Turn("developer", "x")
