"""Label shares of a batch (pcd_engine.calibrate.shares): each estimator against its slow definition, EM finding a
known mix from calibrated distributions, the bootstrap interval, and the typed errors."""

from __future__ import annotations

import random

import numpy as np
import pytest

from pcd_engine import label_shares
from pcd_engine.calibrate.shares import estimate_shares, value_shares
from pcd_engine.errors import OptionError
from tests.calibrate.test_calibration import SCHEMA
from tests.calibrate.test_correction import engine, texts


def calibrated_rows(mix, n, *, seed=0, sharpness=2.0):
    """Exact posteriors under uniform labels of documents ``x ~ N(sharpness * e_label, I)``: each label's likelihood
    is ``exp(sharpness * x_label)`` up to a common factor; true labels drawn from ``mix``."""
    rng = np.random.default_rng(seed)
    k = len(mix)
    labels = rng.choice(k, size=n, p=mix)
    x = np.eye(k)[labels] * sharpness + rng.normal(size=(n, k))
    like = np.exp(sharpness * x)
    return (like / like.sum(axis=1, keepdims=True)).tolist(), labels


def slow_em(rows, alpha, steps=2000):
    """Saerens et al.'s EM written out: re-weight every document by the shares, take their mean."""
    k = len(rows[0])
    pi = [1 / k] * k
    for _ in range(steps):
        post = []
        for row in rows:
            w = [p * s for p, s in zip(row, pi)]
            total = sum(w)
            post.append([x / total for x in w])
        pi = [(sum(p[j] for p in post) + alpha - 1) / (len(rows) + k * (alpha - 1)) for j in range(k)]
    return pi


def test_each_estimator_equals_its_definition():
    rng = random.Random(1)
    rows = [[rng.random() for _ in range(3)] for _ in range(40)]
    rows = [[x / sum(r) for x in r] for r in rows]
    mean, _, _ = estimate_shares(rows, method="mean", resamples=0)
    assert mean == pytest.approx([sum(r[j] for r in rows) / 40 for j in range(3)], abs=1e-12)
    count, _, _ = estimate_shares(rows, method="count", resamples=0)
    winners = [max(range(3), key=lambda j: r[j]) for r in rows]
    assert count == pytest.approx([winners.count(j) / 40 for j in range(3)])
    for alpha in (1.0, 2.0):
        em, _, _ = estimate_shares(rows, method="em", alpha=alpha, resamples=0)
        assert em == pytest.approx(slow_em(rows, alpha), abs=1e-6)


def test_em_follows_a_skewed_mix_that_the_mean_understates():
    rows, labels = calibrated_rows([0.8, 0.1, 0.1], 600, seed=2)
    em, low, high = estimate_shares(rows)
    mean, _, _ = estimate_shares(rows, method="mean", resamples=0)
    truth = np.bincount(labels, minlength=3) / len(labels)
    assert abs(em[0] - truth[0]) < abs(mean[0] - truth[0])  # the mean pulls towards uniform
    assert abs(em[0] - truth[0]) < 0.05
    assert all(lo <= s <= hi for s, lo, hi in zip(em, low, high))
    assert high[0] - low[0] < 0.15
    again = estimate_shares(rows)
    assert again == (em, low, high)  # seeded: the same rows, the same interval


def test_label_shares_of_a_batch_on_the_engine(smol_tokenizer):
    eng = engine(smol_tokenizer, anchor=False, correction="auto")
    outs = eng.extract_many(texts(20, seed=3), SCHEMA)
    shares = label_shares(outs, SCHEMA)
    assert list(shares) == ["urgent", "deadline", "carrier", "tags"]
    deadline = shares["deadline"]
    assert deadline.documents == 20 and len(deadline.labels) == 4 and sum(deadline.shares) == pytest.approx(1)
    rows = [o.fields["deadline"].label_distribution for o in outs]
    assert deadline.shares == pytest.approx(estimate_shares(rows)[0])
    tags = shares["tags"]
    yes = [o.fields["tags"].label_probabilities[tags.labels[0]] for o in outs]
    assert tags.shares[0] == pytest.approx(estimate_shares([[p, 1 - p] for p in yes])[0][0])
    assert shares["carrier"].to_json()["labels"][0]["value"] == shares["carrier"].labels[0]


def test_value_shares_count_the_decided_values():
    values = [
        {"urgent": True, "deadline": "1_HOUR", "carrier": None, "tags": ["billing"]},
        {"urgent": False, "deadline": "1_HOUR", "carrier": "dhl", "tags": ["billing", "broken"]},
        None,  # a failed document: skipped
        {"urgent": True, "deadline": "NONE", "carrier": "dhl", "tags": ["shipping"]},
        {"urgent": True, "deadline": "1_WEEK", "carrier": "ups", "tags": ["billing"]},
    ]
    shares = value_shares(values, SCHEMA)
    assert list(shares) == ["urgent", "deadline", "carrier", "tags"]
    assert all(s.documents == 4 and s.method == "count" for s in shares.values())
    deadline = shares["deadline"]
    assert dict(zip(deadline.labels, deadline.shares)) == {"1_HOUR": 0.5, "12_HOURS": 0, "1_WEEK": 0.25, "NONE": 0.25}
    one_hot = [[float(v["deadline"] == label) for label in deadline.labels] for v in values if v is not None]
    assert (deadline.low, deadline.high) == estimate_shares(one_hot, method="count")[1:]
    carrier = shares["carrier"]
    assert dict(zip(carrier.labels, carrier.shares)) == {"dhl": 0.5, "ups": 0.25, None: 0.25}
    tags = shares["tags"]  # each label on its own: the share of documents it is among the answers of
    assert dict(zip(tags.labels, tags.shares)) == {"billing": 0.75, "shipping": 0.25, "broken": 0.25}
    assert list(value_shares(values, SCHEMA, fields=["urgent"])) == ["urgent"]
    assert value_shares([None, None], SCHEMA) == {}
    with pytest.raises(OptionError, match="expected a closed field of several labels.*but got 'note'"):
        value_shares(values, SCHEMA, fields=["note"])


def test_value_shares_of_results_equal_their_count_shares(smol_tokenizer):
    eng = engine(smol_tokenizer, anchor=False)
    outs = eng.extract_many(texts(12, seed=5), SCHEMA)
    fields = ["urgent", "deadline", "carrier"]  # one label each: the decided value is the distribution's argmax
    assert value_shares([o.values for o in outs], SCHEMA, fields=fields) == label_shares(
        outs, SCHEMA, method="count", fields=fields
    )


def test_bad_input_is_refused_with_a_typed_error(smol_tokenizer):
    with pytest.raises(OptionError, match="expected at least one document's distribution"):
        estimate_shares([])
    with pytest.raises(OptionError, match=r"expected rows of one length, but got lengths \[2, 3\]"):
        estimate_shares([[0.5, 0.5], [0.2, 0.3, 0.5]])
    with pytest.raises(OptionError, match="finite"):
        estimate_shares([[float("nan"), 1.0]])
    with pytest.raises(OptionError, match="expected one of"):
        estimate_shares([[0.5, 0.5]], method="median")
    eng = engine(smol_tokenizer, anchor=False)
    outs = eng.extract_many(texts(2, seed=4), SCHEMA)
    with pytest.raises(OptionError, match="expected a closed field of several labels.*but got 'queue'"):
        label_shares(outs, SCHEMA, fields=["queue"])
    with pytest.raises(OptionError, match="at least one decided document"):
        label_shares([ValueError("x")], SCHEMA)
