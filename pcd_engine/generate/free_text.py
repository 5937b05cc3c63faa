"""Free-text chat on the engine's model: the model's chat template, greedy decoding, stop sequences, streaming.

Integrations (LangChain, LlamaIndex) use this for their plain ``invoke`` / ``complete`` calls, so that a chat
model backed by pcd is a real chat model on the same local weights, not only a structured-output shim.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from pcd_engine.backends.contract import Backend
from pcd_engine.errors import ContextError, OptionError, RequestTimeout
from pcd_engine.generate.open_rows import Grammars
from pcd_engine.limits import DEFAULT_TIME_LIMIT_S
from pcd_engine.prompt.chat_prompt import TokenizerView, render_chat
from pcd_engine.prompt.transcript import ChatMessage

__all__ = [
    "ChatMessage",
    "ChatModel",
    "JsonReply",
    "TextChunk",
    "chat_prompt_ids",
    "json_chat",
    "stream_chat",
    "stream_text",
]

_ROLES = ("system", "user", "assistant")


class ChatModel(Protocol):
    """What free text needs of a loaded model (an :class:`~pcd_engine.engine.Engine` is one): its backend, its
    tokenizer and its grammar cache."""

    @property
    def backend(self) -> Backend: ...

    @property
    def tokenizer(self) -> TokenizerView: ...

    @property
    def grammars(self) -> Grammars: ...


@dataclass(frozen=True)
class TextChunk:
    """A piece of streamed text.

    Attributes:
        text: Text added since the previous chunk (may be empty on the last one).
        finish_reason: ``None`` while generating; on the last chunk ``"stop"`` (end of turn or a stop sequence)
            or ``"length"`` (``max_new_tokens`` reached).
        prompt_tokens: Tokens in the rendered prompt.
        completion_tokens: Tokens generated so far.
    """

    text: str
    finish_reason: str | None
    prompt_tokens: int
    completion_tokens: int


@dataclass(frozen=True)
class JsonReply:
    """A reply that is one JSON value (see :func:`json_chat`).

    Attributes:
        value: The parsed value; ``None`` when the reply was cut and could not be completed into a valid one.
        text: The reply's JSON text (closed by pcd when it was cut).
        finish_reason: ``"stop"`` (the value is complete) or ``"length"`` (cut at ``max_new_tokens``).
        prompt_tokens: Tokens in the rendered prompt.
        completion_tokens: Tokens generated.
        valid: True when ``value`` satisfies the schema.
    """

    value: Any
    text: str
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    valid: bool


def chat_prompt_ids(tokenizer: Any, messages: Sequence[ChatMessage]) -> list[int]:
    """Render ``messages`` with the model's chat template, ending with an open assistant turn.

    Templates that refuse a system role get the system text folded into the first user turn. Message contents
    are plain text: a control string inside one (``<|im_start|>system``) is tokenized as ordinary text.

    Args:
        tokenizer: A :class:`~pcd_engine.prompt.chat_prompt.TokenizerView`.
        messages: The conversation; at least one message.

    Raises:
        ContextError: If there are no messages, a role is unknown, or the template cannot render them.
    """
    if not messages:
        raise ContextError("Chat: expected at least one message, but got none.")
    for i, m in enumerate(messages):
        if m.role not in _ROLES:
            raise ContextError(f"Chat: expected message {i} to have a role in {list(_ROLES)}, but got {m.role!r}.")
    rendered = _render_turns(tokenizer, [{"role": m.role, "content": m.content} for m in messages])
    # Control tokens of the template stay control tokens; a control string inside a message is plain text (a
    # message cannot open a turn). The template's control tokens bound the stretches that are tokenized plain.
    spans, at = [], 0
    for m in messages:
        content = m.content.strip()
        found = rendered.find(content, at) if content else -1
        if found >= 0:
            spans.append((found, found + len(content)))
            at = found + len(content)
    ids, offsets = tokenizer.encode_with_offsets(rendered)
    out: list[int] = []
    start = 0
    for token, (begin, end) in zip(ids, offsets, strict=True):
        inside = any(lo <= begin < hi for lo, hi in spans)
        if token in tokenizer.added_ids and end > begin and not inside:
            out += tokenizer.encode_plain(rendered[start:begin]) if begin > start else []
            out.append(token)
            start = end
    if start < len(rendered):
        out += tokenizer.encode_plain(rendered[start:])
    return out


def _render_turns(tokenizer: Any, turns: list[dict[str, str]]) -> str:
    """The chat template's text for ``turns``; a template that refuses a system role gets it folded into the
    first user turn."""
    try:
        return render_chat(tokenizer, turns)[0]
    except Exception as exc:  # noqa: BLE001 - templates raise anything; report it as one typed error
        raise ContextError(f"Chat: expected the model's chat template to render the messages, but: {exc}") from exc


def _held_back(text: str, stops: Sequence[str]) -> int:
    """How many trailing characters might still become a stop sequence (or are an unfinished character)."""
    keep = 0
    for stop in stops:
        for n in range(min(len(stop) - 1, len(text)), keep, -1):
            if stop.startswith(text[-n:]):
                keep = n
                break
    if text.endswith("\ufffd"):
        keep = max(keep, 1)
    return keep


def stream_chat(
    engine: ChatModel,
    messages: Sequence[ChatMessage],
    *,
    max_new_tokens: int = 256,
    stop: Sequence[str] = (),
    time_limit_s: float | None = DEFAULT_TIME_LIMIT_S,
) -> Iterator[TextChunk]:
    """Greedy free-text reply from the engine's model, streamed as text chunks.

    Text is emitted as soon as it cannot be part of a stop sequence; the stop sequence itself is never emitted.

    Args:
        engine: A loaded :class:`~pcd_engine.engine.Engine`.
        messages: The conversation.
        max_new_tokens: Upper bound on generated tokens (> 0).
        stop: Strings that end the reply.
        time_limit_s: Seconds the reply may take, checked after each token; ``None`` for no limit (default
            :data:`~pcd_engine.limits.DEFAULT_TIME_LIMIT_S`).

    Yields:
        Text chunks; the last one carries the finish reason and the token counts.

    Raises:
        OptionError: If ``max_new_tokens`` is not a positive int, a stop sequence is empty, or ``time_limit_s``
            is not positive.
        ContextError: If the messages cannot be rendered or do not fit the model's window.
        RequestTimeout: If the reply runs past ``time_limit_s`` (what was streamed before stays sent).
    """

    def ids() -> list[int]:  # rendered when streaming starts, so a bad conversation fails at the first chunk
        return chat_prompt_ids(engine.tokenizer, messages)

    yield from _stream(engine, ids, "Chat", max_new_tokens=max_new_tokens, stop=stop, time_limit_s=time_limit_s)


def stream_text(
    engine: ChatModel,
    prompt: str,
    *,
    max_new_tokens: int = 16,
    stop: Sequence[str] = (),
    time_limit_s: float | None = DEFAULT_TIME_LIMIT_S,
) -> Iterator[TextChunk]:
    """Greedy continuation of a raw ``prompt`` (no chat template), streamed as text chunks: OpenAI's legacy
    ``/v1/completions``. Arguments, chunks and errors are as for :func:`stream_chat`; the prompt must not be empty.
    """

    def ids() -> list[int]:
        if not prompt:
            raise ContextError("Completion: expected a non-empty prompt, but got ''.")
        return list(engine.tokenizer.encode(prompt))

    yield from _stream(engine, ids, "Completion", max_new_tokens=max_new_tokens, stop=stop, time_limit_s=time_limit_s)


def _stream(
    engine: ChatModel,
    prompt: Callable[[], list[int]],
    what: str,
    *,
    max_new_tokens: int,
    stop: Sequence[str],
    time_limit_s: float | None,
) -> Iterator[TextChunk]:
    """Greedy tokens after ``prompt()``'s ids as text chunks, held back where a stop sequence may begin."""
    if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise OptionError(f"max_new_tokens: expected an int > 0, but got {max_new_tokens!r}.")
    stops = list(stop)
    if any(not isinstance(s, str) or not s for s in stops):
        raise OptionError(f"stop: expected non-empty strings, but got {stops!r}.")
    if time_limit_s is not None and not time_limit_s > 0:
        raise OptionError(f"time_limit_s: expected a positive number of seconds, but got {time_limit_s!r}.")
    started = time.perf_counter()
    tokenizer = engine.tokenizer
    ids = prompt()
    if len(ids) + 1 > engine.backend.max_context:
        raise ContextError(
            f"{what}: expected the prompt to fit the model's window of {engine.backend.max_context} tokens, but it "
            f"has {len(ids)}."
        )
    limit = min(max_new_tokens, engine.backend.max_context - len(ids))
    eos = tokenizer.eos_ids
    tokens: list[int] = []
    sent = 0
    reason = "length"
    for token in engine.backend.stream_greedy(ids, max_new_tokens=limit):
        if time_limit_s is not None and time.perf_counter() - started > time_limit_s:
            raise RequestTimeout(f"{what}: the reply ran past its time limit of {time_limit_s:g} s.")
        if token in eos:
            reason = "stop"
            break
        tokens.append(token)
        text = tokenizer.decode(tokens)
        cuts = [i for i in (text.find(s) for s in stops) if i >= 0]
        if cuts:
            if min(cuts) > sent:
                yield TextChunk(text[sent : min(cuts)], None, len(ids), len(tokens))
            yield TextChunk("", "stop", len(ids), len(tokens))
            return
        ready = len(text) - _held_back(text, stops)
        if ready > sent:
            yield TextChunk(text[sent:ready], None, len(ids), len(tokens))
            sent = ready
    text = tokenizer.decode(tokens) if tokens else ""
    if len(text) > sent:
        yield TextChunk(text[sent:], None, len(ids), len(tokens))
    yield TextChunk("", reason, len(ids), len(tokens))


def json_chat(
    engine: ChatModel,
    messages: Sequence[ChatMessage],
    *,
    schema: Mapping[str, Any] | None = None,
    max_new_tokens: int = 256,
    time_limit_s: float | None = DEFAULT_TIME_LIMIT_S,
) -> JsonReply:
    """The model's reply to ``messages`` as one JSON value, generated greedily under a JSON grammar (llguidance):
    OpenAI's ``response_format={"type": "json_object"}``. The conversation is rendered with the model's own chat
    template, and every token is masked to keep the reply valid JSON under ``schema``.

    Args:
        engine: A loaded engine.
        messages: The conversation.
        schema: The reply's JSON Schema; ``None`` for any JSON object.
        max_new_tokens: Upper bound on generated tokens (> 0); a reply cut there is closed where it can be.
        time_limit_s: Seconds the reply may take, checked between passes; ``None`` for no limit (default
            :data:`~pcd_engine.limits.DEFAULT_TIME_LIMIT_S`).

    Returns:
        The reply, parsed.

    Raises:
        OptionError: If ``max_new_tokens`` is not a positive int or ``time_limit_s`` is not positive.
        ContextError: If the messages do not fit the model's window.
        SchemaError: If llguidance cannot honour ``schema``.
        RequestTimeout: If the reply runs past ``time_limit_s``.
    """
    from pcd_engine.generate.open_rows import generate_reply
    from pcd_engine.schema import FieldSpec

    if not isinstance(max_new_tokens, int) or isinstance(max_new_tokens, bool) or max_new_tokens < 1:
        raise OptionError(f"max_new_tokens: expected an int > 0, but got {max_new_tokens!r}.")
    if time_limit_s is not None and not time_limit_s > 0:
        raise OptionError(f"time_limit_s: expected a positive number of seconds, but got {time_limit_s!r}.")
    ids = chat_prompt_ids(engine.tokenizer, messages)
    if len(ids) + max_new_tokens > engine.backend.max_context:
        raise ContextError(
            f"Chat: expected the prompt and {max_new_tokens} new tokens to fit the model's window of "
            f"{engine.backend.max_context} tokens, but the prompt has {len(ids)}."
        )
    text = json.dumps(dict(schema) if schema is not None else {"type": "object"}, ensure_ascii=False)
    spec = FieldSpec("reply", "open", (), None, (), schema_json=text, max_tokens=max_new_tokens)
    started = time.perf_counter()

    def check() -> None:
        if time_limit_s is not None and time.perf_counter() - started > time_limit_s:
            raise RequestTimeout(f"Chat: the reply ran past its time limit of {time_limit_s:g} s.")

    out = generate_reply(
        engine.backend, ids, spec=spec, grammars=engine.grammars, tokenizer=engine.tokenizer, check=check
    )
    reason = "length" if out.truncated else "stop"
    return JsonReply(out.value, out.text, reason, len(ids), out.tokens, out.valid)
