"""The OpenAI-compatible API: ``GET /v1/models`` and ``POST /v1/chat/completions``.

A ``response_format`` of type ``json_schema`` is answered by the engine (closed properties scored, open ones
generated under their schema): the content is the JSON object, and per-field evidence is in the extra top-level
field ``pcd``. A schema pcd cannot constrain (``Any``, free-form objects, recursion) is a 400 with an OpenAI-style
error body; without a ``response_format`` (or with type ``text``) the reply is free text.
"""

from __future__ import annotations

import itertools
import json
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.concurrency import iterate_in_threadpool, run_in_threadpool

from pcd_engine.chat import ChatMessage, document_text, stream_chat
from pcd_engine.errors import SchemaError
from pcd_engine.options import ExtractOptions
from pcd_engine.schema import compile_schema
from pcd_engine.tools.serve.app import Server
from pcd_engine.tools.serve.errors import HTTPError
from pcd_engine.tools.serve.models import ChatCompletionRequest, parse_body

__all__ = ["openai_router"]


def openai_router(server: Server) -> APIRouter:
    """The ``/v1`` routes, served by ``server``."""
    router = APIRouter()
    created = int(time.time())

    @router.get("/v1/models")
    async def models() -> Any:
        entry = {"id": server.model_name, "object": "model", "created": created, "owned_by": "pcd"}
        return {"object": "list", "data": [entry]}

    @router.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Any:
        body = parse_body(ChatCompletionRequest, await server.read_json(request))
        if body.model != server.model_name:
            message = f"Model {body.model!r}: this server serves {server.model_name!r}."
            raise HTTPError(404, "model_not_found", message, param="model")
        messages = _messages(body.messages)
        fmt = body.response_format or {"type": "text"}
        kind = fmt.get("type") if isinstance(fmt, dict) else None
        if kind == "json_schema":
            return await _json_schema_reply(server, request, body, messages, fmt)
        if kind not in ("text", None):
            raise HTTPError(
                400,
                "unsupported_response_format",
                f"response_format: expected type 'json_schema' or 'text', but got "
                f"{kind!r}; pcd decides against a schema, so 'json_object' without one cannot be answered.",
                param="response_format",
            )
        return await _text_reply(server, body, messages)

    return router


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
    return _reply(_completion_id(), server.model_name, content, "stop", usage, stream=body.stream, extra={"pcd": pcd})


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
        events = _sse_chunks(completion_id, server.model_name, rest)
        return StreamingResponse(iterate_in_threadpool(events), media_type="text/event-stream")
    pieces = [first, *await run_in_threadpool(list, chunks)]
    last = pieces[-1]
    usage = _usage(last.prompt_tokens, last.completion_tokens)
    text = "".join(p.text for p in pieces)
    return _reply(completion_id, server.model_name, text, last.finish_reason, usage)


def _completion_id() -> str:
    return f"chatcmpl-{uuid.uuid4().hex[:24]}"


def _messages(raw: Any) -> list[ChatMessage]:
    if not isinstance(raw, list) or not raw:
        raise HTTPError(400, "invalid_request", "messages: expected a non-empty list.", param="messages")
    out = []
    for i, m in enumerate(raw):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise HTTPError(400, "invalid_request", f"messages[{i}]: expected an object with a role.", param="messages")
        content = m.get("content")
        if isinstance(content, list):  # content parts: keep the text ones
            content = "".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
        if not isinstance(content, str):
            raise HTTPError(400, "invalid_request", f"messages[{i}].content: expected text.", param="messages")
        role = "system" if m["role"] == "developer" else m["role"]
        out.append(ChatMessage(role, content))
    return out


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
    extra: dict[str, Any] | None = None,
) -> Any:
    if stream:

        async def one() -> AsyncIterator[str]:
            yield _chunk(completion_id, model, content, None)
            yield _chunk(completion_id, model, "", finish_reason or "stop", extra)
            yield "data: [DONE]\n\n"

        return StreamingResponse(one(), media_type="text/event-stream")
    message = {"role": "assistant", "content": content, "refusal": None}
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


def _chunk(completion_id: str, model: str, text: str, finish: str | None, extra: dict[str, Any] | None = None) -> str:
    delta = {"role": "assistant", "content": text} if finish is None else {}
    body = {
        "id": completion_id,
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}],
        **(extra or {}),
    }
    return f"data: {json.dumps(body, ensure_ascii=False)}\n\n"


def _sse_chunks(completion_id: str, model: str, chunks: Iterator[Any]) -> Iterator[str]:
    for chunk in chunks:
        if chunk.text:
            yield _chunk(completion_id, model, chunk.text, None)
        if chunk.finish_reason is not None:
            yield _chunk(completion_id, model, "", chunk.finish_reason)
    yield "data: [DONE]\n\n"
