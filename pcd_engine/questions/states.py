"""A decision's state as the text it is decided on: :func:`state_text` (text, JSON, or a conversation) and
:func:`content_text` (instructions and descriptions given as text or JSON).

A conversation (OpenAI-style messages, at the root) reads as a transcript with each turn's role; any other JSON
object or array reads as indented JSON, messages nested in it included. Media (images, audio, files) are refused:
pcd reads text.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from pcd_engine.errors import ContextError
from pcd_engine.tool_calls import called_text, tool_result_text

__all__ = ["content_text", "state_text"]

MEDIA = frozenset({"image", "image_url", "input_image", "file", "input_file", "audio", "input_audio", "video"})
"""Content-block types that carry media, in LangChain's and OpenAI's shapes."""
ROLES = {"user": "User", "assistant": "Assistant", "system": "System", "developer": "System", "tool": "Tool"}
TEXT_PARTS = frozenset({"text", "input_text", "output_text"})


def content_text(content: Any, *, where: str) -> str:
    """Instructions or a description given as text or JSON, as text: text as it is, other JSON as JSON text.

    Raises:
        ContextError: If it holds media, or is not JSON.
    """
    if isinstance(content, str):
        return content
    parts = _text_parts(content)
    if parts is not None:
        return "".join(parts)
    return json.dumps(_plain(content, where), ensure_ascii=False)


def state_text(state: Any, *, where: str = "state") -> str:
    """The text a state is decided on.

    Text is itself. A conversation (one OpenAI-style message ``{"role", "content"}``, or a list of them) is a
    transcript: each turn's text after its role (``User:``, ``Assistant:``, ``System:``), an assistant's tool calls
    as ``Called name({...})`` and a tool's result as ``Tool result (name): ...``, turns apart by blank lines. Any
    other JSON object or array is its JSON, indented, messages nested in it included.

    Raises:
        ContextError: If the state is a bare number, boolean or null, holds media, or is not JSON.
    """
    if isinstance(state, str):
        return state
    if _is_message(state):
        state = [state]
    if isinstance(state, list) and state and all(_is_message(m) for m in state):
        names = {c.get("id"): c.get("function", {}).get("name") for m in state for c in m.get("tool_calls") or []}
        turns = [_turn(m, names, f"{where}[{i}]") for i, m in enumerate(state)]
        return "\n\n".join(t for t in turns if t)
    if not isinstance(state, (dict, list)):
        raise ContextError(
            f"Context: expected {where} to be text, a JSON object or array, or messages, but got "
            f"{type(state).__name__} {state!r}."
        )
    return json.dumps(_plain(state, where), ensure_ascii=False, indent=2)


def _is_message(value: Any) -> bool:
    return isinstance(value, dict) and value.get("role") in ROLES and "content" in value


def _turn(message: dict[str, Any], names: Mapping[Any, Any], where: str) -> str:
    """One message of a conversation as the transcript shows it."""
    content = message.get("content")
    text = "" if content is None else content_text(content, where=f"{where}.content").strip()
    if message["role"] == "tool":
        name = message.get("name") or names.get(message.get("tool_call_id")) or message.get("tool_call_id") or "tool"
        return tool_result_text(str(name), text)
    calls = []
    for call in message.get("tool_calls") or []:
        function = call.get("function") or {}
        arguments = function.get("arguments") or "{}"
        try:
            parsed = json.loads(arguments) if isinstance(arguments, str) else arguments
        except json.JSONDecodeError:
            parsed = {"arguments": arguments}
        calls.append((str(function.get("name")), parsed if isinstance(parsed, Mapping) else {"arguments": parsed}))
    body = "\n".join(t for t in (text, called_text(calls)) if t)
    return f"{ROLES[message['role']]}: {body}" if body else ""


def _text_parts(content: Any) -> list[str] | None:
    """A list of content parts that are all text (or JSON data), as texts; ``None`` when it is not such a list."""
    if not isinstance(content, list) or not content:
        return None
    out = []
    for part in content:
        if not isinstance(part, dict):
            return None
        if part.get("type") in TEXT_PARTS and isinstance(part.get("text"), str):
            out.append(part["text"])
        elif part.get("type") == "input_json" and "data" in part:
            out.append(json.dumps(part["data"], ensure_ascii=False))
        elif part.get("type") in MEDIA:
            raise ContextError(f"Context: {_media(part)}")
        else:
            return None
    return out


def _plain(value: Any, where: str) -> Any:
    """``value`` checked to be JSON without media blocks."""
    if isinstance(value, dict):
        if value.get("type") in MEDIA:
            raise ContextError(f"Context: {where}: {_media(value)}")
        return {str(k): _plain(v, f"{where}.{k}") for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v, f"{where}[{i}]") for i, v in enumerate(value)]
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    raise ContextError(f"Context: expected {where} to be JSON, but got {type(value).__name__}.")


def _media(block: Mapping[str, Any]) -> str:
    kind = block.get("type")
    return f"expected text, but got media (a {kind!r} block); pcd reads text only: no images, audio or files."
