"""Knowing when to trust a decision (issue 58): calibration, thresholds with intervals and prediction sets, measured
on held-out documents.

For each dataset, ``--docs`` documents (first ``--max-chars`` characters) are decided once by the embedded model with
pcd's own passes (``Engine.read_features``: the default correction's distribution and the features a head reads). For
each number of labelled examples per label and each seeded draw, a head is fitted on the drawn examples exactly as
``Head.fit`` fits it (``fit_scaled_head``: a temperature fitted on its own held-out folds, whose evidence it keeps),
the zero-shot default is given the same examples as its evidence (it is fitted on none of them, so its readings
of them are held out), and a calibration is fitted as ``Calibrator.fit(method="em", examples=...)`` fits it on the
other documents (unlabelled) and the drawn examples, keeping the examples' held-out evidence. Then, on every other
document:

- ECE of the head before and after its temperature (and the default's);
- for each target accuracy, the threshold chosen on the examples (``choose_threshold``), the coverage and the
  accuracy it had there with its 95% bootstrap interval, and the coverage and accuracy realised on the held-out
  documents, and in how many draws the realised accuracy fell inside the interval;
- 90% prediction sets (split conformal on the same evidence, ``set_cutoff``): held-out coverage and mean size.

Then, on ``--order-docs`` BBC articles with default options, the label-order ensemble (``label_orders``): accuracy,
how many answers change when the labels are listed reversed or shifted, and the cost per document.

    .venv/bin/python benchmarks/bench_trust.py --docs 400 --max-chars 600 --draws 5
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

from benchmarks.bench_heads import draw  # noqa: E402
from benchmarks.common import labelled_arguments  # noqa: E402
from pcd_engine import Calibrator, Engine, compile_schema  # noqa: E402
from pcd_engine.calibrate.examples import example_priors, held_out_evidence  # noqa: E402
from pcd_engine.heads.fields import fit_scaled_head  # noqa: E402
from pcd_engine.heads.gates import scores  # noqa: E402
from pcd_engine.heads.thresholds import choose_threshold, prediction_set, set_cutoff  # noqa: E402
from pcd_engine.run.orders import reordered  # noqa: E402
from pcd_engine.tools.datasets import load_dataset  # noqa: E402
from pcd_engine.tools.eval import eval_schema  # noqa: E402

DATASETS = {
    "bbc-news": ("topic", "The section of the news site", (10, 50)),
    "rotten-tomatoes": ("verdict", "The review", (10, 50)),
}
TARGETS = (0.70, 0.90, 0.95)
READERS = ("zero-shot default", "calibration with examples", "head")
LEVEL = 0.9


def evidence(distributions: np.ndarray, gold: np.ndarray) -> list[tuple[float, float]]:
    """Per example, the decided label's probability and the true label's."""
    return [(float(p.max()), float(p[g])) for p, g in zip(distributions, gold, strict=True)]


def realised(test: np.ndarray, gold: np.ndarray, threshold: float) -> tuple[float, float]:
    """Coverage and accuracy on held-out documents when answering only where the probability reaches ``threshold``."""
    kept = test.max(axis=1) >= threshold
    if not kept.any():
        return 0.0, float("nan")
    return float(kept.mean()), float((test[kept].argmax(axis=1) == gold[kept]).mean())


def set_scores(test: np.ndarray, gold: np.ndarray, cutoff: float) -> tuple[float, float]:
    """Held-out coverage and mean size of the prediction sets at ``cutoff``."""
    labels = list(range(test.shape[1]))
    sets = [prediction_set(labels, p.tolist(), cutoff) for p in test]
    return float(np.mean([g in s for g, s in zip(gold, sets, strict=True)])), float(np.mean([len(s) for s in sets]))


def calibrated(raw: np.ndarray, gold: np.ndarray, labels: list[str], train: list, test: list) -> tuple:
    """A calibration fitted as ``Calibrator.fit(method="em", examples=...)`` fits it: the lean on the other
    documents' and the examples' own readings, the prior from the examples' labels; its held-out distributions and
    the examples' evidence (each under the prior of the other examples' labels)."""
    schema = compile_schema(eval_schema("f", labels))
    tally, given = [int((gold[train] == k).sum()) for k in range(len(labels))], [[int(g)] for g in gold[train]]
    prior = example_priors(schema.fields, {"f": (tally, list(given))})["f"]
    rows = np.concatenate([raw[test], raw[train]]).tolist()
    cal = Calibrator.from_distributions(schema, {"f": rows}, model="m", method="em", priors={"f": prior})
    field = cal.field("f")
    held = held_out_evidence(field.bias, tally, given, raw[train].tolist())
    return np.array([field.correct(r) for r in raw[test]]), list(held)


def readers(x: np.ndarray, raw: np.ndarray, default: np.ndarray, gold: np.ndarray, labels: list[str], k: int,
            seed: int) -> dict:  # fmt: skip
    """Each reader's held-out distributions (scaled, and the head's unscaled) and its evidence on the examples."""
    train, test = draw(gold, k, seed)
    head, _ = fit_scaled_head("f", labels, x[train].tolist(), gold[train].tolist(), seed=seed)
    plain = replace(head, temperature=1.0)
    return {
        "test": test,
        "head": (np.array([head.probabilities(r) for r in x[test]]), list(head.held_out)),
        "head, unscaled": (np.array([plain.probabilities(r) for r in x[test]]), None),
        "zero-shot default": (default[test], evidence(default[train], gold[train])),
        "calibration with examples": calibrated(raw, gold, labels, list(train), list(test)),
    }


def read(engine: Engine | None, name: str, docs: int, max_chars: int, cache: Path | None) -> tuple:
    """The documents' features, the model's own and the default distributions, gold label indices and labels (kept
    in ``cache`` when given, to rerun the tables without the model)."""
    field, description, _ = DATASETS[name]
    kept = None if cache is None else cache / f"trust2-{name}-{docs}-{max_chars}.npz"
    data = list(load_dataset(name))
    random.Random(0).shuffle(data)
    data = data[:docs]
    labels = sorted({d.label for d in data})
    if kept is not None and kept.exists():
        saved = np.load(kept)
        return saved["x"], saved["raw"], saved["default"], saved["gold"], labels
    schema = eval_schema(field, labels, description=description)
    rows = (engine or Engine.load()).read_features([d.text[:max_chars] for d in data], schema)
    x = np.array([features[field] for _, features in rows])
    default = np.array([results[field].label_distribution for results, _ in rows])
    raw = np.array([results[field].raw_distribution or results[field].label_distribution for results, _ in rows])
    gold = np.array([labels.index(d.label) for d in data])
    if kept is not None:
        kept.parent.mkdir(parents=True, exist_ok=True)
        np.savez(kept, x=x, raw=raw, default=default, gold=gold)
    return x, raw, default, gold, labels


def threshold_row(runs: dict, reader: str, k: int, target: float, gold: np.ndarray, draws: int) -> str:
    """One row of the thresholds table: the threshold chosen on each draw's examples, and what it does held out."""
    field = "f"
    got = []
    for s in range(draws):
        run = runs[k, s]
        t = choose_threshold(field, run[reader][1], accuracy=target, seed=s)
        if t.reached:
            got.append((t, *realised(run[reader][0], gold[run["test"]], t.probability)))
    cells = [reader, str(k), f"{target:.0%}", f"{len(got)}/{draws}"]
    if not got:
        return "| " + " | ".join(cells + ["-"] * 6) + " |"
    accs = [a for _, _, a in got if a == a]
    inside = sum(t.interval[0] <= a <= t.interval[1] for t, _, a in got)
    low, high = (statistics.mean(t.interval[i] for t, _, _ in got) * 100 for i in (0, 1))
    cells += [f"{statistics.mean(t.probability for t, _, _ in got):.2f}",
              f"{statistics.mean(t.coverage for t, _, _ in got) * 100:.1f}%",
              f"{statistics.mean(t.achieved for t, _, _ in got) * 100:.1f}% [{low:.1f}, {high:.1f}]",
              f"{statistics.mean(c for _, c, _ in got) * 100:.1f}%",
              f"{statistics.mean(accs) * 100:.1f}%" if accs else "-", f"{inside}/{len(got)}"]  # fmt: skip
    return "| " + " | ".join(cells) + " |"


def dataset_tables(name: str, docs: int, max_chars: int, draws: int, cache: Path | None) -> None:
    field, _, shots = DATASETS[name]
    tick = time.perf_counter()
    x, raw, default, gold, labels = read(None, name, docs, max_chars, cache)
    print(f"\n## {name}: {len(gold)} documents, {len(labels)} labels, first {max_chars} characters, {draws} draws "
          f"(read in {time.perf_counter() - tick:.0f} s)")  # fmt: skip
    runs = {(k, seed): readers(x, raw, default, gold, labels, k, seed) for k in shots for seed in range(draws)}
    print("\nheld-out accuracy and ECE, %, mean of the draws")
    print("| reader | " + " | ".join(f"{k} per label: accuracy / ECE" for k in shots) + " |")
    print("|---|" + "---|" * len(shots))
    for reader in ("zero-shot default", "calibration with examples", "head, unscaled", "head"):
        cells = []
        for k in shots:
            got = [scores(runs[k, s][reader][0], gold[runs[k, s]["test"]]) for s in range(draws)]
            cells.append(f"{statistics.mean(g.accuracy for g in got) * 100:.1f} / "
                         f"{statistics.mean(g.ece for g in got) * 100:.1f}")  # fmt: skip
        print(f"| {reader} | " + " | ".join(cells) + " |")
    print(
        "\nthresholds chosen on the examples, then held out: means over the draws whose examples reached the target "
        "('reached'); 'inside': of those, the draws whose held-out accuracy fell inside the examples' 95% interval"
    )
    print("| reader | per label | target | reached | threshold | coverage on examples | accuracy on examples "
          "[interval] | coverage held out | accuracy held out | inside |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|")
    for reader in READERS:
        for k in shots:
            for target in TARGETS:
                print(threshold_row(runs, reader, k, target, gold, draws))
    print(f"\n{LEVEL:.0%} prediction sets (split conformal on the examples' evidence), held out, mean of the draws")
    print("| reader | per label | coverage | mean size | per draw coverage |")
    print("|---|---|---|---|---|")
    for reader in READERS:
        for k in shots:
            got = []
            for s in range(draws):
                run = runs[k, s]
                got.append(set_scores(run[reader][0], gold[run["test"]], set_cutoff(run[reader][1], LEVEL)))
            print(
                f"| {reader} | {k} | {statistics.mean(c for c, _ in got) * 100:.1f}% | "
                f"{statistics.mean(n for _, n in got):.2f} | {', '.join(f'{c * 100:.0f}' for c, _ in got)} |"
            )


def auroc(positive: Sequence[float], negative: Sequence[float]) -> float:
    """The chance that a positive scores above a negative (ties count half): the area under the ROC curve."""
    wins = sum((p > n) + 0.5 * (p == n) for p in positive for n in negative)
    return wins / (len(positive) * len(negative))


def head_scope(x: np.ndarray, gold: np.ndarray, left: int, *, per_label: int = 10, draws: int = 5) -> float:
    """AUROC of a head's low probability for telling documents of label ``left`` (left out of its fit) from the
    held-out documents of the labels it was fitted on, mean over seeded draws."""
    kept = [k for k in sorted(set(gold.tolist())) if k != left]
    inside = np.array([g in kept for g in gold])
    index = {k: i for i, k in enumerate(kept)}
    scores = []
    for seed in range(draws):
        train, test = draw(np.where(inside, gold, -1), per_label, seed)
        train = [i for i in train if inside[i]]
        head, _ = fit_scaled_head("f", kept, x[train].tolist(), [index[g] for g in gold[train]], seed=seed)
        low = {i: 1 - max(head.probabilities(x[i])) for i in test}
        scores.append(auroc([low[i] for i in test if not inside[i]], [low[i] for i in test if inside[i]]))
    return statistics.mean(scores)


def scope_table(name: str, per_label: int, max_chars: int, cached: tuple | None = None) -> None:
    """'None of these': for each label left out of the schema, how well its documents (whose true answer is not
    among the labels) are told from the others by a low probability of the answer, by a low mass on the allowed
    labels, and by an explicit "none of these" label decided with the others (and, given ``cached`` features and gold
    labels, by a head's low probability). Default options."""
    field, description, _ = DATASETS[name]
    data = list(load_dataset(name))
    random.Random(2).shuffle(data)
    labels = sorted({d.label for d in data})
    chosen = [d for label in labels for d in [x for x in data if x.label == label][:per_label]]
    texts = [d.text[:max_chars] for d in chosen]
    engine = Engine.load()
    rows = []
    for left in labels:
        kept = [label for label in labels if label != left]
        out = [d.label == left for d in chosen]
        plain = engine.extract_many(texts, eval_schema(field, kept, description=description))
        explicit = engine.extract_many(texts, eval_schema(field, [*kept, "none of these"], description=description))
        probability = [1 - r.fields[field].probability for r in plain]
        mass = [1 - (r.fields[field].candidate_mass or 0.0) for r in plain]
        said = [r.values[field] == "none of these" for r in explicit]
        flagged = [s for s, o in zip(said, out, strict=True) if o]
        alarms = [s for s, o in zip(said, out, strict=True) if not o]
        split = [(score, o) for score, o in zip(probability, out, strict=True)]
        by_head = float("nan") if cached is None else head_scope(cached[0], cached[1], labels.index(left))
        rows.append((left, auroc([a for a, o in split if o], [a for a, o in split if not o]),
                     auroc([m for m, o in zip(mass, out, strict=True) if o],
                           [m for m, o in zip(mass, out, strict=True) if not o]),
                     sum(flagged) / len(flagged), sum(alarms) / len(alarms), by_head))  # fmt: skip
    print(f"\n## {name}: 'none of these', {per_label} documents per label, each label left out in turn")
    print(
        "| left out | AUROC: low probability | AUROC: low label mass | explicit label: out-of-scope caught | "
        "explicit label: in-scope wrongly caught | AUROC: a head's low probability (10 per kept label) |"
    )
    print("|---|---|---|---|---|---|")
    for left, by_p, by_mass, caught, wrong, by_head in rows:
        print(f"| {left} | {by_p:.2f} | {by_mass:.2f} | {caught:.0%} | {wrong:.0%} | {by_head:.2f} |")
    means = [statistics.mean(r[i] for r in rows) for i in range(1, 6)]
    print(f"| mean | {means[0]:.2f} | {means[1]:.2f} | {means[2]:.0%} | {means[3]:.0%} | {means[4]:.2f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    labelled_arguments(parser, DATASETS)
    parser.add_argument("--cache", type=Path, default=None, help="keep the features read here, to rerun the tables")
    parser.add_argument("--order-docs", type=int, default=100, help="documents for the label-order table (0: none)")
    parser.add_argument("--orders", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument(
        "--scope-per-label", type=int, default=20, help="documents per label, 'none of these' (0: none)"
    )
    args = parser.parse_args()
    for name in args.datasets:
        dataset_tables(name, args.docs, args.max_chars, args.draws, args.cache)
    if args.order_docs:
        order_table("bbc-news", args.order_docs, args.max_chars, args.orders)
    if args.scope_per_label:
        read_once = read(None, "bbc-news", args.docs, args.max_chars, args.cache) if args.cache else None
        heads = None if read_once is None else (read_once[0], read_once[3])  # features and gold labels
        scope_table("bbc-news", args.scope_per_label, args.max_chars, heads)


def order_table(name: str, docs: int, max_chars: int, counts: Sequence[int]) -> None:
    """The label-order ensemble: accuracy, the flip rate between the schema's order and two others (its reverse, and
    the labels shifted by two), and the cost, for each number of orders. Default options (the default correction)."""
    field, description, _ = DATASETS[name]
    data = list(load_dataset(name))
    random.Random(1).shuffle(data)
    data = data[:docs]
    labels = sorted({d.label for d in data})
    schema = compile_schema(eval_schema(field, labels, description=description))
    others = {"reversed": reordered(schema, (True, 0)), "shifted by 2": reordered(schema, (False, 2))}
    texts = [d.text[:max_chars] for d in data]
    engine = Engine.load()
    engine.extract_many(texts[:2], schema)  # warm the preamble cache
    print(f"\n## {name}: label orders, {len(texts)} documents, first {max_chars} characters, default options")
    print("| orders | accuracy | flips against reversed | flips against shifted by 2 | ms per document | "
          "passes per document |")  # fmt: skip
    print("|---|---|---|---|---|---|")
    for count in counts:
        tick = time.perf_counter()
        own = engine.extract_many(texts, schema, label_orders=count)
        ms = (time.perf_counter() - tick) * 1000 / len(texts)
        passes = statistics.mean(r.stats.forward_passes for r in own)
        answers = [r.values[field] for r in own]
        flips = []
        for variant in others.values():
            got = [r.values[field] for r in engine.extract_many(texts, variant, label_orders=count)]
            flips.append(sum(a != b for a, b in zip(answers, got, strict=True)) / len(texts))
        accuracy = sum(a == d.label for a, d in zip(answers, data, strict=True)) / len(texts)
        print(f"| {count} | {accuracy:.1%} | {flips[0]:.1%} | {flips[1]:.1%} | {ms:.0f} | {passes:.1f} |")


if __name__ == "__main__":
    main()
