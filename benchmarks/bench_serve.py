"""Load test of ``pcd serve``: N concurrent ``POST /api/extract`` on loopback against the serial answer.

Starts the app with uvicorn on a free loopback port (default model unless ``--model``), sends one request to warm
the schema's head, times ``--serial`` requests one after another, then ``--concurrent`` at once from a thread pool,
and prints throughput, latencies and whether every concurrent answer equals the serial one.

Usage::

    python benchmarks/bench_serve.py --concurrent 32 --preset support_triage
"""

from __future__ import annotations

import argparse
import socket
import statistics
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402
import uvicorn  # noqa: E402

from pcd_engine import Engine  # noqa: E402
from pcd_engine.tools.examples import EXAMPLE_PRESETS, example_preset  # noqa: E402
from pcd_engine.tools.serve import create_app  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--preset", action="append", choices=EXAMPLE_PRESETS, help="repeatable; default: two")
    parser.add_argument("--concurrent", type=int, default=32)
    parser.add_argument("--serial", type=int, default=5)
    args = parser.parse_args(argv)

    engine = Engine.load(args.model)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    server = uvicorn.Server(uvicorn.Config(create_app(engine), log_level="warning"))
    threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True).start()
    while not server.started:
        time.sleep(0.05)

    print(f"model: {args.model or 'SmolLM2-135M-Instruct (embedded)'}; backend {engine.backend.name}; {url}\n")
    print(
        "| preset | fields | serial ms (median) | concurrent | wall s | throughput req/s | latency median s | "
        "latency max s | all 200 | identical to serial |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name in args.preset or ["support_triage", "catalogue_255"]:
        preset = example_preset(name)
        body = {"schema": preset.schema.json_schema(), "context": preset.context}

        def post(_: int) -> tuple[float, httpx.Response]:
            started = time.perf_counter()
            response = httpx.post(f"{url}/api/extract", json=body, timeout=600)  # noqa: B023 - used in this loop
            return time.perf_counter() - started, response

        post(0)  # warm the head
        serial = [post(i) for i in range(args.serial)]
        expected = serial[0][1].json()
        started = time.perf_counter()
        with ThreadPoolExecutor(max_workers=args.concurrent) as pool:
            results = list(pool.map(post, range(args.concurrent)))
        wall = time.perf_counter() - started
        ok = all(r.status_code == 200 for _, r in results)
        same = ok and all(
            r.json()["values"] == expected["values"] and r.json()["fields"] == expected["fields"] for _, r in results
        )
        latencies = [t for t, _ in results]
        print(
            f"| {name} | {len(preset.schema.fields)} | {statistics.median(t for t, _ in serial) * 1000:.0f} | "
            f"{args.concurrent} | {wall:.1f} | {args.concurrent / wall:.2f} | {statistics.median(latencies):.1f} | "
            f"{max(latencies):.1f} | {'yes' if ok else 'NO'} | {'yes' if same else 'NO'} |"
        )
    server.should_exit = True
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
