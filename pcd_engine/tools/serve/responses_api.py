"""OpenAI's Responses API: ``POST /v1/responses``, answered by the same path as Chat Completions.

The input (a string, or message / ``function_call`` / ``function_call_output`` items) is read into chat turns,
tool calls and results labelled; ``text.format`` picks a scored JSON Schema, a JSON object under a grammar, or
free text; function tools are the engine's scored decision. The reply is a ``response`` object whose ``output``
holds one ``message`` (``output_text``) or the ``function_call`` items, with the usage and pcd's evidence in the
extra field ``pcd``. With ``stream``, free text is sent as it is written (one ``output_text.delta`` per chunk);
a scored answer or tool calls are sent as the event sequence once decided (pcd decides before it writes, so
there is nothing earlier to send). Nothing is stored: ``store=true`` and
``previous_response_id`` are refused.
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

from pcd_engine.errors import ContextError
from pcd_engine.prompt.transcript import responses_input
from pcd_engine.result import TokenUsage
from pcd_engine.tools.serve.answers import (
    Answer,
    Ask,
    conversation,
    decide,
    decision_headers,
    extract_options,
    function_tool,
    read_request,
    respond,
    text_chunks,
    token_limit,
)
from pcd_engine.tools.serve.errors import HTTPError
from pcd_engine.tools.serve.models import ResponsesRequest, documented
from pcd_engine.tools.serve.server import Server

__all__ = ["input_turns", "responses_router"]


def responses_router(server: Server) -> APIRouter:
    """The ``/v1/responses`` route, served by ``server``."""
    router = APIRouter()

    @router.post("/v1/responses", openapi_extra=documented(ResponsesRequest))
    async def responses(request: Request) -> Any:
        body = await read_request(server, request, ResponsesRequest)
        ask = _ask(server, body)
        decided = await decide(server, request, ask)
        calls = decided if decided is not None and decided.calls else None
        if calls is None and body.stream and ask.format == "text":
            return await _text_stream(server, body, ask)
        answer = calls or await respond(server, request, ask, chosen=decided)
        response, headers = _response(server, body, answer), decision_headers(answer)
        if body.stream:
            return StreamingResponse(_events(response), media_type="text/event-stream", headers=headers)
        return JSONResponse(response, headers=headers)

    return router


def _ask(server: Server, body: ResponsesRequest) -> Ask:
    """A Responses request as an :class:`~pcd_engine.tools.serve.answers.Ask`.

    Raises:
        HTTPError: 400 for bad input items, tools, format or limits.
    """
    fmt = (body.text or {}).get("format") or {"type": "text"}
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind not in ("text", "json_object", "json_schema"):
        message = f"text.format: expected type 'text', 'json_object' or 'json_schema', but got {kind!r}."
        raise HTTPError(400, "unsupported_response_format", message, param="text.format")
    tools = []
    for i, raw in enumerate(body.tools or []):
        if raw.get("type") != "function":
            message = (
                f"tools[{i}]: expected a function tool, but got type {raw.get('type')!r}; pcd runs no hosted tools."
            )
            raise HTTPError(400, "invalid_request", message, param="tools")
        parameters = raw.get("parameters") or {}
        tools.append(
            function_tool(raw.get("name"), raw.get("description"), parameters, where=f"tools[{i}]", param="tools")
        )
    turns = ([{"role": "system", "content": body.instructions}] if body.instructions else []) + input_turns(body.input)
    # the client's token limit caps the whole reply; each open value's (pcd.max_tokens) stays within it
    reply = token_limit(body.max_output_tokens, server, param="max_output_tokens")
    return Ask(
        conversation=conversation(turns, param="input"),
        options=extract_options(server, body.pcd, body.temperature, reply, model=body.model),
        max_new_tokens=reply,
        tools=tools,
        tool_choice=body.tool_choice,
        parallel=body.parallel_tool_calls is not False,
        format=kind,
        schema=fmt.get("schema") if kind == "json_schema" else None,
        params={"format": "text.format"},
        model=body.model,
        route="/v1/responses",
    )


def input_turns(raw: str | list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Responses input items as Chat Completions messages
    (:func:`~pcd_engine.prompt.transcript.responses_input`).

    Raises:
        HTTPError: 400 for an item of a kind pcd cannot read (reasoning, hosted tool calls, ...).
    """
    try:
        return responses_input(raw, where="input")
    except ContextError as exc:
        raise HTTPError(400, "invalid_request", str(exc), param="input") from None


def _response(
    server: Server, body: ResponsesRequest, answer: Answer, *, ids: tuple[str, str] | None = None
) -> dict[str, Any]:
    """The ``response`` object of an answer (``ids``: the response's and its message's, when already sent)."""
    response_id, message_id = ids or (f"resp_{uuid.uuid4().hex[:24]}", f"msg_{uuid.uuid4().hex[:24]}")
    output: list[dict[str, Any]]
    if answer.calls:
        output = [
            {"type": "function_call", "id": f"fc_{uuid.uuid4().hex[:24]}", "call_id": c.id, "name": c.name,
             "arguments": c.arguments, "status": "completed"}
            for c in answer.calls
        ]  # fmt: skip
    else:
        text = {"type": "output_text", "text": answer.content or "", "annotations": [], "logprobs": []}
        output = [
            {"type": "message", "id": message_id, "status": "completed", "role": "assistant",
             "content": [text]}
        ]  # fmt: skip
    cut = answer.finish_reason == "length"
    usage: dict[str, Any] = TokenUsage(answer.prompt_tokens, answer.completion_tokens).input_output()
    usage.update(input_tokens_details={"cached_tokens": 0}, output_tokens_details={"reasoning_tokens": 0})
    response: dict[str, Any] = {
        "id": response_id,
        "object": "response",
        "created_at": int(time.time()),
        "status": "incomplete" if cut else "completed",
        "incomplete_details": {"reason": "max_output_tokens"} if cut else None,
        "error": None,
        "model": server.reply_name(body.model),
        "output": output,
        "usage": usage,
        "instructions": body.instructions,
        "metadata": body.metadata or {},
        "parallel_tool_calls": body.parallel_tool_calls is not False,
        "temperature": body.temperature,
        "top_p": body.top_p,
        "tool_choice": body.tool_choice or "auto",
        "tools": body.tools or [],
        "text": body.text or {"format": {"type": "text"}},
        "max_output_tokens": body.max_output_tokens,
        "previous_response_id": None,
        "reasoning": None,
        "store": False,
        "truncation": "disabled",
        "user": body.user,
    }
    if answer.pcd is not None:
        response["pcd"] = answer.pcd
    return response


class _Events:
    """Responses stream events, numbered in order."""

    def __init__(self) -> None:
        self.sequence = 0

    def __call__(self, kind: str, **data: Any) -> str:
        self.sequence += 1
        payload = {"type": kind, "sequence_number": self.sequence, **data}
        return f"event: {kind}\ndata: {json.dumps(payload, ensure_ascii=False)}\n\n"

    def opening(self, response: dict[str, Any]) -> list[str]:
        """``response.created`` and ``response.in_progress``, for a response not written yet."""
        opening = {**response, "status": "in_progress", "output": [], "usage": None}
        return [self("response.created", response=opening), self("response.in_progress", response=opening)]

    def message_start(self, item: dict[str, Any], index: int) -> list[str]:
        """A message item and its text part, opened empty."""
        where = {"item_id": item["id"], "output_index": index, "content_index": 0}
        return [
            self("response.output_item.added", output_index=index, item={**item, "status": "in_progress",
                                                                          "content": []}),
            self("response.content_part.added", **where, part={**item["content"][0], "text": ""}),
        ]  # fmt: skip

    def delta(self, item: dict[str, Any], index: int, text: str) -> str:
        return self("response.output_text.delta", item_id=item["id"], output_index=index, content_index=0,
                    delta=text, logprobs=[])  # fmt: skip

    def message_end(self, item: dict[str, Any], index: int) -> list[str]:
        """A message's text part and item, closed with their whole text."""
        part = item["content"][0]
        where = {"item_id": item["id"], "output_index": index, "content_index": 0}
        return [
            self("response.output_text.done", **where, text=part["text"], logprobs=[]),
            self("response.content_part.done", **where, part=part),
            self("response.output_item.done", output_index=index, item=item),
        ]

    def closing(self, response: dict[str, Any]) -> str:
        kind = "response.completed" if response["status"] == "completed" else "response.incomplete"
        return self(kind, response=response)


async def _events(response: dict[str, Any]) -> AsyncIterator[str]:
    """The Responses event sequence of a complete response: created, each output item with its content, then
    completed."""
    event = _Events()
    for line in event.opening(response):
        yield line
    for index, item in enumerate(response["output"]):
        if item["type"] == "message":
            for line in event.message_start(item, index):
                yield line
            if item["content"][0]["text"]:
                yield event.delta(item, index, item["content"][0]["text"])
            for line in event.message_end(item, index):
                yield line
        else:
            yield event("response.output_item.added", output_index=index, item={**item, "status": "in_progress",
                                                                                 "arguments": ""})  # fmt: skip
            where = {"item_id": item["id"], "output_index": index}
            yield event("response.function_call_arguments.delta", **where, delta=item["arguments"])
            yield event("response.function_call_arguments.done", **where, arguments=item["arguments"])
            yield event("response.output_item.done", output_index=index, item=item)
    yield event.closing(response)


async def _text_stream(server: Server, body: ResponsesRequest, ask: Ask) -> Any:
    """Free text streamed as it is written: the opening events, one ``output_text.delta`` per chunk, then the
    closing events with the whole response."""
    chunks = text_chunks(server, ask)
    first = await run_in_threadpool(next, chunks)  # bad input is a 4xx, not a broken stream
    ids = (f"resp_{uuid.uuid4().hex[:24]}", f"msg_{uuid.uuid4().hex[:24]}")

    def events() -> Iterator[str]:
        event = _Events()
        empty = _response(server, body, Answer("", (), "stop", first.prompt_tokens, 0, None), ids=ids)
        item = empty["output"][0]
        yield from event.opening(empty)
        yield from event.message_start(item, 0)
        text, last = "", first
        for chunk in itertools.chain([first], chunks):
            last = chunk
            if chunk.text:
                text += chunk.text
                yield event.delta(item, 0, chunk.text)
        answer = Answer(text, (), str(last.finish_reason), last.prompt_tokens, last.completion_tokens, None)
        final = _response(server, body, answer, ids=ids)
        yield from event.message_end(final["output"][0], 0)
        yield event.closing(final)

    return StreamingResponse(iterate_in_threadpool(events()), media_type="text/event-stream")
