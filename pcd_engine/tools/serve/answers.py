"""What the OpenAI-style routes share: a request read into one :class:`Ask`, answered as one :class:`Answer`.

Chat Completions and Responses differ in shape, not in substance: both carry a conversation (with tool calls and
tool results), tools with a choice, and an answer format (free text, a JSON object, or a JSON Schema). Each
route reads its body into an :class:`Ask`; :func:`answer` decides the tools (the engine's scored decision, see
:mod:`pcd_engine.tool_calls`) and, when the model answers instead, writes the content; the route then puts the
:class:`Answer` in its own shape.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal, TypeVar

from fastapi import Request
from starlette.concurrency import run_in_threadpool

from pcd_engine.errors import ContextError, OptionError, SchemaError, check_count
from pcd_engine.generate.free_text import ChatMessage, TextChunk, json_chat, stream_chat
from pcd_engine.options import ExtractOptions, surface_options
from pcd_engine.prompt.transcript import Conversation, openai_conversation
from pcd_engine.schema import compile_schema
from pcd_engine.tool_calls import Tool, ToolDecision, choice_of, decide_tools
from pcd_engine.tools.serve.errors import HTTPError
from pcd_engine.tools.serve.models import (
    ChatCompletionRequest,
    CompletionRequest,
    DecisionsRequest,
    ResponsesRequest,
    SystemOneRequest,
    parse_body,
)
from pcd_engine.tools.serve.server import DECISION_ID_HEADER, Server

__all__ = [
    "Answer",
    "Ask",
    "Call",
    "read_request",
    "conversation",
    "decide",
    "decision_headers",
    "extract_options",
    "function_tool",
    "respond",
    "schema_in_prompt",
    "stops",
    "text_chunks",
    "token_limit",
]

Format = Literal["text", "json_object", "json_schema"]
R = TypeVar("R", ChatCompletionRequest, CompletionRequest, ResponsesRequest, DecisionsRequest, SystemOneRequest)


async def read_request(server: Server, request: Request, model: type[R]) -> R:
    """An OpenAI route's body, read within the server's limits, validated, for a model the server serves, with
    every field honoured.

    Raises:
        HTTPError: 4xx for a bad body, 404 for an unknown model, 400 naming a field pcd cannot honour.
    """
    body = parse_body(model, await server.read_json(request))
    server.check_model(body.model)
    refused = body.refused()
    if refused is not None:
        raise HTTPError(400, "unsupported_parameter", refused[1], param=refused[0])
    return body


@dataclass(frozen=True)
class Ask:
    """One request, whichever route it came in on.

    Attributes:
        conversation: The conversation, tool calls and results included (:func:`conversation`).
        options: Extraction options for scored answers (``pcd``, ``temperature``, the token limit).
        max_new_tokens: Token limit of free text and JSON objects (already capped by the server).
        tools: Function tools; empty for none.
        tool_choice: The route's tool choice, as :func:`pcd_engine.tool_calls.choice_of` reads it.
        parallel: Let the model call several tools.
        format: What the answer is when no tool is called.
        schema: The JSON Schema of a ``json_schema`` answer.
        stop: Stop strings of free text.
        params: The route's names of its fields (``tool_choice``, ``format``, ``tools``), for error messages.
        model: The model the request names (a served head's name decides its schema with that head).
        route: The route, as the log names it.
    """

    conversation: Conversation
    options: ExtractOptions
    max_new_tokens: int
    tools: list[Tool] = field(default_factory=list)
    tool_choice: object = None
    parallel: bool = True
    format: Format = "text"
    schema: dict[str, Any] | None = None
    stop: list[str] = field(default_factory=list)
    params: dict[str, str] = field(default_factory=dict)
    model: Any = None
    route: str = ""

    def param(self, name: str) -> str:
        """The route's name of a field."""
        return self.params.get(name, name)

    @property
    def messages(self) -> list[ChatMessage]:
        """The conversation's turns as the chat template renders them (free text and JSON objects)."""
        return self.conversation.chat()

    @property
    def document(self) -> str:
        """The text a decision is made on (a tool choice, a scored answer)."""
        return self.conversation.document

    @property
    def done(self) -> list[tuple[str, Any]]:
        """The tool calls already made and answered in the conversation, which the tool decision does not
        repeat."""
        return self.conversation.answered_calls()


@dataclass(frozen=True)
class Call:
    """One decided tool call: an id, the tool, and its arguments as JSON text."""

    id: str
    name: str
    arguments: str


@dataclass(frozen=True)
class Answer:
    """The answer to an :class:`Ask`.

    Attributes:
        content: The text (free text or JSON); ``None`` when tools are called.
        calls: The tool calls; empty when the model answers.
        finish_reason: ``"stop"``, ``"length"`` or ``"tool_calls"``.
        prompt_tokens: Tokens of the prompt.
        completion_tokens: Tokens written.
        pcd: pcd's evidence (per-field probabilities, the tool choice), or ``None`` for free text.
    """

    content: str | None
    calls: tuple[Call, ...]
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    pcd: dict[str, Any] | None


async def respond(server: Server, request: Request, ask: Ask, *, chosen: Answer | None = None) -> Answer:
    """The answer in ``ask.format`` (tools aside: see :func:`decide`): a scored JSON Schema, a JSON object under
    a grammar, or free text; ``chosen``, :func:`decide`'s decision to answer, puts the tool choice's evidence in
    the answer's ``pcd``.

    A ``json_object`` request whose system (or developer) turns carry a JSON Schema, as instructor's
    ``Mode.JSON`` sends it, is answered as that schema (see :func:`schema_in_prompt`); the evidence then says
    ``"schema_source": "prompt"``.

    Raises:
        HTTPError: 400 for a schema pcd cannot honour.
    """
    answer = await _respond(server, request, ask)
    if chosen is not None and chosen.pcd:
        return replace(answer, pcd={**(answer.pcd or {}), **chosen.pcd})
    return answer


async def _respond(server: Server, request: Request, ask: Ask) -> Answer:
    if ask.format == "json_schema":
        return await _scored(server, request, ask)
    found = schema_in_prompt(ask.conversation) if ask.format == "json_object" else None
    if found is not None:
        schema, rest = found
        answer = await _scored(server, request, replace(ask, schema=schema, conversation=rest))
        return replace(answer, pcd={**(answer.pcd or {}), "schema_source": "prompt"})
    _refuse_head(server, ask, "free text and JSON objects")
    if ask.format == "json_object":
        reply = await run_in_threadpool(
            json_chat,
            server.engine,
            ask.messages,
            max_new_tokens=ask.max_new_tokens,
            time_limit_s=server.limits.time_limit_s,
        )
        return Answer(reply.text, (), reply.finish_reason, reply.prompt_tokens, reply.completion_tokens, None)
    pieces = await run_in_threadpool(list, text_chunks(server, ask))
    text = "".join(p.text for p in pieces)
    last = pieces[-1]
    return Answer(text, (), str(last.finish_reason), last.prompt_tokens, last.completion_tokens, None)


def text_chunks(server: Server, ask: Ask) -> Iterator[TextChunk]:
    """The free-text reply, chunk by chunk (for routes that stream it as it is written).

    Raises:
        HTTPError: 400 when the request names a served head (free text comes from the base model).
    """
    _refuse_head(server, ask, "free text and JSON objects")
    return stream_chat(
        server.engine,
        ask.messages,
        max_new_tokens=ask.max_new_tokens,
        stop=ask.stop,
        time_limit_s=server.limits.time_limit_s,
    )


async def decide(server: Server, request: Request, ask: Ask) -> Answer | None:
    """The tool calls the engine decides on; when it decides to answer, an answer without calls that carries the
    decision's evidence (for :func:`respond`'s ``chosen``); ``None`` without tools.

    Raises:
        HTTPError: 400 for a tool choice that names no tool, or tool parameters pcd cannot fill.
    """
    if not ask.tools:
        return None
    _refuse_head(server, ask, "tool calls")
    try:
        choice = choice_of(ask.tool_choice, [t.name for t in ask.tools])
    except OptionError as exc:
        raise HTTPError(400, "invalid_request", str(exc), param=ask.param("tool_choice")) from None
    parallel = ask.parallel and len(ask.tools) > 1
    document = ask.document
    try:
        decision: ToolDecision = await server.run_engine(
            request, decide_tools, server.engine, document, ask.tools, choice=choice, parallel=parallel,
            options=ask.options, done=ask.done, limits=server.limits,
        )  # fmt: skip
    except SchemaError as exc:
        raise HTTPError(400, "unsupported_schema", str(exc), param=ask.param("tools")) from None
    if decision.answer:
        return Answer(None, (), "stop", 0, 0, decision.evidence())
    calls = tuple(Call(c.id, c.name, json.dumps(c.arguments, ensure_ascii=False)) for c in decision.calls)
    results = [c.result for c in decision.calls if c.result is not None]
    prompt = max((r.stats.prompt_tokens for r in results), default=0)
    written = sum(len(server.engine.tokenizer.encode(c.arguments)) for c in calls)
    return Answer(None, calls, "tool_calls", prompt, written, decision.evidence())


async def _scored(server: Server, request: Request, ask: Ask) -> Answer:
    """The engine's answer to a JSON Schema: closed properties scored, open ones generated."""
    if not isinstance(ask.schema, dict):
        raise HTTPError(400, "invalid_request", f"{ask.param('format')}: expected a JSON Schema object.",
                        param=ask.param("format"))  # fmt: skip
    try:
        compiled = compile_schema(ask.schema)
    except SchemaError as exc:
        raise HTTPError(400, "unsupported_schema", str(exc), param=ask.param("format")) from None
    decided = await server.decide(request, ask.document, compiled, ask.options, route=ask.route, model=ask.model)
    result = decided.result
    content = json.dumps(result.values, ensure_ascii=False)
    written = len(server.engine.tokenizer.encode(content))
    pcd = {k: v for k, v in result.to_json().items() if k != "values"}
    if decided.id is not None:
        pcd["decision_id"] = decided.id
    return Answer(content, (), "stop", result.stats.prompt_tokens, written, pcd)


def _refuse_head(server: Server, ask: Ask, what: str) -> None:
    """Refuse ``what`` (free text, tool calls) from a served head: a head decides its schema's fields only.

    Raises:
        HTTPError: 400 naming the model, when the request names a served head.
    """
    served = server.served(ask.model)
    if served is not None:
        message = (f"Model {served.name!r}: a fitted head answers the schema it was fitted on (a json_schema "
                   f"answer); {what} come from the base model {server.model_name!r}.")  # fmt: skip
        raise HTTPError(400, "invalid_request", message, param="model")


def decision_headers(answer: Answer) -> dict[str, str]:
    """The response headers of an answer: the logged decision's id, when it has one."""
    ident = (answer.pcd or {}).get("decision_id")
    return {} if ident is None else {DECISION_ID_HEADER: ident}


# ------------------------------------------------------------------------------------------------ reading


def schema_in_prompt(conversation: Conversation) -> tuple[dict[str, Any], Conversation] | None:
    """The JSON Schema a client wrote into the instructions of a ``json_object`` request, and the conversation
    without it.

    Clients that ask for a JSON object often put the schema in the system turn instead of the request
    (instructor's ``Mode.JSON``, LangChain's JSON-format instructions). The last JSON object in a system turn
    that pcd can compile as an object schema (a ``properties`` mapping) is taken; its text is cut from that
    turn, since the scored answer states the schema itself.

    Args:
        conversation: The conversation.

    Returns:
        ``(schema, conversation)``, or ``None`` when no system turn carries a schema pcd compiles.
    """
    decoder = json.JSONDecoder()
    turns = conversation.turns
    for index in range(len(turns) - 1, -1, -1):
        turn = turns[index]
        if turn.role != "system":
            continue
        found: tuple[dict[str, Any], int, int] | None = None
        start = turn.text.find("{")
        while start != -1:
            try:
                value, end = decoder.raw_decode(turn.text, start)
            except ValueError:
                start = turn.text.find("{", start + 1)
                continue
            if isinstance(value, dict) and isinstance(value.get("properties"), dict) and _compiles(value):
                found = (value, start, end)
            start = turn.text.find("{", end)
        if found is not None:
            schema, start, end = found
            rest = (turn.text[:start] + turn.text[end:]).strip()
            kept = [*turns[:index], *([replace(turn, text=rest)] if rest else []), *turns[index + 1 :]]
            return schema, Conversation(tuple(kept))
    return None


def _compiles(schema: dict[str, Any]) -> bool:
    try:
        compile_schema(schema)
    except SchemaError:
        return False
    return True


def function_tool(name: Any, description: Any, parameters: Any, *, where: str, param: str) -> Tool:
    """A function tool from its parts.

    Raises:
        HTTPError: 400 when the name is not a string or the parameters are not an object.
    """
    if not isinstance(name, str) or not name:
        raise HTTPError(400, "invalid_request", f"{where}: expected a function with a name.", param=param)
    if not isinstance(parameters, dict):
        message = f"{where}.parameters: expected a JSON Schema object, but got {parameters!r}."
        raise HTTPError(400, "invalid_request", message, param=param)
    return Tool(name, description if isinstance(description, str) else None, parameters)


def conversation(raw: Any, *, param: str = "messages") -> Conversation:
    """Chat Completions messages as the conversation every surface reads
    (:func:`~pcd_engine.prompt.transcript.openai_conversation`).

    Raises:
        HTTPError: 400 for a message without a known role, or content that is not text (images, audio, files are
            refused, not dropped).
    """
    try:
        return openai_conversation(raw, where=param)
    except ContextError as exc:
        raise HTTPError(400, "invalid_request", str(exc), param=param) from None


def token_limit(value: int | None, server: Server, *, param: str) -> int:
    """A request's token limit for free text: its own, or the server's when it names none.

    Raises:
        HTTPError: 400 when it is not positive, or above the server's (never cut down without a word).
    """
    _check_limit(value, param)
    if value is not None and value > server.max_new_tokens:
        raise HTTPError(
            400,
            "invalid_request",
            f"{param}: expected at most {server.max_new_tokens} tokens (this server's --max-new-tokens), but got "
            f"{value}.",
            param=param,
        )
    return value or server.max_new_tokens


def _check_limit(value: int | None, param: str) -> None:
    """A token limit as the request names it: ``None`` or an integer >= 1 (:func:`check_count`), else a 400."""
    try:
        check_count(value, param)
    except OptionError as exc:
        raise HTTPError(400, "invalid_request", str(exc), param=param) from None


def extract_options(
    server: Server, pcd: Any, temperature: Any, reply_tokens: int, *, model: Any = None
) -> ExtractOptions:
    """The ``pcd`` options with OpenAI's ``temperature`` laid over them, and each open value's token limit kept
    within the reply's.

    Two limits, two numbers: the client's token limit (``max_tokens``, ``max_completion_tokens``,
    ``max_output_tokens``; :func:`token_limit`) caps the whole reply, and ``pcd.max_tokens`` (the engine's default
    when unnamed) caps each generated value of a structured reply. A value is part of the reply, so its limit is the
    smaller of the two; a field's own ``maxLength``-derived limit still wins below it.

    Args:
        server: The server (its client options and engine defaults).
        pcd: The request's ``pcd`` options.
        temperature: OpenAI's temperature (positive: reshapes the probabilities; 0 or ``None``: the engine's).
        reply_tokens: The reply's token limit, already checked (:func:`token_limit`).
        model: The model the request names (a served head's name adds its head).

    Raises:
        HTTPError: 400 for a bad option.
    """
    options = server.client_options(pcd, where="pcd", model=model)
    check_temperature(temperature)
    layered = surface_options(temperature=temperature).over(options)
    per_value = server.engine.resolve(layered).value_tokens
    return surface_options(max_tokens=min(per_value, reply_tokens)).over(layered)


def check_temperature(temperature: Any) -> None:
    """OpenAI's ``temperature`` as the Python API takes it: none, or a number >= 0 (NaN, negatives, strings and
    booleans refused, as everywhere else).

    Raises:
        HTTPError: 400 naming ``temperature``.
    """
    try:
        surface_options(temperature=temperature)
    except OptionError as exc:
        raise HTTPError(400, "invalid_request", str(exc), param="temperature") from None


def stops(raw: str | Sequence[str] | None) -> list[str]:
    """Stop strings as a list."""
    return [raw] if isinstance(raw, str) else list(raw or [])
