"""``pcd serve``: a side-by-side web page, a JSON API and an OpenAI-compatible endpoint, as one ASGI app.

* ``GET /``: the page. pcd's decisions and the model writing the JSON token by token, side by side, with live
  timers; rows aligned by key; the keys the autoregressive answer missed, invented or filled with a value outside
  the schema are highlighted. One model serves both, so the page runs pcd first and then streams the other.
* ``GET /api/presets``, ``POST /api/extract`` (``{schema, context, options}`` -> values, fields, stats),
  ``POST /api/baseline`` (the autoregressive answer streamed as Server-Sent Events).
* ``GET /v1/models`` and ``POST /v1/chat/completions`` (OpenAI-compatible). A ``response_format`` of type
  ``json_schema`` is answered by the engine (closed properties scored, open ones generated under their schema):
  the content is the JSON object, and per-field evidence is in the extra top-level field ``pcd``. A schema pcd
  cannot constrain (``Any``, free-form objects, recursion) is a 400 with an OpenAI-style error body; without a
  ``response_format`` (or with type ``text``) the reply is free text.

The engine is not thread-safe, so one lock serializes its use: concurrent requests queue and get exactly the
answers they would get one by one. A streamed answer takes the lock per token, so other requests interleave.
Bad requests (bad JSON, an unsupported schema, an empty context, a body over ``max_body_bytes``) get a 4xx with a
JSON error body, never a crash.
"""

# No ``from __future__ import annotations``: FastAPI reads the endpoints' annotations at runtime, and ``Request``
# is imported inside ``create_app`` (FastAPI is an optional dependency).
import itertools
import json
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

from pcd_engine.baseline import BaselineResult, partial_pairs, stream_baseline
from pcd_engine.chat import ChatMessage, document_text, stream_chat
from pcd_engine.errors import BackendUnavailableError, ContextError, OptionError, PCDError, SchemaError
from pcd_engine.examples import EXAMPLE_PRESETS, example_preset
from pcd_engine.schema import compile_schema

__all__ = ["create_app"]

_PAGE = Path(__file__).resolve().parent / "web" / "index.html"
_STATUS = {SchemaError: 400, ContextError: 400, OptionError: 400}


class _HTTPError(Exception):
    def __init__(self, status: int, kind: str, message: str, *, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.kind, self.message, self.param, self.code = status, kind, message, param, code


def _fastapi() -> Any:
    try:
        import fastapi
    except ImportError as exc:
        raise BackendUnavailableError(
            "pcd serve: expected FastAPI and uvicorn to be installed, but they are not. "
            "Install them with: pip install 'pcd[serve]'"
        ) from exc
    return fastapi


def _field_kinds(compiled: Any) -> list[dict[str, Any]]:
    return [{"name": f.name, "kind": f.kind, "values": list(f.values)} for f in compiled.fields]


def _key_status(compiled: Any, text: str, result: BaselineResult | None) -> dict[str, Any]:
    """Per-key status of an autoregressive answer: ok, missing or invalid, plus the keys it invented."""
    written = result.values if result is not None and result.values is not None else partial_pairs(text)
    status = {}
    for spec in compiled.fields:
        if spec.name not in written:
            status[spec.name] = "missing"
        else:
            status[spec.name] = "ok" if spec.allows(spec.read(written[spec.name])) else "invalid"
    known = {f.name for f in compiled.fields}
    return {"values": written, "status": status, "invented": [k for k in written if k not in known]}


def create_app(
    engine: Any,
    *,
    model_name: str = "pcd",
    max_body_bytes: int = 1_000_000,
    max_new_tokens: int = 512,
) -> Any:
    """Build the ASGI app around a loaded engine.

    Args:
        engine: A loaded :class:`~pcd_engine.engine.Engine`.
        model_name: The model id that ``/v1/models`` lists and ``/v1/chat/completions`` accepts.
        max_body_bytes: Larger request bodies get 413.
        max_new_tokens: Upper bound on generated tokens for free text and the streamed baseline.

    Returns:
        A FastAPI application.

    Raises:
        BackendUnavailableError: If FastAPI is not installed.
    """
    fastapi = _fastapi()
    from fastapi import Request
    from fastapi.responses import HTMLResponse, JSONResponse, StreamingResponse
    from starlette.concurrency import iterate_in_threadpool, run_in_threadpool

    app = fastapi.FastAPI(title="pcd", version="0.1.0", docs_url="/docs", redoc_url=None)
    lock = threading.Lock()

    def locked(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        with lock:
            return fn(*args, **kwargs)

    def locked_iter(items: Iterator[Any]) -> Iterator[Any]:
        """Step a generator that uses the engine, holding the lock only while it computes the next item."""
        while True:
            with lock:
                try:
                    item = next(items)
                except StopIteration:
                    return
            yield item

    async def read_json(request: Request) -> Any:
        declared = request.headers.get("content-length")
        if declared and declared.isdigit() and int(declared) > max_body_bytes:
            raise _HTTPError(413, "request_too_large", f"Request body: expected at most {max_body_bytes} bytes.")
        body = bytearray()
        async for chunk in request.stream():
            body += chunk
            if len(body) > max_body_bytes:
                raise _HTTPError(413, "request_too_large", f"Request body: expected at most {max_body_bytes} bytes.")
        try:
            data = json.loads(bytes(body) or b"null")
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise _HTTPError(400, "invalid_json", f"Request body: expected JSON, but got bad JSON ({exc}).") from None
        if not isinstance(data, dict):
            raise _HTTPError(400, "invalid_request", "Request body: expected a JSON object.")
        return data

    def api_error(exc: _HTTPError) -> Any:
        return JSONResponse({"error": {"type": exc.kind, "message": exc.message}}, status_code=exc.status)

    def openai_error(exc: _HTTPError) -> Any:
        kind = "invalid_request_error" if exc.status < 500 else "server_error"
        body = {"error": {"message": exc.message, "type": kind, "param": exc.param, "code": exc.code or exc.kind}}
        return JSONResponse(body, status_code=exc.status)

    def as_http(exc: PCDError) -> _HTTPError:
        kind = type(exc).__name__
        return _HTTPError(_STATUS.get(type(exc), 422 if isinstance(exc, ValueError) else 500), kind, str(exc))

    @app.exception_handler(_HTTPError)
    async def http_error(request: Request, exc: _HTTPError) -> Any:
        return openai_error(exc) if request.url.path.startswith("/v1/") else api_error(exc)

    @app.exception_handler(PCDError)
    async def pcd_error(request: Request, exc: PCDError) -> Any:
        return await http_error(request, as_http(exc))

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> Any:  # a request never takes the server down
        return await http_error(request, _HTTPError(500, "internal_error", f"{type(exc).__name__}: {exc}"))

    def request_parts(data: dict[str, Any]) -> tuple[Any, str, dict[str, Any]]:
        if "schema" not in data:
            raise _HTTPError(400, "invalid_request", "Request: expected a 'schema' (JSON Schema or preset dict).")
        compiled = compile_schema(data["schema"])
        context = data.get("context")
        if not isinstance(context, str) or not context.strip():
            raise _HTTPError(400, "empty_context", "Request: expected 'context' to be a non-empty string.")
        options = data.get("options") or {}
        if not isinstance(options, dict):
            raise _HTTPError(400, "invalid_request", "Request: expected 'options' to be an object.")
        return compiled, context, options

    # ------------------------------------------------------------------------------------------ page and API

    @app.get("/", response_class=HTMLResponse)
    async def page() -> Any:
        return HTMLResponse(_PAGE.read_text(encoding="utf-8"))

    @app.get("/api/presets")
    async def presets() -> Any:
        out = []
        for name in EXAMPLE_PRESETS:
            preset = example_preset(name)
            out.append(
                {
                    "name": name,
                    "title": preset.title,
                    "schema": preset.schema.json_schema(),
                    "context": preset.context,
                }
            )
        return {"model": model_name, "presets": out}

    @app.post("/api/extract")
    async def extract(request: Request) -> Any:
        compiled, context, options = request_parts(await read_json(request))
        allowed = {"anchor", "strategy", "temperature"}
        unknown = sorted(set(options) - allowed)
        if unknown:
            raise _HTTPError(400, "invalid_request", f"options: expected keys from {sorted(allowed)}, got {unknown}.")
        result = await run_in_threadpool(locked, engine.extract, context, compiled, **options)
        data = result.to_json()
        data["schema"] = _field_kinds(compiled)
        return data

    @app.post("/api/baseline")
    async def baseline(request: Request) -> Any:
        compiled, context, options = request_parts(await read_json(request))
        limit = options.get("max_new_tokens")
        if limit is not None and (not isinstance(limit, int) or not 0 < limit <= max_new_tokens):
            raise _HTTPError(400, "invalid_request", f"options.max_new_tokens: expected 1..{max_new_tokens}.")
        steps = await run_in_threadpool(locked, stream_baseline, engine, context, compiled, max_new_tokens=limit)

        def events() -> Iterator[str]:
            started = time.perf_counter()
            text = ""
            try:
                for item in locked_iter(steps):
                    if isinstance(item, BaselineResult):
                        done = {
                            "text": item.text,
                            "valid": item.valid,
                            "errors": list(item.errors),
                            "tokens": item.tokens,
                            "ms": item.ms,
                            **_key_status(compiled, item.text, item if item.values is not None else None),
                        }
                        yield f"event: done\ndata: {json.dumps(done)}\n\n"
                    else:
                        text += item
                        ms = (time.perf_counter() - started) * 1000
                        yield f"event: token\ndata: {json.dumps({'text': item, 'ms': ms})}\n\n"
            except Exception as exc:  # noqa: BLE001 - reported in the stream; the response has started
                yield f"event: error\ndata: {json.dumps({'message': f'{type(exc).__name__}: {exc}'})}\n\n"

        return StreamingResponse(
            iterate_in_threadpool(events()), media_type="text/event-stream", headers={"Cache-Control": "no-cache"}
        )

    # ------------------------------------------------------------------------------------------ OpenAI

    created = int(time.time())

    @app.get("/v1/models")
    async def models() -> Any:
        return {
            "object": "list",
            "data": [{"id": model_name, "object": "model", "created": created, "owned_by": "pcd"}],
        }

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Any:
        data = await read_json(request)
        if data.get("model") != model_name:
            raise _HTTPError(
                404,
                "model_not_found",
                f"Model {data.get('model')!r}: this server serves {model_name!r}.",
                param="model",
            )
        messages = _messages(data.get("messages"))
        fmt = data.get("response_format") or {"type": "text"}
        kind = fmt.get("type") if isinstance(fmt, dict) else None
        completion_id = f"chatcmpl-{uuid.uuid4().hex[:24]}"
        stream = bool(data.get("stream"))
        if kind == "json_schema":
            schema = (fmt.get("json_schema") or {}).get("schema")
            if not isinstance(schema, dict):
                raise _HTTPError(
                    400,
                    "invalid_request",
                    "response_format.json_schema.schema: expected an object.",
                    param="response_format",
                )
            try:
                compiled = compile_schema(schema)
            except SchemaError as exc:
                raise _HTTPError(400, "unsupported_schema", str(exc), param="response_format") from None
            document = document_text([m.content for m in messages])
            temperature = data.get("temperature")
            extra = {"temperature": temperature} if isinstance(temperature, (int, float)) and temperature > 0 else {}
            result = await run_in_threadpool(locked, engine.extract, document, compiled, **extra)
            content = json.dumps(result.values, ensure_ascii=False)
            completion_tokens = len(engine.tokenizer.encode(content))
            pcd = {k: v for k, v in result.to_json().items() if k != "values"}
            usage = _usage(result.stats.prompt_tokens, completion_tokens)
            return _reply(completion_id, model_name, content, "stop", usage, stream=stream, extra={"pcd": pcd})
        if kind not in ("text", None):
            raise _HTTPError(
                400,
                "unsupported_response_format",
                f"response_format: expected type 'json_schema' or 'text', but got "
                f"{kind!r}; pcd decides against a schema, so 'json_object' without one cannot be answered.",
                param="response_format",
            )
        limit = data.get("max_completion_tokens") or data.get("max_tokens") or max_new_tokens
        if not isinstance(limit, int) or limit < 1:
            raise _HTTPError(400, "invalid_request", "max_tokens: expected a positive integer.", param="max_tokens")
        stop = data.get("stop") or []
        stop = [stop] if isinstance(stop, str) else stop
        chunks = stream_chat(engine, messages, max_new_tokens=min(limit, max_new_tokens), stop=stop)
        # The first chunk is computed before answering, so bad input is a 4xx, not a broken stream.
        first = await run_in_threadpool(locked, next, chunks)
        if stream:
            rest = itertools.chain([first], locked_iter(chunks))
            return StreamingResponse(
                iterate_in_threadpool(_sse_chunks(completion_id, model_name, rest)), media_type="text/event-stream"
            )
        pieces = [first, *await run_in_threadpool(locked, list, chunks)]
        last = pieces[-1]
        usage = _usage(last.prompt_tokens, last.completion_tokens)
        return _reply(completion_id, model_name, "".join(p.text for p in pieces), last.finish_reason, usage)

    return app


def _messages(raw: Any) -> list[ChatMessage]:
    if not isinstance(raw, list) or not raw:
        raise _HTTPError(400, "invalid_request", "messages: expected a non-empty list.", param="messages")
    out = []
    for i, m in enumerate(raw):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise _HTTPError(
                400, "invalid_request", f"messages[{i}]: expected an object with a role.", param="messages"
            )
        content = m.get("content")
        if isinstance(content, list):  # content parts: keep the text ones
            content = "".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
        if not isinstance(content, str):
            raise _HTTPError(400, "invalid_request", f"messages[{i}].content: expected text.", param="messages")
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
    from fastapi.responses import JSONResponse, StreamingResponse

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
