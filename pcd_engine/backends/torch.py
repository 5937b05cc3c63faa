"""PyTorch backend on transformers ``AutoModelForCausalLM``.

Tree-packed scoring: the causal tokens and every fed tree node go into one sequence after the cached prefix,
with per-token ``position_ids`` (a node sits at the position after the causal block plus its depth) and a 4-D
float mask (0 visible, a large negative number hidden) that lets each node see the prefix, the causal block and
its own ancestors. Models with sliding-window layers get a dict of masks, one per layer type, with the window
built into the sliding one; their caches are kept whole (plain ``DynamicLayer``), so cropping the tree back off
is exact. Models whose cache cannot branch by masking (recurrent or hybrid layers, attention kernels that take
no custom mask) fall back to row broadcast: the request's own model cache is copied and repeated over a batch
of rows, one root-to-leaf chain per row.
"""

from __future__ import annotations

import copy
import inspect
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np

from pcd_engine.backends.capabilities import BatchedDocuments, FeatureTaps, PlainReference, RowBroadcast
from pcd_engine.backends.contract import Prefix, RequestState, serialized
from pcd_engine.backends.growth import estimate_pass_bytes
from pcd_engine.backends.taps import FeatureTap, Seen, record_chains, record_extension, record_pass
from pcd_engine.backends.torch_load import load_model
from pcd_engine.backends.torch_tree import (
    decoder_layers,
    filled_layer_class,
    fork_cache,
    hidden_taps,
    import_torch,
    picked_logprobs,
    tree_masks,
)
from pcd_engine.errors import OptionError
from pcd_engine.trees import TreeBatch

__all__ = ["TorchBackend"]

_MASKABLE_LAYERS = {"full_attention", "sliding_attention"}
_MASKABLE_KERNELS = {"eager", "sdpa"}


@dataclass
class TorchPrefix(Prefix):
    """A prefilled head: its token ids and (for the packed scorer) its KV cache."""

    ids: tuple[int, ...]
    cache: Any
    length: int


@dataclass
class TorchState(RequestState):
    """A request: the forked cache, the ids it holds, and their count."""

    ids: list[int]
    cache: Any
    length: int


class TorchBackend(BatchedDocuments, RowBroadcast, FeatureTaps, PlainReference):
    """Scores packed token trees with a transformers causal LM.

    Args:
        model: A loaded ``PreTrainedModel`` for causal LM.
        tokenizer: Its tokenizer.
        scorer: ``"auto"``, ``"packed"`` or ``"rows"``. ``"auto"`` picks packed when every layer is full or
            sliding attention and the attention kernel takes a custom mask.

    Raises:
        OptionError: If ``scorer`` is unknown, or ``"packed"`` is forced on a model that cannot do it.
    """

    name = "torch"

    def __init__(self, model: Any, tokenizer: Any, *, scorer: str = "auto") -> None:
        torch = import_torch()
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.forward_passes = 0
        config = model.config.get_text_config()
        self._config = config
        self._layer_types = list(getattr(config, "layer_types", None) or [])
        self._sliding = "sliding_attention" in self._layer_types
        self._window = int(getattr(config, "sliding_window", 0) or 0)
        kernel = getattr(model.config, "_attn_implementation", "eager") or "eager"
        maskable = set(self._layer_types) <= _MASKABLE_LAYERS and kernel in _MASKABLE_KERNELS
        if scorer not in ("auto", "packed", "rows"):
            raise OptionError(f"Scorer: expected 'auto', 'packed' or 'rows', but got {scorer!r}.")
        if scorer == "packed" and not maskable:
            raise OptionError(
                f"Scorer 'packed': expected full or sliding attention layers with an eager/sdpa kernel, but this "
                f"model has layers {sorted(set(self._layer_types))} and kernel {kernel!r}. Use scorer='auto'."
            )
        self.scorer = "packed" if scorer == "auto" and maskable else ("rows" if scorer == "auto" else scorer)
        self._device = next(model.parameters()).device
        self._dtype = next(model.parameters()).dtype
        self._grad = torch.no_grad
        # transformers renamed `past_key_values` to `cache`; take whichever this version's forward accepts.
        params = inspect.signature(model.forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"

    @classmethod
    def load(
        cls, path: str, *, device: str | None = None, dtype: str | None = None, scorer: str = "auto"
    ) -> TorchBackend:
        """Load a model folder or Hugging Face repo id.

        Args:
            path: A local folder with ``config.json``, or a repo id in the local Hugging Face cache.
            device: ``"cpu"``, ``"cuda"``, ...; defaults to CUDA when available.
            dtype: ``"float32"``, ``"bfloat16"`` or ``"float16"``; defaults to float32 on CPU, bfloat16 on CUDA.
            scorer: See :class:`TorchBackend`.

        Raises:
            ModelLoadError: If the model cannot be loaded.
        """
        model, tokenizer = load_model(path, device=device, dtype=dtype)
        return cls(model, tokenizer, scorer=scorer)

    @property
    def max_context(self) -> int:
        """The model's ``max_position_embeddings`` (or 32768 when the config has none)."""
        return int(getattr(self._config, "max_position_embeddings", 0) or 32768)

    # ------------------------------------------------------------------------------------------ contract

    @serialized
    def prefill(self, ids: Sequence[int], *, chunk: int | None = None) -> TorchPrefix:
        """Run the head once (in causal chunks when ``chunk`` is given) and keep its cache: plain layers
        (packed), or the model's own cache (rows)."""
        ids = tuple(int(i) for i in ids)
        step = max(1, chunk or len(ids) or 1)
        if self.scorer == "rows":
            cache = None
            for start in range(0, len(ids), step):
                cache = self._extend_native(cache, list(ids[start : start + step]))[0]
            return TorchPrefix(ids, cache, len(ids))
        cache = self._new_cache()
        empty = TreeBatch((), (), (), (), (), ())
        for start in range(0, len(ids), step):
            self._packed_pass(cache, start, list(ids[start : start + step]), empty)
        return TorchPrefix(ids, cache, len(ids))

    def start(self, prefix: Prefix) -> TorchState:
        """Fork the prefix: new cache layers that share the prefix's tensors (``update`` concatenates into new
        tensors, so the prefix is never written to). The rows scorer deep-copies the model's own cache, whose
        layers may update in place."""
        if not isinstance(prefix, TorchPrefix):
            raise TypeError(f"start: expected a TorchPrefix, but got {type(prefix).__name__}.")
        if self.scorer == "rows":
            return TorchState(list(prefix.ids), copy.deepcopy(prefix.cache), prefix.length)
        return TorchState(list(prefix.ids), self._fork(prefix.cache), prefix.length)

    @serialized
    def score_tree(self, state: RequestState, *, causal: Sequence[int], batch: TreeBatch) -> np.ndarray:
        """Append ``causal`` and read the tree's log-probabilities in one pass (see :class:`Backend`)."""
        if not isinstance(state, TorchState):
            raise TypeError(f"score_tree: expected a TorchState, but got {type(state).__name__}.")
        return self._append_and_score(state, causal, batch)

    @property
    def default_batch_size(self) -> int:
        """4 on CPU, where a pass costs about its tokens and batching mostly saves per-pass overhead (measured in
        ``benchmarks/bench_batch.py``); 32 on an accelerator, where a pass of one document is mostly fixed cost."""
        if not self.batches_documents:
            return 1
        return 4 if self._device.type == "cpu" else 32

    def stream_greedy(self, ids: Sequence[int], *, max_new_tokens: int) -> Iterator[int]:
        """Plain greedy decoding with the model's own cache and masks."""
        torch = import_torch()
        from transformers import DynamicCache

        cache = DynamicCache(config=self.model.config)
        inputs = torch.tensor([list(ids)], device=self._device)
        for _ in range(max_new_tokens):
            with self._grad(), self.model_lock:
                logits = self.model(
                    input_ids=inputs, **{self._cache_kw: cache}, use_cache=True, logits_to_keep=1
                ).logits
            self.forward_passes += 1
            token = int(logits[0, -1].argmax())
            yield token
            inputs = torch.tensor([[token]], device=self._device)

    @serialized
    def sequence_logprobs(self, ids: Sequence[int]) -> np.ndarray:
        """One plain causal pass over ``ids`` with no cache (see :meth:`PlainReference.sequence_logprobs`)."""
        torch = import_torch()
        with self._grad():
            logits = self.model(input_ids=torch.tensor([list(ids)], device=self._device), use_cache=False).logits
        self.forward_passes += 1
        logp = torch.log_softmax(logits[0, :-1].double(), dim=-1)
        targets = torch.tensor(list(ids)[1:], device=logp.device)
        return logp.gather(1, targets[:, None])[:, 0].cpu().numpy()

    def plain_pass(self, prefix: Prefix, tokens: Sequence[int], *, rows: int) -> Callable[[], None]:
        """See :meth:`PlainReference.plain_pass`."""
        torch = import_torch()
        inputs = torch.tensor([list(tokens)], device=self._device)

        def run() -> None:
            state = self.start(prefix)
            with self._grad(), self.model_lock:
                self.model(input_ids=inputs, **{self._cache_kw: state.cache}, use_cache=True, logits_to_keep=rows)
            self.forward_passes += 1

        return run

    @property
    def weights_dtype(self) -> str:
        """See :attr:`PlainReference.weights_dtype`."""
        dtypes = {str(p.dtype).removeprefix("torch.") for p in self.model.parameters()}
        return dtypes.pop() if len(dtypes) == 1 else "mixed"

    @property
    def default_memory_budget_mb(self) -> float:
        """1 GiB on CPU; on a GPU a quarter of its memory, at most 16 GiB."""
        if self._device.type != "cuda":
            return 1024.0
        total = import_torch().cuda.get_device_properties(self._device).total_memory / 2**20
        return float(min(total / 4, 16384.0))

    def pass_bytes(self, *, past: int, new: int, rows: int) -> int:
        """See :func:`~pcd_engine.backends.contract.estimate_pass_bytes`."""
        return estimate_pass_bytes(self._config, past=past, new=new, rows=rows, masks=2 if self._sliding else 1)

    # ------------------------------------------------------------------------------------------ packed

    def _new_cache(self) -> Any:
        from transformers import DynamicCache

        return DynamicCache()

    def _fork(self, cache: Any) -> Any:
        return fork_cache(cache)

    def _masks(self, visible: np.ndarray, qpos: np.ndarray, kpos: np.ndarray) -> Any:
        """Float 4-D masks from a visibility matrix (:func:`~pcd_engine.backends.torch_tree.tree_masks`)."""
        window = self._window if self._sliding else None
        return tree_masks(visible, qpos, kpos, dtype=self._dtype, device=self._device, window=window)

    @contextmanager
    def _tapping(self, layer: int | None, *, keep: np.ndarray | None = None) -> Iterator[Seen | None]:
        """See :meth:`FeatureTaps._tapping` (forward hooks: :func:`~pcd_engine.backends.torch_tree.hidden_taps`)."""
        if layer is None:
            yield None
            return
        mask = None if keep is None else import_torch().from_numpy(keep)
        with hidden_taps(self.model, layer, keep=mask) as seen:
            yield seen

    @property
    def hidden_layers(self) -> int:
        """The model's decoder layers (``num_hidden_layers``)."""
        return len(decoder_layers(self.model))

    def _packed_pass(
        self, cache: Any, past: int, causal: list[int], batch: TreeBatch, *, tap: FeatureTap | None = None
    ) -> np.ndarray:
        torch = import_torch()
        n = len(batch.tokens)
        if not causal and n == 0:
            return np.zeros(0)
        visible, positions, kpos = batch.visibility(past, len(causal))
        mask = self._masks(visible, positions, kpos)
        ids = torch.tensor([causal + list(batch.tokens)], device=self._device)
        pos = torch.from_numpy(positions).to(self._device)[None]
        keep = n + (1 if causal else 0)
        with self._grad(), self._tapping(None if tap is None else tap.layer) as seen:
            out = self.model(
                input_ids=ids,
                position_ids=pos,
                attention_mask=mask,
                **{self._cache_kw: cache},
                use_cache=True,
                logits_to_keep=max(keep, 1),
            )
        self.forward_passes += 1
        if tap is not None and seen is not None:
            first = len(causal) + n - max(keep, 1)
            record_pass(tap, seen, past=past, fed=len(causal), batch=batch, kept=lambda s: s - first)
        if n:
            for layer in cache.layers:
                layer.crop(-n)
        if not batch.query_rows:
            return np.zeros(0)
        rows = [r + (1 if causal else 0) for r in batch.query_rows]
        return picked_logprobs(out.logits[0].float(), rows, batch.query_tokens)

    def _buffered_cache(self, states: list[Any], widest: int, room: int) -> Any:
        """See :meth:`BatchedDocuments._buffered_cache`: one preallocated buffer per layer
        (:func:`~pcd_engine.backends.torch_tree.filled_layer_class`), which the pass writes into in place, so each
        cache is copied once."""
        from transformers import DynamicCache

        if not all(isinstance(s, TorchState) for s in states):
            raise TypeError("score_trees: expected TorchState objects.")
        cache = DynamicCache()
        layers: list[Any] = []
        for index in range(len(states[0].cache.layers)):
            mine = [s.cache.layers[index] for s in states]
            layers.append(filled_layer_class().of([m.keys for m in mine], [m.values for m in mine], widest, room))
        cache.layers = layers
        return cache

    def _buffered_room(self, cache: Any, more: int) -> int:
        """See :meth:`BatchedDocuments._buffered_room` (the buffers grow with room to spare)."""
        for layer in cache.layers:
            layer.reserve(more)
        return int(cache.layers[0].filled)

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
        """See :meth:`BatchedDocuments._buffered_pass` (``logits_to_keep`` takes the rows-kept mask)."""
        torch = import_torch()
        with self._grad(), self.model_lock:
            out = self.model(
                input_ids=torch.from_numpy(ids).to(self._device),
                position_ids=torch.from_numpy(qpos).to(self._device),
                attention_mask=self._masks(visible, qpos, kpos),
                **{self._cache_kw: cache},
                use_cache=True,
                logits_to_keep=torch.from_numpy(keep).to(self._device),
            )
            self.forward_passes += 1
        logits = out.logits
        if logits.ndim == 3:  # a model that ignores a mask of rows to keep returns every row
            logits = logits[torch.from_numpy(keep).to(logits.device)]
        logits = logits.float()
        if picks is None:
            return torch.log_softmax(logits, dim=-1).cpu().numpy()
        if not picks:
            return np.zeros(0)
        return picked_logprobs(logits, [row for row, _ in picks], [token for _, token in picks])

    def _buffered_adopt(self, state: Any, cache: Any, row: int, lo: int, hi: int) -> None:
        """See :meth:`BatchedDocuments._buffered_adopt`: the state's layers become views of the buffer."""
        for layer, filled in zip(state.cache.layers, cache.layers, strict=True):
            layer.keys, layer.values = filled.keys[row : row + 1, :, lo:hi], filled.values[row : row + 1, :, lo:hi]

    @serialized
    def _grow_pass(
        self, cache: Any, tokens: list[int], visible: np.ndarray, qpos: np.ndarray, kpos: np.ndarray, read: list[int]
    ) -> np.ndarray:
        """One packed pass that keeps its tokens in ``cache`` (see :meth:`PackedTrees._grow_pass`)."""
        torch = import_torch()
        keep = len(tokens) - min(read)
        with self._grad():
            out = self.model(
                input_ids=torch.tensor([tokens], device=self._device),
                position_ids=torch.from_numpy(qpos).to(self._device)[None],
                attention_mask=self._masks(visible, qpos, kpos),
                **{self._cache_kw: cache},
                use_cache=True,
                logits_to_keep=keep,
            )
        self.forward_passes += 1
        rows = torch.tensor([r - (len(tokens) - keep) for r in read], device=self._device)
        return torch.log_softmax(out.logits[0, rows].float(), dim=-1).cpu().numpy()

    # ------------------------------------------------------------------------------------------ rows fallback

    def _extend_native(self, cache: Any, ids: list[int]) -> tuple[Any, Any]:
        """Run ``ids`` on top of the model's own cache (``None`` starts one); return it and the last logits."""
        torch = import_torch()
        if not ids:
            return cache, None
        with self._grad():
            out = self.model(
                input_ids=torch.tensor([ids], device=self._device),
                **{self._cache_kw: cache},
                use_cache=True,
                logits_to_keep=1,
            )
        self.forward_passes += 1
        return out.past_key_values, out.logits[0, -1].float()

    def _rows_pass(
        self, state: TorchState, causal: list[int], batch: TreeBatch, *, rows_per_call: int = 8
    ) -> np.ndarray:
        """Row broadcast: extend the request's own cache by ``causal``, then score each root-to-leaf chain as a
        row on a copy of that cache repeated over the batch (right-padded; padding comes after every read)."""
        torch = import_torch()
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
            dists[-1] = torch.log_softmax(last, dim=-1)
        wanted = {r for r in batch.query_rows if r >= 0}
        with self._grad():
            for start in range(0, len(chains), rows_per_call):
                group = chains[start : start + rows_per_call]
                if not any(node in wanted for chain in group for node in chain):
                    continue
                longest = max(len(c) for c in group)
                inputs = torch.zeros((len(group), longest), dtype=torch.long, device=self._device)
                attn = torch.zeros((len(group), state.length + longest), dtype=torch.long, device=self._device)
                attn[:, : state.length] = 1
                for g, chain in enumerate(group):
                    inputs[g, : len(chain)] = torch.tensor([batch.tokens[c] for c in chain], device=self._device)
                    attn[g, state.length : state.length + len(chain)] = 1
                rows_cache = self._repeated(state.cache, len(group))
                with self._tapping(None if tap is None else tap.layer) as seen:
                    logits = self.model(
                        input_ids=inputs, attention_mask=attn, **{self._cache_kw: rows_cache}, use_cache=True
                    ).logits.float()
                self.forward_passes += 1
                for node in wanted:
                    chain_index, offset = row_of[node]
                    if start <= chain_index < start + len(group):
                        dists[node] = torch.log_softmax(logits[chain_index - start, offset], dim=-1)
                if tap is not None and seen is not None:
                    record_chains(tap, seen, fed=fed, batch=batch, row_of=row_of, first=start, count=len(group),
                                  longest=longest)  # fmt: skip
        out = np.empty(len(batch.query_rows))
        for q, (row, token) in enumerate(zip(batch.query_rows, batch.query_tokens, strict=True)):
            out[q] = float(dists[row][token])
        return out

    @serialized
    def _rows_start(self, state: TorchState, causal: list[int], rows: int) -> Any:
        """Extend the state's own cache by ``causal``; return a deep copy repeated over ``rows`` batch rows."""
        state.cache, _ = self._extend_native(state.cache, causal)
        state.ids.extend(causal)
        state.length += len(causal)
        if state.cache is None:
            from transformers import DynamicCache

            return DynamicCache(config=self.model.config)
        return self._repeated(state.cache, rows)

    def _repeated(self, cache: Any, rows: int) -> Any:
        """A copy of a one-row cache repeated over ``rows`` batch rows (``None`` stays ``None``).

        Every cache layer class can reorder its batch for beam search, recurrent and convolution states
        (LFM2, Qwen3.5) included, while only attention layers can ``batch_repeat_interleave``; selecting row 0
        ``rows`` times is that repeat for all of them.
        """
        if cache is None:
            return None
        torch = import_torch()
        repeated = copy.deepcopy(cache)
        repeated.reorder_cache(torch.zeros(rows, dtype=torch.long, device=self._device))
        return repeated

    @serialized
    def _rows_step(self, cache: Any, tokens: list[int]) -> np.ndarray:
        """One token per batch row on the repeated cache (see :meth:`RowBroadcast._rows_step`)."""
        torch = import_torch()
        with self._grad():
            out = self.model(
                input_ids=torch.tensor(tokens, device=self._device)[:, None],
                **{self._cache_kw: cache},
                use_cache=True,
            )
        self.forward_passes += 1
        return torch.log_softmax(out.logits[:, -1].float(), dim=-1).cpu().numpy()
