"""Tree-packed scoring equals scoring each label path alone with a full forward pass (fp32, 1e-4).

Run per tiny random architecture: llama, qwen2, qwen3, gemma2 (logit soft-caps) and gemma3 with a sliding window
shorter than the prompt. Each uses a label set with shared prefixes and a 300-label field.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from pcd_engine import Engine, compile_schema
from pcd_engine.backends.torch import TorchBackend
from pcd_engine.compiler import compile_wave
from pcd_engine.planner import plan_passes
from pcd_engine.prompt import ChatPrompt, TokenizerView, field_line
from tests.conftest import ARCHS, tiny_model

TEXT = "The parcel arrived two weeks late and the box was crushed. I would like a refund within 12 hours, please."

SHARED_PREFIXES = {
    "deadline": {"type": "enum", "choices": ["1_HOUR", "12_HOURS", "1_WEEK", "NONE"]},
    "refund": {"type": "boolean", "description": "Asks for money back"},
    "level": {"type": "enum", "choices": [1, 12, 123, 2]},
    "tone": {"type": "enum", "choices": ["angry", "angr", "calm"]},
}
BIG = {"product": {"type": "enum", "choices": [f"SKU-{i:03d}" for i in range(300)]}}


@pytest.fixture(scope="module", params=ARCHS)
def backend(request, smol_tokenizer):
    return TorchBackend(tiny_model(request.param, len(smol_tokenizer)), smol_tokenizer)


def brute_force(backend: TorchBackend, prefix_ids: list[int], paths: list[list[int]]) -> list[np.ndarray]:
    """log p of each path token given everything before it, scoring each path alone.

    The model runs the way transformers runs it by itself: its own masks, its own cache classes (sliding
    windows included), its default positions. The prompt is run once and each path continues a deep copy of
    that cache, which is a full forward pass per path without repeating the shared prompt's work.
    """
    from transformers import DynamicCache

    model = backend.model
    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        first = model(input_ids=torch.tensor([prefix_ids]), cache=cache, use_cache=True, logits_to_keep=1)
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


def check_against_brute_force(backend, wave, prefix_ids, logprobs):
    paths = [path for trie in wave.fields for path in trie.paths]
    tokens = [[wave.tree.tokens[n] for n in path.nodes] for path in paths]
    for path, expected in zip(paths, brute_force(backend, list(prefix_ids), tokens)):
        np.testing.assert_allclose(logprobs[list(path.nodes)], expected, atol=1e-4, rtol=0)


def packed_logprobs(backend: TorchBackend, preset: dict, *, max_nodes: int = 10_000):
    tv = TokenizerView(backend.tokenizer)
    schema = compile_schema(preset)
    prompt = ChatPrompt.build(tv, schema)
    ids = prompt.request_ids(tv, TEXT)
    wave = compile_wave(tv, schema.fields, boundary_text=prompt.boundary_text, tail_text=prompt.tail_text)
    assert tuple(ids[len(ids) - len(wave.tail_ids) :]) == wave.tail_ids
    causal_end = len(ids) - len(wave.tail_ids) + wave.causal_len
    prefix = backend.prefill(prompt.head_ids)
    snapshot = [(layer.keys.clone(), layer.values.clone()) for layer in prefix.cache.layers]
    state = backend.start(prefix)
    pending = ids[len(prompt.head_ids) : causal_end]
    logprobs = np.full(len(wave.tree), np.nan)
    passes = plan_passes(wave.tree, max_nodes=max_nodes)
    for batch in passes:
        logprobs[list(batch.query_nodes)] = backend.score_tree(state, causal=pending, batch=batch)
        pending = []
    # The prefix is untouched, and the request state holds exactly the causal tokens.
    for (k, v), layer in zip(snapshot, prefix.cache.layers):
        assert torch.equal(k, layer.keys) and torch.equal(v, layer.values)
    assert state.length == causal_end
    assert all(layer.keys.shape[-2] == causal_end for layer in state.cache.layers)
    return ids[:causal_end], wave, logprobs, passes


@pytest.mark.parametrize("preset", [SHARED_PREFIXES, BIG], ids=["shared-prefixes", "300-labels"])
def test_packed_equals_brute_force(backend, preset):
    prefix_ids, wave, logprobs, passes = packed_logprobs(backend, preset)
    assert len(passes) == 1
    assert not np.isnan(logprobs).any()
    check_against_brute_force(backend, wave, prefix_ids, logprobs)


def test_split_passes_equal_one_pass(backend):
    _, wave, one, _ = packed_logprobs(backend, SHARED_PREFIXES)
    _, _, split, passes = packed_logprobs(backend, SHARED_PREFIXES, max_nodes=5)
    assert len(passes) > 2
    np.testing.assert_allclose(split, one, atol=1e-4, rtol=0)


def test_wrong_positions_are_detected(backend, monkeypatch):
    """The check can fail: shifting every tree position by one moves the log-probs well past the tolerance."""
    prefix_ids, wave, good, _ = packed_logprobs(backend, SHARED_PREFIXES)
    original = backend._masks

    def shifted(past, causal, batch):
        mask, positions = original(past, causal, batch)
        positions = positions.copy()
        positions[causal:] += 1
        return mask, positions

    monkeypatch.setattr(backend, "_masks", shifted)
    _, _, bad, _ = packed_logprobs(backend, SHARED_PREFIXES)
    assert np.abs(bad - good).max() > 1e-3


def test_second_wave_matches_brute_force(backend):
    """A wave after the anchor: written answers ride as causal tokens in front of the next tree."""
    tv = TokenizerView(backend.tokenizer)
    schema = compile_schema(SHARED_PREFIXES)
    prompt = ChatPrompt.build(tv, schema)
    ids = prompt.request_ids(tv, TEXT)
    first = compile_wave(tv, schema.fields[:1], boundary_text=prompt.boundary_text, tail_text=prompt.tail_text)
    tail = prompt.tail_text + field_line("deadline", '"12_HOURS"')
    second = compile_wave(tv, schema.fields[1:], boundary_text=prompt.boundary_text, tail_text=tail)
    base = len(ids) - len(first.tail_ids)
    state = backend.start(backend.prefill(prompt.head_ids))
    backend.score_tree(
        state,
        causal=ids[len(prompt.head_ids) : base + first.causal_len],
        batch=plan_passes(first.tree, max_nodes=999)[0],
    )
    causal = list(second.tail_ids[first.causal_len : second.causal_len])
    batch = plan_passes(second.tree, max_nodes=999)[0]
    logprobs = np.zeros(len(second.tree))
    logprobs[list(batch.query_nodes)] = backend.score_tree(state, causal=causal, batch=batch)
    context = ids[:base] + list(second.tail_ids[: second.causal_len])
    check_against_brute_force(backend, second, context, logprobs)


def test_rows_fallback_equals_packed(backend, smol_tokenizer):
    rows = TorchBackend(backend.model, smol_tokenizer, scorer="rows")
    assert rows.scorer == "rows"
    packed = Engine(backend, anchor=True).extract(TEXT, SHARED_PREFIXES)
    fallback = Engine(rows, anchor=True).extract(TEXT, SHARED_PREFIXES)
    assert fallback.values == packed.values
    for name in packed.values:
        assert fallback.fields[name].probability == pytest.approx(packed.fields[name].probability, abs=1e-4)
    assert any("one row each" in w for w in fallback.warnings)


def test_engine_one_pass_per_wave(backend):
    engine = Engine(backend, anchor=False)
    engine.extract(TEXT, SHARED_PREFIXES)  # warm the head cache
    out = engine.extract(TEXT, SHARED_PREFIXES)
    assert out.stats.forward_passes == 1
    assert out.stats.cached_tokens > 0
    anchored = Engine(backend, anchor=True)
    anchored.extract(TEXT, SHARED_PREFIXES)
    assert anchored.extract(TEXT, SHARED_PREFIXES).stats.forward_passes == 2
