"""LangChain's messages and schemas as pcd reads them: a conversation (LangChain's own OpenAI form of it, read as
every surface reads one),
what ``with_structured_output`` and ``bind_tools`` were given (:class:`Target`, :class:`Tools`), a structured batch
decided in one engine call (:class:`SharedBatch`), and a reply decided whole as a stream's last chunk.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Sequence
from typing import Any

from langchain_core.messages import AIMessageChunk, BaseMessage, convert_to_openai_messages
from langchain_core.outputs import ChatGenerationChunk, ChatResult
from langchain_core.utils.function_calling import convert_to_json_schema
from langchain_core.utils.pydantic import is_basemodel_subclass

from pcd_engine import ExtractOptions, SchemaError, Tool
from pcd_engine.adapters import Conversation, openai_conversation

__all__ = [
    "METHODS",
    "SharedBatch",
    "Target",
    "Tools",
    "conversation",
    "is_typeddict",
    "last_chunk",
    "message_text",
    "turns_key",
]

METHODS = ("json_schema", "function_calling", "json_mode")


def message_text(message: BaseMessage) -> str:
    content = message.content
    if isinstance(content, str):
        return content
    return "".join(p if isinstance(p, str) else str(p.get("text", "")) for p in content if isinstance(p, (str, dict)))


def conversation(messages: Sequence[BaseMessage]) -> Conversation:
    """The conversation pcd reads: LangChain's messages in their OpenAI form (``convert_to_openai_messages``),
    read as every surface reads one (:func:`pcd_engine.adapters.openai_conversation`); a role of a
    ``ChatMessage``'s own is a user's.

    Raises:
        ContextError: If a message holds media: pcd reads text.
    """
    return openai_conversation(convert_to_openai_messages(list(messages)), where="messages", other_roles_as="user")


def is_typeddict(schema: Any) -> bool:
    from typing_extensions import is_typeddict as typeddict

    return isinstance(schema, type) and typeddict(schema)


def turns_key(messages: Sequence[BaseMessage]) -> tuple[tuple[str, str], ...]:
    return tuple((m.type, message_text(m)) for m in messages)


class Target:
    """What ``with_structured_output`` was given, and how to turn pcd's values back into it."""

    def __init__(self, schema: Any, *, options: ExtractOptions | None = None) -> None:
        self.schema = schema
        self.options = options or ExtractOptions()
        self.pydantic = isinstance(schema, type) and is_basemodel_subclass(schema)
        if self.pydantic and hasattr(schema, "model_json_schema"):
            self.engine_schema: Any = schema  # Pydantic v2: the engine reads it directly
        elif self.pydantic or isinstance(schema, dict) or is_typeddict(schema):
            try:
                self.engine_schema = convert_to_json_schema(schema)
            except (ValueError, TypeError) as exc:
                raise ValueError(f"Schema: expected a Pydantic model, TypedDict or JSON Schema, but {exc}") from exc
        else:
            raise ValueError(
                f"Schema: expected a Pydantic model class, a TypedDict, a JSON Schema dict or an OpenAI tool dict, "
                f"but got {type(schema).__name__}."
            )

    def parse(self, message: BaseMessage) -> Any:
        error = message.response_metadata.get("pcd_error")
        if error:
            raise SchemaError(error)
        values = json.loads(message_text(message))
        return self.schema(**values) if self.pydantic else values


class Tools:
    """What ``bind_tools`` was given: the tools, the choice, and the answer's schema when the model answers."""

    def __init__(self, tools: list[Tool], choice: str, parallel: bool, response: Target | None) -> None:
        self.tools, self.choice, self.parallel, self.response = tools, choice, parallel, response


Decide = Callable[[Sequence[Sequence[BaseMessage]], "Target"], list[ChatResult | Exception]]
"""Decides a structured target for several conversations at once (``ChatPCD._structured``)."""


class SharedBatch:
    """The answers of one structured batch, decided by ONE engine call on the first run that asks (the other runs
    wait for it), then handed to each run by its conversation."""

    def __init__(self, decide: Decide, conversations: Sequence[Sequence[BaseMessage]], target: Target) -> None:
        self._decide, self._conversations, self._target = decide, conversations, target
        self._answers: dict[tuple[tuple[str, str], ...], ChatResult | Exception] | None = None
        self._lock = threading.Lock()

    def answer(self, messages: Sequence[BaseMessage]) -> ChatResult | Exception:
        with self._lock:
            if self._answers is None:
                decided = self._decide(self._conversations, self._target)
                self._answers = {turns_key(c): a for c, a in zip(self._conversations, decided, strict=True)}
        hit = self._answers.get(turns_key(messages))
        return hit if hit is not None else self._decide([messages], self._target)[0]


def last_chunk(result: ChatResult) -> ChatGenerationChunk:
    """A reply decided whole as the one, last chunk of a stream: its text, its tool calls as tool-call chunks, its
    metadata and usage."""
    message = result.generations[0].message
    calls = [
        {"name": c["name"], "args": json.dumps(c["args"]), "id": c["id"], "index": i, "type": "tool_call_chunk"}
        for i, c in enumerate(getattr(message, "tool_calls", []))
    ]
    return ChatGenerationChunk(
        message=AIMessageChunk(
            content=message.content,
            tool_call_chunks=calls,  # type: ignore[arg-type]
            response_metadata=message.response_metadata,
            usage_metadata=getattr(message, "usage_metadata", None),
            chunk_position="last",
        )
    )
