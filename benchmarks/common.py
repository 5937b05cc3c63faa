"""Helpers shared by the benchmark scripts (no tensor library imported here)."""

from __future__ import annotations

from typing import Any

from pcd_engine.comparison import median_ms, one_wave

__all__ = ["floor_ms", "median_ms", "one_wave"]


def floor_ms(engine: Any, preset: Any, out: Any, repeats: int, sync: Any = lambda: None) -> float:
    """ONE plain causal pass over (document + tail + tree nodes) new tokens on the warm head, with the model's
    own causal mask, reading as many output rows as the 1-pass extract ``out`` read."""
    plan, prefix = engine._heads[out.schema.fingerprint]
    new = out.stats.prompt_tokens - out.stats.cached_tokens + out.stats.nodes_scored
    ids = engine.prompt_for(preset.context, out.schema)[len(plan.prompt.head_ids) :]
    tokens = (ids * (new // max(len(ids), 1) + 1))[:new]
    rows = out.stats.nodes_scored + 1
    backend: Any = engine.backend
    if backend.name == "torch":
        import torch

        device = next(backend.model.parameters()).device

        def run() -> None:
            state = backend.start(prefix)
            with torch.no_grad():
                backend.model(
                    input_ids=torch.tensor([tokens], device=device),
                    **{backend._cache_kw: state.cache},
                    use_cache=True,
                    logits_to_keep=rows,
                )

    else:
        import mlx.core as mx

        native, _ = backend._extend_native(None, list(prefix.ids))
        keep = list(range(new - rows, new))

        def run() -> None:
            mx.eval(backend._forward(mx.array([tokens]), backend._copy_native(native), keep=keep))

    run()
    return median_ms(run, repeats, sync)
