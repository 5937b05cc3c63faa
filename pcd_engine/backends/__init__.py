"""Backends: the only code that touches tensors. Each backend file implements :class:`Backend`."""

from __future__ import annotations

import importlib.util
import platform
import sys

from pcd_engine.backends.contract import Backend, Prefix, RequestState
from pcd_engine.errors import BackendUnavailableError

__all__ = ["BACKENDS", "Backend", "Prefix", "RequestState", "select_backend"]

BACKENDS = ("torch", "mlx")


def select_backend(name: str) -> str:
    """Resolve a backend name without importing any tensor library.

    Args:
        name: ``"auto"``, ``"torch"`` or ``"mlx"``. ``"auto"`` is MLX on Apple silicon when both ``mlx`` and
            ``mlx_lm`` are installed, and PyTorch everywhere else.

    Returns:
        ``"torch"`` or ``"mlx"``.

    Raises:
        BackendUnavailableError: If the name is unknown.
    """
    if name == "auto":
        apple = sys.platform == "darwin" and platform.machine() == "arm64"
        has_mlx = all(importlib.util.find_spec(m) is not None for m in ("mlx", "mlx_lm"))
        return "mlx" if apple and has_mlx else "torch"
    if name not in BACKENDS:
        raise BackendUnavailableError(f"Backend: expected 'auto', 'torch' or 'mlx', but got {name!r}.")
    return name
