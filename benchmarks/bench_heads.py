"""Decision heads from a few labels (issue 46): accuracy against raw, the default correction and a fitted calibrator,
and what a head costs per document.

For each dataset, ``--docs`` documents (first ``--max-chars`` characters) are decided once by the embedded model with
pcd's own passes (``Engine.read_features``: the default correction's distribution, the model's own, and the features a
head reads). For each number of labelled examples per label and each seeded draw, a head is fitted on the drawn
examples exactly as ``Head.fit`` fits it (``fit_scaled_head``: its temperature fitted on its own held-out folds)
and scored on every other document, with and without that temperature, beside the model's own reading (raw), the
default correction and a calibrator fitted on all documents unlabelled (``Calibrator.fit``, mean method), on the
same held-out documents. The feature rows compare the head's two halves alone (the answer
state, the document mean) at 10 per label. The cost rows time ``extract`` on one schema with and without a head,
alternating, and count the forward passes of each.

    .venv/bin/python benchmarks/bench_heads.py --docs 300 --max-chars 600 --draws 5
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import labelled_arguments  # noqa: E402
from pcd_engine import Calibrator, Engine, Head  # noqa: E402
from pcd_engine.heads.fields import fit_scaled_head  # noqa: E402
from pcd_engine.heads.gates import scores  # noqa: E402
from pcd_engine.heads.head import FEATURE_RECIPES  # noqa: E402
from pcd_engine.tools.datasets import load_dataset  # noqa: E402
from pcd_engine.tools.eval import eval_schema  # noqa: E402

DATASETS = {
    "bbc-news": ("topic", "The section of the news site", (2, 5, 10, 20, 50)),
    "rotten-tomatoes": ("verdict", "The review", (2, 5, 10, 20, 50)),
}


def draw(gold: np.ndarray, per_label: int, seed: int) -> tuple[list[int], list[int]]:
    """``per_label`` examples of each label (one left out at least), and every other document."""
    rng = random.Random(seed)
    train: list[int] = []
    for label in sorted(set(gold.tolist())):
        members = [i for i in range(len(gold)) if gold[i] == label]
        train += rng.sample(members, min(per_label, len(members) - 1))
    chosen = set(train)
    return train, [i for i in range(len(gold)) if i not in chosen]


def head_rows(
    x: np.ndarray, gold: np.ndarray, labels: list[str], train: list[int], test: list[int], *, scaled: bool = True
) -> np.ndarray:
    """Held-out distributions of a head fitted on ``train`` as ``Head.fit`` fits it (its temperature fitted on its
    own held-out folds of ``train``: ``fit_scaled_head``), or without the temperature (``scaled=False``)."""
    head, _ = fit_scaled_head("f", labels, x[train].tolist(), gold[train].tolist())
    if not scaled:
        head = replace(head, temperature=1.0)
    return np.array([head.probabilities(row) for row in x[test]])


def row(title: str, cells: Sequence[tuple[float, float, float]]) -> str:
    return f"| {title} | " + " | ".join(f"{a:.1f} / {f:.1f} / {e:.1f}" for a, f, e in cells) + " |"


def mean_scores(runs: list) -> tuple[float, float, float]:
    return (statistics.mean(s.accuracy for s in runs) * 100, statistics.mean(s.macro_f1 for s in runs) * 100,
            statistics.mean(s.ece for s in runs) * 100)  # fmt: skip


def dataset_table(engine: Engine, name: str, docs: int, max_chars: int, draws: int) -> None:
    field, description, shots = DATASETS[name]
    data = list(load_dataset(name))
    random.Random(0).shuffle(data)
    data = data[:docs]
    labels = sorted({d.label for d in data})
    schema = eval_schema(field, labels, description=description)
    texts = [d.text[:max_chars] for d in data]
    gold = np.array([labels.index(d.label) for d in data])
    tick = time.perf_counter()
    rows = engine.read_features(texts, schema)
    read_s = time.perf_counter() - tick
    x = np.array([features[field] for _, features in rows])
    default = np.array([results[field].label_distribution for results, _ in rows])
    raw = np.array([results[field].raw_distribution or results[field].label_distribution for results, _ in rows])
    tick = time.perf_counter()
    prior = Calibrator.fit(engine, texts, schema).field(field)
    calibrated = np.array([prior.correct(p) for p in raw]) if prior is not None else raw
    fit_s = time.perf_counter() - tick
    print(f"\n## {name}: {len(data)} documents, {len(labels)} labels, first {max_chars} characters, {draws} draws")
    print(f"features ({FEATURE_RECIPES[0]}, width {x.shape[1]}) and distributions read in {read_s:.1f} s; "
          f"calibrator fitted on the {len(texts)} documents unlabelled in {fit_s:.1f} s")  # fmt: skip
    print("held-out accuracy / macro-F1 / ECE, %, mean of the draws (the baselines on the same held-out documents)")
    print("| reader | " + " | ".join(f"{k} per label" for k in shots) + " |")
    print("|---|" + "---|" * len(shots))
    table: dict[str, list[tuple[float, float, float]]] = {}
    spreads = []
    for k in shots:
        runs: dict[str, list] = {"raw": [], "default correction": [], "calibrator (unlabelled)": [],
                                 "head, unscaled": [], "head": []}  # fmt: skip
        for seed in range(draws):
            train, test = draw(gold, k, seed)
            runs["raw"].append(scores(raw[test], gold[test]))
            runs["default correction"].append(scores(default[test], gold[test]))
            runs["calibrator (unlabelled)"].append(scores(calibrated[test], gold[test]))
            runs["head, unscaled"].append(scores(head_rows(x, gold, labels, train, test, scaled=False), gold[test]))
            runs["head"].append(scores(head_rows(x, gold, labels, train, test), gold[test]))
        for title, got in runs.items():
            table.setdefault(title, []).append(mean_scores(got))
        spreads.append(statistics.stdev(s.accuracy for s in runs["head"]) * 100 if draws > 1 else 0.0)
    for title, cells in table.items():
        print(row(title, cells))
    print("| head accuracy spread (sd over draws) | " + " | ".join(f"{s:.1f}" for s in spreads) + " |")
    width = x.shape[1] // 2
    print("\nfeature choices at 10 per label (accuracy, mean of the draws):")
    for title, cols in (("answer state only (last layer)", slice(0, width)), ("document mean only (middle layer)",
                        slice(width, None)), ("both (the recipe)", slice(None))):  # fmt: skip
        accs = []
        for seed in range(draws):
            train, test = draw(gold, 10, seed)
            accs.append(scores(head_rows(x[:, cols], gold, labels, train, test), gold[test]).accuracy * 100)
        print(f"- {title}: {statistics.mean(accs):.1f}%")


def cost_table(engine: Engine, docs: int, max_chars: int, repeats: int) -> None:
    field, description, _ = DATASETS["bbc-news"]
    data = list(load_dataset("bbc-news", limit=docs + 50, seed=1))
    labels = sorted({d.label for d in data})
    schema = eval_schema(field, labels, description=description)
    fit_on = [(d.text[:max_chars], {field: d.label}) for d in data[docs:]]
    head = Head.fit(engine, schema, fit_on)
    texts = [d.text[:max_chars] for d in data[:docs]]
    plain_ms, head_ms, passes = [], [], set()
    engine.extract(texts[0], schema), engine.extract(texts[0], schema, head=head)  # warm the preamble cache
    for _ in range(repeats):
        for text in texts:
            for which in ("plain", "head"):
                tick = time.perf_counter()
                out = engine.extract(text, schema, head=head) if which == "head" else engine.extract(text, schema)
                (head_ms if which == "head" else plain_ms).append((time.perf_counter() - tick) * 1000)
                passes.add((which, out.stats.forward_passes))
    plain, headed = statistics.median(plain_ms), statistics.median(head_ms)
    per_doc = {w: sorted(p for x, p in passes if x == w) for w in ("plain", "head")}
    print(f"\n## cost: extract of the one-field topic schema, {docs} documents x {repeats}, alternating, CPU")
    print("| call | median ms per document | forward passes per document |")
    print("|---|---|---|")
    print(f"| plain extract | {plain:.1f} | {per_doc['plain']} |")
    print(f"| extract with a head | {headed:.1f} | {per_doc['head']} |")
    print(f"ratio: {headed / plain:.3f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    labelled_arguments(parser, DATASETS)
    parser.add_argument("--cost-docs", type=int, default=30)
    parser.add_argument("--cost-repeats", type=int, default=3)
    args = parser.parse_args()
    engine = Engine.load()
    for name in args.datasets:
        dataset_table(engine, name, args.docs, args.max_chars, args.draws)
    if args.cost_docs:
        cost_table(engine, args.cost_docs, args.max_chars, args.cost_repeats)


if __name__ == "__main__":
    main()
