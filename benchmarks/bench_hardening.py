"""Bounded requests: what the hardening issue's oversized requests cost now, on the embedded SmolLM2-135M.

Prints one Markdown table. Each row is one request the probe found unbounded:

* a schema too long for the window (1,500 and 10,000 labels): refused before the preamble prefill;
* wide integer ranges (``maximum: 3e7`` and ``1e9``): counted by arithmetic, the field generated instead;
* open-row masks at 200 rows x 64 tokens: the new rows only, against the whole matrix sliced (measured side by
  side in this run, per step, at the last step);
* 255 labels on a 6k-token document under the default 1 GiB budget: the document fed in causal chunks.

Peak memory is the growth of this process's resident set while the call runs, sampled every 2 ms.

    .venv/bin/python benchmarks/bench_hardening.py
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import peak_rss  # noqa: E402
from pcd_engine import Engine, compile_schema  # noqa: E402
from pcd_engine.errors import PCDError  # noqa: E402
from pcd_engine.trees import TreeBatch  # noqa: E402

TEXT = "Order 1182 arrived broken; the customer is furious and wants their money back today."


def measure(fn: Callable[[], Any]) -> tuple[float, float, str]:
    """(seconds, peak RSS growth in MiB, outcome) of one call; an error is named by its type."""
    seconds, mb, outcome = peak_rss(fn)
    return seconds, mb, type(outcome).__name__ if isinstance(outcome, PCDError) else str(outcome)


def row_masks(rows: int, tokens: int, past: int) -> tuple[float, float, float, float]:
    """Seconds and MiB of the last step's mask: the whole visibility matrix sliced, then the new rows only."""
    parents = [-1] + [0] * rows  # a shared key token, then one chain per row
    depths = [0] + [1] * rows
    for step in range(1, tokens):
        for r in range(rows):
            parents.append(1 + r if step == 1 else len(parents) - rows)
            depths.append(step + 1)
    tree = TreeBatch(tuple(range(len(parents))), tuple(parents), tuple(depths), (), (), ())
    new = list(range(len(parents) - rows, len(parents)))
    started = time.perf_counter()
    whole, _q, _k = tree.visibility(past, 0)
    sliced = whole[new]
    old_s, old_mb = time.perf_counter() - started, whole.nbytes / 2**20
    started = time.perf_counter()
    rows_only, _q, _k = tree.visibility_of(past, new)
    new_s, new_mb = time.perf_counter() - started, rows_only.nbytes / 2**20
    assert np.array_equal(sliced, rows_only)
    return old_s, old_mb, new_s, new_mb


def main() -> None:
    engine = Engine.load()
    engine.extract(TEXT, {"ok": {"type": "boolean"}})  # load and warm
    table: list[tuple[str, str, str, str]] = []
    for labels in (1_500, 10_000):
        schema = {"topic": {"type": "enum", "choices": [f"label_{i:05d}_x" for i in range(labels)]}}
        before = engine.backend.forward_passes
        s, mb, outcome = measure(lambda schema=schema: engine.extract(TEXT, schema))
        passes = engine.backend.forward_passes - before
        outcome = f"{outcome}, {passes} passes"
        table.append((f"{labels:,} labels (window check)", f"{s:.2f} s", f"{mb:.0f} MiB", outcome))
    for maximum in (3e7, 1e9):
        node = {"type": "integer", "minimum": 0, "maximum": maximum}
        s, mb, _ = measure(lambda node=node: compile_schema({"properties": {"n": node}}))
        kind = compile_schema({"properties": {"n": node}}).field("n").kind
        table.append((f"integer 0..{maximum:g}", f"{s * 1000:.2f} ms", f"{mb:.0f} MiB", f"field is {kind}"))
    old_s, old_mb, new_s, new_mb = row_masks(200, 64, past=300)
    table.append(("200 rows x 64 tokens, last step, whole matrix", f"{old_s:.3f} s", f"{old_mb:.0f} MiB", "before"))
    table.append(("200 rows x 64 tokens, last step, new rows", f"{new_s:.3f} s", f"{new_mb:.1f} MiB", "after"))
    big = {"sku": {"type": "enum", "choices": [f"SKU-{i:03d}" for i in range(255)]}, "ok": {"type": "boolean"}}
    document = " ".join(f"line {i} of the order history." for i in range(600))
    engine.extract(TEXT, big)  # the head is not what is measured
    s, mb, out = peak_rss(lambda: engine.extract(document, big))
    if isinstance(out, Exception):
        raise out
    detail = f"{out.stats.forward_passes} passes, {out.stats.prompt_tokens} prompt tokens"
    table.append(("255 labels on a 6k-token document, 1 GiB", f"{s:.1f} s", f"{mb:.0f} MiB", detail))
    print("| request | time | peak RSS growth | outcome |")
    print("|---|---|---|---|")
    for row in table:
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
