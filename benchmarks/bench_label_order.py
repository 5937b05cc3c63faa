"""The label-order effect with the embedded model: on every example preset, and on BBC News with the remedies.

Part 1, every example preset: its context read with each enum field's labels in schema order, reversed, and in two
seeded shuffles (every other field as it is; ``anchor=False`` so every field reads the same prompt). For each
reordering: the share of enum fields whose answer stays the same, and the mean total-variation distance between the
two label distributions (put back in schema order). One text per preset, so these are counts over its fields.

Part 2, BBC News (``--docs`` articles, cut to ``--max-chars``): the topic field read with the labels in sorted
order and in reverse order, each also in its five cyclic shifts (every label once in every position). Four ways to
decide, each measured with both base orders:

* pcd as it is (one order);
* calibrated: EM prior correction fitted on the same texts (transductive, as ``pcd eval --calibrate`` reports);
* permutation-averaged: the mean of the five shifts' distributions (five heads, five times the scoring work);
* both: the averaged distributions, then calibrated.

For each: accuracy, macro-F1, the share of articles with the same answer under reversed base order, and the cost
in readings of the document. Reading the whole distribution is what a calibrated call does
(``strategy="exact"``, ``staging="one_pass"``).

Usage::

    python benchmarks/bench_label_order.py --docs 100 --max-chars 600
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pcd_engine import Engine  # noqa: E402
from pcd_engine.calibrate.calibrator import em_bias, reweight  # noqa: E402
from pcd_engine.schema.presets import load_preset  # noqa: E402
from pcd_engine.tools.datasets import classification_metrics, load_dataset  # noqa: E402
from pcd_engine.tools.eval import eval_schema  # noqa: E402
from pcd_engine.tools.examples import EXAMPLE_PRESETS, example_preset_path  # noqa: E402
from pcd_engine.tools.terminal import table, versions  # noqa: E402

WHOLE = {"strategy": "exact", "staging": "one_pass", "anchor": False}


def argmax(row) -> int:
    return max(range(len(row)), key=lambda i: (row[i], -i))


def in_order(distribution, listed, canonical):
    """``distribution`` over ``listed`` labels, re-indexed to ``canonical`` order."""
    at = {label: p for label, p in zip(listed, distribution, strict=True)}
    return [at[label] for label in canonical]


def reordered_preset(raw: dict, how: str, seed: int) -> dict:
    """The preset with each enum field's choices reversed or shuffled."""
    data = json.loads(json.dumps(raw))
    rng = random.Random(seed)
    for spec in data["schema"].values():
        choices = spec.get("choices")
        if spec.get("type") == "enum" and choices and len(choices) > 1:
            if how == "reversed":
                spec["choices"] = choices[::-1]
            else:
                rng.shuffle(choices)
    return data


def preset_order_effect(engine: Engine) -> list[tuple]:
    rows = []
    for name in EXAMPLE_PRESETS:
        raw = json.loads(example_preset_path(name).read_text())
        base = load_preset(raw)
        enums = [f for f in base.schema.fields if f.kind == "enum" and len(f.labels) > 1]
        first = engine.extract(base.context, base.schema, **WHOLE)
        line = [name, len(enums)]
        for how, seed in (("reversed", 0), ("shuffled", 1), ("shuffled", 2)):
            other = load_preset(reordered_preset(raw, how, seed))
            again = engine.extract(base.context, other.schema, **WHOLE)
            same, distance = 0, []
            for spec in enums:
                canonical = [label.value for label in spec.labels]
                listed = [label.value for label in other.schema.field(spec.name).labels]
                a = first.fields[spec.name].label_distribution
                b = in_order(again.fields[spec.name].label_distribution, listed, canonical)
                same += first.values[spec.name] == again.values[spec.name]
                distance.append(0.5 * sum(abs(x - y) for x, y in zip(a, b, strict=True)))
            line.append(f"{same}/{len(enums)} ({statistics.fmean(distance):.2f})")
        rows.append(tuple(line))
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--docs", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-chars", type=int, default=600)
    parser.add_argument("--model", default=None)
    parser.add_argument("--skip-presets", action="store_true")
    args = parser.parse_args()

    engine = Engine.load(args.model, backend="torch")
    print(f"model: {args.model or 'default'}; backend torch; {versions()}\n")
    if not args.skip_presets:
        head = ("preset", "enum fields", "same answer, reversed (mean TV)", "shuffle 1", "shuffle 2")
        print("Part 1: the order effect on every example preset (its own context)\n")
        print(table(head, preset_order_effect(engine)) + "\n")

    docs = load_dataset("bbc-news", limit=args.docs, seed=args.seed)
    texts = [d.text[: args.max_chars] for d in docs]
    gold = [d.label for d in docs]
    labels = sorted(set(gold))
    k = len(labels)

    def read(order):
        schema = eval_schema("topic", gold, schema={"topic": {"type": "enum", "choices": order}})
        started = time.perf_counter()
        outs = engine.extract_many(texts, schema, **WHOLE)
        ms = (time.perf_counter() - started) * 1000 / len(texts)
        return [in_order(o.fields["topic"].label_distribution, order, labels) for o in outs], ms

    families, ms = {}, []
    for base_name, base in (("sorted", labels), ("reversed", labels[::-1])):
        family = []
        for shift in range(k):
            rows, each = read(base[shift:] + base[:shift])
            family.append(rows)
            ms.append(each)
        families[base_name] = family

    def decide(rows, calibrate: bool):
        if calibrate:
            bias = em_bias(rows)
            rows = [reweight(r, [1 / b for b in bias]) for r in rows]
        return [labels[argmax(r)] for r in rows]

    def averaged(family):
        return [[statistics.fmean(col) for col in zip(*per_doc, strict=True)] for per_doc in zip(*family, strict=True)]

    methods = {
        "pcd": (lambda f: f[0], False, 1),
        "calibrated (em, transductive)": (lambda f: f[0], True, 1),
        f"permutation-averaged ({k} cyclic orders)": (averaged, False, k),
        f"permutation-averaged ({k}) + calibrated": (averaged, True, k),
    }
    out = []
    for name, (rows_of, calibrate, readings) in methods.items():
        fwd = decide(rows_of(families["sorted"]), calibrate)
        bwd = decide(rows_of(families["reversed"]), calibrate)
        m = classification_metrics(gold, fwd, labels=labels)
        agree = statistics.fmean(a == b for a, b in zip(fwd, bwd, strict=True))
        cost = f"{readings}x ({readings * statistics.fmean(ms):.0f} ms/doc)"
        out.append((name, f"{m.accuracy:.1%}", f"{m.macro_f1:.3f}", f"{agree:.1%}", cost))
    print(f"Part 2: BBC News, {len(docs)} articles (seed {args.seed}), first {args.max_chars} characters\n")
    print(table(("method", "accuracy", "macro-F1", "same answer, reversed order", "cost"), out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
