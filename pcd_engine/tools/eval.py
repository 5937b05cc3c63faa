"""``pcd eval``: accuracy on labelled data. One field decided per document by pcd and each baseline, scored with
:func:`~pcd_engine.tools.datasets.classification_metrics`.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pcd_engine.calibrate.shares import LabelShares, label_shares
from pcd_engine.deciders.corrections import CORRECTION_WINDOW
from pcd_engine.errors import OptionError, check_count
from pcd_engine.options import CORRECTIONS, ExtractOptions
from pcd_engine.schema import FieldSpec, Schema, compile_schema
from pcd_engine.tools.comparators import BASELINES, INVALID, Progress, ready
from pcd_engine.tools.datasets import LabelledText, Metrics, agreement, classification_metrics

if TYPE_CHECKING:
    from pcd_engine.engine import Engine

__all__ = [
    "COVERAGE_THRESHOLDS",
    "CoveragePoint",
    "EvalReport",
    "OWN",
    "MethodScore",
    "accuracy_coverage",
    "calibration_scores",
    "eval_chunk_size",
    "eval_schema",
    "evaluate",
    "parse_corrections",
]

OWN = "pcd, the model's own (same pass)"
"""The row of the model's own distributions, read in the same pass as pcd's corrected row."""

COVERAGE_THRESHOLDS = (0.0, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
"""The ``min_probability`` values ``pcd eval`` prints the accuracy-coverage curve at."""


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
        probabilities: For pcd (calibrated or not), its probability of each prediction, in document order; empty
            for a baseline, which reports none.
        distributions: For pcd, each document's distribution over the report's labels; empty for a baseline.
        ece: Expected calibration error of ``probabilities`` (ten equal-width bins of the top label's
            probability: the gap between confidence and accuracy, weighted by the documents in each); ``None``
            without probabilities.
        brier: Brier score of ``distributions`` (the mean over documents of the squared distance to the gold
            label's one-hot vector; 0 is perfect, 2 the worst); ``None`` without distributions.
    """

    method: str
    predictions: tuple[str, ...]
    metrics: Metrics
    mean_ms: float
    invalid: int
    agreement_with_pcd: float
    probabilities: tuple[float, ...] = ()
    distributions: tuple[tuple[float, ...], ...] = ()
    ece: float | None = None
    brier: float | None = None


@dataclass(frozen=True)
class CoveragePoint:
    """One point of an accuracy-coverage curve: what abstaining below ``threshold`` keeps.

    Attributes:
        threshold: The ``min_probability``.
        coverage: The fraction of documents answered (probability at least ``threshold``).
        accuracy: The accuracy on those documents; ``None`` when none is kept.
    """

    threshold: float
    coverage: float
    accuracy: float | None


def accuracy_coverage(
    predictions: Sequence[str],
    probabilities: Sequence[float],
    gold: Sequence[str],
    thresholds: Sequence[float] = COVERAGE_THRESHOLDS,
) -> tuple[CoveragePoint, ...]:
    """For each threshold, the share of documents whose probability reaches it and the accuracy on them.

    Raises:
        OptionError: If the three sequences differ in length.
    """
    if not len(predictions) == len(probabilities) == len(gold):
        raise OptionError(
            f"accuracy_coverage: expected as many predictions, probabilities and gold labels, but got "
            f"{len(predictions)}, {len(probabilities)} and {len(gold)}."
        )
    points = []
    for threshold in thresholds:
        kept = [p == g for p, q, g in zip(predictions, probabilities, gold, strict=True) if q >= threshold]
        coverage = len(kept) / len(gold) if gold else 0.0
        points.append(CoveragePoint(threshold, coverage, sum(kept) / len(kept) if kept else None))
    return tuple(points)


@dataclass(frozen=True)
class EvalReport:
    """``pcd eval``'s result.

    Attributes:
        field: The field scored.
        labels: Its allowed labels.
        gold: The gold labels, in document order.
        methods: pcd first (and, when its field was corrected, the model's own reading of the same pass, named
            :data:`OWN`), then each calibration, correction and baseline.
        shares: The field's label shares among the documents as pcd's row estimates them
            (:func:`~pcd_engine.calibrate.shares.label_shares`), to set beside the gold ones.
    """

    field: str
    labels: tuple[str, ...]
    gold: tuple[str, ...]
    methods: tuple[MethodScore, ...]
    shares: LabelShares | None = None

    def to_json(self) -> dict[str, Any]:
        """The report as plain JSON-ready data, with each pcd method's accuracy-coverage curve."""
        data = dataclasses.asdict(self)
        data["shares"] = None if self.shares is None else self.shares.to_json()
        for entry, method in zip(data["methods"], self.methods, strict=True):
            entry["accuracy_coverage"] = [dataclasses.asdict(p) for p in self.coverage(method)]
        return data

    def coverage(
        self, method: MethodScore, thresholds: Sequence[float] = COVERAGE_THRESHOLDS
    ) -> tuple[CoveragePoint, ...]:
        """``method``'s accuracy-coverage curve (empty for a baseline, which reports no probabilities)."""
        if not method.probabilities:
            return ()
        return accuracy_coverage(method.predictions, method.probabilities, self.gold, thresholds)

    def held_out(self, method: MethodScore) -> list[tuple[float, float]]:
        """``method``'s evidence on these documents, as thresholds are chosen on it
        (:data:`~pcd_engine.heads.thresholds.HeldOut`: per document, the probability of its decided label and of
        the gold one); empty for a baseline, which reports no distributions."""
        index = {label: i for i, label in enumerate(self.labels)}
        return [(max(p), p[index[g]] if g in index else 0.0) for p, g in zip(method.distributions, self.gold,
                                                                             strict=True)]  # fmt: skip


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
    engine: Engine,
    docs: Sequence[LabelledText],
    schema: Schema,
    field: str,
    *,
    against: Sequence[str] = (),
    max_chars: int | None = None,
    progress: Progress | None = None,
    calibrations: Mapping[str, Any] | None = None,
    corrections: Sequence[str] = (),
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
        progress: Called with a short description before each batch of documents.
        calibrations: More methods, by name: pcd with each :class:`~pcd_engine.calibrate.calibrator.Calibrator` (fitted
            on this schema and model), run as pcd is.
        corrections: More methods: pcd with each lean correction of
            :data:`~pcd_engine.options.CORRECTIONS` (named ``"pcd, correction=none"``, ...), leaving out the one
            pcd's own row already uses (the call's ``correction``, else the engine's default).
        **extract_options: Passed to ``engine.extract_many`` (``strategy``, ``anchor``, ``temperature``).

    Every pcd method decides the documents in chunks of :data:`~pcd_engine.deciders.corrections.CORRECTION_WINDOW`, each
    one :meth:`Engine.extract_many` call (one pass per wave for a batch of :meth:`Engine.batch_size`; the batch a
    ``"batch"`` correction estimates its lean on); its time per document is its chunk's time divided by the
    chunk's size. Baselines run one document at a time. Where pcd's own row corrected the field, the model's own
    distributions of the same pass are scored too, as :data:`OWN` (no second reading).

    Returns:
        The report: pcd first, then the model's own reading, each calibration, correction and baseline.
    """
    ready(engine, against)
    check_count(max_chars, "max_chars")
    calibrated = dict(calibrations or {})
    call = engine.resolve(None, **extract_options)  # a correction that would not change pcd's own call is not run again
    corrected = {f"pcd, correction={c}": c for c in corrections if ExtractOptions(correction=c).over(call) != call}
    methods = ("pcd", OWN, *calibrated, *corrected, *against)
    preds: dict[str, list[str]] = {m: [] for m in methods}
    times: dict[str, list[float]] = {m: [] for m in methods}
    probabilities: dict[str, list[float]] = {m: [] for m in methods}
    distributions: dict[str, list[tuple[float, ...]]] = {m: [] for m in methods}
    spec = schema.field(field)
    decided: list[Any] = []
    engine.extract(docs[0].text[:max_chars], schema, **extract_options)  # prefill the head before timing
    # chunks as large as a batch correction's window: pcd's own row (the default "auto") and the corrected ones
    # decide each chunk as one extract_many, as a user's batch call would
    size = eval_chunk_size(engine)
    runs = {"pcd": extract_options, **{name: {**extract_options, "calibration": c} for name, c in calibrated.items()}}
    runs.update({name: {**extract_options, "correction": c} for name, c in corrected.items()})
    for first in range(0, len(docs), size):
        chunk = [d.text[:max_chars] for d in docs[first : first + size]]
        if progress:
            progress(f"documents {first + 1}-{first + len(chunk)}/{len(docs)}")
        for name, options in runs.items():
            started = time.perf_counter()
            outs = engine.extract_many(chunk, schema, **options)  # one pass per wave for the chunk
            each = (time.perf_counter() - started) * 1000 / len(chunk)
            rows = [_distribution(out.fields[field], spec) for out in outs]
            chosen = [(out.values[field], float(out.fields[field].probability or 0.0)) for out in outs]
            _record(name, spec, rows, each, preds, times, probabilities, distributions, chosen=chosen)
            if name == "pcd":  # the model's own distributions of the same pass, beside the corrected ones
                decided += outs
                own = [out.fields[field].raw_distribution or row for out, row in zip(outs, rows, strict=True)]
                _record(OWN, spec, own, each, preds, times, probabilities, distributions)
        _run_baselines(engine, chunk, schema, field, against, preds, times)
    if not any(out.fields[field].raw_distribution for out in decided):  # nothing corrected: the same row twice
        methods = tuple(m for m in methods if m != OWN)
    report = _report(docs, spec, methods, preds, times, probabilities, distributions)
    shares = label_shares(decided, schema, fields=[field])[field] if spec.scored and len(spec.labels) > 1 else None
    return dataclasses.replace(report, shares=shares)


def eval_chunk_size(engine: Engine) -> int:
    """How many documents :func:`evaluate` decides in one ``extract_many`` call (one step of its progress):
    at least a batch correction's window, so each chunk is corrected as a user's batch of that size would be."""
    return max(engine.batch_size(), CORRECTION_WINDOW)


def _run_baselines(
    engine: Engine, chunk: Sequence[str], schema: Schema, field: str, against: Sequence[str],
    preds: dict[str, list[str]], times: dict[str, list[float]],
) -> None:  # fmt: skip
    """Each baseline of ``against`` on each text of ``chunk``, one document at a time: its decision of ``field``
    (:data:`INVALID` where it gave no allowed value) and its time."""
    for text in chunk:
        for method in against:
            result = BASELINES[method](engine, text, schema)
            times[method].append(result.ms)
            value = (result.values or {}).get(field, INVALID)
            preds[method].append(str(value) if schema.field(field).allows(value) else INVALID)


def _record(
    name: str, spec: FieldSpec, rows: Sequence[tuple[float, ...]], each_ms: float, preds: dict[str, list[str]],
    times: dict[str, list[float]], probabilities: dict[str, list[float]],
    distributions: dict[str, list[tuple[float, ...]]], *, chosen: Sequence[tuple[Any, float]] | None = None,
) -> None:  # fmt: skip
    """Method ``name``'s decisions: ``chosen`` (each document's value and its probability), else each
    distribution's argmax (the lowest index on a tie)."""
    for i, row in enumerate(rows):
        best = max(range(len(row)), key=lambda j: (row[j], -j))
        value, probability = chosen[i] if chosen is not None else (spec.values[best], row[best])
        preds[name].append(str(value))
        probabilities[name].append(float(probability))
        distributions[name].append(tuple(row))
        times[name].append(each_ms)


def _distribution(result: Any, spec: FieldSpec) -> tuple[float, ...]:
    """A decided field's distribution over its labels: its own, or one-hot on its value."""
    if result.label_distribution is not None:
        return tuple(result.label_distribution)
    return tuple(1.0 if v == result.value else 0.0 for v in spec.values)


def calibration_scores(
    gold: Sequence[str], labels: Sequence[str], probabilities: Sequence[float], predictions: Sequence[str],
    distributions: Sequence[Sequence[float]], *, bins: int = 10,
) -> tuple[float | None, float | None]:  # fmt: skip
    """``(ece, brier)`` of one method (see :class:`MethodScore`); each ``None`` when its inputs are empty."""
    ece = None
    if probabilities:
        total = 0.0
        for b in range(bins):
            inside = [
                (q, p == g) for q, p, g in zip(probabilities, predictions, gold, strict=True)
                if b / bins < q <= (b + 1) / bins or (b == 0 and q == 0)
            ]  # fmt: skip
            if inside:
                confidence = statistics.fmean(q for q, _ in inside)
                accuracy = statistics.fmean(float(ok) for _, ok in inside)
                total += len(inside) * abs(confidence - accuracy)
        ece = total / len(gold)
    brier = None
    if distributions:
        brier = statistics.fmean(
            sum((p - (1.0 if label == g else 0.0)) ** 2 for p, label in zip(row, labels, strict=True))
            for row, g in zip(distributions, gold, strict=True)
        )
    return ece, brier


def _report(
    docs: Sequence[LabelledText],
    spec: FieldSpec,
    methods: Sequence[str],
    preds: Mapping[str, list[str]],
    times: Mapping[str, list[float]],
    probabilities: Mapping[str, list[float]],
    distributions: Mapping[str, list[tuple[float, ...]]],
) -> EvalReport:
    """Each method's predictions scored against the gold labels (pcd's row first)."""
    gold = [d.label for d in docs]
    labels = [str(v) for v in spec.values]
    scores = []
    for m in methods:
        ece, brier = calibration_scores(gold, labels, probabilities[m], preds[m], distributions[m])
        scores.append(
            MethodScore(
                method=m,
                predictions=tuple(preds[m]),
                metrics=classification_metrics(gold, preds[m], labels=labels),
                mean_ms=statistics.fmean(times[m]),
                invalid=preds[m].count(INVALID),
                agreement_with_pcd=agreement(preds[m], preds["pcd"]),
                probabilities=tuple(probabilities[m]),
                distributions=tuple(distributions[m]),
                ece=ece,
                brier=brier,
            )
        )
    return EvalReport(spec.name, tuple(labels), tuple(gold), tuple(scores))


def parse_corrections(text: str | None) -> tuple[str, ...]:
    """Parse ``--corrections``: comma-separated names from :data:`~pcd_engine.options.CORRECTIONS` (``none`` is
    the model's own decisions), ``all`` for every one, or empty for none.

    Raises:
        OptionError: If a name is unknown.
    """
    offered = CORRECTIONS
    if not text or not text.strip():
        return ()
    names = tuple(dict.fromkeys(n.strip().lower() for n in text.split(",") if n.strip()))
    if names == ("all",):
        return offered
    unknown = [n for n in names if n not in offered]
    if unknown:
        raise OptionError(f"--corrections: expected names from {list(offered)} or 'all', but got {unknown}.")
    return names
