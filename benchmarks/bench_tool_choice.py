"""The tool choice's default correction (issue 48): would dividing the model's content-free lean out of "which
tool, or answer" make a reader that is right wrong?

Three ways to decide the choice, as :func:`pcd_engine.tool_calls.decide_tools` computes them:

* **own**: the model's own distribution (``correction="none"``);
* **always**: the content-free lean divided out whatever it is (``correction="auto"`` named in the options);
* **default**: the engine's default, which divides the lean out only when it leans to calling
  (:func:`pcd_engine.tool_calls.leans_to_calling`: the model, asked nothing, would call a tool); a model that
  answers a turn that says nothing keeps its own choice.

Part 1, readers whose posteriors are known (simulated, so that a capable reader can be measured without its
weights): four options (answer and three tools); a turn's true option gets a logit boost over Gaussian noise
(capable: +4, weak: +1); the content-free reading is the reader's own on a turn that asks nothing (answering
is right there: a boost of +3 on answer for a capable reader, none for a weak one), and every reading is
multiplied by the reader's planted lean (none; x4 towards the first tool; x8 towards answering). Turns come
balanced, 80% answers, or 80% calls of the first tool. Part 2, the embedded model on eight conversations
(greetings, asks that need a tool, turns after a tool's result), each read the three ways.

Usage::

    python benchmarks/bench_tool_choice.py --turns 4000
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pcd_engine.tools.terminal import table, versions  # noqa: E402

OPTIONS = ["answer", "tool_a", "tool_b", "tool_c"]
READERS = {  # name: (boost of the true option, content-free boost of answer, planted lean)
    "capable, no lean": (4.0, 3.0, [1, 1, 1, 1]),
    "capable, x4 towards tool_a": (4.0, 3.0, [1, 4, 1, 1]),
    "capable, x8 towards answering": (4.0, 3.0, [8, 1, 1, 1]),
    "weak, x4 towards tool_a": (1.0, 0.0, [1, 4, 1, 1]),
}
MIXES = {"balanced": [0.25, 0.25, 0.25, 0.25], "80% answers": [0.8, 0.2 / 3, 0.2 / 3, 0.2 / 3],
         "80% tool_a": [0.2 / 3, 0.8, 0.2 / 3, 0.2 / 3]}  # fmt: skip


def _softmax(logits: np.ndarray) -> np.ndarray:
    e = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def simulated(turns: int, seed: int) -> list[tuple[str, ...]]:
    """Accuracy of own / always / default on each simulated reader and mix of turns."""
    rng = np.random.default_rng(seed)
    rows = []
    for reader, (boost, empty_boost, lean_list) in READERS.items():
        lean = np.array(lean_list, dtype=float)
        empty = _softmax(rng.normal(0, 1, (256, 4)) + np.array([empty_boost, 0, 0, 0])) * lean
        content_free = (empty / empty.sum(axis=1, keepdims=True)).mean(axis=0)
        calls = content_free[1:].max() > content_free[0]  # leans_to_calling, on this reader's lean
        for mix, shares in MIXES.items():
            truth = rng.choice(4, size=turns, p=shares)
            read = (_softmax(rng.normal(0, 1, (turns, 4)) + boost * np.eye(4)[truth])) * lean
            read /= read.sum(axis=1, keepdims=True)
            always = read / content_free
            default = always if calls else read
            acc = [float((m.argmax(axis=1) == truth).mean()) for m in (read, always, default)]
            rows.append((reader, mix, "yes" if calls else "no", *(f"{a:.1%}" for a in acc),
                         f"{100 * (acc[2] - acc[0]):+.1f}"))  # fmt: skip
    return rows


CASES = [  # (tools, conversation, the right option)
    ("shop", "Hello! How are you today?", "answer"),
    ("shop", "Thanks, that is all I needed.", "answer"),
    ("shop", "Where is my order 5521? It has not arrived.", "get_order_status"),
    ("shop", "Please refund order 5521, it arrived broken.", "refund"),
    ("shop", "Where is my order 5521? It has not arrived.\n\nCalled get_order_status({\"order_id\": \"5521\"})\n\n"
             "Tool result (get_order_status): Order 5521 shipped on Monday and arrives Friday.", "answer"),
    ("shop", "Please refund order 5521, it arrived broken.\n\nCalled refund({\"order_id\": \"5521\"})\n\n"
             "Tool result (refund): Refund for order 5521 issued.", "answer"),
    ("weather", "What is the weather in Paris?", "get_weather"),
    ("weather", "What is the weather in Paris?\n\nCalled get_weather({\"city\": \"Paris\"})\n\n"
                "Tool result (get_weather): Sunny, 21 C.", "answer"),
]  # fmt: skip


def embedded(model: str) -> list[tuple[str, ...]]:
    """The embedded model's choice on each case, three ways: (case, right, own, always, default)."""
    from pcd_engine import Engine
    from pcd_engine.tool_calls import Tool, decide_tools

    order = {"type": "object", "properties": {"order_id": {"type": "string"}}, "required": ["order_id"]}
    city = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    tools = {
        "shop": [Tool("get_order_status", "Look up the shipping status of an order by its number.", order),
                 Tool("refund", "Refund an order by its number.", order)],
        "weather": [Tool("get_weather", "Get the current weather in a city.", city)],
    }  # fmt: skip
    engine = Engine.load(model)
    rows = []
    for name, text, right in CASES:
        read = [decide_tools(engine, text, tools[name], options=o).choice for o in
                ({"correction": "none"}, {"correction": "auto"}, None)]  # fmt: skip
        cells = [f"{'**' if c.value == right else ''}{c.value} {c.probability:.2f}" for c in read]
        rows.append((text.split("\n")[0][:40] + (" (after the result)" if "Tool result" in text else ""), right,
                     *cells))  # fmt: skip
    scores = [sum(r[2 + k].startswith("**") for r in rows) for k in range(3)]
    rows.append(("right", f"of {len(rows)}", *(str(s) for s in scores)))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=4000, help="simulated turns per reader and mix")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--model", default="smollm2-135m", help="the model of part 2 (default: the embedded one)")
    parser.add_argument("--no-model", action="store_true", help="part 1 only")
    args = parser.parse_args()
    print(versions() + "\n")
    print(f"Part 1: simulated readers, {args.turns} turns per cell, accuracy of the choice\n")
    print(table(("reader", "turns", "lean to calling?", "own", "always", "default", "default - own"),
                simulated(args.turns, args.seed)))  # fmt: skip
    if not args.no_model:
        print(f"\nPart 2: {args.model}, the chosen option and its probability (** right)\n")
        print(table(("conversation", "right", "own", "always", "default"), embedded(args.model)))


if __name__ == "__main__":
    main()
