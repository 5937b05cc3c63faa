"""Load test of ``pcd serve``: N concurrent ``POST /api/extract`` on loopback against the serial answer.

Starts two apps with uvicorn on free loopback ports, on one engine (default model unless ``--model``): one that
decides every request alone, and one that collects concurrent requests for a few milliseconds and decides them
in shared batches (the default of ``pcd serve``). For each, it warms the schema's preamble, times four requests one
after another (four different texts), then ``--concurrent`` at once from a thread pool, and prints throughput
(and its ratio to the serial rate), latencies, how many documents shared each pass, and whether every concurrent
answer equals the serial one (decisions identical, probabilities within 1e-4).

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


def _serve(app: object) -> tuple[str, uvicorn.Server]:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True).start()
    while not server.started:
        time.sleep(0.05)
    return f"http://127.0.0.1:{sock.getsockname()[1]}", server


def _same(got: dict, expected: dict) -> bool:
    """Decisions identical; probabilities within 1e-4 (a batched pass rounds differently)."""
    if got["values"] != expected["values"]:
        return False
    for name, field in expected["fields"].items():
        mine = got["fields"][name]
        if (field["probability"] is None) != (mine["probability"] is None):
            return False
        if field["probability"] is not None and abs(mine["probability"] - field["probability"]) > 1e-4:
            return False
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--preset", action="append", choices=EXAMPLE_PRESETS, help="repeatable; default: two")
    parser.add_argument("--concurrent", type=int, default=32)
    parser.add_argument("--window", type=float, default=5.0, help="the collecting server's batch window, ms")
    args = parser.parse_args(argv)

    engine = Engine.load(args.model)
    servers = {
        "one at a time": _serve(create_app(engine, batch_window_ms=None)),
        f"collected ({args.window:g} ms window)": _serve(create_app(engine, batch_window_ms=args.window)),
    }
    print(f"model: {args.model or 'SmolLM2-135M-Instruct (embedded)'}; backend {engine.backend.name}; "
          f"{args.concurrent} concurrent requests over 4 different texts\n")  # fmt: skip
    print(
        "| preset | fields | server | serial ms (median) | wall s | throughput req/s | vs serial | latency median s | "
        "latency max s | docs per pass | all 200 | same as serial |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for name in args.preset or ["support_triage", "catalogue_255"]:
        preset = example_preset(name)
        contexts = [preset.context, f"Note: {preset.context}", f"{preset.context} Thanks.", f"Hi. {preset.context}"]
        bodies = [{"schema": preset.schema.json_schema(), "context": contexts[i % 4]} for i in range(args.concurrent)]
        for label, (url, _) in servers.items():

            def post(body: dict, url: str = url) -> tuple[float, httpx.Response]:
                started = time.perf_counter()
                response = httpx.post(f"{url}/api/extract", json=body, timeout=600)
                return time.perf_counter() - started, response

            post(bodies[0])  # warm the head
            serial = [post(b) for b in bodies[:4]]
            expected = [r.json() for _, r in serial]
            serial_s = statistics.median(t for t, _ in serial)
            started = time.perf_counter()
            with ThreadPoolExecutor(max_workers=args.concurrent) as pool:
                results = list(pool.map(post, bodies))
            wall = time.perf_counter() - started
            ok = all(r.status_code == 200 for _, r in results)
            same = ok and all(_same(r.json(), expected[i % 4]) for i, (_, r) in enumerate(results))
            shared = [n for _, r in results if r.status_code == 200 for n in r.json()["stats"]["documents_per_pass"]]
            latencies = [t for t, _ in results]
            rate = args.concurrent / wall
            print(
                f"| {name} | {len(preset.schema.fields)} | {label} | {serial_s * 1000:.0f} | {wall:.1f} | "
                f"{rate:.2f} | {rate * serial_s:.2f}x | {statistics.median(latencies):.1f} | {max(latencies):.1f} | "
                f"{statistics.mean(shared) if shared else 1:.1f} | {'yes' if ok else 'NO'} | "
                f"{'yes' if same else 'NO'} |"
            )
    for _, server in servers.values():
        server.should_exit = True
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
