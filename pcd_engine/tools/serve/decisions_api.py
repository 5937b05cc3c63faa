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
from collections.abc import Mapping
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from pcd_engine.errors import ContextError
from pcd_engine.questions import Decisions, Question, content_text, questions_schema, read_decisions, state_text
from pcd_engine.tools.serve.answers import read_request
from pcd_engine.tools.serve.errors import HTTPError
from pcd_engine.tools.serve.models import DecisionsRequest, SystemOneRequest, documented
from pcd_engine.tools.serve.responses_api import input_turns
from pcd_engine.tools.serve.server import Server

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
        decided = await _decide(server, request, text, asked, body.pcd)
        levels = {raw["name"]: raw.get("levels") for raw in body.questions}
        answers = [{"name": name, **_wire_answer(a, levels[name])} for name, a in decided.answers.items()]
        usage: dict[str, Any] = dict(decided.usage.input_output())
        usage.update(input_tokens_details={"cached_tokens": decided.result.stats.cached_tokens},
                     output_tokens_details={"reasoning_tokens": 0})  # fmt: skip
        reply = {"id": f"dec_{uuid.uuid4().hex[:24]}", "object": "decision", "created": int(time.time()),
                 "model": server.model_name, "answers": answers, "usage": usage,
                 "pcd": decided.result.evidence()}  # fmt: skip
        return JSONResponse(reply, headers={"x-request-id": f"req_{uuid.uuid4().hex[:24]}"})

    @router.post("/v1/systemone", openapi_extra=documented(SystemOneRequest))
    async def systemone(request: Request) -> Any:
        body = await read_request(server, request, SystemOneRequest)
        asked = {name: _systemone_question(raw, f"questions.{name}") for name, raw in body.questions.items()}
        decided = await _decide(server, request, _text(body.state, "state"), asked, body.pcd)
        answers = {name: _systemone_answer(a, body.questions[name]) for name, a in decided.answers.items()}
        reply = {"model": server.model_name, "answers": answers, "usage": decided.usage.input_output(),
                 "pcd": decided.result.evidence()}  # fmt: skip
        return JSONResponse(reply, headers={"x-typesafe-request-id": f"req_{uuid.uuid4().hex[:24]}"})

    return router


async def _decide(server: Server, request: Request, text: str, asked: dict[str, Question], pcd: Any) -> Decisions:
    """Every question answered from one extraction, in a shared batch with the server's other requests."""
    options = server.client_options(pcd, where="pcd")
    schema = questions_schema(asked)  # a SchemaError is a 400 naming the question
    return read_decisions(await server.extract(request, text, schema, options), asked)


def _text(state: Any, param: str) -> str:
    """The state's text (:func:`pcd_engine.questions.state_text`).

    Raises:
        HTTPError: 400 for media, or a state that is no text, JSON object or array.
    """
    try:
        return state_text(state, where=param)
    except ContextError as exc:
        raise HTTPError(400, "invalid_request", str(exc), param=param) from None


def _content(value: Any, where: str) -> str:
    try:
        return content_text(value, where=where)
    except ContextError as exc:
        raise HTTPError(400, "invalid_request", f"{where}: {exc}", param=where) from None


def _items(raw: Mapping[str, Any], key: str, where: str, least: int) -> list[Any]:
    items = raw.get(key)
    if not isinstance(items, list) or len(items) < least:
        message = f"{where}.{key}: expected a list of at least {least}, but got {items!r}."
        raise HTTPError(400, "invalid_request", message, param=f"{where}.{key}")
    return items


def _wire_question(raw: Any, where: str) -> tuple[str, Question]:
    """One ``/v1/decisions`` question as the engine's.

    Raises:
        HTTPError: 400 naming the part of the question at fault.
    """
    kind = raw.get("type") if isinstance(raw, dict) else None
    name = raw.get("name") if isinstance(raw, dict) else None
    if kind not in ("predicate", "choice", "score"):
        message = f"{where}.type: expected 'predicate', 'choice' or 'score', but got {kind!r}."
        raise HTTPError(400, "invalid_request", message, param=f"{where}.type")
    if not isinstance(name, str) or not name:
        raise HTTPError(400, "invalid_request", f"{where}.name: expected a non-empty string.", param=f"{where}.name")
    instructions = _content(raw.get("instructions"), f"{where}.instructions")
    if kind == "predicate":
        return name, Question.yes_no(instructions)
    if kind == "choice":
        choices = {}
        for j, item in enumerate(_items(raw, "choices", where, 1)):
            at = f"{where}.choices[{j}]"
            value = item.get("value") if isinstance(item, dict) else None
            if not isinstance(value, (str, bool)) or value in choices:
                message = f"{at}.value: expected a string or boolean used once, but got {value!r}."
                raise HTTPError(400, "invalid_request", message, param=f"{at}.value")
            about = item.get("description")
            choices[value] = None if about is None else _content(about, f"{at}.description")
        return name, Question.choice(instructions, choices)
    levels = []
    for j, item in enumerate(_items(raw, "levels", where, 2)):
        at = f"{where}.levels[{j}]"
        label = item.get("label") if isinstance(item, dict) else None
        if not isinstance(label, str) or not label.strip():
            raise HTTPError(400, "invalid_request", f"{at}.label: expected text, but got {label!r}.", param=at)
        about = item.get("description")
        levels.append(label if about is None else f"{label}: {_content(about, f'{at}.description')}")  # the rubric
    return name, Question.score(instructions, levels)


def _wire_answer(answer: Any, levels: Any) -> dict[str, Any]:
    """One answer in the ``/v1/decisions`` shape (probabilities as lists, a score's ``levels`` with their labels)."""
    if answer.kind == "yes_no":
        return {"type": "predicate", "probability": answer.yes}
    if answer.kind == "choice":
        probabilities = [{"value": v, "probability": p} for v, p in answer.probabilities.items()]
        return {"type": "choice", "choice": answer.value, "probabilities": probabilities,
                "confidence": answer.confidence}  # fmt: skip
    rows = [{"value": v, "label": levels[int(v)]["label"], "probability": p} for v, p in answer.probabilities.items()]
    return {"type": "score", "score": answer.score, "probabilities": rows, "confidence": answer.confidence}


def _systemone_question(raw: Any, where: str) -> Question:
    """One ``/v1/systemone`` question as the engine's.

    Raises:
        HTTPError: 400 naming the part of the question at fault.
    """
    kind = raw.get("type") if isinstance(raw, dict) else None
    if kind not in ("noul", "choice", "score"):
        message = f"{where}.type: expected 'noul', 'choice' or 'score', but got {kind!r}."
        raise HTTPError(400, "invalid_request", message, param=f"{where}.type")
    instructions = _content(raw.get("instructions"), f"{where}.instructions")
    criteria = raw.get("criteria")
    if kind == "noul":
        if criteria is not None and not isinstance(criteria, dict):
            message = f"{where}.criteria: expected an object with 'true' and 'false', but got {criteria!r}."
            raise HTTPError(400, "invalid_request", message, param=f"{where}.criteria")
        yes, no = (criteria or {}).get("true"), (criteria or {}).get("false")
        return Question.yes_no(
            instructions,
            yes=None if yes is None else _content(yes, f"{where}.criteria.true"),
            no=None if no is None else _content(no, f"{where}.criteria.false"),
        )
    if kind == "choice":
        if not isinstance(criteria, dict) or not criteria:
            message = f"{where}.criteria: expected an object of label to description, but got {criteria!r}."
            raise HTTPError(400, "invalid_request", message, param=f"{where}.criteria")
        labels = {k: None if v is None else _content(v, f"{where}.criteria.{k}") for k, v in criteria.items()}
        return Question.choice(instructions, labels)
    levels = _items(raw, "criteria", where, 2)
    return Question.score(instructions, [_content(c, f"{where}.criteria[{j}]") for j, c in enumerate(levels)])


def _systemone_answer(answer: Any, raw: Mapping[str, Any]) -> dict[str, Any]:
    """One answer in the ``/v1/systemone`` shape."""
    if answer.kind == "yes_no":
        return {"type": "noul", "noul": answer.yes}
    probabilities = {str(k) if answer.kind == "score" else k: p for k, p in answer.probabilities.items()}
    if answer.kind == "choice":
        return {"type": "choice", "choice": answer.value, "probabilities": probabilities,
                "confidence": answer.confidence}  # fmt: skip
    legend = {str(i): level for i, level in enumerate(raw["criteria"])}
    return {"type": "score", "score": answer.score, "legend": legend, "probabilities": probabilities,
            "confidence": answer.confidence}  # fmt: skip
