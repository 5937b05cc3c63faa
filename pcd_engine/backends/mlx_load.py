"""What mlx-lm needs to load a model folder written by transformers 5: the config keys it reads elsewhere, the
weight layouts it does not accept, and YaRN frequencies it rounds (:func:`load_mlx_model`).

Loading is the backend's business, not the model names' (:mod:`pcd_engine.models` converts a GGUF into a folder
and writes :func:`mlx_config_overrides` into its config so that mlx-lm reads it as transformers does).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from typing import Any

import numpy as np

from pcd_engine.backends.mlx_tree import import_mlx
from pcd_engine.backends.model_folder import check_model_folder
from pcd_engine.errors import ModelLoadError, OptionError

__all__ = ["load_checked", "load_mlx_model", "mlx_config_overrides", "mlx_weights_fix"]

_NO_CODE = {"trust_remote_code": False}  # the tokenizer's loader (transformers) never runs a folder's code either


def load_checked(path: str, *, dtype: str | None = None) -> tuple[Any, Any]:
    """The folder checked (:func:`~pcd_engine.backends.model_folder.check_model_folder`), then
    :func:`load_mlx_model`, its floating-point parameters cast to ``dtype`` when given.

    Raises:
        ModelLoadError: If the model cannot be loaded.
        OptionError: If ``dtype`` is unknown.
    """
    mx = import_mlx()
    if dtype is not None and dtype not in ("float32", "bfloat16", "float16"):
        raise OptionError(f"dtype: expected 'float32', 'bfloat16' or 'float16', but got {dtype!r}.")
    check_model_folder(path)
    try:
        model, tokenizer = load_mlx_model(path)
    except Exception as exc:  # mlx-lm raises OSError, ValueError and hub errors alike
        first = (str(exc).splitlines() or [type(exc).__name__])[0]
        raise ModelLoadError(
            f"Model {path!r}: expected a local MLX/transformers model folder or a repo id in the local Hugging "
            f"Face cache, but mlx_lm.load failed: {first}"
        ) from exc
    if dtype is not None:
        model.set_dtype(getattr(mx, dtype))
    return model, tokenizer


def load_mlx_model(path: str) -> tuple[Any, Any]:
    """``mlx_lm.load(path)``, for a folder written by transformers 5 as well as an MLX conversion.

    The folder is not changed: its config.json gets the top-level keys mlx-lm reads
    (:func:`mlx_config_overrides`) and, for model types that transformers saves in another
    layout (gpt-oss's experts), its weights are rewritten on load (:func:`mlx_weights_fix`).

    Args:
        path: A local folder with ``config.json``, or a repo id in the local Hugging Face cache.

    Returns:
        The mlx-lm model, unwrapped, and mlx-lm's tokenizer wrapper.

    Raises:
        Exception: Whatever mlx-lm raises for a folder it cannot load (:meth:`MLXBackend.load` wraps it).
    """
    import importlib
    import json
    from pathlib import Path

    import mlx_lm

    import_mlx()  # the system BLAS first
    config: dict[str, Any] = {}
    config_file = os.path.join(path, "config.json")
    if os.path.isfile(config_file):
        with open(config_file) as f:
            config = json.load(f)
    overrides = mlx_config_overrides(config)
    fix = mlx_weights_fix(config)
    if fix is None:
        loaded: Any = mlx_lm.load(
            path, model_config=overrides, return_config=True, trust_remote_code=False, tokenizer_config=_NO_CODE
        )
        _untruncated_yarn(loaded[0], loaded[2])
        return loaded[0], loaded[1]
    from mlx_lm.utils import load_model, load_tokenizer

    rewrite: Callable[[dict[str, Any]], dict[str, Any]] = fix

    def classes(config: dict[str, Any]) -> tuple[Any, Any]:
        module = importlib.import_module(f"mlx_lm.models.{config['model_type']}")

        class Model(module.Model):  # type: ignore[misc, name-defined]
            def sanitize(self, weights: dict[str, Any]) -> Any:
                return super().sanitize(rewrite(weights))

        return Model, module.ModelArgs

    model, merged = load_model(Path(path), model_config=overrides, get_model_classes=classes, trust_remote_code=False)
    _untruncated_yarn(model, merged)
    return model, load_tokenizer(Path(path), _NO_CODE, eos_token_ids=merged.get("eos_token_id"))


def _untruncated_yarn(model: Any, config: dict[str, Any]) -> None:
    """Give mlx-lm's YaRN rotary embeddings the frequencies of a config that says ``truncate: false``.

    mlx-lm rounds YaRN's correction range to whole dimensions (floor and ceil) whatever the config says;
    transformers and OpenAI's reference implementation of gpt-oss, whose config sets ``truncate: false``, do not.
    The rounding moves every rotary frequency in the ramp, so without this the two backends compute different
    models (a tiny gpt-oss: log-probs 0.26 apart).
    """
    scaling = config.get("rope_scaling") or {}
    if scaling.get("truncate", True) or scaling.get("rope_type", scaling.get("type")) != "yarn":
        return
    import mlx.core as mx
    from mlx_lm.models.rope_utils import YarnRoPE

    base = float(config.get("rope_theta", 10000.0))
    factor = float(scaling.get("factor", 1.0))
    original = float(scaling.get("original_max_position_embeddings", 4096))
    for _, module in model.named_modules():
        if not isinstance(module, YarnRoPE):
            continue
        dims = module.dims

        def correction_dim(rotations: float, dims: int = dims) -> float:
            return dims * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(base))

        low = max(correction_dim(float(scaling.get("beta_fast") or 32)), 0.0)
        high = min(correction_dim(float(scaling.get("beta_slow") or 1)), dims - 1.0)
        extra = base ** (np.arange(0, dims, 2, dtype=np.float64) / dims)
        inter = factor * extra
        ramp = np.clip((np.arange(dims // 2, dtype=np.float64) - low) / ((high - low) or 0.001), 0.0, 1.0)
        keep = 1.0 - ramp
        module._freqs = mx.array((inter * extra / (inter * keep + extra * (1.0 - keep))).astype(np.float32))


def mlx_config_overrides(config: dict[str, Any]) -> dict[str, Any]:
    """Keys that mlx-lm needs but a config.json written by transformers 5 keeps elsewhere.

    transformers 5 nests RoPE settings under ``rope_parameters`` (per layer type for Gemma 3) and describes
    sliding and linear-attention layers with ``layer_types``; mlx-lm 0.32 reads ``rope_theta``, ``rope_scaling``,
    ``rope_local_base_freq``, ``sliding_window_pattern`` and ``full_attention_interval`` at the top level and
    otherwise silently falls back to its own defaults (Qwen2's is 1e6 where transformers' is 1e4), which changes
    every logit. LFM2 needs ``block_dim`` (transformers: ``hidden_size``), and a text-only Qwen3.5 folder
    (``qwen3_5_text``) loads as mlx-lm's ``qwen3_5``, which takes a bare text config.

    Args:
        config: The parsed config.json.

    Returns:
        The top-level keys to add; keys already present are never overridden, except a ``model_type`` that
        mlx-lm names differently.
    """
    out: dict[str, Any] = {}
    params = config.get("rope_parameters") or {}
    by_type = {k: v for k, v in params.items() if isinstance(v, dict)}
    full = by_type.get("full_attention", params if not by_type else {})
    if full.get("rope_theta") is not None:
        out["rope_theta"] = full["rope_theta"]
    if full.get("rope_type", "default") != "default" and not config.get("rope_scaling"):
        out["rope_scaling"] = {k: v for k, v in full.items() if k != "rope_theta"}
    local = by_type.get("sliding_attention", {})
    if local.get("rope_theta") is not None:
        out["rope_local_base_freq"] = local["rope_theta"]
    types = config.get("layer_types") or []
    period = _full_attention_period(types)
    if period and "sliding_attention" in types:
        out["sliding_window_pattern"] = period
    if period and "linear_attention" in types:
        out["full_attention_interval"] = period
    if config.get("model_type") == "lfm2" and config.get("hidden_size"):
        out["block_dim"] = config["hidden_size"]
    out = {k: v for k, v in out.items() if k not in config}
    if config.get("model_type") in _MLX_MODEL_TYPES:
        out["model_type"] = _MLX_MODEL_TYPES[config["model_type"]]
    return out


def mlx_weights_fix(config: dict[str, Any]) -> Callable[[dict[str, Any]], dict[str, Any]] | None:
    """A rewrite of a folder's weights into a layout mlx-lm's ``sanitize`` accepts, where transformers saves another.

    gpt-oss: transformers saves the experts unquantized as ``experts.gate_up_proj`` (experts x hidden x 2 inter,
    gate and up interleaved on the last axis) and ``experts.down_proj`` (experts x inter x hidden); mlx-lm reads
    the original checkpoint's MXFP4 ``*_blocks`` or its own split, transposed ``gate_proj`` / ``up_proj`` /
    ``down_proj`` weights, and rejects the rest.

    Args:
        config: The parsed config.json.

    Returns:
        A function from weight name to array (mlx or numpy) to the rewritten mapping, or ``None`` when the model
        type needs none. The function leaves weights already in mlx-lm's layouts as they are.
    """
    return _gpt_oss_weights if config.get("model_type") == "gpt_oss" else None


def _gpt_oss_weights(weights: dict[str, Any]) -> dict[str, Any]:
    if not any(k.endswith(".experts.gate_up_proj") for k in weights):
        return weights
    out: dict[str, Any] = {}
    for key, value in weights.items():
        stem, _, name = key.rpartition(".experts.")
        experts = f"{stem}.experts."
        if not stem or name not in ("gate_up_proj", "gate_up_proj_bias", "down_proj", "down_proj_bias"):
            out[key] = value
        elif name == "gate_up_proj":
            out[experts + "gate_proj.weight"] = value[..., ::2].swapaxes(-1, -2)
            out[experts + "up_proj.weight"] = value[..., 1::2].swapaxes(-1, -2)
        elif name == "gate_up_proj_bias":
            out[experts + "gate_proj.bias"] = value[..., ::2]
            out[experts + "up_proj.bias"] = value[..., 1::2]
        elif name == "down_proj":
            out[experts + "down_proj.weight"] = value.swapaxes(-1, -2)
        else:
            out[experts + "down_proj.bias"] = value
    return out


_MLX_MODEL_TYPES = {"qwen3_5_text": "qwen3_5", "qwen3_5_moe_text": "qwen3_5_moe", "ministral": "llama"}
"""transformers' text-only model types that mlx-lm knows under another name."""


def _full_attention_period(types: list[str]) -> int | None:
    """``k`` when every ``k``-th layer (and only those) is full attention, the form mlx-lm's configs take."""
    if "full_attention" not in types:
        return None
    period = types.index("full_attention") + 1
    if all((t == "full_attention") == (i % period == period - 1) for i, t in enumerate(types)):
        return period
    return None
