"""Benchmark pcd's extract against its floor and the autoregressive baseline, and measure decision-step memory.

For each preset, in one run on the same model and prompt:

* ``extract 1-wave``: ``anchor=False``, so the request is ONE forward pass on the warm preamble (median of N);
* ``extract``: default settings (anchor, depends_on waves) (median of N);
* ``floor``: ONE plain causal forward pass over the same number of new tokens (document + tail + tree nodes) on
  the same warm preamble cache, with the model's own causal mask, reading the same number of output rows;
* the AR baseline (same model, same prompt, greedy JSON) with its tokens and validity, and the speed-ups.

Then the peak extra memory of the decision step for one field of 4, 28 and 255 labels, and for the 28-field
presets, next to what per-row KV copies of the prompt (the peer design) would hold.

Usage::

    python benchmarks/bench_engine.py                       # default SmolLM2 on CPU, example presets
    python benchmarks/bench_engine.py --random-init qwen2.5-1.5b --tokenizer .cache/tokenizers/qwen3 --device cuda
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# Large tensors are mmapped and returned on free, so sampled RSS follows live CPU memory.
if os.environ.get("MALLOC_MMAP_THRESHOLD_") is None and "--no-reexec" not in sys.argv:
    os.environ["MALLOC_MMAP_THRESHOLD_"] = "65536"
    os.execv(sys.executable, [sys.executable, *sys.argv, "--no-reexec"])

import torch  # noqa: E402

from benchmarks.common import floor_ms, median_ms, one_wave  # noqa: E402
from pcd_engine import Engine, load_preset  # noqa: E402
from pcd_engine.backends.torch import TorchBackend  # noqa: E402
from pcd_engine.schema import compile_schema  # noqa: E402
from pcd_engine.tools.baseline import generate_baseline  # noqa: E402
from pcd_engine.tools.examples import EXAMPLE_PRESETS, example_preset  # noqa: E402

RANDOM_CONFIGS = {
    "qwen2.5-1.5b": dict(
        model_type="qwen2",
        hidden_size=1536,
        intermediate_size=8960,
        num_hidden_layers=28,
        num_attention_heads=12,
        num_key_value_heads=2,
        vocab_size=151936,
        max_position_embeddings=32768,
        rope_theta=1e6,
        tie_word_embeddings=True,
    ),
    "qwen2.5-7b": dict(
        model_type="qwen2",
        hidden_size=3584,
        intermediate_size=18944,
        num_hidden_layers=28,
        num_attention_heads=28,
        num_key_value_heads=4,
        vocab_size=152064,
        max_position_embeddings=32768,
        rope_theta=1e6,
        tie_word_embeddings=False,
    ),
}


class PeakMemory:
    """Peak extra memory while a block runs: CUDA allocator stats, or sampled RSS on CPU."""

    def __init__(self, device: str) -> None:
        self.device = device
        self.peak = 0

    def _rss(self) -> int:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    def __enter__(self) -> PeakMemory:
        if self.device.startswith("cuda"):
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self.base = torch.cuda.memory_allocated()
        else:
            self.base = self._rss()
            self.top = self.base
            self.running = True

            def sample() -> None:
                while self.running:
                    self.top = max(self.top, self._rss())
                    time.sleep(0.0002)

            self.thread = threading.Thread(target=sample, daemon=True)
            self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.device.startswith("cuda"):
            torch.cuda.synchronize()
            self.peak = torch.cuda.max_memory_allocated() - self.base
        else:
            self.running = False
            self.thread.join()
            self.peak = self.top - self.base


def kv_bytes_per_token(model: Any) -> int:
    cfg = model.config.get_text_config()
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    kv_heads = getattr(cfg, "num_key_value_heads", cfg.num_attention_heads)
    return 2 * cfg.num_hidden_layers * kv_heads * head_dim * next(model.parameters()).element_size()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=None, help="alias, folder or repo id (default: embedded SmolLM2)")
    parser.add_argument("--random-init", choices=sorted(RANDOM_CONFIGS), help="random weights of a realistic size")
    parser.add_argument("--tokenizer", default=None, help="tokenizer folder for --random-init")
    parser.add_argument("--presets", nargs="*", default=list(EXAMPLE_PRESETS))
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--ar-repeats", type=int, default=3)
    parser.add_argument("--device", default=None)
    parser.add_argument("--dtype", default=None)
    parser.add_argument("--skip-ar", action="store_true")
    parser.add_argument("--json", default=None, help="write the raw figures here")
    parser.add_argument("--no-reexec", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.random_init:
        from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

        device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
        dtype = getattr(torch, args.dtype or ("bfloat16" if device.startswith("cuda") else "float32"))
        spec = dict(RANDOM_CONFIGS[args.random_init])
        config = AutoConfig.for_model(spec.pop("model_type"), **spec)
        torch.manual_seed(0)
        with torch.device(device):
            model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation="sdpa")
        engine = Engine(TorchBackend(model, AutoTokenizer.from_pretrained(args.tokenizer)))
        model_name = f"{args.random_init} (random init)"
    else:
        engine = Engine.load(args.model, device=args.device, dtype=args.dtype)
        model_name = args.model or "SmolLM2-135M-Instruct (embedded)"
    backend = engine.backend
    assert isinstance(backend, TorchBackend)
    device = str(next(backend.model.parameters()).device)
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)

    import transformers

    print(f"model: {model_name}; device: {device}; dtype: {next(backend.model.parameters()).dtype}")
    print(
        f"torch {torch.__version__}, transformers {transformers.__version__}, python {platform.python_version()}, "
        f"{platform.machine()}, {os.cpu_count()} cpus, torch threads {torch.get_num_threads()}"
    )
    rows = []
    for name in args.presets:
        preset = example_preset(name) if name in EXAMPLE_PRESETS else load_preset(name)
        # The 1-pass variant drops depends_on as well as the anchor: every field in ONE wave.
        flat = one_wave(preset.schema)
        one = engine.extract(preset.context, flat, anchor=False)  # warm the head caches
        dflt = engine.extract(preset.context, preset.schema)
        one = engine.extract(preset.context, flat, anchor=False)
        one_ms = median_ms(lambda: engine.extract(preset.context, flat, anchor=False), args.repeats, sync)
        dflt_ms = median_ms(lambda: engine.extract(preset.context, preset.schema), args.repeats, sync)
        fl = floor_ms(engine, preset, one, args.repeats, sync)
        row = dict(
            preset=name,
            fields=len(preset.schema.fields),
            labels=sum(len(f.labels) for f in preset.schema.fields),
            new_tokens=one.stats.prompt_tokens - one.stats.cached_tokens + one.stats.nodes_scored,
            nodes=one.stats.nodes_scored,
            cached=one.stats.cached_tokens,
            one_wave_ms=one_ms,
            one_wave_passes=one.stats.forward_passes,
            default_ms=dflt_ms,
            default_passes=dflt.stats.forward_passes,
            waves=dflt.stats.waves,
            floor_ms=fl,
            ratio=one_ms / fl,
        )
        if not args.skip_ar:
            ar_runs = []
            for _ in range(args.ar_repeats):
                sync()
                ar_runs.append(generate_baseline(engine, preset.context, preset.schema))
            ar = ar_runs[0]
            ar_ms = statistics.median(r.ms for r in ar_runs)
            # A weak model often stops early with invalid JSON, which flatters AR. So also time AR writing exactly
            # as many tokens as the complete answer takes (pcd's answer as pretty JSON), EOS ignored.
            answer = json.dumps(dflt.values, indent=2, ensure_ascii=False)[1:]
            full_len = len(engine.tokenizer.encode(answer))
            ids = engine.prompt_for(preset.context, preset.schema)
            full_ms = median_ms(
                lambda: backend.generate_greedy(ids, max_new_tokens=full_len, stop=lambda out: False),
                args.ar_repeats,
                sync,
            )
            agree = 0
            if ar.values:
                agree = sum(1 for k, v in dflt.values.items() if ar.values.get(k) == v)
            row.update(
                ar_ms=ar_ms,
                ar_tokens=ar.tokens,
                ar_valid=ar.valid,
                ar_errors=len(ar.errors),
                full_tokens=full_len,
                full_ms=full_ms,
                speedup_default=full_ms / dflt_ms,
                speedup_one_wave=full_ms / one_ms,
                agree=agree,
            )
        rows.append(row)
        print(f"  done {name}", file=sys.stderr)

    print("\n## Speed (ms are medians)\n")
    head = (
        "| preset | fields | labels | new tokens | tree nodes | 1-pass ms | passes | floor ms | 1-pass/floor |"
        " default ms | passes | waves |"
    )
    if not args.skip_ar:
        head += (
            " AR ms | AR tokens | AR valid | full-answer AR ms | full-answer tokens | speed-up (default) |"
            " speed-up (1-pass) |"
        )
    print(head)
    print("|" + "---|" * (head.count("|") - 1))
    for r in rows:
        line = (
            f"| {r['preset']} | {r['fields']} | {r['labels']} | {r['new_tokens']} | {r['nodes']} | "
            f"{r['one_wave_ms']:.1f} | {r['one_wave_passes']} | {r['floor_ms']:.1f} | {r['ratio']:.2f}x | "
            f"{r['default_ms']:.1f} | {r['default_passes']} | {r['waves']} |"
        )
        if not args.skip_ar:
            line += (
                f" {r['ar_ms']:.0f} | {r['ar_tokens']} | {'yes' if r['ar_valid'] else 'no'} | {r['full_ms']:.0f} | "
                f"{r['full_tokens']} | {r['speedup_default']:.1f}x | {r['speedup_one_wave']:.1f}x |"
            )
        print(line)

    print("\n## Decision-step peak memory (one request, warm preamble, anchor=False)\n")
    print("| schema | labels | prompt tokens | tree nodes | peak extra MB | per-row KV copies would hold MB |")
    print("|---|---|---|---|---|---|")
    kv = kv_bytes_per_token(backend.model)
    text = example_preset("support_triage").context
    cases = [
        (f"1 field, {n} labels", {"pick": {"type": "enum", "choices": [f"OPTION_{i}" for i in range(n)]}})
        for n in (4, 28, 255)
    ]
    cases += [(name, example_preset(name).schema) for name in args.presets if name in EXAMPLE_PRESETS[:3]]
    mem_rows = []
    for label, schema in cases:
        schema = compile_schema(schema)
        engine.extract(text, schema, anchor=False)
        with PeakMemory(device) as mem:
            out = engine.extract(text, schema, anchor=False)
        labels = sum(len(f.labels) for f in schema.fields)
        paths = sum(len(l.surfaces) for f in schema.fields for l in f.labels)
        copies = paths * out.stats.prompt_tokens * kv / 2**20
        mem_rows.append(
            dict(
                schema=label,
                labels=labels,
                prompt=out.stats.prompt_tokens,
                nodes=out.stats.nodes_scored,
                peak_mb=mem.peak / 2**20,
                copies_mb=copies,
            )
        )
        print(
            f"| {label} | {labels} | {out.stats.prompt_tokens} | {out.stats.nodes_scored} | "
            f"{mem.peak / 2**20:.1f} | {copies:.0f} |"
        )
    if args.json:
        Path(args.json).write_text(
            json.dumps({"model": model_name, "device": device, "speed": rows, "memory": mem_rows}, indent=2)
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
