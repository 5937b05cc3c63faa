"""The web page and its JSON API: ``GET /``, ``GET /api/presets``, ``POST /api/extract``, ``POST /api/baseline``,
``POST /api/outcomes``.

``/api/extract`` answers ``{schema, context, options}`` with the values, per-field evidence and statistics (and,
under ``pcd serve --log``, an ``id`` that ``/api/outcomes`` takes with the right values, for ``pcd fit --log``);
``/api/baseline`` streams the model writing the same answer token by token as Server-Sent Events (``token``
events, then one ``done`` event with the answer's validity and the status of every key).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, JSONResponse, StreamingResponse
from starlette.concurrency import iterate_in_threadpool, run_in_threadpool

from pcd_engine.schema import Schema, compile_schema
from pcd_engine.tools.baseline import BaselineResult, partial_pairs, stream_baseline
from pcd_engine.tools.examples import EXAMPLE_PRESETS, example_preset
from pcd_engine.tools.serve.errors import HTTPError
from pcd_engine.tools.serve.models import BaselineRequest, ExtractRequest, OutcomeRequest, documented, parse_body
from pcd_engine.tools.serve.outcomes import outcome_problem
from pcd_engine.tools.serve.server import DECISION_ID_HEADER, Server

__all__ = ["page_router"]

PAGE = Path(__file__).resolve().parent.parent.parent / "web" / "index.html"
_KINDS = {"context": "empty_context"}


def field_kinds(compiled: Schema) -> list[dict[str, Any]]:
    """Each field's name, kind and allowed values, for the page's table."""
    return [{"name": f.name, "kind": f.kind, "values": list(f.values)} for f in compiled.fields]


def key_status(compiled: Schema, text: str, result: BaselineResult | None) -> dict[str, Any]:
    """Per-key status of an autoregressive answer: ok, missing or invalid, plus the keys it invented."""
    written = result.values if result is not None and result.values is not None else partial_pairs(text)
    grade = compiled.grade(written)
    return {"values": written, "status": dict(grade.status), "invented": list(grade.extra)}


def _events(compiled: Schema, steps: Iterator[str | BaselineResult]) -> Iterator[str]:
    """The baseline's steps as Server-Sent Events."""
    started = time.perf_counter()
    try:
        for item in steps:
            if isinstance(item, BaselineResult):
                done = {
                    "text": item.text,
                    "valid": item.valid,
                    "errors": list(item.errors),
                    "tokens": item.tokens,
                    "ms": item.ms,
                    **key_status(compiled, item.text, item if item.values is not None else None),
                }
                yield f"event: done\ndata: {json.dumps(done)}\n\n"
            else:
                ms = (time.perf_counter() - started) * 1000
                yield f"event: token\ndata: {json.dumps({'text': item, 'ms': ms})}\n\n"
    except Exception as exc:  # noqa: BLE001 - reported in the stream; the response has started
        yield f"event: error\ndata: {json.dumps({'message': f'{type(exc).__name__}: {exc}'})}\n\n"


def page_router(server: Server) -> APIRouter:
    """The page and its API, served by ``server``."""
    router = APIRouter()

    @router.get("/", response_class=HTMLResponse)
    async def page() -> Any:
        return HTMLResponse(PAGE.read_text(encoding="utf-8"))

    @router.get("/api/presets")
    async def presets() -> Any:
        out = []
        for name in EXAMPLE_PRESETS:
            preset = example_preset(name)
            schema = preset.schema.json_schema()
            out.append({"name": name, "title": preset.title, "schema": schema, "context": preset.context})
        return {"model": server.model_name, "presets": out}

    @router.post("/api/extract", openapi_extra=documented(ExtractRequest))
    async def extract(request: Request) -> Any:
        body = parse_body(ExtractRequest, await server.read_json(request), kinds=_KINDS)
        server.check_model(body.model)
        compiled = compile_schema(body.schema_)
        options = server.client_options(body.options, model=body.model)
        decided = await server.decide(request, body.context, compiled, options, route="/api/extract", model=body.model)
        logged = {"id": decided.id} if decided.id is not None else {}
        reply = {**logged, **decided.result.to_json(), "schema": field_kinds(compiled)}
        return JSONResponse(reply, headers=decided.headers)

    @router.post("/api/outcomes", openapi_extra=documented(OutcomeRequest))
    async def outcomes(request: Request) -> Any:
        body = parse_body(OutcomeRequest, await server.read_json(request), kinds={})
        if server.log is None:
            message = "Outcomes: this server keeps no log (start it with pcd serve --log FILE)."
            raise HTTPError(404, "not_found", message)
        schema = server.log.schema_of(body.id)
        if schema is None:
            message = f"Outcome id {body.id!r}: expected the id of a decision this server logged (a reply's " \
                      f"{DECISION_ID_HEADER} header, or its pcd.decision_id)."  # fmt: skip
            raise HTTPError(404, "not_found", message, param="id")
        problem = outcome_problem(schema, body.values)
        if problem is not None:
            raise HTTPError(400, "invalid_request", problem[1], param=problem[0])
        if not server.log.outcome(body.id, body.values):
            raise HTTPError(503, "log_unwritable", f"Outcome id {body.id!r}: the log could not be written; try again.")
        return {"id": body.id, "recorded": sorted(body.values)}

    @router.post("/api/baseline", openapi_extra=documented(BaselineRequest))
    async def baseline(request: Request) -> Any:
        body = parse_body(BaselineRequest, await server.read_json(request), kinds=_KINDS)
        compiled = compile_schema(body.schema_)
        limit = body.options.get("max_new_tokens")
        if limit is not None and (not isinstance(limit, int) or not 0 < limit <= server.max_new_tokens):
            raise HTTPError(400, "invalid_request", f"options.max_new_tokens: expected 1..{server.max_new_tokens}.")
        steps = await run_in_threadpool(stream_baseline, server.engine, body.context, compiled, max_new_tokens=limit)
        return StreamingResponse(
            iterate_in_threadpool(_events(compiled, steps)),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache"},
        )

    return router
