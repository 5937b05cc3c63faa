"""pcd measured against its baselines, side by side in one run on the same model and the same prompt.

* :func:`bench_presets`: speed on presets. pcd's ``extract`` (default settings and one-pass mode) against each
  baseline (:data:`BASELINES`), with tokens, validity, agreement of the fields and speed-ups.
* :func:`evaluate`: accuracy on labelled data. One field decided per document by pcd and each baseline, scored
  with :func:`~pcd_engine.evaluation.classification_metrics`.

Timings are medians of wall time. The first pcd call of a schema prefills its head and is not timed; outlines'
one-off index compilation is reported apart (``setup_ms``), so both are compared warm.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from pcd_engine.baseline import BaselineResult, generate_baseline, generate_outlines, outlines_model
from pcd_engine.errors import OptionError
from pcd_engine.evaluation import LabelledText, Metrics, agreement, classification_metrics
from pcd_engine.schema import Preset, Schema, compile_schema

__all__ = [
    "BASELINES",
    "BaselineRun",
    "BenchRow",
    "EvalReport",
    "MethodScore",
    "bench_presets",
    "eval_schema",
    "evaluate",
    "median_ms",
    "one_wave",
    "parse_against",
]

BASELINES: dict[str, Callable[..., BaselineResult]] = {"ar": generate_baseline, "outlines": generate_outlines}
INVALID = "<invalid>"

Progress = Callable[[str], None]


def _ready(engine: Any, against: Sequence[str]) -> None:
    """Fail before any timing when a baseline cannot run on this engine."""
    parse_against(",".join(against))
    if "outlines" in against:
        outlines_model(engine)


def parse_against(text: str | None) -> tuple[str, ...]:
    """Parse ``--against``: comma-separated names from :data:`BASELINES`, or ``none``/empty for no baseline.

    Raises:
        OptionError: If a name is unknown.
    """
    if not text or text.strip().lower() == "none":
        return ()
    names = tuple(dict.fromkeys(n.strip().lower() for n in text.split(",") if n.strip()))
    unknown = [n for n in names if n not in BASELINES]
    if unknown:
        raise OptionError(f"--against: expected names from {sorted(BASELINES)} or 'none', but got {unknown}.")
    return names


@dataclass(frozen=True)
class BaselineRun:
    """One baseline on one preset.

    Attributes:
        method: The baseline's name in :data:`BASELINES`.
        ms: Median wall time of its generation.
        tokens: Tokens it wrote.
        valid: Whether its object was a valid answer (parses, every key, allowed values, no extra keys).
        errors: What was invalid, in words.
        agree: How many fields equal pcd's default-settings decisions.
        setup_ms: One-off work excluded from ``ms`` (outlines' index compilation).
        speedup: ``ms`` divided by pcd's default-settings ms.
    """

    method: str
    ms: float
    tokens: int
    valid: bool
    errors: tuple[str, ...]
    agree: int
    setup_ms: float
    speedup: float


@dataclass(frozen=True)
class BenchRow:
    """pcd and its baselines on one preset.

    Attributes:
        preset: The preset's name.
        fields: Number of fields.
        labels: Number of labels over all fields.
        pcd_ms: Median ms of ``extract`` with default settings (warm head).
        passes: Forward passes of one default-settings extract.
        one_pass_ms: Median ms with ``anchor=False`` and ``depends_on`` dropped: every field in ONE pass.
        values: pcd's default-settings values.
        baselines: One entry per baseline, in the order asked.
        full_answer_ms: AR writing exactly as many tokens as pcd's answer as pretty JSON (EOS ignored), when AR
            was asked for; a weak model's AR run can stop early and invalid, which would flatter it.
        full_answer_tokens: The token count of that answer.
    """

    preset: str
    fields: int
    labels: int
    pcd_ms: float
    passes: int
    one_pass_ms: float
    values: dict[str, Any]
    baselines: tuple[BaselineRun, ...]
    full_answer_ms: float | None = None
    full_answer_tokens: int | None = None

    def to_json(self) -> dict[str, Any]:
        """The row as plain JSON-ready data."""
        return dataclasses.asdict(self)


def median_ms(fn: Callable[[], Any], repeats: int, sync: Callable[[], Any] = lambda: None) -> float:
    """Median wall time of ``fn()`` over ``repeats`` runs, in ms; ``sync`` waits for the device around each."""
    times = []
    for _ in range(repeats):
        sync()
        started = time.perf_counter()
        fn()
        sync()
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


def one_wave(schema: Schema) -> Schema:
    """The schema with ``depends_on`` dropped, so that with ``anchor=False`` every field is in ONE wave."""
    return dataclasses.replace(
        schema,
        fields=tuple(dataclasses.replace(f, depends_on=()) for f in schema.fields),
        fingerprint=schema.fingerprint + "-flat",
    )


def bench_presets(
    engine: Any,
    presets: Sequence[tuple[str, Preset]],
    *,
    against: Sequence[str] = ("ar",),
    repeats: int = 3,
    progress: Progress | None = None,
) -> list[BenchRow]:
    """Time pcd and each baseline on each preset's own example text, in one run.

    Args:
        engine: A loaded engine (outlines needs the torch backend).
        presets: ``(name, preset)`` pairs; every preset needs a ``context``.
        against: Baseline names from :data:`BASELINES`.
        repeats: Timed runs per method (medians are reported).
        progress: Called with a short description before each timed step.

    Returns:
        One row per preset.

    Raises:
        OptionError: If ``repeats`` < 1, a baseline is unknown, or a preset has no example text.
        BackendUnavailableError: If a baseline cannot run on this engine (outlines needs torch and outlines).
    """
    if repeats < 1:
        raise OptionError(f"repeats: expected at least 1, but got {repeats}.")
    _ready(engine, against)
    tick = progress or (lambda _: None)
    for name, preset in presets:
        if not preset.context:
            raise OptionError(f"Preset {name!r}: expected a 'context' example text to benchmark on, but it has none.")
    return [_bench_one(engine, name, preset, against, repeats, tick) for name, preset in presets]


def _bench_one(
    engine: Any, name: str, preset: Preset, against: Sequence[str], repeats: int, tick: Progress
) -> BenchRow:
    text, schema = preset.context or "", preset.schema
    flat = one_wave(schema)
    tick(f"{name}: pcd")
    engine.extract(text, schema)  # prefill the heads: later calls are the warm steady state
    engine.extract(text, flat, anchor=False)
    out = engine.extract(text, schema)
    pcd_ms = median_ms(lambda: engine.extract(text, schema), repeats)
    one_ms = median_ms(lambda: engine.extract(text, flat, anchor=False), repeats)
    runs = []
    full_ms = full_tokens = None
    for method in against:
        tick(f"{name}: {method}")
        results = [BASELINES[method](engine, text, schema) for _ in range(repeats)]
        first, ms = results[0], statistics.median(r.ms for r in results)
        written = first.values or {}
        runs.append(
            BaselineRun(
                method=method,
                ms=ms,
                tokens=first.tokens,
                valid=first.valid,
                errors=first.errors,
                agree=sum(1 for k, v in out.values.items() if k in written and written[k] == v),
                setup_ms=max(r.setup_ms for r in results),
                speedup=ms / pcd_ms,
            )
        )
    if "ar" in against:
        tick(f"{name}: full-answer AR")
        answer = json.dumps(out.values, indent=2, ensure_ascii=False)[1:]
        full_tokens = len(engine.tokenizer.encode(answer))
        ids = engine.prompt_for(text, schema)
        full_ms = median_ms(
            lambda: engine.backend.generate_greedy(ids, max_new_tokens=full_tokens, stop=lambda _: False), repeats
        )
    return BenchRow(
        preset=name,
        fields=len(schema.fields),
        labels=sum(len(f.labels) for f in schema.fields),
        pcd_ms=pcd_ms,
        passes=out.stats.forward_passes,
        one_pass_ms=one_ms,
        values=dict(out.values),
        baselines=tuple(runs),
        full_answer_ms=full_ms,
        full_answer_tokens=full_tokens,
    )


@dataclass(frozen=True)
class MethodScore:
    """One method's predictions on a labelled dataset.

    Attributes:
        method: ``"pcd"`` or a baseline name.
        predictions: One label per document; :data:`INVALID` where a baseline wrote no valid value for the field.
        metrics: Accuracy, macro-F1 and confusion matrix against the gold labels.
        mean_ms: Mean wall time per document.
        invalid: Documents where the method wrote no valid value for the field.
        agreement_with_pcd: Fraction of documents where it chose pcd's label (1.0 for pcd itself).
    """

    method: str
    predictions: tuple[str, ...]
    metrics: Metrics
    mean_ms: float
    invalid: int
    agreement_with_pcd: float


@dataclass(frozen=True)
class EvalReport:
    """``pcd eval``'s result.

    Attributes:
        field: The field scored.
        labels: Its allowed labels.
        gold: The gold labels, in document order.
        methods: pcd first, then each baseline.
    """

    field: str
    labels: tuple[str, ...]
    gold: tuple[str, ...]
    methods: tuple[MethodScore, ...]

    def to_json(self) -> dict[str, Any]:
        """The report as plain JSON-ready data."""
        return dataclasses.asdict(self)


def eval_schema(field: str, labels: Sequence[str], *, description: str | None = None, schema: Any = None) -> Schema:
    """The schema ``pcd eval`` decides: one enum field over the dataset's labels, or ``field`` of a given schema.

    Args:
        field: The field name.
        labels: The dataset's gold labels.
        description: Shown to the model next to the field (only for the generated one-field schema).
        schema: A schema that already has ``field``; its labels must cover the dataset's.

    Raises:
        OptionError: If ``schema`` lacks the field or its labels miss some gold labels.
    """
    if schema is None:
        spec = {"type": "enum", "choices": sorted(set(labels))}
        if description:
            spec["description"] = description
        return compile_schema({field: spec})
    compiled = compile_schema(schema)
    names = [f.name for f in compiled.fields]
    if field not in names:
        raise OptionError(f"--field: expected one of the schema's fields {names}, but got {field!r}.")
    allowed = {str(v) for v in compiled.field(field).values}
    missing = sorted(set(labels) - allowed)
    if missing:
        raise OptionError(f"Field {field!r}: expected its labels to cover the dataset's, but it lacks {missing}.")
    return compiled


def evaluate(
    engine: Any,
    docs: Sequence[LabelledText],
    schema: Schema,
    field: str,
    *,
    against: Sequence[str] = (),
    max_chars: int | None = None,
    progress: Progress | None = None,
    **extract_options: Any,
) -> EvalReport:
    """Decide ``field`` for every document with pcd and each baseline, then score them against the gold labels.

    Args:
        engine: A loaded engine.
        docs: The labelled documents.
        schema: The schema to fill (see :func:`eval_schema`).
        field: The field compared with the gold label.
        against: Baseline names from :data:`BASELINES`.
        max_chars: Cut each document to this many characters first (the same text for every method).
        progress: Called with a short description before each document.
        **extract_options: Passed to ``engine.extract`` (``strategy``, ``anchor``, ``temperature``).

    Returns:
        The report: pcd first, then each baseline.
    """
    _ready(engine, against)
    if max_chars is not None and max_chars < 1:
        raise OptionError(f"max_chars: expected a positive number, but got {max_chars}.")
    methods = ("pcd", *against)
    preds: dict[str, list[str]] = {m: [] for m in methods}
    times: dict[str, list[float]] = {m: [] for m in methods}
    engine.extract(docs[0].text[:max_chars], schema, **extract_options)  # prefill the head before timing
    for i, doc in enumerate(docs):
        if progress:
            progress(f"document {i + 1}/{len(docs)}")
        text = doc.text[:max_chars]
        started = time.perf_counter()
        out = engine.extract(text, schema, **extract_options)
        times["pcd"].append((time.perf_counter() - started) * 1000)
        preds["pcd"].append(str(out.values[field]))
        for method in against:
            result = BASELINES[method](engine, text, schema)
            times[method].append(result.ms)
            value = (result.values or {}).get(field, INVALID)
            preds[method].append(str(value) if schema.field(field).allows(value) else INVALID)
    gold = [d.label for d in docs]
    labels = [str(v) for v in schema.field(field).values]
    scores = tuple(
        MethodScore(
            method=m,
            predictions=tuple(preds[m]),
            metrics=classification_metrics(gold, preds[m], labels=labels),
            mean_ms=statistics.fmean(times[m]),
            invalid=preds[m].count(INVALID),
            agreement_with_pcd=agreement(preds[m], preds["pcd"]),
        )
        for m in methods
    )
    return EvalReport(field, tuple(labels), tuple(gold), scores)
