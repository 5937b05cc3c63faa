"""A conversation as pcd reads it, in the same words on every surface: the decisions API's state, the OpenAI
routes, ``ChatPCD`` and ``PCDLLM`` all turn their messages into a :class:`Conversation` and read it here.

Two readings, one set of words:

* :attr:`Conversation.document`, the text a decision is made on (a structured answer, a tool choice, a
  question's state). Instructions and a user's text (system and user turns only) are their texts, apart by blank
  lines, so a question asked as one message is decided as the same text given bare, and a prompt template's
  system turn reads as the instructions it is. A dialogue (an assistant's turn or a tool's result in it) is a
  transcript: each turn after its role (``User:``, ``Assistant:``, ``System:``), so the model can tell who said
  what.
* :meth:`Conversation.chat`, the turns a chat template renders for free text, each with its role (a tool's result
  is a user turn: templates differ on tool turns, and some have none).

In both, an assistant's tool calls read ``Called name({...})`` after its text, and a tool's result reads
``Tool result (name): ...``, named by the call it answers. Media (images, audio, files) are refused: pcd reads
text.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pcd_engine.errors import ContextError

__all__ = [
    "ChatMessage",
    "Conversation",
    "PastCall",
    "Turn",
    "called_text",
    "content_text",
    "is_openai_message",
    "media_refusal",
    "openai_conversation",
    "plain_json",
    "responses_input",
    "tool_result_text",
]

ROLES = ("system", "user", "assistant", "tool")
"""The roles of a :class:`Turn`."""
LABELS = {"system": "System", "user": "User", "assistant": "Assistant"}
"""How a transcript names each role (a tool's result carries its own label)."""
CHAT_ROLES = {"system": "system", "user": "user", "assistant": "assistant", "tool": "user"}
"""The chat-template role of each turn's role."""
OPENAI_ROLES = {
    "system": "system",
    "developer": "system",
    "user": "user",
    "assistant": "assistant",
    "tool": "tool",
    "function": "tool",
}
"""OpenAI-style message roles as turn roles (``function``: the legacy function result)."""
MEDIA = frozenset({"image", "image_url", "input_image", "file", "input_file", "audio", "input_audio", "video"})
"""Content-block types that carry media, in LangChain's and OpenAI's shapes."""
TEXT_PARTS = frozenset({"text", "input_text", "output_text"})
"""Content-part types that carry text, in OpenAI's and LangChain's shapes."""


@dataclass(frozen=True)
class ChatMessage:
    """One turn of a conversation as a chat template renders it.

    Attributes:
        role: ``"system"``, ``"user"`` or ``"assistant"``.
        content: The turn's text.
    """

    role: str
    content: str


@dataclass(frozen=True)
class PastCall:
    """A tool call an assistant turn made.

    Attributes:
        name: The tool's name.
        arguments: Its arguments.
        id: The call's id, which the tool turn answering it names; ``None`` when the framework gives none.
    """

    name: str
    arguments: Mapping[str, Any]
    id: str | None = None


@dataclass(frozen=True)
class Turn:
    """One turn of a conversation.

    Attributes:
        role: ``"system"``, ``"user"``, ``"assistant"`` or ``"tool"`` (a tool's result).
        text: The turn's text (a tool turn: the result).
        calls: An assistant turn's tool calls.
        answers: A tool turn: the id of the call it answers.
        tool: A tool turn: the tool's name, where the message gives it (else the answered call's name is used).

    Raises:
        ContextError: If the role is not one of the four.
    """

    role: str
    text: str = ""
    calls: tuple[PastCall, ...] = ()
    answers: str | None = None
    tool: str | None = None

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ContextError(f"Conversation: expected a turn's role in {list(ROLES)}, but got {self.role!r}.")


@dataclass(frozen=True)
class Conversation:
    """A conversation's turns, and how pcd reads them (see the module's docstring).

    Attributes:
        turns: The turns, in order.
    """

    turns: tuple[Turn, ...]

    def bodies(self) -> list[str]:
        """Each turn's text as both readings show it, without its role: the text stripped, an assistant's calls
        after it, a tool's result labelled with the tool's name."""
        names: dict[str | None, str] = {c.id: c.name for t in self.turns for c in t.calls if c.id is not None}
        out = []
        for turn in self.turns:
            text = turn.text.strip()
            if turn.role == "tool":
                out.append(tool_result_text(turn.tool or names.get(turn.answers) or turn.answers or "tool", text))
            else:
                made = called_text([(c.name, c.arguments) for c in turn.calls])
                out.append("\n".join(t for t in (text, made) if t))
        return out

    @property
    def dialogue(self) -> bool:
        """Whether an assistant or a tool speaks: then the document names each turn's role."""
        return any(t.role in ("assistant", "tool") for t in self.turns)

    @property
    def document(self) -> str:
        """The text a decision is made on: the turns' texts (:meth:`bodies`), those with none left out, apart by
        blank lines; in a :attr:`dialogue` each after its role (a tool's result carries its own label)."""
        said = [(turn, body) for turn, body in zip(self.turns, self.bodies(), strict=True) if body]
        if not self.dialogue:
            return "\n\n".join(body for _, body in said)
        return "\n\n".join(body if turn.role == "tool" else f"{LABELS[turn.role]}: {body}" for turn, body in said)

    def chat(self) -> list[ChatMessage]:
        """The turns as a chat template renders them: each with its chat role, a tool's result as a user turn."""
        return [ChatMessage(CHAT_ROLES[t.role], body) for t, body in zip(self.turns, self.bodies(), strict=True)]

    def answered_calls(self) -> list[tuple[str, dict[str, Any]]]:
        """The tool calls that a tool turn answers, as ``(name, arguments)``: the calls a next decision does not
        make again."""
        answered = {t.answers for t in self.turns if t.role == "tool" and t.answers is not None}
        return [(c.name, dict(c.arguments)) for t in self.turns for c in t.calls if c.id in answered]


def called_text(calls: Sequence[tuple[str, Mapping[str, Any]]]) -> str:
    """How an assistant turn's tool calls read: ``Called name({"arg": ...})``, one per call, joined by ``"; "``."""
    return "; ".join(f"Called {name}({json.dumps(dict(a), ensure_ascii=False, default=str)})" for name, a in calls)


def tool_result_text(name: str, content: str) -> str:
    """How a tool's result reads: ``Tool result (name): content``."""
    return f"Tool result ({name}): {content}"


def content_text(content: Any, *, where: str) -> str:
    """Content given as text or JSON, as text: text as it is, a list of text parts joined, other JSON as JSON text.

    Raises:
        ContextError: If it holds media, or is not JSON.
    """
    if isinstance(content, str):
        return content
    parts = _text_parts(content, where)
    if parts is not None:
        return "".join(parts)
    return json.dumps(plain_json(content, where), ensure_ascii=False)


def openai_conversation(messages: Any, *, where: str, other_roles_as: str | None = None) -> Conversation:
    """OpenAI Chat Completions messages (``{"role", "content"}``; an assistant's ``tool_calls``, a tool's
    ``tool_call_id``) as a :class:`Conversation`. ``developer`` is a system turn; content is text, text parts or
    JSON; a call's arguments are a JSON object or its text.

    Args:
        messages: One message or a non-empty list of them.
        where: What the messages are, for error messages (``"messages"``, ``"state"``).
        other_roles_as: The role a message of any other role is read as (a framework's own roles; ``None``:
            refused).

    Raises:
        ContextError: If a message is not an object with a known role, or its content is not text (media
            included; no content only beside tool calls).
    """
    listed = [messages] if isinstance(messages, dict) else messages
    if not isinstance(listed, list) or not listed:
        raise ContextError(f"Conversation: expected {where} to be a non-empty list of messages, but got {messages!r}.")
    turns = []
    for i, m in enumerate(listed):
        at = f"{where}[{i}]"
        known = isinstance(m, dict) and m.get("role") in OPENAI_ROLES
        if not isinstance(m, dict) or (not known and other_roles_as is None):
            got = m.get("role") if isinstance(m, dict) else type(m).__name__
            raise ContextError(f"Conversation: expected {at}.role in {sorted(OPENAI_ROLES)}, but got {got!r}.")
        content = m.get("content")
        calls = tuple(_past_call(c) for c in m.get("tool_calls") or [] if isinstance(c, dict))
        if content is None and not calls:
            raise ContextError(f"Conversation: expected {at}.content to be text, but got None.")
        text = "" if content is None else content_text(content, where=f"{at}.content")
        role = OPENAI_ROLES[m["role"]] if known else str(other_roles_as)  # Turn checks it is a role
        if role == "tool":
            answers = m.get("tool_call_id")
            turns.append(Turn("tool", text, answers=None if answers is None else str(answers), tool=m.get("name")))
        else:
            turns.append(Turn(role, text, calls))
    return Conversation(tuple(turns))


def responses_input(raw: Any, *, where: str = "input") -> list[dict[str, Any]]:
    """Responses API input (a string: one user turn; or items: messages, ``function_call`` and
    ``function_call_output``) as the Chat Completions messages :func:`openai_conversation` reads.

    Raises:
        ContextError: For an item of a kind pcd cannot read (reasoning, hosted tool calls, ...), naming it.
    """
    if isinstance(raw, str):
        return [{"role": "user", "content": raw}]
    if not isinstance(raw, list):
        raise ContextError(f"Conversation: expected {where} to be a string or a list of items, but got {raw!r}.")
    out: list[dict[str, Any]] = []
    for i, item in enumerate(raw):
        kind = item.get("type", "message") if isinstance(item, dict) else type(item).__name__
        if kind == "message":
            out.append({"role": item.get("role"), "content": item.get("content")})
        elif kind == "function_call":
            function = {"name": item.get("name"), "arguments": item.get("arguments")}
            call = {"id": item.get("call_id"), "function": function}
            out.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            out.append({"role": "tool", "tool_call_id": item.get("call_id"), "content": item.get("output")})
        else:
            raise ContextError(
                f"Conversation: expected {where}[{i}] to be a message, function_call or function_call_output item, "
                f"but got {kind!r}."
            )
    return out


def is_openai_message(value: Any) -> bool:
    """Whether ``value`` is an OpenAI-style message: an object with a known role and ``content``."""
    return isinstance(value, dict) and value.get("role") in OPENAI_ROLES and "content" in value


def media_refusal(block: Mapping[str, Any]) -> str:
    """The words of every refusal of a media block."""
    kind = block.get("type")
    return f"expected text, but got media (a {kind!r} block); pcd reads text only: no images, audio or files."


def plain_json(value: Any, where: str) -> Any:
    """``value`` checked to be JSON without media blocks.

    Raises:
        ContextError: If it holds media, or is not JSON.
    """
    if isinstance(value, dict):
        if value.get("type") in MEDIA:
            raise ContextError(f"Context: {where}: {media_refusal(value)}")
        return {str(k): plain_json(v, f"{where}.{k}") for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain_json(v, f"{where}[{i}]") for i, v in enumerate(value)]
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    raise ContextError(f"Context: expected {where} to be JSON, but got {type(value).__name__}.")


def _text_parts(content: Any, where: str) -> list[str] | None:
    """A list of content parts that are all text (or JSON data), as texts; ``None`` when it is not such a list.

    Raises:
        ContextError: If a part is media.
    """
    if not isinstance(content, list) or not content:
        return None
    out = []
    for j, part in enumerate(content):
        if not isinstance(part, dict):
            return None
        if part.get("type") in TEXT_PARTS and isinstance(part.get("text"), str):
            out.append(part["text"])
        elif part.get("type") == "input_json" and "data" in part:
            out.append(json.dumps(part["data"], ensure_ascii=False))
        elif part.get("type") in MEDIA:
            raise ContextError(f"Context: {where}[{j}]: {media_refusal(part)}")
        else:
            return None
    return out


def _past_call(call: Mapping[str, Any]) -> PastCall:
    """An OpenAI ``tool_calls`` entry (arguments as a JSON object or its text)."""
    function = call.get("function") or {}
    arguments = function.get("arguments") or "{}"
    try:
        parsed = json.loads(arguments) if isinstance(arguments, str) else arguments
    except json.JSONDecodeError:
        parsed = {"arguments": arguments}
    ident = call.get("id")
    return PastCall(
        str(function.get("name")),
        parsed if isinstance(parsed, Mapping) else {"arguments": parsed},
        None if ident is None else str(ident),
    )
