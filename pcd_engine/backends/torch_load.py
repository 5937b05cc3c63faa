"""Loading a model folder for the PyTorch backend (:mod:`pcd_engine.backends.torch`), as
:mod:`pcd_engine.backends.mlx_load` does for MLX: the folder checked before any loader, transformers' own classes only
(a folder's own code never runs), safetensors only.
"""

from __future__ import annotations

from typing import Any

from pcd_engine.backends.model_folder import check_model_folder
from pcd_engine.backends.torch_tree import import_torch
from pcd_engine.errors import ModelLoadError, OptionError

__all__ = ["load_model"]


def load_model(path: str, *, device: str | None = None, dtype: str | None = None) -> tuple[Any, Any]:
    """Load a model folder (or a repo id in the local Hugging Face cache): the model on ``device`` and its tokenizer.

    Args:
        path: A local folder with ``config.json``, or a repo id in the local Hugging Face cache.
        device: ``"cpu"``, ``"cuda"``, ...; defaults to CUDA when available.
        dtype: ``"float32"``, ``"bfloat16"`` or ``"float16"``; defaults to float32 on CPU, bfloat16 on CUDA.

    Raises:
        ModelLoadError: If the model cannot be loaded.
        OptionError: If ``dtype`` is unknown.
    """
    torch = import_torch()
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    if dtype is None:
        torch_dtype = torch.float32 if device == "cpu" else torch.bfloat16
    else:
        torch_dtype = getattr(torch, dtype, None)
        if not isinstance(torch_dtype, torch.dtype):
            raise OptionError(f"dtype: expected 'float32', 'bfloat16' or 'float16', but got {dtype!r}.")
    check_model_folder(path)
    try:
        config = AutoConfig.from_pretrained(path, trust_remote_code=False)  # never run a folder's code
        softcap = getattr(config.get_text_config(), "attn_logit_softcapping", None)
        kernel = "eager" if softcap else "sdpa"
        try:
            model = AutoModelForCausalLM.from_pretrained(
                path, dtype=torch_dtype, attn_implementation=kernel, trust_remote_code=False, use_safetensors=True
            )
        except ValueError as exc:  # e.g. gpt-oss (attention sinks): transformers has no SDPA path for it
            if kernel != "sdpa" or "scaled_dot_product_attention" not in str(exc):
                raise
            model = AutoModelForCausalLM.from_pretrained(
                path, dtype=torch_dtype, attn_implementation="eager", trust_remote_code=False, use_safetensors=True
            )
        tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=False)
    except OSError as exc:
        raise ModelLoadError(
            f"Model {path!r}: expected a local model folder or a repo id in the local Hugging Face cache, but "
            f"loading failed: {str(exc).splitlines()[0]}"
        ) from exc
    except ValueError as exc:
        if "trust_remote_code" not in str(exc):
            raise
        raise ModelLoadError(
            f"Model {path!r}: expected a model transformers implements itself, but the folder names its own "
            "Python code, which pcd never runs."
        ) from exc
    loaded: Any = model
    return loaded.to(device), tokenizer
