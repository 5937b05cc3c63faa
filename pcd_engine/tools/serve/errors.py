"""How the server fails: one exception for every refusal, and the two error bodies (pcd's own API and OpenAI's).

Every refusal is an :class:`HTTPError` with a status, a kind and a message that names what was wrong; a
:class:`~pcd_engine.errors.PCDError` from the engine maps to a status by its type (:data:`STATUS`), and anything
else is a 500 whose body says what happened, so that a request never takes the server down.
"""

from __future__ import annotations

from typing import Any

from pcd_engine.errors import (
    ContextError,
    LimitError,
    OptionError,
    PCDError,
    RequestCancelled,
    RequestTimeout,
    SchemaError,
)

__all__ = ["STATUS", "HTTPError", "as_http", "error_response", "install_handlers"]

STATUS: dict[type[PCDError], int] = {
    SchemaError: 400,
    ContextError: 400,
    OptionError: 400,
    LimitError: 400,
    RequestTimeout: 504,
    RequestCancelled: 499,
}


class HTTPError(Exception):
    """A refused request.

    Args:
        status: The HTTP status.
        kind: pcd's error type (``invalid_request``, ``empty_context``, ``SchemaError``, ...); OpenAI bodies carry
            it as ``code`` unless ``code`` is given.
        message: What was expected and what was received.
        param: The request field at fault (OpenAI bodies report it).
        code: The OpenAI ``code``, when it differs from ``kind``.
    """

    def __init__(self, status: int, kind: str, message: str, *, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.kind, self.message, self.param, self.code = status, kind, message, param, code


def as_http(exc: Exception) -> HTTPError:
    """The refusal for an exception raised while serving a request."""
    if isinstance(exc, HTTPError):
        return exc
    if isinstance(exc, PCDError):
        status = STATUS.get(type(exc), 422 if isinstance(exc, ValueError) else 500)
        return HTTPError(status, type(exc).__name__, str(exc))
    return HTTPError(500, "internal_error", f"{type(exc).__name__}: {exc}")


def error_response(path: str, exc: HTTPError) -> Any:
    """The JSON error response: OpenAI's shape under ``/v1/``, pcd's own elsewhere."""
    from fastapi.responses import JSONResponse

    if path.startswith("/v1/"):
        kind = "invalid_request_error" if exc.status < 500 else "server_error"
        body = {"error": {"message": exc.message, "type": kind, "param": exc.param, "code": exc.code or exc.kind}}
    else:
        body = {"error": {"type": exc.kind, "message": exc.message}}
    return JSONResponse(body, status_code=exc.status)


def install_handlers(app: Any) -> None:
    """Answer every exception a route raises with :func:`error_response`, and unknown routes and methods (404,
    405) in the same shape, naming the route."""
    from fastapi import Request
    from starlette.exceptions import HTTPException

    async def handle(request: Request, exc: Exception) -> Any:
        return error_response(request.url.path, as_http(exc))

    async def routing(request: Request, exc: HTTPException) -> Any:
        route = f"{request.method} {request.url.path}"
        if exc.status_code == 404:
            refusal = HTTPError(404, "not_found", f"Route: no route {route}; see /docs for the routes pcd serves.")
        elif exc.status_code == 405:
            refusal = HTTPError(405, "method_not_allowed", f"Route: {route} is not allowed; see /docs.")
        else:
            refusal = HTTPError(exc.status_code, "http_error", str(exc.detail))
        return error_response(request.url.path, refusal)

    app.add_exception_handler(HTTPException, routing)
    for kind in (HTTPError, PCDError, Exception):
        app.add_exception_handler(kind, handle)
