"""Drafted open rows (:mod:`pcd_engine.generate.drafting`): a row's proposed continuation rides in its own pass, and the
row keeps exactly the tokens greedy decoding gives it, whatever the draft, in fewer passes when the draft is right.

The reference is the obvious generator (:meth:`tests.support.OracleBackend.generate_rows`: each row's whole
context, one token per step). :class:`GrowingOracle` runs the engine's packed generator over the same oracle and
reads every fed token's context off the visibility mask it is given, so a wrong mask or a wrong acceptance shows.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from pcd_engine import Engine
from pcd_engine.backends.capabilities import PackedTrees
from pcd_engine.errors import OptionError
from pcd_engine.generate.drafting import PromptLookup
from pcd_engine.options import ExtractOptions
from tests.support import OracleBackend, OracleLM, both_backends, tiny_backend


class GrowingOracle(PackedTrees, OracleBackend):
    """The oracle through the packed row generator (:class:`~pcd_engine.backends.growth.Growth`): the cache is the
    list of keys in feeding order, and each read row's context is the keys its mask row shows."""

    def _packed_pass(self, cache, past, causal, batch, *, tap=None):
        raise AssertionError("the oracle scores trees itself")

    def _packed_generate(self, state, growth, before_pass):
        state.cache = list(state.ids)
        super()._packed_generate(state, growth, before_pass)

    def _fork(self, cache):
        return list(cache)

    def _grow_pass(self, cache, tokens, visible, qpos, kpos, read):
        self.forward_passes += 1
        cache.extend(tokens)
        assert visible.shape == (len(tokens), len(cache))
        rows = [self.lm.distribution([cache[j] for j in np.flatnonzero(visible[r])]) for r in read]
        return np.array(rows, dtype=np.float32)  # as the reference gives them


CONTEXT = list(range(100, 160))
PREFIXES = [[7, 8], [7, 9, 10], [11]]
LIMITS = [6, 9, 4]


def greedy(limits, record):
    """A chooser: the argmax, until the row's limit; it records each row's tokens and log-probs."""

    def choose(row, logprobs):
        token = int(np.argmax(logprobs))
        record[row].append((token, float(logprobs[token])))
        return [token], len(record[row]) >= limits[row]

    return choose


def grow(backend, draft=None):
    record = [[] for _ in PREFIXES]
    state = backend.start(backend.prefill(CONTEXT))
    passes = backend.generate_rows(state, causal=[1, 2], prefixes=PREFIXES, choose=greedy(LIMITS, record), draft=draft)
    return record, passes


@pytest.fixture
def lm(smol_tokenizer):
    return OracleLM(len(smol_tokenizer), window=4)


def test_the_packed_generator_equals_the_obvious_one(smol_tokenizer, lm):
    reference, ref_passes = grow(OracleBackend(smol_tokenizer, lm))
    got, passes = grow(GrowingOracle(smol_tokenizer, lm))
    assert got == reference and passes == ref_passes == max(LIMITS)


def scripted_drafts(truth, kind, vocab):
    """Drafts of three tokens per pass: the greedy row's next tokens, all of them wrong, the first right only, or
    the right ones followed by ten more past the row's limit."""

    def draft(row, tokens):
        done = len(tokens) - len(PREFIXES[row])
        right = truth[row][done : done + 3]
        if kind == "right":
            return right
        if kind == "too-long":
            return right + [5] * 10
        wrong = [(t + 1) % vocab for t in right]
        return wrong if kind == "wrong" else right[:1] + wrong[1:]

    return draft


@pytest.mark.parametrize("kind", ["right", "wrong", "half-right", "too-long"])
def test_drafted_rows_equal_greedy_rows_whatever_the_draft(smol_tokenizer, lm, kind):
    reference, _ = grow(OracleBackend(smol_tokenizer, lm))
    truth = [[t for t, _ in row] for row in reference]
    draft = scripted_drafts(truth, kind, lm.vocab_size)
    got, passes = grow(GrowingOracle(smol_tokenizer, lm), draft)
    assert [[t for t, _ in row] for row in got] == truth
    for g, r in zip(got, reference, strict=True):
        np.testing.assert_allclose([p for _, p in g], [p for _, p in r], atol=1e-12)
    if kind in ("right", "too-long"):  # four tokens a pass: the token, three drafted, one more from the last
        assert passes == -(-max(LIMITS) // 4)
    elif kind == "half-right":
        assert passes == -(-max(LIMITS) // 2)
    else:
        assert passes == max(LIMITS)


def test_prompt_lookup_copies_the_latest_longest_match():
    context = [1, 2, 3, 4, 5, 9, 2, 3, 7, 8, 6, 3, 4]
    lookup = PromptLookup(context, max_ngram=2, max_draft=3)
    assert lookup([0, 2, 3]) == [7, 8, 6]  # "2 3" last occurs before 7
    assert lookup([0, 0, 3]) == [4]  # "0 3" is nowhere; "3" last occurs before 4 (the context's end)
    assert lookup([1, 2, 3], limit=1) == [7]
    assert lookup([42]) == [] and lookup([]) == []
    with pytest.raises(ValueError, match="max_draft"):
        PromptLookup(context, max_draft=0)


ORDER = "Hello, this is Margaret Okonkwo-Pell. My order ZX-88213-QR arrived broken; I paid 149.99 EUR for it."
SPANS = {
    "properties": {
        "broken": {"type": "boolean"},
        "customer": {"type": "string", "x-max-tokens": 16},
        "order_id": {"type": "string", "x-max-tokens": 16},
        "amount": {"type": "string", "x-max-tokens": 12},
    }
}


class CopyingLM(OracleLM):
    """An oracle that writes ``wants[key]`` after ``"key":`` token by token in the tokenizer's own encoding of
    ``' "value",'`` (so, like a real model copying a span, its tokens match the document's after the first word);
    everywhere else it is the plain oracle."""

    def __init__(self, tokenizer, wants, *, boost=40.0):
        super().__init__(len(tokenizer), window=8)
        self.tokenizer, self.boost = tokenizer, boost
        self.targets = {k: tokenizer.encode(f" {json.dumps(v)},", add_special_tokens=False) for k, v in wants.items()}

    def distribution(self, context):
        base = super().distribution(context)
        text = self.tokenizer.decode(list(context[-40:]))
        for key, target in self.targets.items():
            at = text.rfind(f"{json.dumps(key)}:")
            if at < 0:
                continue
            tail = text[at + len(key) + 3 :]
            done = next((k for k in range(len(target)) if self.tokenizer.decode(target[:k]) == tail), None)
            if done is not None:
                logits = base.copy()
                logits[target[done]] += self.boost
                return logits - np.logaddexp.reduce(logits)
        return base


def spans_engine(tokenizer, **options):
    wants = {"customer": "Margaret Okonkwo-Pell", "order_id": "ZX-88213-QR", "amount": "149.99 EUR"}
    return Engine(GrowingOracle(tokenizer, CopyingLM(tokenizer, wants)), **options)


def test_spans_of_the_document_are_copied_in_fewer_passes(smol_tokenizer):
    plain = spans_engine(smol_tokenizer, draft_tokens=0).extract(ORDER, SPANS)
    drafted = spans_engine(smol_tokenizer).extract(ORDER, SPANS)
    assert plain.values == drafted.values
    assert drafted.values["order_id"] == "ZX-88213-QR" and drafted.values["customer"] == "Margaret Okonkwo-Pell"
    for name in ("customer", "order_id", "amount"):
        assert drafted.fields[name].mean_logprob == pytest.approx(plain.fields[name].mean_logprob, abs=1e-9)
    s, p = drafted.stats, plain.stats
    assert p.draft_tokens == p.accepted_tokens == 0
    assert s.accepted_tokens > 0 and s.draft_tokens >= s.accepted_tokens
    assert s.generated_tokens == p.generated_tokens
    assert s.generation_passes < p.generation_passes
    assert s.tokens_per_step > p.tokens_per_step
    assert drafted.to_json()["stats"]["accepted_tokens"] == s.accepted_tokens


def test_draft_tokens_is_an_option_with_checked_values(smol_tokenizer):
    engine = spans_engine(smol_tokenizer)
    off = engine.extract(ORDER, SPANS, draft_tokens=0)
    assert off.stats.draft_tokens == 0
    assert engine.extract(ORDER, SPANS, options=ExtractOptions(draft_tokens=2)).stats.draft_tokens > 0
    for bad in (-1, 1.5, True, "8"):
        with pytest.raises(OptionError, match="draft_tokens"):
            engine.extract(ORDER, SPANS, draft_tokens=bad)


@pytest.fixture(scope="module", params=both_backends(), ids=lambda p: f"{p[0]}-{p[1]}")
def tiny(request, smol_tokenizer, tmp_path_factory):
    return tiny_backend(request.param, smol_tokenizer, tmp_path_factory.mktemp("m"))


@pytest.mark.parametrize("kind", ["right", "wrong", "half-right"])
def test_tiny_models_draft_exactly_the_greedy_rows(tiny, kind):
    """The real masks and positions: with any draft, alone and with rows of other requests in one batch, each
    row's tokens are the undrafted greedy row's and its log-probs agree within 1e-4."""
    reference, ref_passes = grow(tiny)
    truth = [[t for t, _ in row] for row in reference]
    vocab = len(tiny.tokenizer)
    got, passes = grow(tiny, scripted_drafts(truth, kind, vocab))
    assert [[t for t, _ in row] for row in got] == truth
    for g, r in zip(got, reference, strict=True):
        np.testing.assert_allclose([p for _, p in g], [p for _, p in r], atol=1e-4)
    assert passes < ref_passes if kind != "wrong" else passes == ref_passes
    # two requests' rows grown together (one batch row each), both drafted
    records = [[[] for _ in PREFIXES] for _ in range(2)]
    states = [tiny.start(tiny.prefill(CONTEXT)), tiny.start(tiny.prefill(CONTEXT[:40]))]
    alone = [[[] for _ in PREFIXES]]
    tiny.generate_rows(
        tiny.start(tiny.prefill(CONTEXT[:40])), causal=[1, 2], prefixes=PREFIXES, choose=greedy(LIMITS, alone[0])
    )
    truths = [truth, [[t for t, _ in row] for row in alone[0]]]
    outcomes = tiny.generate_rows_many(
        states, causals=[[1, 2], [1, 2]], prefixes=[PREFIXES, PREFIXES],
        chooses=[greedy(LIMITS, r) for r in records], before_passes=[lambda: None] * 2,
        drafts=[scripted_drafts(t, kind, vocab) for t in truths],
    )  # fmt: skip
    assert all(failure is None for _, failure in outcomes)
    for record, t in zip(records, truths, strict=True):
        assert [[tok for tok, _ in row] for row in record] == t


def test_tiny_models_extract_the_same_values_with_drafts(tiny):
    texts = [ORDER, "Order QQ-1 from Al; amount 3 USD. " * 3]
    plain = Engine(tiny, draft_tokens=0)
    drafted = Engine(tiny, draft_tokens=8)
    for text in texts:
        a, b = plain.extract(text, SPANS), drafted.extract(text, SPANS)
        assert a.values == b.values
        assert b.stats.generation_passes <= a.stats.generation_passes
    together = drafted.extract_many(texts, SPANS, batch_size=2)
    assert [r.values for r in together] == [plain.extract(t, SPANS).values for t in texts]


class RowPricedOracle(GrowingOracle):
    """A pass costs 1000 bytes per row read: three undrafted rows fit 20 KiB, three rows of 1 + 8 do not."""

    def pass_bytes(self, *, past, new, rows):
        return rows * 1000


def test_drafts_that_would_not_fit_the_memory_budget_are_left_out(smol_tokenizer):
    wants = {"customer": "Margaret Okonkwo-Pell", "order_id": "ZX-88213-QR", "amount": "149.99 EUR"}
    backend = RowPricedOracle(smol_tokenizer, CopyingLM(smol_tokenizer, wants))
    out = Engine(backend, memory_budget_mb=20 / 1024).extract(ORDER, SPANS)
    assert out.stats.draft_tokens == 0
    assert out.values == Engine(backend, draft_tokens=0).extract(ORDER, SPANS).values
    assert Engine(backend, memory_budget_mb=1.0).extract(ORDER, SPANS).stats.draft_tokens > 0
