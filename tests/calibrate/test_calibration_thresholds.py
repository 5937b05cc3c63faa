"""A calibration fitted with labelled examples keeps their held-out evidence (each example's calibrated reading under
the prior of the other examples' labels): thresholds, abstention and prediction sets are chosen on it as on a head's
(issue 58)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from pcd_engine import Calibrator
from pcd_engine.calibrate.calibrator import FieldPrior
from pcd_engine.errors import OptionError
from pcd_engine.heads.thresholds import choose_threshold, set_cutoff
from tests.calibrate.test_calibration import SCHEMA, oracle  # noqa: F401 - the fixture

TEXTS = [f"Ticket {i}: the parcel is late and the customer is upset." for i in range(4)]
EXAMPLES = [
    ("Refund now, it broke!", {"deadline": "1_HOUR", "tags": ["broken", "billing"]}),
    ("Whenever you can.", {"deadline": "1_WEEK", "carrier": None, "tags": []}),
    ("Today please.", {"deadline": "1_HOUR", "carrier": "dhl"}),
    ("By tomorrow morning would be fine.", {"deadline": "12_HOURS"}),
    ("No rush at all.", {"deadline": "NONE", "carrier": "ups"}),
    ("Within the hour or I cancel.", {"deadline": "1_HOUR"}),
]


@pytest.fixture
def fitted(oracle):  # noqa: F811
    return Calibrator.fit(oracle[1], TEXTS, SCHEMA, method="em", examples=EXAMPLES)


def expected_evidence(engine, cal, name):
    """The obvious computation: each example that labels ``name``, read alone (the model's own distribution),
    corrected with the fitted lean and the add-one shares of the OTHER examples' labels."""
    prior = cal.field(name)
    out = []
    for i, (text, labels) in enumerate(EXAMPLES):
        if name not in labels:
            continue
        others = [ex[name] for j, (_, ex) in enumerate(EXAMPLES) if j != i and name in ex]
        shares = tuple((others.count(v) + 1) / (len(others) + len(prior.labels)) for v in prior.labels)
        own = engine.extract(text, SCHEMA, strategy="exact", staging="one_pass").fields[name].label_distribution
        dist = FieldPrior(name, prior.labels, prior.bias, shares).correct(own)
        out.append((max(dist), dist[prior.labels.index(labels[name])]))
    return out


def test_each_single_label_field_keeps_its_examples_held_out_evidence(oracle, fitted):  # noqa: F811
    for name in ("deadline", "carrier"):
        got = fitted.field(name).held_out
        assert len(got) == sum(name in ex for _, ex in EXAMPLES)
        np.testing.assert_allclose(got, expected_evidence(oracle[1], fitted, name), atol=1e-9)
    assert fitted.field("tags").held_out == () and fitted.field("urgent").held_out == ()
    without = Calibrator.fit(oracle[1], TEXTS, SCHEMA, method="em")
    assert all(f.held_out == () for f in without.fields)


def test_thresholds_and_cutoffs_are_chosen_on_that_evidence(fitted):
    evidence = fitted.field("deadline").held_out
    assert fitted.threshold("deadline", accuracy=0.5) == choose_threshold("deadline", evidence, accuracy=0.5)
    assert fitted.set_cutoff("deadline", 0.8) == set_cutoff(evidence, 0.8)
    kept = fitted.with_thresholds(accuracy=0.5)
    for prior in kept.fields:
        chosen = fitted.threshold(prior.name, accuracy=0.5).probability if prior.held_out else None
        assert prior.min_probability == chosen
    with pytest.raises(OptionError, match=r"Calibration field 'tags': a threshold needs .* held-out evidence"):
        fitted.threshold("tags", accuracy=0.9)
    with pytest.raises(OptionError, match=r"Calibration: expected one of its fields .* got 'nope'"):
        fitted.set_cutoff("nope", 0.9)


def test_the_evidence_and_thresholds_are_saved_and_older_files_still_load(fitted, tmp_path):
    kept = fitted.with_thresholds(accuracy=0.5, fields=["deadline"])
    again = Calibrator.load(kept.save(tmp_path / "cal.json"))
    assert again == kept
    plain = kept.to_json()
    for f in plain["fields"]:
        f.pop("held_out", None)
        f.pop("min_probability", None)
    assert all(f.held_out == () and f.min_probability is None for f in Calibrator.from_json(plain).fields)
    bad = kept.to_json()
    bad["fields"][1]["held_out"] = [[0.2, 0.9]]
    with pytest.raises(Exception, match="expected 0 <= true <= decided <= 1"):
        Calibrator.from_json(bad)


def test_a_kept_threshold_abstains_in_calibrated_calls_unless_the_call_sets_its_own(oracle, fitted):  # noqa: F811
    engine = oracle[1]
    strict = dataclasses.replace(fitted, fields=tuple(
        dataclasses.replace(f, min_probability=0.999) if f.name == "deadline" else f for f in fitted.fields
    ))  # fmt: skip
    out = engine.extract(TEXTS[0], SCHEMA, calibration=strict)
    assert out.fields["deadline"].abstained and not out.fields["urgent"].abstained
    assert any("deadline" in w and "0.999" in w for w in out.warnings)
    assert not engine.extract(TEXTS[0], SCHEMA, calibration=strict, min_probability=0.01).fields["deadline"].abstained
    assert not engine.extract(TEXTS[0], SCHEMA, calibration=fitted).fields["deadline"].abstained


def test_calibrated_calls_answer_prediction_sets_from_the_examples(oracle, fitted):  # noqa: F811
    out = oracle[1].extract(TEXTS[0], SCHEMA, calibration=fitted, prediction_set=0.8)
    field = out.fields["deadline"]
    cutoff = fitted.set_cutoff("deadline", 0.8)
    labels = fitted.field("deadline").labels
    expected = [v for v, p in sorted(zip(labels, field.label_distribution), key=lambda vp: -vp[1]) if p >= cutoff]
    assert list(field.prediction_set) == (expected or [field.value]) and field.prediction_set[0] == field.value
    assert out.fields["carrier"].prediction_set is not None
    assert any("'urgent'" in w and "no prediction set" in w for w in out.warnings)
