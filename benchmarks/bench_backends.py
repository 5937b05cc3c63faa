"""MLX against PyTorch on the same model and prompts: extract ms, forward passes and agreement per preset.

Each backend runs in its own worker process, one after the other, because MLX on Linux uses OpenBLAS threads
that busy-wait and would slow PyTorch's threads down in a shared process. For each preset and backend:

* ``default ms``: ``extract`` with default settings (anchor, depends_on waves), median of N, warm preamble cache;
* ``1-pass ms``: ``anchor=False`` and ``depends_on`` dropped, so the request is ONE forward pass;
* ``floor``: ONE plain causal pass of the model over the same number of new tokens on the same warm preamble, with
  its own causal mask, reading the same number of rows; ``1-pass/floor`` is pcd's overhead on that backend;
* the forward passes of each, and how many fields the two backends decide identically;
* with ``--ar``: the autoregressive baseline writing the full answer (as many tokens as pcd's answer as pretty
  JSON, EOS ignored) on the same backend, and pcd's speed-up over it.

Usage::

    python benchmarks/bench_backends.py                        # default SmolLM2, example presets, this CPU
    python benchmarks/bench_backends.py --ar --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.common import floor_ms, median_ms, one_wave
from pcd_engine import Engine, load_preset
from pcd_engine.tools.examples import EXAMPLE_PRESETS, example_preset

BACKENDS = ("torch", "mlx")


def versions(backend: str) -> str:
    from importlib.metadata import version

    packages = ["torch", "transformers"] if backend == "torch" else ["mlx", "mlx-lm"]
    return ", ".join(f"{p} {version(p)}" for p in packages)


def worker(backend: str, args: argparse.Namespace) -> dict[str, Any]:
    """Measure every preset on one backend (runs in its own process)."""
    engine = Engine.load(args.model, backend=backend)
    rows = []
    for name in args.presets:
        preset = example_preset(name) if name in EXAMPLE_PRESETS else load_preset(name)
        flat = one_wave(preset.schema)
        engine.extract(preset.context, flat, anchor=False)  # warm the head caches
        dflt = engine.extract(preset.context, preset.schema)
        one = engine.extract(preset.context, flat, anchor=False)
        row: dict[str, Any] = dict(
            preset=name,
            fields=len(preset.schema.fields),
            prompt_tokens=dflt.stats.prompt_tokens,
            default_ms=median_ms(lambda: engine.extract(preset.context, preset.schema), args.repeats),
            default_passes=dflt.stats.forward_passes,
            one_ms=median_ms(lambda: engine.extract(preset.context, flat, anchor=False), args.repeats),
            one_passes=one.stats.forward_passes,
            floor_ms=floor_ms(engine, preset, one, args.repeats),
            values={k: v if isinstance(v, (bool, int, str)) else str(v) for k, v in dflt.values.items()},
        )
        if args.ar:
            answer = json.dumps(dflt.values, indent=2, ensure_ascii=False)[1:]
            full = len(engine.tokenizer.encode(answer))
            ids = engine.prompt_for(preset.context, preset.schema)
            row["ar_tokens"] = full
            row["ar_ms"] = median_ms(
                lambda: engine.backend.generate_greedy(ids, max_new_tokens=full, stop=lambda out: False),
                args.ar_repeats,
            )
        rows.append(row)
        print(f"  {backend}: done {name}", file=sys.stderr)
    return {"backend": backend, "scorer": engine.backend.scorer, "versions": versions(backend), "rows": rows}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=None, help="alias or folder (default: embedded SmolLM2)")
    parser.add_argument("--presets", nargs="*", default=list(EXAMPLE_PRESETS))
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--ar", action="store_true", help="also time the full-answer autoregressive baseline")
    parser.add_argument("--ar-repeats", type=int, default=1)
    parser.add_argument("--json", default=None, help="write the raw figures here")
    parser.add_argument("--worker", choices=BACKENDS, help=argparse.SUPPRESS)
    parser.add_argument("--worker-out", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.worker:
        Path(args.worker_out).write_text(json.dumps(worker(args.worker, args)))
        return 0

    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for backend in BACKENDS:
            out = Path(tmp) / f"{backend}.json"
            cmd = [sys.executable, __file__, "--presets", *args.presets, "--repeats", str(args.repeats)]
            cmd += ["--ar-repeats", str(args.ar_repeats), "--worker", backend, "--worker-out", str(out)]
            cmd += (["--ar"] if args.ar else []) + (["--model", args.model] if args.model else [])
            subprocess.run(cmd, check=True)
            results[backend] = json.loads(out.read_text())

    print(f"model: {args.model or 'SmolLM2-135M-Instruct (embedded), float32'}; device: CPU")
    print(f"python {platform.python_version()}, {platform.machine()}, {os.cpu_count()} cpus")
    for backend in BACKENDS:
        print(f"{backend}: {results[backend]['versions']}; scorer {results[backend]['scorer']}")
    head = (
        "| preset | fields | prompt tokens | torch ms | mlx ms | mlx/torch | passes torch / mlx |"
        " 1-pass torch ms | 1-pass mlx ms | 1-pass mlx/torch | 1-pass passes | 1-pass/floor torch |"
        " 1-pass/floor mlx | identical fields |"
    )
    if args.ar:
        head += " AR tokens | AR torch ms | AR mlx ms | speed-up torch | speed-up mlx |"
    print("\n## MLX against PyTorch (ms are medians)\n")
    print(head)
    print("|" + "---|" * (head.count("|") - 1))
    same_total = fields_total = 0
    for t, m in zip(results["torch"]["rows"], results["mlx"]["rows"], strict=True):
        same = sum(m["values"][k] == v for k, v in t["values"].items())
        same_total += same
        fields_total += t["fields"]
        line = (
            f"| {t['preset']} | {t['fields']} | {t['prompt_tokens']} | {t['default_ms']:.0f} | {m['default_ms']:.0f} | "
            f"{m['default_ms'] / t['default_ms']:.2f}x | {t['default_passes']} / {m['default_passes']} | "
            f"{t['one_ms']:.0f} | {m['one_ms']:.0f} | {m['one_ms'] / t['one_ms']:.2f}x | "
            f"{t['one_passes']} / {m['one_passes']} | {t['one_ms'] / t['floor_ms']:.2f}x | "
            f"{m['one_ms'] / m['floor_ms']:.2f}x | {same}/{t['fields']} |"
        )
        if args.ar:
            line += (
                f" {t['ar_tokens']} | {t['ar_ms']:.0f} | {m['ar_ms']:.0f} | {t['ar_ms'] / t['default_ms']:.1f}x | "
                f"{m['ar_ms'] / m['default_ms']:.1f}x |"
            )
        print(line)
    print(f"\nIdentical decisions: {same_total}/{fields_total} fields ({same_total / fields_total:.1%}).")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
