"""The decision routes: ``POST /v1/decisions`` (the OpenAI Decisions wire format, as ``langchain_openai.decisions``'
``OpenAIDecisions`` and ``OpenAIClassifier`` send it) and ``POST /v1/systemone`` (what ``langchain_typesafe``'s
``TypeSafeClassifier`` sends).

Both read typed questions about one state and answer every question from one extraction of their schema
(:mod:`pcd_engine.questions`): one pass per wave, decided in a shared batch with the server's other requests of the
moment. ``predicate`` / ``noul`` is yes or no; ``choice`` one of its values (several tokens each, scored exactly);
``score`` a level of its rubric, the answer's ``score`` the expected level. ``confidence`` is how concentrated the
distribution is (``1 - H(p) / log(K)``). Media and bad questions are 400s naming the field; pcd options go in the
extra field ``pcd``, and the engine's evidence comes back in ``pcd``.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from pcd_engine.errors import ContextError, QuestionError
from pcd_engine.questions import Decisions, Question, questions_schema, read_decisions, state_text, wire_type
from pcd_engine.tools.serve.answers import read_request
from pcd_engine.tools.serve.errors import HTTPError
from pcd_engine.tools.serve.models import DecisionsRequest, SystemOneRequest, documented
from pcd_engine.tools.serve.responses_api import input_turns
from pcd_engine.tools.serve.server import Decided, Server

__all__ = ["decisions_router"]


def decisions_router(server: Server) -> APIRouter:
    """The ``/v1/decisions`` and ``/v1/systemone`` routes, served by ``server``."""
    router = APIRouter()

    @router.post("/v1/decisions", openapi_extra=documented(DecisionsRequest))
    async def decisions(request: Request) -> Any:
        body = await read_request(server, request, DecisionsRequest)
        asked = {}
        for i, raw in enumerate(body.questions):
            name, question = _wire_question(raw, f"questions[{i}]")
            if name in asked:
                raise HTTPError(400, "invalid_request", f"questions[{i}].name: {name!r} is used twice.", param="name")
            asked[name] = question
        text = _text(body.input if isinstance(body.input, str) else input_turns(body.input), "input")
        decided, logged = await _decide(server, request, text, asked, body, "/v1/decisions")
        levels = {raw["name"]: raw.get("levels") for raw in body.questions}
        answers = [{"name": name, **a.wire("decisions", legend=_level_labels(levels[name]))}
                   for name, a in decided.answers.items()]  # fmt: skip
        usage: dict[str, Any] = dict(decided.usage.input_output())
        usage.update(input_tokens_details={"cached_tokens": decided.result.stats.cached_tokens},
                     output_tokens_details={"reasoning_tokens": 0})  # fmt: skip
        reply = {"id": f"dec_{uuid.uuid4().hex[:24]}", "object": "decision", "created": int(time.time()),
                 "model": server.reply_name(body.model), "answers": answers, "usage": usage,
                 "pcd": logged.evidence()}  # fmt: skip
        return JSONResponse(reply, headers={"x-request-id": f"req_{uuid.uuid4().hex[:24]}", **logged.headers})

    @router.post("/v1/systemone", openapi_extra=documented(SystemOneRequest))
    async def systemone(request: Request) -> Any:
        body = await read_request(server, request, SystemOneRequest)
        asked = {name: _systemone_question(raw, f"questions.{name}") for name, raw in body.questions.items()}
        decided, logged = await _decide(server, request, _text(body.state, "state"), asked, body, "/v1/systemone")
        answers = {name: a.wire("systemone", legend=body.questions[name].get("criteria") or ())
                   for name, a in decided.answers.items()}  # fmt: skip
        reply = {"model": server.reply_name(body.model), "answers": answers, "usage": decided.usage.input_output(),
                 "pcd": logged.evidence()}  # fmt: skip
        return JSONResponse(reply, headers={"x-typesafe-request-id": f"req_{uuid.uuid4().hex[:24]}", **logged.headers})

    return router


async def _decide(
    server: Server, request: Request, text: str, asked: dict[str, Question], body: Any, route: str
) -> tuple[Decisions, Decided]:
    """Every question answered from one extraction, in a shared batch with the server's other requests (with the
    head of the model the request names, if it names a served head), and logged."""
    options = server.client_options(body.pcd, where="pcd", model=body.model)
    schema = questions_schema(asked)  # a SchemaError is a 400 naming the question
    logged = await server.decide(request, text, schema, options, route=route, model=body.model)
    return read_decisions(logged.result, asked), logged


def _text(state: Any, param: str) -> str:
    """The state's text (:func:`pcd_engine.questions.state_text`).

    Raises:
        HTTPError: 400 for media, or a state that is no text, JSON object or array.
    """
    try:
        return state_text(state, where=param)
    except ContextError as exc:
        raise HTTPError(400, "invalid_request", str(exc), param=param) from None


def _wire_question(raw: Any, where: str) -> tuple[str, Question]:
    """One ``/v1/decisions`` question as the engine's, with its name.

    Raises:
        HTTPError: 400 naming the part of the question at fault.
    """
    try:
        return Question.named_from_decisions(raw, where)
    except QuestionError as exc:
        raise HTTPError(400, "invalid_request", str(exc), param=exc.param) from None


def _systemone_question(raw: Any, where: str) -> Question:
    """One ``/v1/systemone`` question as the engine's.

    Raises:
        HTTPError: 400 naming the part of the question at fault.
    """
    try:
        kind = wire_type("systemone", raw.get("type") if isinstance(raw, dict) else None, where=where)
        return Question.from_wire(kind, "systemone", raw, where)
    except QuestionError as exc:
        raise HTTPError(400, "invalid_request", str(exc), param=exc.param) from None


def _level_labels(levels: Any) -> list[str]:
    """The labels of a ``/v1/decisions`` score question's levels (what its answer's rows name), lowest first."""
    return [level["label"] for level in levels or ()]
