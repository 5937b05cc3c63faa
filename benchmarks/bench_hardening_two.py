"""The second hardening (issue 45): each class of defect the adversarial probe found, what it gives now, and how long
each bounded case takes, on the embedded SmolLM2-135M.

Prints one Markdown table: the class, the probe, what the issue reported before, the outcome now (a valid value and
how it was made, or the typed error and its first words) and the seconds the call took. The time-limit rows run the
slow shapes under a small limit and report the time against the limit.

    .venv/bin/python benchmarks/bench_hardening_two.py
"""

from __future__ import annotations

import datetime
import json
import os
import pickle
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pcd_engine import Engine  # noqa: E402
from pcd_engine.calibrate.calibrator import Calibrator  # noqa: E402
from pcd_engine.errors import PCDError  # noqa: E402
from pcd_engine.limits import RequestLimits  # noqa: E402
from pcd_engine.models.resolve import default_model_path  # noqa: E402

TEXT = "Order 1182 arrived broken on 2024-03-05 at 10:00; ticket 6f1c-22. The customer wants 30 euros back today."


class Tags(BaseModel):
    tags: tuple[Literal["billing", "shipping", "broken"], ...]


class When(BaseModel):
    when: datetime.datetime


class Leaf(BaseModel):
    v: int


class Mid(BaseModel):
    inner: Leaf


class Deep(BaseModel):
    inner: Mid
    urgent: bool


class Node(BaseModel):
    name: str
    children: list[Node] = []


class Ident(BaseModel):
    ident: uuid.UUID


class Dated(BaseModel):
    when: datetime.datetime
    day: datetime.date
    ident: uuid.UUID


class Shaped(BaseModel):
    counts: dict[str, int]
    pair: tuple[str, int, float]


class Card(BaseModel):
    method: Literal["card"]
    last_digits: str


class Refund(BaseModel):
    method: Literal["refund"]
    euros: int


class Payment(BaseModel):
    payment: Annotated[Card | Refund, Field(discriminator="method")]


def outcome(fn: Callable[[], Any], model: type[BaseModel] | None = None) -> tuple[str, float]:
    """What one call gives, in words, and its seconds."""
    started = time.perf_counter()
    try:
        got = fn()
    except PCDError as exc:
        return f"{type(exc).__name__}: {str(exc)[:90]}...", time.perf_counter() - started
    seconds = time.perf_counter() - started
    if model is None:
        return f"accepted: {got!r}"[:100], seconds
    try:
        model.model_validate(got.values)
        valid = "valid"
    except Exception as exc:  # noqa: BLE001 - reported
        valid = f"INVALID ({type(exc).__name__})"
    how = "; ".join(w.split("; ", 1)[-1] for w in got.warnings if "Field" in w)[:80]
    return f"{valid}{f' ({how})' if how else ''}", seconds


def calibration_file(folder: Path, engine: Engine, edit: Callable[[dict[str, Any]], None]) -> Path:
    rows = {"urgent": [[0.7, 0.3]]}
    data = Calibrator.from_distributions(_schema(), rows, model=engine.model_id).to_json()
    edit(data)
    path = folder / f"cal-{len(list(folder.iterdir()))}.json"
    path.write_text(json.dumps(data))
    return path


def _schema() -> Any:
    from pcd_engine import compile_schema

    return compile_schema({"urgent": {"type": "boolean"}})


def folder_without(base: Path, where: Path, *, drop: str, add: str | None = None) -> str:
    target = where / f"model-{drop.replace('.', '-')}"
    shutil.copytree(base, target, ignore=shutil.ignore_patterns("*.gguf"), copy_function=os.symlink)
    (target / drop).unlink()
    if add:
        (target / add).write_bytes(pickle.dumps({"weights": [0.0]}))
    return str(target)


def rows(engine: Engine, work: Path) -> list[tuple[str, str, str, Callable[[], tuple[str, float]]]]:
    def bad_lean(value: Any) -> Callable[[dict[str, Any]], None]:
        def edit(data: dict[str, Any]) -> None:
            data["fields"][0]["bias"] = [value, 0.5]

        return edit

    def short(data: dict[str, Any]) -> None:
        data["fields"][0]["bias"] = [1.0]

    def load(edit: Callable[[dict[str, Any]], None]) -> Callable[[], Any]:
        return lambda: Calibrator.load(calibration_file(work, engine, edit))

    model = default_model_path()
    limit = RequestLimits(time_limit_s=2.0)
    return [
        ("value", "tuple of Literal, max_tokens=3", "required field None",
         lambda: outcome(lambda: engine.extract(TEXT, Tags, max_tokens=3), Tags)),
        ("value", "datetime, max_tokens=4", "cut '2024-03', ValidationError",
         lambda: outcome(lambda: engine.extract(TEXT, When, max_tokens=4), When)),
        ("value", "nested model 3 deep, max_tokens=4", "None, ValidationError",
         lambda: outcome(lambda: engine.extract(TEXT, Deep, max_tokens=4), Deep)),
        ("value", "discriminated union", "SchemaError: unknown 'mapping'",
         lambda: outcome(lambda: engine.extract(TEXT, Payment), Payment)),
        ("bounded", "UUID alone (default limits)", "44 s",
         lambda: outcome(lambda: engine.extract(TEXT, Ident), Ident)),
        ("bounded", "datetime + date + UUID (default limits)", "> 90 s, unfinished",
         lambda: outcome(lambda: engine.extract(TEXT, Dated), Dated)),
        ("bounded", "dict + tuple (default limits)", "68-88 s",
         lambda: outcome(lambda: engine.extract(TEXT, Shaped), Shaped)),
        ("bounded", "datetime + date + UUID, time limit 2 s", "no default limit",
         lambda: outcome(lambda: engine.extract(TEXT, Dated, limits=limit), Dated)),
        ("bounded", "dict + tuple, time limit 2 s", "no default limit",
         lambda: outcome(lambda: engine.extract(TEXT, Shaped, limits=limit), Shaped)),
        ("file", "calibration lean NaN", "accepted, saved as null",
         lambda: outcome(load(bad_lean(float("nan"))))),
        ("file", "calibration lean negative", "accepted", lambda: outcome(load(bad_lean(-0.5)))),
        ("file", "calibration lean zero", "accepted", lambda: outcome(load(bad_lean(0)))),
        ("file", "calibration lean 10**400", "OverflowError", lambda: outcome(load(bad_lean(10**400)))),
        ("file", "calibration lean of wrong length", "ValueError from zip() (HTTP 500)", lambda: outcome(load(short))),
        ("folder", "model folder without config.json", "transformers' own error",
         lambda: outcome(lambda: Engine.load(folder_without(model, work, drop="config.json")))),
        ("folder", "model folder with pickled weights only", "torch's own error",
         lambda: outcome(lambda: Engine.load(folder_without(model, work, drop="model.safetensors",
                                                            add="pytorch_model.bin")))),
        ("typed", "recursive Pydantic model", "KeyError('properties')",
         lambda: outcome(lambda: engine.extract(TEXT, Node))),
        ("typed", "number bound 1e-320", "grammar parse failure",
         lambda: outcome(lambda: engine.extract(TEXT, {"properties": {"x": {"type": "number", "minimum": 1e-320}}}))),
        ("typed", "preset type 'enmu'", "type typo not named",
         lambda: outcome(lambda: engine.extract(TEXT, {"x": {"type": "enmu", "choices": ["a"]}}))),
        ("misread", "extract_many('a string')", "one document per character",
         lambda: outcome(lambda: engine.extract_many("a string", Tags))),
        ("misread", "labels 'Refund' and 'refund'", "both accepted",
         lambda: outcome(lambda: engine.extract(TEXT, {"x": {"type": "enum", "choices": ["Refund", "refund"]}}))),
        ("misread", "labels 'ok' and 'o\\u200bk'", "both accepted, the invisible one can win",
         lambda: outcome(lambda: engine.extract(TEXT, {"x": {"type": "enum", "choices": ["ok", "o\u200bk"]}}))),
    ]  # fmt: skip


def main() -> None:
    engine = Engine.load()
    engine.extract(TEXT, Tags)  # warm
    print("| class | probe | before (issue 45) | now | seconds |")
    print("|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for kind, probe, before, run in rows(engine, Path(tmp)):
            now, seconds = run()
            print(f"| {kind} | {probe} | {before} | {now.replace('|', '/')} | {seconds:.2f} |", flush=True)


if __name__ == "__main__":
    main()
