"""The ASGI app: one :class:`Server` (the engine and the server's limits), its HTTP plumbing, and the routers.

What the server guards on every request lives here: the ``Host`` header (:class:`HostCheck`), the body's media
type, size and pace (:meth:`Server.read_json`), the options a client may set (:meth:`Server.client_options`),
and cancelling engine work when a client goes away (:meth:`Server.run_engine`). uvicorn's header timeout is
:func:`header_timeout_protocol`. The routes live in :mod:`~pcd_engine.tools.serve.page_api` and
:mod:`~pcd_engine.tools.serve.openai_api`; the error bodies in :mod:`~pcd_engine.tools.serve.errors`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from pcd_engine import __version__
from pcd_engine.errors import pip_install, require
from pcd_engine.limits import SERVER_LIMITS, SERVER_MAX_NEW_TOKENS, RequestLimits
from pcd_engine.run.collector import Collector
from pcd_engine.tools.serve.errors import HTTPError, error_response, install_handlers
from pcd_engine.tools.serve.server import Server

if TYPE_CHECKING:
    from pcd_engine.engine import Engine
    from pcd_engine.tools.serve.served import ServedHead

__all__ = ["LOOPBACK", "HostCheck", "KeyCheck", "create_app", "header_timeout_protocol"]

LOOPBACK = ("localhost", "127.0.0.1", "::1")
INSTALL = pip_install("serve")


def create_app(
    engine: Engine,
    *,
    model_name: str = "pcd",
    max_body_bytes: int = 1_000_000,
    max_new_tokens: int = SERVER_MAX_NEW_TOKENS,
    limits: RequestLimits = SERVER_LIMITS,
    body_timeout_s: float = 10.0,
    host: str | None = None,
    allowed_hosts: Sequence[str] = (),
    aliases: Sequence[str] = (),
    api_key: str | None = None,
    cors_origins: Sequence[str] = (),
    batch_window_ms: float | None = 5.0,
    max_batch: int | None = None,
    log: str | os.PathLike[str] | None = None,
    heads: Mapping[str, ServedHead] | None = None,
) -> Any:
    """Build the ASGI app around a loaded engine.

    Args:
        engine: A loaded :class:`~pcd_engine.engine.Engine`.
        model_name: The model id that ``/v1/models`` lists and ``/v1/chat/completions`` accepts.
        max_body_bytes: Larger request bodies get 413.
        max_new_tokens: Upper bound on generated tokens for free text and the streamed baseline.
        limits: What one extraction may ask for (labels, generated tokens, seconds); over a size limit is a 400
            before any model work, over the time limit a 504.
        body_timeout_s: Seconds a client may take to send its whole request body before a 408.
        host: The address the server is bound to; requests may name it in their ``Host`` header.
        allowed_hosts: More host names requests may use (a reverse proxy's name); loopback names always work.
        aliases: Other names ``/v1`` accepts for the model (``default`` always works).
        api_key: When set, ``/v1`` and ``/api`` requests must carry ``Authorization: Bearer <api_key>`` (401
            otherwise); the page itself stays open.
        cors_origins: Web origins whose pages may call the API from a browser (CORS); none by default, so a page
            on another origin cannot read the answers.
        batch_window_ms: Extractions arriving within this many milliseconds of each other are decided together
            (one pass per wave for all; see :class:`~pcd_engine.run.collector.Collector`); ``None`` decides each
            alone.
        max_batch: The most extractions in one batch; ``None`` takes the engine's batch size.
        log: A JSON-lines file logging every decided request (:mod:`~pcd_engine.tools.serve.outcomes`) and the
            outcomes ``POST /api/outcomes`` reports for them; ``None`` refuses outcomes.
        heads: Fitted heads served as models by name (:mod:`~pcd_engine.tools.serve.served`).

    Returns:
        A FastAPI application; ``app.state.server`` is its :class:`Server`.

    Raises:
        BackendUnavailableError: If FastAPI is not installed.
    """
    (fastapi,) = require("fastapi", what="pcd serve", install=INSTALL)
    from pcd_engine.tools.serve import decisions_api, openai_api, page_api, responses_api
    from pcd_engine.tools.serve.outcomes import DecisionLog

    collector = (
        None if batch_window_ms is None else Collector(engine, window_ms=batch_window_ms, max_documents=max_batch)
    )
    server = Server(
        engine, model_name, max_body_bytes, max_new_tokens, limits, body_timeout_s, aliases=tuple(aliases),
        collector=collector, log=DecisionLog(log) if log is not None else None, heads=dict(heads or {}),
    )  # fmt: skip
    app = fastapi.FastAPI(title="pcd", version=__version__, docs_url="/docs", redoc_url=None)
    app.state.server = server
    if api_key:
        app.add_middleware(KeyCheck, key=api_key)
    if cors_origins:
        from fastapi.middleware.cors import CORSMiddleware

        app.add_middleware(
            CORSMiddleware,
            allow_origins=list(cors_origins),
            allow_methods=["GET", "POST"],
            allow_headers=["Authorization", "Content-Type"],
        )
    hosts = {h.lower().strip("[]") for h in (*LOOPBACK, *allowed_hosts, *([host] if host else []))}
    app.add_middleware(HostCheck, hosts=frozenset(hosts - {"0.0.0.0", "::"}))
    install_handlers(app)
    for router in (page_api.page_router, openai_api.openai_router, responses_api.responses_router,
                   decisions_api.decisions_router):  # fmt: skip
        app.include_router(router(server))
    return app


def header_timeout_protocol(seconds: float) -> type:
    """uvicorn's h11 protocol, closing a connection whose request headers are not complete within ``seconds``.

    uvicorn waits for the headers of a request forever, so a client that opens connections and sends a few header
    bytes now and then could hold them all; the body has its own limit in the app (``body_timeout_s``). Pass the
    class as ``uvicorn.run(..., http=header_timeout_protocol(10.0))``.

    Raises:
        BackendUnavailableError: If uvicorn is not installed.
    """
    h11: Any = require("uvicorn.protocols.http.h11_impl", what="pcd serve", install=INSTALL)[0]

    class HeaderTimeoutH11(h11.H11Protocol):  # type: ignore[misc]
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


class HostCheck:
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


class KeyCheck:
    """ASGI middleware: requests to ``/v1/`` and ``/api/`` must carry ``Authorization: Bearer <key>`` (401 in
    the API's error shape otherwise). The page and ``/docs`` stay open: they hold no data.
    """

    def __init__(self, app: Any, *, key: str) -> None:
        self.app = app
        self.expected = f"Bearer {key}".encode()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        import hmac

        path = scope.get("path", "") if scope["type"] == "http" else ""
        if path.startswith(("/v1/", "/api/")):
            given = dict(scope["headers"]).get(b"authorization", b"")
            if not hmac.compare_digest(given, self.expected):
                what = "a wrong key" if given else "none"
                message = f"Authorization: expected 'Bearer <the server's API key>', but got {what}."
                error = HTTPError(401, "invalid_api_key", message)
                await error_response(path, error)(scope, receive, send)
                return
        await self.app(scope, receive, send)
