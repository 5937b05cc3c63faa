"""The tree-packed pieces of the PyTorch backend (:mod:`pcd_engine.backends.torch`), as
:mod:`pcd_engine.backends.mlx_tree` holds the MLX backend's: the tree masks a packed pass attends under, the fork of
a prefix's cache that a request writes into, the batch buffer several requests share
(:func:`filled_layer_class`), and the log-probabilities a pass reads.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import numpy as np

from pcd_engine.errors import pip_install, require

__all__ = ["filled_layer_class", "fork_cache", "import_torch", "picked_logprobs", "tree_masks"]


def import_torch() -> Any:
    """``torch``, or a :class:`~pcd_engine.errors.BackendUnavailableError` that says how to install it."""
    install = f"{pip_install('torch')} (on CPU: pip install torch==2.13.0 first)"
    return require("torch", what="Backend 'torch'", install=install)[0]


def fork_cache(cache: Any) -> Any:
    """A ``DynamicCache`` that shares ``cache``'s key and value tensors layer by layer and never writes into them
    (new tokens go into new tensors of the fork's own layers)."""
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer

    fork = DynamicCache()
    layers: list[Any] = []
    for layer in getattr(cache, "layers", []):
        shared = DynamicLayer()
        if layer.is_initialized:
            shared.lazy_initialization(layer.keys, layer.values)
            shared.keys, shared.values = layer.keys, layer.values
        layers.append(shared)
    fork.layers = layers
    return fork


def tree_masks(
    visible: np.ndarray, qpos: np.ndarray, kpos: np.ndarray, *, dtype: Any, device: Any, window: int | None
) -> Any:
    """Float 4-D masks (0 visible, the dtype's minimum hidden) from a visibility matrix (``[queries, keys]``, or
    ``[batch, queries, keys]`` with per-row positions): one tensor, or, for a model with sliding-window layers
    (``window``), one per layer type with the window built into the sliding one."""
    torch = import_torch()
    hidden = torch.finfo(dtype).min

    def to_tensor(v: np.ndarray) -> Any:
        mask = torch.zeros(v.shape, dtype=dtype, device=device)
        mask.masked_fill_(torch.from_numpy(~v).to(device), hidden)
        return mask[None, None] if v.ndim == 2 else mask[:, None]

    if window is None:
        return to_tensor(visible)
    sliding = visible & ((qpos[..., :, None] - kpos[..., None, :]) < window)
    return {"full_attention": to_tensor(visible), "sliding_attention": to_tensor(sliding)}


def picked_logprobs(logits: Any, rows: Sequence[int], tokens: Sequence[int]) -> np.ndarray:
    """``log_softmax(logits)[rows[i], tokens[i]]`` for each ``i``, as ``float64``, without the full softmax."""
    torch = import_torch()
    # Row blocks keep logsumexp cache-friendly over a large vocabulary (about 1.7x faster on CPU).
    norm = torch.cat([torch.logsumexp(block, dim=-1) for block in logits.split(32)])
    where = torch.tensor(list(rows), device=logits.device)
    picked = logits[where, torch.tensor(list(tokens), device=logits.device)] - norm[where]
    return picked.double().cpu().numpy()


@functools.cache
def filled_layer_class() -> Any:
    """The ``FilledLayer`` class (defined on first use, over transformers' ``DynamicLayer``): a cache layer over a
    preallocated buffer, one batch row per request."""
    from transformers.cache_utils import DynamicLayer

    class FilledLayer(DynamicLayer):  # type: ignore[misc]
        """A cache layer over a preallocated buffer: ``update`` writes the new keys and values into the next
        slots in place and returns the buffer up to them (a ``DynamicLayer`` would concatenate, copying the whole
        cache every pass)."""

        filled: int = 0
        keys: Any  # set by DynamicLayer.lazy_initialization
        values: Any

        @classmethod
        def of(cls, keys: list[Any], values: list[Any], widest: int, new: int) -> Any:
            """One buffer row per request: its cache right-aligned in the first ``widest`` slots, zeros around it,
            room for ``new`` slots after."""
            torch = import_torch()
            layer = cls()
            first = keys[0]
            shape = (len(keys), first.shape[1], widest + new, first.shape[-1])
            layer.lazy_initialization(first, values[0])
            layer.keys = torch.zeros(shape, dtype=first.dtype, device=first.device)
            layer.values = torch.zeros(
                (*shape[:-1], values[0].shape[-1]), dtype=values[0].dtype, device=values[0].device
            )
            for row, (k, v) in enumerate(zip(keys, values, strict=True)):
                length = k.shape[-2]
                if length:
                    layer.keys[row, :, widest - length : widest] = k[0]
                    layer.values[row, :, widest - length : widest] = v[0]
            layer.filled = widest
            return layer

        def reserve(self, more: int) -> None:
            """Make room for ``more`` slots after the filled ones (a larger buffer, when needed, with room to
            spare so that growing a row a token at a time copies the buffer only now and then)."""
            torch = import_torch()
            keys: Any = self.keys
            values: Any = self.values
            if self.filled + more <= keys.shape[2]:
                return
            size = self.filled + max(more, self.filled // 2, 16)
            bigger_k = torch.zeros((*keys.shape[:2], size, keys.shape[-1]), dtype=keys.dtype, device=keys.device)
            bigger_v = torch.zeros(
                (*values.shape[:2], size, values.shape[-1]), dtype=values.dtype, device=values.device
            )
            bigger_k[:, :, : self.filled] = keys[:, :, : self.filled]
            bigger_v[:, :, : self.filled] = values[:, :, : self.filled]
            self.keys, self.values = bigger_k, bigger_v

        def update(self, key_states: Any, value_states: Any, *args: Any, **kwargs: Any) -> tuple[Any, Any]:
            keys: Any = self.keys
            values: Any = self.values
            end = self.filled + key_states.shape[-2]
            keys[:, :, self.filled : end] = key_states
            values[:, :, self.filled : end] = value_states
            self.filled = end
            return keys[:, :, :end], values[:, :, :end]

        def get_seq_length(self) -> int:
            return int(self.filled)

    return FilledLayer
