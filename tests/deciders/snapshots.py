"""Every decider's decisions on fixed inputs, as plain JSON: what ``decisions_before.json`` holds from the code before
deciders were objects (commit 245d8f8), and what ``test_deciders.py`` compares today's decisions with.

Only public APIs are used (``Engine.extract_many``, ``Calibrator.fit``, ``Head.fit``), so the same functions ran on
the old code: ``PCD_WRITE_DECISIONS=1 pytest tests/deciders/test_deciders_before_after.py`` (in a checkout of that
commit with this folder copied in) writes the file, in the process the tests run in (the embedded model's last
digits depend on which BLAS the process loaded).
"""

from __future__ import annotations

import random
from dataclasses import replace
from pathlib import Path
from typing import Any

SNAPSHOT = Path(__file__).with_name("decisions_before.json")

ORACLE_SCHEMA = {
    "urgent": {"type": "boolean"},
    "deadline": {"type": "enum", "choices": ["1_HOUR", "12_HOURS", "1_WEEK", "NONE"]},
    "carrier": {"type": "enum", "choices": ["dhl", "ups", None]},
    "tags": {"type": "multi", "choices": ["billing", "shipping", "broken"], "min_items": 1},
    "queue": {"type": "enum", "choices": ["billing"]},
}
WORDS = "parcel late broken refund invoice courier damaged tonight charge twice angry box label week".split()

EMBEDDED_SCHEMA = {
    "topic": {"type": "enum", "choices": ["business", "entertainment", "politics", "sport", "tech"]},
    "about_money": {"type": "boolean"},
    "mentions": {"type": "multi", "choices": ["people", "companies", "countries"]},
    "tone": {"type": "enum", "choices": ["positive", "negative", None]},
}


def oracle_texts(n: int = 20, seed: int = 3) -> list[str]:
    rng = random.Random(seed)
    return [f"Ticket {i}: " + " ".join(rng.choice(WORDS) for _ in range(6)) + "." for i in range(n)]


def field_record(f: Any) -> dict[str, Any]:
    """One field's decision and evidence, as JSON."""
    return {
        "value": f.value,
        "probability": f.probability,
        "method": f.method,
        "correction": f.correction,
        "raw_probability": f.raw_probability,
        "lean": list(f.lean) if f.lean is not None else None,
        "label_distribution": list(f.label_distribution) if f.label_distribution is not None else None,
        "raw_distribution": list(f.raw_distribution) if f.raw_distribution is not None else None,
        "label_probabilities": (
            [[v, p] for v, p in f.label_probabilities.items()] if f.label_probabilities is not None else None
        ),
        "abstained": f.abstained,
    }


def run(engine: Any, texts: list[str], schema: Any, **options: Any) -> list[dict[str, Any]]:
    """Each text's closed fields' records, decided as one ``extract_many`` call under ``options``."""
    outs = engine.extract_many(texts, schema, **options)
    return [{name: field_record(f) for name, f in out.fields.items() if f.source == "scored"} for out in outs]


def oracle_decisions(engine: Any) -> dict[str, Any]:
    """Every correction and a calibration on the oracle LM (its distributions are seeded by each text), each also
    with a threshold to abstain below, one call each and the calibrated call one text at a time."""
    from pcd_engine.calibrate.calibrator import Calibrator

    texts = oracle_texts()
    cal = Calibrator.fit(engine, texts, ORACLE_SCHEMA, method="em")
    out: dict[str, Any] = {}
    for correction in ("none", "auto", "content_free", "batch"):
        out[correction] = run(engine, texts, ORACLE_SCHEMA, correction=correction)
        out[f"{correction}, anchor"] = run(engine, texts, ORACLE_SCHEMA, correction=correction, anchor=True)
    out["auto, marginal"] = run(engine, texts, ORACLE_SCHEMA, correction="auto", strategy="marginal")
    out["auto, trie_walk"] = run(engine, texts, ORACLE_SCHEMA, correction="auto", strategy="trie_walk")
    out["calibration"] = run(engine, texts, ORACLE_SCHEMA, calibration=cal)
    out["calibration over batch"] = run(engine, texts, ORACLE_SCHEMA, calibration=cal, correction="batch")
    out["calibration, min_probability"] = run(engine, texts, ORACLE_SCHEMA, calibration=cal, min_probability=0.6)
    out["batch of 5"] = run(engine, texts[:5], ORACLE_SCHEMA, correction="batch")
    return out


def embedded_decisions(engine: Any, texts: list[str]) -> dict[str, Any]:
    """The default and the batch's correction, a calibration and heads (over the default correction, over a
    calibration, over the batch's lean) on the embedded model, with heads fitted on the first 12 texts (labels that
    follow their position, so every label is shown)."""
    from pcd_engine import Head
    from pcd_engine.calibrate.calibrator import Calibrator

    topics = EMBEDDED_SCHEMA["topic"]["choices"]
    mentions = EMBEDDED_SCHEMA["mentions"]["choices"]
    examples = [
        (t, {"topic": topics[i % 5], "about_money": i % 2 == 0, "mentions": [mentions[i % 3]]})
        for i, t in enumerate(texts[:12])
    ]
    head = Head.fit(engine, EMBEDDED_SCHEMA, examples)
    # The snapshot holds the regressions' own probabilities: issue 58 fits a temperature per single-label head
    # (tests/heads/test_heads.py checks it); the deciders' plumbing is compared at the temperature the snapshot had.
    head = replace(head, fields=tuple(replace(f, temperature=1.0) for f in head.fields))
    cal = Calibrator.fit(engine, texts, EMBEDDED_SCHEMA, method="em")
    out: dict[str, Any] = {}
    for correction in ("auto", "batch"):  # the oracle LM checks the others, on more readings
        out[correction] = run(engine, texts, EMBEDDED_SCHEMA, correction=correction)
    out["calibration"] = run(engine, texts, EMBEDDED_SCHEMA, calibration=cal)
    out["head"] = run(engine, texts, EMBEDDED_SCHEMA, head=head)
    out["head over calibration"] = run(engine, texts, EMBEDDED_SCHEMA, head=head, calibration=cal)
    out["head over batch"] = run(engine, texts, EMBEDDED_SCHEMA, head=head, correction="batch")
    return out


def oracle_engine(tokenizer: Any) -> Any:
    from pcd_engine import Engine
    from tests.support import OracleBackend, OracleLM

    return Engine(OracleBackend(tokenizer, OracleLM(len(tokenizer), window=40)), correction="none")


def embedded_texts() -> list[str]:
    from pcd_engine.tools.datasets import load_dataset

    return [d.text[:160] for d in load_dataset("bbc-news", limit=16, seed=1)]
