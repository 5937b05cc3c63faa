"""The conformance suite (tests/conformance.py) on the PyTorch backend.

Run per tiny random architecture: llama, qwen2, qwen3, gemma2 (logit soft-caps), gemma3 with a sliding window
shorter than the prompt, mistral, ministral (interleaved sliding window), granite (embedding, residual, attention
and logit multipliers), gemma4 and gpt-oss (mixture of experts, attention sinks, eager attention only); these
five skip the 300-label field, which the first five cover. The hybrid architectures, LFM2 (short convolutions) and
Qwen3.5 (gated delta rule linear attention), run the row-broadcast part of the suite: their caches hold states that
no tree mask can branch.
"""

from __future__ import annotations

import pytest

from pcd_engine.backends.torch import TorchBackend
from pcd_engine.errors import OptionError
from tests.conformance import SHARED_PREFIXES, BackendConformance, ProbeOnly, RowsConformance
from tests.support import (
    ARCHS,
    HYBRID_ARCHS,
    MORE_ARCHS,
    save_tiny,
    tiny_model,
    torch_brute_force,
    torch_cache_tensors,
    torch_hidden_states,
)


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

    def hidden_reference(self, backend, ids, layer):
        return torch_hidden_states(backend.model, ids, layer)

    def brute_force(self, backend, context, paths):
        return torch_brute_force(backend.model, context, paths)

    def snapshot(self, prefix):
        return torch_cache_tensors(prefix.cache)

    def cache_lengths(self, state):
        return [layer.keys.shape[-2] for layer in state.cache.layers]


@pytest.fixture(scope="module", params=MORE_ARCHS)
def more_backend(request, smol_tokenizer):
    return TorchBackend(tiny_model(request.param, len(smol_tokenizer)), smol_tokenizer)


class TestTorchMoreConformance(ProbeOnly, TestTorchConformance):
    """The further architectures, on the probe with shared prefixes (the 300-label field runs on :data:`ARCHS`)."""

    @pytest.fixture
    def torch_backend(self, more_backend):
        return more_backend


@pytest.fixture(scope="module", params=HYBRID_ARCHS)
def hybrid_backend(request, smol_tokenizer):
    return TorchBackend(tiny_model(request.param, len(smol_tokenizer)), smol_tokenizer)


class TestTorchHybridConformance(RowsConformance):
    @pytest.fixture
    def rows_backend(self, hybrid_backend):
        assert hybrid_backend.scorer == "rows"  # picked by scorer="auto"
        return hybrid_backend

    def hidden_reference(self, backend, ids, layer):
        return torch_hidden_states(backend.model, ids, layer)

    def brute_force(self, backend, context, paths):
        return torch_brute_force(backend.model, context, paths)

    @pytest.mark.parametrize("preset", [SHARED_PREFIXES], ids=["shared-prefixes"])
    def test_rows_fallback_equals_brute_force(self, rows_backend, preset):
        super().test_rows_fallback_equals_brute_force(rows_backend, preset)

    def snapshot(self, prefix):
        tensors = torch_cache_tensors(prefix.cache)
        assert len(tensors) > 2  # the convolution or recurrent states are in it, not only one layer's keys
        return tensors


def test_hybrid_model_refuses_the_packed_scorer(hybrid_backend):
    with pytest.raises(OptionError, match="Scorer 'packed'"):
        TorchBackend(hybrid_backend.model, hybrid_backend.tokenizer, scorer="packed")


def test_a_model_without_sdpa_loads_with_eager_attention(smol_tokenizer, tmp_path):
    """gpt-oss has no SDPA path in transformers: loading from a folder falls back to eager attention, packed."""
    save_tiny(tiny_model("gpt_oss", len(smol_tokenizer)), smol_tokenizer, tmp_path)
    backend = TorchBackend.load(str(tmp_path))
    assert backend.model.config._attn_implementation == "eager" and backend.scorer == "packed"
