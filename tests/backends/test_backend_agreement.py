"""PyTorch and MLX agree on the same weights: log-probs within 1e-4 (fp32) and identical decisions.

The tiny random models are built in PyTorch and converted once, in the test, by writing a transformers folder
that ``mlx_lm.load`` reads. Gemma 2 is left out on purpose: mlx-lm's Gemma 2 has no sliding window while
transformers' has, so the two libraries define different models once the prompt outgrows the window (the MLX
conformance suite still covers mlx-lm's Gemma 2 against its own brute force).
"""

from __future__ import annotations

import numpy as np
import pytest

from pcd_engine import Engine
from pcd_engine.backends.torch import TorchBackend
from pcd_engine.tools.examples import EXAMPLE_PRESETS, example_preset
from tests.conformance import BIG, SHARED_PREFIXES, TEXT, packed_logprobs
from tests.support import HYBRID_ARCHS, MORE_ARCHS, load_mlx_twin, mlx_available, save_tiny, tiny_model

pytestmark = [
    pytest.mark.mlx,
    pytest.mark.skipif(not mlx_available(), reason="mlx and mlx-lm are not installed (pip install 'pcd-llm[mlx]')"),
]

# The hybrids check that their folders load into mlx-lm with the same model (config keys mapped right).
AGREEMENT_ARCHS = ["llama", "qwen2", "qwen3", "gemma3", *HYBRID_ARCHS]


@pytest.fixture(scope="module", params=AGREEMENT_ARCHS)
def twins(request, smol_tokenizer, tmp_path_factory):
    model = tiny_model(request.param, len(smol_tokenizer))
    folder = save_tiny(model, smol_tokenizer, tmp_path_factory.mktemp("twin"))
    return TorchBackend(model, smol_tokenizer), load_mlx_twin(folder, smol_tokenizer)[0]


@pytest.mark.parametrize("preset", [SHARED_PREFIXES, BIG], ids=["shared-prefixes", "300-labels"])
def test_logprobs_agree(twins, preset):
    torch_run = packed_logprobs(twins[0], preset)
    mlx_run = packed_logprobs(twins[1], preset)
    assert torch_run["context"] == mlx_run["context"]
    assert torch_run["wave"].tree == mlx_run["wave"].tree
    np.testing.assert_allclose(mlx_run["logprobs"], torch_run["logprobs"], atol=1e-4, rtol=0)


@pytest.mark.parametrize("anchor", [True, False])
def test_decisions_agree(twins, anchor):
    # the model's own decisions: a lean correction on a tiny random model amplifies float rounding
    torch_out = Engine(twins[0], anchor=anchor, correction="none").extract(TEXT, SHARED_PREFIXES)
    mlx_out = Engine(twins[1], anchor=anchor, correction="none").extract(TEXT, SHARED_PREFIXES)
    assert mlx_out.values == torch_out.values
    assert mlx_out.stats.forward_passes == torch_out.stats.forward_passes
    for name, field in torch_out.fields.items():
        assert mlx_out.fields[name].probability == pytest.approx(field.probability, abs=1e-4)


@pytest.fixture(scope="module", params=MORE_ARCHS)
def more_twins(request, smol_tokenizer, tmp_path_factory):
    model = tiny_model(request.param, len(smol_tokenizer))
    folder = save_tiny(model, smol_tokenizer, tmp_path_factory.mktemp("more-twin"))
    return TorchBackend(model, smol_tokenizer), load_mlx_twin(folder, smol_tokenizer)[0]


def test_more_architectures_agree(more_twins):
    """Folders written by transformers for Mistral, Ministral (interleaved sliding window), Granite (multipliers),
    Gemma 4 and gpt-oss (experts in transformers' layout, YaRN with ``truncate: false``) are the same model in
    mlx-lm: log-probs within 1e-4 and the same decisions, on the shared-prefix probe."""
    torch_run = packed_logprobs(more_twins[0], SHARED_PREFIXES)
    mlx_run = packed_logprobs(more_twins[1], SHARED_PREFIXES)
    assert torch_run["context"] == mlx_run["context"]
    np.testing.assert_allclose(mlx_run["logprobs"], torch_run["logprobs"], atol=1e-4, rtol=0)
    assert Engine(more_twins[1], correction="none").extract(TEXT, SHARED_PREFIXES).values == (
        Engine(more_twins[0], correction="none").extract(TEXT, SHARED_PREFIXES).values
    )


@pytest.fixture(scope="module")
def mlx_engine(smol_path):
    return Engine.load(backend="mlx")


# The two 255-label presets are left out on MLX on CPU: customs_255's 4,000-token schema prompt alone takes over a
# minute to prefill there (PyTorch: 15 s), catalogue_255 half a minute; 255- and 300-label tries are held to 1e-4
# between the backends on the tiny twins above (test_logprobs_agree[300-labels]).
MLX_PRESETS = [name for name in EXAMPLE_PRESETS if not name.endswith("_255")]


@pytest.mark.real_model
def test_smollm2_agrees_on_the_example_presets(mlx_engine, smol_alone, record_property):
    """The embedded SmolLM2 on both backends: identical decisions on at least 99% of all fields."""
    assert mlx_engine.backend.name == "mlx" and mlx_engine.backend.scorer == "packed"
    same = total = 0
    for name in MLX_PRESETS:
        preset = example_preset(name)
        torch_out = smol_alone(preset.context, preset.schema)
        mlx_out = mlx_engine.extract(preset.context, preset.schema, correction="none")  # as smol_alone reads
        total += len(torch_out.values)
        same += sum(mlx_out.values[k] == v for k, v in torch_out.values.items())
    record_property("identical_fields", f"{same}/{total}")
    assert total == sum(len(example_preset(name).schema.fields) for name in MLX_PRESETS)
    assert same >= 0.99 * total, f"only {same}/{total} fields agree"


@pytest.mark.parametrize("scorer", ["auto", "rows"])
def test_features_agree(twins, scorer):
    """A decision head reads the same hidden states on both backends (the document's middle-layer mean and each
    field's answer state), on the packed scorer and on the rows fallback, with the document fed in chunks."""
    from pcd_engine.backends.mlx import MLXBackend

    torch_backend = TorchBackend(twins[0].model, twins[0].tokenizer, scorer=scorer)
    mlx_backend = MLXBackend(twins[1].model, twins[1].tokenizer, scorer=scorer)
    assert torch_backend.hidden_layers == mlx_backend.hidden_layers
    ours = packed_logprobs(torch_backend, SHARED_PREFIXES, tap=True, chunk=7)["state"].tap
    theirs = packed_logprobs(mlx_backend, SHARED_PREFIXES, tap=True, chunk=7)["state"].tap
    width = len(next(iter(ours.answers.values())))
    mean = ours.document_mean(width)
    assert theirs.count == ours.count > 0
    np.testing.assert_allclose(theirs.document_mean(width), mean, atol=1e-4 * np.abs(mean).max())
    assert set(theirs.answers) == set(ours.answers) == set(ours.nodes)
    for node, vector in ours.answers.items():
        np.testing.assert_allclose(theirs.answers[node], vector, atol=1e-4 * np.abs(vector).max())


def test_a_head_decides_alike_on_both_backends(twins):
    """A head fitted through the PyTorch engine, given to the MLX engine on the same weights (its model name
    changed to the MLX engine's), decides the same labels with the same distributions; batched too."""
    from pcd_engine import Head

    schema = {"tone": {"type": "enum", "choices": ["calm", "angry", "sad"]}, "refund": {"type": "boolean"}}
    words = {"angry": "I am furious about this!", "calm": "Thanks, all is fine.", "sad": "So sad and tired today."}
    examples = [(f"Order {i}. {text}", {"tone": tone}) for i in range(6) for tone, text in words.items()]
    torch_engine = Engine(twins[0], correction="none")
    mlx_engine = Engine(twins[1], correction="none")
    head = Head.fit(torch_engine, schema, examples)
    mlx_head = Head.from_json({**head.to_json(), "model": mlx_engine.model_id})
    texts = [f"Order {i}. {text}" for i, text in enumerate(words.values(), 40)]
    ours = torch_engine.extract_many(texts, schema, head=head)
    theirs = mlx_engine.extract_many(texts, schema, head=mlx_head)
    for a, b in zip(ours, theirs, strict=True):
        assert b.fields["tone"].method == "head" and b.values == a.values
        np.testing.assert_allclose(b.fields["tone"].label_distribution, a.fields["tone"].label_distribution, atol=1e-3)
