"""Documents per second: ``Engine.extract_many`` with batches of 1, 4, 16 and 64 documents against the loop of
``extract`` calls, side by side in one run, on BBC News articles with a 5-field tagging schema.

Each configuration tags the same documents on the same engine (the schema preamble is warm), ``--repeats`` times;
the table gives the median documents per second, the ratio to the loop, the passes the backend ran, how many
documents shared a pass on average, the peak growth of resident memory (CPU) or of allocated GPU memory, and
whether every decision equals the loop's.

Usage::

    python benchmarks/bench_batch.py --docs 64 --repeats 3
    python benchmarks/bench_batch.py --docs 64 --open          # plus an open field (a short summary)
    python benchmarks/bench_batch.py --docs 32 --backend mlx   # MLX (mlx[cpu] on Linux)
    python benchmarks/bench_batch.py --model /path/to/folder --device cuda --docs 64   # on a GPU
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Literal

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pydantic import BaseModel, Field  # noqa: E402

from benchmarks.common import peak_rss  # noqa: E402
from pcd_engine import Engine  # noqa: E402
from pcd_engine.tools.datasets import load_dataset  # noqa: E402


class Tags(BaseModel):
    """Tags of a news article."""

    topic: Literal["business", "entertainment", "politics", "sport", "tech"]
    tone: Literal["positive", "neutral", "negative"]
    opinion: bool = Field(description="Whether the article argues a point of view")
    region: Literal["UK", "US", "Europe", "Asia", "global"]
    audience: Literal["general", "specialist"]


class TagsAndSummary(Tags):
    """Tags of a news article, and a short summary."""

    summary: str = Field(description="The article in a few words", json_schema_extra={"x-max-tokens": 8})


def _gpu_peak(engine: Engine, fn: Any) -> tuple[float, float, Any]:
    import torch

    device = engine.backend.model.device  # type: ignore[attr-defined]
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    base = torch.cuda.memory_allocated(device)
    tick = time.perf_counter()
    out = fn()
    torch.cuda.synchronize(device)
    return time.perf_counter() - tick, (torch.cuda.max_memory_allocated(device) - base) / 2**20, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="model folder or alias (default: the embedded SmolLM2-135M)")
    parser.add_argument("--backend", default="auto", choices=["auto", "torch", "mlx"])
    parser.add_argument("--device", default=None)
    parser.add_argument("--dtype", default=None)
    parser.add_argument("--docs", type=int, default=64)
    parser.add_argument("--sizes", default="1,4,16,64")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--chars", type=int, default=1500, help="keep each article's first CHARS characters")
    parser.add_argument("--open", action="store_true", help="add an open field (an 8-token summary) to the schema")
    args = parser.parse_args()

    engine = Engine.load(args.model, backend=args.backend, device=args.device, dtype=args.dtype)
    schema: type[BaseModel] = TagsAndSummary if args.open else Tags
    docs = [d.text[: args.chars] for d in load_dataset("bbc-news", limit=args.docs, seed=0)]
    cuda = getattr(getattr(engine.backend, "_device", None), "type", "cpu") == "cuda"
    measure = (lambda fn: _gpu_peak(engine, fn)) if cuda else peak_rss
    engine.extract(docs[0], schema)  # the preamble prefill is not part of any row
    tokens = [len(engine.prompt_for(d, schema)) for d in docs]
    print(f"model {args.model or 'smollm2-135m'}, backend {engine.backend.name} ({engine.backend.scorer}), "
          f"{len(docs)} BBC articles, prompt tokens median {statistics.median(tokens):.0f} "
          f"(min {min(tokens)}, max {max(tokens)}), schema {schema.__name__}, "
          f"engine batch size {engine.batch_size()}")  # fmt: skip

    def loop() -> list[Any]:
        return [engine.extract(d, schema) for d in docs]

    configs: list[tuple[str, Any]] = [("loop of extract", loop)]
    for size in (int(s) for s in args.sizes.split(",")):
        run = lambda size=size: engine.extract_many(docs, schema, batch_size=size)  # noqa: E731
        configs.append((f"extract_many, batch {size}", run))

    rows: dict[str, dict[str, Any]] = {name: {"rates": [], "peak": 0.0} for name, _ in configs}
    reference: list[Any] = []
    for _ in range(args.repeats):
        for name, fn in configs:  # interleaved, so a noisy spell hits every configuration alike
            before = engine.backend.forward_passes
            seconds, peak, out = measure(fn)
            if isinstance(out, Exception):
                raise out
            row = rows[name]
            row["rates"].append(len(docs) / seconds)
            row["peak"] = max(row["peak"], peak)
            row["passes"] = engine.backend.forward_passes - before
            shared = [n for r in out for n in r.stats.documents_per_pass]
            row["shared"] = statistics.mean(shared) if shared else 1.0
            if not reference:
                reference = [r.values for r in out]
            row["same"] = sum(r.values == v for r, v in zip(out, reference, strict=True))

    base = statistics.median(rows["loop of extract"]["rates"])
    print()
    print(
        "| configuration | docs/s (median) | vs loop | forward passes | docs per pass | peak memory MiB "
        "| same decisions |"
    )
    print("|---|---|---|---|---|---|---|")
    for name, _ in configs:
        row = rows[name]
        rate = statistics.median(row["rates"])
        print(f"| {name} | {rate:.2f} | {rate / base:.2f}x | {row['passes']} | {row['shared']:.1f} | "
              f"{row['peak']:.0f} | {row['same']}/{len(docs)} |")  # fmt: skip


if __name__ == "__main__":
    main()
