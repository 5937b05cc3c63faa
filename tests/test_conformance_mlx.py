"""The conformance suite (tests/conformance.py) on the MLX backend, on Linux CPU in CI.

Each tiny random architecture is built in PyTorch, written once as a transformers folder and loaded with
``mlx_lm.load`` (fp32): llama, qwen2, qwen3, gemma2 and gemma3 text with a sliding window shorter than the
prompt (mlx-lm's own cache for its sliding layers is a ``RotatingKVCache``; the brute force uses it). The brute
force runs a second, unwrapped copy of the model the way mlx-lm runs it by itself. A tiny LFM2 (recurrent
``ArraysCache`` layers) checks that hybrid models fall back to row broadcast and still equal the brute force.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.conformance import SHARED_PREFIXES, TEXT, BackendConformance, check_paths, packed_logprobs
from tests.support import ARCHS, load_mlx_twin, mlx_available, mlx_brute_force, save_tiny, tiny_model

pytestmark = [
    pytest.mark.mlx,
    pytest.mark.skipif(not mlx_available(), reason="mlx and mlx-lm are not installed (pip install 'pcd[mlx]')"),
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


def test_hybrid_recurrent_model_falls_back_to_rows(smol_tokenizer):
    """LFM2 mixes convolution (ArraysCache) and attention layers: no tree mask can branch its state."""
    import mlx.core as mx
    from mlx_lm.models import lfm2

    from pcd_engine import Engine
    from pcd_engine.backends.mlx import MLXBackend

    args = lfm2.ModelArgs(
        model_type="lfm2",
        vocab_size=len(smol_tokenizer),
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        norm_eps=1e-5,
        conv_bias=False,
        conv_L_cache=3,
        block_dim=64,
        block_ff_dim=128,
        block_multiple_of=16,
        block_ffn_dim_multiplier=1.0,
        block_auto_adjust_ff_dim=False,
        full_attn_idxs=[1],
        rope_theta=10000.0,
    )
    mx.random.seed(0)
    model = lfm2.Model(args)
    mx.eval(model.parameters())
    backend = MLXBackend(model, smol_tokenizer)
    assert backend.scorer == "rows"
    run = packed_logprobs(backend, SHARED_PREFIXES)
    check_paths(lambda c, p: mlx_brute_force(model, c, p), run["wave"], run["context"], run["logprobs"])
    out = Engine(backend).extract(TEXT, SHARED_PREFIXES)
    assert set(out.values) == set(SHARED_PREFIXES)
    # Open rows on a recurrent cache: broadcast rows, no padding, each equal to its own causal continuation.
    suite = TestMLXConformance()
    suite._plain = model
    run = suite.scripted_rows(backend, suite.SCRIPTS)
    suite.check_rows(backend, run)
    mixed = Engine(backend, max_tokens=6).extract(TEXT, {**SHARED_PREFIXES, "note": {"type": "string"}})
    assert isinstance(mixed.values["note"], str) and mixed.fields["note"].source == "generated"
    with pytest.raises(Exception, match="Scorer 'packed'"):
        MLXBackend(model, smol_tokenizer, scorer="packed")
