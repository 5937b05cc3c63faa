"""Calibration (pcd_engine.calibrate.calibrator): the estimators, the corrections in the engine against the re-weighted
brute-force distribution on an oracle LM, saving and loading, and refusing another schema or model."""

from __future__ import annotations

import json

import numpy as np
import pytest

from pcd_engine import Engine, compile_schema
from pcd_engine.calibrate.calibrator import Calibrator, FieldPrior, em_bias, mean_prior, reweight
from pcd_engine.decide.compiler import questions
from pcd_engine.errors import InputError, OptionError
from pcd_engine.prompt.chat_prompt import ChatPrompt, TokenizerView
from tests.support import OracleBackend, OracleLM, enumerate_paths
from tests.support import oracle_brute_force as brute_force

TEXT = "Order 1182 arrived broken; the customer is furious and wants their money back today."
SCHEMA = {
    "urgent": {"type": "boolean"},
    "deadline": {"type": "enum", "choices": ["1_HOUR", "12_HOURS", "1_WEEK", "NONE"]},
    "carrier": {"type": "enum", "choices": ["dhl", "ups", None]},
    "tags": {"type": "multi", "choices": ["billing", "shipping", "broken"], "min_items": 1},
    "queue": {"type": "enum", "choices": ["billing"]},
    "note": {"type": "string", "max_length": 20, "max_tokens": 4},
}


def synthetic_posteriors(prior, bias, n, *, seed=0, strength=2.0):
    """Documents drawn from ``prior``, each a point ``x ~ N(strength * e_y, I)``; the model's posterior is the
    Bayes posterior under a uniform prior (``softmax(strength * x)``) times ``bias``, renormalized."""
    rng = np.random.default_rng(seed)
    k = len(prior)
    truth = rng.choice(k, size=n, p=prior)
    x = rng.normal(size=(n, k))
    x[np.arange(n), truth] += strength
    logits = strength * x
    posteriors = np.exp(logits - logits.max(axis=1, keepdims=True)) * np.asarray(bias)
    return truth, (posteriors / posteriors.sum(axis=1, keepdims=True)).tolist()


# ------------------------------------------------------------------------------------------------ estimators


def test_em_recovers_a_planted_label_prior():
    """A model whose posteriors are Bayes posteriors times a planted lean (6:1:1) on balanced documents: EM finds
    the lean; the plain mean of the posteriors is pulled towards uniform."""
    planted = (0.75, 0.125, 0.125)
    _, posteriors = synthetic_posteriors((1 / 3, 1 / 3, 1 / 3), (6.0, 1.0, 1.0), 8000, seed=1)
    assert em_bias(posteriors) == pytest.approx(planted, abs=0.02)
    assert mean_prior(posteriors)[0] < 0.5


def test_em_with_the_true_label_shares_recovers_the_lean_on_an_unbalanced_corpus():
    """Documents 60/20/20 and a planted lean towards the second label: EM given the corpus's shares finds the lean;
    assuming balance, it mistakes part of the corpus's own skew for the model's."""
    shares, lean = (0.6, 0.2, 0.2), (1.0, 3.0, 1.0)
    _, posteriors = synthetic_posteriors(shares, lean, 8000, seed=3)
    assert em_bias(posteriors, target=shares) == pytest.approx((0.2, 0.6, 0.2), abs=0.02)
    assert em_bias(posteriors)[0] > 0.3  # balance assumed: the first label's frequency is read as a lean


def test_dividing_out_the_lean_restores_balanced_decisions():
    truth, posteriors = synthetic_posteriors((1 / 3, 1 / 3, 1 / 3), (6.0, 1.0, 1.0), 8000, seed=2)
    raw = np.argmax(posteriors, axis=1)
    assert np.mean(raw == 0) > 0.45

    def decide(bias):
        return np.array([np.argmax(reweight(p, [1 / b for b in bias])) for p in posteriors])

    by_em, by_mean = decide(em_bias(posteriors)), decide(mean_prior(posteriors))
    assert np.bincount(by_em, minlength=3) / len(by_em) == pytest.approx([1 / 3] * 3, abs=0.03)
    assert np.mean(by_em == truth) > np.mean(by_mean == truth) > np.mean(raw == truth)


def test_a_field_prior_corrects_single_and_multi_label_fields():
    single = FieldPrior("f", ("a", "b"), bias=(0.8, 0.2), prior=(0.5, 0.5))
    assert single.correct((0.7, 0.3)) == pytest.approx(
        (0.7 / 0.8 / (0.7 / 0.8 + 0.3 / 0.2), 0.3 / 0.2 / (0.7 / 0.8 + 0.3 / 0.2))
    )
    flag = FieldPrior("m", ("x",), bias=(0.9,), prior=(0.5,))
    # odds of yes divided by the bias's odds: 0.9 raw is exactly "no lean" under a 0.9 bias
    assert flag.correct_yes(0, 0.9) == pytest.approx(0.5)
    assert flag.correct_yes(0, 0.5) == pytest.approx((0.5 / 0.9) / (0.5 / 0.9 + 0.5 / 0.1))


# ------------------------------------------------------------------------------------------------ the engine


@pytest.fixture
def oracle(smol_tokenizer):
    lm = OracleLM(len(smol_tokenizer))
    # "none": the uncalibrated references are the model's own (a calibration wins over any correction anyway)
    return lm, Engine(OracleBackend(smol_tokenizer, lm), anchor=False, correction="none")


def planted(schema, engine) -> Calibrator:
    """A calibrator with a strong, known lean on every closed field (as if fitted)."""
    rows = {
        "urgent": [[0.9, 0.1]],
        "deadline": [[0.55, 0.05, 0.1, 0.3]],
        "carrier": [[0.2, 0.2, 0.6]],
        "tags": [[0.9, 0.2, 0.5]],
    }
    return Calibrator.from_distributions(schema, rows, model=engine.model_id, method="mean")


def test_calibrated_decisions_equal_the_reweighted_brute_force(oracle, smol_tokenizer):
    lm, engine = oracle
    schema = compile_schema(SCHEMA)
    cal = planted(schema, engine)
    out = engine.extract(TEXT, SCHEMA, calibration=cal)
    raw = engine.extract(TEXT, SCHEMA, strategy="exact")
    prompt = ChatPrompt.build(TokenizerView(smol_tokenizer), schema)
    context = prompt.prefix_text + TEXT + prompt.suffix_text
    for name in ("urgent", "deadline", "carrier"):
        spec = schema.field(name)
        _, probs, _ = brute_force(lm, enumerate_paths(smol_tokenizer, context, spec), "exact")
        prior = cal.field(name)
        weights = [pi / b for pi, b in zip(prior.prior, prior.bias, strict=True)]
        corrected = np.array(probs) * weights
        corrected /= corrected.sum()
        winner = int(np.argmax(corrected))
        got = out.fields[name]
        assert got.value == spec.labels[winner].value, name
        assert got.probability == pytest.approx(corrected[winner], abs=1e-9)
        assert got.raw_probability == pytest.approx(probs[winner], abs=1e-9)
        assert got.label_distribution == pytest.approx(tuple(corrected), abs=1e-9)
        assert raw.fields[name].raw_probability is None  # no calibration, no raw figure
    spec, prior = schema.field("tags"), cal.field("tags")
    yes = []
    for question in questions(spec):
        _, probs, _ = brute_force(lm, enumerate_paths(smol_tokenizer, context, question), "exact")
        yes.append(probs[0])
    for i, p in enumerate(yes):
        odds = (p / prior.bias[i]) / ((1 - p) / (1 - prior.bias[i]))
        assert out.fields["tags"].label_probabilities[spec.labels[i].value] == pytest.approx(odds / (1 + odds))
    assert out.fields["queue"].probability == 1.0 and out.fields["note"].source == "generated"  # untouched
    data = out.to_json()["fields"]
    assert data["deadline"]["raw_probability"] == out.fields["deadline"].raw_probability
    assert "raw_probability" not in data["note"] and "raw_probability" not in raw.to_json()["fields"]["deadline"]


def test_a_strong_lean_flips_the_answer_and_the_raw_one_stays_visible(oracle):
    """A lean as strong as the model's own answer, and weaker on the runner-up: the runner-up wins."""
    _, engine = oracle
    schema = compile_schema(SCHEMA)
    raw = engine.extract(TEXT, SCHEMA, strategy="exact").fields["deadline"]
    labels = [label.value for label in schema.field("deadline").labels]
    runner_up = labels.index(raw.runners_up(1)[0].value)
    lean = list(raw.label_distribution)
    lean[runner_up] /= 1000
    cal = Calibrator.from_distributions(schema, {"deadline": [lean]}, model=engine.model_id)
    got = engine.extract(TEXT, SCHEMA, calibration=cal).fields["deadline"]
    assert raw.value != labels[runner_up] == got.value
    assert got.raw_probability == pytest.approx(raw.label_distribution[runner_up], rel=1e-9)


def test_min_probability_abstains_below_the_calibrated_probability(oracle):
    """Below min_probability an Optional field answers None and any other field keeps its label, flagged; the
    threshold reads the calibrated probability, and nothing else in the result changes."""
    _, engine = oracle
    cal = planted(compile_schema(SCHEMA), engine)
    plain = engine.extract(TEXT, SCHEMA, calibration=cal)
    probs = {n: f.probability for n, f in plain.fields.items() if f.source == "scored" and n != "queue"}
    for threshold in sorted({*probs.values(), 1.0}):
        out = engine.extract(TEXT, SCHEMA, calibration=cal, min_probability=threshold)
        below = {n for n, p in probs.items() if p < threshold}
        assert {n for n, f in out.fields.items() if f.abstained} == below, threshold
        for name, f in out.fields.items():
            expected = None if name == "carrier" and name in below else plain.values[name]
            assert name == "note" or f.value == expected, (threshold, name)
            assert f.alternatives == plain.fields[name].alternatives, name  # what the model preferred stays
            said = any(w.startswith(f"Field {name!r}: probability") for w in out.warnings)
            assert said == (name in below), name
        flagged = {f.name for f in out.low_confidence(min_probability=0.0, min_candidate_mass=0.0)}
        assert flagged - {"note"} == below  # note: cut at its 4 tokens
    assert below == set(probs)  # at 1.0 every uncertain field abstains: the Optional one answers None
    assert out.values["carrier"] is None and out.values["deadline"] == plain.values["deadline"]  # not nullable
    assert not out.fields["queue"].abstained  # one label: probability 1
    assert out.to_json()["fields"]["carrier"]["abstained"] is True
    assert "abstained" not in plain.to_json()["fields"]["carrier"]
    for bad in (0, 1.5, True, "0.5", float("nan")):
        with pytest.raises(OptionError, match=r"min_probability: expected a number in \(0, 1\]"):
            engine.extract(TEXT, SCHEMA, min_probability=bad)


def test_fit_on_unlabelled_documents(oracle):
    """fit reads every closed field whole on each document; "mean" keeps the mean distributions, "em" the prior
    that makes the corrected ones average to uniform."""
    _, engine = oracle
    texts = [f"Ticket {i}: the parcel is late and the customer is upset." for i in range(6)]
    said = []
    by_mean = Calibrator.fit(engine, texts, SCHEMA, method="mean", progress=said.append)
    assert said == ["documents 1-6/6"]
    by_em = Calibrator.fit(engine, texts, SCHEMA, method="em")
    assert by_mean.documents == 6 and by_mean.model == engine.model_id and by_em.method == "em"
    assert [f.name for f in by_mean.fields] == ["urgent", "deadline", "carrier", "tags"]
    results = [engine.extract(t, SCHEMA, strategy="exact", staging="one_pass") for t in texts]
    rows = [r.fields["deadline"].label_distribution for r in results]
    assert by_mean.field("deadline").bias == pytest.approx(tuple(np.mean(rows, axis=0)), abs=1e-9)
    corrected = np.mean([by_em.field("deadline").correct(row) for row in rows], axis=0)
    assert corrected == pytest.approx([0.25] * 4, abs=1e-3)
    tags = np.mean([list(r.fields["tags"].label_probabilities.values()) for r in results], axis=0)
    assert by_mean.field("tags").bias == pytest.approx(tuple(tags), abs=1e-9)


def test_labelled_examples_set_the_priors_the_fit_aims_at(oracle):
    _, engine = oracle
    texts = [f"Ticket {i}: the parcel is late and the customer is upset." for i in range(4)]
    examples = [
        ("Refund now, it broke!", {"deadline": "1_HOUR", "tags": ["broken", "billing"]}),
        ("Whenever you can.", {"deadline": "1_WEEK", "carrier": None, "tags": []}),
        ("Today please.", {"deadline": "1_HOUR"}),
    ]
    cal = Calibrator.fit(engine, texts, SCHEMA, method="em", examples=examples)
    assert (cal.documents, cal.examples) == (7, 3)
    assert cal.field("deadline").prior == pytest.approx((3 / 7, 1 / 7, 2 / 7, 1 / 7))  # 1_HOUR twice, 1_WEEK once
    assert cal.field("carrier").prior == pytest.approx((1 / 4, 1 / 4, 2 / 4))
    assert cal.field("tags").prior == pytest.approx((2 / 4, 1 / 4, 2 / 4))  # yes-shares over the 2 labelled
    assert cal.field("urgent").prior == (0.5, 0.5)  # no example labels it: uniform
    every = texts + [t for t, _ in examples]
    results = engine.extract_many(every, SCHEMA, strategy="exact", staging="one_pass")
    rows = [r.fields["deadline"].label_distribution for r in results]
    corrected = np.mean([cal.field("deadline").correct(row) for row in rows], axis=0)
    assert corrected == pytest.approx(cal.field("deadline").prior, abs=1e-3)  # the corrected mean hits the prior
    assert Calibrator.from_json(cal.to_json()) == cal
    for bad, match in (
        ([("x", {"queue": "billing"})], "expected one of the calibrated fields"),
        ([("x", {"deadline": "2_HOURS"})], r"field 'deadline': expected values from"),
        ([("x", {"tags": "billing"})], r"field 'tags': expected a list of values"),
        (["x"], r"Calibration example 0: expected \(text, \{field: value\}\)"),
    ):
        with pytest.raises(OptionError, match=match):
            Calibrator.fit(engine, texts, SCHEMA, examples=bad)


# ------------------------------------------------------------------------------------------------ files and refusals


def test_saving_and_loading_round_trips(oracle, tmp_path):
    _, engine = oracle
    cal = planted(compile_schema(SCHEMA), engine)
    path = cal.save(tmp_path / "cal.json")
    data = json.loads(path.read_text())
    assert data["format"] == "pcd-calibration/1" and data["schema"]["fingerprint"] == compile_schema(SCHEMA).fingerprint
    assert Calibrator.load(path) == cal
    again = engine.extract(TEXT, SCHEMA, calibration=data)  # its JSON works as the option too (the /api surface)
    assert again.values == engine.extract(TEXT, SCHEMA, calibration=cal).values


def test_another_schema_or_model_is_refused_before_any_model_work(oracle, tmp_path):
    _, engine = oracle
    cal = planted(compile_schema(SCHEMA), engine)
    reordered = {**SCHEMA, "deadline": {"type": "enum", "choices": ["NONE", "1_WEEK", "12_HOURS", "1_HOUR"]}}
    before = engine.backend.forward_passes
    with pytest.raises(OptionError, match=r"Calibration: expected the schema it was fitted on"):
        engine.extract(TEXT, reordered, calibration=cal)  # the same labels in another order: another prompt
    other = Calibrator.from_json({**cal.to_json(), "model": "another/model"})
    with pytest.raises(OptionError, match=r"expected the model it was fitted with \('another/model'\)"):
        engine.extract(TEXT, SCHEMA, calibration=other)
    assert engine.backend.forward_passes == before
    with pytest.raises(OptionError, match="calibration: expected a Calibrator"):
        engine.extract(TEXT, SCHEMA, calibration="cal.json")
    (tmp_path / "bad.json").write_text('{"format": "something else"}')
    with pytest.raises(InputError, match="expected a pcd calibration"):
        Calibrator.load(tmp_path / "bad.json")
    with pytest.raises(InputError, match="does not exist"):
        Calibrator.load(tmp_path / "missing.json")
    with pytest.raises(OptionError, match="Calibration method"):
        Calibrator.from_distributions(compile_schema(SCHEMA), {}, model="m", method="platt")
    with pytest.raises(OptionError, match="expected a closed field with several labels"):
        Calibrator.from_distributions(compile_schema(SCHEMA), {"note": [[1.0]]}, model="m")


# ------------------------------------------------------------------------------------------------ command line


def test_pcd_calibrate_writes_a_calibration_that_extract_accepts(tiny_folder, tmp_path, capsys):
    tiny = tiny_folder
    from pcd_engine.tools.cli import main

    source = tmp_path / "docs.jsonl"
    source.write_text("".join(json.dumps({"text": f"Parcel {i} is late, refund me."}) + "\n" for i in range(5)))
    (tmp_path / "s.json").write_text(json.dumps(SCHEMA))
    out = tmp_path / "cal.json"
    argv = ["calibrate", tiny, "--backend", "torch", "--schema", str(tmp_path / "s.json"), "--input", str(source)]
    assert main([*argv, "-o", str(out), "-q", "--method", "mean"]) == 0
    cal = Calibrator.load(out)
    assert cal.documents == 5 and cal.method == "mean" and cal.model == tiny
    engine = Engine.load(tiny, backend="torch")
    result = engine.extract("Where is my parcel?", SCHEMA, calibration=cal)
    assert result.fields["deadline"].raw_probability is not None
    capsys.readouterr()
    no_schema = ["calibrate", tiny, "--backend", "torch", "--input", str(source), "-o", str(out)]
    assert main(no_schema) == 1
    assert capsys.readouterr().err.strip() == (
        "pcd calibrate: error: Schema: expected exactly one of --schema S.json and --preset PRESET, but got neither."
    )


def test_pcd_eval_calibrate_reports_transductive_and_inductive(tiny_folder, tmp_path, capsys):
    tiny = tiny_folder
    from pcd_engine.tools.cli import main

    docs = [{"text": f"Shares fell {i}% at the bank.", "label": "business"} for i in range(4)]
    docs += [{"text": f"The striker scored {i} goals.", "label": "sport"} for i in range(4)]
    source = tmp_path / "d.jsonl"
    source.write_text("".join(json.dumps(d) + "\n" for d in docs))
    report = tmp_path / "r.json"
    argv = ["eval", tiny, str(source), "--field", "topic", "--limit", "4", "--backend", "torch", "-q", "--calibrate"]
    assert main([*argv, "--json", str(report)]) == 0
    out = capsys.readouterr().out
    assert "transductive fitted on the 4 evaluated texts" in out and "inductive on 4 other documents" in out
    data = json.loads(report.read_text())["report"]
    methods = [m["method"] for m in data["methods"]]
    own = "pcd, the model's own (same pass)"  # pcd's default corrects the field: the model's reading beside it
    assert methods == ["pcd", own, "pcd calibrated (transductive)", "pcd calibrated (inductive)"]
    assert "accuracy-coverage" in out and "pcd calibrated (inductive): coverage / accuracy" in out
    for m in data["methods"]:
        assert len(m["probabilities"]) == 4 and m["accuracy_coverage"][0]["coverage"] == 1.0
    assert main([*argv, "--calibration", "cal.json"]) == 1
    assert capsys.readouterr().err.strip() == (
        "pcd eval: error: expected either --calibrate or --calibration CAL.json, but got both."
    )


def test_pcd_run_takes_a_calibration_file_and_min_probability(tiny_folder, tmp_path, capsys):
    from pcd_engine.tools.cli import main

    engine = Engine.load(tiny_folder, backend="torch")
    schema = compile_schema(SCHEMA)
    cal = Calibrator.from_distributions(
        schema, {"deadline": [[0.7, 0.1, 0.1, 0.1]], "carrier": [[0.1, 0.1, 0.8]]}, model=engine.model_id
    )
    path = cal.save(tmp_path / "cal.json")
    (tmp_path / "s.json").write_text(json.dumps(SCHEMA))
    argv = ["run", tiny_folder, "--backend", "torch", "-q", "--schema", str(tmp_path / "s.json"), "--text", TEXT]
    argv += ["--max-tokens", "4", "--json"]
    assert main([*argv, "--calibration", str(path), "--min-probability", "1"]) == 0
    got = json.loads(capsys.readouterr().out)
    expected = engine.extract(TEXT, SCHEMA, calibration=cal, min_probability=1.0, max_tokens=4)
    assert got["values"] == expected.values and got["values"]["carrier"] is None
    assert got["fields"]["deadline"]["raw_probability"] == pytest.approx(expected.fields["deadline"].raw_probability)
    assert got["fields"]["carrier"]["abstained"] is True
    assert main([a for a in argv if a != "--json"] + ["--calibration", str(path), "--min-probability", "1"]) == 0
    table = capsys.readouterr().out
    carrier = next(line for line in table.splitlines() if line.startswith("| carrier"))
    raw = expected.fields["carrier"].raw_probability
    assert "| null " in carrier and f"(raw {raw:.2f}), abstained" in carrier
    assert main([*argv, "--calibration", str(tmp_path / "missing.json")]) == 1
    assert "does not exist" in capsys.readouterr().err
    assert main([*argv, "--min-probability", "2"]) == 1
    assert capsys.readouterr().err.strip() == (
        "pcd run: error: min_probability: expected a number in (0, 1], but got 2.0."
    )


def test_pcd_tag_calibrate_fits_once_tags_calibrated_and_resumes_with_the_same_calibration(
    tiny_folder, tmp_path, capsys
):
    import pyarrow.parquet as pq

    from pcd_engine.tagging.table import row_values
    from pcd_engine.tools.cli import main

    texts = [f"Parcel {i} is {'late' if i % 2 else 'broken'}, refund me." for i in range(6)]
    source = tmp_path / "docs.jsonl"
    source.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    (tmp_path / "s.json").write_text(json.dumps(SCHEMA))
    out = tmp_path / "tags.parquet"
    argv = ["tag", tiny_folder, "-q", "--backend", "torch", "--schema", str(tmp_path / "s.json")]
    argv += ["--input", str(source), "--output", str(out), "--max-tokens", "4"]
    assert main([*argv, "--calibrate", "4", "--calibrate-method", "mean"]) == 0
    saved = tmp_path / "tags.parquet.calibration.json"
    cal = Calibrator.load(saved)
    assert (cal.documents, cal.method, cal.model) == (4, "mean", tiny_folder)
    engine = Engine.load(tiny_folder, backend="torch")
    expected = engine.extract_many(texts, SCHEMA, calibration=cal, max_tokens=4)
    rows = pq.read_table(out).to_pylist()
    compiled = compile_schema(SCHEMA)
    assert [row_values(compiled, r) for r in rows] == [e.values for e in expected]
    assert [r["deadline__probability"] for r in rows] == pytest.approx(
        [e.fields["deadline"].probability for e in expected], abs=1e-6
    )
    capsys.readouterr()
    assert main([*argv, "--calibrate", "4", "--calibrate-method", "mean"]) == 0  # resumed: the saved calibration
    assert "6 documents (0 tagged now" in capsys.readouterr().out
    assert Calibrator.load(saved) == cal
    assert main([*argv, "--calibrate", "4", "--calibration", str(saved)]) == 1
    assert capsys.readouterr().err.strip() == (
        "pcd tag: error: expected either --calibrate N or --calibration CAL.json, but got both."
    )


def test_pcd_calibrate_with_examples_keeps_their_evidence_and_thresholds(tiny_folder, tmp_path, capsys):
    """``--examples`` (a labelled table, as pcd fit reads it) sets the priors and keeps the held-out evidence;
    ``--accuracy`` keeps each field's threshold and prints the table; both refused without examples, before any
    model work."""
    from pcd_engine.tools.cli import main

    source = tmp_path / "docs.jsonl"
    source.write_text("".join(json.dumps({"text": f"Parcel {i} is late, refund me."}) + "\n" for i in range(4)))
    labelled = tmp_path / "labelled.csv"
    rows = [("Refund today!", "1_HOUR"), ("Whenever.", "1_WEEK"), ("Now!", "1_HOUR"), ("Tomorrow.", "12_HOURS")]
    labelled.write_text("text,deadline\n" + "".join(f"{t},{d}\n" for t, d in rows))
    (tmp_path / "s.json").write_text(json.dumps(SCHEMA))
    out = tmp_path / "cal.json"
    schema = str(tmp_path / "s.json")
    argv = ["calibrate", tiny_folder, "--backend", "torch", "--schema", schema, "--input", str(source)]
    assert main([*argv, "-o", str(out), "-q", "--examples", str(labelled), "--accuracy", "0.5"]) == 0
    printed = capsys.readouterr().out
    cal = Calibrator.load(out)
    assert (cal.documents, cal.examples) == (8, 4)
    deadline = cal.field("deadline")
    assert len(deadline.held_out) == 4 and all(f.held_out == () for f in cal.fields if f.name != "deadline")
    assert deadline.min_probability == cal.threshold("deadline", accuracy=0.5).probability
    assert "thresholds of" in printed and "kept with the calibration for 50%: deadline abstains below" in printed
    for flags in (["--accuracy", "0.9"], ["--risk-plot", str(tmp_path / "r.png")]):
        assert main([*argv, "-o", str(out), *flags]) == 1
        assert (
            capsys.readouterr()
            .err.strip()
            .endswith("expected --examples too (thresholds are chosen on labelled examples).")
        )
