"""A differential property test: random closed schemas, decided by the engine on tiny random models, equal brute
force.

Hypothesis draws schemas with 1 to 300 labels per field: shared prefixes, unicode, quotes and backslashes,
numbers written as strings next to the same numbers, ``true`` / ``null`` as strings, Optional fields, bounded
integers and multi-label fields; every strategy, anchor on and off; tiny random llama, qwen2 and gemma3 (a
sliding window much shorter than the prompt). The brute force never sees the trie, the packing or the cache: it
tokenizes each complete prompt + JSON line as one text and scores it with ONE plain causal forward pass
(:meth:`~pcd_engine.backends.contract.Backend.sequence_logprobs`), then applies each strategy's definition by
enumeration (:func:`tests.decide.test_decoding_oracle.brute_force`).

The run is seeded (``derandomize``) and sized to under a minute here (20 schemas); a longer run is
``PCD_PROPERTY_EXAMPLES=500 .venv/bin/python -m pytest tests/decide/test_property.py``.
"""

from __future__ import annotations

import os
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pcd_engine import Engine, compile_schema
from pcd_engine.decide.compiler import questions, written_value
from pcd_engine.prompt.chat_prompt import ChatPrompt, TokenizerView, field_line
from tests.support import enumerate_paths, tiny_model
from tests.support import oracle_brute_force as brute_force

EXAMPLES = int(os.environ.get("PCD_PROPERTY_EXAMPLES", "20"))
TEXT = 'Parcel 7 came late, the box was crushed and the customer wants a refund: "never again" — ünïcode ok.'
ARCHS = ("llama", "qwen2", "gemma3")


@pytest.fixture(scope="module")
def backends(smol_tokenizer) -> dict[str, Any]:
    from pcd_engine.backends.torch import TorchBackend

    return {arch: TorchBackend(tiny_model(arch, len(smol_tokenizer), seed=7), smol_tokenizer) for arch in ARCHS}


# ---------------------------------------------------------------------------------------------- schemas

STEMS = ["cat", "ca", "cat_", "ITEM_", "1_HOUR", "12_HOURS", "é", "日本", 'say "hi"', "back\\slash", "a b", "Ω-"]
SPECIAL = ["1", "12", "true", "false", "null", "0"]


@st.composite
def label_values(draw: Any, max_labels: int) -> list[Any]:
    many = st.integers(7, max_labels) if max_labels > 6 else st.nothing()
    n = draw(st.one_of(st.integers(1, min(6, max_labels)), many))
    stems = draw(st.lists(st.sampled_from(STEMS), min_size=1, max_size=3, unique=True))
    values: list[Any] = [f"{stems[i % len(stems)]}{i}" if n > 6 else stems[i % len(stems)] + str(i) for i in range(n)]
    extras = draw(st.lists(st.sampled_from([*SPECIAL, 1, 12, 0, True, False]), max_size=3, unique_by=repr))
    for extra in extras:
        if not any(type(v) is type(extra) and v == extra for v in values):
            values.append(extra)
    return values


def labels_of(node: dict[str, Any]) -> int:
    if node.get("type") == "boolean":
        return 2
    if node.get("type") == "integer":
        return int(node["maximum"] - node["minimum"] + 1)
    if node.get("type") == "array":
        return 2 * len(node["items"]["enum"])
    return len(node["enum"])


@st.composite
def fields(draw: Any, index: int, budget: int) -> tuple[str, dict[str, Any]]:
    name = f"f{index}_" + draw(st.sampled_from(["a", "é", 'q"x', "k"]))
    kind = draw(st.sampled_from(["enum", "enum", "optional", "boolean", "int", "multi"]))
    if kind == "boolean":
        return name, {"type": "boolean"}
    if kind == "int":
        lo = draw(st.integers(-20, 20))
        return name, {"type": "integer", "minimum": lo, "maximum": lo + draw(st.integers(0, 40))}
    if kind == "multi":
        values = draw(label_values(6))
        return name, {"type": "array", "items": {"enum": values}, "maxItems": max(1, len(values) - 1)}
    values = draw(label_values(max(1, budget - 4)))
    if kind == "optional":
        values = [v for v in values if v is not None] + [None]
    return name, {"enum": values}


@st.composite
def schemas(draw: Any) -> dict[str, Any]:
    count = draw(st.integers(1, 3))
    props: dict[str, Any] = {}
    budget = 300  # labels over the whole schema, so that its prompt fits the tiny models' window
    for i in range(count):
        if budget < 50:
            break
        name, node = draw(fields(i, budget))
        props[name] = node
        budget -= labels_of(node)
    return {"type": "object", "properties": props}


# ---------------------------------------------------------------------------------------------- brute force


class ModelLM:
    """``logprob(context, token)`` from plain causal passes: each complete path is scored once, alone, by the
    model with no cache, no tree mask and no custom positions (only the last positions' logits are kept)."""

    def __init__(self, backend: Any) -> None:
        self.backend = backend
        self.table: dict[tuple[tuple[int, ...], int], float] = {}

    def prime(self, sequences: list[list[int]]) -> None:
        import torch

        shared = min(len(s) for s in sequences)
        for i in range(shared):
            if len({s[i] for s in sequences}) > 1:
                shared = i
                break
        for seq in sequences:
            if (tuple(seq[:-1]), seq[-1]) in self.table:
                continue
            keep = len(seq) - max(1, shared - 1)
            with torch.no_grad():
                logits = self.backend.model(input_ids=torch.tensor([seq]), use_cache=False, logits_to_keep=keep).logits
            logprobs = torch.log_softmax(logits[0].double(), dim=-1)
            for row, i in enumerate(range(len(seq) - keep, len(seq) - 1)):
                self.table[(tuple(seq[: i + 1]), seq[i + 1])] = float(logprobs[row, seq[i + 1]])

    def logprob(self, context: list[int], token: int) -> float:
        return self.table[(tuple(context), token)]


def check(backend: Any, schema_dict: dict[str, Any], strategy: str | None, anchor: bool) -> None:
    tokenizer = backend.tokenizer
    schema = compile_schema(schema_dict)
    out = Engine(backend, anchor=anchor, correction="none").extract(TEXT, schema, strategy=strategy)  # as read
    prompt = ChatPrompt.build(TokenizerView(tokenizer), schema)
    base = prompt.prefix_text + TEXT + prompt.suffix_text
    scored = [f for f in schema.fields if f.scored]
    first = next((f for f in scored if not f.depends_on), None) if anchor and len(scored) > 1 else None
    lm = ModelLM(backend)
    for spec in scored:
        context = base
        if first is not None and spec.name != first.name:
            context += field_line(first.name, written_value(first, out.values[first.name]))
        got = out.fields[spec.name]
        for q in questions(spec):
            if len(q.labels) < 2:
                continue
            paths = enumerate_paths(tokenizer, context, q)
            lm.prime([seq for _, seq in paths])
            name = strategy or ("marginal" if len(q.labels) <= 32 else "trie_walk")
            winner, probs, mass = brute_force(lm, paths, name)
            if spec.kind == "multi":
                assert got.label_probabilities is not None
                value = spec.labels[questions(spec).index(q)].value
                assert got.label_probabilities[value] == pytest.approx(probs[0], abs=2e-4), (spec.name, value)
                continue
            picked = spec.label_index(got.value)
            assert picked is not None, (spec.name, got.value)
            # A float tie between two labels may go either way; anything else must be the brute-force winner.
            assert picked == winner or probs[picked] >= probs[winner] - 2e-4, (spec.name, got.value, winner)
            assert got.probability == pytest.approx(probs[picked], abs=2e-4), spec.name
            assert got.candidate_mass == pytest.approx(mass, rel=2e-3, abs=1e-6), spec.name
    for spec in schema.fields:
        assert spec.allows(out.values[spec.name]), (spec.name, out.values[spec.name])


@pytest.mark.slow
@settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture],
)
@given(
    schema=schemas(),
    arch=st.sampled_from(ARCHS),
    strategy=st.sampled_from([None, "marginal", "exact", "trie_walk"]),
    anchor=st.booleans(),
)
def test_random_schemas_equal_brute_force(backends, schema, arch, strategy, anchor):
    check(backends[arch], schema, strategy, anchor)


def test_the_property_check_can_fail(backends, monkeypatch):
    """The same check on a deliberately broken packer (tree positions shifted by one) fails."""
    from tests.conformance import shift_tree_positions

    shift_tree_positions(monkeypatch)
    schema = {"properties": {"pick": {"enum": ["cat1", "cat12", "ca3", "é4", "1", 1]}, "ok": {"type": "boolean"}}}
    with pytest.raises(AssertionError):
        check(backends["llama"], schema, "exact", False)
