"""Lean corrections without a fitted calibration (pcd_engine.deciders.corrections), on an oracle LM: each equals the
calibrated extraction it stands for (the batch's EM prior, wave by wave; the content-free mean prior), the batch
correction does not depend on the documents' order, and what cannot be corrected says so."""

from __future__ import annotations

import random

import pytest

import pcd_engine.engine as engine_module
from pcd_engine import Engine, compile_schema
from pcd_engine.calibrate.calibrator import Calibrator
from pcd_engine.deciders.corrections import CONTENT_FREE_TEXTS, MIN_BATCH, field_rows
from pcd_engine.errors import ContextError, OptionError
from tests.calibrate.test_calibration import SCHEMA  # closed fields of every kind, one-label, and an open one
from tests.support import OracleBackend, OracleLM

CLOSED = ("urgent", "deadline", "carrier", "tags")
WORDS = "parcel late broken refund invoice courier damaged tonight charge twice angry box label week".split()


def texts(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [f"Ticket {i}: " + " ".join(rng.choice(WORDS) for _ in range(6)) + "." for i in range(n)]


def engine(smol_tokenizer, *, anchor: bool, correction: str = "none") -> Engine:
    # The last 40 tokens (the tail and the end of the document) seed each distribution: every document differs.
    # The engine's default is "none" here, so that the raw references are the model's own; each test names the
    # correction it checks (test_the_engine_default_is_auto checks the real default).
    lm = OracleLM(len(smol_tokenizer), window=40)
    return Engine(OracleBackend(smol_tokenizer, lm), anchor=anchor, correction=correction)


def rows_of(results, names) -> dict[str, list[list[float]]]:
    """Each field's row per document, as a calibrator is fitted from them."""
    out: dict[str, list[list[float]]] = {}
    for name in names:
        for r in results:
            f = r.fields[name]
            row = list(f.label_probabilities.values()) if f.label_probabilities else list(f.label_distribution)
            out.setdefault(name, []).append(row)
    return out


def assert_same_decisions(got, want, *, correction):
    assert got.values == want.values
    for name in CLOSED:
        a, b = got.fields[name], want.fields[name]
        assert a.probability == pytest.approx(b.probability, abs=1e-12), name
        assert a.raw_probability == pytest.approx(b.raw_probability, abs=1e-12), name
        assert a.lean == pytest.approx(b.lean, abs=1e-12), name
        assert a.correction == correction and b.correction == "calibration", name
    assert got.fields["queue"].correction is None  # one label: nothing to correct


def test_batch_correction_equals_calibrating_with_the_batch_em_prior(smol_tokenizer):
    """One wave (no anchor): every closed field's lean is the EM prior of the batch's own whole distributions,
    and each document is decided as a calibrated call with that prior; the open field sees the corrected
    answers."""
    eng = engine(smol_tokenizer, anchor=False)
    docs = texts(20)
    got = eng.extract_many(docs, SCHEMA, correction="batch")
    raw = eng.extract_many(docs, SCHEMA, strategy="exact", staging="one_pass")
    schema = compile_schema(SCHEMA)
    cal = Calibrator.from_distributions(schema, rows_of(raw, CLOSED), model=eng.model_id, method="em")
    for text, result in zip(docs, got, strict=True):
        assert_same_decisions(result, eng.extract(text, SCHEMA, calibration=cal), correction="batch")
    assert any(r.values != o.values for r, o in zip(got, raw, strict=True))  # the correction changed answers
    data = got[0].to_json()["fields"]
    assert data["deadline"]["correction"] == "batch" and len(data["deadline"]["lean"]) == 4
    assert "correction" not in raw[0].to_json()["fields"]["deadline"]


def test_batch_correction_is_wave_by_wave(smol_tokenizer):
    """With an anchor, the second wave reads the first wave's corrected answer: its lean is estimated on the
    distributions read after the corrected anchor, as a calibration of the anchor alone would read them."""
    eng = engine(smol_tokenizer, anchor=True)
    docs = texts(18, seed=1)
    schema = compile_schema(SCHEMA)
    got = eng.extract_many(docs, SCHEMA, correction="batch")
    assert got[0].stats.waves == 2
    first = eng.extract_many(docs, SCHEMA, strategy="exact", staging="one_pass")
    anchor_only = Calibrator.from_distributions(schema, rows_of(first, ["urgent"]), model=eng.model_id, method="em")
    second = eng.extract_many(docs, SCHEMA, calibration=anchor_only)
    rows = {**rows_of(first, ["urgent"]), **rows_of(second, CLOSED[1:])}
    cal = Calibrator.from_distributions(schema, rows, model=eng.model_id, method="em")
    for text, result in zip(docs, got, strict=True):
        assert_same_decisions(result, eng.extract(text, SCHEMA, calibration=cal), correction="batch")


def test_batch_correction_does_not_depend_on_the_order_of_the_documents(smol_tokenizer):
    eng = engine(smol_tokenizer, anchor=True)
    docs = texts(17, seed=2)
    got = eng.extract_many(docs, SCHEMA, correction="batch")
    order = list(range(len(docs)))
    random.Random(5).shuffle(order)
    shuffled = eng.extract_many([docs[i] for i in order], SCHEMA, correction="batch", batch_size=3)
    for position, i in enumerate(order):
        assert shuffled[position].values == got[i].values
        for name in CLOSED:
            assert shuffled[position].fields[name].probability == pytest.approx(got[i].fields[name].probability)


def test_a_batch_too_small_to_estimate_a_lean_is_decided_raw_and_says_so(smol_tokenizer):
    eng = engine(smol_tokenizer, anchor=True)
    docs = texts(MIN_BATCH - 1, seed=3)
    got = eng.extract_many(docs, SCHEMA, correction="batch")
    raw = eng.extract_many(docs, SCHEMA, strategy="exact", staging="one_pass")
    alone = eng.extract(docs[0], SCHEMA, correction="batch")
    for r, o in zip([*got, alone], [*raw, raw[0]], strict=True):
        assert r.values == o.values
        assert all(f.correction is None and f.raw_probability is None for f in r.fields.values())
    note = f"but this batch had {MIN_BATCH - 1}; the answers are the model's own"
    assert sum(note in w for w in got[0].warnings) == 1
    assert any("but this batch had 1;" in w for w in alone.warnings)


def test_a_long_call_is_cut_into_even_windows_each_its_own_batch(smol_tokenizer, monkeypatch):
    """34 documents under a window of 24 are two batches of 17 (not 24 and 10, which would be too small)."""
    monkeypatch.setattr(engine_module, "CORRECTION_WINDOW", 24)
    eng = engine(smol_tokenizer, anchor=False)
    docs = texts(34, seed=4)
    got = eng.extract_many(docs, SCHEMA, correction="batch")
    assert all(r.fields["deadline"].correction == "batch" for r in got)
    leans = {r.fields["deadline"].lean for r in got}
    assert len(leans) == 2
    raw = eng.extract_many(docs, SCHEMA, strategy="exact", staging="one_pass")
    schema = compile_schema(SCHEMA)
    for part in (slice(0, 17), slice(17, 34)):
        cal = Calibrator.from_distributions(schema, rows_of(raw[part], CLOSED), model=eng.model_id, method="em")
        assert got[part][0].fields["deadline"].lean == pytest.approx(cal.field("deadline").bias, abs=1e-12)


def test_content_free_correction_equals_calibrating_on_the_content_free_inputs_once(smol_tokenizer):
    eng = engine(smol_tokenizer, anchor=True)
    text = texts(1, seed=6)[0]
    got = eng.extract(text, SCHEMA, correction="content_free")
    cal = Calibrator.fit(eng, CONTENT_FREE_TEXTS, SCHEMA, method="mean")
    assert_same_decisions(got, eng.extract(text, SCHEMA, calibration=cal), correction="content_free")
    before = eng.backend.forward_passes
    again = eng.extract(text, SCHEMA, correction="content_free")
    alone = eng.backend.forward_passes - before
    before = eng.backend.forward_passes
    eng.extract(text, SCHEMA, calibration=cal)
    assert alone == eng.backend.forward_passes - before  # the lean was read once, and kept
    assert again.values == got.values
    many = eng.extract_many(texts(3, seed=7), SCHEMA, correction="content_free")
    assert all(r.fields["urgent"].lean == got.fields["urgent"].lean for r in many)


def test_auto_divides_out_the_content_free_lean_alone_and_in_any_batch(smol_tokenizer):
    """``"auto"`` corrects the single-choice fields with the content-free lean, read as the plain call reads them
    (marginal), and nothing of the batch: a document's answer alone equals its answer inside a batch of 64, to the
    last digit. Multi-label flags are decided as read."""
    eng = engine(smol_tokenizer, anchor=True)
    docs = texts(64, seed=10)
    single = [n for n in CLOSED if n != "tags"]
    batch = eng.extract_many(docs, SCHEMA, correction="auto")
    plain = eng.extract_many(docs, SCHEMA, correction="none")
    marginal = Calibrator.fit(eng, CONTENT_FREE_TEXTS, SCHEMA, method="mean", options={"strategy": "marginal"})
    for i in (0, 17, 63):
        alone = eng.extract(docs[i], SCHEMA, correction="auto")
        assert alone.values == batch[i].values
        want = eng.extract(docs[i], SCHEMA, calibration=marginal, strategy="marginal")
        for n in single:
            a, b = alone.fields[n], batch[i].fields[n]
            assert a.probability == b.probability and a.label_distribution == b.label_distribution, n
            assert b.method == "marginal" and b.correction == "content_free", n
            assert b.value == want.fields[n].value, n
            assert b.probability == pytest.approx(want.fields[n].probability, abs=1e-12), n
            assert b.lean == pytest.approx(marginal.field(n).bias, abs=1e-12), n
        assert batch[i].fields["tags"].correction is None and batch[i].values["tags"] == plain[i].values["tags"]
        assert not any("Correction" in w for w in batch[i].warnings)
    assert any(b.values != p.values for b, p in zip(batch, plain, strict=True))  # the lean moved some answers
    assert batch[0].stats.correction_passes >= 1 and all(r.stats.correction_passes == 0 for r in batch[1:])


def test_auto_answers_do_not_depend_on_the_other_documents_of_a_batch(smol_tokenizer):
    """The same document keeps its answer in a batch whose other documents are all alike (a skewed batch) and in
    one of varied documents: the content-free lean is read apart from the batch."""
    eng = engine(smol_tokenizer, anchor=False)
    docs = texts(20, seed=15)
    same = [docs[0], *([docs[1]] * 19)]
    varied = eng.extract_many(docs, SCHEMA, correction="auto")
    skewed = eng.extract_many(same, SCHEMA, correction="auto")
    assert skewed[0].values == varied[0].values
    assert skewed[0].fields["deadline"].probability == varied[0].fields["deadline"].probability


def test_auto_leaves_a_large_label_set_to_its_cost_planned_reading(smol_tokenizer):
    """Above ``marginal_max_labels`` the default reading is the trie walk, staged where it pays: ``"auto"``
    decides that field as read (what ``"none"`` decides, nothing read whole), while it corrects the small ones;
    a correction named outright reads the large field whole and corrects it too. Under ``"auto"`` an exact
    reading is left as read as well (staged or not, the same decision), and a call with no marginal field reads
    no content-free lean."""
    labels = [f"item_{i:02d}" for i in range(40)]
    schema = {**SCHEMA, "item": {"type": "enum", "choices": labels}}
    eng = engine(smol_tokenizer, anchor=False)
    text = texts(1, seed=11)[0]
    auto = eng.extract(text, schema, correction="auto")
    raw = eng.extract(text, schema, correction="none")
    item = auto.fields["item"]
    assert item.method == "trie_walk" and item.correction is None and item.raw_probability is None
    assert item.value == raw.fields["item"].value and item.probability == raw.fields["item"].probability
    assert auto.stats.nodes_scored == raw.stats.nodes_scored  # the same reading
    assert all(auto.fields[n].correction == "content_free" for n in ("deadline", "carrier"))
    named = eng.extract(text, schema, correction="content_free")
    assert named.fields["item"].method == "exact" and named.fields["item"].correction == "content_free"
    for staging in ("one_pass", "staged"):
        exact = eng.extract(text, schema, correction="auto", strategy="exact", staging=staging)
        assert exact.stats.correction_passes == 0  # no field auto corrects: nothing to read
        assert all(f.correction is None for f in exact.fields.values())
        assert exact.values == eng.extract(text, schema, correction="none", strategy="exact").values
    docs = texts(MIN_BATCH, seed=13)
    batch = eng.extract_many(docs, schema, correction="auto")
    raw = eng.extract_many(docs, schema, correction="none")
    for b, r in zip(batch, raw, strict=True):
        assert b.fields["item"].method == "trie_walk" and b.fields["item"].correction is None
        assert b.fields["item"].value == r.fields["item"].value
        assert b.fields["deadline"].method == "marginal" and b.fields["deadline"].correction == "content_free"


def test_batch_in_a_batch_that_lost_documents_is_decided_raw_and_says_so(smol_tokenizer):
    """Sixteen documents open as a batch; one fails, so fifteen are left to estimate the lean on: they are decided
    as read, with a warning, not with a lean from too few documents."""
    eng = engine(smol_tokenizer, anchor=False)
    docs = [*texts(MIN_BATCH - 1, seed=14), "   "]
    got = eng.extract_many(docs, SCHEMA, correction="batch", return_exceptions=True)
    assert isinstance(got[-1], ContextError)
    raw = eng.extract_many(docs[:-1], SCHEMA, correction="none", strategy="exact", staging="one_pass")
    for r, o in zip(got[:-1], raw, strict=True):
        assert r.values == o.values  # read whole, as read
        assert all(f.correction is None for f in r.fields.values())
        assert any(f"Correction 'batch': expected at least {MIN_BATCH}" in w for w in r.warnings)


def test_the_engine_default_is_auto(smol_tokenizer):
    eng = Engine(OracleBackend(smol_tokenizer, OracleLM(len(smol_tokenizer), window=40)), anchor=True)
    assert eng.options.correction == "auto" and eng.resolve().correction == "auto"
    text = texts(1, seed=12)[0]
    default = eng.extract(text, SCHEMA)
    data = default.to_json()
    assert data["stats"]["correction_passes"] == default.stats.correction_passes >= 1  # the lean, read once
    assert data["fields"]["deadline"]["correction"] == "content_free" and len(data["fields"]["deadline"]["lean"]) == 4
    assert default.values == eng.extract(text, SCHEMA, correction="auto").values
    assert default.fields["deadline"].correction == "content_free"
    assert default.fields["deadline"].raw_probability is not None
    off = eng.extract(text, SCHEMA, correction="none")
    assert all(f.correction is None and f.raw_probability is None for f in off.fields.values())


def test_full_distribution_only_for_labels_read_whole():
    from pcd_engine.decide.decoding import Decision
    from pcd_engine.deciders.base import full_distribution

    def made(method: str, bounded: int = 0) -> Decision:
        return Decision(label=0, probabilities=(0.6, 0.4), candidate_mass=0.9, method=method, bounded=bounded)

    assert full_distribution([made("marginal")]) and full_distribution([made("exact"), made("exact")])
    assert not full_distribution([made("exact", bounded=3)])  # a staged reading's bounds
    assert not full_distribution([made("trie_walk")]) and not full_distribution([made("fixed")])
    assert not full_distribution([])


def test_a_fitted_calibration_wins_over_any_correction(smol_tokenizer):
    eng = engine(smol_tokenizer, anchor=False)
    docs = texts(MIN_BATCH, seed=8)
    schema = compile_schema(SCHEMA)
    raw = eng.extract_many(docs, SCHEMA, strategy="exact", staging="one_pass")
    cal = Calibrator.from_distributions(schema, rows_of(raw[:3], CLOSED), model=eng.model_id, method="mean")
    for correction in ("batch", "content_free", "auto", "none"):
        got = eng.extract_many(docs, SCHEMA, calibration=cal, correction=correction)
        for r, text in zip(got, docs, strict=True):
            assert_same_decisions(r, eng.extract(text, SCHEMA, calibration=cal), correction="calibration")


def test_correction_none_is_the_model_s_own_decision(smol_tokenizer):
    eng = engine(smol_tokenizer, anchor=True)
    docs = texts(MIN_BATCH, seed=9)
    plain = eng.extract_many(docs, SCHEMA)
    off = eng.extract_many(docs, SCHEMA, correction="none")
    assert [r.values for r in off] == [r.values for r in plain]
    assert all(f.correction is None for r in off for f in r.fields.values())


def test_an_unknown_correction_is_refused(smol_tokenizer):
    eng = engine(smol_tokenizer, anchor=True)
    known = r"\['none', 'batch', 'content_free', 'auto'\]"
    with pytest.raises(OptionError, match=rf"correction: expected one of {known}, but got 'bach'"):
        eng.extract("x", SCHEMA, correction="bach")
    with pytest.raises(OptionError, match="correction"):
        Engine(eng.backend, correction="auto-ish")


def test_field_rows_are_the_distribution_or_each_label_s_yes():
    from pcd_engine.decide.decoding import Decision

    schema = compile_schema(SCHEMA)
    one = Decision(label=1, probabilities=(0.2, 0.5, 0.3), candidate_mass=0.9, method="exact")
    assert field_rows(schema.field("carrier"), [one]) == [0.2, 0.5, 0.3]
    yes = [Decision(label=0, probabilities=(p, 1 - p), candidate_mass=0.8, method="exact") for p in (0.1, 0.7, 0.4)]
    assert field_rows(schema.field("tags"), yes) == [0.1, 0.7, 0.4]


@pytest.mark.parametrize("correction", ["auto", "batch"])
def test_concurrent_callers_get_exactly_their_serial_answers(smol_tokenizer, correction):
    """32 callers at once through the collector (what ``pcd serve`` decides concurrent requests with): they share
    batches for speed, but a batch correction pools only one caller's documents, so each answer equals the one the
    same request gets alone, to the last digit."""
    from concurrent.futures import ThreadPoolExecutor

    from pcd_engine.run.collector import Collector

    eng = engine(smol_tokenizer, anchor=True)
    docs = texts(32, seed=16)
    serial = [eng.extract(t, SCHEMA, correction=correction) for t in docs]
    collector = Collector(eng, window_ms=200, max_documents=64)
    try:
        with ThreadPoolExecutor(len(docs)) as pool:
            futures = list(pool.map(lambda t: collector.submit(t, SCHEMA, correction=correction), docs))
        together = [f.result() for f in futures]
    finally:
        collector.close()
    assert max(collector.batches) >= MIN_BATCH  # decided together: a pooled lean would have moved answers
    for got, want in zip(together, serial, strict=True):
        assert got.values == want.values
        for name in CLOSED:
            assert got.fields[name].probability == want.fields[name].probability, name
            assert got.fields[name].correction == want.fields[name].correction, name


def test_no_module_but_the_corrections_own_compares_a_correction_name():
    """Corrections are objects with one owner (pcd_engine.deciders.corrections): no other module of the engine or
    the integrations compares anything about a correction with a correction's name."""
    import ast
    from pathlib import Path

    from pcd_engine.deciders.corrections import CORRECTIONS

    root = Path(__file__).resolve().parents[2]
    owner = root / "pcd_engine" / "deciders"
    names = set(CORRECTIONS)

    def named(node: ast.AST) -> bool:
        if isinstance(node, ast.Constant):
            return node.value in names
        return isinstance(node, (ast.Tuple, ast.List, ast.Set)) and any(named(e) for e in node.elts)

    found = []
    for path in [*(root / "pcd_engine").rglob("*.py"), *(root / "pcd_integrations").rglob("*.py")]:
        if path.is_relative_to(owner):
            continue
        source = path.read_text(encoding="utf-8")
        for node in ast.walk(ast.parse(source)):
            if not isinstance(node, ast.Compare):
                continue
            sides = [node.left, *node.comparators]
            text = ast.get_source_segment(source, node) or ""
            if any(named(s) for s in sides) and "correction" in text.lower():
                found.append(f"{path.relative_to(root)}:{node.lineno}: {text}")
    assert not found, found
