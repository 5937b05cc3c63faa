"""Each decider decides exactly as before deciders were objects: today's decisions against
``decisions_before.json``, written by :mod:`tests.deciders.snapshots` on the code of commit 245d8f8 (where head,
calibration and correction were chosen between at eleven places), on the oracle LM and on the embedded model.

Values, methods and corrections must be equal; probabilities, leans and distributions equal to 1e-12 on the oracle
LM (the same float operations in the same order) and to 1e-4 on the embedded model (the same passes; their last
digits move with the BLAS a worker process happens to have loaded, and a wrong lean or decider moves them by 1e-2).
``PCD_WRITE_DECISIONS=1`` writes the file instead of comparing (how it was made, on the old code).
"""

from __future__ import annotations

import json
import os

import pytest

from tests.deciders.snapshots import (
    SNAPSHOT,
    embedded_decisions,
    embedded_texts,
    oracle_decisions,
    oracle_engine,
)

WRITE = bool(os.environ.get("PCD_WRITE_DECISIONS"))
BEFORE = {} if WRITE else json.loads(SNAPSHOT.read_text(encoding="utf-8"))


def compare(part: str, got: dict, *, tol: float) -> None:
    """Compare ``got`` with the snapshot's ``part``, or write it there under ``PCD_WRITE_DECISIONS``."""
    if WRITE:
        data = json.loads(SNAPSHOT.read_text(encoding="utf-8")) if SNAPSHOT.exists() else {}
        data[part] = got
        SNAPSHOT.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n", encoding="utf-8")
        pytest.skip(f"wrote {part} into {SNAPSHOT.name}")
    assert_same(got, BEFORE[part], tol=tol)


def assert_same(got: dict, want: dict, *, tol: float) -> None:
    assert sorted(got) == sorted(want)
    for run in want:
        assert len(got[run]) == len(want[run]), run
        for i, (g_doc, w_doc) in enumerate(zip(got[run], want[run], strict=True)):
            assert sorted(g_doc) == sorted(w_doc), (run, i)
            for name, w in w_doc.items():
                g = json.loads(json.dumps(g_doc[name]))  # as the snapshot holds it (tuples as lists, keys as text)
                where = f"{run}, text {i}, field {name!r}"
                for key in ("value", "method", "correction", "abstained"):
                    assert g[key] == w[key], f"{where}: {key}"
                for key in ("probability", "raw_probability", "lean", "label_distribution", "raw_distribution"):
                    assert (g[key] is None) == (w[key] is None), f"{where}: {key}"
                    if w[key] is not None:
                        assert g[key] == pytest.approx(w[key], abs=tol), f"{where}: {key}"
                if w["label_probabilities"] is not None:
                    assert [v for v, _ in g["label_probabilities"]] == [v for v, _ in w["label_probabilities"]]
                    got_p = [p for _, p in g["label_probabilities"]]
                    assert got_p == pytest.approx([p for _, p in w["label_probabilities"]], abs=tol), where


def test_every_correction_and_calibration_decides_as_before_on_the_oracle_lm(smol_tokenizer):
    compare("oracle", oracle_decisions(oracle_engine(smol_tokenizer)), tol=1e-12)


@pytest.mark.real_model
def test_every_decider_decides_as_before_on_the_embedded_model(default_engine):
    compare("embedded", embedded_decisions(default_engine, embedded_texts()), tol=1e-4)


@pytest.mark.skipif(WRITE, reason="writing the snapshot")
def test_the_comparison_can_fail():
    oracle = BEFORE["oracle"]
    changed = json.loads(json.dumps(oracle))
    changed["auto"][0]["deadline"]["probability"] += 1e-9
    with pytest.raises(AssertionError, match="auto, text 0, field 'deadline': probability"):
        assert_same(changed, oracle, tol=1e-12)
    changed = json.loads(json.dumps(oracle))
    changed["batch"][3]["tags"]["correction"] = None
    with pytest.raises(AssertionError, match="batch, text 3, field 'tags': correction"):
        assert_same(changed, oracle, tol=1e-12)
