"""Lean corrections on weak and capable readers, on balanced and skewed batches: would a correction make a reader
that is right wrong?

Readers (each gives every document's distribution over the labels, and its distribution on the content-free
inputs "N/A", "[MASK]", "(no text)"):

* the embedded model (``--model``, default SmolLM2-135M) on BBC News topics (5 labels) and Rotten Tomatoes
  verdicts (2), read with the labels listed sorted and reversed, both ``marginal`` (the default reading) and
  ``exact`` (every token of every label, what ``content_free`` and ``batch`` read);
* the same model on easy tasks made here, 2 to 8 labels (which colour, animal, weekday, fruit a sentence names;
  whether a device is on): some it gets right alone, some its lean misleads;
* capable readers whose posteriors are real: a TF-IDF logistic regression trained on half of BBC News (as fitted,
  and with sigmoid-calibrated probabilities), each with a planted lean towards ``business`` (mild: x2, strong:
  x8 / x3 / x1 / x1 / x0.5); and a synthetic 99%-accurate reader with a x1.5 lean. Their content-free readings are
  the classifier's own on the same inputs, times the planted lean.

Batches are drawn from each reader's documents by label: balanced, and 60%, 80% and 95% one label, with the
majority on the label the model leans to most (its content-free lean) and on the one it leans to least; 16, 64 and
256 documents; many draws each (1024 documents per cell). Corrections, as the engine computes them (the tests hold
the engine to these formulas on an oracle model):

* **raw**: the model's own distribution (marginal reading);
* **auto** (the default): the content-free lean divided out of the marginal reading, per document;
* **content_free**: the same on the exact reading;
* **batch**: the batch's EM lean (corrected shares made uniform) divided out of the exact reading;
* **oracle** (readers with a planted lean only, in a table of their own): the planted lean itself divided out, the
  reader as it is without its lean. No correction that is the same for every batch can do better on a batch whose
  majority the lean happens to favour.

Reported: accuracy, macro-F1, expected calibration error, Brier score, the share of documents with the same answer
under both label orders (model readers), ms per document of the reading; the worst loss against raw over the skewed
batches; and the error of each label-share estimator (``pcd_engine.calibrate.shares``) on the auto-corrected
distributions.

Usage::

    python benchmarks/bench_corrections.py --bbc-docs 240 --rt-docs 320 --max-chars 600
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pcd_engine import Engine  # noqa: E402
from pcd_engine.calibrate.calibrator import em_bias  # noqa: E402
from pcd_engine.calibrate.shares import estimate_shares  # noqa: E402
from pcd_engine.deciders.corrections import CONTENT_FREE_TEXTS  # noqa: E402
from pcd_engine.tools.datasets import classification_metrics, load_dataset  # noqa: E402
from pcd_engine.tools.eval import calibration_scores, eval_schema  # noqa: E402
from pcd_engine.tools.terminal import table, versions  # noqa: E402

DATASETS = {
    "bbc-news": ("topic", "The section of the news site"),
    "rotten-tomatoes": ("verdict", "The critic's verdict on the film: fresh (liked it) or rotten (did not)"),
}
CORRECTIONS = ("raw", "auto", "content_free", "batch")
SIZES = (16, 64, 256)
SHARES = (0.6, 0.8, 0.95)


def easy_tasks(seed: int = 0) -> dict[str, tuple[str, str, list[str], list[tuple[str, str]]]]:
    """Short sentences that name their label outright: name -> (field, description, labels, (text, label)s)."""
    rng = random.Random(seed)
    colours = ["red", "green", "blue", "yellow", "purple"]
    things = ["car", "door", "house", "bicycle", "umbrella", "shirt", "cup", "boat"]
    said = ["The {t} is {c}.", "She painted the {t} {c}.", "My neighbour bought a {c} {t} yesterday.",
            "A {c} {t} was parked outside.", "He prefers the {c} {t}."]  # fmt: skip
    animals = {"dog": "barked", "cat": "meowed", "cow": "mooed", "duck": "quacked"}
    heard = ["Last night the {a} {v} loudly.", "Our {a} {v} at the postman.", "The farmer's {a} {v} all morning."]
    days = ["monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday"]
    dated = [
        "The meeting is on {d}.",
        "We will fly out on {d} morning.",
        "See you {d}!",
        "The shop is closed every {d}.",
    ]
    state = {
        "on": ["The lamp is switched on.", "She turned the light on.", "The heater is running now.", "The TV is on."],
        "off": ["The lamp is switched off.", "She turned the light off.", "The heater is not running.",
                "The TV is off."],
    }  # fmt: skip
    fruit = {"apple": "apples", "banana": "bananas", "orange": "oranges", "grape": "grapes", "lemon": "lemons",
             "cherry": "cherries", "pear": "pears", "peach": "peaches"}  # fmt: skip
    bought = ["I bought some {p} at the market.", "The recipe needs three {p}.", "He ate two {p} for lunch."]
    return {
        "colour": ("colour", "The colour the sentence names", colours,
                   [(rng.choice(said).format(t=rng.choice(things), c=c), c) for c in colours for _ in range(40)]),
        "animal": ("animal", "The animal the sentence is about", list(animals),
                   [(rng.choice(heard).format(a=a, v=v), a) for a, v in animals.items() for _ in range(50)]),
        "weekday": ("day", "The day of the week the sentence names", days,
                    [(rng.choice(dated).format(d=d.capitalize()), d) for d in days for _ in range(28)]),
        "switch": ("state", "Whether the device is on or off", ["on", "off"],
                   [(rng.choice(state[s]), s) for s in state for _ in range(80)]),
        "fruit": ("fruit", "The fruit the sentence mentions", list(fruit),
                  [(rng.choice(bought).format(p=p), f) for f, p in fruit.items() for _ in range(25)]),
    }  # fmt: skip


class Reading:
    """One reader's distributions: ``q[reading][order]`` (documents x labels, canonical label order), the same
    for the content-free inputs, the gold labels, and ms per document of each reading."""

    def __init__(self, name: str, labels: list[str], gold: list[str]):
        self.name, self.labels, self.gold = name, labels, np.array([labels.index(g) for g in gold])
        self.q: dict[str, dict[str, np.ndarray]] = {}
        self.cf: dict[str, dict[str, np.ndarray]] = {}
        self.ms: dict[str, float] = {}
        self.lean: np.ndarray | None = None  # a planted lean, when it is known (the capable readers)


def read_model(engine: Engine, name: str, field: str, description: str, labels: list[str], texts: list[str],
               gold: list[str]) -> Reading:  # fmt: skip
    """The model's distributions for ``texts`` in both label orders and both readings."""
    out = Reading(name, labels, gold)
    for reading in ("marginal", "exact"):
        options = {"strategy": reading, "staging": "one_pass", "anchor": False, "correction": "none"}
        out.q[reading], out.cf[reading] = {}, {}
        seconds = 0.0
        for order_name, order in (("sorted", labels), ("reversed", labels[::-1])):
            spec = {"type": "enum", "choices": order, "description": description}
            schema = eval_schema(field, labels, schema={field: spec})

            def read(docs: Sequence[str], schema=schema) -> np.ndarray:
                results = engine.extract_many(list(docs), schema, **options)
                rows = [dict(zip(order, r.fields[field].label_distribution, strict=True)) for r in results]
                return np.array([[row[label] for label in labels] for row in rows])

            tick = time.perf_counter()
            out.q[reading][order_name] = read(texts)
            seconds += time.perf_counter() - tick
            out.cf[reading][order_name] = read(CONTENT_FREE_TEXTS)
        out.ms[reading] = seconds * 1000 / (2 * len(texts))
    return out


def capable_readers(seed: int = 1) -> list[Reading]:
    """The TF-IDF logistic regressions (fitted, and calibrated) with planted leans, and the synthetic reader."""
    from sklearn.calibration import CalibratedClassifierCV
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression

    data = list(load_dataset("bbc-news"))
    random.Random(seed).shuffle(data)
    texts, gold = [d.text[:600] for d in data], [d.label for d in data]
    labels = sorted(set(gold))
    half = len(texts) // 2
    vec = TfidfVectorizer(sublinear_tf=True, min_df=2).fit(texts[:half])
    train, test = vec.transform(texts[:half]), vec.transform(texts[half:])
    y = [labels.index(g) for g in gold[:half]]
    empty = vec.transform(list(CONTENT_FREE_TEXTS))
    models = {
        "logistic regression": LogisticRegression(C=10, max_iter=2000).fit(train, y),
        "calibrated regression": CalibratedClassifierCV(LogisticRegression(C=10, max_iter=2000), cv=5).fit(train, y),
    }
    out = []
    for model_name, model in models.items():
        p, cf = model.predict_proba(test), model.predict_proba(empty)
        for lean_name, lean in (("mild lean", [2.0, 1, 1, 1, 1]), ("strong lean", [8.0, 3, 1, 1, 0.5])):
            b = np.array(lean) / sum(lean)
            reader = Reading(f"{model_name}, {lean_name}", labels, gold[half:])
            reader.lean = b
            planted = (p * b) / (p * b).sum(axis=1, keepdims=True)
            cf_planted = (cf * b) / (cf * b).sum(axis=1, keepdims=True)
            for reading in ("marginal", "exact"):
                reader.q[reading], reader.cf[reading] = {"sorted": planted}, {"sorted": cf_planted}
                reader.ms[reading] = 0.0
            out.append(reader)
    rng = np.random.default_rng(seed)
    truth = np.array([labels.index(g) for g in gold[half:]])
    confidence = rng.uniform(0.9, 0.995, len(truth))
    rows = np.zeros((len(truth), len(labels)))
    for i, t in enumerate(truth):
        said = t if rng.random() > 0.01 else (t + 1) % len(labels)
        rows[i] = np.insert(rng.dirichlet(np.ones(len(labels) - 1)) * (1 - confidence[i]), said, confidence[i])
    b = np.array([1.5, 1, 1, 1, 1]) / 5.5
    synthetic = Reading("synthetic 99% reader, x1.5 lean", labels, gold[half:])
    synthetic.lean = b
    for reading in ("marginal", "exact"):
        synthetic.q[reading] = {"sorted": (rows * b) / (rows * b).sum(axis=1, keepdims=True)}
        synthetic.cf[reading] = {"sorted": np.tile(b, (3, 1))}
        synthetic.ms[reading] = 0.0
    return [*out, synthetic]


def normalised(m: np.ndarray) -> np.ndarray:
    total = m.sum(axis=-1, keepdims=True)
    return m / np.where(total > 0, total, 1.0)


def corrected(reader: Reading, correction: str, idx: np.ndarray, order: str) -> np.ndarray:
    """The batch ``idx``'s distributions under ``correction``, as the engine computes them."""
    if correction == "raw":
        return reader.q["marginal"][order][idx]
    if correction == "oracle":  # the planted lean itself divided out: the reader as it is without it
        assert reader.lean is not None
        return normalised(reader.q["marginal"][order][idx] / reader.lean)
    reading = "marginal" if correction == "auto" else "exact"
    q = reader.q[reading][order][idx]
    if correction == "batch":
        return normalised(q / np.array(em_bias(q.tolist())))
    return normalised(q / reader.cf[reading][order].mean(axis=0))


def compositions(k: int, lean_to: int, least: int) -> dict[str, list[float]]:
    out = {"balanced": [1.0 / k] * k}
    for share in SHARES:
        for where, label in (("leaned-to", lean_to), ("least-leaned", least)):
            mix = [(1 - share) / (k - 1)] * k
            mix[label] = share
            out[f"{share:.0%} the {where} label"] = mix
    return out


def cell(reader: Reading, mix: list[float], size: int, seed: int = 0) -> dict[str, dict[str, float]]:
    """Each correction's metrics on draws of ``size`` documents of label mix ``mix`` (1024 documents in all)."""
    rng = np.random.default_rng(seed)
    k = len(reader.labels)
    by_label = [np.flatnonzero(reader.gold == j) for j in range(k)]
    both = "reversed" in reader.q["marginal"]
    corrections = (*CORRECTIONS, "oracle") if reader.lean is not None else CORRECTIONS
    got: dict[str, dict[str, list[float]]] = {c: {} for c in corrections}
    share_error: dict[str, list[float]] = {}
    for _ in range(max(4, 1024 // size)):
        counts = rng.multinomial(size, mix)
        idx = np.concatenate([rng.choice(by_label[j], c, replace=True) for j, c in enumerate(counts) if c])
        truth = reader.gold[idx]
        for c in corrections:
            post = corrected(reader, c, idx, "sorted")
            chosen = post.argmax(axis=1)
            names = [reader.labels[i] for i in chosen]
            gold = [reader.labels[i] for i in truth]
            metrics = classification_metrics(gold, names, labels=reader.labels)
            ece, brier = calibration_scores(gold, reader.labels, post.max(axis=1).tolist(), names, post.tolist())
            row = got[c]
            row.setdefault("accuracy", []).append(metrics.accuracy)
            row.setdefault("macro_f1", []).append(metrics.macro_f1)
            row.setdefault("ece", []).append(ece or 0.0)
            row.setdefault("brier", []).append(brier or 0.0)
            if both:
                back = corrected(reader, c, idx, "reversed").argmax(axis=1)
                row.setdefault("agreement", []).append(float(np.mean(back == chosen)))
            if c == "auto":
                actual = np.bincount(truth, minlength=k) / len(truth)
                for method in ("em", "mean", "count"):
                    estimate = np.array(estimate_shares(post.tolist(), method=method, resamples=0)[0])
                    share_error.setdefault(method, []).append(0.5 * float(np.abs(estimate - actual).sum()))
    out = {c: {m: statistics.fmean(v) for m, v in got[c].items()} for c in corrections}
    out["shares"] = {m: statistics.fmean(v) for m, v in share_error.items()}
    return out


def measure(reader: Reading) -> list[tuple[str, int, dict]]:
    lean = reader.cf["marginal"]["sorted"].mean(axis=0)
    mixes = compositions(len(reader.labels), int(np.argmax(lean)), int(np.argmin(lean)))
    return [(name, size, cell(reader, mix, size)) for name, mix in mixes.items() for size in SIZES]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--bbc-docs", type=int, default=240)
    parser.add_argument("--rt-docs", type=int, default=320)
    parser.add_argument("--max-chars", type=int, default=600)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--model", default=None)
    args = parser.parse_args(argv)
    engine = Engine.load(args.model, backend="torch")
    print(f"model: {args.model or 'default'}; backend torch; {versions()}")
    print(f"first {args.max_chars} characters of each document; seed {args.seed}\n", flush=True)
    readers = []
    for name, docs in (("bbc-news", args.bbc_docs), ("rotten-tomatoes", args.rt_docs)):
        data = load_dataset(name, limit=docs, seed=args.seed)
        field, description = DATASETS[name]
        labels = sorted({d.label for d in data})
        texts, gold = [d.text[: args.max_chars] for d in data], [d.label for d in data]
        readers.append(read_model(engine, f"embedded model, {name}", field, description, labels, texts, gold))
        print(f"read {name}: {len(texts)} documents", flush=True)
    for name, (field, description, labels, docs) in easy_tasks(args.seed).items():
        texts, gold = [t for t, _ in docs], [g for _, g in docs]
        readers.append(read_model(engine, f"embedded model, easy: {name}", field, description, labels, texts, gold))
        print(f"read easy task {name}: {len(texts)} sentences", flush=True)
    readers += capable_readers()
    cells = {r.name: measure(r) for r in readers}

    rows = []
    for reader in readers:
        for mix, size, got in cells[reader.name]:
            rows.append((reader.name, mix, size, *(f"{100 * got[c]['accuracy']:.1f}" for c in CORRECTIONS)))
    print("\naccuracy (%) per batch composition and size\n")
    print(table(("reader", "batch", "documents", *CORRECTIONS), rows))

    rows = []
    for reader in readers:
        balanced = [got for mix, size, got in cells[reader.name] if mix == "balanced" and size == 64][0]
        for c in CORRECTIONS:
            m = balanced[c]
            ms = reader.ms["marginal" if c in ("raw", "auto") else "exact"]
            agree = f"{100 * m['agreement']:.1f}%" if "agreement" in m else "-"
            rows.append((reader.name, c, f"{100 * m['accuracy']:.1f}%", f"{m['macro_f1']:.3f}", f"{m['ece']:.3f}",
                         f"{m['brier']:.3f}", agree, f"{ms:.0f}" if ms else "-"))  # fmt: skip
    print("\nbalanced batches of 64: every metric\n")
    print(table(("reader", "correction", "accuracy", "macro-F1", "ECE", "Brier", "same answer, reversed order",
                 "ms / doc"), rows))  # fmt: skip

    rows = []
    for reader in readers:
        worst = {}
        for mix, size, got in cells[reader.name]:
            if mix == "balanced":
                continue
            for c in CORRECTIONS[1:]:
                loss = 100 * (got[c]["accuracy"] - got["raw"]["accuracy"])
                if c not in worst or loss < worst[c][0]:
                    worst[c] = (loss, f"{mix}, {size}")
        balanced = {c: statistics.fmean(100 * g[c]["accuracy"] for m, _, g in cells[reader.name] if m == "balanced")
                    for c in CORRECTIONS}  # fmt: skip
        rows.append((reader.name, *(f"{balanced[c]:.1f}" for c in CORRECTIONS),
                     *(f"{worst[c][0]:+.1f} ({worst[c][1]})" for c in CORRECTIONS[1:])))  # fmt: skip
    print("\nbalanced accuracy (mean over sizes), and each correction's worst change against raw on a skewed batch\n")
    print(table(("reader", *(f"balanced: {c}" for c in CORRECTIONS), *(f"worst skewed: {c}" for c in
                                                                        CORRECTIONS[1:])), rows))  # fmt: skip

    rows = []
    for reader in (r for r in readers if r.lean is not None):
        skewed = [(mix, size, got) for mix, size, got in cells[reader.name] if mix != "balanced"]
        worst = {}
        for c in ("auto", "oracle"):
            mix, size, got = min(skewed, key=lambda cell, c=c: cell[2][c]["accuracy"] - cell[2]["raw"]["accuracy"])
            worst[c] = f"{100 * (got[c]['accuracy'] - got['raw']['accuracy']):+.1f} ({mix}, {size})"
        gap = max(100 * (got["oracle"]["accuracy"] - got["auto"]["accuracy"]) for _, _, got in skewed)
        rows.append((reader.name, worst["auto"], worst["oracle"], f"{gap:.1f}"))
    print(
        "\nreaders with a known planted lean: the worst skewed change against raw of auto and of the planted lean "
        "itself divided out (oracle: the reader without its lean), and auto's largest shortfall against the oracle\n"
    )
    print(table(("reader", "worst skewed: auto", "worst skewed: oracle", "auto below oracle, at most"), rows))

    rows = []
    for reader in readers:
        errors = {
            m: statistics.fmean(g["shares"][m] for _, _, g in cells[reader.name]) for m in ("em", "mean", "count")
        }
        rows.append((reader.name, *(f"{100 * errors[m]:.1f}" for m in ("em", "mean", "count"))))
    print(
        "\nlabel shares: mean error (total variation, points) of each estimator on the auto-corrected distributions\n"
    )
    print(table(("reader", "em", "mean", "count"), rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
