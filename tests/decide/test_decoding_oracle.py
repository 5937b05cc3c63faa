"""Every decoding strategy, run through the whole engine, equals brute-force enumeration on an oracle LM.

The brute force never sees the trie, the packing or the backend: it tokenizes each complete prompt + JSON line
as one text, and asks the oracle for each token's probability given everything before it. The engines decide with
the model's own distributions (``correction="none"``): the corrections are checked against the re-weighted brute
force in test_correction and test_calibration.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from pcd_engine import Engine, compile_schema
from pcd_engine.prompt.chat_prompt import ChatPrompt, TokenizerView, field_line
from tests.support import OracleBackend, OracleLM, enumerate_paths, greedy_constrained
from tests.support import oracle_brute_force as brute_force

TEXT = "Order 1182 arrived broken; the customer is furious and wants their money back today."

PRESET = {
    "urgent": {"type": "boolean"},
    "deadline": {"type": "enum", "choices": ["1_HOUR", "12_HOURS", "1_WEEK", "NONE"]},
    "stars": {"type": "enum", "choices": [1, 12, 2, 5]},
    "tone": {"type": "enum", "choices": ["angry", "angr", "calm", 'çalm "quoted" \\ back']},
    "catalogue": {"type": "enum", "choices": [f"ITEM_{i}" for i in range(40)]},
    "queue": {"type": "enum", "choices": ["billing"]},
    # Optional fields and bounded ints are enum fields with a null label / one label per number.
    "carrier": {"type": "enum", "choices": ["dhl", "ups", None]},
    "rating": {"type": "enum", "choices": [1, 2, 3, 4, 5, 10, None]},
}


@pytest.fixture()
def oracle(smol_tokenizer):
    lm = OracleLM(len(smol_tokenizer))
    return lm, OracleBackend(smol_tokenizer, lm)


@pytest.mark.parametrize("strategy", ["marginal", "exact", "trie_walk", None])
@pytest.mark.parametrize("temperature", [1.0, 0.5])
def test_strategies_equal_brute_force(oracle, smol_tokenizer, strategy, temperature):
    lm, backend = oracle
    engine = Engine(backend, anchor=False, correction="none")
    out = engine.extract(TEXT, PRESET, strategy=strategy, temperature=temperature)
    schema = compile_schema(PRESET)
    prompt = ChatPrompt.build(TokenizerView(smol_tokenizer), schema)
    context = prompt.prefix_text + TEXT + prompt.suffix_text
    for spec in schema.fields:
        got = out.fields[spec.name]
        if len(spec.labels) == 1:
            assert got.method == "fixed" and got.probability == 1.0 and got.candidate_mass is None
            continue
        name = strategy or ("marginal" if len(spec.labels) <= 32 else "trie_walk")
        assert got.method == name
        winner, probs, mass = brute_force(lm, enumerate_paths(smol_tokenizer, context, spec), name, temperature)
        assert got.value == spec.labels[winner].value, spec.name
        assert got.probability == pytest.approx(probs[winner], abs=1e-9)
        assert got.candidate_mass == pytest.approx(mass, rel=1e-9)
        by_value = {a.value: a.probability for a in got.alternatives}
        for li, label in enumerate(spec.labels):
            if label.value in by_value:
                assert by_value[label.value] == pytest.approx(probs[li], abs=1e-9)


def test_anchor_wave_sees_the_written_answer(oracle, smol_tokenizer):
    lm, backend = oracle
    out = Engine(backend, anchor=True, correction="none").extract(TEXT, PRESET, strategy="exact")
    schema = compile_schema(PRESET)
    prompt = ChatPrompt.build(TokenizerView(smol_tokenizer), schema)
    first = schema.fields[0]
    assert out.fields[first.name].wave == 0
    chosen = next(l for l in first.labels if l.value == out.values[first.name])
    context = prompt.prefix_text + TEXT + prompt.suffix_text + field_line(first.name, chosen.surfaces[0])
    spec = schema.field("deadline")
    winner, probs, _ = brute_force(lm, enumerate_paths(smol_tokenizer, context, spec), "exact")
    assert out.fields["deadline"].wave == 1
    assert out.values["deadline"] == spec.labels[winner].value
    assert out.fields["deadline"].probability == pytest.approx(probs[winner], abs=1e-9)


def test_temperature_never_changes_the_winner(oracle):
    _, backend = oracle
    engine = Engine(backend, anchor=False, correction="none")
    runs = [engine.extract(TEXT, PRESET, temperature=t) for t in (0.1, 1.0, 5.0)]
    assert all(r.values == runs[0].values for r in runs)
    cold, _, hot = (r.fields["deadline"].probability for r in runs)
    assert cold > hot


def test_passes_per_request(oracle):
    _, backend = oracle
    preset = {**PRESET, "after": {"type": "boolean", "depends_on": ["tone"]}}
    engine = Engine(backend, anchor=False, correction="none")
    engine.extract(TEXT, PRESET)  # preamble prefill happens once
    backend.passes.clear()
    out = engine.extract(TEXT, PRESET)
    assert out.stats.forward_passes == 1 and len(backend.passes) == 1
    assert backend.passes[0][0] > 10  # the document rides in the same pass as the tree
    assert Engine(backend, anchor=False, correction="none").extract(TEXT, preset).stats.waves == 2
    anchored = Engine(backend, correction="none").extract(TEXT, preset)
    assert anchored.stats.waves == 3 and anchored.fields["after"].wave == 2


def test_memory_budget_splits_passes_with_the_same_answers(oracle):
    _, backend = oracle
    whole = Engine(backend, anchor=False, correction="none").extract(TEXT, PRESET)
    split = Engine(backend, anchor=False, memory_budget_mb=0.05, correction="none").extract(TEXT, PRESET)
    assert split.stats.forward_passes > whole.stats.forward_passes
    assert split.values == whole.values
    for name in whole.values:
        assert split.fields[name].probability == pytest.approx(whole.fields[name].probability, abs=1e-12)


def test_dependent_wave_sees_anchor_and_its_dependencies_only(oracle, smol_tokenizer):
    lm, backend = oracle
    preset = {**PRESET, "after": {"type": "boolean", "depends_on": ["tone"]}}
    out = Engine(backend, anchor=True, correction="none").extract(TEXT, preset, strategy="exact")
    schema = compile_schema(preset)
    prompt = ChatPrompt.build(TokenizerView(smol_tokenizer), schema)

    def line(name):
        spec = schema.field(name)
        return field_line(name, next(l for l in spec.labels if l.value == out.values[name]).surfaces[0])

    context = prompt.prefix_text + TEXT + prompt.suffix_text + line("urgent") + line("tone")
    winner, probs, _ = brute_force(lm, enumerate_paths(smol_tokenizer, context, schema.field("after")), "exact")
    assert out.fields["after"].wave == 2
    assert out.values["after"] == schema.field("after").labels[winner].value
    assert out.fields["after"].probability == pytest.approx(probs[winner], abs=1e-9)


# ---------------------------------------------------------------------------------------------------- multi-label


MULTI = {
    "urgent": {"type": "boolean"},
    "tags": {"type": "multi", "choices": ["billing", "shipping", "broken", 7], "min_items": 1, "max_items": 2},
    "extras": {"type": "multi", "choices": ["gift", "express"]},
}


def test_multi_label_equals_brute_force(oracle, smol_tokenizer):
    """Each label's probability of applying is the brute-force marginal of its own yes/no line, and the chosen
    list is the labels above one half, topped up to min_items and cut to max_items by that probability."""
    from pcd_engine.decide.compiler import questions

    lm, backend = oracle
    engine = Engine(backend, anchor=False, correction="none")
    engine.extract(TEXT, MULTI)  # the head's prefill is its own pass
    out = engine.extract(TEXT, MULTI, temperature=1.0)
    schema = compile_schema(MULTI)
    prompt = ChatPrompt.build(TokenizerView(smol_tokenizer), schema)
    context = prompt.prefix_text + TEXT + prompt.suffix_text
    for name in ("tags", "extras"):
        spec = schema.field(name)
        yes = []
        for question in questions(spec):
            _, probs, _ = brute_force(lm, enumerate_paths(smol_tokenizer, context, question), "marginal")
            yes.append(probs[0])
        got = out.fields[name]
        assert list(got.label_probabilities.values()) == pytest.approx(yes, abs=1e-9)
        order = sorted(range(len(yes)), key=lambda i: -yes[i])
        chosen = [i for i in order if yes[i] >= 0.5]
        chosen = chosen or order[: spec.min_items]
        chosen = (chosen + [i for i in order if i not in chosen])[: max(len(chosen), spec.min_items)]
        if spec.max_items is not None:
            chosen = chosen[: spec.max_items]
        assert got.value == [spec.labels[i].value for i in sorted(chosen)]
        assert spec.allows(got.value)
        sure = [yes[i] if i in chosen else 1 - yes[i] for i in range(len(yes))]
        assert got.probability == pytest.approx(min(sure), abs=1e-9)
    assert out.stats.forward_passes == 1  # every yes/no question rides in the one pass


def test_multi_label_answer_is_written_as_flags(oracle, smol_tokenizer):
    """As the anchor, a multi-label field is written into the prompt the way the instructions describe it."""
    lm, backend = oracle
    preset = {"tags": MULTI["tags"], "urgent": {"type": "boolean"}}
    out = Engine(backend, anchor=True, correction="none").extract(TEXT, preset, strategy="exact")
    schema = compile_schema(preset)
    prompt = ChatPrompt.build(TokenizerView(smol_tokenizer), schema)
    flags = {str(v): v in out.values["tags"] for v in schema.field("tags").values}
    context = prompt.prefix_text + TEXT + prompt.suffix_text + field_line("tags", json.dumps(flags))
    winner, probs, _ = brute_force(lm, enumerate_paths(smol_tokenizer, context, schema.field("urgent")), "exact")
    assert out.values["urgent"] == schema.field("urgent").labels[winner].value
    assert out.fields["urgent"].probability == pytest.approx(probs[winner], abs=1e-9)


# ---------------------------------------------------------------------------------------------------- open fields


OPEN = {
    "type": "object",
    "properties": {
        "urgent": {"type": "boolean"},
        "deadline": {"enum": ["1_HOUR", "12_HOURS", "NONE"]},
        "summary": {"type": "string", "maxLength": 24},
        "count": {"type": "integer"},
        "who": {
            "type": "object",
            "properties": {"name": {"type": "string", "maxLength": 6}, "vip": {"type": "boolean"}},
            "required": ["name", "vip"],
            "additionalProperties": False,
        },
    },
}


SHAPES = {  # the shapes that came back invalid or unbounded before (issue 45)
    "type": "object",
    "properties": {
        "urgent": {"type": "boolean"},
        "pair": {"type": "array", "prefixItems": [{"enum": ["x", "y"]}, {"type": "integer"}], "minItems": 2,
                 "maxItems": 2},
        "when": {"type": "string", "format": "date-time"},
        "ident": {"type": "string", "format": "uuid"},
        "counts": {"type": "object", "additionalProperties": {"type": "integer"}},
        "either": {"anyOf": [{"type": "integer"}, {"type": "string", "maxLength": 8}]},
        "deep": {"type": "object", "properties": {"inner": {"type": "object", "properties": {"v": {"type": "integer"}},
                 "required": ["v"]}}, "required": ["inner"]},
    },
}  # fmt: skip


@pytest.mark.parametrize("shapes", [OPEN, SHAPES], ids=["open", "shapes"])
def test_open_fields_equal_greedy_constrained_brute_force(oracle, smol_tokenizer, shapes):
    """Each open row writes exactly what plain greedy generation under its JSON Schema writes after the prompt,
    the closed answers and its key; rows never see each other. A row cut at its limit holds what the one rule for
    values makes of the brute force's text (:func:`~pcd_engine.generate.values.complete_value`): always valid."""
    from pcd_engine.generate.values import complete_value

    lm, backend = oracle
    engine = Engine(backend, anchor=False, max_tokens=10, correction="none")
    engine.extract(TEXT, shapes)  # the head's prefill is its own pass
    out = engine.extract(TEXT, shapes)
    schema = compile_schema(shapes)
    prompt = ChatPrompt.build(TokenizerView(smol_tokenizer), schema)
    closed = "".join(
        field_line(f.name, next(l for l in f.labels if l.value == out.values[f.name]).surfaces[0])
        for f in schema.fields
        if f.scored
    )
    context = prompt.prefix_text + TEXT + prompt.suffix_text + closed
    lengths, steps = [], []
    for spec in schema.fields:
        if spec.scored:
            assert out.fields[spec.name].source == "scored"
            continue
        got = out.fields[spec.name]
        tokens, finished, choices = greedy_constrained(
            lm, smol_tokenizer, context + f'\n  "{spec.name}":', spec.value_schema, 10
        )
        assert got.source == "generated" and got.method == "generated" and got.probability is None
        assert got.tokens == len(tokens) and got.truncated == (not finished)
        text = TokenizerView(smol_tokenizer).decode(tokens).strip()
        if finished:
            assert got.value == json.loads(text.removesuffix(","))
        else:
            assert got.value == complete_value(spec, text, truncated=True)[0]
        assert spec.allows(got.value)
        ids = TokenizerView(smol_tokenizer).encode(context + f'\n  "{spec.name}":')
        chosen_lp = [lm.logprob(ids + tokens[:i], tokens[i]) for i in choices]
        assert got.mean_logprob == pytest.approx(float(np.mean(chosen_lp)), abs=1e-5)
        lengths.append(len(tokens))
        steps.append(len(choices))
    assert out.stats.generation_passes == max(steps)  # forced tokens ride with the choice before them
    assert out.stats.generated_tokens == sum(lengths)
    assert out.stats.forward_passes == 1 + max(steps)  # one scored wave, then one pass per row step
