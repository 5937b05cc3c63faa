"""The MLX backend's boundaries: choosing it, loading models, its options and its errors."""

from __future__ import annotations

import json
import sys

import pytest

from pcd_engine import BackendUnavailableError, Engine, ModelLoadError, OptionError
from pcd_engine.backends import select_backend
from pcd_engine.backends.mlx_load import mlx_config_overrides, mlx_weights_fix
from tests.conformance import SHARED_PREFIXES, TEXT
from tests.support import mlx_available, save_tiny, tiny_model

pytestmark = pytest.mark.mlx
needs_mlx = pytest.mark.skipif(
    not mlx_available(), reason="mlx and mlx-lm are not installed (pip install 'pcd-llm[mlx]')"
)


def test_auto_picks_mlx_only_on_apple_silicon(monkeypatch):
    import platform

    monkeypatch.setattr(sys, "platform", "linux")
    assert select_backend("auto") == "torch"
    monkeypatch.setattr(sys, "platform", "darwin")
    monkeypatch.setattr(platform, "machine", lambda: "arm64")
    assert select_backend("auto") == ("mlx" if mlx_available() else "torch")
    monkeypatch.setattr(platform, "machine", lambda: "x86_64")
    assert select_backend("auto") == "torch"
    assert select_backend("mlx") == "mlx" and select_backend("torch") == "torch"


def test_missing_mlx_says_how_to_install(monkeypatch):
    for name in ("mlx", "mlx.core", "mlx_lm"):
        monkeypatch.setitem(sys.modules, name, None)  # makes `import mlx.core` raise ImportError
    with pytest.raises(BackendUnavailableError, match=r"Backend 'mlx'.*Install with: pip install \"pcd-llm\[mlx\]\""):
        Engine.load(backend="mlx")


def test_config_overrides_for_transformers5_folders():
    llama = {"rope_parameters": {"rope_theta": 100000.0, "rope_type": "default"}}
    assert mlx_config_overrides(llama) == {"rope_theta": 100000.0}
    assert mlx_config_overrides({**llama, "rope_theta": 5.0}) == {}  # never overrides what is there
    scaled = {"rope_parameters": {"rope_theta": 5e5, "rope_type": "llama3", "factor": 8.0}}
    assert mlx_config_overrides(scaled) == {"rope_theta": 5e5, "rope_scaling": {"rope_type": "llama3", "factor": 8.0}}
    gemma3 = {
        "rope_parameters": {
            "full_attention": {"rope_theta": 1e6, "rope_type": "default"},
            "sliding_attention": {"rope_theta": 1e4, "rope_type": "default"},
        },
        "layer_types": ["sliding_attention"] * 5 + ["full_attention"] + ["sliding_attention"] * 2,
    }
    assert mlx_config_overrides(gemma3) == {"rope_theta": 1e6, "rope_local_base_freq": 1e4, "sliding_window_pattern": 6}
    irregular = {"layer_types": ["sliding_attention", "full_attention", "full_attention"]}
    assert "sliding_window_pattern" not in mlx_config_overrides(irregular)
    lfm2 = {"model_type": "lfm2", "hidden_size": 64, "layer_types": ["conv", "full_attention"]}
    assert mlx_config_overrides(lfm2) == {"block_dim": 64}
    qwen35 = {"model_type": "qwen3_5_text", "layer_types": ["linear_attention"] * 3 + ["full_attention"]}
    assert mlx_config_overrides(qwen35) == {"full_attention_interval": 4, "model_type": "qwen3_5"}
    full_first = {"layer_types": ["full_attention", "linear_attention"]}
    assert "full_attention_interval" not in mlx_config_overrides(full_first)
    assert mlx_config_overrides({"model_type": "ministral"}) == {"model_type": "llama"}  # layer_types: sliding


def test_gpt_oss_experts_in_transformers_layout_compute_the_same_in_mlx_lms():
    """transformers: ``x @ gate_up[e]`` with gate and up interleaved; mlx-lm: ``x @ W.T`` per projection."""
    import numpy as np

    rng = np.random.default_rng(0)
    experts, hidden, inter = 3, 4, 5
    p = "model.layers.0.mlp.experts."
    weights = {
        p + "gate_up_proj": rng.normal(size=(experts, hidden, 2 * inter)),
        p + "gate_up_proj_bias": rng.normal(size=(experts, 2 * inter)),
        p + "down_proj": rng.normal(size=(experts, inter, hidden)),
        p + "down_proj_bias": rng.normal(size=(experts, hidden)),
        "model.layers.0.mlp.router.weight": rng.normal(size=(experts, hidden)),
    }
    fix = mlx_weights_fix({"model_type": "gpt_oss"})
    out = fix(weights)
    assert sorted(out) == sorted(
        [p + f"{proj}.{kind}" for proj in ("gate_proj", "up_proj", "down_proj") for kind in ("weight", "bias")]
        + ["model.layers.0.mlp.router.weight"]
    )
    x, y = rng.normal(size=hidden), rng.normal(size=inter)
    for e in range(experts):
        gate_up = x @ weights[p + "gate_up_proj"][e] + weights[p + "gate_up_proj_bias"][e]
        np.testing.assert_allclose(x @ out[p + "gate_proj.weight"][e].T + out[p + "gate_proj.bias"][e], gate_up[::2])
        np.testing.assert_allclose(x @ out[p + "up_proj.weight"][e].T + out[p + "up_proj.bias"][e], gate_up[1::2])
        down = y @ weights[p + "down_proj"][e] + weights[p + "down_proj_bias"][e]
        np.testing.assert_allclose(y @ out[p + "down_proj.weight"][e].T + out[p + "down_proj.bias"][e], down)
    original = {p + "gate_up_proj_blocks": np.zeros((experts, 2 * inter, 1, 16), np.uint8)}  # OpenAI's MXFP4
    assert fix(original) is original  # mlx-lm's own sanitize reads that layout
    assert mlx_weights_fix({"model_type": "llama"}) is None


@needs_mlx
def test_load_errors_are_typed(tmp_path):
    from pcd_engine.backends.mlx import MLXBackend

    with pytest.raises(ModelLoadError, match=r"Model '.*': expected a model folder with a config.json"):
        MLXBackend.load(str(tmp_path))  # the one folder check, before mlx-lm sees it
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "no-such-arch"}))
    with pytest.raises(ModelLoadError, match=r"expected weights in \*.safetensors files, but the folder holds none"):
        MLXBackend.load(str(tmp_path))
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(ModelLoadError, match="expected a local MLX/transformers model folder .* mlx_lm.load failed"):
        MLXBackend.load(str(tmp_path))
    with pytest.raises(OptionError, match="dtype: expected 'float32', 'bfloat16' or 'float16', but got 'int8'"):
        MLXBackend.load(str(tmp_path), dtype="int8")


@needs_mlx
def test_load_a_transformers_folder_and_options(smol_tokenizer, tmp_path):
    """A folder written by transformers loads through Engine.load(backend="mlx"); bad options are typed errors."""
    from pcd_engine.backends.mlx import MLXBackend

    folder = save_tiny(tiny_model("llama", len(smol_tokenizer)), smol_tokenizer, tmp_path)
    engine = Engine.load(str(folder), backend="mlx", dtype="float32", device="cpu")
    assert engine.backend.name == "mlx" and engine.backend.scorer == "packed"
    out = engine.extract(TEXT, SHARED_PREFIXES)
    assert set(out.values) == set(SHARED_PREFIXES)
    assert engine.backend.max_context == 4096
    assert engine.backend.default_memory_budget_mb == 1024.0
    model, tokenizer = engine.backend.model, engine.backend.tokenizer
    with pytest.raises(OptionError, match="Device \\(mlx\\): expected None, 'cpu' or 'gpu', but got 'cuda'"):
        MLXBackend(model, tokenizer, device="cuda")
    with pytest.raises(OptionError, match="Scorer: expected 'auto', 'packed' or 'rows'"):
        MLXBackend(model, tokenizer, scorer="fast")
    # Wrapping the same model again (a second backend) does not stack wrappers, and both still agree.
    again = MLXBackend(model, tokenizer)
    assert Engine(again).extract(TEXT, SHARED_PREFIXES).values == out.values


@needs_mlx
def test_greedy_generation_matches_mlx_lm(smol_tokenizer, tmp_path):
    """The baseline's greedy loop equals mlx-lm's own generate with a greedy sampler."""
    import mlx.core as mx
    from mlx_lm.generate import generate_step

    from pcd_engine.backends.mlx import MLXBackend

    folder = save_tiny(tiny_model("qwen3", len(smol_tokenizer)), smol_tokenizer, tmp_path)
    backend = MLXBackend.load(str(folder), dtype="float32")
    prompt = smol_tokenizer.encode("Write JSON about a parcel.")
    ours = backend.generate_greedy(prompt, max_new_tokens=12, stop=lambda out: False)
    theirs = [int(token) for token, _ in generate_step(mx.array(prompt), backend.model, max_tokens=12)]
    assert ours == theirs
    assert backend.forward_passes >= 12


def test_blas_preload_is_skipped_when_asked(monkeypatch):
    from pcd_engine.backends import mlx as mlx_backend
    from pcd_engine.backends import mlx_tree

    monkeypatch.setenv("PCD_MLX_BLAS", "none")
    monkeypatch.setattr(mlx_tree, "_BLAS_TRIED", False)
    assert mlx_backend.preload_blas() is False


@needs_mlx
def test_four_bit_conversion_packs_exactly(smol_tokenizer, tmp_path):
    """A 4-bit MLX conversion (what mlx-community publishes), made here with mlx_lm.convert: packed scoring
    still equals the brute force on the quantized weights, and it is a different model from the fp32 one."""
    import mlx_lm
    from mlx_lm import convert

    from pcd_engine.backends.mlx import MLXBackend
    from tests.conformance import check_paths, packed_logprobs
    from tests.support import mlx_brute_force

    source = save_tiny(tiny_model("qwen3", len(smol_tokenizer)), smol_tokenizer, tmp_path / "hf")
    convert(str(source), str(tmp_path / "q4"), quantize=True, q_bits=4, q_group_size=32)
    assert json.loads((tmp_path / "q4" / "config.json").read_text())["quantization"]["bits"] == 4
    quantized = MLXBackend.load(str(tmp_path / "q4"))
    backend = MLXBackend(quantized.model, smol_tokenizer)
    assert backend.scorer == "packed"
    run = packed_logprobs(backend, SHARED_PREFIXES)
    plain, _ = mlx_lm.load(str(tmp_path / "q4"))  # a second, unwrapped copy for the reference

    check_paths(lambda c, p: mlx_brute_force(plain, c, p), run["wave"], run["context"], run["logprobs"])
    full = packed_logprobs(MLXBackend(MLXBackend.load(str(source)).model, smol_tokenizer), SHARED_PREFIXES)
    assert abs(full["logprobs"] - run["logprobs"]).max() > 1e-3
