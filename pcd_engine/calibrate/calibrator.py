"""Calibration: correcting the model's label prior with the user's own unlabelled documents.

A small model asked to pick a label leans towards some labels whatever the document says (the first one listed,
a frequent word): its distributions behave as posteriors computed under a skewed label prior ``b``. Prior
correction divides each document's label distribution by ``b`` and renormalizes, ``p(y|x) ~ q(y|x) / b(y)``: the
decision then follows the evidence the document adds, not the model's habit. Two estimates of ``b`` from
unlabelled documents: ``"mean"``, the mean predicted distribution; ``"em"``, the prior under which the corrected
distributions average to uniform, found by the EM iteration of Saerens, Latinne & Decaestecker (2002) run with the
roles of the two priors swapped (the mean pulls towards uniform, so it under-corrects a strong lean).

A :class:`Calibrator` holds, per closed field, the labels and the two distributions. It is tied to the schema it was
fitted on (its fingerprint: the prompt, so the label order too) and to the model, and refuses any other; it is saved
and loaded as JSON. Calibration promises nothing about documents unlike the ones it was fitted on, and a field
whose labels are rare in the corpus keeps a prior estimated from few documents (``documents`` says how many).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from pcd_engine.calibrate.estimators import em_bias, mean_prior, reweight
from pcd_engine.calibrate.examples import (
    corrected,
    example_counts,
    example_priors,
    held_out_evidence,
)
from pcd_engine.calibrate.fitted import (
    Reader,
    check_fitted_on,
    finite_real,
    from_fitted_json,
    read_json_file,
    same_labels,
    write_json_file,
)
from pcd_engine.errors import OptionError
from pcd_engine.heads.thresholds import KeepsHeldOut, checked_floor, checked_held_out
from pcd_engine.schema import FieldSpec, Schema

__all__ = [
    "CALIBRATION_METHODS",
    "FIT_CHUNK",
    "Calibrator",
    "FieldPrior",
    "em_bias",
    "mean_prior",
    "result_rows",
    "reweight",
]

CALIBRATION_METHODS = ("mean", "em")
"""``"mean"``: ``b`` is the mean predicted distribution. ``"em"``: ``b`` is the prior whose correction makes the
corrected distributions average to uniform (:func:`em_bias`)."""

FIT_CHUNK = 64
"""Documents :meth:`Calibrator.fit` reads between two progress reports."""

_FORMAT = "pcd-calibration/1"
_FLOOR = 1e-300  # the smallest lean a fit records (a label that got no probability on any fitting document)


def _unit_share(where: str, what: str, value: Any) -> float:
    """``value`` as a probability in (0, 1]: a finite real number (not a bool) a lean can be divided by."""
    number = finite_real(value)
    if number is None or not 0 < number <= 1:
        raise OptionError(f"{where}: expected each {what} value in (0, 1], but got {value!r}.")
    return number


def _target(name: str, shares: Sequence[float], width: int, multi: bool) -> tuple[float, ...]:
    """A field's given label shares, checked: one per label, each in (0, 1) and (single-label) summing to 1."""
    values = tuple(float(v) for v in shares)
    if len(values) != width or not all(0 < v < 1 for v in values):
        raise OptionError(
            f"Calibration prior of {name!r}: expected {width} shares, each strictly between 0 and 1, but got "
            f"{list(values)}."
        )
    if not multi and abs(sum(values) - 1.0) > 1e-6:
        raise OptionError(
            f"Calibration prior of {name!r}: expected shares summing to 1, but they sum to {sum(values)}."
        )
    return values


@dataclass(frozen=True)
class FieldPrior:
    """One closed field's correction.

    Attributes:
        name: The field's key.
        labels: Its labels' values, in schema order (for a multi-label field, the labels each asked yes/no).
        bias: The model's label prior ``b`` over ``labels``, estimated on the fitting documents (see
            :data:`CALIBRATION_METHODS`); for a multi-label field, each label's prior of "yes".
        prior: The prior the corrected distribution is given instead: uniform (0.5 for each "yes" of a
            multi-label field), or the labels' shares among labelled examples (see :meth:`Calibrator.fit`).
        held_out: A single-label field's evidence from labelled examples (:meth:`Calibrator.fit`): per example
            that labels it, the calibrated probability of the decided label and of the true one, the example's own
            label left out of the prior (:func:`~pcd_engine.calibrate.examples.held_out_evidence`); what
            thresholds and prediction sets are chosen on. Empty without examples.
        min_probability: The field's abstention threshold, kept with the calibration
            (:meth:`Calibrator.with_thresholds`), used as the call option ``min_probability`` is when the call
            gives none. ``None``: none.
    """

    name: str
    labels: tuple[Any, ...]
    bias: tuple[float, ...]
    prior: tuple[float, ...]
    held_out: tuple[tuple[float, float], ...] = ()
    min_probability: float | None = None

    def __post_init__(self) -> None:
        where = f"Calibration field {self.name!r}"
        if not isinstance(self.name, str) or not self.name:
            raise OptionError(f"Calibration field name: expected a non-empty string, but got {self.name!r}.")
        labels = tuple(self.labels) if isinstance(self.labels, (list, tuple)) else None
        if not labels or not all(v is None or isinstance(v, (str, int, float)) for v in labels):
            raise OptionError(f"{where}: expected a list of labels (strings, numbers, null), but got {self.labels!r}.")
        keys = [(type(v), v) for v in labels]
        if len(set(keys)) != len(keys):
            raise OptionError(f"{where}: expected distinct labels, but got {list(labels)}.")
        object.__setattr__(self, "labels", labels)
        for what in ("bias", "prior"):
            values = getattr(self, what)
            checked = tuple(_unit_share(where, what, v) for v in values) if isinstance(values, (list, tuple)) else ()
            if len(checked) != len(labels):
                raise OptionError(f"{where}: expected {len(labels)} {what} values, one per label, but got {values!r}.")
            object.__setattr__(self, what, checked)
        object.__setattr__(self, "held_out", checked_held_out(where, self.held_out))
        object.__setattr__(self, "min_probability", checked_floor(where, self.min_probability))

    def correct(self, probabilities: Sequence[float]) -> tuple[float, ...]:
        """A single-label field's calibrated distribution: ``prior * p / bias``, renormalized."""
        return corrected(probabilities, self.prior, self.bias)

    def correct_yes(self, index: int, yes: float) -> float:
        """A multi-label field's calibrated probability that label ``index`` applies, from the model's ``yes``."""
        b, pi = self.bias[index], self.prior[index]
        if not 0 < b < 1:
            return yes
        pair = reweight((yes, 1.0 - yes), (pi / b, (1.0 - pi) / (1.0 - b)))
        return pair[0]


@dataclass(frozen=True)
class Calibrator(KeepsHeldOut):
    """Label-prior corrections for one schema and one model, estimated from unlabelled documents. Fitted with
    labelled examples, each single-label field keeps their held-out evidence: :meth:`threshold`,
    :meth:`with_thresholds` and :meth:`set_cutoff` (:class:`~pcd_engine.heads.thresholds.KeepsHeldOut`) choose on
    it.

    Build one with :meth:`fit` (or :meth:`from_distributions`), pass it as ``calibration=`` to
    :meth:`~pcd_engine.engine.Engine.extract`, and keep it with :meth:`save` / :meth:`load`.

    Attributes:
        schema_fingerprint: The fingerprint of the schema it was fitted on (the prompt, label order included).
        schema_title: That schema's title, for messages.
        model: The model it was fitted with (:attr:`pcd_engine.engine.Engine.model_id`).
        method: One of :data:`CALIBRATION_METHODS`.
        documents: How many documents it was fitted on.
        fields: One :class:`FieldPrior` per closed field with more than one label.
        examples: How many labelled examples set the fields' priors (0: the priors are uniform).
    """

    kept_by: ClassVar[str] = "Calibration"

    schema_fingerprint: str
    schema_title: str
    model: str
    method: str
    documents: int
    fields: tuple[FieldPrior, ...]
    examples: int = 0

    def __post_init__(self) -> None:
        if self.method not in CALIBRATION_METHODS:
            raise OptionError(f"Calibration method: expected one of {list(CALIBRATION_METHODS)}, got {self.method!r}.")
        for name in ("schema_fingerprint", "schema_title", "model"):
            if not isinstance(getattr(self, name), str):
                raise OptionError(f"Calibration {name}: expected a string, but got {getattr(self, name)!r}.")
        for name in ("documents", "examples"):
            count = getattr(self, name)
            if isinstance(count, bool) or not isinstance(count, int) or count < 0:
                raise OptionError(f"Calibration {name}: expected a count (an integer >= 0), but got {count!r}.")
        fields = tuple(self.fields) if isinstance(self.fields, (list, tuple)) else None
        if fields is None or not all(isinstance(f, FieldPrior) for f in fields):
            raise OptionError(f"Calibration fields: expected a list of FieldPrior, but got {self.fields!r}.")
        names = [f.name for f in fields]
        if len(set(names)) != len(names):
            raise OptionError(f"Calibration fields: expected each field once, but got {names}.")
        object.__setattr__(self, "fields", fields)

    # ------------------------------------------------------------------------------------------ building

    @classmethod
    def from_distributions(
        cls,
        schema: Schema,
        distributions: Mapping[str, Sequence[Sequence[float]]],
        *,
        model: str,
        method: str = "mean",
        priors: Mapping[str, Sequence[float]] | None = None,
        examples: int = 0,
    ) -> Calibrator:
        """A calibrator from each field's per-document distributions (what :meth:`fit` collects).

        Args:
            schema: The compiled schema.
            distributions: Field name to one row per document: the label distribution of a single-label field,
                or each label's probability of "yes" for a multi-label field.
            model: The model's identity.
            method: One of :data:`CALIBRATION_METHODS`.
            priors: Field name to the labels' shares in the documents (each label's share of "yes" for a
                multi-label field), when known; the others are taken as uniform (0.5 for each "yes").
            examples: How many labelled examples ``priors`` came from (recorded; 0 when none).

        Raises:
            OptionError: If the method is unknown, a field is not a closed field of the schema, or a row has the
                wrong length.
        """
        if method not in CALIBRATION_METHODS:
            raise OptionError(f"Calibration method: expected one of {list(CALIBRATION_METHODS)}, got {method!r}.")
        for name in priors or {}:
            if name not in distributions:
                raise OptionError(f"Calibration priors: expected a field that is calibrated, but got {name!r}.")
        fitted = []
        counts = {len(rows) for rows in distributions.values()}

        def estimate(table: Sequence[Sequence[float]], goal: Sequence[float]) -> tuple[float, ...]:
            return em_bias(table, target=goal) if method == "em" else mean_prior(table)

        for name, rows in distributions.items():
            spec = _closed_field(schema, name)
            labels = tuple(label.value for label in spec.labels)
            if any(len(row) != len(labels) for row in rows):
                raise OptionError(
                    f"Calibration field {name!r}: expected {len(labels)} probabilities per document, but a row has "
                    f"{next(len(row) for row in rows if len(row) != len(labels))}."
                )
            multi = spec.kind == "multi"
            given = (priors or {}).get(name)
            if given is not None:
                prior = _target(name, given, len(labels), multi)
            else:  # uniform: 0.5 for each "yes" of a multi-label field
                prior = (0.5 if multi else 1.0 / len(labels),) * len(labels)
            if multi:  # each label's yes/no on its own
                bias = tuple(
                    estimate([(r[i], 1.0 - r[i]) for r in rows], (prior[i], 1.0 - prior[i]))[0]
                    for i in range(len(labels))
                )
            else:
                bias = estimate(rows, prior)
            # a label the documents never gave any probability keeps a lean a division can use (a file's zero is
            # refused), and a multi-label "yes" stays short of certain
            bias = tuple(min(max(b, _FLOOR), 1.0 - 2**-53 if multi else 1.0) for b in bias)
            fitted.append(FieldPrior(name, labels, bias, prior))
        return cls(
            schema_fingerprint=schema.fingerprint,
            schema_title=schema.title,
            model=model,
            method=method,
            documents=max(counts) if counts else 0,
            fields=tuple(fitted),
            examples=examples,
        )

    @classmethod
    def fit(
        cls,
        engine: Reader,
        texts: Sequence[str],
        schema: Any,
        *,
        method: str = "mean",
        options: Any = None,
        batch_size: int | None = None,
        progress: Callable[[str], None] | None = None,
        examples: Sequence[tuple[str, Mapping[str, Any]]] = (),
    ) -> Calibrator:
        """Estimate the corrections from unlabelled ``texts``: each closed field's full label distribution on every
        document (the closed fields decided in batches, every label read; nothing generated), then
        :meth:`from_distributions`.

        Args:
            engine: The :class:`~pcd_engine.engine.Engine` (its model is the one calibrated).
            texts: The documents, unlabelled; a few hundred like the ones to be decided.
            schema: The schema (anything :func:`~pcd_engine.schema.compile_schema` takes).
            method: One of :data:`CALIBRATION_METHODS`.
            options: :class:`~pcd_engine.options.ExtractOptions` or a mapping for the extraction (the prompt
                options must be those the calibrator will be used with; a ``calibration`` there is refused, and a
                ``correction`` is ignored: the fit reads the model's own distributions).
            batch_size: Documents per pass (``None``: the engine's choice).
            progress: Called with a short description before each chunk of :data:`FIT_CHUNK` documents.
            examples: A few labelled documents, ``(text, {field: value})``, to refine the fit: their texts join
                ``texts``, and their labels give each field's label shares (add-one smoothed) as the prior the
                corrected distributions are given, instead of uniform (a corpus whose labels are far from
                balanced). A field no example labels keeps the uniform prior.

        Raises:
            OptionError: If there are no texts, the method is unknown, the options carry a calibration, or an
                example labels a field that is not calibrated or with a value the field does not allow.
        """
        from pcd_engine.schema import compile_schema

        if method not in CALIBRATION_METHODS:
            raise OptionError(f"Calibration method: expected one of {list(CALIBRATION_METHODS)}, got {method!r}.")
        if not texts:
            raise OptionError("Calibration: expected at least one document to fit on, but got none.")
        # over the engine's defaults, as the calls it will correct
        call = engine.resolve(options).without_fitted("calibration", where="Calibration")
        # every label's probability, as the calibrated calls will read them, and the model's own (no correction)
        call = call.uncorrected().read_whole()
        compiled = compile_schema(schema)
        closed = [s for s in compiled.fields if s.scored and len(s.labels) > 1]
        counts = example_counts(closed, examples)
        priors = example_priors(closed, counts)
        texts = [*texts, *(text for text, _ in examples)]
        results: list[dict[str, Any]] = []
        for first in range(0, len(texts), FIT_CHUNK):
            chunk = list(texts[first : first + FIT_CHUNK])
            if progress:
                progress(f"documents {first + 1}-{first + len(chunk)}/{len(texts)}")
            results += engine.read_closed(chunk, compiled, call, batch_size=batch_size)
        rows = result_rows(closed, results)
        fitted = cls.from_distributions(
            compiled, rows, model=engine.model_id, method=method, priors=priors, examples=len(examples)
        )
        single = {spec.name for spec in closed if spec.kind != "multi"}
        return dataclasses.replace(fitted, fields=tuple(
            dataclasses.replace(f, held_out=held_out_evidence(f.bias, *counts[f.name], rows[f.name][-len(examples):]))
            if f.name in single and f.name in counts else f
            for f in fitted.fields
        ))  # fmt: skip

    # ------------------------------------------------------------------------------------------ use

    def field(self, name: str) -> FieldPrior | None:
        """The correction of field ``name``, or ``None`` when it has none."""
        return next((f for f in self.fields if f.name == name), None)

    def check(self, schema: Schema, model: str) -> None:
        """Refuse a schema or model other than the ones this calibrator was fitted on.

        Raises:
            OptionError: On a mismatch, naming both sides.
        """
        check_fitted_on(
            "Calibration", fingerprint=self.schema_fingerprint, title=self.schema_title, model=self.model,
            schema=schema, model_id=model,
            hint="; a change to the fields, labels, their order or the prompt options needs a new calibration",
        )  # fmt: skip
        for prior in self.fields:  # the fingerprint is only a claim: the fields themselves must fit the schema
            _check_field(schema, prior)

    # ------------------------------------------------------------------------------------------ JSON

    def to_json(self) -> dict[str, Any]:
        """The calibrator as plain JSON data (what :meth:`save` writes)."""
        return {
            "format": _FORMAT,
            "schema": {"title": self.schema_title, "fingerprint": self.schema_fingerprint},
            "model": self.model,
            "method": self.method,
            "documents": self.documents,
            "examples": self.examples,
            "fields": [
                {
                    "name": f.name,
                    "labels": list(f.labels),
                    "bias": list(f.bias),
                    "prior": list(f.prior),
                    **({"held_out": [list(pair) for pair in f.held_out]} if f.held_out else {}),
                    **({"min_probability": f.min_probability} if f.min_probability is not None else {}),
                }
                for f in self.fields
            ],  # fmt: skip
        }

    @classmethod
    def from_json(cls, data: Any, *, where: str = "calibration") -> Calibrator:
        """A calibrator from :meth:`to_json`'s data.

        Raises:
            InputError: If the data is not a calibration of this format.
        """

        def build(data: Mapping[str, Any]) -> Calibrator:
            return cls(
                schema_fingerprint=data["schema"]["fingerprint"],
                schema_title=data["schema"]["title"],
                model=data["model"],
                method=data["method"],
                documents=data["documents"],
                examples=data.get("examples", 0),
                fields=tuple(
                    FieldPrior(
                        f["name"], f["labels"], f["bias"], f["prior"], f.get("held_out", ()), f.get("min_probability")
                    )
                    for f in data["fields"]
                ),  # fmt: skip
            )

        return from_fitted_json(data, where=where, kind="pcd calibration", fmt=_FORMAT, build=build)

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write the calibrator as JSON to ``path``."""
        return write_json_file(path, self.to_json(), indent=2)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Calibrator:
        """Read a calibrator written by :meth:`save`.

        Raises:
            InputError: If the file is missing, not JSON, or not a calibration.
        """
        return cls.from_json(read_json_file(path, "Calibration"), where=f"Calibration {str(path)!r}")


def result_rows(closed: Sequence[FieldSpec], results: Sequence[Mapping[str, Any]]) -> dict[str, list[list[float]]]:
    """Each closed field's row per document from decided results (field name to a
    :class:`~pcd_engine.result.FieldResult` per document): its label distribution, or each label's probability of
    "yes" for a multi-label field. What a calibration or a lean is estimated from."""
    rows: dict[str, list[list[float]]] = {s.name: [] for s in closed}
    for result in results:
        for spec in closed:
            got = result[spec.name]
            if spec.kind == "multi":
                yes = got.label_probabilities or {}
                rows[spec.name].append([yes[label.value] for label in spec.labels])
            else:
                rows[spec.name].append(list(got.label_distribution or ()))
    return rows


def _check_field(schema: Schema, prior: FieldPrior) -> None:
    """Refuse a field prior that does not fit the schema's field: its labels (the same values, types and order) and
    its shares (a single-label field's lean and prior each sum to 1; a multi-label field's are each below 1)."""
    spec = _closed_field(schema, prior.name)
    expected = [label.value for label in spec.labels]
    if not same_labels(prior.labels, expected):
        raise OptionError(
            f"Calibration field {prior.name!r}: expected the schema's labels {expected}, but got {list(prior.labels)}."
        )
    for what in ("bias", "prior"):
        values = getattr(prior, what)
        if spec.kind == "multi" and not all(v < 1 for v in values):
            raise OptionError(
                f"Calibration field {prior.name!r}: expected each {what} value of a multi-label field below 1, but "
                f"got {list(values)}."
            )
        if spec.kind != "multi" and abs(sum(values) - 1.0) > 1e-6:
            raise OptionError(
                f"Calibration field {prior.name!r}: expected {what} values summing to 1, but they sum to {sum(values)}."
            )


def _closed_field(schema: Schema, name: str) -> FieldSpec:
    try:
        spec = schema.field(name)
    except KeyError:
        raise OptionError(f"Calibration: expected a field of {schema.title!r}, but got {name!r}.") from None
    if not spec.scored or len(spec.labels) < 2:
        raise OptionError(f"Calibration field {name!r}: expected a closed field with several labels.")
    return spec
