"""Knowing when to trust a decision (issue 58): thresholds for a target accuracy and split conformal prediction sets
equal their brute-force definitions, the sets keep their coverage guarantee on held-out data, a head keeps its
held-out evidence and its thresholds in its file, and a call abstains at a head's threshold and answers prediction
sets from it."""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest

from pcd_engine import Head
from pcd_engine.errors import InputError, OptionError
from pcd_engine.heads.fields import FieldHead
from pcd_engine.heads.thresholds import choose_threshold, prediction_set, risk_coverage, set_cutoff, wilson
from tests.heads.test_head_decisions import SCHEMA, examples


def held_out(n: int, labels: int, *, seed: int) -> list[tuple[float, float]]:
    """Evidence of a reader whose distributions are softmaxes of noisy scores, the true label drawn from them."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        p = np.exp(rng.normal(scale=2.0, size=labels))
        p /= p.sum()
        truth = rng.choice(labels, p=p)
        out.append((float(p.max()), float(p[truth])))
    return out


def test_risk_coverage_is_the_accuracy_of_what_each_threshold_answers():
    pairs = held_out(60, 4, seed=1) + [(0.5, 0.5), (0.5, 0.2)]  # a tie at one probability
    curve = risk_coverage(pairs)
    thresholds = sorted({top for top, _ in pairs}, reverse=True)
    assert [t for t, _, _ in curve] == thresholds
    for t, coverage, accuracy in curve:
        kept = [(top, truth) for top, truth in pairs if top >= t]
        assert coverage == pytest.approx(len(kept) / len(pairs))
        assert accuracy == pytest.approx(sum(truth == top for top, truth in kept) / len(kept))


@pytest.mark.parametrize("target", [0.6, 0.8, 0.9, 0.95, 1.0])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_chosen_threshold_is_the_lowest_from_which_every_higher_one_reaches_the_target(target, seed):
    pairs = held_out(80, 5, seed=seed)
    got = choose_threshold("topic", pairs, accuracy=target, seed=3)

    def accuracy_at(t):
        kept = [truth == top for top, truth in pairs if top >= t]
        return sum(kept) / len(kept)

    candidates = sorted({top for top, _ in pairs})
    good = [t for t in candidates if all(accuracy_at(u) >= target for u in candidates if u >= t)]
    assert got.reached == bool(good)
    if good:
        assert got.probability == min(good)
        kept = [truth == top for top, truth in pairs if top >= got.probability]
        assert got.coverage == pytest.approx(len(kept) / len(pairs))
        assert got.achieved == pytest.approx(sum(kept) / len(kept)) and got.achieved >= target
        assert got.interval[0] <= got.achieved <= got.interval[1]
    else:
        assert got.probability == 1.0
    assert got.held_out == 80 and got.accuracy == target
    assert got == choose_threshold("topic", pairs, accuracy=target, seed=3)  # the bootstrap is seeded


def test_bad_threshold_input_is_an_option_error_naming_it():
    with pytest.raises(OptionError, match=r"'topic'.*accuracy: expected a number in \(0, 1\], but got 1.5"):
        choose_threshold("topic", [(0.9, 0.9)], accuracy=1.5)
    with pytest.raises(OptionError, match="'topic': expected held-out examples"):
        choose_threshold("topic", [], accuracy=0.9)
    with pytest.raises(OptionError, match=r"level: expected a number in \(0, 1\), but got 1"):
        set_cutoff([(0.9, 0.9)], 1)


@pytest.mark.parametrize("level", [0.5, 0.8, 0.9, 0.95])
def test_the_set_cutoff_is_the_highest_that_keeps_enough_true_labels(level):
    """Split conformal by its definition: the highest cutoff at which at least ``ceil((n + 1) * level)`` of the n
    held-out true labels reach it (0 when n is too small)."""
    for n in (5, 19, 50):
        pairs = held_out(n, 4, seed=n)
        need = math.ceil((n + 1) * level)
        options = [c for c in [0.0, *(truth for _, truth in pairs)] if sum(t >= c for _, t in pairs) >= need]
        assert set_cutoff(pairs, level) == (max(options) if need <= n else 0.0)


def test_prediction_sets_are_never_empty_and_most_probable_first():
    assert prediction_set(["a", "b", "c"], [0.2, 0.5, 0.3], 0.25) == ("b", "c")
    assert prediction_set(["a", "b", "c"], [0.2, 0.5, 0.3], 0.9) == ("b",)
    assert prediction_set(["a", "b", "c"], [0.2, 0.5, 0.3], 0.0) == ("b", "c", "a")


@pytest.mark.parametrize("level", [0.8, 0.9])
def test_prediction_sets_cover_the_true_label_at_their_level_on_held_out_data(level):
    """The guarantee, on exchangeable data: over many splits, the mean share of held-out examples whose set holds
    the true label is at least the level (within the simulation's error), and not far above it."""
    rng = np.random.default_rng(0)
    covered = []
    for trial in range(300):
        logits = rng.normal(scale=1.5, size=(150, 4))
        p = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
        shrunk = p**0.5 / (p**0.5).sum(axis=1, keepdims=True)  # the reader is under-confident: sets still cover
        truth = np.array([rng.choice(4, p=row) for row in p])
        cal = [(float(r.max()), float(r[t])) for r, t in zip(shrunk[:50], truth[:50], strict=True)]
        cutoff = set_cutoff(cal, level)
        hits = [
            truth[i] in [["a", "b", "c", "d"].index(v) for v in prediction_set(list("abcd"), shrunk[i], cutoff)]
            for i in range(50, 150)
        ]
        covered.append(np.mean(hits))
    assert level - 0.01 <= float(np.mean(covered)) <= level + 0.06


def field_head(**changes) -> FieldHead:
    base = dict(name="topic", labels=("a", "b"), mean=(0.0,), scale=(1.0,), weights=((1.0,), (-1.0,)),
                bias=(0.0, 0.0), seen=(3, 3))  # fmt: skip
    return FieldHead(**{**base, **changes})


def test_held_out_evidence_and_a_threshold_are_saved_with_the_head_and_checked(tmp_path):
    evidence = tuple(held_out(30, 2, seed=4))
    head = Head("f", "T", "m", "answer-last+document-middle", 30, (field_head(held_out=evidence),))
    assert head.field("topic").min_probability is None
    set_at = head.with_thresholds(accuracy=0.9)
    chosen = head.threshold("topic", accuracy=0.9)
    assert set_at.field("topic").min_probability == chosen.probability
    again = Head.load(set_at.save(tmp_path / "h.json"))
    assert again.fields == set_at.fields and again.threshold("topic", accuracy=0.9) == chosen
    assert again.set_cutoff("topic", 0.9) == set_cutoff(evidence, 0.9)
    data = json.loads((tmp_path / "h.json").read_text())
    for edit, needle in [
        (lambda f: f.update(held_out=[[0.4, 0.6]]), r"0 <= true <= decided <= 1"),
        (lambda f: f.update(held_out=[[0.9]]), r"\[decided, true\] probability pairs"),
        (lambda f: f.update(min_probability=1.5), r"min_probability: expected a number in \(0, 1\]"),
    ]:
        bad = json.loads(json.dumps(data))
        edit(bad["fields"][0])
        with pytest.raises(InputError, match=needle):
            Head.from_json(bad)
    del data["fields"][0]["held_out"], data["fields"][0]["min_probability"]
    old = Head.from_json(data)  # a head saved before these were kept
    with pytest.raises(OptionError, match="'topic': a threshold needs the head's held-out evidence.*refit it"):
        old.threshold("topic")
    with pytest.raises(OptionError, match="expected one of its fields \\['topic'\\], but got 'tone'"):
        head.threshold("tone")


@pytest.fixture(scope="module")
def tone_head(tiny_engine):
    return Head.fit(tiny_engine, SCHEMA, examples(), fields=["tone"])


def test_fit_keeps_each_examples_held_out_evidence_at_the_heads_temperature(tone_head):
    """The evidence is the gate's own: its accuracy is the gate's held-out accuracy."""
    (gate,) = tone_head.gates
    evidence = tone_head.field("tone").held_out
    assert len(evidence) == gate.held_out == 24
    assert np.mean([truth == top for top, truth in evidence]) == pytest.approx(gate.head.accuracy)


def test_a_call_abstains_at_the_heads_threshold_unless_it_gives_its_own(tiny_engine, tone_head):
    text = "Order 99. I am furious about this!"
    spread = dataclasses.replace(tone_head, fields=(dataclasses.replace(tone_head.field("tone"), temperature=1e3),))
    p = tiny_engine.extract(text, SCHEMA, head=spread).fields["tone"].probability
    assert p < 0.99
    strict = dataclasses.replace(spread, fields=(dataclasses.replace(spread.field("tone"), min_probability=p + 1e-6),))
    out = tiny_engine.extract(text, SCHEMA, head=strict)
    assert out.fields["tone"].abstained and out.values["tone"] == "angry"  # not Optional: flagged, kept
    assert any("below the head's threshold" in w for w in out.warnings)
    assert not out.fields["refund"].abstained  # no head, no threshold
    lenient = tiny_engine.extract(text, SCHEMA, head=strict, min_probability=p / 2)
    assert not lenient.fields["tone"].abstained  # the call's own threshold is used in its place


def test_a_prediction_set_comes_from_the_heads_evidence_and_the_others_are_named(tiny_engine, tone_head):
    text = "Order 98. So sad and tired today."
    out = tiny_engine.extract(text, SCHEMA, head=tone_head, prediction_set=0.9)
    tone = out.fields["tone"]
    cutoff = tone_head.set_cutoff("tone", 0.9)
    labels = ["calm", "angry", "sad"]
    expected = prediction_set(labels, tone.label_distribution, cutoff)
    assert tone.prediction_set == expected and tone.prediction_set[0] == tone.value
    assert out.to_json()["fields"]["tone"]["prediction_set"] == list(expected)
    assert out.fields["refund"].prediction_set is None
    assert any("['refund']: no prediction set at 0.9" in w for w in out.warnings)
    assert tiny_engine.extract(text, SCHEMA, head=tone_head).fields["tone"].prediction_set is None
    with pytest.raises(OptionError, match=r"prediction_set: expected a level in \(0, 1\)"):
        tiny_engine.extract(text, SCHEMA, prediction_set=1.0)


def test_the_interval_is_never_zero_width_where_every_kept_answer_was_right():
    """Two kept answers, both right: the bootstrap alone says [100%, 100%]; the Wilson interval widens it."""
    pairs = [(0.99, 0.99), (0.98, 0.98), *[(0.5, 0.1)] * 20]
    got = choose_threshold("topic", pairs, accuracy=0.95)
    assert got.probability == 0.98 and got.achieved == 1.0
    assert got.interval[1] == 1.0 and got.interval[0] == pytest.approx(wilson(2, 2)[0]) and got.interval[0] < 0.5
    low, high = wilson(45, 50)  # against the textbook formula
    p, n, z = 0.9, 50, 1.96
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    assert (low, high) == pytest.approx((centre - half, centre + half))
