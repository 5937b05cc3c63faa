"""Decision heads (issue 46, first part): a small linear model per closed field over hidden states of the model's
own pass, fitted from a few labelled examples, and kept as plain JSON tied to the model and schema it was fitted on.

This module owns the head as a value: its numbers, the arithmetic that turns features into a distribution over the
field's labels, fitting one from features with scikit-learn, saving, loading and checking it (every number and label
of a file is checked, as a calibration's are; nothing is unpickled), and the gate: each example scored by a head
fitted without it (stratified folds), against the model's own decision on the same examples, with a paired
bootstrap interval of the accuracy gained. Reading the features from the scoring
pass and deciding fields with a head on every surface are the issue's next parts: until then nothing in the engine
uses a head.

The feature recipe of the design study (``benchmarks/study_head_features.py``): the last layer's state at the
field's answer position beside a middle layer's mean over the document, standardized; a multinomial logistic
regression with an L2 penalty on top.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
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
from pcd_engine.errors import OptionError
from pcd_engine.schema import Schema

__all__ = [
    "FEATURE_RECIPES",
    "FieldHead",
    "Gate",
    "Head",
    "Scores",
    "fit_field_head",
    "gate",
    "held_out_distributions",
    "scores",
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
    """

    schema_fingerprint: str
    schema_title: str
    model: str
    features: str
    examples: int
    fields: tuple[FieldHead, ...]

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


# ---------------------------------------------------------------------------------------------- the gate


@dataclass(frozen=True)
class Scores:
    """How well one reader's distributions decide held-out examples.

    Attributes:
        accuracy: Share of examples whose most likely label is the gold one.
        macro_f1: F1 averaged over the labels that occur (in the gold labels or the decisions).
        ece: Expected calibration error of the decided label's probability, 10 equal-width bins.
        brier: Mean squared error of the whole distribution against the gold label.
    """

    accuracy: float
    macro_f1: float
    ece: float
    brier: float


def scores(distributions: Sequence[Sequence[float]], gold: Sequence[int], *, bins: int = 10) -> Scores:
    """:class:`Scores` of ``distributions`` (one per example, over the same labels) against ``gold`` (indices)."""
    import numpy as np

    p = np.asarray(distributions, dtype=np.float64)
    y = np.asarray(gold, dtype=np.int64)
    decided = p.argmax(axis=1)
    right = decided == y
    f1 = []
    for label in sorted(set(y.tolist()) | set(decided.tolist())):
        tp = float(np.sum(right & (y == label)))
        wrong = float(np.sum(decided == label)) - tp + float(np.sum(y == label)) - tp
        f1.append(2 * tp / (2 * tp + wrong) if tp or wrong else 0.0)
    confidence = p.max(axis=1)
    which = np.minimum((confidence * bins).astype(int), bins - 1)
    ece = sum(abs(confidence[which == b].mean() - right[which == b].mean()) * np.sum(which == b) for b in
              range(bins) if np.any(which == b)) / len(y)  # fmt: skip
    brier = float(np.mean(np.sum((p - np.eye(p.shape[1])[y]) ** 2, axis=1)))
    return Scores(float(right.mean()), float(np.mean(f1)), float(ece), brier)


@dataclass(frozen=True)
class Gate:
    """A head against the model's own (zero-shot) decision on the same held-out examples.

    Attributes:
        field: The field's key.
        held_out: How many examples were scored (each by a head fitted without it).
        head: The head's scores.
        zero_shot: The zero-shot decision's scores.
        gain: The head's accuracy minus the zero-shot accuracy, in points.
        interval: A 95% paired bootstrap interval of ``gain`` (the same resampled examples for both).
    """

    field: str
    held_out: int
    head: Scores
    zero_shot: Scores
    gain: float
    interval: tuple[float, float]

    @property
    def better(self) -> bool:
        """Whether the head is better than the zero-shot decision beyond chance: the interval's lower end > 0."""
        return self.interval[0] > 0


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


def gate(
    name: str, head: Sequence[Sequence[float]], zero_shot: Sequence[Sequence[float]], gold: Sequence[int], *,
    draws: int = 1000, seed: int = 0,
) -> Gate:  # fmt: skip
    """Compare a head's held-out distributions with the zero-shot ones on the same examples (:class:`Gate`).

    Raises:
        OptionError: If the three sequences differ in length or are empty.
    """
    import numpy as np

    if not gold or not len(head) == len(zero_shot) == len(gold):
        raise OptionError(f"Head gate {name!r}: expected one head and one zero-shot distribution per gold label.")
    y = np.asarray(gold)
    right_head = np.asarray(head).argmax(axis=1) == y
    right_zero = np.asarray(zero_shot).argmax(axis=1) == y
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, len(y), size=(draws, len(y)))
    gains = (right_head[picks].mean(axis=1) - right_zero[picks].mean(axis=1)) * 100
    low, high = np.percentile(gains, [2.5, 97.5])
    return Gate(name, len(y), scores(head, gold), scores(zero_shot, gold),
                float((right_head.mean() - right_zero.mean()) * 100), (float(low), float(high)))  # fmt: skip
