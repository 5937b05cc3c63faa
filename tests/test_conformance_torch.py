"""The conformance suite (tests/conformance.py) on the PyTorch backend.

Run per tiny random architecture: llama, qwen2, qwen3, gemma2 (logit soft-caps) and gemma3 with a sliding window
shorter than the prompt.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from pcd_engine.backends.torch import TorchBackend
from tests.conformance import BackendConformance, check_paths
from tests.conftest import ARCHS, tiny_model


@pytest.fixture(scope="module", params=ARCHS)
def torch_backend(request, smol_tokenizer):
    return TorchBackend(tiny_model(request.param, len(smol_tokenizer)), smol_tokenizer)


def torch_brute_force(model, context: list[int], paths: list[list[int]]) -> list[np.ndarray]:
    """log p of each path token given everything before it, scoring each path alone.

    The model runs the way transformers runs it by itself: its own masks, its own cache classes (sliding
    windows included), its default positions. The prompt is run once and each path continues a deep copy of
    that cache, which is a full forward pass per path without repeating the shared prompt's work.
    """
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        first = model(input_ids=torch.tensor([context]), cache=cache, use_cache=True, logits_to_keep=1)
    root = torch.log_softmax(first.logits[0, -1].double(), dim=-1)
    out = []
    for path in paths:
        scores = [float(root[path[0]])]
        if len(path) > 1:
            with torch.no_grad():
                logits = (
                    model(input_ids=torch.tensor([path[:-1]]), cache=copy.deepcopy(cache), use_cache=True)
                    .logits[0]
                    .double()
                )
            logp = torch.log_softmax(logits, dim=-1)
            scores += [float(logp[i, t]) for i, t in enumerate(path[1:])]
        out.append(np.array(scores))
    return out


def brute_force(backend: TorchBackend, context: list[int], paths: list[list[int]]) -> list[np.ndarray]:
    return torch_brute_force(backend.model, context, paths)


def check_against_brute_force(backend: TorchBackend, wave, context: list[int], logprobs: np.ndarray) -> None:
    check_paths(lambda c, p: torch_brute_force(backend.model, c, p), wave, context, logprobs)


class TestTorchConformance(BackendConformance):
    @pytest.fixture
    def backend(self, torch_backend):
        return torch_backend

    @pytest.fixture
    def rows_backend(self, torch_backend):
        return TorchBackend(torch_backend.model, torch_backend.tokenizer, scorer="rows")

    def brute_force(self, backend, context, paths):
        return torch_brute_force(backend.model, context, paths)

    def snapshot(self, prefix):
        return [t.clone().numpy() for layer in prefix.cache.layers for t in (layer.keys, layer.values)]

    def cache_lengths(self, state):
        return [layer.keys.shape[-2] for layer in state.cache.layers]
