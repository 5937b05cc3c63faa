"""The server's decision log: ``pcd serve --log LOG.jsonl`` appends each ``/api/extract`` request it answers (its
id, schema, text and values), and ``POST /api/outcomes`` appends what the answer should have been, by id; ``pcd fit
--log LOG.jsonl`` reads the two back as labelled examples (:func:`logged_examples`), the path from logged traffic and
reported outcomes to a decision head.

One JSON object per line, appended under a lock and flushed per line, so a log survives a crash up to its last line:

* ``{"kind": "request", "id", "time", "schema": {"title", "fingerprint", "json"}, "text", "values"}``
* ``{"kind": "outcome", "id", "time", "values"}``: the right values of some fields of that request (a later outcome
  for the same id and field wins).
"""

from __future__ import annotations

import json
import os
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pcd_engine.errors import InputError
from pcd_engine.result import ExtractionResult
from pcd_engine.schema import Schema

__all__ = ["DecisionLog", "logged_examples"]

KNOWN_IDS = 100_000
"""How many of the latest request ids a running server accepts outcomes for (older ones are in the log only)."""


class DecisionLog:
    """Appends requests and outcomes to a JSON-lines file (see the module docstring).

    Args:
        path: The log file (created, or appended to; its folder must exist).

    Raises:
        InputError: If the file cannot be opened for appending.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        try:
            self._file = self.path.open("a", encoding="utf-8")
        except OSError as exc:
            raise InputError(
                f"Log {str(path)!r}: expected a file that can be appended to, but {exc.strerror}."
            ) from None
        self._lock = threading.Lock()
        self._known: OrderedDict[str, str] = OrderedDict()  # id -> schema fingerprint

    def _write(self, entry: Mapping[str, Any]) -> None:
        line = json.dumps(entry, ensure_ascii=False, default=str)
        with self._lock:
            self._file.write(line + "\n")
            self._file.flush()

    def record(self, schema: Schema, text: str, result: ExtractionResult) -> str:
        """Log one answered request; returns its id (what an outcome names)."""
        ident = f"dec-{uuid.uuid4().hex}"
        self._write({"kind": "request", "id": ident, "time": time.time(), "text": text, "values": result.values,
                     "schema": {"title": schema.title, "fingerprint": schema.fingerprint,
                                "json": schema.json_schema()}})  # fmt: skip
        with self._lock:
            self._known[ident] = schema.fingerprint
            while len(self._known) > KNOWN_IDS:
                self._known.popitem(last=False)
        return ident

    def knows(self, ident: str) -> bool:
        """Whether ``ident`` is one of the latest :data:`KNOWN_IDS` requests this server logged."""
        with self._lock:
            return ident in self._known

    def outcome(self, ident: str, values: Mapping[str, Any]) -> None:
        """Log the right values of some fields of request ``ident`` (checked against the schema when fitted)."""
        self._write({"kind": "outcome", "id": ident, "time": time.time(), "values": dict(values)})

    def close(self) -> None:
        with self._lock:
            self._file.close()


def logged_examples(path: str | os.PathLike[str], schema: Schema) -> list[tuple[str, dict[str, Any]]]:
    """The labelled examples of a decision log for ``schema``: each logged request of that schema (by fingerprint)
    with an outcome, its text and the outcome's values (later outcomes win, field by field), in the order of their
    first outcomes.

    Raises:
        InputError: If the file cannot be read, or a line is not a log entry (naming the line).
    """
    from pcd_engine.tagging.corpus import json_lines

    if not Path(path).is_file():
        raise InputError(f"Log {str(path)!r}: expected a pcd serve --log file, but there is none.")
    texts: dict[str, str] = {}
    outcomes: dict[str, dict[str, Any]] = {}
    for where, entry in json_lines(Path(path), what="Log"):
        kind, ident = entry.get("kind"), entry.get("id")
        if kind not in ("request", "outcome") or not isinstance(ident, str):
            raise InputError(f"Log {where}: expected a request or outcome entry with an id, but got {sorted(entry)}.")
        if kind == "request" and (entry.get("schema") or {}).get("fingerprint") == schema.fingerprint:
            texts[ident] = str(entry.get("text", ""))
        elif kind == "outcome" and isinstance(entry.get("values"), Mapping):
            outcomes.setdefault(ident, {}).update(entry["values"])
    return [(texts[i], values) for i, values in outcomes.items() if i in texts and values]
