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

The engine is thread-safe: concurrent requests run in worker threads and interleave at forward-pass boundaries
(the model runs one pass at a time), and each gets exactly the answer it would get alone. Every request is
bounded: its body by ``max_body_bytes`` and ``body_timeout_s``, its work by :class:`~pcd_engine.limits.
RequestLimits` (labels, generated tokens, time), checked before any model work where the size is known; a client
that disconnects has its work cancelled at the next pass boundary.

Only local pages may drive it: JSON endpoints accept only ``Content-Type: application/json`` (a plain form post
from another site is refused with 415), and the ``Host`` header must name a loopback address, the bound address
or one of ``allowed_hosts`` (DNS rebinding is refused with 421). Bad requests (bad JSON, an unsupported schema,
an empty context, a body too large or too slow) get a 4xx with a JSON error body, never a crash.
"""

# No ``from __future__ import annotations``: FastAPI reads the endpoints' annotations at runtime, and ``Request``
# is imported inside ``create_app`` (FastAPI is an optional dependency).
import asyncio
import itertools
import json
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from pcd_engine.baseline import BaselineResult, partial_pairs, stream_baseline
from pcd_engine.chat import ChatMessage, document_text, stream_chat
from pcd_engine.errors import (
    BackendUnavailableError,
    ContextError,
    LimitError,
    OptionError,
    PCDError,
    RequestCancelled,
    RequestTimeout,
    SchemaError,
)
from pcd_engine.examples import EXAMPLE_PRESETS, example_preset
from pcd_engine.limits import SERVER_LIMITS, RequestLimits
from pcd_engine.options import ExtractOptions
from pcd_engine.schema import compile_schema

__all__ = ["create_app", "header_timeout_protocol"]

_PAGE = Path(__file__).resolve().parent / "web" / "index.html"
_STATUS = {
    SchemaError: 400,
    ContextError: 400,
    OptionError: 400,
    LimitError: 400,
    RequestTimeout: 504,
    RequestCancelled: 499,
}
_LOOPBACK = ("localhost", "127.0.0.1", "::1")


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
    limits: RequestLimits = SERVER_LIMITS,
    body_timeout_s: float = 10.0,
    host: str | None = None,
    allowed_hosts: Sequence[str] = (),
) -> Any:
    """Build the ASGI app around a loaded engine.

    Args:
        engine: A loaded :class:`~pcd_engine.engine.Engine`.
        model_name: The model id that ``/v1/models`` lists and ``/v1/chat/completions`` accepts.
        max_body_bytes: Larger request bodies get 413.
        max_new_tokens: Upper bound on generated tokens for free text and the streamed baseline.
        limits: What one extraction may ask for (labels, generated tokens, seconds); over a size limit is a 400
            before any model work, over the time limit a 504.
        body_timeout_s: Seconds a client may take to send each piece of its request body before a 408.
        host: The address the server is bound to; requests may name it in their ``Host`` header.
        allowed_hosts: More host names requests may use (a reverse proxy's name); loopback names always work.

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
    hosts = {h.lower().strip("[]") for h in (*_LOOPBACK, *allowed_hosts, *([host] if host else []))}
    app.add_middleware(_HostCheck, hosts=frozenset(hosts - {"0.0.0.0", "::"}))

    async def run_engine(request: Request, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run an engine call in a worker thread; if the client goes away, cancel it at the next pass."""
        gone = threading.Event()

        async def watch() -> None:
            while not gone.is_set():
                if await request.is_disconnected():
                    gone.set()
                    return
                await asyncio.sleep(0.1)

        watcher = asyncio.create_task(watch())
        try:
            return await run_in_threadpool(fn, *args, cancelled=gone.is_set, **kwargs)
        finally:
            gone.set()
            watcher.cancel()

    async def read_json(request: Request) -> Any:
        media = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if media != "application/json":
            raise _HTTPError(
                415,
                "unsupported_media_type",
                f"Request body: expected Content-Type application/json, but got {media or 'none'!r}.",
            )
        declared = request.headers.get("content-length")
        if declared and declared.isdigit() and int(declared) > max_body_bytes:
            raise _HTTPError(413, "request_too_large", f"Request body: expected at most {max_body_bytes} bytes.")
        body = bytearray()
        chunks = request.stream().__aiter__()
        while True:
            try:
                chunk = await asyncio.wait_for(chunks.__anext__(), timeout=body_timeout_s)
            except StopAsyncIteration:
                break
            except asyncio.TimeoutError:
                raise _HTTPError(
                    408, "request_timeout", f"Request body: expected each part within {body_timeout_s:g} s."
                ) from None
            body += chunk
            if len(body) > max_body_bytes:
                raise _HTTPError(413, "request_too_large", f"Request body: expected at most {max_body_bytes} bytes.")
        try:
            data = json.loads(bytes(body) or b"null")
        except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:
            detail = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)
            message = f"Request body: expected JSON, but got bad JSON ({detail})."
            raise _HTTPError(400, "invalid_json", message) from None
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

    def client_options(raw: Any, *, where: str = "options") -> ExtractOptions:
        """A client's options; the server's own limits and memory budget are not the client's to change."""
        try:
            options = ExtractOptions.parse(raw, where=where)
        except OptionError as exc:
            raise _HTTPError(400, "invalid_request", str(exc), param=where) from None
        for name in ("limits", "memory_budget_mb"):
            if getattr(options, name) is not None:
                message = f"{where}.{name}: set by the server (pcd serve flags), not by a request."
                raise _HTTPError(400, "invalid_request", message, param=where)
        return options

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
        result = await run_engine(request, engine.extract, context, compiled, client_options(options), limits=limits)
        data = result.to_json()
        data["schema"] = _field_kinds(compiled)
        return data

    @app.post("/api/baseline")
    async def baseline(request: Request) -> Any:
        compiled, context, options = request_parts(await read_json(request))
        limit = options.get("max_new_tokens")
        if limit is not None and (not isinstance(limit, int) or not 0 < limit <= max_new_tokens):
            raise _HTTPError(400, "invalid_request", f"options.max_new_tokens: expected 1..{max_new_tokens}.")
        steps = await run_in_threadpool(stream_baseline, engine, context, compiled, max_new_tokens=limit)

        def events() -> Iterator[str]:
            started = time.perf_counter()
            text = ""
            try:
                for item in steps:
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
            options = client_options(data.get("pcd"), where="pcd")
            temperature = data.get("temperature")
            if isinstance(temperature, (int, float)) and not isinstance(temperature, bool) and temperature > 0:
                options = ExtractOptions(temperature=temperature).over(options)
            budget = data.get("max_completion_tokens") or data.get("max_tokens")
            if budget is not None:  # the token limit of each generated value (the rows run side by side)
                if isinstance(budget, bool) or not isinstance(budget, int) or budget < 1:
                    message = "max_tokens: expected a positive integer."
                    raise _HTTPError(400, "invalid_request", message, param="max_tokens")
                options = ExtractOptions(max_tokens=budget).over(options)
            result = await run_engine(request, engine.extract, document, compiled, options, limits=limits)
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
        first = await run_in_threadpool(next, chunks)
        if stream:
            rest = itertools.chain([first], chunks)
            return StreamingResponse(
                iterate_in_threadpool(_sse_chunks(completion_id, model_name, rest)), media_type="text/event-stream"
            )
        pieces = [first, *await run_in_threadpool(list, chunks)]
        last = pieces[-1]
        usage = _usage(last.prompt_tokens, last.completion_tokens)
        return _reply(completion_id, model_name, "".join(p.text for p in pieces), last.finish_reason, usage)

    return app


def header_timeout_protocol(seconds: float) -> type:
    """uvicorn's h11 protocol, closing a connection whose request headers are not complete within ``seconds``.

    uvicorn waits for the headers of a request forever, so a client that opens connections and sends a few header
    bytes now and then could hold them all; the body has its own limit in the app (``body_timeout_s``). Pass the
    class as ``uvicorn.run(..., http=header_timeout_protocol(10.0))``.

    Raises:
        BackendUnavailableError: If uvicorn is not installed.
    """
    try:
        from uvicorn.protocols.http.h11_impl import H11Protocol
    except ImportError as exc:
        raise BackendUnavailableError(
            "pcd serve: expected uvicorn, but it is not installed. Install it with: pip install 'pcd[serve]'"
        ) from exc

    class HeaderTimeoutH11(H11Protocol):  # type: ignore[misc]
        _headers_timer: Any = None

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self._arm()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def handle_events(self) -> None:
            super().handle_events()
            if self.cycle is not None and not self.cycle.response_complete:
                self._disarm()  # a request's headers are in: the app's body timeout takes over

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing():
                self._arm()

        def _arm(self) -> None:
            self._disarm()
            self._headers_timer = self.loop.call_later(seconds, self._headers_late)

        def _disarm(self) -> None:
            if self._headers_timer is not None:
                self._headers_timer.cancel()
                self._headers_timer = None

        def _headers_late(self) -> None:
            self._headers_timer = None
            if (self.cycle is None or self.cycle.response_complete) and not self.transport.is_closing():
                self.transport.close()

    return HeaderTimeoutH11


class _HostCheck:
    """ASGI middleware: refuse requests whose ``Host`` header names none of ``hosts`` (421, JSON body).

    A page on another site that rebinds its own name to 127.0.0.1 sends its own name as ``Host``, so checking
    the name keeps such pages from reading answers.
    """

    def __init__(self, app: Any, *, hosts: frozenset[str]) -> None:
        self.app = app
        self.hosts = hosts

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] in ("http", "websocket"):
            headers = dict(scope.get("headers") or [])
            raw = headers.get(b"host", b"").decode("latin-1").strip().lower()
            if raw.startswith("[") and "]" in raw:  # [::1]:8000
                name = raw[1 : raw.index("]")]
            else:  # localhost:8000, or a bare IPv6 address
                name = raw.rsplit(":", 1)[0] if raw.count(":") == 1 else raw
            if name not in self.hosts:
                from fastapi.responses import JSONResponse

                message = (
                    f"Host: expected one of {sorted(self.hosts)}, but got {raw or 'none'!r}. Start pcd serve with "
                    "--allow-host NAME to accept another name."
                )
                body = {"error": {"type": "misdirected_request", "message": message}}
                await JSONResponse(body, status_code=421)(scope, receive, send)
                return
        await self.app(scope, receive, send)


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
