"""What every route of ``pcd serve`` shares: :class:`Server`, the engine with the server's limits, and the steps
each route takes (read a JSON body within the limits, parse a client's options, run an engine call in a worker
thread that a client going away cancels). The app (:mod:`.app`) builds one and hands it to each router.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pcd_engine.errors import OptionError
from pcd_engine.limits import RequestLimits
from pcd_engine.options import ExtractOptions, surface_options
from pcd_engine.result import ExtractionResult
from pcd_engine.run.collector import Collector
from pcd_engine.schema import Schema
from pcd_engine.tools.serve.errors import HTTPError
from pcd_engine.tools.serve.outcomes import DecisionLog, result_entry
from pcd_engine.tools.serve.served import ServedHead, mismatch

if TYPE_CHECKING:
    from fastapi import Request

    from pcd_engine.engine import Engine

__all__ = ["DECISION_ID_HEADER", "Decided", "Server"]

DECISION_ID_HEADER = "x-pcd-decision-id"
"""The response header that carries a logged decision's id (what ``POST /api/outcomes`` names)."""


@dataclass(frozen=True)
class Decided:
    """One decided request: the engine's result, and the id the log keeps it under.

    Attributes:
        result: The extraction.
        id: The log's id for it (``None``: the server keeps no log, or the write failed).
    """

    result: ExtractionResult
    id: str | None

    @property
    def headers(self) -> dict[str, str]:
        """The response headers that say the decision's id (none without one)."""
        return {} if self.id is None else {DECISION_ID_HEADER: self.id}

    def evidence(self) -> dict[str, Any]:
        """The result's evidence (:meth:`~pcd_engine.result.ExtractionResult.evidence`), with ``decision_id``
        when logged."""
        return {**self.result.evidence(), **({"decision_id": self.id} if self.id is not None else {})}


@dataclass(frozen=True)
class Server:
    """What every route shares: the engine and the server's limits.

    Attributes:
        engine: A loaded engine (thread-safe; requests run in worker threads).
        model_name: The model id that replies name; ``/v1/models`` lists it first.
        max_body_bytes: Larger request bodies get 413.
        max_new_tokens: Upper bound on generated tokens for free text and the streamed baseline.
        limits: What one extraction may ask for (labels, generated tokens, seconds).
        body_timeout_s: Seconds a client may take to send its whole request body before a 408.
        aliases: Other names requests may use for the model (``default``, the alias, the folder).
        collector: Collects concurrent extractions into shared batches (one pass per wave for all of them);
            ``None`` runs each alone.
        log: Where every decided request and its reported outcomes go
            (:class:`~pcd_engine.tools.serve.outcomes.DecisionLog`); ``None``: nowhere.
        heads: Fitted decision models served by name (:class:`~pcd_engine.tools.serve.served.ServedHead`).
    """

    engine: Engine
    model_name: str
    max_body_bytes: int
    max_new_tokens: int
    limits: RequestLimits
    body_timeout_s: float
    aliases: tuple[str, ...] = ()
    collector: Collector | None = None
    log: DecisionLog | None = None
    heads: Mapping[str, ServedHead] = dataclasses.field(default_factory=dict)

    @property
    def model_names(self) -> tuple[str, ...]:
        """Every name ``/v1`` accepts for the base model, the reply's name first."""
        return tuple(dict.fromkeys((self.model_name, *self.aliases, "default")))

    def check_model(self, name: Any) -> None:
        """Accept any of :attr:`model_names` and the served heads' names (and no model at all, as local servers
        do).

        Raises:
            HTTPError: 404 naming the accepted names.
        """
        if name is not None and name not in self.model_names and self.served(name) is None:
            known = [*self.model_names, *self.heads]
            message = f"Model {name!r}: expected one of {known} (the served model's names and its fitted heads)."
            raise HTTPError(404, "model_not_found", message, param="model")

    def served(self, name: Any) -> ServedHead | None:
        """The head served as model ``name``, or ``None`` (the base model, or no name)."""
        return self.heads.get(name) if isinstance(name, str) else None

    def reply_name(self, name: Any) -> str:
        """The model a reply names: the served head's name when the request named one, else the model's."""
        return name if self.served(name) is not None else self.model_name

    async def read_json(self, request: Request) -> dict[str, Any]:
        """The request's JSON object, read within the size and time limits.

        Raises:
            HTTPError: 415 for another media type, 413 for a body too large, 408 for one too slow, 400 for bad
                JSON or a JSON value that is not an object.
        """
        media = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if media != "application/json":
            raise HTTPError(
                415,
                "unsupported_media_type",
                f"Request body: expected Content-Type application/json, but got {media or 'none'!r}.",
            )
        too_large = HTTPError(413, "request_too_large", f"Request body: expected at most {self.max_body_bytes} bytes.")
        declared = request.headers.get("content-length")
        if declared and declared.isdigit() and int(declared) > self.max_body_bytes:
            raise too_large
        body = bytearray()
        chunks = request.stream().__aiter__()
        clock = asyncio.get_running_loop()
        deadline = clock.time() + self.body_timeout_s  # for the whole body: a trickle of bytes cannot extend it
        while True:
            try:
                chunk = await asyncio.wait_for(chunks.__anext__(), timeout=max(0.0, deadline - clock.time()))
            except StopAsyncIteration:
                break
            except asyncio.TimeoutError:
                message = f"Request body: expected the whole body within {self.body_timeout_s:g} s."
                raise HTTPError(408, "request_timeout", message) from None
            body += chunk
            if len(body) > self.max_body_bytes:
                raise too_large
        try:
            data = json.loads(bytes(body) or b"null")
        except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:
            detail = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)
            raise HTTPError(400, "invalid_json", f"Request body: expected JSON, but got bad JSON ({detail}).") from None
        if not isinstance(data, dict):
            raise HTTPError(400, "invalid_request", "Request body: expected a JSON object.")
        return data

    def client_options(self, raw: Any, *, where: str = "options", model: Any = None) -> ExtractOptions:
        """A client's options; the server's own limits and memory budget are not the client's to change, and a
        ``head`` comes as its JSON data (a request never names a file for the server to read). A ``model`` that
        names a served head decides with that head.

        Raises:
            HTTPError: 400 for an unknown or bad option, one that only the server sets, or a head beside a model
                that has its own.
        """
        served = self.served(model)
        if served is not None and isinstance(raw, Mapping) and raw.get("head") is not None:
            message = f"{where}.head: model {served.name!r} decides with its own head; drop the head, or name the " \
                      f"base model {self.model_name!r}."  # fmt: skip
            raise HTTPError(400, "invalid_request", message, param=f"{where}.head")
        if isinstance(raw, Mapping) and raw.get("head") is not None and not isinstance(raw["head"], Mapping):
            message = f"{where}.head: expected a head's JSON data (what pcd fit writes), but got {raw['head']!r}."
            raise HTTPError(400, "invalid_request", message, param=where)
        try:
            options = surface_options((where, raw))
        except OptionError as exc:
            raise HTTPError(400, "invalid_request", str(exc), param=where) from None
        for name in ("limits", "memory_budget_mb"):
            if getattr(options, name) is not None:
                message = f"{where}.{name}: set by the server (pcd serve flags), not by a request."
                raise HTTPError(400, "invalid_request", message, param=where)
        return options if served is None else dataclasses.replace(options, head=served.head)

    async def run_engine(self, request: Request, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run an engine call in a worker thread; if the client goes away, cancel it at the next pass."""
        from starlette.concurrency import run_in_threadpool

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

    async def extract(self, request: Request, text: str, schema: Schema, options: ExtractOptions) -> ExtractionResult:
        """One extraction under the server's limits, cancelled if the client goes away; decided in a shared batch
        with the other requests of the moment when the server collects them."""
        run = self.engine.extract if self.collector is None else self.collector.extract
        result: ExtractionResult = await self.run_engine(request, run, text, schema, options, limits=self.limits)
        return result

    async def decide(
        self, request: Request, text: str, schema: Schema, options: ExtractOptions, *, route: str, model: Any = None
    ) -> Decided:
        """What every deciding route does: a request naming a served head is checked against the head's schema
        (options from :meth:`client_options` carry the head), decided (:meth:`extract`), its shadow candidate
        decided beside it when the head has one, and logged when the server keeps a log.

        Raises:
            HTTPError: 400 naming what differs when the request's schema or questions are not the served head's.
        """
        served = self.served(model)
        if served is not None:
            differs = mismatch(served.head, schema)
            if differs is not None:
                message = f"Model {served.name!r}: expected the schema its head was fitted on, but {differs}."
                raise HTTPError(400, "invalid_request", message, param="model")
        result = await self.extract(request, text, schema, options)
        if self.log is None:
            return Decided(result, None)
        shadow = None
        if served is not None and served.shadow is not None:
            candidate = await self.extract(request, text, schema, dataclasses.replace(options, head=served.shadow))
            shadow = {"head": served.shadow_path, **result_entry(candidate)}
        name = served.name if served is not None else self.model_name
        return Decided(result, self.log.record(schema, text, result, route=route, model=name, shadow=shadow))
