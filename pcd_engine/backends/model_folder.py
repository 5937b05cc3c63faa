"""What a model folder must hold before a loader (transformers or mlx-lm) is given it.

A model folder is untrusted input: pcd never runs code from it. Both backends load with ``trust_remote_code=False``
(explicit, so nothing prompts on a terminal either), read weights from safetensors only, and call
:func:`check_model_folder` first, so that a folder without ``config.json``, with a config that is not a JSON object,
or with only pickled weights (unpickling a checkpoint can run code it holds) is a
:class:`~pcd_engine.errors.ModelLoadError` naming the folder, instead of whatever the loader or torch raises.
"""

from __future__ import annotations

import json
from pathlib import Path

from pcd_engine.errors import ModelLoadError

__all__ = ["PICKLED_WEIGHTS", "check_model_folder"]

PICKLED_WEIGHTS = ("*.bin", "*.pt", "*.pth", "*.ckpt", "*.pkl", "*.pickle")
"""Weight files in Python's pickle format, which pcd refuses to load: unpickling can run code the file holds."""


def check_model_folder(path: str) -> None:
    """Refuse a model folder pcd cannot load safely, before any loader reads it.

    A path that is not a local folder (a repo id) is checked in its local Hugging Face cache snapshot when there is
    one; otherwise it is left to the loader, whose errors the backends wrap.

    Args:
        path: The local folder or repo id the backend was given.

    Raises:
        ModelLoadError: If the folder has no ``config.json``, its ``config.json`` is not a JSON object, or it holds
            no ``*.safetensors`` weights (naming the pickled ones it holds instead, if any).
    """
    folder = Path(path)
    local = folder.is_dir()
    if not local:
        cached = _cached_snapshot(path)
        if cached is None:
            return
        folder = cached
    config = folder / "config.json"
    if not config.is_file():
        raise ModelLoadError(
            f"Model {path!r}: expected a model folder with a config.json (or a folder with one .gguf file), but "
            f"{str(folder)!r} has no config.json."
        )
    try:
        data = json.loads(config.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as exc:
        raise ModelLoadError(f"Model {path!r}: expected config.json to be JSON, but reading failed ({exc}).") from None
    if not isinstance(data, dict):
        got = type(data).__name__
        raise ModelLoadError(f"Model {path!r}: expected config.json to hold a JSON object, but got {got}.")
    if any(folder.glob("*.safetensors")):
        return
    pickled = sorted(p.name for pattern in PICKLED_WEIGHTS for p in folder.glob(pattern))
    if pickled:
        raise ModelLoadError(
            f"Model {path!r}: expected weights in safetensors files, but the folder holds only pickled ones "
            f"({', '.join(pickled)}), which pcd never loads: unpickling a file can run code it holds. Convert them "
            "to safetensors (for example with transformers' save_pretrained in a session you trust)."
        )
    if local:  # a cache snapshot may hold the config alone, its weights still to fetch: the loader says so
        raise ModelLoadError(f"Model {path!r}: expected weights in *.safetensors files, but the folder holds none.")


def _cached_snapshot(repo: str) -> Path | None:
    """The local Hugging Face cache snapshot of ``repo`` (the folder its cached config.json lies in), if any."""
    try:
        from huggingface_hub import try_to_load_from_cache

        found = try_to_load_from_cache(repo, "config.json")
    except Exception:  # not a repo id the cache knows how to look up
        return None
    return Path(found).parent if isinstance(found, str) else None
