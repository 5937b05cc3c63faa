"""The OpenAI-compatible API: ``GET /v1/models``, ``POST /v1/chat/completions`` and the legacy
``POST /v1/completions`` (the greedy continuation of a raw prompt).

A ``response_format`` of type ``json_schema`` is answered by the engine (closed properties scored, open ones
generated under their schema): the content is the JSON object, and per-field evidence is in the extra top-level
field ``pcd``. A schema pcd cannot constrain (``Any``, free-form objects, recursion) is a 400 with an OpenAI-style
error body. ``json_object`` is the model's reply written under a JSON grammar (any object, always valid JSON);
without a ``response_format`` (or with type ``text``) the reply is free text.

``tools`` are answered by the engine's tool decision (:func:`pcd_engine.calls.decide_tools`, the mechanism behind
``ChatPCD.bind_tools``): which tool to call (or, under ``tool_choice="auto"``, whether to answer instead) is one
scored question over the conversation, tool calls and tool results included; the chosen tools' arguments are
filled as their schemas, so every call names a real tool and its arguments validate. The reply carries
``message.tool_calls`` with ids and JSON arguments, ``finish_reason="tool_calls"``, and the choice's
probabilities in ``pcd``.

Nothing is silently ignored: a field pcd cannot honour is a 400 naming it (see
:meth:`~pcd_engine.tools.serve.models.ChatCompletionRequest.refused`).
"""

from __future__ import annotations

import itertools
import json
import time
import uuid
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.concurrency import iterate_in_threadpool, run_in_threadpool

from pcd_engine.calls import Tool, ToolDecision, called_text, choice_of, decide_tools, tool_result_text
from pcd_engine.chat import ChatMessage, document_text, json_chat, stream_chat, stream_text
from pcd_engine.errors import OptionError, SchemaError
from pcd_engine.options import ExtractOptions
from pcd_engine.schema import compile_schema
from pcd_engine.tools.serve.app import Server
from pcd_engine.tools.serve.errors import HTTPError
from pcd_engine.tools.serve.models import ChatCompletionRequest, CompletionRequest, parse_body

__all__ = ["openai_router"]


def openai_router(server: Server) -> APIRouter:
    """The ``/v1`` routes, served by ``server``."""
    router = APIRouter()
    created = int(time.time())

    @router.get("/v1/models")
    async def models() -> Any:
        entries = [{"id": n, "object": "model", "created": created, "owned_by": "pcd"} for n in server.model_names]
        return {"object": "list", "data": entries}

    @router.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Any:
        body = parse_body(ChatCompletionRequest, await server.read_json(request))
        server.check_model(body.model)
        refused = body.refused()
        if refused is not None:
            raise HTTPError(400, "unsupported_parameter", refused[1], param=refused[0])
        messages = _messages(body.messages)
        fmt = body.response_format or {"type": "text"}
        kind = fmt.get("type") if isinstance(fmt, dict) else None
        if kind not in ("json_schema", "json_object", "text", None):
            raise HTTPError(
                400,
                "unsupported_response_format",
                f"response_format: expected type 'json_schema', 'json_object' or 'text', but got {kind!r}.",
                param="response_format",
            )
        if body.tools:
            decision = await _decide_tools(server, request, body, messages)
            if not decision.answer:
                return _tool_calls_reply(server, body, decision)
        if kind == "json_schema":
            return await _json_schema_reply(server, request, body, messages, fmt)
        if kind == "json_object":
            return await _json_object_reply(server, body, messages)
        return await _text_reply(server, body, messages)

    @router.post("/v1/completions")
    async def completions(request: Request) -> Any:
        body = parse_body(CompletionRequest, await server.read_json(request))
        server.check_model(body.model)
        refused = body.refused()
        if refused is not None:
            raise HTTPError(400, "unsupported_parameter", refused[1], param=refused[0])
        return await _completion_reply(server, body)

    return router


async def _completion_reply(server: Server, body: CompletionRequest) -> Any:
    """The greedy continuation of a raw prompt, as a ``text_completion`` (streamed when asked)."""
    limit = 16 if body.max_tokens is None else body.max_tokens
    if limit < 1:
        raise HTTPError(400, "invalid_request", "max_tokens: expected a positive integer.", param="max_tokens")
    prompt = body.prompt if isinstance(body.prompt, str) else body.prompt[0]
    stop = [body.stop] if isinstance(body.stop, str) else list(body.stop or [])
    chunks = stream_text(
        server.engine,
        prompt,
        max_new_tokens=min(limit, server.max_new_tokens),
        stop=stop,
        time_limit_s=server.limits.time_limit_s,
    )
    first = await run_in_threadpool(next, chunks)  # bad input is a 4xx, not a broken stream
    completion_id = f"cmpl-{uuid.uuid4().hex[:24]}"

    def text_chunk(text: str, finish: str | None) -> str:
        choice = {"index": 0, "text": text, "finish_reason": finish, "logprobs": None}
        return _sse(completion_id, server.model_name, "text_completion", [choice])

    if body.stream:

        def events() -> Iterator[str]:
            last = None
            for chunk in itertools.chain([first], chunks):
                last = chunk
                if chunk.text or chunk.finish_reason is not None:
                    yield text_chunk(chunk.text, chunk.finish_reason)
            if body.include_usage and last is not None:
                usage = _usage(last.prompt_tokens, last.completion_tokens)
                yield _sse(completion_id, server.model_name, "text_completion", [], usage=usage)
            yield "data: [DONE]\n\n"

        return StreamingResponse(iterate_in_threadpool(events()), media_type="text/event-stream")
    pieces = [first, *await run_in_threadpool(list, chunks)]
    last = pieces[-1]
    text = "".join(p.text for p in pieces)
    choice = {"index": 0, "text": text, "finish_reason": last.finish_reason, "logprobs": None}
    return JSONResponse(
        {
            "id": completion_id,
            "object": "text_completion",
            "created": int(time.time()),
            "model": server.model_name,
            "choices": [choice],
            "usage": _usage(last.prompt_tokens, last.completion_tokens),
        }
    )


def _sse(
    completion_id: str, model: str, kind: str, choices: list[dict[str, Any]], usage: dict[str, int] | None = None
) -> str:
    """One Server-Sent Event of a streamed ``kind`` (``text_completion``), usage included when given."""
    body: dict[str, Any] = {"id": completion_id, "object": kind, "created": int(time.time()), "model": model}
    body["choices"] = choices
    if usage is not None:
        body["usage"] = usage
    return f"data: {json.dumps(body, ensure_ascii=False)}\n\n"


def _tools(body: ChatCompletionRequest) -> list[Tool]:
    """The request's function tools.

    Raises:
        HTTPError: 400 for a tool that is not a function with a name, or parameters that are not an object.
    """
    out = []
    for i, raw in enumerate(body.tools or []):
        function = raw.get("function") if raw.get("type") == "function" else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            message = f"tools[{i}]: expected {{'type': 'function', 'function': {{'name': ...}}}}, but got {raw!r}."
            raise HTTPError(400, "invalid_request", message, param="tools")
        parameters = function.get("parameters") or {}
        if not isinstance(parameters, dict):
            message = f"tools[{i}].function.parameters: expected a JSON Schema object, but got {parameters!r}."
            raise HTTPError(400, "invalid_request", message, param="tools")
        out.append(Tool(function["name"], function.get("description"), parameters))
    return out


async def _decide_tools(
    server: Server, request: Request, body: ChatCompletionRequest, messages: list[ChatMessage]
) -> ToolDecision:
    """The engine's decision: which tools to call, with their arguments, or to answer."""
    tools = _tools(body)
    try:
        choice = choice_of(body.tool_choice, [t.name for t in tools])
    except OptionError as exc:
        raise HTTPError(400, "invalid_request", str(exc), param="tool_choice") from None
    parallel = body.parallel_tool_calls is not False and len(tools) > 1
    document = document_text([m.content for m in messages])
    try:
        decision: ToolDecision = await server.run_engine(
            request, decide_tools, server.engine, document, tools, choice=choice, parallel=parallel,
            options=_call_options(server, body), limits=server.limits,
        )  # fmt: skip
    except SchemaError as exc:
        raise HTTPError(400, "unsupported_schema", str(exc), param="tools") from None
    return decision


def _tool_calls_reply(server: Server, body: ChatCompletionRequest, decision: ToolDecision) -> Any:
    """The decided calls as OpenAI ``tool_calls`` (ids, JSON arguments), ``finish_reason="tool_calls"``."""
    arguments = [json.dumps(c.arguments, ensure_ascii=False) for c in decision.calls]
    calls: list[dict[str, Any]] = [
        {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function", "function": {"name": c.name, "arguments": a}}
        for c, a in zip(decision.calls, arguments, strict=True)
    ]
    results = [c.result for c in decision.calls if c.result is not None]
    prompt = max((r.stats.prompt_tokens for r in results), default=0)
    completion = sum(len(server.engine.tokenizer.encode(a)) for a in arguments)
    extra = {"pcd": decision.evidence()}
    usage = _usage(prompt, completion)
    completion_id = _completion_id()
    if body.stream:
        delta = {"role": "assistant", "content": None, "tool_calls": [{"index": i, **c} for i, c in enumerate(calls)]}
        events = [
            _event(completion_id, server.model_name, delta, None),
            _event(completion_id, server.model_name, {}, "tool_calls", extra),
        ]
        return _stream_response(events, completion_id, server.model_name, usage if body.include_usage else None)
    message = {"role": "assistant", "content": None, "refusal": None, "tool_calls": calls}
    return _completion(completion_id, server.model_name, message, "tool_calls", usage, extra)


def _call_options(server: Server, body: ChatCompletionRequest) -> ExtractOptions:
    """The ``pcd`` options, with OpenAI's ``temperature`` and token limit laid over them."""
    options = server.client_options(body.pcd, where="pcd")
    temperature = body.temperature
    if isinstance(temperature, (int, float)) and not isinstance(temperature, bool) and temperature > 0:
        options = ExtractOptions(temperature=temperature).over(options)
    budget = body.token_limit
    if budget is not None:  # the token limit of each generated value (the rows run side by side)
        if budget < 1:
            raise HTTPError(400, "invalid_request", "max_tokens: expected a positive integer.", param="max_tokens")
        options = ExtractOptions(max_tokens=budget).over(options)
    return options


async def _json_schema_reply(
    server: Server, request: Request, body: ChatCompletionRequest, messages: list[ChatMessage], fmt: dict[str, Any]
) -> Any:
    """The engine's answer to a ``json_schema`` response format."""
    schema = (fmt.get("json_schema") or {}).get("schema")
    if not isinstance(schema, dict):
        message = "response_format.json_schema.schema: expected an object."
        raise HTTPError(400, "invalid_request", message, param="response_format")
    try:
        compiled = compile_schema(schema)
    except SchemaError as exc:
        raise HTTPError(400, "unsupported_schema", str(exc), param="response_format") from None
    document = document_text([m.content for m in messages])
    result = await server.extract(request, document, compiled, _call_options(server, body))
    content = json.dumps(result.values, ensure_ascii=False)
    completion_tokens = len(server.engine.tokenizer.encode(content))
    pcd = {k: v for k, v in result.to_json().items() if k != "values"}
    usage = _usage(result.stats.prompt_tokens, completion_tokens)
    return _reply(
        _completion_id(),
        server.model_name,
        content,
        "stop",
        usage,
        stream=body.stream,
        include_usage=body.include_usage,
        extra={"pcd": pcd},
    )


async def _json_object_reply(server: Server, body: ChatCompletionRequest, messages: list[ChatMessage]) -> Any:
    """A JSON object, written by the model under a JSON grammar (:func:`pcd_engine.chat.json_chat`)."""
    limit = body.token_limit or server.max_new_tokens
    if limit < 1:
        raise HTTPError(400, "invalid_request", "max_tokens: expected a positive integer.", param="max_tokens")
    reply = await run_in_threadpool(
        json_chat,
        server.engine,
        messages,
        max_new_tokens=min(limit, server.max_new_tokens),
        time_limit_s=server.limits.time_limit_s,
    )
    usage = _usage(reply.prompt_tokens, reply.completion_tokens)
    return _reply(
        _completion_id(),
        server.model_name,
        reply.text,
        reply.finish_reason,
        usage,
        stream=body.stream,
        include_usage=body.include_usage,
    )


async def _text_reply(server: Server, body: ChatCompletionRequest, messages: list[ChatMessage]) -> Any:
    """Free text, written by the model (streamed when asked)."""
    limit = body.token_limit or server.max_new_tokens
    if limit < 1:
        raise HTTPError(400, "invalid_request", "max_tokens: expected a positive integer.", param="max_tokens")
    stop = [body.stop] if isinstance(body.stop, str) else list(body.stop or [])
    chunks = stream_chat(server.engine, messages, max_new_tokens=min(limit, server.max_new_tokens), stop=stop)
    # The first chunk is computed before answering, so bad input is a 4xx, not a broken stream.
    first = await run_in_threadpool(next, chunks)
    completion_id = _completion_id()
    if body.stream:
        rest = itertools.chain([first], chunks)
        events = _sse_chunks(completion_id, server.model_name, rest, include_usage=body.include_usage)
        return StreamingResponse(iterate_in_threadpool(events), media_type="text/event-stream")
    pieces = [first, *await run_in_threadpool(list, chunks)]
    last = pieces[-1]
    usage = _usage(last.prompt_tokens, last.completion_tokens)
    text = "".join(p.text for p in pieces)
    return _reply(completion_id, server.model_name, text, last.finish_reason, usage)


def _completion_id() -> str:
    return f"chatcmpl-{uuid.uuid4().hex[:24]}"


def _messages(raw: Any) -> list[ChatMessage]:
    """The conversation as chat turns: an assistant turn's ``tool_calls`` and a tool turn's result are labelled
    text (the result by the name of the call it answers), as :mod:`pcd_engine.calls` reads them.

    Raises:
        HTTPError: 400 for a message without a role, content that is not text (images, audio, files), or an
            unknown role.
    """
    if not isinstance(raw, list) or not raw:
        raise HTTPError(400, "invalid_request", "messages: expected a non-empty list.", param="messages")
    names: dict[str, str] = {}
    out = []
    for i, m in enumerate(raw):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise HTTPError(400, "invalid_request", f"messages[{i}]: expected an object with a role.", param="messages")
        role = m["role"]
        if role not in _ROLES:
            message = f"messages[{i}].role: expected one of {sorted(_ROLES)}, but got {role!r}."
            raise HTTPError(400, "invalid_request", message, param="messages")
        content = m.get("content")
        if isinstance(content, list):
            content = "".join(_text_part(i, j, p) for j, p in enumerate(content))
        if content is None and (role == "assistant" and m.get("tool_calls")):
            content = ""
        if not isinstance(content, str):
            raise HTTPError(400, "invalid_request", f"messages[{i}].content: expected text.", param="messages")
        calls = [c.get("function") or {} for c in m.get("tool_calls") or [] if isinstance(c, dict)]
        names.update({str(c.get("id")): str((c.get("function") or {}).get("name")) for c in m.get("tool_calls") or []})
        if calls:
            made = called_text([(str(c.get("name")), _arguments(c.get("arguments"))) for c in calls])
            content = "\n".join(t for t in (content, made) if t)
        if role == "tool":
            call_id = str(m.get("tool_call_id", ""))
            content = tool_result_text(names.get(call_id) or str(m.get("name") or call_id or "tool"), content)
        out.append(ChatMessage(_ROLES[role], content))
    return out


# OpenAI roles as chat-template roles: tool results reach the model as user turns (labelled).
_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant", "tool": "user"}


def _text_part(i: int, j: int, part: Any) -> str:
    """A content part's text.

    Raises:
        HTTPError: 400 for a part that is not text: pcd reads text only, and does not drop the rest silently.
    """
    if isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str):
        return str(part["text"])
    kind = part.get("type") if isinstance(part, dict) else type(part).__name__
    message = f"messages[{i}].content[{j}]: expected a text part, but got {kind!r}; pcd reads text only."
    raise HTTPError(400, "unsupported_content", message, param="messages")


def _arguments(raw: Any) -> dict[str, Any]:
    """A past call's arguments (OpenAI sends them as a JSON string)."""
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except json.JSONDecodeError:
            return {"arguments": raw}
    return raw if isinstance(raw, dict) else {}


def _usage(prompt: int, completion: int) -> dict[str, int]:
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def _reply(
    completion_id: str,
    model: str,
    content: str,
    finish_reason: str | None,
    usage: dict[str, int],
    *,
    stream: bool = False,
    include_usage: bool = False,
    extra: dict[str, Any] | None = None,
) -> Any:
    """A whole answer, as one completion or as a stream of two events (the content, then the finish)."""
    if stream:
        events = [
            _event(completion_id, model, {"role": "assistant", "content": content}, None),
            _event(completion_id, model, {}, finish_reason or "stop", extra),
        ]
        return _stream_response(events, completion_id, model, usage if include_usage else None)
    message = {"role": "assistant", "content": content, "refusal": None}
    return _completion(completion_id, model, message, finish_reason, usage, extra)


def _completion(
    completion_id: str,
    model: str,
    message: dict[str, Any],
    finish_reason: str | None,
    usage: dict[str, int],
    extra: dict[str, Any] | None,
) -> Any:
    body = {
        "id": completion_id,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": finish_reason, "logprobs": None}],
        "usage": usage,
        **(extra or {}),
    }
    return JSONResponse(body)


def _event(
    completion_id: str, model: str, delta: dict[str, Any], finish: str | None, extra: dict[str, Any] | None = None
) -> str:
    """One Server-Sent Event carrying a ``chat.completion.chunk``."""
    body = {
        "id": completion_id,
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}],
        **(extra or {}),
    }
    return f"data: {json.dumps(body, ensure_ascii=False)}\n\n"


def _usage_event(completion_id: str, model: str, usage: dict[str, int]) -> str:
    """The last chunk ``stream_options.include_usage`` asks for: no choices, the usage."""
    body = {
        "id": completion_id,
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": model,
        "choices": [],
        "usage": usage,
    }
    return f"data: {json.dumps(body)}\n\n"


def _stream_response(
    events: Sequence[str], completion_id: str, model: str, usage: dict[str, int] | None
) -> StreamingResponse:
    async def send() -> AsyncIterator[str]:
        for event in events:
            yield event
        if usage is not None:
            yield _usage_event(completion_id, model, usage)
        yield "data: [DONE]\n\n"

    return StreamingResponse(send(), media_type="text/event-stream")


def _sse_chunks(completion_id: str, model: str, chunks: Iterator[Any], *, include_usage: bool) -> Iterator[str]:
    last = None
    for chunk in chunks:
        last = chunk
        if chunk.text:
            yield _event(completion_id, model, {"role": "assistant", "content": chunk.text}, None)
        if chunk.finish_reason is not None:
            yield _event(completion_id, model, {}, chunk.finish_reason)
    if include_usage and last is not None:
        yield _usage_event(completion_id, model, _usage(last.prompt_tokens, last.completion_tokens))
    yield "data: [DONE]\n\n"
