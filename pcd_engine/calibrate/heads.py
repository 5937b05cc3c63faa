"""Decision heads (issue 46): a small linear model per closed field over hidden states of the model's own pass,
fitted from a few labelled examples, and kept as plain JSON tied to the model and schema it was fitted on.

This module owns the head as a value: its numbers, the arithmetic that turns features into a distribution over the
field's labels, fitting one with scikit-learn (:meth:`Head.fit` reads the features from the engine's own passes,
:meth:`~pcd_engine.engine.Engine.read_features`), the held-out distributions its gate
(:mod:`pcd_engine.calibrate.gates`) compares with the model's own decision, saving, loading and checking it (every
number and label of a file is checked, as a calibration's are; nothing is unpickled). A call decides a field with
its head through the ``head`` option (:class:`~pcd_engine.options.ExtractOptions`).

The feature recipe, measured in the design study (``benchmarks/study_head_features.py``): the last layer's state at
the field's answer position (where its decision is read) beside the middle layer's mean over the document's tokens,
standardized; a multinomial logistic regression with an L2 penalty on top.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pcd_engine.calibrate.fitted import (
    check_fitted_on,
    finite_real,
    from_fitted_json,
    read_json_file,
    same_labels,
    write_json_file,
)
from pcd_engine.calibrate.gates import Gate, gate
from pcd_engine.errors import OptionError
from pcd_engine.schema import FieldSpec, Schema

__all__ = [
    "FEATURE_RECIPES",
    "FIT_CHUNK",
    "FieldHead",
    "Head",
    "example_targets",
    "fit_field_head",
    "held_out_distributions",
]

FEATURE_RECIPES = ("answer-last+document-middle",)
"""How a head's features are read from the pass: ``"answer-last+document-middle"`` is the last layer's hidden state
at the field's answer position, then the middle layer's (``num_hidden_layers // 2``) mean over the document's
tokens."""

UNSEEN_LOG_ODDS = -math.log(1000.0)
"""A label no example shows gets no weights and a bias this far below the lowest bias of the labels shown: at the
examples' mean features its odds are 1/1000 of the least likely shown label's. It stays possible in the head's
distribution, and the head does not decide it on its own."""

_FORMAT = "pcd-head/1"

FIT_CHUNK = 64
"""Documents whose features :meth:`Head.fit` reads per call of the engine (its ``progress`` is called before each)."""


def _real(where: str, value: Any) -> float:
    """``value`` as a finite real number (not a bool), or an OptionError naming ``where``."""
    number = finite_real(value)
    if number is None:
        raise OptionError(f"{where}: expected a finite number, but got {value!r}.")
    return number


def _reals(where: str, values: Any, width: int | None) -> tuple[float, ...]:
    if not isinstance(values, (list, tuple)) or (width is not None and len(values) != width):
        raise OptionError(f"{where}: expected a list of {width if width is not None else 'some'} numbers.")
    return tuple(_real(where, v) for v in values)


@dataclass(frozen=True)
class FieldHead:
    """One closed field's head: ``softmax(weights @ ((x - mean) / scale) + bias)`` over its labels.

    Attributes:
        name: The field's key.
        labels: Its labels' values, in schema order.
        mean: Each feature's mean over the fitting examples (standardization).
        scale: Each feature's standard deviation over them (1 where it was 0).
        weights: One row of feature weights per label.
        bias: One intercept per label.
        seen: Per label, how many fitting examples showed it (0: the label's odds are fixed low, see
            :data:`UNSEEN_LOG_ODDS`).
    """

    name: str
    labels: tuple[Any, ...]
    mean: tuple[float, ...]
    scale: tuple[float, ...]
    weights: tuple[tuple[float, ...], ...]
    bias: tuple[float, ...]
    seen: tuple[int, ...]

    def __post_init__(self) -> None:
        where = f"Head field {self.name!r}"
        if not isinstance(self.name, str) or not self.name:
            raise OptionError(f"Head field name: expected a non-empty string, but got {self.name!r}.")
        labels = tuple(self.labels) if isinstance(self.labels, (list, tuple)) else ()
        if len(labels) < 2 or not all(v is None or isinstance(v, (str, int, float)) for v in labels):
            raise OptionError(f"{where}: expected a list of at least two labels, but got {self.labels!r}.")
        mean = _reals(f"{where} mean", self.mean, None)
        scale = _reals(f"{where} scale", self.scale, len(mean))
        if not mean or not all(s > 0 for s in scale):
            raise OptionError(f"{where}: expected at least one feature and positive scales.")
        if not isinstance(self.weights, (list, tuple)) or len(self.weights) != len(labels):
            raise OptionError(f"{where}: expected one row of weights per label ({len(labels)}).")
        weights = tuple(_reals(f"{where} weights", row, len(mean)) for row in self.weights)
        bias = _reals(f"{where} bias", self.bias, len(labels))
        seen = tuple(self.seen) if isinstance(self.seen, (list, tuple)) else ()
        if len(seen) != len(labels) or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in seen):
            raise OptionError(f"{where}: expected one count of examples (an integer >= 0) per label.")
        for key, value in (("labels", labels), ("mean", mean), ("scale", scale), ("weights", weights)):
            object.__setattr__(self, key, value)
        object.__setattr__(self, "bias", bias)
        object.__setattr__(self, "seen", seen)

    @property
    def width(self) -> int:
        """How many features the head reads."""
        return len(self.mean)

    def probabilities(self, features: Sequence[float]) -> tuple[float, ...]:
        """The head's distribution over :attr:`labels` for one document's features.

        Raises:
            OptionError: If ``features`` does not have :attr:`width` values.
        """
        if len(features) != self.width:
            raise OptionError(f"Head field {self.name!r}: expected {self.width} features, but got {len(features)}.")
        x = [(f - m) / s for f, m, s in zip(features, self.mean, self.scale, strict=True)]
        scores = [
            sum(w * v for w, v in zip(row, x, strict=True)) + b for row, b in zip(self.weights, self.bias, strict=True)
        ]
        top = max(scores)
        exp = [math.exp(s - top) for s in scores]
        total = sum(exp)
        return tuple(e / total for e in exp)


def fit_field_head(
    name: str, labels: Sequence[Any], features: Sequence[Sequence[float]], targets: Sequence[int], *, c: float = 0.1
) -> FieldHead:
    """Fit one field's head: standardize the features, then a multinomial logistic regression (scikit-learn,
    ``C=c``) on the labels the examples show; a label no example shows gets :data:`UNSEEN_LOG_ODDS`.

    Args:
        name: The field's key.
        labels: Its labels, in schema order.
        features: One row of features per example.
        targets: Each example's label, as an index into ``labels``.
        c: The inverse of the L2 penalty's strength (smaller: stronger; 0.1 was best in the design study).

    Raises:
        OptionError: If the rows are ragged or empty, a target is out of range, fewer than two labels are shown,
            or ``c`` is not positive.
        BackendUnavailableError: If scikit-learn is not installed.
    """
    import numpy as np

    from pcd_engine.errors import pip_install, require

    (linear,) = require("sklearn.linear_model", what="Fitting a head", install=pip_install("eval"))
    if not (isinstance(c, (int, float)) and not isinstance(c, bool) and math.isfinite(c) and c > 0):
        raise OptionError(f"Head {name!r}: c: expected a positive number, but got {c!r}.")
    if not features or len({len(row) for row in features}) != 1 or len(features) != len(targets):
        raise OptionError(f"Head {name!r}: expected one row of features per example, all of one width.")
    if not all(isinstance(t, int) and 0 <= t < len(labels) for t in targets):
        raise OptionError(f"Head {name!r}: expected each target to index one of {len(labels)} labels.")
    shown = sorted(set(targets))
    if len(shown) < 2:
        raise OptionError(f"Head {name!r}: expected examples of at least two labels, but they show {len(shown)}.")
    x = np.asarray(features, dtype=np.float64)
    mean = x.mean(axis=0)
    scale = x.std(axis=0)
    scale[scale == 0] = 1.0
    model = linear.LogisticRegression(C=c, max_iter=5000).fit((x - mean) / scale, np.asarray(targets))
    coef, intercept = model.coef_, model.intercept_
    if len(shown) == 2:  # scikit-learn keeps one row for two classes: the second's log-odds against the first
        coef = np.vstack([-coef[0] / 2, coef[0] / 2])
        intercept = np.array([-intercept[0] / 2, intercept[0] / 2])
    weights = [[0.0] * x.shape[1] for _ in labels]
    bias = [0.0] * len(labels)
    for row, label in enumerate(shown):
        weights[label], bias[label] = [float(w) for w in coef[row]], float(intercept[row])
    floor = min(bias[label] for label in shown) + UNSEEN_LOG_ODDS
    for label in set(range(len(labels))) - set(shown):
        bias[label] = floor
    seen = [sum(1 for t in targets if t == i) for i in range(len(labels))]
    return FieldHead(name, tuple(labels), tuple(mean.tolist()), tuple(scale.tolist()),
                     tuple(tuple(r) for r in weights), tuple(bias), tuple(seen))  # fmt: skip


@dataclass(frozen=True)
class Head:
    """Decision heads for a schema's closed fields, fitted with one model, kept as JSON.

    Attributes:
        schema_fingerprint: The fingerprint of the schema it was fitted on.
        schema_title: That schema's title, for messages.
        model: The model it was fitted with (:attr:`~pcd_engine.engine.Engine.model_id`).
        features: How the features are read, one of :data:`FEATURE_RECIPES`.
        examples: How many labelled examples it was fitted on.
        fields: One :class:`FieldHead` per field it decides (the others are decided as without a head).
        gates: From :meth:`fit`, each field's head against the model's own decision on held-out examples
            (:class:`~pcd_engine.calibrate.gates.Gate`); not saved, and empty on a loaded head.
    """

    schema_fingerprint: str
    schema_title: str
    model: str
    features: str
    examples: int
    fields: tuple[FieldHead, ...]
    gates: tuple[Gate, ...] = dataclasses.field(default=(), compare=False)

    def __post_init__(self) -> None:
        for name in ("schema_fingerprint", "schema_title", "model"):
            if not isinstance(getattr(self, name), str):
                raise OptionError(f"Head {name}: expected a string, but got {getattr(self, name)!r}.")
        if self.features not in FEATURE_RECIPES:
            raise OptionError(f"Head features: expected one of {list(FEATURE_RECIPES)}, but got {self.features!r}.")
        if isinstance(self.examples, bool) or not isinstance(self.examples, int) or self.examples < 0:
            raise OptionError(f"Head examples: expected a count (an integer >= 0), but got {self.examples!r}.")
        fields = tuple(self.fields) if isinstance(self.fields, (list, tuple)) else None
        if not fields or not all(isinstance(f, FieldHead) for f in fields):
            raise OptionError(f"Head fields: expected a non-empty list of FieldHead, but got {self.fields!r}.")
        names = [f.name for f in fields]
        if len(set(names)) != len(names) or len({f.width for f in fields}) != 1:
            raise OptionError(f"Head fields: expected each field once, all reading the same features, got {names}.")
        object.__setattr__(self, "fields", fields)

    @classmethod
    def fit(
        cls,
        engine: Any,
        schema: Any,
        examples: Sequence[tuple[str, Mapping[str, Any]]],
        *,
        fields: Sequence[str] | None = None,
        options: Any = None,
        c: float = 0.1,
        batch_size: int | None = None,
        progress: Callable[[str], None] | None = None,
        require_better: bool = False,
        seed: int = 0,
    ) -> Head:
        """Fit a head per labelled field from ``examples``, read from the engine's own passes, and gate it.

        Each example's text is decided once (closed fields only, nothing generated) with ``options``, keeping the
        features a head reads (:meth:`~pcd_engine.engine.Engine.read_features`); each field's head is fitted on the
        examples that label it (:func:`fit_field_head`). The gate scores each example with a head fitted without it
        (:func:`held_out_distributions`) against the decision the call would make without a head (its correction
        included), with a paired bootstrap interval (:attr:`gates`).

        Few examples work (down to 2 per label; the study's 10 per label read BBC topics at 85%), unbalanced ones
        too (the regression weighs them as they come); a label no example shows stays possible but is never
        decided alone (:data:`UNSEEN_LOG_ODDS`).

        Args:
            engine: The :class:`~pcd_engine.engine.Engine` (its model is the one the head reads).
            schema: The schema (anything :func:`~pcd_engine.schema.compile_schema` takes).
            examples: ``(text, {field: value})`` pairs; a field an example leaves out is not used for that field.
            fields: The fields to fit heads for (``None``: every single-label closed field the examples label).
            options: :class:`~pcd_engine.options.ExtractOptions` or a mapping: the prompt options the head will be
                used with (a ``head`` there is refused).
            c: The inverse L2 penalty of the regressions.
            batch_size: Documents per pass (``None``: the engine's choice).
            progress: Called with a short description before each chunk of :data:`FIT_CHUNK` documents.
            require_better: Refuse (:class:`~pcd_engine.errors.OptionError`) when a field's head is not better than
                the model's own decision beyond chance (:attr:`~pcd_engine.calibrate.gates.Gate.better`).
            seed: Seeds the held-out folds and the bootstrap.

        Raises:
            OptionError: If there are no examples, one is malformed or gives a value its field does not allow, a
                field's examples show fewer than two labels, the options carry a head, or ``require_better`` and a
                head is not better.
        """
        from pcd_engine.schema import compile_schema

        compiled = compile_schema(schema)
        call = engine.resolve(options)
        if call.head is not None:
            raise OptionError("Head: expected options without a head to fit a new one on.")
        targets = example_targets(compiled, examples, fields)
        texts = [text for text, _ in examples]
        rows: list[Any] = []
        for first in range(0, len(texts), FIT_CHUNK):
            chunk = texts[first : first + FIT_CHUNK]
            if progress is not None:
                progress(f"documents {first + 1}-{first + len(chunk)}/{len(texts)}")
            rows += engine.read_features(chunk, compiled, call, fields=list(targets), batch_size=batch_size)
        heads, gates = [], []
        for name, labels in targets.items():
            spec = compiled.field(name)
            values = [label.value for label in spec.labels]
            shown = [i for i, t in enumerate(labels) if t is not None]
            x = [rows[i][1][name].tolist() for i in shown]
            y = [int(labels[i]) for i in shown]  # type: ignore[arg-type]
            heads.append(fit_field_head(name, values, x, y, c=c))
            held = held_out_distributions(name, values, x, y, c=c, seed=seed)
            zero = [rows[i][0][name].label_distribution for i in shown]
            gates.append(gate(name, held, zero, y, seed=seed))
        worse = [g for g in gates if not g.better]
        if require_better and worse:
            raise OptionError("Head: expected each head to beat the model's own decision, but " + "; ".join(
                f"{g.field!r} gained {g.gain:+.1f} points (95% interval {g.interval[0]:+.1f} to {g.interval[1]:+.1f}) "
                f"on {g.held_out} held-out examples" for g in worse) + ".")  # fmt: skip
        return cls(compiled.fingerprint, compiled.title, engine.model_id, FEATURE_RECIPES[0], len(texts),
                   tuple(heads), gates=tuple(gates))  # fmt: skip

    def field(self, name: str) -> FieldHead | None:
        """The head of field ``name``, or ``None`` when it has none."""
        return next((f for f in self.fields if f.name == name), None)

    def check(self, schema: Schema, model: str) -> None:
        """Refuse a schema or model other than the ones it was fitted on, and fields that do not fit the schema.

        Raises:
            OptionError: On a mismatch, naming both sides.
        """
        check_fitted_on("Head", fingerprint=self.schema_fingerprint, title=self.schema_title, model=self.model,
                        schema=schema, model_id=model)  # fmt: skip
        for head in self.fields:
            try:
                spec = schema.field(head.name)
            except KeyError:
                raise OptionError(f"Head: expected a field of {schema.title!r}, but got {head.name!r}.") from None
            expected = [label.value for label in spec.labels]
            if spec.kind not in ("enum", "boolean") or not same_labels(head.labels, expected):
                raise OptionError(
                    f"Head field {head.name!r}: expected a single-label field with the labels {expected}, but the "
                    f"head has {list(head.labels)}."
                )

    def to_json(self) -> dict[str, Any]:
        """The head as plain JSON data (what :meth:`save` writes)."""
        return {
            "format": _FORMAT,
            "schema": {"title": self.schema_title, "fingerprint": self.schema_fingerprint},
            "model": self.model,
            "features": self.features,
            "examples": self.examples,
            "fields": [
                {"name": f.name, "labels": list(f.labels), "mean": list(f.mean), "scale": list(f.scale),
                 "weights": [list(r) for r in f.weights], "bias": list(f.bias), "seen": list(f.seen)}
                for f in self.fields
            ],
        }  # fmt: skip

    @classmethod
    def from_json(cls, data: Any, *, where: str = "head") -> Head:
        """A head from :meth:`to_json`'s data, every value checked.

        Raises:
            InputError: If the data is not a head of this format, naming what is wrong.
        """

        def build(data: Mapping[str, Any]) -> Head:
            fields = tuple(
                FieldHead(f["name"], f["labels"], f["mean"], f["scale"], f["weights"], f["bias"], f["seen"])
                for f in data["fields"]
            )
            return cls(data["schema"]["fingerprint"], data["schema"]["title"], data["model"], data["features"],
                       data["examples"], fields)  # fmt: skip

        return from_fitted_json(data, where=where, kind="pcd head", fmt=_FORMAT, build=build)

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write the head as JSON to ``path``."""
        return write_json_file(path, self.to_json())

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Head:
        """Read a head written by :meth:`save`.

        Raises:
            InputError: If the file is missing, not JSON, or not a head.
        """
        return cls.from_json(read_json_file(path, "Head"), where=f"Head {str(path)!r}")


def held_out_distributions(
    name: str, labels: Sequence[Any], features: Sequence[Sequence[float]], targets: Sequence[int], *,
    folds: int = 5, c: float = 0.1, seed: int = 0,
) -> list[tuple[float, ...]]:  # fmt: skip
    """Each example's distribution from a head fitted without it: stratified folds (as many as the rarest label's
    examples allow, between 2 and ``folds``), each head fitted on the other folds. A label with one example is
    unseen by the head that scores it (see :data:`UNSEEN_LOG_ODDS`).

    Raises:
        OptionError: If a fold's training examples show fewer than two labels (too few examples to gate).
    """
    import random
    from collections import Counter

    order = list(range(len(targets)))
    random.Random(seed).shuffle(order)
    k = max(2, min(folds, min(Counter(targets).values(), default=1)))
    fold_of: dict[int, int] = {}
    for label in sorted(set(targets)):
        members = [i for i in order if targets[i] == label]
        for n, i in enumerate(members):
            fold_of[i] = n % k
    out: list[tuple[float, ...]] = [()] * len(targets)
    for fold in range(k):
        test = [i for i in order if fold_of[i] == fold]
        train = [i for i in order if fold_of[i] != fold]
        if not test:
            continue
        head = fit_field_head(name, labels, [features[i] for i in train], [targets[i] for i in train], c=c)
        for i in test:
            out[i] = head.probabilities(features[i])
    return out


def example_targets(
    schema: Schema, examples: Sequence[tuple[str, Mapping[str, Any]]], fields: Sequence[str] | None
) -> dict[str, list[int | None]]:
    """Per field to fit, each example's label index (``None`` where the example does not label it).

    Raises:
        OptionError: If there are no examples, one is not ``(text, mapping)``, a field is not a single-label closed
            field, a value is not one of its labels, or a field's examples show fewer than two labels.
    """
    headed = {s.name: s for s in schema.fields if s.kind in ("enum", "boolean") and len(s.labels) > 1}
    if not examples:
        raise OptionError("Head: expected labelled examples to fit on, but got none.")
    for i, example in enumerate(examples):
        if not (isinstance(example, tuple) and len(example) == 2 and isinstance(example[0], str)
                and isinstance(example[1], Mapping)):  # fmt: skip
            raise OptionError(f"Head example {i}: expected (text, {{field: value}}), but got {example!r}.")
    for name in [*(fields or ()), *(n for _, labels in examples for n in labels)]:
        if name not in headed:
            raise OptionError(f"Head: expected a single-label closed field of {list(headed)}, but got {name!r}.")
    labelled = {n for _, labels in examples for n in labels}
    named = [n for n in headed if n in labelled] if fields is None else list(fields)
    return {name: _targets(headed[name], examples) for name in named}


def _targets(spec: FieldSpec, examples: Sequence[tuple[str, Mapping[str, Any]]]) -> list[int | None]:
    """Each example's label index for ``spec`` (``None`` where it has none); at least two labels shown."""
    values = [label.value for label in spec.labels]
    out: list[int | None] = []
    for i, (_, labels) in enumerate(examples):
        value = labels.get(spec.name)
        value = value.value if isinstance(value, enum.Enum) else value  # an Enum member, as the user's model has it
        match = [k for k, v in enumerate(values) if v == value and type(v) is type(value)]
        if spec.name in labels and not match:
            raise OptionError(f"Head example {i}, field {spec.name!r}: expected one of {values}, but got {value!r}.")
        out.append(match[0] if match else None)
    if len({t for t in out if t is not None}) < 2:
        raise OptionError(f"Head field {spec.name!r}: expected examples of at least two of its labels.")
    return out
