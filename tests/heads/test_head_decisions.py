"""Deciding with a head (issue 46): the features come from the passes an extraction runs anyway (no extra forward pass)
and equal a plain forward pass's hidden states; a field with a head is decided by it, with the model's own
distribution beside it; the other fields are decided as without one; batched, one at a time and saved-and-reloaded
heads decide alike; a head for another schema or model is refused before any model work; ``Head.fit`` gates what
it fits.

The tiny random Llama cannot read, but its hidden states differ with the text, so a head fitted on texts whose label
follows their wording learns them (the gate says so), and one fitted on labels drawn at random does not.
"""

from __future__ import annotations

import numpy as np
import pytest

from pcd_engine import Engine, Head, compile_schema
from pcd_engine.backends.taps import middle_layer
from pcd_engine.backends.torch import TorchBackend
from pcd_engine.errors import OptionError
from pcd_engine.prompt.chat_prompt import ChatPrompt
from tests.support import torch_hidden_states

SCHEMA = {
    "tone": {"type": "enum", "choices": ["calm", "angry", "sad"]},
    "refund": {"type": "boolean"},
    "note": {"type": "string", "max_tokens": 2},
}
WORDS = {"angry": "I am furious about this!", "calm": "Thanks, all is fine.", "sad": "So sad and tired today."}


def examples(n: int = 24) -> list[tuple[str, dict]]:
    """Texts whose tone follows their wording, with refunds drawn at random."""
    rng = np.random.default_rng(0)
    tones = list(WORDS)
    out = []
    for i in range(n):
        tone = tones[i % 3]
        out.append((f"Order {i}. {WORDS[tone]}", {"tone": tone, "refund": bool(rng.integers(0, 2))}))
    return out


@pytest.fixture(scope="module")
def fitted(tiny_engine):
    return Head.fit(tiny_engine, SCHEMA, examples(), fields=["tone"])


def test_fit_gates_a_head_that_learned_and_one_that_did_not(tiny_engine, fitted):
    (tone,) = fitted.gates
    assert tone.field == "tone" and tone.held_out == 24 and tone.better
    assert tone.head.accuracy > tone.zero_shot.accuracy
    both = Head.fit(tiny_engine, SCHEMA, examples())
    refund = next(g for g in both.gates if g.field == "refund")
    assert not refund.better
    with pytest.raises(OptionError, match="'refund' gained .* held-out examples"):
        Head.fit(tiny_engine, SCHEMA, examples(), require_better=True)


def test_fit_takes_real_label_counts(tiny_engine):
    """A yes/no field with 11 examples of one answer and 1 of the other, and a field with one example per label, are
    fitted and gated (issue 57): every label present at least once is fitted, and a label seen once is scored
    honestly in its held-out fold (by a head that never saw it)."""
    rare = [(f"Order {i}. {WORDS['calm']}", {"refund": i == 5}) for i in range(12)]
    head = Head.fit(tiny_engine, SCHEMA, rare)
    (gate,) = head.gates
    assert gate.field == "refund" and gate.held_out == 12
    assert head.field("refund").seen == (11, 1) or head.field("refund").seen == (1, 11)
    once = [(WORDS[tone], {"tone": tone}) for tone in WORDS]
    (gate,) = Head.fit(tiny_engine, SCHEMA, once).gates
    assert gate.field == "tone" and gate.held_out == 3


def test_copies_are_folded_before_the_gate(tiny_engine):
    """Ten copies of one text per label gave a gate of 1.00 (each copy scored by a head that had read its twins);
    folded, two examples are left, each scored by a head that never read it, and the gate says how many were
    folded. The same text with another label is no copy: it stays."""
    copies = [(WORDS[tone], {"tone": tone}) for tone in ("calm", "angry") for _ in range(10)]
    head = Head.fit(tiny_engine, SCHEMA, copies)
    (gate,) = head.gates
    assert gate.folded == 18 and gate.held_out == 2 and head.examples == 2
    assert gate.head.accuracy == 0 and not gate.better  # a head that read only the other text answers the other
    disagree = [("Same words.", {"tone": tone}) for tone in ("calm", "angry", "calm")]
    assert Head.fit(tiny_engine, SCHEMA, disagree).gates[0].folded == 1


def test_a_field_with_a_head_is_decided_by_it_and_the_others_as_without(tiny_engine, fitted):
    text = "Order 99. I am furious about this!"
    plain = tiny_engine.extract(text, SCHEMA)
    headed = tiny_engine.extract(text, SCHEMA, head=fitted)
    tone = headed.fields["tone"]
    assert tone.method == "head" and tone.correction == "head" and tone.value == "angry"
    assert tone.label_distribution is not None and sum(tone.label_distribution) == pytest.approx(1.0)
    assert tone.probability == max(tone.label_distribution)
    # the model's own distribution beside it: what the call reads uncorrected, every label whole
    own = tiny_engine.extract(text, SCHEMA, correction="none", strategy="exact").fields["tone"]
    np.testing.assert_allclose(tone.raw_distribution, own.label_distribution, atol=1e-5)
    assert headed.values["refund"] == plain.values["refund"] and headed.values["note"] == plain.values["note"]
    assert headed.fields["refund"].method != "head"


def test_the_head_reads_what_a_plain_forward_pass_computes(tiny_engine, fitted):
    """The slow, obvious computation: the whole prompt up to the field's decision run as one plain causal pass;
    the last layer's state where the decision is read and the middle layer's mean over the document."""
    text = "Order 7. So sad and tired today."
    schema = compile_schema(SCHEMA)
    [(results, features)] = tiny_engine.read_features([text], schema, fields=["tone"])
    view = tiny_engine.tokenizer
    prompt = ChatPrompt.build(view, schema)
    ids = prompt.request_ids(view, text)
    wave = tiny_engine.cache.wave(schema, prompt, [schema.field("tone"), schema.field("refund")], prompt.tail_text)
    trie = next(t for t in wave.fields if t.spec.name == "tone")
    tree, node = wave.tree, trie.paths[0].nodes[trie.decision_depth]
    chain, parent = [], tree.parents[node]
    while parent >= 0:
        chain.append(tree.tokens[parent])
        parent = tree.parents[parent]
    causal = ids[: len(ids) - len(wave.tail_ids) + wave.causal_len]
    layer = middle_layer(tiny_engine.backend.hidden_layers)
    middle, last = torch_hidden_states(tiny_engine.backend.model, [*causal, *reversed(chain)], layer)
    lo, hi = len(prompt.preamble_ids), len(ids) - len(wave.tail_ids)
    expected = np.concatenate([last[-1], middle[lo:hi].mean(axis=0)])
    np.testing.assert_allclose(features["tone"], expected, atol=1e-4 * np.abs(expected).max())
    decided = tiny_engine.extract(text, SCHEMA, head=fitted).fields["tone"].label_distribution
    np.testing.assert_allclose(decided, fitted.field("tone").probabilities(expected.tolist()), atol=1e-4)
    assert results["tone"].method != "head"


def test_a_head_costs_no_forward_pass(tiny_engine, fitted):
    texts = [text for text, _ in examples(6)]
    for text in texts[:2]:
        plain = tiny_engine.extract(text, SCHEMA)
        headed = tiny_engine.extract(text, SCHEMA, head=fitted)
        assert headed.stats.forward_passes == plain.stats.forward_passes
    before = tiny_engine.backend.forward_passes
    tiny_engine.extract_many(texts, SCHEMA, batch_size=3)
    plain_passes = tiny_engine.backend.forward_passes - before
    before = tiny_engine.backend.forward_passes
    tiny_engine.extract_many(texts, SCHEMA, batch_size=3, head=fitted)
    assert tiny_engine.backend.forward_passes - before == plain_passes


def test_batched_rows_and_reloaded_heads_decide_alike(tiny_engine, fitted, tmp_path):
    texts = ["Short.", *(text for text, _ in examples(5))]
    alone = [tiny_engine.extract(t, SCHEMA, head=fitted) for t in texts]
    batched = tiny_engine.extract_many(texts, SCHEMA, head=fitted, batch_size=4)
    path = fitted.save(tmp_path / "tone.head.json")
    from_file = tiny_engine.extract_many(texts, SCHEMA, head=str(path), batch_size=4)
    from_json = tiny_engine.extract_many(texts, SCHEMA, head=fitted.to_json(), batch_size=4)
    assert Head.load(path) == fitted
    rows = Engine(TorchBackend(tiny_engine.backend.model, tiny_engine.backend.tokenizer, scorer="rows"))
    by_rows = [rows.extract(t, SCHEMA, head=fitted) for t in texts[:3]]
    for i, one in enumerate(alone):
        for other in (batched[i], from_file[i], from_json[i], *([by_rows[i]] if i < 3 else [])):
            assert other.values["tone"] == one.values["tone"]
            np.testing.assert_allclose(other.fields["tone"].label_distribution, one.fields["tone"].label_distribution,
                                       atol=1e-4)  # fmt: skip


def test_a_head_for_another_schema_or_model_is_refused_before_any_model_work(tiny_engine, fitted):
    other = {**SCHEMA, "tone": {"type": "enum", "choices": ["calm", "angry"]}}
    before = tiny_engine.backend.forward_passes
    with pytest.raises(OptionError, match="Head"):
        tiny_engine.extract("Hello.", other, head=fitted)
    renamed = Head.from_json({**fitted.to_json(), "model": "another/model"})
    with pytest.raises(OptionError, match="another/model"):
        tiny_engine.extract("Hello.", SCHEMA, head=renamed)
    assert tiny_engine.backend.forward_passes == before


@pytest.mark.parametrize(
    ("bad", "needle"),
    [
        ([], "expected labelled examples"),
        ([("text", {"tone": "furious"})], "expected one of \\['calm', 'angry', 'sad'\\]"),
        ([("a", {"tone": "calm"}), ("b", {"tone": "calm"})], "at least two of its labels"),
        ([("a", {"note": "x"})], "expected a closed field of \\[.tone., .refund.\\], but got .note."),
        (["just text"], "expected \\(text, \\{field: value\\}\\)"),
        ([("a", {"refund": 1}), ("b", {"refund": False})], "expected one of \\[True, False\\]"),
    ],
)
def test_fit_refuses_bad_examples_before_any_model_work(tiny_engine, bad, needle):
    before = tiny_engine.backend.forward_passes
    with pytest.raises(OptionError, match=needle):
        Head.fit(tiny_engine, SCHEMA, bad)
    assert tiny_engine.backend.forward_passes == before


@pytest.mark.parametrize(
    ("value", "needle"),
    [(42, "expected a Head, its JSON or the path"), ({"format": "nope"}, "head: "), ("/no/such/head.json", "head: ")],
)
def test_the_head_option_refuses_what_is_not_a_head(tiny_engine, value, needle):
    with pytest.raises(OptionError, match=needle):
        tiny_engine.extract("Hello.", SCHEMA, head=value)


MULTI = {"tags": {"type": "multi", "choices": ["late", "broken", "billing"]}, "tone": SCHEMA["tone"]}
PHRASES = {"late": "It came two weeks late.", "broken": "The lid was broken.", "billing": "I was charged twice."}


def multi_examples() -> list[tuple[str, dict]]:
    out = []
    for i in range(18):
        tags = [t for k, t in enumerate(PHRASES) if (i >> k) % 2 or i % 7 == k]
        out.append((f"Order {i}. " + " ".join(PHRASES[t] for t in tags), {"tags": tags}))
    return out


def test_a_multi_label_field_gets_a_yes_no_head_per_label(tiny_engine, tmp_path):
    head = Head.fit(tiny_engine, MULTI, multi_examples())
    tags = head.field("tags")
    assert tags.kind == "multi" and tags.labels == ("late", "broken", "billing") and len(head.fields) == 1
    (gated,) = head.gates
    assert gated.held_out == 18 * 3  # every (example, label) one yes/no decision
    text = "Order 50. The lid was broken. I was charged twice."
    [(_, features)] = tiny_engine.read_features([text], MULTI)
    assert features["tags"].shape[0] == 3 and features["tone"].ndim == 1
    out = tiny_engine.extract(text, MULTI, head=head)
    field = out.fields["tags"]
    assert field.method == "head" and field.correction == "head"
    expected = tags.yes(features["tags"].tolist())
    np.testing.assert_allclose([field.label_probabilities[v] for v in tags.labels], expected, atol=1e-4)
    assert field.value == [v for v, p in zip(tags.labels, expected, strict=True) if p >= 0.5]
    assert out.fields["tone"].method != "head"
    reloaded = Head.load(head.save(tmp_path / "tags.head.json"))
    assert reloaded == head and tiny_engine.extract(text, MULTI, head=reloaded).values == out.values
    with pytest.raises(OptionError, match="expected a list of values from"):
        Head.fit(tiny_engine, MULTI, [("a", {"tags": "late"}), ("b", {"tags": []})])
