"""The conformance suite (tests/conformance.py) on the PyTorch backend.

Run per tiny random architecture: llama, qwen2, qwen3, gemma2 (logit soft-caps) and gemma3 with a sliding window
shorter than the prompt.
"""

from __future__ import annotations

import pytest

from pcd_engine.backends.torch import TorchBackend
from tests.conformance import BackendConformance
from tests.support import ARCHS, tiny_model, torch_brute_force


@pytest.fixture(scope="module", params=ARCHS)
def torch_backend(request, smol_tokenizer):
    return TorchBackend(tiny_model(request.param, len(smol_tokenizer)), smol_tokenizer)


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
