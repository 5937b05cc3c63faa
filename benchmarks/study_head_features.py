"""Which hidden states a few-label head should read (issue 46, the design study before the head is built).

For each labelled document, the prompt pcd builds for a one-field topic schema is run through the embedded model once
(``output_hidden_states``) up to the field's key (``"topic":``), and candidate features are read from that one pass:
a layer's state at the answer position (the key's last token, where pcd reads the value's first token), a layer's
mean over the document's tokens, and concatenations. A logistic regression (scikit-learn, standardized features) is
fitted on ``k`` examples per label and scored on every other document, over several seeded draws; the table gives
the mean held-out accuracy and its spread for each feature set, beside the model's own zero-shot reading of the same
pass (the answer position's distribution over the labels' first tokens) for scale.

    .venv/bin/python benchmarks/study_head_features.py --docs 300 --max-chars 600 --draws 5
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import labelled_arguments  # noqa: E402
from pcd_engine import Engine  # noqa: E402
from pcd_engine.prompt.chat_prompt import ChatPrompt  # noqa: E402
from pcd_engine.tools.datasets import load_dataset  # noqa: E402
from pcd_engine.tools.eval import eval_schema  # noqa: E402

DATASETS = {"bbc-news": ("topic", "The section of the news site"), "rotten-tomatoes": ("verdict", "The review")}


def hidden_states(engine: Engine, texts: list[str], field: str, labels: list[str], description: str) -> dict:
    """Per document: every layer's state at the answer position, every layer's mean over the document, and the
    model's own zero-shot label (the answer position's best label by its first token)."""
    import torch

    schema = eval_schema(field, labels, description=description)
    view = engine.tokenizer  # already a TokenizerView
    prompt = ChatPrompt.build(view, schema)
    model = engine.backend.model
    firsts = [view.encode(f' "{label}"')[0] for label in labels]
    answer, pooled, zero_shot = [], [], []
    for text in texts:
        start = len(view.encode(prompt.prefix_text))
        end = len(view.encode(prompt.prefix_text + text))
        ids = view.encode(prompt.prefix_text + text + prompt.suffix_text + f'\n  "{field}":')
        with torch.inference_mode():
            out = model(input_ids=torch.tensor([ids]), output_hidden_states=True)
        states = [h[0].float().numpy() for h in out.hidden_states]
        answer.append(np.stack([s[-1] for s in states]))
        pooled.append(np.stack([s[start:end].mean(axis=0) for s in states]))
        zero_shot.append(int(np.argmax(out.logits[0, -1].float().numpy()[firsts])))
    return {"answer": np.stack(answer), "pooled": np.stack(pooled), "zero_shot": np.array(zero_shot)}


def accuracy(features: np.ndarray, gold: np.ndarray, per_label: int, draws: int) -> tuple[float, float]:
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    scores = []
    for seed in range(draws):
        rng = random.Random(seed)
        train = []
        for label in sorted(set(gold.tolist())):
            members = [i for i in range(len(gold)) if gold[i] == label]
            train += rng.sample(members, min(per_label, len(members) - 1))
        test = [i for i in range(len(gold)) if i not in set(train)]
        head = make_pipeline(StandardScaler(), LogisticRegression(C=0.1, max_iter=2000))
        head.fit(features[train], gold[train])
        scores.append(float((head.predict(features[test]) == gold[test]).mean()))
    return statistics.mean(scores) * 100, (statistics.stdev(scores) * 100 if len(scores) > 1 else 0.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    labelled_arguments(parser, DATASETS)
    args = parser.parse_args()
    engine = Engine.load()
    layers = engine.backend.model.config.num_hidden_layers
    middle, late = layers // 2, (2 * layers) // 3
    for name in args.datasets:
        field, description = DATASETS[name]
        data = list(load_dataset(name))
        random.Random(0).shuffle(data)
        data = data[: args.docs]
        labels = sorted({d.label for d in data})
        gold = np.array([labels.index(d.label) for d in data])
        tick = time.perf_counter()
        got = hidden_states(engine, [d.text[: args.max_chars] for d in data], field, labels, description)
        seconds = time.perf_counter() - tick
        answer, pooled = got["answer"], got["pooled"]
        candidates = {
            f"answer position, last layer ({layers})": answer[:, layers],
            f"answer position, layer {late}": answer[:, late],
            f"answer position, layer {middle}": answer[:, middle],
            f"document mean, layer {middle}": pooled[:, middle],
            f"document mean, layer {late}": pooled[:, late],
            f"answer last + document mean {middle} (issue's choice)": np.hstack([answer[:, layers], pooled[:, middle]]),
            f"answer {late} + document mean {middle}": np.hstack([answer[:, late], pooled[:, middle]]),
        }
        zero = float((got["zero_shot"] == gold).mean()) * 100
        print(f"\n## {name}: {len(data)} documents, {len(labels)} labels, first {args.max_chars} characters")
        print(f"model's own zero-shot reading of the same pass: {zero:.1f}%; features read in {seconds:.1f} s")
        shots = (2, 5, 10, 20) if len(labels) > 2 else (5, 10, 20, 50)
        print("| features | " + " | ".join(f"{k} per label" for k in shots) + " |")
        print("|---|" + "---|" * len(shots))
        for title, features in candidates.items():
            cells = [accuracy(features, gold, k, args.draws) for k in shots]
            print(f"| {title} | " + " | ".join(f"{m:.1f} ± {s:.1f}" for m, s in cells) + " |", flush=True)


if __name__ == "__main__":
    main()
