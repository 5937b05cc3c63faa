"""The conformance suite (tests/conformance.py) on the MLX backend, on Linux CPU in CI.

Each tiny random architecture is built in PyTorch, written once as a transformers folder and loaded with
``mlx_lm.load`` (fp32): llama, qwen2, qwen3, gemma2 and gemma3 text with a sliding window shorter than the
prompt (mlx-lm's own cache for its sliding layers is a ``RotatingKVCache``; the brute force uses it). The brute
force runs a second, unwrapped copy of the model the way mlx-lm runs it by itself. Mistral, Ministral, Granite,
Gemma 4 and gpt-oss run the suite on the shared-prefix probe. Tiny LFM2 and Qwen3.5 folders
(recurrent ``ArraysCache`` layers) check that hybrid models load unedited, fall back to row broadcast and still
equal the brute force.
"""

from __future__ import annotations

import numpy as np
import pytest

from pcd_engine.errors import OptionError
from tests.conformance import SHARED_PREFIXES, TEXT, BackendConformance, ProbeOnly, RowsConformance, RowsProbeOnly
from tests.support import (
    ARCHS,
    HYBRID_ARCHS,
    MORE_ARCHS,
    load_mlx_twin,
    mlx_available,
    mlx_brute_force,
    save_tiny,
    tiny_model,
)

pytestmark = [
    pytest.mark.mlx,
    pytest.mark.skipif(not mlx_available(), reason="mlx and mlx-lm are not installed (pip install 'pcd-llm[mlx]')"),
]


@pytest.fixture(scope="module", params=ARCHS)
def mlx_pair(request, smol_tokenizer, tmp_path_factory):
    """(backend, plain model): the backend's model is wrapped for packing, the plain one is untouched."""
    model = tiny_model(request.param, len(smol_tokenizer))
    return load_mlx_twin(save_tiny(model, smol_tokenizer, tmp_path_factory.mktemp("m")), smol_tokenizer)


class TestMLXConformance(BackendConformance):
    @pytest.fixture
    def backend(self, mlx_pair):
        assert mlx_pair[0].scorer == "packed"
        return mlx_pair[0]

    @pytest.fixture
    def rows_backend(self, mlx_pair):
        from pcd_engine.backends.mlx import MLXBackend

        return MLXBackend(mlx_pair[0].model, mlx_pair[0].tokenizer, scorer="rows")

    def brute_force(self, backend, context, paths):
        return mlx_brute_force(self._plain, context, paths)

    @pytest.fixture(autouse=True)
    def _plain_model(self, mlx_pair):
        self._plain = mlx_pair[1]

    def snapshot(self, prefix):
        import mlx.core as mx
        from mlx.utils import tree_flatten

        states = [getattr(c, "state", None) or (c.keys, c.values) for c in prefix.cache]
        return [np.array(v) for _, v in tree_flatten(states) if isinstance(v, mx.array)]

    def cache_lengths(self, state):
        return [layer.keys.shape[2] for layer in state.cache]


@pytest.fixture(scope="module", params=[arch for arch in MORE_ARCHS if arch != "ministral3"])
def mlx_more_pair(request, smol_tokenizer, tmp_path_factory):
    """Mistral, Ministral (interleaved window: mlx-lm's llama), Granite, Gemma 4 and gpt-oss (experts rewritten from
    transformers' layout on load) from folders written by transformers; Ministral 3 is below."""
    model = tiny_model(request.param, len(smol_tokenizer))
    return load_mlx_twin(save_tiny(model, smol_tokenizer, tmp_path_factory.mktemp("more")), smol_tokenizer)


class TestMLXMoreConformance(ProbeOnly, TestMLXConformance):
    """The further architectures, on the probe with shared prefixes (the 300-label field runs on :data:`ARCHS`)."""

    @pytest.fixture
    def mlx_pair(self, mlx_more_pair):
        return mlx_more_pair


@pytest.fixture(scope="module", params=HYBRID_ARCHS)
def mlx_hybrid_pair(request, smol_tokenizer, tmp_path_factory):
    """A hybrid model written by transformers and loaded with mlx-lm as it is (no hand-edited config)."""
    model = tiny_model(request.param, len(smol_tokenizer))
    return load_mlx_twin(save_tiny(model, smol_tokenizer, tmp_path_factory.mktemp("h")), smol_tokenizer)


class TestMLXHybridConformance(RowsConformance):
    """LFM2 (convolution) and Qwen3.5 (gated delta rule) keep ``ArraysCache`` states: no tree mask can branch
    them, so the backend falls back to row broadcast and must still equal the brute force."""

    @pytest.fixture
    def rows_backend(self, mlx_hybrid_pair):
        assert mlx_hybrid_pair[0].scorer == "rows"  # picked by scorer="auto"
        return mlx_hybrid_pair[0]

    @pytest.fixture(autouse=True)
    def _plain_model(self, mlx_hybrid_pair):
        self._plain = mlx_hybrid_pair[1]

    def brute_force(self, backend, context, paths):
        return mlx_brute_force(self._plain, context, paths)

    snapshot = TestMLXConformance.snapshot

    def test_open_field_is_generated_and_packed_is_refused(self, rows_backend):
        from pcd_engine import Engine
        from pcd_engine.backends.mlx import MLXBackend

        mixed = Engine(rows_backend, max_tokens=6).extract(TEXT, {**SHARED_PREFIXES, "note": {"type": "string"}})
        assert isinstance(mixed.values["note"], str) and mixed.fields["note"].source == "generated"
        with pytest.raises(OptionError, match="Scorer 'packed'"):
            MLXBackend(rows_backend.model, rows_backend.tokenizer, scorer="packed")


@pytest.fixture(scope="module")
def mlx_ministral3_pair(smol_tokenizer, tmp_path_factory):
    model = tiny_model("ministral3", len(smol_tokenizer))
    return load_mlx_twin(save_tiny(model, smol_tokenizer, tmp_path_factory.mktemp("m3")), smol_tokenizer)


class TestMLXMinistral3Conformance(RowsProbeOnly, TestMLXHybridConformance):
    """mlx-lm's Ministral 3 scales queries by position (Llama 4's scaling, here past the tiny model's 128 original
    positions) from the cache offset, read as one offset per batch row: a packed pass's one position per token
    does not fit, so the backend picks row broadcast, which must equal the brute force."""

    @pytest.fixture
    def mlx_hybrid_pair(self, mlx_ministral3_pair):
        return mlx_ministral3_pair
