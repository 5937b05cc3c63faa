"""The server's decision log: ``pcd serve --log LOG.jsonl`` appends every request a route decides (``/api/extract``,
``/v1/decisions``, ``/v1/systemone``, structured chat completions and responses), each under an id the client gets
back (the ``x-pcd-decision-id`` header, and the body's ``pcd`` evidence); ``POST /api/outcomes`` appends what the
answer should have been, for any logged id, checked against that request's fields and labels; ``pcd fit --log``
reads the two back as labelled examples (:func:`logged_examples`), and ``pcd promote`` compares a shadowed candidate
with the live head on them (:func:`shadowed_outcomes`).

One JSON object per line, appended under a lock and flushed per line:

* ``{"kind": "request", "id", "time", "route", "model", "schema": {"title", "fingerprint", "json"}, "text",
  "values", "probabilities": {field: [p, ...]}}``, and ``"shadow": {"head", "values", "probabilities"}`` when a
  candidate head ran beside the live one (``pcd serve --shadow``);
* ``{"kind": "outcome", "id", "time", "values"}``: the right values of some fields of that request (a later outcome
  for the same id and field wins).

A log survives what a crash or a full disk leaves: a write that fails is reported once on stderr and the answer goes
out unlogged (without an id); reading, a torn last line (a crash mid-write) is skipped with a warning, and a line that
is not an entry is reported by its number and skipped (:func:`read_log`).
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from pcd_engine.errors import InputError, OptionError
from pcd_engine.jsonl import json_lines
from pcd_engine.result import ExtractionResult
from pcd_engine.schema import Schema, compile_schema

__all__ = ["DecisionLog", "Warn", "logged_examples", "outcome_problem", "read_log", "result_entry"]

KNOWN_IDS = 100_000
"""How many of the latest request ids a running server accepts outcomes for (older ones are in the log only)."""

Warn = Callable[[str], None]
"""Where a reader's warnings go (a skipped line, named by its number)."""


def _stderr(message: str) -> None:
    sys.stderr.write(f"pcd: warning: {message}\n")


def result_entry(result: ExtractionResult) -> dict[str, Any]:
    """What the log keeps of one decision: the values, and each scored single-label field's distribution."""
    probabilities = {name: list(f.label_distribution) for name, f in result.fields.items()
                     if f.label_distribution is not None}  # fmt: skip
    return {"values": result.values, "probabilities": probabilities}


class DecisionLog:
    """Appends decided requests and their outcomes to a JSON-lines file (see the module docstring).

    The ids already in the file are known again when a server restarts on it, so an outcome can be posted for a
    request answered before the restart.

    Args:
        path: The log file (created, or appended to; its folder must exist).
        warn: Where a failed write and a skipped line of an existing log are reported (default: stderr).

    Raises:
        InputError: If the file cannot be opened for appending.
    """

    def __init__(self, path: str | os.PathLike[str], *, warn: Warn = _stderr) -> None:
        self.path = Path(path)
        self._warn = warn
        self._lock = threading.Lock()
        self._known: OrderedDict[str, str] = OrderedDict()  # id -> schema fingerprint
        self._schemas: dict[str, Any] = {}  # fingerprint -> Schema, or its JSON until an outcome needs it
        self.failed_writes = 0
        if self.path.is_file() and self.path.stat().st_size:
            for entry in read_log(self.path, warn=warn):
                if entry["kind"] == "request" and isinstance(entry.get("schema"), Mapping):
                    self._remember(entry["id"], entry["schema"].get("fingerprint"), entry["schema"].get("json"))
        try:
            self._file = self.path.open("a", encoding="utf-8")
        except OSError as exc:
            raise InputError(
                f"Log {str(path)!r}: expected a file that can be appended to, but {exc.strerror}."
            ) from None

    def _remember(self, ident: str, fingerprint: Any, schema: Any) -> None:
        if not isinstance(fingerprint, str):
            return
        self._known[ident] = fingerprint
        self._schemas.setdefault(fingerprint, schema)
        while len(self._known) > KNOWN_IDS:
            self._known.popitem(last=False)

    def _write(self, entry: Mapping[str, Any]) -> bool:
        """Append one entry; ``False`` (reported on the first failure) when it could not be written."""
        line = json.dumps(entry, ensure_ascii=False, default=str)
        with self._lock:
            try:
                self._file.write(line + "\n")
                self._file.flush()
            except (OSError, ValueError) as exc:
                self.failed_writes += 1
                if self.failed_writes == 1:
                    why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
                    self._warn(f"log {str(self.path)!r} could not be written ({why}); answers go on, unlogged.")
                return False
        return True

    def record(
        self, schema: Schema, text: str, result: ExtractionResult, *, route: str, model: str,
        shadow: Mapping[str, Any] | None = None,
    ) -> str | None:  # fmt: skip
        """Log one decided request; returns its id (what an outcome names), or ``None`` when it could not be
        written (the answer goes out without one).

        Args:
            schema: The schema decided (for questions, theirs).
            text: The text decided.
            result: The answer.
            route: The route (``/v1/decisions``).
            model: The model name the request used (a served head's name, or the base model's).
            shadow: A candidate head's decision beside it: ``{"head": path, "values", "probabilities"}``.
        """
        ident = f"dec-{uuid.uuid4().hex}"
        entry = {"kind": "request", "id": ident, "time": time.time(), "route": route, "model": model,
                 "schema": {"title": schema.title, "fingerprint": schema.fingerprint, "json": schema.json_schema()},
                 "text": text, **result_entry(result), **({"shadow": dict(shadow)} if shadow else {})}  # fmt: skip
        if not self._write(entry):
            return None
        with self._lock:
            self._remember(ident, schema.fingerprint, schema)
        return ident

    def schema_of(self, ident: str) -> Schema | None:
        """The schema of logged request ``ident`` (one of the latest :data:`KNOWN_IDS`), or ``None``."""
        with self._lock:
            fingerprint = self._known.get(ident)
            if fingerprint is None:
                return None
            schema = self._schemas.get(fingerprint)
        if not isinstance(schema, Schema):
            schema = compile_schema(schema)
            with self._lock:
                self._schemas[fingerprint] = schema
        return schema

    def outcome(self, ident: str, values: Mapping[str, Any]) -> bool:
        """Log the right values of some fields of request ``ident`` (check them first: :func:`outcome_problem`);
        ``False`` when the log could not be written."""
        return self._write({"kind": "outcome", "id": ident, "time": time.time(), "values": dict(values)})

    def close(self) -> None:
        with self._lock:
            self._file.close()


def outcome_problem(schema: Schema, values: Mapping[str, Any]) -> tuple[str, str] | None:
    """What is wrong with an outcome's values for a request of ``schema``, as ``(param, message)``, or ``None``:
    each must name a field, and a closed field's value must be one of its labels (a multi-label field's, a list of
    them)."""
    for name, value in values.items():
        param = f"values.{name}"
        try:
            spec = schema.field(name)
        except KeyError:
            keys = [s.name for s in schema.fields]
            return param, f"{param}: expected a field of {schema.title!r} ({keys}), but the request has no {name!r}."
        if not spec.scored:
            continue
        given = value if spec.kind == "multi" and isinstance(value, list) else [value]
        if spec.kind == "multi" and not isinstance(value, list):
            return param, f"{param}: expected a list of labels of {list(spec.values)}, but got {value!r}."
        bad = [v for v in given if spec.label_index(v) is None]
        if bad:
            return param, f"{param}: expected one of the labels {list(spec.values)}, but got {bad[0]!r}."
    return None


def read_log(path: str | os.PathLike[str], *, warn: Warn = _stderr) -> list[dict[str, Any]]:
    """The entries of a log, in order, skipping what a crash or a bad write left: a torn last line (no newline at
    the end, and not JSON) with a warning, and any other line that is not an entry (bad JSON, or no ``kind`` and
    ``id``) reported by its number.

    Raises:
        InputError: If the file does not exist or cannot be read.
    """
    file = Path(path)
    if not file.is_file():
        raise InputError(f"Log {str(path)!r}: expected a pcd serve --log file, but there is none.")

    def skipped(where: str, problem: str, torn: bool) -> None:
        if torn:
            warn(f"log {where}: the last line is cut short (a crash while it was written?); skipped.")
        else:
            warn(f"log {where}: expected a log entry, but {problem}; skipped.")

    entries = []
    try:
        for where, entry in json_lines(file, what="Log", skip=skipped):
            if entry.get("kind") not in ("request", "outcome") or not isinstance(entry.get("id"), str):
                warn(f"log {where}: expected a request or outcome entry with an id, but got {sorted(entry)}; skipped.")
                continue
            entries.append(entry)
    except OSError as exc:
        raise InputError(f"Log {str(path)!r}: expected a readable file, but {exc.strerror}.") from None
    return entries


def _requests_and_outcomes(
    entries: Sequence[dict[str, Any]],
) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, Any]]]:
    """The requests by id, and each id's outcome values (later outcomes win, field by field; first outcome's
    order)."""
    requests: dict[str, dict[str, Any]] = {}
    outcomes: dict[str, dict[str, Any]] = {}
    for entry in entries:
        if entry["kind"] == "request" and isinstance(entry.get("schema"), Mapping):
            requests[entry["id"]] = entry
        elif entry["kind"] == "outcome" and isinstance(entry.get("values"), Mapping):
            outcomes.setdefault(entry["id"], {}).update(entry["values"])
    return requests, outcomes


def logged_examples(
    path: str | os.PathLike[str], schema: Schema | None = None, *, served: str | None = None, warn: Warn = _stderr
) -> tuple[Schema, list[tuple[str, dict[str, Any]]]]:
    """The labelled examples of a decision log: each logged request with an outcome, its text and the outcome's
    values (in the order of their first outcomes), of one schema or question set.

    Args:
        path: The log.
        schema: Keep requests of this schema (by fingerprint); ``None``: the one schema the requests with outcomes
            have (after ``served``), compiled from the log.
        served: Keep requests that named this model (a served head's name).
        warn: Where skipped lines are reported.

    Returns:
        The schema and the examples.

    Raises:
        InputError: If the log cannot be read, or ``schema`` is ``None`` and the requests with outcomes are of
            several schemas (naming them) or none.
    """
    requests, outcomes = _requests_and_outcomes(read_log(path, warn=warn))
    kept = [(requests[i], v) for i, v in outcomes.items() if i in requests and v
            and (served is None or requests[i].get("model") == served)]  # fmt: skip
    if schema is None:
        groups: dict[str, tuple[str, Any, int]] = {}
        for entry, _ in kept:
            fp, title = entry["schema"].get("fingerprint"), entry["schema"].get("title")
            count = groups.get(fp, (title, entry["schema"].get("json"), 0))[2]
            groups[fp] = (title, entry["schema"].get("json"), count + 1)
        if len(groups) != 1:
            listed = "; ".join(f"{t!r} (fingerprint {fp}, {n} with outcomes)" for fp, (t, _, n) in groups.items())
            raise InputError(f"Log {str(path)!r}: expected the requests with outcomes{_of(served)} to share one "
                             f"schema or question set, but found {listed or 'none'}; name one with --schema or "
                             "--served.")  # fmt: skip
        try:
            schema = compile_schema(next(iter(groups.values()))[1])
        except Exception as exc:  # noqa: BLE001 - a log's schema that no longer compiles is a bad log
            raise InputError(f"Log {str(path)!r}: expected a schema pcd compiles, but {exc}") from None
    fingerprint = schema.fingerprint
    return schema, [(str(e.get("text", "")), v) for e, v in kept if e["schema"].get("fingerprint") == fingerprint]


def _of(served: str | None) -> str:
    return "" if served is None else f" of model {served!r}"


def shadowed_outcomes(
    path: str | os.PathLike[str], *, served: str | None = None, since: float | None = None, warn: Warn = _stderr
) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """The logged requests that a candidate head shadowed and that have outcomes, with their outcomes' values:
    ``(request entry, values)`` (:func:`~pcd_engine.tools.cli.promote.compare` scores them).

    Args:
        path: The log.
        served: Keep requests that named this model.
        since: Keep requests logged at or after this Unix time.
        warn: Where skipped lines are reported.

    Raises:
        InputError: If the log cannot be read.
        OptionError: If ``since`` is not a number.
    """
    if since is not None and not isinstance(since, (int, float)):
        raise OptionError(f"since: expected a Unix time, but got {since!r}.")
    requests, outcomes = _requests_and_outcomes(read_log(path, warn=warn))
    return [(requests[i], v) for i, v in outcomes.items()
            if i in requests and isinstance(requests[i].get("shadow"), Mapping)
            and (served is None or requests[i].get("model") == served)
            and (since is None or float(requests[i].get("time", 0)) >= since)]  # fmt: skip
