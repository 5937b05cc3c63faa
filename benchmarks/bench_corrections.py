"""Label-bias corrections that need nothing from the user, measured side by side on labelled data.

For each dataset (BBC News topics, five labels; Rotten Tomatoes review snippets, fresh/rotten), a seeded sample is
read with every label's probability, once with the labels listed sorted and once reversed, in each reading asked
for: ``exact`` (each label's full tokens, as a calibrated call reads it) and ``marginal`` (each label's
identifying token, as a default call reads a field of up to 32 labels, and as the default ``"auto"`` correction
corrects it). Each correction decides from those readings (plus whatever
extra readings it needs), and is reported with accuracy, macro-F1, the share of documents whose answer is the same
under both label orders, and its cost in readings per document. Each dataset is also reported on a skewed
batch (every document of its first label and one in four of the others), where a correction towards uniform
labels can do harm.

Corrections (``q``: the model's label distribution on the document; ``b``: an estimated lean; the decision is the
argmax of ``q / b``):

* **raw**: ``q`` as it is (pcd without calibration);
* **length-normalised**: the label's log-likelihood per token instead of its total (unconditional, one reading);
* **content-free**: ``b`` is the mean distribution on content-free documents ("N/A", "[MASK]", "(no text)"),
  read once per schema (Zhao et al. 2021); works for a single call;
* **random words**: ``b`` from five documents of random words drawn from a fixed English word list (the
  model's vocabulary), read once per schema; a single call;
* **domain words**: ``b`` from five documents of random words drawn from the sample's own documents (Fei et al.
  2023); needs a batch;
* **own words shuffled**: each document's ``b`` is its own words in a random order (two readings per document);
  a single call;
* **batch mean / batch EM**: ``b`` is the mean of ``q`` over the documents decided together, or the EM prior
  under which the corrected distributions average to uniform (pcd's ``Calibrator`` methods, fitted on the batch);
  also with the batch cut in chunks of 32, 16 and 8, as smaller calls would see it;
* **running EM**: each document corrected by the EM estimate over every document decided before it and itself
  (an engine-held estimate that grows with use).

Usage::

    python benchmarks/bench_corrections.py --bbc-docs 240 --rt-docs 320 --max-chars 600 --readings exact,marginal
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pcd_engine import Engine  # noqa: E402
from pcd_engine.calibrate.calibrator import em_bias, mean_prior  # noqa: E402
from pcd_engine.decide.compiler import compile_wave  # noqa: E402
from pcd_engine.prompt.chat_prompt import ChatPrompt  # noqa: E402
from pcd_engine.tools.datasets import classification_metrics, load_dataset  # noqa: E402
from pcd_engine.tools.eval import eval_schema  # noqa: E402
from pcd_engine.tools.terminal import table, versions  # noqa: E402

READINGS = ("exact", "marginal")
CONTENT_FREE = ("N/A", "[MASK]", "(no text)")
DATASETS = {
    "bbc-news": ("topic", "The section of the news site"),
    "rotten-tomatoes": ("verdict", "The critic's verdict on the film: fresh (liked it) or rotten (did not)"),
}


def argmax(row: Sequence[float]) -> int:
    return max(range(len(row)), key=lambda i: (row[i], -i))


def in_order(distribution: Sequence[float], listed: Sequence[str], canonical: Sequence[str]) -> list[float]:
    at = dict(zip(listed, distribution, strict=True))
    return [at[label] for label in canonical]


def divided(row: Sequence[float], bias: Sequence[float]) -> list[float]:
    return [p / b if b > 0 else 0.0 for p, b in zip(row, bias, strict=True)]


def em_numpy(rows: np.ndarray, iterations: int = 500, tolerance: float = 1e-9) -> np.ndarray:
    """:func:`pcd_engine.calibrate.calibrator.em_bias` with a uniform target, vectorised (the running estimate calls it
    once per document); checked against it on every dataset before use."""
    bias = rows.mean(axis=0)
    goal = 1.0 / rows.shape[1]
    for _ in range(iterations):
        corrected = rows * (goal / bias)
        corrected /= corrected.sum(axis=1, keepdims=True)
        mean = corrected.mean(axis=0)
        if np.max(np.abs(mean - goal)) < tolerance:
            break
        bias = bias * mean / goal
        bias /= bias.sum()
    return bias


def word_documents(words: Sequence[str], *, count: int, length: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(words) for _ in range(length)) for _ in range(count)]


class Reader:
    """Reads one dataset's field in one label order: whole distributions, masses and the time per document."""

    def __init__(
        self, engine: Engine, field: str, description: str, labels: list[str], order: list[str], strategy: str
    ):
        self.engine, self.field, self.labels, self.order = engine, field, labels, order
        self.options = {"strategy": strategy, "staging": "one_pass", "anchor": False, "correction": "none"}
        self.schema = eval_schema(field, labels, schema={field: {"type": "enum", "choices": order,
                                                                 "description": description}})  # fmt: skip
        self.seconds = 0.0
        self.readings = 0

    def read(self, texts: Sequence[str]) -> tuple[list[list[float]], list[float]]:
        started = time.perf_counter()
        outs = self.engine.extract_many(list(texts), self.schema, **self.options)
        self.seconds += time.perf_counter() - started
        self.readings += len(texts)
        fields = [o.fields[self.field] for o in outs]
        return [in_order(f.label_distribution, self.order, self.labels) for f in fields], [
            float(f.candidate_mass) for f in fields
        ]

    def label_tokens(self) -> list[int]:
        """Each label's token count after the field's shared start (its shortest surface), in canonical order."""
        tv = self.engine.tokenizer
        prompt = ChatPrompt.build(tv, self.schema)
        spec = self.schema.field(self.field)
        wave = compile_wave(tv, [spec], boundary_text=prompt.boundary_text, tail_text=prompt.tail_text)
        trie = wave.fields[0]
        count = {}
        for path in trie.paths:
            n = len(path.nodes) - trie.decision_depth
            value = str(spec.labels[path.label].value)
            count[value] = min(count.get(value, n), n)
        return [count[label] for label in self.labels]


def readings(
    engine: Engine, name: str, texts: list[str], labels: list[str], seed: int, words: list[str], strategy: str
) -> dict:
    """Every reading the corrections decide from, in both label orders, read with ``strategy``."""
    field, description = DATASETS[name]
    rng = random.Random(seed)
    mean_words = max(3, round(statistics.fmean(len(t.split()) for t in texts)))
    batch_words = [w for t in texts for w in t.split()]
    shuffled = []
    for t in texts:
        parts = t.split()
        rng.shuffle(parts)
        shuffled.append(" ".join(parts))
    out = {}
    for base, order in (("sorted", labels), ("reversed", labels[::-1])):
        reader = Reader(engine, field, description, labels, order, strategy)
        q, mass = reader.read(texts)
        out[base] = {
            "ms": reader.seconds * 1000 / len(texts),
            "q": q,
            "mass": mass,
            "tokens": reader.label_tokens(),
            "content_free": reader.read(CONTENT_FREE)[0],
            "vocab": reader.read(word_documents(words, count=5, length=mean_words, seed=seed))[0],
            "domain": reader.read(word_documents(batch_words, count=5, length=mean_words, seed=seed))[0],
            "own": reader.read(shuffled)[0],
        }
        rows = np.array(q)
        assert np.allclose(em_numpy(rows), em_bias(q), atol=1e-6), "em_numpy must equal em_bias"
    return out


def decide_all(read: dict, keep: Sequence[int], labels: list[str]) -> dict[str, list[str]]:
    """Each correction's decisions on the documents ``keep`` (the batch methods estimate on those alone; the
    domain words are drawn from the whole sample)."""
    q = [read["q"][i] for i in keep]
    mass = [read["mass"][i] for i in keep]
    own = [read["own"][i] for i in keep]
    rows = np.array(q)

    def chunked(size: int) -> list[list[float]]:
        out = []
        for start in range(0, len(q), size):
            part = q[start : start + size]
            out += [divided(r, em_bias(part)) for r in part]
        return out

    tokens = read["tokens"]
    lengthwise = [
        [math.log(max(p * m, 1e-300)) / n for p, n in zip(r, tokens, strict=True)] for r, m in zip(q, mass, strict=True)
    ]
    methods: dict[str, list[Sequence[float]]] = {
        "raw": q,
        "length-normalised": lengthwise,
        "content-free (3 inputs)": [divided(r, mean_prior(read["content_free"])) for r in q],
        "random words (5 inputs)": [divided(r, mean_prior(read["vocab"])) for r in q],
        "domain words (5 from the sample)": [divided(r, mean_prior(read["domain"])) for r in q],
        "own words shuffled (per doc)": [divided(r, b) for r, b in zip(q, own, strict=True)],
        "batch mean (all)": [divided(r, mean_prior(q)) for r in q],
        "batch EM (all)": [divided(r, em_bias(q)) for r in q],
        "batch EM (chunks of 32)": chunked(32),
        "batch EM (chunks of 16)": chunked(16),
        "batch EM (chunks of 8)": chunked(8),
        "running EM": [divided(r, em_numpy(rows[: i + 1])) for i, r in enumerate(q)],
    }
    return {method: [labels[argmax(r)] for r in scored] for method, scored in methods.items()}


EXTRA = {"content-free (3 inputs)": 3, "random words (5 inputs)": 5, "domain words (5 from the sample)": 5}


def report(name: str, read: dict, keep: Sequence[int], gold: list[str], labels: list[str]) -> list[tuple]:
    fwd = decide_all(read["sorted"], keep, labels)
    bwd = decide_all(read["reversed"], keep, labels)
    truth = [gold[i] for i in keep]
    ms = statistics.fmean([read["sorted"]["ms"], read["reversed"]["ms"]])
    out = []
    for method in fwd:
        m = classification_metrics(truth, fwd[method], labels=labels)
        agree = statistics.fmean(a == b for a, b in zip(fwd[method], bwd[method], strict=True))
        if method.startswith("own words"):
            cost = f"2 readings/doc ({2 * ms:.0f} ms)"
        elif method in EXTRA:
            cost = f"1/doc + {EXTRA[method]} per schema ({ms:.0f} ms)"
        else:
            cost = f"1 reading/doc ({ms:.0f} ms)"
        out.append((name, method, f"{m.accuracy:.1%}", f"{m.macro_f1:.3f}", f"{agree:.1%}", cost))
    return out


def measure(
    engine: Engine, name: str, docs: int, max_chars: int, seed: int, words: list[str], strategy: str
) -> list[tuple]:
    data = load_dataset(name, limit=docs, seed=seed)
    texts = [d.text[:max_chars] for d in data]
    gold = [d.label for d in data]
    labels = sorted(set(gold))
    read = readings(engine, name, texts, labels, seed, words, strategy)
    rows = report(f"{name} ({len(texts)}, {strategy})", read, range(len(texts)), gold, labels)
    # A skewed batch: every document of the sample's first label, and one in four of the others.
    first = labels[0]
    skewed = [i for i, g in enumerate(gold) if g == first or i % 4 == 0]
    share = sum(gold[i] == first for i in skewed) / len(skewed)
    rows += report(f"{name} skewed ({len(skewed)}, {share:.0%} {first}, {strategy})", read, skewed, gold, labels)
    return rows


def vocabulary_words(engine: Engine, limit: int = 5000) -> list[str]:
    """Whole English words in the tokenizer's vocabulary (a leading-space token of 3+ letters), a fixed list."""
    found = []
    for token in sorted(engine.tokenizer.hf.get_vocab()):
        word = token[1:] if token[:1] in ("Ġ", "▁") else None
        if word and len(word) >= 3 and word.isascii() and word.isalpha() and word.islower():
            found.append(word)
    return found[:: max(1, len(found) // limit)][:limit]


def main(argv: Sequence[str] | None = None, *, engine_factory: Callable[[], Engine] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--bbc-docs", type=int, default=200)
    parser.add_argument("--rt-docs", type=int, default=300)
    parser.add_argument("--max-chars", type=int, default=600)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--model", default=None)
    parser.add_argument(
        "--readings", default=",".join(READINGS), help=f"comma-separated, from {', '.join(READINGS)} (default: both)"
    )
    args = parser.parse_args(argv)
    strategies = [s.strip() for s in args.readings.split(",") if s.strip()]
    if not strategies or any(s not in READINGS for s in strategies):
        parser.error(f"--readings: expected names from {list(READINGS)}, but got {args.readings!r}")
    engine = engine_factory() if engine_factory else Engine.load(args.model, backend="torch")
    print(f"model: {args.model or 'default'}; backend torch; {versions()}")
    print(f"first {args.max_chars} characters of each document; seed {args.seed}\n")
    words = vocabulary_words(engine)
    rows = []
    for name, docs in (("bbc-news", args.bbc_docs), ("rotten-tomatoes", args.rt_docs)):
        for strategy in strategies if docs else ():
            rows += measure(engine, name, docs, args.max_chars, args.seed, words, strategy)
            print(f"{name}: {docs} documents read ({strategy})", flush=True)
    head = ("dataset", "correction", "accuracy", "macro-F1", "same answer, reversed order", "cost")
    print("\n" + table(head, rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
