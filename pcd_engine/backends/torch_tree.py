"""The tree-packed pieces of the PyTorch backend (:mod:`pcd_engine.backends.torch`), as
:mod:`pcd_engine.backends.mlx_tree` holds the MLX backend's: the tree masks a packed pass attends under, the fork of
a prefix's cache that a request writes into, the batch buffer several requests share
(:func:`filled_layer_class`), the log-probabilities a pass reads, and the hidden states a feature tap keeps
(:func:`hidden_taps`).
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np

from pcd_engine.backends.taps import Seen
from pcd_engine.errors import PCDError, pip_install, require

__all__ = ["decoder_layers", "filled_layer_class", "fork_cache", "hidden_taps", "import_torch", "picked_logprobs",
           "tree_masks"]  # fmt: skip


def import_torch() -> Any:
    """``torch``, or a :class:`~pcd_engine.errors.BackendUnavailableError` that says how to install it."""
    install = f"{pip_install('torch')} (on CPU: pip install torch==2.13.0 first)"
    return require("torch", what="Backend 'torch'", install=install)[0]


def decoder_layers(model: Any) -> Any:
    """The decoder layers of a transformers causal LM, in order (the ``layers`` of its decoder).

    Raises:
        PCDError: If the model keeps them where pcd does not look.
    """
    for owner in (getattr(model, "get_decoder", lambda: None)(), getattr(model, "model", None), model):
        layers = getattr(owner, "layers", None)
        if layers is not None and len(layers):
            return layers
    raise PCDError(f"Hidden states: expected a model with decoder layers, but {type(model).__name__} has none.")


@contextmanager
def hidden_taps(model: Any, layer: int, *, keep: Any = None) -> Iterator[Seen]:
    """Expose hidden-state ``layer`` (the output of decoder layer ``layer - 1``) and the final states the
    vocabulary projection reads, for the forward calls run inside the block (forward hooks, removed on exit).

    ``Seen.last`` indexes the rows the projection read, flattened in (batch row, slot) order; a model that ignored a
    boolean ``logits_to_keep`` mask (``keep``) and projected every row is cut to the kept rows first.
    """
    got: dict[str, Any] = {}

    def on_layer(_module: Any, _args: Any, output: Any) -> None:
        got["middle"] = output[0] if isinstance(output, tuple) else output

    def on_projection(_module: Any, args: Any) -> None:
        got["last"] = args[0]

    def middle(row: int, rows: list[int]) -> np.ndarray:
        return got["middle"][row, rows].double().cpu().numpy()  # type: ignore[no-any-return]

    def last(index: int) -> np.ndarray:
        states = got["last"]
        if keep is not None and states.ndim == 3 and states.shape[:2] == tuple(keep.shape):
            states = states[keep.to(states.device)]
        return states.reshape(-1, states.shape[-1])[index].double().cpu().numpy()  # type: ignore[no-any-return]

    handles = [
        decoder_layers(model)[layer - 1].register_forward_hook(on_layer),
        model.get_output_embeddings().register_forward_pre_hook(on_projection),
    ]
    try:
        yield Seen(middle, last)
    finally:
        for handle in handles:
            handle.remove()


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
