"""Apple MLX backend on mlx-lm (0.32.x).

Tree-packed scoring: mlx-lm models read their attention mask from ``cache.make_mask(...)`` and their RoPE
positions from ``cache.offset``. The packed scorer therefore gives every layer a thin cache of its own
(``TreeLayer``) that keeps the whole history by concatenation and, during a pass, answers ``make_mask`` with
the tree mask (with the window built in for sliding layers) and ``offset`` with the per-token positions. MLX's
fused RoPE takes one offset per batch row only, so each attention layer's ``rope`` is wrapped once
(``TreeRoPE``) to move the tokens into the batch axis when it receives per-token positions; with an integer
offset the wrapper is a plain pass-through. The model's final norm is wrapped the same way (``RowPicker``)
so that the vocabulary projection runs only on the rows a pass reads.

Several documents batch the same way as on PyTorch (:meth:`Backend.score_trees`): each request's caches are
left-padded and stacked into one batch row per request, the mask is ``[rows, 1, new, keys]``, and the positions
``[rows, new]`` reach RoPE as one token per batch row.

Models whose default caches are not plain ``KVCache`` / ``RotatingKVCache`` (recurrent or hybrid layers such as
``ArraysCache``), or whose attention layers have no ``rope`` to wrap, fall back to row broadcast: the request's
own mlx-lm cache is copied with the cache API (``from_state``; the state carries the offset) and repeated over a
batch of rows, one root-to-leaf chain per row.

On Linux mlx is loaded over the system's OpenBLAS where there is one (see
:func:`~pcd_engine.backends.mlx_tree.preload_blas`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np

from pcd_engine.backends.capabilities import BatchedDocuments, FeatureTaps, PlainReference, RowBroadcast
from pcd_engine.backends.contract import Prefix, RequestState, serialized
from pcd_engine.backends.growth import estimate_pass_bytes
from pcd_engine.backends.mlx_load import load_checked, load_mlx_model
from pcd_engine.backends.mlx_tree import (
    TreeLayer,
    TreePass,
    copy_native,
    decoder_layers,
    final_norm,
    hidden_taps,
    import_mlx,
    module_wrappers,
    picked_forward,
    picked_logprobs,
    preload_blas,
    stacked_layers,
)
from pcd_engine.backends.taps import FeatureTap, Seen, record_chains, record_extension, record_pass
from pcd_engine.errors import OptionError
from pcd_engine.trees import TreeBatch

__all__ = ["MLXBackend", "load_mlx_model", "preload_blas"]

_MASKABLE_CACHES = {"KVCache", "RotatingKVCache"}
# Attention modules that reshape queries to [B, kv_heads, repeats, L, D] and mask the scores themselves.
_GROUPED_SCORES = {"mlx_lm.models.gemma2"}
# Attention modules that also use positions outside RoPE, computed from the cache offset as a batch of offsets
# (Ministral 3's Llama 4 query scaling): a packed pass's one-position-per-token offset would not fit them.
_POSITIONS_OUTSIDE_ROPE = {"mlx_lm.models.ministral3"}


@dataclass
class MLXPrefix(Prefix):
    """A prefilled head: its token ids and its per-layer caches."""

    ids: tuple[int, ...]
    cache: list[Any]
    length: int


@dataclass
class MLXState(RequestState):
    """A request: the forked caches, the ids they hold, and their count."""

    ids: list[int]
    cache: list[Any]
    length: int


class MLXBackend(BatchedDocuments, RowBroadcast, FeatureTaps, PlainReference):
    """Scores packed token trees with an mlx-lm model.

    Args:
        model: A loaded mlx-lm model (``mlx_lm.load(...)[0]``).
        tokenizer: Its Hugging Face tokenizer (an mlx-lm ``TokenizerWrapper`` is unwrapped).
        scorer: ``"auto"``, ``"packed"`` or ``"rows"``. ``"auto"`` picks packed when every default cache is a
            plain or rotating KV cache and every attention layer has a ``rope`` to wrap.
        device: ``None`` for MLX's default device, or ``"cpu"`` / ``"gpu"``.

    Raises:
        OptionError: If ``scorer`` or ``device`` is unknown, or ``"packed"`` is forced on a model that cannot do it.
        BackendUnavailableError: If mlx or mlx-lm is not installed.
    """

    name = "mlx"

    def __init__(self, model: Any, tokenizer: Any, *, scorer: str = "auto", device: str | None = None) -> None:
        mx = import_mlx()
        from mlx_lm.models.cache import make_prompt_cache
        from mlx_lm.tokenizer_utils import TokenizerWrapper

        if scorer not in ("auto", "packed", "rows"):
            raise OptionError(f"Scorer: expected 'auto', 'packed' or 'rows', but got {scorer!r}.")
        if device not in (None, "cpu", "gpu"):
            raise OptionError(f"Device (mlx): expected None, 'cpu' or 'gpu', but got {device!r}.")
        self.model = model
        self.tokenizer = tokenizer._tokenizer if isinstance(tokenizer, TokenizerWrapper) else tokenizer
        self.forward_passes = 0
        self._device = None if device is None else getattr(mx, device)
        self._args = getattr(model, "args", None)
        defaults = make_prompt_cache(model)
        kinds = {type(c).__name__ for c in defaults}
        layers = list(getattr(model, "layers", []))
        attention: list[Any] = [getattr(layer, "self_attn", None) for layer in layers]
        modules = sorted({type(a).__module__ for a in attention})
        maskable = (
            bool(layers)
            and kinds <= _MASKABLE_CACHES
            and all(hasattr(a, "rope") for a in attention)
            and not _POSITIONS_OUTSIDE_ROPE.intersection(modules)
        )
        if scorer == "packed" and not maskable:
            raise OptionError(
                "Scorer 'packed': expected plain or rotating KV caches and attention layers whose only use of "
                f"positions is a 'rope', but this model has caches {sorted(kinds)} and attention from {modules}. "
                "Use scorer='auto'."
            )
        self.scorer = "packed" if scorer == "auto" and maskable else ("rows" if scorer == "auto" else scorer)
        self._shared = TreePass()
        self._shared.grouped_scores = any(
            type(a).__module__ in _GROUPED_SCORES and getattr(a, "repeats", 1) > 1 for a in attention
        )
        # Sliding layers keep their whole history here; their window goes into the mask instead.
        self._windows = [c.max_size if type(c).__name__ == "RotatingKVCache" else None for c in defaults]
        tree_rope, row_picker = module_wrappers()
        if self.scorer == "packed":
            for attn in attention:
                if not isinstance(attn.rope, tree_rope):
                    attn.rope = tree_rope(attn.rope)
        inner, name = final_norm(model)
        norm = getattr(inner, name, None) if name else None
        self._picker: Any = None
        if norm is not None and callable(norm):
            self._picker = norm if isinstance(norm, row_picker) else row_picker(norm, self._shared)
            setattr(inner, name, self._picker)

    @classmethod
    def load(
        cls, path: str, *, device: str | None = None, dtype: str | None = None, scorer: str = "auto"
    ) -> MLXBackend:
        """Load a model with ``mlx_lm.load`` (:func:`~pcd_engine.backends.mlx_load.load_checked`): a local folder
        with ``config.json``, or a repo id in the local Hugging Face cache (MLX conversions, 4-bit included; a folder
        written by transformers 5 loads as it is). ``device``: ``None``, ``"cpu"`` or ``"gpu"``; ``dtype``: ``None``
        keeps the stored weights, ``"float32"``, ``"bfloat16"`` or ``"float16"`` casts the floating-point ones.

        Raises:
            ModelLoadError: If the model cannot be loaded.
            OptionError: If ``dtype`` is unknown.
        """
        model, tokenizer = load_checked(path, dtype=dtype)
        return cls(model, tokenizer, scorer=scorer, device=device)

    @property
    def max_context(self) -> int:
        """The model's ``max_position_embeddings`` (or 32768 when its arguments have none)."""
        return int(getattr(self._args, "max_position_embeddings", 0) or 32768)

    # ------------------------------------------------------------------------------------------ contract

    @serialized
    def prefill(self, ids: Sequence[int], *, chunk: int | None = None) -> MLXPrefix:
        """Run the head once (in causal chunks when ``chunk`` is given) and keep its cache: tree layers
        (packed), or the model's own caches (rows)."""
        ids = tuple(int(i) for i in ids)
        step = max(1, chunk or len(ids) or 1)
        if self.scorer == "rows":
            cache = self._extend_native(None, [])[0]
            for start in range(0, len(ids), step):
                cache = self._extend_native(cache, list(ids[start : start + step]))[0]
            return MLXPrefix(ids, cache, len(ids))
        cache = self._new_cache()
        empty = TreeBatch((), (), (), (), (), ())
        for start in range(0, len(ids), step):
            self._packed_pass(cache, start, list(ids[start : start + step]), empty)
        return MLXPrefix(ids, cache, len(ids))

    @serialized
    def start(self, prefix: Prefix) -> MLXState:
        """Fork the prefix: tree layers share its arrays (they only ever concatenate); the rows scorer copies the
        model's own caches with ``from_state``, because a ``KVCache`` writes into its buffer in place."""
        if not isinstance(prefix, MLXPrefix):
            raise TypeError(f"start: expected an MLXPrefix, but got {type(prefix).__name__}.")
        if self.scorer == "rows":
            return MLXState(list(prefix.ids), self._copy_native(prefix.cache), prefix.length)
        return MLXState(list(prefix.ids), self._fork(prefix.cache), prefix.length)

    @serialized
    def score_tree(self, state: RequestState, *, causal: Sequence[int], batch: TreeBatch) -> np.ndarray:
        """Append ``causal`` and read the tree's log-probabilities in one pass (see :class:`Backend`)."""
        if not isinstance(state, MLXState):
            raise TypeError(f"score_tree: expected an MLXState, but got {type(state).__name__}.")
        return self._append_and_score(state, causal, batch)

    @property
    def default_batch_size(self) -> int:
        """1 on CPU, where batched passes gained nothing reliable over one document per pass
        (``benchmarks/bench_batch.py --backend mlx``: 0.91-1.09x at 4, 0.93-0.96x at 16-32); 32 with Metal,
        where a pass of one document is mostly fixed cost (the PyTorch backend's GPU default; not measured on
        Apple silicon here)."""
        if not self.batches_documents:
            return 1
        return 32 if self._on_metal() else 1

    def _on_metal(self) -> bool:
        """Whether passes run on Metal (available, and the backend was not pinned to the CPU)."""
        mx = import_mlx()
        try:
            return bool(mx.metal.is_available()) and self._device != mx.cpu
        except (AttributeError, RuntimeError):
            return False

    def stream_greedy(self, ids: Sequence[int], *, max_new_tokens: int) -> Iterator[int]:
        """Plain greedy decoding with the model's own caches and masks."""
        mx = import_mlx()
        from mlx_lm.models.cache import make_prompt_cache

        cache = make_prompt_cache(self.model)
        inputs = [int(i) for i in ids]
        for _ in range(max_new_tokens):
            with self.model_lock:
                logits = self._forward(mx.array([inputs]), cache, keep=[len(inputs) - 1])
                token = int(mx.argmax(logits[0, -1]).item())
            yield token
            inputs = [token]

    @serialized
    def sequence_logprobs(self, ids: Sequence[int]) -> np.ndarray:
        """One plain causal pass over ``ids`` with no cache (see :meth:`PlainReference.sequence_logprobs`)."""
        mx = import_mlx()
        logits = self._forward(mx.array([list(ids)]), None, keep=None)[0, :-1]
        logp = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        picked = mx.take_along_axis(logp, mx.array(list(ids)[1:])[:, None], axis=-1)[:, 0]
        return np.array(picked, dtype=np.float64)

    def plain_pass(self, prefix: Prefix, tokens: Sequence[int], *, rows: int) -> Callable[[], None]:
        """See :meth:`PlainReference.plain_pass` (the preamble runs once through mlx-lm's caches, copied per run)."""
        mx = import_mlx()
        if not isinstance(prefix, MLXPrefix):
            raise TypeError(f"plain_pass: expected an MLXPrefix, but got {type(prefix).__name__}.")
        native, _ = self._extend_native(None, list(prefix.ids))
        inputs, keep = mx.array([list(tokens)]), list(range(len(tokens) - rows, len(tokens)))

        def run() -> None:
            mx.eval(self._forward(inputs, self._copy_native(native), keep=keep))

        return run

    @property
    def weights_dtype(self) -> str:
        """See :attr:`PlainReference.weights_dtype`."""
        from mlx.utils import tree_flatten

        flat: Any = tree_flatten(self.model.parameters())
        dtypes = {str(v.dtype).removeprefix("mlx.core.") for _, v in flat}
        return dtypes.pop() if len(dtypes) == 1 else "mixed"

    @property
    def default_memory_budget_mb(self) -> float:
        """1 GiB on CPU; with Metal a quarter of the unified memory, at most 16 GiB."""
        mx = import_mlx()
        try:
            if self._on_metal():
                total = float(mx.metal.device_info()["memory_size"]) / 2**20
                return float(min(total / 4, 16384.0))
        except (AttributeError, KeyError, RuntimeError):
            pass
        return 1024.0

    def pass_bytes(self, *, past: int, new: int, rows: int) -> int:
        """See :func:`~pcd_engine.backends.contract.estimate_pass_bytes`."""
        masks = 2 if any(w is not None for w in self._windows) else 1
        return estimate_pass_bytes(self._args, past=past, new=new, rows=rows, masks=masks)

    # ------------------------------------------------------------------------------------------ packed

    def _new_cache(self) -> list[TreeLayer]:
        return [TreeLayer(self._shared, window=w) for w in self._windows]

    def _fork(self, cache: list[Any]) -> list[TreeLayer]:
        return [layer.fork() for layer in cache]

    def _forward(self, inputs: Any, cache: list[Any] | None, *, keep: Sequence[int] | np.ndarray | None) -> Any:
        """One model call; returns float32 logits of the ``keep`` rows (all rows when ``None``). ``keep`` is a list
        of sequence rows (batch of 1), or a boolean ``[rows, new]`` mask whose kept rows come back as one row in
        (row, slot) order."""
        logits = picked_forward(self.model, self._shared, self._picker, self._device, inputs, cache, keep)
        self.forward_passes += 1
        return logits

    @contextmanager
    def _tapping(self, layer: int | None, *, keep: np.ndarray | None = None) -> Iterator[Seen | None]:
        """See :meth:`FeatureTaps._tapping` (:func:`~pcd_engine.backends.mlx_tree.hidden_taps`)."""
        if layer is None:
            yield None
            return
        if self._picker is not None:
            self._picker._shared = self._shared  # as _forward does: the pass reads this backend's TreePass
        with hidden_taps(self.model, self._picker, layer) as seen:
            yield seen

    @property
    def hidden_layers(self) -> int:
        """The model's decoder layers."""
        return len(decoder_layers(self.model))

    def _packed_pass(
        self, cache: list[TreeLayer], past: int, causal: list[int], batch: TreeBatch, *, tap: FeatureTap | None = None
    ) -> np.ndarray:
        mx = import_mlx()
        n = len(batch.tokens)
        if not causal and n == 0:
            return np.zeros(0)
        visible, qpos, kpos = batch.visibility(past, len(causal))
        rows = [r + len(causal) for r in batch.query_rows]
        keep = sorted(set(rows)) if rows else [len(causal) + n - 1]
        self._shared.begin(visible, qpos, kpos, causal_only=n == 0)
        try:
            with self._tapping(None if tap is None else tap.layer) as seen:
                logits = self._forward(mx.array([causal + list(batch.tokens)]), cache, keep=keep)[0]
        finally:
            self._shared.end()
        if tap is not None and seen is not None:
            record_pass(tap, seen, past=past, fed=len(causal), batch=batch, kept=keep.index)
        for layer in cache:
            layer.crop(n)
        if not batch.query_rows:
            mx.eval([a for layer in cache for a in (layer.keys, layer.values)])
            return np.zeros(0)
        index = {row: i for i, row in enumerate(keep)}
        arrays = [a for layer in cache for a in (layer.keys, layer.values)]
        return picked_logprobs(logits, [index[r] for r in rows], batch.query_tokens, arrays)

    @serialized
    def _grow_pass(
        self,
        cache: list[TreeLayer],
        tokens: list[int],
        visible: np.ndarray,
        qpos: np.ndarray,
        kpos: np.ndarray,
        read: list[int],
    ) -> np.ndarray:
        """One packed pass that keeps its tokens in ``cache`` (see :meth:`PackedTrees._grow_pass`)."""
        mx = import_mlx()
        keep = sorted(set(read))
        self._shared.begin(visible, qpos, kpos, causal_only=False)
        try:
            logits = self._forward(mx.array([tokens]), cache, keep=keep)[0]
        finally:
            self._shared.end()
        index = {row: i for i, row in enumerate(keep)}
        picked = logits[mx.array([index[r] for r in read])]
        out = picked - mx.logsumexp(picked, axis=-1, keepdims=True)
        mx.eval(out, [a for layer in cache for a in (layer.keys, layer.values)])
        return np.array(out, dtype=np.float32)

    def _buffered_cache(self, states: list[Any], widest: int, room: int) -> list[TreeLayer]:
        """See :meth:`BatchedDocuments._buffered_cache`: each layer one tree layer over the states' caches, left-padded
        with zeros to ``widest`` slots and stacked over the batch (the pass appends by concatenation, so
        ``room`` needs no preallocation)."""
        if not all(isinstance(s, MLXState) for s in states):
            raise TypeError("score_trees: expected MLXState objects.")
        return stacked_layers(self._shared, self._windows, [s.cache for s in states], widest)

    def _buffered_room(self, cache: Any, more: int) -> int:
        """See :meth:`BatchedDocuments._buffered_room` (tree layers grow by concatenation)."""
        return int(cache[0].length)

    def _buffered_pass(
        self,
        cache: Any,
        ids: np.ndarray,
        qpos: np.ndarray,
        visible: np.ndarray,
        kpos: np.ndarray,
        keep: np.ndarray,
        *,
        picks: Sequence[tuple[int, int]] | None = None,
    ) -> np.ndarray:
        """See :meth:`BatchedDocuments._buffered_pass` (positions reach ``TreeRoPE`` as ``[rows, new]``)."""
        mx = import_mlx()
        self._shared.begin(visible, qpos, kpos, causal_only=False)
        try:
            logits = self._forward(mx.array(ids.astype(np.int32)), cache, keep=keep)[0]
        finally:
            self._shared.end()
        arrays = [a for layer in cache for a in (layer.keys, layer.values)]
        if picks is None:
            out = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
            mx.eval(out, arrays)
            return np.array(out, dtype=np.float32)
        if not picks:
            mx.eval(arrays)
            return np.zeros(0)
        return picked_logprobs(logits, [row for row, _ in picks], [token for _, token in picks], arrays)

    def _buffered_adopt(self, state: Any, cache: Any, row: int, lo: int, hi: int) -> None:
        """See :meth:`BatchedDocuments._buffered_adopt`: the state's layers become slices of the stacked arrays."""
        for layer, filled in zip(state.cache, cache, strict=True):
            layer.keys = filled.keys[row : row + 1, :, lo:hi]
            layer.values = filled.values[row : row + 1, :, lo:hi]
            layer.length = hi - lo

    # ------------------------------------------------------------------------------------------ rows fallback

    def _copy_native(self, cache: list[Any], *, repeat: int = 1) -> list[Any]:
        """Copy mlx-lm caches through their state (which carries the offset), optionally repeated over a batch."""
        return copy_native(cache, repeat=repeat)

    def _extend_native(self, cache: list[Any] | None, ids: list[int]) -> tuple[list[Any], Any]:
        """Run ``ids`` on top of the model's own caches (``None`` starts them); return them and the last logits."""
        mx = import_mlx()
        from mlx_lm.models.cache import make_prompt_cache

        if cache is None:
            cache = make_prompt_cache(self.model)
        if not ids:
            return cache, None
        logits = self._forward(mx.array([ids]), cache, keep=[len(ids) - 1])[0, -1]
        mx.eval(logits, [c.state for c in cache])
        return cache, logits

    def _rows_pass(self, state: MLXState, causal: list[int], batch: TreeBatch, *, rows_per_call: int = 8) -> np.ndarray:
        """Row broadcast: extend the request's own caches by ``causal``, then score each root-to-leaf chain as a
        row on a copy of them repeated over the batch (right-padded; padding comes after every read)."""
        mx = import_mlx()
        tap, past, fed = state.tap, state.length, len(causal)
        with self._tapping(None if tap is None else tap.layer) as seen:
            state.cache, last = self._extend_native(state.cache, causal)
        if tap is not None and seen is not None and causal:
            record_extension(tap, seen, past=past, fed=fed, batch=batch)
        state.ids.extend(causal)
        state.length += len(causal)
        chains, row_of = batch.chains()
        dists: dict[int, Any] = {}
        if last is not None:
            dists[-1] = last - mx.logsumexp(last)
        wanted = {r for r in batch.query_rows if r >= 0}
        for start in range(0, len(chains), rows_per_call):
            group = chains[start : start + rows_per_call]
            if not any(node in wanted for chain in group for node in chain):
                continue
            longest = max(len(c) for c in group)
            inputs = np.zeros((len(group), longest), dtype=np.int32)
            for g, chain in enumerate(group):
                inputs[g, : len(chain)] = [batch.tokens[c] for c in chain]
            rows_cache = self._copy_native(state.cache, repeat=len(group))
            with self._tapping(None if tap is None else tap.layer) as seen:
                logits = self._forward(mx.array(inputs), rows_cache, keep=None)
            if tap is not None and seen is not None:
                record_chains(tap, seen, fed=fed, batch=batch, row_of=row_of, first=start, count=len(group),
                              longest=longest)  # fmt: skip
            for node in wanted:
                chain_index, offset = row_of[node]
                if start <= chain_index < start + len(group):
                    row = logits[chain_index - start, offset]
                    dists[node] = row - mx.logsumexp(row)
        if not batch.query_rows:
            return np.zeros(0)
        picked = mx.stack([dists[row][token] for row, token in zip(batch.query_rows, batch.query_tokens, strict=True)])
        return np.array(picked, dtype=np.float64)

    @serialized
    def _rows_start(self, state: MLXState, causal: list[int], rows: int) -> list[Any]:
        """Extend the state's own caches by ``causal``; return copies repeated over ``rows`` batch rows."""
        state.cache, _ = self._extend_native(state.cache, causal)
        state.ids.extend(causal)
        state.length += len(causal)
        return self._copy_native(state.cache, repeat=rows)

    @serialized
    def _rows_step(self, cache: list[Any], tokens: list[int]) -> np.ndarray:
        """One token per batch row on the repeated caches (see :meth:`RowBroadcast._rows_step`)."""
        mx = import_mlx()
        logits = self._forward(mx.array(np.asarray(tokens, dtype=np.int32)[:, None]), cache, keep=None)[:, -1]
        out = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        mx.eval(out, [c.state for c in cache])
        return np.array(out, dtype=np.float32)
