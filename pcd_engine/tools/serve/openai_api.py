"""The OpenAI-compatible API: ``GET /v1/models``, ``POST /v1/chat/completions`` and the legacy
``POST /v1/completions`` (the greedy continuation of a raw prompt).

A ``response_format`` of type ``json_schema`` is answered by the engine (closed properties scored, open ones
generated under their schema): the content is the JSON object, and per-field evidence is in the extra top-level
field ``pcd``. A schema pcd cannot constrain (``Any``, free-form objects, recursion) is a 400 with an OpenAI-style
error body. ``json_object`` is the model's reply written under a JSON grammar (any object, always valid JSON);
without a ``response_format`` (or with type ``text``) the reply is free text.

``tools`` are answered by the engine's tool decision (:func:`pcd_engine.tool_calls.decide_tools`, the mechanism behind
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

from pcd_engine.generate.free_text import stream_text
from pcd_engine.result import TokenUsage
from pcd_engine.tools.serve.answers import (
    Answer,
    Ask,
    check_temperature,
    conversation,
    decide,
    decision_headers,
    extract_options,
    function_tool,
    read_request,
    respond,
    stops,
    text_chunks,
    token_limit,
)
from pcd_engine.tools.serve.errors import HTTPError
from pcd_engine.tools.serve.models import ChatCompletionRequest, CompletionRequest, documented
from pcd_engine.tools.serve.server import Server

__all__ = ["field_logprobs", "openai_router"]


def openai_router(server: Server) -> APIRouter:
    """The ``/v1`` routes, served by ``server``."""
    router = APIRouter()
    created = int(time.time())

    @router.get("/v1/models")
    async def models() -> Any:
        entries = [{"id": n, "object": "model", "created": created, "owned_by": "pcd"} for n in server.model_names]
        for name, served in server.heads.items():
            head = served.head
            about = {"base_model": server.model_name, "schema": head.schema_title, "examples": head.examples,
                     "fields": [f.name for f in head.fields], "shadow": served.shadow is not None}  # fmt: skip
            entries.append({"id": name, "object": "model", "created": created, "owned_by": "pcd",
                            "pcd": {"head": about}})  # fmt: skip
        return {"object": "list", "data": entries}

    @router.post("/v1/chat/completions", openapi_extra=documented(ChatCompletionRequest))
    async def chat_completions(request: Request) -> Any:
        body = await read_request(server, request, ChatCompletionRequest)
        ask = _ask(server, body)
        decided = await decide(server, request, ask)
        calls = decided if decided is not None and decided.calls else None
        if calls is None and body.stream and ask.format == "text":
            return await _text_stream(server, body, ask)
        answer = calls or await respond(server, request, ask, chosen=decided)
        reply = _chat_reply(server, body, answer)
        reply.headers.update(decision_headers(answer))
        return reply

    @router.post("/v1/completions", openapi_extra=documented(CompletionRequest))
    async def completions(request: Request) -> Any:
        body = await read_request(server, request, CompletionRequest)
        if server.served(body.model) is not None:
            message = (f"Model {body.model!r}: a fitted head answers the schema it was fitted on; text completions "
                       f"come from the base model {server.model_name!r}.")  # fmt: skip
            raise HTTPError(400, "invalid_request", message, param="model")
        return await _completion_reply(server, body)

    return router


async def _completion_reply(server: Server, body: CompletionRequest) -> Any:
    """The greedy continuation of a raw prompt, as a ``text_completion`` (streamed when asked)."""
    limit = token_limit(16 if body.max_tokens is None else body.max_tokens, server, param="max_tokens")
    check_temperature(body.temperature)  # accepted (the continuation is greedy), but not NaN or negative
    prompt = body.prompt if isinstance(body.prompt, str) else body.prompt[0]
    chunks = stream_text(
        server.engine, prompt, max_new_tokens=limit, stop=stops(body.stop), time_limit_s=server.limits.time_limit_s
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
    usage = _usage(last.prompt_tokens, last.completion_tokens)
    return JSONResponse(_body(completion_id, server.model_name, "text_completion", [choice], usage=usage))


def _body(
    completion_id: str,
    model: str,
    kind: str,
    choices: list[dict[str, Any]],
    *,
    usage: dict[str, int] | None = None,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """An OpenAI object of ``kind`` (``chat.completion``, ``chat.completion.chunk``, ``text_completion``): its
    choices, the usage when given, then pcd's extra fields."""
    body: dict[str, Any] = {"id": completion_id, "object": kind, "created": int(time.time()), "model": model}
    body["choices"] = choices
    if usage is not None:
        body["usage"] = usage
    return {**body, **(extra or {})}


def _sse(
    completion_id: str,
    model: str,
    kind: str,
    choices: list[dict[str, Any]],
    *,
    usage: dict[str, int] | None = None,
    extra: dict[str, Any] | None = None,
) -> str:
    """One Server-Sent Event carrying :func:`_body`."""
    body = _body(completion_id, model, kind, choices, usage=usage, extra=extra)
    return f"data: {json.dumps(body, ensure_ascii=False)}\n\n"


def _ask(server: Server, body: ChatCompletionRequest) -> Ask:
    """A chat completion request as an :class:`~pcd_engine.tools.serve.answers.Ask`.

    Raises:
        HTTPError: 400 for bad messages, tools, response format or limits.
    """
    fmt = body.response_format or {"type": "text"}
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind not in ("json_schema", "json_object", "text", None):
        raise HTTPError(
            400,
            "unsupported_response_format",
            f"response_format: expected type 'json_schema', 'json_object' or 'text', but got {kind!r}.",
            param="response_format",
        )
    tools = []
    for i, raw in enumerate(body.tools or []):
        function = raw.get("function") if raw.get("type") == "function" else None
        if not isinstance(function, dict):
            message = f"tools[{i}]: expected {{'type': 'function', 'function': {{'name': ...}}}}, but got {raw!r}."
            raise HTTPError(400, "invalid_request", message, param="tools")
        parameters = function.get("parameters") or {}
        name, description = function.get("name"), function.get("description")
        tools.append(function_tool(name, description, parameters, where=f"tools[{i}].function", param="tools"))
    schema = (fmt.get("json_schema") or {}).get("schema") if kind == "json_schema" else None
    # the client's token limit caps the whole reply; each open value's (pcd.max_tokens) stays within it
    reply = token_limit(body.token_limit, server, param="max_tokens")
    return Ask(
        conversation=conversation(body.messages),
        options=extract_options(server, body.pcd, body.temperature, reply, model=body.model),
        max_new_tokens=reply,
        tools=tools,
        tool_choice=body.tool_choice,
        parallel=body.parallel_tool_calls is not False,
        format=kind or "text",
        schema=schema,
        stop=stops(body.stop),
        params={"format": "response_format"},
        model=body.model,
        route="/v1/chat/completions",
    )


def _chat_reply(server: Server, body: ChatCompletionRequest, answer: Answer) -> Any:
    """An answer as a ``chat.completion`` (or its two-event stream): content or ``tool_calls``, the finish
    reason, the usage, and pcd's evidence in the extra field ``pcd``."""
    completion_id = _completion_id()
    model = server.reply_name(body.model)
    usage = _usage(answer.prompt_tokens, answer.completion_tokens)
    extra = {"pcd": answer.pcd} if answer.pcd is not None else None
    calls = [
        {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}} for c in answer.calls
    ]
    logprobs = None
    if body.logprobs and answer.pcd is not None:
        logprobs = {"content": field_logprobs(answer.pcd, top=body.top_logprobs or 0), "refusal": None}
    if body.stream:
        delta: dict[str, Any] = {"role": "assistant", "content": answer.content}
        if calls:
            delta["tool_calls"] = [{"index": i, **c} for i, c in enumerate(calls)]
        events = [
            _event(completion_id, model, delta, None, logprobs=logprobs),
            _event(completion_id, model, {}, answer.finish_reason, extra),
        ]
        return _stream_response(events, completion_id, model, usage if body.include_usage else None)
    message: dict[str, Any] = {"role": "assistant", "content": answer.content, "refusal": None}
    if calls:
        message["tool_calls"] = calls
    return _completion(completion_id, model, message, answer.finish_reason, usage, extra, logprobs)


def field_logprobs(pcd: dict[str, Any], *, top: int) -> list[dict[str, Any]]:
    """pcd's evidence as OpenAI ``logprobs.content`` entries, one per scored field, so that clients which keep
    only standard fields (ChatOpenAI's ``response_metadata["logprobs"]``) still see it: the token is
    ``field=value`` (the value as JSON), the logprob the log of the field's probability, and ``top_logprobs`` its
    best alternatives. A tool call gives ``tool=name`` for the choice and ``name.argument=value`` for each scored
    argument. Generated (open) fields have no probability and no entry."""
    import math

    def entry(name: str, value: Any, probability: float, alternatives: list[Any]) -> dict[str, Any]:
        def one(v: Any, p: float) -> dict[str, Any]:
            token = f"{name}={json.dumps(v, ensure_ascii=False)}"
            return {"token": token, "logprob": math.log(p) if p > 0 else -9999.0, "bytes": list(token.encode())}

        return {**one(value, probability), "top_logprobs": [one(v, p) for v, p in alternatives[:top]]}

    def fields(prefix: str, data: dict[str, Any]) -> list[dict[str, Any]]:
        return [
            entry(prefix + name, f["value"], f["probability"], f["alternatives"])
            for name, f in data.items()
            if f.get("probability") is not None
        ]

    if "tool_choice" in pcd:
        choice = pcd["tool_choice"]
        out = [] if choice is None else [entry("tool", choice["value"], choice["probability"], choice["alternatives"])]
        for tool, evidence in pcd["arguments"].items():
            out.extend(fields(f"{tool}.", evidence["fields"]))
        return out
    return fields("", pcd.get("fields", {}))


async def _text_stream(server: Server, body: ChatCompletionRequest, ask: Ask) -> Any:
    """Free text streamed as it is written."""
    chunks = text_chunks(server, ask)
    first = await run_in_threadpool(next, chunks)  # bad input is a 4xx, not a broken stream
    completion_id = _completion_id()
    rest = itertools.chain([first], chunks)
    events = _sse_chunks(completion_id, server.model_name, rest, include_usage=body.include_usage)
    return StreamingResponse(iterate_in_threadpool(events), media_type="text/event-stream")


def _completion_id() -> str:
    return f"chatcmpl-{uuid.uuid4().hex[:24]}"


def _usage(prompt: int, completion: int) -> dict[str, int]:
    return TokenUsage(prompt, completion).chat_completions()


def _completion(
    completion_id: str,
    model: str,
    message: dict[str, Any],
    finish_reason: str | None,
    usage: dict[str, int],
    extra: dict[str, Any] | None,
    logprobs: dict[str, Any] | None = None,
) -> Any:
    choice = {"index": 0, "message": message, "finish_reason": finish_reason, "logprobs": logprobs}
    return JSONResponse(_body(completion_id, model, "chat.completion", [choice], usage=usage, extra=extra))


def _event(
    completion_id: str,
    model: str,
    delta: dict[str, Any],
    finish: str | None,
    extra: dict[str, Any] | None = None,
    *,
    logprobs: dict[str, Any] | None = None,
) -> str:
    """One Server-Sent Event carrying a ``chat.completion.chunk``."""
    choice = {"index": 0, "delta": delta, "finish_reason": finish, "logprobs": logprobs}
    return _sse(completion_id, model, "chat.completion.chunk", [choice], extra=extra)


def _usage_event(completion_id: str, model: str, usage: dict[str, int]) -> str:
    """The last chunk ``stream_options.include_usage`` asks for: no choices, the usage."""
    return _sse(completion_id, model, "chat.completion.chunk", [], usage=usage)


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
