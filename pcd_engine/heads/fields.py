"""One field's decision head (issue 46): the numbers of a small linear model over a field's features, the arithmetic
that turns features into the field's distribution, and fitting it with scikit-learn, for a single-label field (a
multinomial logistic regression) and a multi-label one (a yes/no regression per label, each over the features read
where that label's flag is decided); the held-out distributions a head's gate compares
(:func:`held_out_distributions`); and the temperature that makes a single-label head's probabilities mean what they
say, fitted on those held-out distributions (:func:`fit_temperature`, :func:`fit_scaled_head`).
:class:`~pcd_engine.heads.head.Head` ties field heads to a schema and model.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass, replace
from typing import Any

from pcd_engine.calibrate.fitted import finite_real
from pcd_engine.errors import OptionError
from pcd_engine.heads.thresholds import checked_floor, checked_held_out

__all__ = [
    "TEMPERATURE_PRIOR",
    "UNSEEN_LOG_ODDS",
    "FieldHead",
    "fit_field_head",
    "fit_flag_head",
    "fit_scaled_head",
    "fit_temperature",
    "held_out_distributions",
    "held_out_yes",
    "tempered",
]

UNSEEN_LOG_ODDS = -math.log(1000.0)
"""A label no example shows gets no weights and a bias this far below the lowest bias of the labels shown: at the
examples' mean features its odds are 1/1000 of the least likely shown label's. It stays possible in the head's
distribution, and the head does not decide it on its own."""


TEMPERATURE_PRIOR = 1.0
"""The weight of the prior :func:`fit_temperature` puts on ``log T`` being 0 (the temperature being 1): added to the
held-out negative log-likelihood as ``TEMPERATURE_PRIOR * log(T) ** 2``."""


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
    """One closed field's head: ``softmax(weights @ ((x - mean) / scale) + bias)`` over its labels; for a
    multi-label field (``kind="multi"``), each label's probability of applying, ``sigmoid(weights[i] @ ((x_i - mean) /
    scale) + bias[i])``, where ``x_i`` are the features read where label ``i``'s flag is decided.

    Attributes:
        name: The field's key.
        labels: Its labels' values, in schema order.
        mean: Each feature's mean over the fitting examples (standardization).
        scale: Each feature's standard deviation over them (1 where it was 0).
        weights: One row of feature weights per label.
        bias: One intercept per label.
        seen: Per label, how many fitting examples showed it (0: the label's odds are fixed low, see
            :data:`UNSEEN_LOG_ODDS`); for a multi-label field, how many it applied to.
        kind: ``"single"`` (one label per document) or ``"multi"`` (a multi-label field).
        temperature: The scores are divided by it before the softmax (or the sigmoid): above 1 the probabilities
            spread, below 1 they sharpen; the decision never changes. :func:`fit_scaled_head` fits it on held-out
            distributions; 1 leaves the regression's own.
        held_out: A single-label head's held-out evidence from its folds, at its temperature: per fitting example,
            the probability a head fitted without it gave its decided label and the probability it gave the true
            one (:data:`~pcd_engine.heads.thresholds.HeldOut`); what thresholds and prediction sets are chosen on.
            Empty for a multi-label head, and for a head saved before they were kept.
        min_probability: The field's abstention threshold, kept with the head
            (:meth:`~pcd_engine.heads.head.Head.with_thresholds`): a decision below it is marked abstained, as the
            call option ``min_probability`` does (which, when given, is used in its place). ``None``: none.
    """

    name: str
    labels: tuple[Any, ...]
    mean: tuple[float, ...]
    scale: tuple[float, ...]
    weights: tuple[tuple[float, ...], ...]
    bias: tuple[float, ...]
    seen: tuple[int, ...]
    kind: str = "single"
    temperature: float = 1.0
    held_out: tuple[tuple[float, float], ...] = ()
    min_probability: float | None = None

    def __post_init__(self) -> None:
        where = f"Head field {self.name!r}"
        if self.kind not in ("single", "multi"):
            raise OptionError(f"{where} kind: expected 'single' or 'multi', but got {self.kind!r}.")
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
        temperature = _real(f"{where} temperature", self.temperature)
        if temperature <= 0:
            raise OptionError(f"{where} temperature: expected a positive number, but got {self.temperature!r}.")
        object.__setattr__(self, "bias", bias)
        object.__setattr__(self, "seen", seen)
        object.__setattr__(self, "temperature", temperature)
        object.__setattr__(self, "held_out", checked_held_out(where, self.held_out))
        object.__setattr__(self, "min_probability", checked_floor(where, self.min_probability))

    @property
    def width(self) -> int:
        """How many features the head reads."""
        return len(self.mean)

    def probabilities(self, features: Sequence[float]) -> tuple[float, ...]:
        """The head's distribution over :attr:`labels` for one document's features.

        Raises:
            OptionError: If ``features`` does not have :attr:`width` values, or the head is a multi-label field's.
        """
        if self.kind != "single":
            raise OptionError(f"Head field {self.name!r}: a multi-label head reads one row of features per label.")
        if len(features) != self.width:
            raise OptionError(f"Head field {self.name!r}: expected {self.width} features, but got {len(features)}.")
        x = [(f - m) / s for f, m, s in zip(features, self.mean, self.scale, strict=True)]
        scores = [
            (sum(w * v for w, v in zip(row, x, strict=True)) + b) / self.temperature
            for row, b in zip(self.weights, self.bias, strict=True)
        ]
        top = max(scores)
        exp = [math.exp(s - top) for s in scores]
        total = sum(exp)
        return tuple(e / total for e in exp)

    def yes(self, features: Sequence[Sequence[float]]) -> tuple[float, ...]:
        """A multi-label head's probability that each label applies, from one row of features per label.

        Raises:
            OptionError: If the head is not a multi-label field's, or the rows do not fit it.
        """
        if self.kind != "multi" or len(features) != len(self.labels) or any(len(r) != self.width for r in features):
            raise OptionError(
                f"Head field {self.name!r}: expected {len(self.labels)} rows of {self.width} features (multi-label)."
            )
        out = []
        for row, weights, bias in zip(features, self.weights, self.bias, strict=True):
            score = bias + sum(w * (f - m) / s for w, f, m, s in zip(weights, row, self.mean, self.scale, strict=True))
            score /= self.temperature
            out.append(1 / (1 + math.exp(-score)) if score >= 0 else math.exp(score) / (1 + math.exp(score)))
        return tuple(out)


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


def tempered(distribution: Sequence[float], temperature: float) -> tuple[float, ...]:
    """A distribution at another temperature: ``p ** (1 / T)``, normalized (the softmax of the scores divided by
    ``T``, for a distribution that is their softmax)."""
    logs = [math.log(max(p, 1e-300)) / temperature for p in distribution]
    top = max(logs)
    exp = [math.exp(v - top) for v in logs]
    total = sum(exp)
    return tuple(e / total for e in exp)


def fit_temperature(distributions: Sequence[Sequence[float]], targets: Sequence[int]) -> float:
    """The temperature that makes held-out distributions most likely for their labels, with a weak prior that it is 1:
    the lowest negative log-likelihood of :func:`tempered` plus :data:`TEMPERATURE_PRIOR` ``* log(T) ** 2`` (a normal
    prior on ``log T`` with standard deviation 0.7), searched over 0.05-20 by SciPy's bounded scalar minimizer on
    ``log T``. One parameter, so fitted on as few examples as the gate has; the prior keeps a handful of them from
    pulling it far (Rotten Tomatoes, 10 reviews per verdict: held-out ECE 10.2% without it, 5.0% with it; BBC at
    5-50 per topic unchanged).

    Raises:
        OptionError: If the lengths differ or there are none.
        BackendUnavailableError: If SciPy is not installed.
    """
    import numpy as np

    from pcd_engine.errors import pip_install, require

    (optimize,) = require("scipy.optimize", what="Scaling a head", install=pip_install("eval"))
    if not distributions or len(distributions) != len(targets):
        raise OptionError("Head temperature: expected one held-out distribution per label.")
    logs = np.log(np.clip(np.asarray(distributions, dtype=np.float64), 1e-300, None))
    gold = np.asarray(targets)

    def loss(log_t: float) -> float:
        z = logs / math.exp(log_t)
        z = z - z.max(axis=1, keepdims=True)
        nll = float(np.sum(np.log(np.exp(z).sum(axis=1)) - z[np.arange(len(gold)), gold]))
        return nll + TEMPERATURE_PRIOR * log_t * log_t

    found = optimize.minimize_scalar(loss, bounds=(math.log(0.05), math.log(20.0)), method="bounded")
    best = math.exp(float(found.x))
    return best if loss(float(found.x)) < loss(0.0) else 1.0


def fit_scaled_head(
    name: str, labels: Sequence[Any], features: Sequence[Sequence[float]], targets: Sequence[int], *,
    c: float = 0.1, seed: int = 0,
) -> tuple[FieldHead, list[tuple[float, ...]]]:  # fmt: skip
    """A single-label field's head fitted on every example (:func:`fit_field_head`) at the temperature fitted on
    its held-out distributions (:func:`held_out_distributions`, :func:`fit_temperature`), keeping their evidence at
    that temperature (:attr:`FieldHead.held_out`), and those held-out distributions, unscaled (:func:`tempered`
    scales them as the head now does).

    Raises:
        OptionError: As :func:`fit_field_head`.
    """
    held = held_out_distributions(name, labels, features, targets, c=c, seed=seed)
    head = fit_field_head(name, labels, features, targets, c=c)
    temperature = fit_temperature(held, targets)
    scaled = [tempered(p, temperature) for p in held]
    evidence = tuple((max(p), min(p[t], max(p))) for p, t in zip(scaled, targets, strict=True))
    return replace(head, temperature=temperature, held_out=evidence), held


def held_out_distributions(
    name: str, labels: Sequence[Any], features: Sequence[Sequence[float]], targets: Sequence[int], *,
    folds: int = 5, c: float = 0.1, seed: int = 0,
) -> list[tuple[float, ...]]:  # fmt: skip
    """Each example's distribution from a head fitted without it: stratified folds (scikit-learn's
    ``StratifiedKFold``, shuffled by ``seed``; as many folds as the rarest label's examples allow, between 2 and
    ``folds``; plain folds where every label is seen once), each head fitted on the other folds. A label with one
    example is unseen by the head that scores it (see :data:`UNSEEN_LOG_ODDS`); where the other folds show a
    single label (a rare answer's own fold), the head fitted on them knows only that label and answers it
    (:func:`one_label_distribution`), as any head fitted on those examples would.

    Raises:
        BackendUnavailableError: If scikit-learn is not installed.
    """
    import warnings
    from collections import Counter

    from pcd_engine.errors import pip_install, require

    (selection,) = require("sklearn.model_selection", what="Gating a head", install=pip_install("eval"))
    counts = Counter(targets).values()
    k = max(2, min(folds, min(counts, default=1), len(targets)))
    # every label seen once leaves nothing to stratify: plain folds (scikit-learn refuses stratified ones)
    split = selection.StratifiedKFold if max(counts, default=0) >= k else selection.KFold
    splitter = split(n_splits=k, shuffle=True, random_state=seed)
    out: list[tuple[float, ...]] = [()] * len(targets)
    with warnings.catch_warnings():  # a label seen less often than there are folds is expected here
        warnings.filterwarnings("ignore", message="The least populated class", category=UserWarning)
        splits = list(splitter.split([[0]] * len(targets), list(targets)))
    for train, test in splits:
        shown = {targets[i] for i in train}
        if len(shown) == 1:
            only = one_label_distribution(len(labels), shown.pop())
            for i in test:
                out[i] = only
            continue
        head = fit_field_head(name, labels, [features[i] for i in train], [targets[i] for i in train], c=c)
        for i in test:
            out[i] = head.probabilities(features[i])
    return out


def one_label_distribution(count: int, label: int) -> tuple[float, ...]:
    """What a head fitted on examples of one label answers: that label, each unseen label at
    :data:`UNSEEN_LOG_ODDS` below it."""
    unseen = math.exp(UNSEEN_LOG_ODDS)
    total = 1.0 + unseen * (count - 1)
    return tuple((1.0 if i == label else unseen) / total for i in range(count))


def fit_flag_head(
    name: str,
    labels: Sequence[Any],
    features: Sequence[Sequence[Sequence[float]]],
    targets: Sequence[Collection[int]],
    *,
    c: float = 0.1,
) -> FieldHead:
    """Fit a multi-label field's head: the features standardized over every label's rows, then one yes/no logistic
    regression per label (scikit-learn, ``C=c``) on that label's rows. A label that applies to every example or to
    none keeps no weights and the add-one smoothed log-odds of applying.

    Args:
        name: The field's key.
        labels: Its labels, in schema order.
        features: Per example, one row of features per label (read where that label's flag is decided).
        targets: Per example, the indices of the labels that apply.
        c: The inverse of the L2 penalty's strength.

    Raises:
        OptionError: If the rows are ragged or empty, a target is out of range, or ``c`` is not positive.
        BackendUnavailableError: If scikit-learn is not installed.
    """
    import numpy as np

    from pcd_engine.errors import pip_install, require

    (linear,) = require("sklearn.linear_model", what="Fitting a head", install=pip_install("eval"))
    if not (isinstance(c, (int, float)) and not isinstance(c, bool) and math.isfinite(c) and c > 0):
        raise OptionError(f"Head {name!r}: c: expected a positive number, but got {c!r}.")
    x = np.asarray(features, dtype=np.float64)
    if x.ndim != 3 or x.shape[0] != len(targets) or x.shape[1] != len(labels) or not x.size:
        raise OptionError(f"Head {name!r}: expected one row of features per label for each example.")
    if not all(0 <= t < len(labels) for chosen in targets for t in chosen):
        raise OptionError(f"Head {name!r}: expected each target to index one of {len(labels)} labels.")
    mean = x.reshape(-1, x.shape[2]).mean(axis=0)
    scale = x.reshape(-1, x.shape[2]).std(axis=0)
    scale[scale == 0] = 1.0
    weights, bias, seen = [], [], []
    for i in range(len(labels)):
        y = np.array([i in chosen for chosen in targets])
        seen.append(int(y.sum()))
        if 0 < y.sum() < len(y):
            model = linear.LogisticRegression(C=c, max_iter=5000).fit((x[:, i] - mean) / scale, y)
            weights.append(tuple(float(w) for w in model.coef_[0]))
            bias.append(float(model.intercept_[0]))
        else:
            weights.append((0.0,) * x.shape[2])
            bias.append(math.log((y.sum() + 1) / (len(y) - y.sum() + 1)))
    return FieldHead(name, tuple(labels), tuple(mean.tolist()), tuple(scale.tolist()), tuple(weights), tuple(bias),
                     tuple(seen), kind="multi")  # fmt: skip


def held_out_yes(
    name: str, labels: Sequence[Any], features: Sequence[Sequence[Sequence[float]]],
    targets: Sequence[Collection[int]], *, folds: int = 5, c: float = 0.1, seed: int = 0,
) -> list[tuple[float, ...]]:  # fmt: skip
    """:func:`held_out_distributions` for a multi-label field: each example's probability that each label applies,
    from a head (:func:`fit_flag_head`) fitted on the other folds (between 2 and ``folds`` folds over the examples)."""
    import random

    order = list(range(len(targets)))
    random.Random(seed).shuffle(order)
    k = max(2, min(folds, len(order)))
    out: list[tuple[float, ...]] = [()] * len(targets)
    for fold in range(k):
        test = order[fold::k]
        train = [i for i in order if i not in set(test)]
        if not test or not train:
            continue
        head = fit_flag_head(name, labels, [features[i] for i in train], [targets[i] for i in train], c=c)
        for i in test:
            out[i] = head.yes(features[i])
    return out
