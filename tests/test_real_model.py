"""End to end on the embedded SmolLM2-135M-Instruct: load offline, extract every example preset, and check the
decisions against brute-force scoring of each label by the same model."""

from __future__ import annotations

import json
import math
from typing import Literal

import numpy as np
import pytest
from pydantic import BaseModel, Field

from pcd_engine import load_preset
from pcd_engine.prompt.chat_prompt import ChatPrompt
from pcd_engine.tools.baseline import generate_baseline
from pcd_engine.tools.examples import EXAMPLE_PRESETS, example_preset, example_preset_path
from tests.support import assert_staged_matches, enumerate_paths, torch_brute_force

pytestmark = pytest.mark.real_model


class Ticket(BaseModel):
    sentiment: Literal["POSITIVE", "NEUTRAL", "NEGATIVE"]
    wants_refund: bool = Field(description="Whether the customer asks for money back")
    deadline: Literal["1_HOUR", "12_HOURS", "1_WEEK", "NONE"]


def _common(seqs):
    n = min(len(s) for s in seqs)
    i = 0
    while i < n and all(s[i] == seqs[0][i] for s in seqs):
        i += 1
    return i


def test_default_model_loads_offline(default_engine):
    assert default_engine.backend.scorer == "packed"
    assert default_engine.backend.model.config.model_type == "llama"
    out = default_engine.extract("I was charged twice and I want my money back tonight!", Ticket)
    assert isinstance(out.model, Ticket)
    assert set(out.values) == {"sentiment", "wants_refund", "deadline"}


SAMPLED_LABELS = 48
"""How many of a field's labels the brute force scores when it has more than this: catalogue_255's 255 paths, each a
forward pass of its own over a 1,900-token prompt, were a minute of CI. The sample (seeded) always holds the
engine's winner and its runner-up, and each sampled label's mass is checked on its own (probability times candidate
mass), so a wrong score on any sampled label fails; every label of 300 is checked against brute force on the tiny
models of each architecture (tests/conformance.py)."""


def _sampled(spec, out) -> set[int]:
    """The labels of ``spec`` the brute force scores: all of them, or a seeded sample with the engine's top two."""
    n = len(spec.labels)
    if n <= SAMPLED_LABELS:
        return set(range(n))
    mass = np.asarray(out.fields[spec.name].raw_distribution or out.fields[spec.name].label_distribution)
    top = {int(i) for i in np.argsort(mass)[-2:]}
    return top | set(np.random.default_rng(0).choice(n, SAMPLED_LABELS - len(top), replace=False).tolist())


# customs_255's 255 labels are scored against brute force through catalogue_255's (the same machinery; its own
# brute force costs minutes of CI), and its staged reading is checked against its one-pass reading below.
@pytest.mark.parametrize("name", [n for n in EXAMPLE_PRESETS if n != "customs_255"])
def test_presets_equal_brute_force(default_engine, name):
    # Without depends_on and anchor every field sees the same context: one wave, one pass.
    raw = json.loads(example_preset_path(name).read_text())
    for spec in raw["schema"].values():
        spec.pop("depends_on", None)
    preset = load_preset(raw)
    out = default_engine.extract(preset.context, preset.schema, anchor=False, strategy="exact", staging="one_pass")
    # ONE scoring pass for every closed field, and no later stage
    assert len(out.stats.documents_per_pass) == 1
    assert out.stats.stage_passes == 0
    assert out.stats.waves == 1
    prompt = ChatPrompt.build(default_engine.tokenizer, preset.schema)
    context = prompt.prefix_text + preset.context.strip() + prompt.suffix_text
    tokenizer = default_engine.tokenizer.hf
    closed = [spec for spec in preset.schema.fields if len(spec.labels) > 1]
    sampled = {spec.name: _sampled(spec, out) for spec in closed}
    per_field = {
        spec.name: [
            (label, seq) for label, seq in enumerate_paths(tokenizer, context, spec) if label in sampled[spec.name]
        ]
        for spec in closed
    }
    every = [seq for paths in per_field.values() for _, seq in paths]
    shared = _common(every)
    tails = torch_brute_force(default_engine.backend.model, every[0][:shared], [seq[shared:] for seq in every])
    by_seq = {tuple(seq): lp for seq, lp in zip(every, tails)}
    for spec in closed:
        paths = per_field[spec.name]
        depth = _common([seq for _, seq in paths]) - shared
        scores = np.full(len(spec.labels), -math.inf)
        for label, seq in paths:
            scores[label] = np.logaddexp(scores[label], by_seq[tuple(seq)][depth:].sum())
        got = out.fields[spec.name]
        assert got.value == spec.labels[int(np.argmax(scores))].value, spec.name
        if len(sampled[spec.name]) == len(spec.labels):
            probs = np.exp(scores - scores.max())
            probs /= probs.sum()
            assert got.probability == pytest.approx(float(probs.max()), abs=1e-3), spec.name
            assert got.candidate_mass == pytest.approx(float(np.exp(scores).sum()), rel=1e-3), spec.name
        else:  # each sampled label's own mass: its share of the engine's distribution times the candidate mass
            shares = np.asarray(got.raw_distribution or got.label_distribution)
            labels = sorted(sampled[spec.name])
            np.testing.assert_allclose(shares[labels] * got.candidate_mass, np.exp(scores[labels]), rtol=1e-3)


@pytest.mark.parametrize("name", EXAMPLE_PRESETS)
def test_presets_default_settings(default_engine, name):
    preset = example_preset(name)
    out = default_engine.extract(preset.context, preset.schema)
    for spec in preset.schema.fields:
        assert spec.allows(out.values[spec.name]), spec.name
        assert out.fields[spec.name].source == ("scored" if spec.scored else "generated")
    assert out.stats.waves >= 2


@pytest.mark.parametrize("name", [n for n in EXAMPLE_PRESETS if n != "customs_255"])
def test_presets_staged_equal_one_pass(default_engine, name):
    """The staged reading decides what one pass over every label's tokens decides, on the real model (the exact
    strategy too on catalogue_255). customs_255 is left out: its one-pass reading of 255 long labels over a
    4,000-token prompt took 50 s of CI, and what it would check is checked elsewhere: staged equals one pass on
    customs_255's own labels with both strategies on the oracle LM (test_staging), and on the real model over 255
    labels with catalogue_255 here; customs_255 is still decided staged on the real model by
    test_presets_default_settings."""
    preset = example_preset(name)
    strategies = [None, "exact"] if name == "catalogue_255" else [None]
    for strategy in strategies:
        whole = default_engine.extract(preset.context, preset.schema, strategy=strategy, staging="one_pass")
        staged = default_engine.extract(preset.context, preset.schema, strategy=strategy, staging="staged")
        assert_staged_matches(whole, staged)
        if name.endswith("_255"):
            assert staged.stats.stage_passes >= 1 and staged.stats.nodes_saved > whole.stats.nodes_saved


def test_baseline_reports_validity(default_engine):
    preset = example_preset("support_triage")
    result = generate_baseline(default_engine, preset.context, preset.schema, max_new_tokens=40)
    assert result.text.startswith("{")
    assert result.tokens <= 40 and result.forward_passes == result.tokens
    assert result.valid == (not result.errors)
    assert not result.valid  # 40 tokens cannot hold 28 fields
