"""Corpus tagging throughput: ``pcd tag``'s job in-process against the same job on Ray Data, side by side.

Every configuration tags the same BBC News articles with the 5-field schema of ``bench_batch.py`` into a fresh
Parquet file through :func:`pcd_engine.tagging.job.run_tag_job`, end to end as a user runs it: the engine load
(in-process) or the actors' start and model load (Ray) included, Parquet parts and the final merge included.

Configurations:

* in-process with the process's torch threads (all cores), and with one thread;
* Ray, one actor with one CPU (one torch thread) and with all CPUs;
* Ray, one actor per core, one CPU each.

The table gives the median wall time, documents per second, the ratio to in-process at equal CPUs (the overhead
of Ray), and whether every row's values equal the in-process run's. Model load time is measured on its own so
that the steady rate can be read off.

Usage::

    python benchmarks/bench_tag.py --docs 100 --repeats 1
    python benchmarks/bench_tag.py --model /path/to/folder --docs 2000 --gpus 1     # on a GPU machine
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.bench_batch import Tags  # noqa: E402
from pcd_engine import Engine  # noqa: E402
from pcd_engine.schema import compile_schema  # noqa: E402
from pcd_engine.tagging.corpus import CorpusDocument  # noqa: E402
from pcd_engine.tagging.job import engine_parts, run_tag_job  # noqa: E402
from pcd_engine.tagging.output import job_identity  # noqa: E402
from pcd_engine.tagging.table import row_values  # noqa: E402
from pcd_engine.tools.datasets import load_dataset  # noqa: E402


def _values(path: Path, schema: Any) -> dict[str, Any]:
    import pyarrow.parquet as pq

    return {r["id"]: row_values(schema, r) for r in pq.read_table(path).to_pylist()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None, help="model name or folder (default: the embedded SmolLM2)")
    parser.add_argument("--docs", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--part-size", type=int, default=25)
    parser.add_argument("--gpus", type=float, default=None, help="GPUs per Ray actor")
    args = parser.parse_args()

    import ray
    import torch

    from pcd_integrations.ray import ray_parts

    cpus = os.cpu_count() or 1
    schema = compile_schema(Tags)
    articles = load_dataset("bbc-news", limit=args.docs, seed=0)
    docs = [CorpusDocument(str(i), a.text) for i, a in enumerate(articles)]
    identity = job_identity(schema, model=str(args.model), columns={"text": "text", "id": None})
    threads = torch.get_num_threads()
    tmp = Path(tempfile.mkdtemp(prefix="bench-tag-"))

    def in_process(n_threads: int) -> Any:
        def run(out: Path) -> None:
            torch.set_num_threads(n_threads)
            try:
                engine = Engine.load(args.model)
                runner = engine_parts(engine, schema, part_size=args.part_size)
                run_tag_job(docs, schema, out, identity=identity, runner=runner, overwrite=True)
            finally:
                torch.set_num_threads(threads)

        return run

    def on_ray(actors: int, cpus_each: float) -> Any:
        def run(out: Path) -> None:
            runner = ray_parts(schema, model=args.model, backend="auto", part_size=args.part_size,
                               concurrency=actors, num_gpus=args.gpus, num_cpus=cpus_each)  # fmt: skip
            run_tag_job(docs, schema, out, identity=identity, runner=runner, overwrite=True)

        return run

    started = time.perf_counter()
    Engine.load(args.model)
    load_s = time.perf_counter() - started

    configs = [
        ("in-process", threads, in_process(threads)),
        ("in-process, 1 thread", 1, in_process(1)),
        ("Ray, 1 actor x 1 CPU", 1, on_ray(1, 1)),
        (f"Ray, 1 actor x {cpus} CPUs", cpus, on_ray(1, cpus)),
        (f"Ray, {cpus} actors x 1 CPU", cpus, on_ray(cpus, 1)),
    ]
    ray.init(num_cpus=cpus, include_dashboard=False, log_to_driver=False, configure_logging=False)
    ray.data.DataContext.get_current().enable_progress_bars = False
    walls: dict[str, list[float]] = {name: [] for name, _, _ in configs}
    same: dict[str, int] = {}
    reference: dict[str, Any] = {}
    for repeat in range(args.repeats):
        for name, _, run in configs:
            out = tmp / f"{len(walls[name])}-{name.replace(' ', '_').replace(',', '')}.parquet"
            tick = time.perf_counter()
            run(out)
            walls[name].append(time.perf_counter() - tick)
            got = _values(out, schema)
            if not reference:
                reference = got
            same[name] = sum(got[k] == v for k, v in reference.items())
            print(f"repeat {repeat + 1}: {name}: {walls[name][-1]:.1f} s", file=sys.stderr)
    ray.shutdown()

    print(f"\n{len(docs)} BBC News articles, 5-field schema, part size {args.part_size}; {cpus} CPUs, "
          f"torch {torch.__version__} ({threads} threads), ray {ray.__version__}; engine load alone "
          f"{load_s:.1f} s; medians of {args.repeats}\n")  # fmt: skip
    print("| configuration | CPUs | wall s (load included) | docs/s | vs in-process at equal CPUs | same values |")
    print("|---|---|---|---|---|---|")
    rate = {name: len(docs) / statistics.median(walls[name]) for name in walls}
    base = {threads: rate["in-process"], 1: rate["in-process, 1 thread"]}
    for name, n_cpus, _ in configs:
        ratio = f"{rate[name] / base[n_cpus]:.2f}x" if n_cpus in base and not name.startswith("in-process") else "-"
        print(f"| {name} | {n_cpus} | {statistics.median(walls[name]):.1f} | {rate[name]:.2f} | {ratio} | "
              f"{same[name]}/{len(docs)} |")  # fmt: skip


if __name__ == "__main__":
    main()
