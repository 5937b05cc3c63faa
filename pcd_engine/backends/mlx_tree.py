"""The MLX side of tree-packed passes: loading mlx over a fast BLAS, the module wrappers, and the tree caches.

:class:`TreeLayer` is the thin per-layer cache of the packed scorer: it keeps the whole history by concatenation
and, during a pass, answers mlx-lm's ``make_mask`` with the tree mask and ``offset`` with per-token positions,
both read from the one :class:`TreePass` the layers share. :func:`module_wrappers` defines ``TreeRoPE`` (RoPE with
one position per token) and ``RowPicker`` (the final norm, then only the rows a pass reads). See
:mod:`pcd_engine.backends.mlx` for how the backend uses them. Importing this file never imports mlx.

On Linux the ``mlx[cpu]`` wheel ships a reference BLAS that is about 35x slower than OpenBLAS for fp32; when the
system has OpenBLAS (Debian: ``libopenblas0-pthread``) it is loaded with global symbols before mlx is first
imported, so mlx's BLAS calls resolve to it (:func:`preload_blas`). ``PCD_MLX_BLAS`` names another library, or
``none`` to skip this. OpenBLAS threads busy-wait between calls; a process that also runs PyTorch should set
``OPENBLAS_NUM_THREADS=1``.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import sys
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np

from pcd_engine.backends.taps import Seen
from pcd_engine.errors import PCDError, pip_install, require

__all__ = [
    "INSTALL_HINT",
    "TreeLayer",
    "TreePass",
    "copy_native",
    "decoder_layers",
    "final_norm",
    "hidden_taps",
    "import_mlx",
    "module_wrappers",
    "picked_forward",
    "picked_logprobs",
    "preload_blas",
    "stacked_layers",
]

INSTALL_HINT = f'{pip_install("mlx")} (on Linux: pip install "mlx[cpu]" mlx-lm)'


def preload_blas() -> bool:
    """Load OpenBLAS with global symbols so that mlx's BLAS calls bind to it instead of the reference BLAS.

    Only on Linux, and only before ``mlx.core`` is first imported (Python loads extensions with ``RTLD_NOW``, so
    the BLAS symbols are bound once, at import). :class:`MLXBackend` calls this itself; call it yourself first
    if your program imports ``mlx`` or ``mlx_lm`` before pcd. ``PCD_MLX_BLAS`` names the library to load, or
    ``none`` to keep the reference BLAS.

    Returns:
        True when a library was loaded by this call.
    """
    global _BLAS_TRIED
    choice = os.environ.get("PCD_MLX_BLAS", "")
    if _BLAS_TRIED or choice.lower() == "none" or not sys.platform.startswith("linux"):
        return False
    _BLAS_TRIED = True
    if "mlx.core" in sys.modules:
        warnings.warn(
            "mlx was imported before pcd could load OpenBLAS for it, so MLX runs on its reference BLAS (much slower "
            "on CPU). Import pcd_engine.backends.mlx and call preload_blas() before importing mlx or mlx_lm.",
            RuntimeWarning,
            stacklevel=3,
        )
        return False
    candidates = [choice] if choice else [ctypes.util.find_library("openblas") or "", "libopenblas.so.0"]
    for name in filter(None, candidates):
        try:
            ctypes.CDLL(name, mode=ctypes.RTLD_GLOBAL)
            return True
        except OSError:
            continue
    return False


_BLAS_TRIED = False


def import_mlx() -> Any:
    preload_blas()
    return require("mlx.core", "mlx_lm", what="Backend 'mlx'", install=INSTALL_HINT)[0]


@functools.cache
def module_wrappers() -> tuple[type, type]:
    """The two module wrappers, defined on first use so that importing this file never imports mlx."""
    import_mlx()
    import mlx.core as mx
    import mlx.nn as nn

    class TreeRoPE(nn.Module):
        """A layer's RoPE that also takes one position per token: ``offset`` of shape ``[L]`` (a batch of 1) or
        ``[B, L]`` (one row of positions per batch row)."""

        def __init__(self, inner: Any) -> None:
            super().__init__()
            self.inner = inner

        def __call__(self, x: Any, offset: Any = 0) -> Any:
            if isinstance(offset, mx.array) and offset.ndim == 1 and x.shape[0] == 1 and x.shape[-2] > 1:
                # [1, H, L, D] -> [L, H, 1, D]: one token per batch row, each with its own offset.
                return self.inner(x.transpose(2, 1, 0, 3), offset=offset).transpose(2, 1, 0, 3)
            if isinstance(offset, mx.array) and offset.ndim == 2:
                # [B, H, L, D] -> [B * L, H, 1, D], one offset per token, and back.
                b, h, length, d = x.shape
                flat = x.transpose(0, 2, 1, 3).reshape(b * length, h, 1, d)
                out = self.inner(flat, offset=offset.reshape(-1))
                return out.reshape(b, length, h, d).transpose(0, 2, 1, 3)
            return self.inner(x, offset=offset)

    class RowPicker(nn.Module):
        """The model's final norm, followed by keeping only the sequence rows the current pass reads."""

        def __init__(self, inner: Any, shared: TreePass) -> None:
            super().__init__()
            self.inner = inner
            self._shared = shared

        def __call__(self, x: Any) -> Any:
            keep = self._shared.keep
            if keep is None:
                out = self.inner(x)
            elif isinstance(keep, tuple):  # (batch rows, slots): the kept rows of a batch, as one row
                out = self.inner(x[keep[0], keep[1]][None])
            else:
                out = self.inner(x[:, keep])
            if self._shared.seen is not None:  # a feature tap keeps the final states
                self._shared.seen["last"] = out
            return out

    return TreeRoPE, RowPicker


class TreePass:
    """What the model reads through its caches during one packed pass: the mask and the positions."""

    def __init__(self) -> None:
        self.keep: Any = None
        self.seen: dict[str, Any] | None = None
        self.positions: Any = 0
        self._visible: np.ndarray | None = None
        self._distance: np.ndarray | None = None
        self._causal_only = False
        self._masks: dict[int | None, Any] = {}
        # Attention that applies the mask to grouped scores [B, kv_heads, repeats, L, S] (mlx-lm's gemma2)
        # needs a batched mask of [B, 1, 1, L, S]; every other takes [B, 1, L, S].
        self.grouped_scores = False

    def begin(self, visible: np.ndarray, qpos: np.ndarray, kpos: np.ndarray, *, causal_only: bool) -> None:
        """Start a pass: ``visible`` is ``[new, keys]`` (batch of 1) or ``[rows, new, keys]`` (batch rows), with
        the query and key positions to match."""
        mx = import_mlx()
        self._visible = visible
        self._distance = qpos[..., :, None] - kpos[..., None, :]
        self._causal_only = causal_only
        self._masks = {}
        past = int(kpos.shape[0] - qpos.shape[0])
        # A block of consecutive positions takes mlx's ordinary integer offset.
        self.positions = past if causal_only else mx.array(qpos.astype(np.int32))

    def end(self) -> None:
        self._visible = self._distance = None
        self._masks = {}
        self.positions = 0
        self.keep = None

    def mask(self, window: int | None, *, return_array: bool = False) -> Any:
        if self._visible is None or self._distance is None:
            raise RuntimeError("The packed MLX cache was used outside a pass.")
        if window is None and self._causal_only and not return_array:
            return "causal" if self._visible.shape[0] > 1 else None
        if window not in self._masks:
            mx = import_mlx()
            visible = self._visible if window is None else self._visible & (self._distance < window)
            if visible.ndim == 3:
                visible = visible[:, None, None] if self.grouped_scores else visible[:, None]
            self._masks[window] = mx.array(visible)
        return self._masks[window]


class TreeLayer:
    """One layer's KV cache for the packed scorer: the whole history, grown by concatenation (so a fork that
    shares arrays with its prefix never writes into them), with the current pass's mask and positions."""

    def __init__(self, shared: TreePass, *, window: int | None, keys: Any = None, values: Any = None) -> None:
        self.shared = shared
        self.window = window
        self.keys = keys
        self.values = values
        self.length = 0 if keys is None else int(keys.shape[2])

    @property
    def offset(self) -> Any:
        """What attention passes to RoPE: the integer start of a causal block, or one position per token."""
        return self.shared.positions

    def make_mask(self, n: int, *, window_size: int | None = None, return_array: bool = False) -> Any:
        return self.shared.mask(window_size or self.window, return_array=return_array)

    def update_and_fetch(self, keys: Any, values: Any) -> tuple[Any, Any]:
        if self.keys is None:
            self.keys, self.values = keys, values
        else:
            mx = import_mlx()
            self.keys = mx.concatenate([self.keys, keys], axis=2)
            self.values = mx.concatenate([self.values, values], axis=2)
        self.length = int(self.keys.shape[2])
        return self.keys, self.values

    def crop(self, n: int) -> None:
        if n and self.keys is not None:
            self.length -= n
            self.keys = self.keys[:, :, : self.length]
            self.values = self.values[:, :, : self.length]

    def fork(self) -> TreeLayer:
        return TreeLayer(self.shared, window=self.window, keys=self.keys, values=self.values)


def picked_forward(model: Any, shared: TreePass, picker: Any, device: Any, inputs: Any, cache: Any, keep: Any) -> Any:
    """One model call on ``device`` (``None``: MLX's default); float32 logits of the ``keep`` rows (all rows when
    ``None``). ``keep`` is a list of sequence rows (batch of 1), or a boolean ``[rows, new]`` mask whose kept rows come
    back as one row in (row, slot) order. The final norm's ``picker`` (``None`` when the model has no norm to wrap)
    keeps the rows before the vocabulary projection, reading ``shared``."""
    mx = import_mlx()
    if picker is not None:
        picker._shared = shared  # another backend on the same model may have wrapped it last
    where: Any = None
    if isinstance(keep, np.ndarray) and keep.ndim == 2:
        rows, slots = np.nonzero(keep)
        where = (mx.array(rows.astype(np.int32)), mx.array(slots.astype(np.int32)))
    elif keep is not None:
        where = mx.array(list(keep))
    shared.keep = None if picker is None else where
    try:
        if device is None:
            logits = model(inputs, cache=cache)
        else:
            with mx.stream(device):
                logits = model(inputs, cache=cache)
    finally:
        shared.keep = None
    if where is not None and picker is None:
        logits = logits[where[0], where[1]][None] if isinstance(where, tuple) else logits[:, where]
    return logits.astype(mx.float32)


def picked_logprobs(logits: Any, rows: Sequence[int], tokens: Sequence[int], arrays: list[Any]) -> np.ndarray:
    """``log_softmax(logits)[rows[i], tokens[i]]`` for each ``i``, as ``float64``, evaluated with ``arrays``
    (the caches the pass grew)."""
    mx = import_mlx()
    where = mx.array(list(rows))
    norm = mx.logsumexp(logits, axis=-1)
    picked = logits[where, mx.array(list(tokens))] - norm[where]
    mx.eval(picked, arrays)
    return np.array(picked, dtype=np.float64)


_FINAL_NORMS = ("norm", "embedding_norm", "final_layernorm")


def _decoder(model: Any) -> Any:
    """The module of an mlx-lm model that holds its decoder layers (``None`` when pcd finds none)."""
    language = getattr(model, "language_model", None)
    for owner in (getattr(model, "model", None), getattr(language, "model", None), language, model):
        layers = getattr(owner, "layers", None)
        if isinstance(layers, list) and layers:
            return owner
    return None


def decoder_layers(model: Any) -> list[Any]:
    """The decoder layers of an mlx-lm model, in order (the list its forward iterates).

    Raises:
        PCDError: If the model keeps them where pcd does not look.
    """
    owner = _decoder(model)
    if owner is None:
        raise PCDError(f"Hidden states: expected a model with decoder layers, but {type(model).__name__} has none.")
    return owner.layers  # type: ignore[no-any-return]


def final_norm(model: Any) -> tuple[Any, str]:
    """Where an mlx-lm model keeps its final norm (the module after the decoder layers, before the vocabulary
    projection): ``(owner, attribute)``, or ``(None, "")`` when it has none pcd knows."""
    owner = _decoder(model)
    for name in _FINAL_NORMS:
        if owner is not None and callable(getattr(owner, name, None)):
            return owner, name
    return None, ""


@contextmanager
def hidden_taps(model: Any, picker: Any, layer: int) -> Iterator[Seen]:
    """Expose hidden-state ``layer`` (the output of decoder layer ``layer - 1``) and the final states the vocabulary
    projection reads (what the backend's ``RowPicker`` passes on), for the model calls run inside the block: the
    layer is swapped for a recorder in the model's own list, and put back on exit.

    Raises:
        PCDError: If the model has no final norm to read the last states from.
    """
    mx = import_mlx()
    if picker is None:
        raise PCDError(f"Hidden states: expected a model with a final norm, but {type(model).__name__} has none.")
    layers = decoder_layers(model)
    inner = layers[layer - 1]
    got: dict[str, Any] = {}

    class Recorder:
        def __call__(self, *args: Any, **kwargs: Any) -> Any:
            out = inner(*args, **kwargs)
            got["middle"] = out[0] if isinstance(out, tuple) else out
            return out

        def __getattr__(self, name: str) -> Any:
            return getattr(inner, name)

    def middle(row: int, rows: list[int]) -> np.ndarray:
        return np.array(got["middle"][row][mx.array(rows)].astype(mx.float32), dtype=np.float64)

    def last(index: int) -> np.ndarray:
        states = got["last"]
        return np.array(states.reshape(-1, states.shape[-1])[index].astype(mx.float32), dtype=np.float64)

    layers[layer - 1] = Recorder()
    picker._shared.seen = got
    try:
        yield Seen(middle, last)
    finally:
        layers[layer - 1] = inner
        picker._shared.seen = None


def stacked_layers(
    shared: TreePass, windows: Sequence[int | None], caches: Sequence[Sequence[TreeLayer]], widest: int
) -> list[TreeLayer]:
    """One tree layer per model layer over several requests' caches (one batch row each), each left-padded with
    zeros to ``widest`` slots and stacked over the batch."""
    mx = import_mlx()

    def stacked(arrays: list[Any]) -> Any:
        ref = next(a for a in arrays if a is not None)
        rows = []
        for a in arrays:
            length = 0 if a is None else int(a.shape[2])
            pad = mx.zeros((1, ref.shape[1], widest - length, ref.shape[3]), dtype=ref.dtype)
            rows.append(pad if a is None else mx.concatenate([pad, a], axis=2) if length < widest else a)
        return mx.concatenate(rows, axis=0)

    layers = []
    for index, window in enumerate(windows):
        mine = [cache[index] for cache in caches]
        keys, values = stacked([m.keys for m in mine]), stacked([m.values for m in mine])
        layers.append(TreeLayer(shared, window=window, keys=keys, values=values))
    return layers


def copy_native(cache: Sequence[Any], *, repeat: int = 1) -> list[Any]:
    """Copy mlx-lm caches through their state (which carries the offset), repeated over ``repeat`` batch rows."""
    mx = import_mlx()
    from mlx.utils import tree_map

    def copy(x: Any) -> Any:
        if not isinstance(x, mx.array):
            return x
        return mx.repeat(x, repeat, axis=0) if repeat > 1 else mx.array(x)

    return [type(c).from_state(tree_map(copy, c.state)) for c in cache]
