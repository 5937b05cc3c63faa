"""Decision heads as values (issue 46, first part): the head's arithmetic equals scikit-learn's own prediction, a
label no example shows stays possible but never wins, a saved head reloads identically, and a head file is
untrusted input (every number and label checked; a fuzz test)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pcd_engine import compile_schema
from pcd_engine.errors import InputError, OptionError
from pcd_engine.heads.fields import (
    TEMPERATURE_PRIOR,
    UNSEEN_LOG_ODDS,
    fit_field_head,
    fit_scaled_head,
    fit_temperature,
    held_out_distributions,
    one_label_distribution,
    tempered,
)
from pcd_engine.heads.gates import gate, scores
from pcd_engine.heads.head import Head
from tests.support import json_mutations

SCHEMA = {"topic": {"type": "enum", "choices": ["business", "sport", "tech"]}, "urgent": {"type": "boolean"}}


def clusters(per_label: int, labels: int, *, width: int = 6, seed: int = 0) -> tuple[np.ndarray, list[int]]:
    """Features of examples drawn around one centre per label."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(scale=3.0, size=(labels, width))
    targets = [i for i in range(labels) for _ in range(per_label)]
    return centres[targets] + rng.normal(size=(len(targets), width)) * np.linspace(0.5, 4, width), targets


@pytest.mark.parametrize("labels", [2, 3])
def test_a_field_head_predicts_as_scikit_learn_does(labels):
    from sklearn.linear_model import LogisticRegression

    x, y = clusters(8, labels)
    names = ["business", "sport", "tech"][:labels]
    head = fit_field_head("topic", names, x.tolist(), y, c=0.1)
    scale = x.std(axis=0)
    reference = LogisticRegression(C=0.1, max_iter=5000).fit((x - x.mean(axis=0)) / scale, y)
    fresh, _ = clusters(5, labels, seed=1)
    expected = reference.predict_proba((fresh - x.mean(axis=0)) / scale)
    got = np.array([head.probabilities(row.tolist()) for row in fresh])
    np.testing.assert_allclose(got, expected, atol=1e-9)
    assert head.seen == (8,) * labels and head.width == x.shape[1]


def test_a_label_no_example_shows_stays_possible_but_never_wins():
    x, y = clusters(6, 2)
    head = fit_field_head("topic", ["business", "sport", "tech"], x.tolist(), y)
    assert head.seen == (6, 6, 0) and head.weights[2] == (0.0,) * head.width
    assert head.bias[2] == pytest.approx(min(head.bias[:2]) + UNSEEN_LOG_ODDS)
    for row in x:
        p = head.probabilities(row.tolist())
        assert 0 < p[2] < 0.01 and int(np.argmax(p)) != 2


def test_fit_refuses_what_it_cannot_fit():
    x, y = clusters(3, 2)
    for args, needle in (
        ((x.tolist(), [0] * len(y)), "at least two labels, but they show 1"),
        ((x.tolist()[:-1], y), "one row of features per example"),
        (([[1.0], [1.0, 2.0]], [0, 1]), "all of one width"),
        ((x.tolist(), [0, 1, 2, 0, 1, 7]), "each target to index one of 2 labels"),
    ):
        with pytest.raises(OptionError, match=needle):
            fit_field_head("topic", ["a", "b"], *args)
    with pytest.raises(OptionError, match="c: expected a positive number"):
        fit_field_head("topic", ["a", "b"], x.tolist(), y, c=0)


def planted() -> Head:
    schema = compile_schema(SCHEMA)
    x, y = clusters(4, 3)
    topic = fit_field_head("topic", ["business", "sport", "tech"], x.tolist(), y)
    urgent = fit_field_head("urgent", [True, False], x.tolist(), [i % 2 for i in range(len(y))])
    return Head(schema.fingerprint, schema.title, "m", "answer-last+document-middle", len(y), (topic, urgent))


def test_a_saved_head_reloads_with_identical_decisions(tmp_path):
    head = planted()
    again = Head.load(head.save(tmp_path / "head.json"))
    assert again == head
    x, _ = clusters(3, 3, seed=5)
    for row in x:
        assert again.field("topic").probabilities(row.tolist()) == head.field("topic").probabilities(row.tolist())


def test_another_schema_model_or_labels_are_refused():
    head = planted()
    head.check(compile_schema(SCHEMA), "m")
    with pytest.raises(OptionError, match="expected the model it was fitted with"):
        head.check(compile_schema(SCHEMA), "other")
    with pytest.raises(OptionError, match="expected the schema it was fitted on"):
        head.check(compile_schema({**SCHEMA, "extra": {"type": "boolean"}}), "m")
    data = head.to_json()
    data["fields"][0]["labels"] = ["business", "sport", "science"]
    with pytest.raises(OptionError, match=r"'topic': expected a single-label field with the labels"):
        Head.from_json(data).check(compile_schema(SCHEMA), "m")


def narrower(field: dict) -> None:
    """One feature fewer, consistently: a head of another width."""
    for key in ("mean", "scale"):
        field[key].pop()
    for row in field["weights"]:
        row.pop()


@pytest.mark.parametrize(
    ("edit", "needle"),
    [
        (lambda d: d["fields"][0]["weights"][0].__setitem__(0, math.nan), "expected a finite number, but got nan"),
        (lambda d: d["fields"][0]["bias"].pop(), "bias: expected a list of 3 numbers"),
        (lambda d: d["fields"][0]["scale"].__setitem__(0, 0.0), "positive scales"),
        (lambda d: d["fields"][0]["weights"].pop(), "one row of weights per label"),
        (lambda d: d["fields"][0]["seen"].__setitem__(0, True), "count of examples"),
        (lambda d: narrower(d["fields"][1]), "all reading the same features"),
        (lambda d: d.__setitem__("features", "everything"), "features: expected one of"),
        (lambda d: d.pop("model"), "no 'model' entry"),
    ],
)
def test_a_bad_head_file_is_an_input_error_naming_it(tmp_path, edit, needle):
    data = planted().to_json()
    edit(data)
    (tmp_path / "head.json").write_text(json.dumps(data))
    with pytest.raises(InputError, match=needle):
        Head.load(tmp_path / "head.json")


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_fuzz_a_mutated_head_file_is_a_typed_error_or_a_head_that_computes(data):
    good = planted().to_json()
    try:
        head = Head.from_json(data.draw(json_mutations(good)))
    except InputError:
        return
    for field in head.fields:
        p = field.probabilities([0.5] * field.width)
        assert len(p) == len(field.labels) and all(math.isfinite(v) for v in p) and sum(p) == pytest.approx(1.0)


# ------------------------------------------------------------------------------------------------ the gate


def test_scores_equal_their_definitions():
    from sklearn.metrics import accuracy_score, f1_score

    rng = np.random.default_rng(3)
    p = rng.dirichlet([1, 1, 1], size=40)
    gold = rng.integers(0, 3, size=40).tolist()
    got = scores(p.tolist(), gold)
    decided = p.argmax(axis=1)
    assert got.accuracy == pytest.approx(accuracy_score(gold, decided))
    assert got.macro_f1 == pytest.approx(f1_score(gold, decided, average="macro"))
    assert got.brier == pytest.approx(
        np.mean([sum((p[i, j] - (j == gold[i])) ** 2 for j in range(3)) for i in range(40)])
    )
    ece = 0.0
    for b in range(10):  # the obvious loop over bins
        inside = [i for i in range(40) if min(int(p[i].max() * 10), 9) == b]
        if inside:
            ece += len(inside) * abs(
                np.mean([p[i].max() for i in inside]) - np.mean([decided[i] == gold[i] for i in inside])
            )
    assert got.ece == pytest.approx(ece / 40)


def test_the_gate_says_a_better_head_is_better_and_a_useless_one_is_not():
    x, y = clusters(12, 3)
    labels = ["business", "sport", "tech"]
    held = held_out_distributions("topic", labels, x.tolist(), y)
    assert len(held) == len(y) and all(len(p) == 3 for p in held)
    lean = [[0.6, 0.2, 0.2]] * len(y)  # a zero-shot reader that always says the first label
    good = gate("topic", held, lean, y)
    assert (
        good.better and good.gain > 0.4 and good.head.accuracy > 0.9 and good.zero_shot.accuracy == pytest.approx(1 / 3)
    )
    assert good.interval[0] <= good.gain <= good.interval[1]
    same = gate("topic", lean, lean, y)
    assert not same.better and same.gain == 0 and same.interval == (0.0, 0.0)
    with pytest.raises(OptionError, match="one head and one zero-shot distribution per gold label"):
        gate("topic", held[:-1], lean, y)


def test_held_out_distributions_never_see_their_own_example():
    """Each example's only feature of its own (a one-hot of its index) is all zero in every training row of the head
    that scores it, so that head can only answer with its label shares; a head fitted on it memorizes it."""
    y = [i % 2 for i in range(12)]
    x = np.eye(12).tolist()
    held = held_out_distributions("topic", ["a", "b"], x, y, c=10.0)
    fitted = fit_field_head("topic", ["a", "b"], x, y, c=10.0)
    for i, row in enumerate(x):
        assert held[i][y[i]] < 0.7  # about the training folds' share of its label (stratified folds), never memorized
        assert fitted.probabilities(row)[y[i]] > 0.9


def test_a_label_seen_once_is_scored_by_heads_that_never_saw_it():
    """11 examples of one label and 1 of the other: the rare one's fold leaves the others one label, and a head
    fitted on them answers it (one_label_distribution, worked out here by hand); every other example is scored by a
    head fitted with both labels. One example per label: each is scored without itself, and nothing raises."""
    x, _ = clusters(6, 2)
    y = [0] * 11 + [1]
    held = held_out_distributions("refund", [False, True], x.tolist(), y)
    unseen = math.exp(UNSEEN_LOG_ODDS)
    assert one_label_distribution(2, 0) == pytest.approx((1 / (1 + unseen), unseen / (1 + unseen)))
    assert held[11] == pytest.approx(one_label_distribution(2, 0))
    assert all(len(p) == 2 and sum(p) == pytest.approx(1) for p in held)
    x3, _ = clusters(1, 3)
    held = held_out_distributions("topic", ["a", "b", "c"], x3.tolist(), [0, 1, 2])
    assert [int(np.argmax(p)) for p in held] != [0, 1, 2]  # a head never answers a label it never saw


def test_a_temperature_divides_the_scores_before_the_softmax_and_never_changes_the_decision():
    from dataclasses import replace

    x, y = clusters(8, 3)
    head = fit_field_head("topic", ["business", "sport", "tech"], x.tolist(), y)
    warm = replace(head, temperature=2.5)
    for row in clusters(4, 3, seed=3)[0]:
        standard = (row - np.asarray(head.mean)) / np.asarray(head.scale)
        scores_ = (np.asarray(head.weights) @ standard + np.asarray(head.bias)) / 2.5
        expected = np.exp(scores_ - scores_.max()) / np.exp(scores_ - scores_.max()).sum()
        got = warm.probabilities(row.tolist())
        np.testing.assert_allclose(got, expected, atol=1e-12)
        assert np.argmax(got) == np.argmax(head.probabilities(row.tolist()))
        np.testing.assert_allclose(tempered(head.probabilities(row.tolist()), 2.5), got, atol=1e-12)
    with pytest.raises(OptionError, match="temperature: expected a positive number"):
        replace(head, temperature=0.0)


def test_fit_temperature_recovers_a_planted_overconfidence():
    """Labels drawn from softmax(z), reported as softmax(3 z): the fitted temperature is near 3, and 1 for
    distributions that are already right."""
    rng = np.random.default_rng(0)
    z = rng.normal(scale=1.5, size=(4000, 4))
    truth = np.exp(z) / np.exp(z).sum(axis=1, keepdims=True)
    gold = [int(rng.choice(4, p=p)) for p in truth]
    sharp = np.exp(3 * z) / np.exp(3 * z).sum(axis=1, keepdims=True)
    assert fit_temperature(sharp.tolist(), gold) == pytest.approx(3.0, rel=0.08)
    assert fit_temperature(truth.tolist(), gold) == pytest.approx(1.0, rel=0.08)


def test_a_scaled_head_is_fitted_on_its_held_out_folds_and_saved_with_its_temperature(tmp_path):
    """``fit_scaled_head``: the head of ``fit_field_head`` at the temperature fitted on exactly the held-out
    distributions of ``held_out_distributions``, whose log-loss it does not raise; the temperature survives a save;
    a head file without one (before it existed) reads as 1."""
    x, y = clusters(10, 3, seed=2)
    labels = ["business", "sport", "tech"]
    head, held = fit_scaled_head("topic", labels, x.tolist(), y, seed=0)
    assert held == held_out_distributions("topic", labels, x.tolist(), y, seed=0)
    assert head.temperature == fit_temperature(held, y) and head.temperature != 1.0
    plain = fit_field_head("topic", labels, x.tolist(), y)
    assert (head.weights, head.bias) == (plain.weights, plain.bias)

    def loss(rows):
        return -np.mean([math.log(r[t]) for r, t in zip(rows, y, strict=True)])

    assert loss([tempered(p, head.temperature) for p in held]) <= loss(held)
    full = Head("f", "T", "m", "answer-last+document-middle", 30, (head,))
    again = Head.load(full.save(tmp_path / "h.json"))
    assert again.fields[0].temperature == head.temperature
    data = json.loads((tmp_path / "h.json").read_text())
    del data["fields"][0]["temperature"]
    assert Head.from_json(data).fields[0].temperature == 1.0


def test_fit_temperature_is_the_minimum_of_its_penalized_likelihood_on_a_grid():
    """With few examples the prior on ``log T`` counts: the fitted temperature is where the held-out negative
    log-likelihood plus ``TEMPERATURE_PRIOR * log(T) ** 2`` is lowest on a fine grid (the slow, obvious search), and
    nearer 1 than the likelihood alone would put it."""
    rng = np.random.default_rng(3)
    z = rng.normal(scale=1.5, size=(12, 3))
    gold = [int(rng.choice(3, p=np.exp(r) / np.exp(r).sum())) for r in z]
    sharp = np.exp(4 * z) / np.exp(4 * z).sum(axis=1, keepdims=True)

    def objective(log_t, prior):
        rows = [tempered(p, math.exp(log_t)) for p in sharp]
        return -sum(math.log(r[g]) for r, g in zip(rows, gold, strict=True)) + prior * log_t * log_t

    grid = np.linspace(math.log(0.05), math.log(20.0), 4001)
    best = grid[np.argmin([objective(t, TEMPERATURE_PRIOR) for t in grid])]
    unpenalized = grid[np.argmin([objective(t, 0.0) for t in grid])]
    got = math.log(fit_temperature(sharp.tolist(), gold))
    assert got == pytest.approx(best, abs=2e-3)
    assert 0 < got < unpenalized
