"""A decision's state as the text it is decided on: :func:`state_text` (text, JSON, or a conversation) and
:func:`content_text` (instructions and descriptions given as text or JSON).

A conversation (OpenAI-style messages, at the root) reads as :mod:`pcd_engine.prompt.transcript` reads every
conversation; any other JSON object or array reads as indented JSON, messages nested in it included. Media
(images, audio, files) are refused: pcd reads text.
"""

from __future__ import annotations

import json
from typing import Any

from pcd_engine.errors import ContextError
from pcd_engine.prompt.transcript import content_text, is_openai_message, openai_conversation, plain_json

__all__ = ["content_text", "state_text"]


def state_text(state: Any, *, where: str = "state") -> str:
    """The text a state is decided on.

    Text is itself. A conversation (one OpenAI-style message ``{"role", "content"}``, or a list of them) is its
    :attr:`~pcd_engine.prompt.transcript.Conversation.document`: system and user turns alone are their texts; a
    dialogue (an assistant or a tool speaks) is a transcript (``User:``, ``Assistant:``, ``System:``; an
    assistant's tool calls as ``Called name({...})``, a tool's result as ``Tool result (name): ...``); turns apart
    by blank lines. Any other JSON object or array is its JSON, indented, messages nested in it included.

    Raises:
        ContextError: If the state is a bare number, boolean or null, holds media, or is not JSON.
    """
    if isinstance(state, str):
        return state
    if is_openai_message(state) or (isinstance(state, list) and state and all(map(is_openai_message, state))):
        return openai_conversation(state, where=where).document
    if not isinstance(state, (dict, list)):
        raise ContextError(
            f"Context: expected {where} to be text, a JSON object or array, or messages, but got "
            f"{type(state).__name__} {state!r}."
        )
    return json.dumps(plain_json(state, where), ensure_ascii=False, indent=2)
