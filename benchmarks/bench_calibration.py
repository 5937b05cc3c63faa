"""Calibration on BBC News with the embedded model: accuracy, macro-F1, label-order robustness and cost.

Three readings of BBC News (``--docs`` documents each): the evaluated sample (``--seed``), a disjoint sample to fit
an inductive calibration on, and the evaluated sample again with the labels listed in reverse order. Each reading
takes every document's full label distribution (``staging="one_pass"``, ``strategy="exact"``, as a calibrated call
and a fit read them); the calibrators are built from those distributions (what ``Calibrator.fit`` does) and the
decisions are their argmax, corrected or not: what ``extract(..., calibration=...)`` decides on this one-field
schema, which the script checks on 20 documents against the real call.

Tables:

* accuracy and macro-F1: pcd as it is, calibrated transductively (fitted on the evaluated texts, labels unused)
  and inductively (fitted on the other sample), for each method (mean, em);
* the order effect: the share of documents whose answer is the same with the labels in schema order and in
  reverse order, and how often the first-listed label is chosen, before and after calibration (each order
  fitted on its own prompt, transductively);
* the cost: the mean ms per document of an extraction with and without a calibration (same reading), and of
  fitting, per document and for ``--fit-docs`` documents.

Usage::

    python benchmarks/bench_calibration.py --docs 200 --fit-docs 1000
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pcd_engine import Calibrator, Engine  # noqa: E402
from pcd_engine.tools.datasets import classification_metrics, load_dataset  # noqa: E402
from pcd_engine.tools.eval import eval_schema  # noqa: E402
from pcd_engine.tools.terminal import table, versions  # noqa: E402

WHOLE = {"strategy": "exact", "staging": "one_pass"}


def distributions(engine, texts, schema):
    """Each document's distribution over the labels, read whole (what a fit collects), and ms per document."""
    started = time.perf_counter()
    outs = engine.extract_many(texts, schema, **WHOLE)
    return [o.fields["topic"].label_distribution for o in outs], (time.perf_counter() - started) * 1000 / len(texts)


def argmax(row) -> int:
    return max(range(len(row)), key=lambda i: (row[i], -i))


def decisions(rows, schema, calibration=None):
    """The decided labels: the argmax of each distribution, corrected first with ``calibration`` (what
    ``extract(..., calibration=...)`` decides on a one-field schema; checked against it on a sample)."""
    values = [label.value for label in schema.field("topic").labels]
    prior = None if calibration is None else calibration.field("topic")
    return [values[argmax(row if prior is None else prior.correct(row))] for row in rows]


def time_fit(args) -> int:
    """Time ``Calibrator.fit`` on ``--fit-docs`` articles (seed + 2), with its per-chunk progress."""
    everything = load_dataset("bbc-news")
    sample = random.Random(args.seed + 2).sample(everything, min(args.fit_docs, len(everything)))
    texts = [d.text[: args.max_chars] for d in sample]
    engine = Engine.load(args.model, backend="torch")
    schema = eval_schema("topic", [d.label for d in everything])
    engine.extract(texts[0], schema, **WHOLE)
    print(f"model: {args.model or 'default'}; {versions()}")
    started = time.perf_counter()
    cal = Calibrator.fit(engine, texts, schema, method="em", options=WHOLE, progress=lambda s: print(s, flush=True))
    total = time.perf_counter() - started
    print(table(("cost", "value"), [
        (f"Calibrator.fit on {cal.documents} articles (s)", f"{total:.1f}"),
        ("per article (ms)", f"{total * 1000 / cal.documents:.0f}"),
    ]))  # fmt: skip
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--docs", type=int, default=200)
    parser.add_argument("--fit-docs", type=int, default=1000, help="documents for the fitting-cost line")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-chars", type=int, default=None, help="cut each article (default: whole)")
    parser.add_argument("--model", default=None)
    parser.add_argument("--only-fit", action="store_true", help="only time Calibrator.fit on --fit-docs documents")
    args = parser.parse_args()
    if args.only_fit:
        return time_fit(args)

    everything = load_dataset("bbc-news")
    docs = load_dataset("bbc-news", limit=args.docs, seed=args.seed)
    seen = {d.text for d in docs}
    held = random.Random(args.seed + 1).sample([d for d in everything if d.text not in seen], args.docs)
    cut = args.max_chars

    def texts(sample):
        return [d.text[:cut] for d in sample]

    gold = [d.label for d in docs]
    labels = sorted(set(gold))
    forward = eval_schema("topic", gold)
    backward = eval_schema("topic", gold, schema={"topic": {"type": "enum", "choices": labels[::-1]}})
    engine = Engine.load(args.model, backend="torch")
    engine.extract(docs[0].text[:cut], forward, **WHOLE)
    print(f"model: {args.model or 'default'}; {len(docs)} evaluated documents (seed {args.seed}), {len(held)} held out")
    print(versions() + "\n")

    rows_fwd, read_ms = distributions(engine, texts(docs), forward)
    rows_held, _ = distributions(engine, texts(held), forward)
    rows_bwd, _ = distributions(engine, texts(docs), backward)

    def fit(schema, rows, method):
        return Calibrator.from_distributions(schema, {"topic": rows}, model=engine.model_id, method=method)

    raw = decisions(rows_fwd, forward)
    scores = [("pcd", raw)]
    for method in ("mean", "em"):
        scores.append(
            (f"pcd calibrated, {method}, transductive", decisions(rows_fwd, forward, fit(forward, rows_fwd, method)))
        )
        scores.append(
            (f"pcd calibrated, {method}, inductive", decisions(rows_fwd, forward, fit(forward, rows_held, method)))
        )
    rows = []
    for name, got in scores:
        m = classification_metrics(gold, got, labels=labels)
        rows.append((name, f"{m.accuracy:.1%}", f"{m.macro_f1:.3f}"))
    print(table(("method", "accuracy", "macro-F1"), rows) + "\n")

    order_rows = []
    for method in (None, "mean", "em"):
        fwd = decisions(rows_fwd, forward, None if method is None else fit(forward, rows_fwd, method))
        bwd = decisions(rows_bwd, backward, None if method is None else fit(backward, rows_bwd, method))
        order_rows.append(
            (
                "pcd" if method is None else f"pcd calibrated, {method}, transductive",
                f"{statistics.fmean(a == b for a, b in zip(fwd, bwd, strict=True)):.1%}",
                f"{fwd.count(labels[0])} ({labels[0]})",
                f"{bwd.count(labels[-1])} ({labels[-1]})",
            )
        )
    head = ("method", "same answer, reversed order", "first label chosen, schema order", "first label, reversed")
    print(table(head, order_rows) + "\n")

    # The shortcut above equals extract(..., calibration=...) itself (checked here on a sample), and the cost.
    cal = fit(forward, rows_fwd, "em")
    sample = texts(docs[:20])
    direct = [str(o.values["topic"]) for o in engine.extract_many(sample, forward, calibration=cal)]
    assert direct == decisions(rows_fwd[:20], forward, cal), "the shortcut differs from extract(calibration=...)"
    plain_ms, calibrated_ms = [], []
    for _ in range(3):
        for runs, given in ((plain_ms, None), (calibrated_ms, cal)):
            started = time.perf_counter()
            engine.extract_many(sample, forward, calibration=given, **WHOLE)
            runs.append((time.perf_counter() - started) * 1000 / len(sample))
    fit_sample = random.Random(args.seed + 2).sample(everything, min(args.fit_docs, len(everything)))
    started = time.perf_counter()
    Calibrator.fit(engine, texts(fit_sample), forward, method="em", options=WHOLE)
    fit_total = time.perf_counter() - started
    cost = [
        ("reading the evaluated documents whole (ms / doc)", f"{read_ms:.1f}"),
        (
            f"extraction of {len(sample)} documents, no calibration (ms / doc, median of 3)",
            f"{statistics.median(plain_ms):.1f}",
        ),
        ("the same, calibrated (ms / doc, median of 3)", f"{statistics.median(calibrated_ms):.1f}"),
        ("ratio calibrated / not", f"{statistics.median(calibrated_ms) / statistics.median(plain_ms):.3f}"),
        (f"Calibrator.fit on {len(fit_sample)} documents (s)", f"{fit_total:.1f}"),
    ]
    print(table(("cost", "value"), cost))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
