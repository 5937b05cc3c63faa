"""Cost-planned reading (:mod:`pcd_engine.decide.staging`): a staged wave decides exactly what one pass over the whole
tree decides, on the oracle LM (random label sets up to 500 labels, every example preset) and on tiny models of both
backends; the pass planner reads exactly the nodes it is asked for; the cost model picks one pass or stages."""

from __future__ import annotations

import random

import numpy as np
import pytest

from pcd_engine import Engine, EngineOptions, ExtractOptions, compile_schema
from pcd_engine.decide.compiler import compile_wave
from pcd_engine.decide.decoding import Exact, Marginal, TrieWalk, sequence_scores
from pcd_engine.decide.planner import plan_passes
from pcd_engine.decide.staging import PassCost, WaveSearch, measure_pass_cost, plan_reading
from pcd_engine.errors import OptionError
from pcd_engine.prompt.chat_prompt import ChatPrompt, TokenizerView
from pcd_engine.tools.examples import EXAMPLE_PRESETS, example_preset
from pcd_engine.tools.greedy_walk import generate_greedy_walk
from pcd_engine.trees import TrieBuilder
from tests.support import OracleBackend, OracleLM, assert_staged_matches, both_backends, tiny_backend

TEXT = "Frozen cod fillets, 40 cartons, shipped by sea from Norway; the invoice lists live lobsters as well."
WORDS = ["Live", "Animals", "Meat", "Edible", "Offal", "Fish", "Dairy", "Eggs", "Honey", "Plants", "Roots", "Fruit"]


def long_labels(n: int, *, seed: int = 0) -> list[str]:
    """``n`` labels shaped like customs categories: ``CAT_042_Fish_Roots`` (a shared prefix, a number that
    identifies the label, then a tail of several tokens)."""
    rng = random.Random(seed)
    return [f"CAT_{i:03d}_{rng.choice(WORDS)}_{rng.choice(WORDS)}" for i in range(n)]


def word_labels(n: int, *, seed: int = 0) -> list[str]:
    """``n`` distinct labels of one to three words (labels part at different depths)."""
    rng = random.Random(seed)
    out: dict[str, None] = {}
    while len(out) < n:
        out["_".join(rng.choice(WORDS) for _ in range(rng.randint(1, 3))) + str(rng.randint(0, 999))] = None
    return list(out)


def schema_with(labels: list[str]) -> dict:
    return {
        "category": {"type": "enum", "choices": labels},
        "urgent": {"type": "boolean"},
        "mode": {"type": "enum", "choices": ["sea", "air", "road", "rail"]},
    }


def oracle_engine(tokenizer, **options) -> Engine:
    options = {"correction": "none", **options}  # staged and one-pass readings compared as read
    return Engine(OracleBackend(tokenizer, OracleLM(len(tokenizer), salt="staging")), anchor=False, **options)


# ------------------------------------------------------------------------------------------ the pass planner


def random_tree(rng: random.Random) -> TrieBuilder:
    trie = TrieBuilder()
    for _ in range(rng.randint(1, 40)):
        trie.add([rng.randint(0, 5) for _ in range(rng.randint(1, 7))])
    return trie


@pytest.mark.parametrize("seed", range(30))
def test_plan_passes_reads_exactly_the_queries_and_feeds_only_their_ancestors(seed):
    rng = random.Random(seed)
    trie = random_tree(rng)
    from pcd_engine.trees import TokenTree

    parents = trie.parents
    tree = TokenTree(tuple(trie.tokens), tuple(parents), tuple(trie.depths), tuple(sorted(set(parents) - {-1})))
    queries = {n for n in range(len(parents)) if rng.random() < 0.4} or {0}
    max_nodes = rng.randint(1, 12)
    passes = plan_passes(tree, max_nodes=max_nodes, queries=queries)
    read: list[int] = []
    ancestors = set()
    for q in queries:
        p = parents[q]
        while p >= 0:
            ancestors.add(p)
            p = parents[p]
    depth = max((trie.depths[n] + 1 for n in ancestors), default=0)
    for index, batch in enumerate(passes):
        assert len(batch.tokens) <= max(max_nodes, depth)
        fed = {}
        for row, token in enumerate(batch.tokens):
            fed[row] = token
        for row, token, node in zip(batch.query_rows, batch.query_tokens, batch.query_nodes, strict=True):
            assert token == trie.tokens[node]
            if row < 0:
                assert parents[node] == -1 and index == 0  # the root's children: first pass, from the causal row
            else:
                assert batch.tokens[row] == trie.tokens[parents[node]]
                assert batch.depths[row] == trie.depths[parents[node]]
        read.extend(batch.query_nodes)
    assert sorted(read) == sorted(queries)  # every query once, nothing else
    fed_total = sum(len(b.tokens) for b in passes)
    assert fed_total <= len(ancestors) * max(1, len(passes))
    if len(passes) == 1:
        assert fed_total == len(ancestors)  # one pass feeds exactly the ancestors
    assert plan_passes(tree, max_nodes=max_nodes) == plan_passes(tree, max_nodes=max_nodes, queries=None)


def test_plan_passes_refuses_root_children_without_causal_tokens():
    trie = TrieBuilder()
    trie.add([1, 2])
    from pcd_engine.trees import TokenTree

    tree = TokenTree(tuple(trie.tokens), tuple(trie.parents), tuple(trie.depths), (0,))
    with pytest.raises(ValueError, match="root"):
        plan_passes(tree, max_nodes=8, queries={0}, causal=False)
    assert [b.query_nodes for b in plan_passes(tree, max_nodes=8, queries={1}, causal=False)] == [(1,)]


# ------------------------------------------------------------------------------------------ the search itself


@pytest.mark.parametrize("n", [40, 120, 500])
@pytest.mark.parametrize("shape", ["long", "words"])
def test_search_reads_what_the_bound_needs_and_decides_as_one_pass(smol_tokenizer, n, shape):
    """On the oracle's full log-probs: the staged search, fed only the nodes it asks for, picks the one-pass winner
    for exact and trie-walk; every label it read in full has the one-pass score, and every label it did not read
    has a bound at least its true score."""
    labels = long_labels(n) if shape == "long" else word_labels(n)
    schema = compile_schema(schema_with(labels))
    view = TokenizerView(smol_tokenizer)
    prompt = ChatPrompt.build(view, schema)
    wave = compile_wave(view, list(schema.fields), boundary_text=prompt.boundary_text, tail_text=prompt.tail_text)
    lm = OracleLM(len(smol_tokenizer), salt=f"{n}{shape}")
    context = list(view.encode(prompt.prefix_text + TEXT))
    full = np.array(
        [
            lm.logprob(context + [wave.tree.tokens[a] for a in _chain(wave.tree.parents, node)], wave.tree.tokens[node])
            for node in range(len(wave.tree))
        ]
    )
    certain = full.copy()  # as a model that copies the listed labels writes them: every tail token near-certain
    for trie in wave.fields:
        for path in trie.paths:
            certain[list(path.nodes[path.ident + 1 :])] = -0.01
    ahead = PassCost(100.0, 4.0)  # a CPU's ratio: the walk reads a few levels per pass
    for strategy, full, cost in (
        (Exact(), full, None),
        (TrieWalk(), full, None),
        (TrieWalk(), full, ahead),
        (Exact(), certain, None),
    ):
        strategies = [strategy if len(f.spec.labels) > 32 else Marginal() for f in wave.fields]
        search = WaveSearch(plan_reading(wave, strategies, staging="staged", cost=lambda: None), cost=cost)
        seen = np.full(len(full), np.nan)
        asked = search.first()
        while asked:
            seen[list(asked)] = full[list(asked)]
            asked = search.next(seen)
        staged = search.decide(seen, temperature=1.0)
        for trie, decision, strat in zip(wave.fields, staged, strategies, strict=True):
            alone = strat.decide(trie, full)
            assert decision.label == alone.label, (trie.spec.name, strategy.name)
            if isinstance(strat, Marginal):
                assert decision == alone
                continue
            true = sequence_scores(trie, full)
            got = sequence_scores(trie, np.nan_to_num(seen, nan=0.0))
            assert (got >= true - 1e-9).all()  # sound: an unread tail only raises a label's score
            unread = {
                path.label for path in trie.paths if np.isnan(seen[list(path.nodes[trie.decision_depth :])]).any()
            }
            read = [li for li in range(len(labels)) if li not in unread]
            np.testing.assert_allclose(got[read], true[read], atol=1e-4)
            assert decision.bounded == len(labels) - len(read)
            mass = np.exp(true[np.isfinite(true)]).sum()
            assert mass - 1e-9 <= decision.candidate_mass <= 1 + 1e-9  # a sound bound of the mass, never above 1
            if not decision.bounded:
                assert decision.candidate_mass == pytest.approx(mass)
            if isinstance(strat, TrieWalk):  # the walk's winner is read in full: its probability is exact
                assert decision.probabilities[decision.label] == pytest.approx(alone.probabilities[alone.label])
        if shape == "long" and (isinstance(strategy, TrieWalk) or full is certain):
            assert np.isnan(seen).sum() > len(full) / 2  # most of the tree was never read


def _chain(parents, node):
    out = []
    node = parents[node]
    while node >= 0:
        out.append(node)
        node = parents[node]
    return out[::-1]


# ------------------------------------------------------------------------------------------ through the engine


@pytest.mark.parametrize("strategy", ["exact", "trie_walk", None])
@pytest.mark.parametrize(("n", "shape"), [(40, "long"), (255, "long"), (500, "words")])
def test_engine_staged_equals_one_pass_on_the_oracle(smol_tokenizer, strategy, n, shape):
    labels = long_labels(n, seed=n) if shape == "long" else word_labels(n, seed=n)
    schema = schema_with(labels)
    engine = oracle_engine(smol_tokenizer)
    whole = engine.extract(TEXT, schema, strategy=strategy, staging="one_pass")
    staged = engine.extract(TEXT, schema, strategy=strategy, staging="staged")
    assert_staged_matches(whole, staged)
    assert whole.stats.stage_passes == 0
    if shape == "long":  # tails below the identifying number: read in a later stage
        assert staged.stats.stage_passes >= 1
    scoring = len(whole.stats.documents_per_pass)  # scoring passes (the preamble prefill is not one)
    assert len(staged.stats.documents_per_pass) == scoring + staged.stats.stage_passes
    if strategy is None:
        assert whole.stats.nodes_saved > 0  # the marginal fields' tails were never fed, even in one pass
    if strategy == "trie_walk" and shape == "long":  # one extra stage, and most of the tree saved
        assert staged.stats.stage_passes == 1
        assert staged.stats.nodes_scored < whole.stats.nodes_scored / 3


@pytest.mark.slow
@pytest.mark.parametrize("preset", EXAMPLE_PRESETS)
@pytest.mark.parametrize("strategy", ["exact", None])
def test_every_example_preset_staged_equals_one_pass_on_the_oracle(smol_tokenizer, preset, strategy):
    p = example_preset(preset)
    engine = oracle_engine(smol_tokenizer, max_tokens=4)
    text = p.context or TEXT
    whole = engine.extract(text, p.schema, strategy=strategy, staging="one_pass")
    staged = engine.extract(text, p.schema, strategy=strategy, staging="staged")
    assert_staged_matches(whole, staged)


def test_batched_staged_requests_equal_each_alone(smol_tokenizer):
    schema = schema_with(long_labels(120))
    engine = oracle_engine(smol_tokenizer, staging="staged", batch_size=4)
    texts = [TEXT, "Two crates of honey.", "Live cattle by rail, urgent: vet papers missing.", "ok"]
    alone = [engine.extract(t, schema, strategy="exact") for t in texts]
    batched = engine.extract_many(texts, schema, strategy="exact")
    for a, b in zip(alone, batched, strict=True):
        assert b.values == a.values
        assert b.fields["category"].probability == pytest.approx(a.fields["category"].probability, abs=1e-9)
        assert b.stats.stage_passes == a.stats.stage_passes


def test_the_greedy_walk_baseline_is_the_greedy_descent(smol_tokenizer):
    """The first pcd's walk (``--against walk``) reaches the label a greedy descent to one label reaches, one level
    per pass."""
    labels = long_labels(60)
    schema = compile_schema(schema_with(labels))
    lm = OracleLM(len(smol_tokenizer), salt="walk")
    backend = OracleBackend(smol_tokenizer, lm)
    engine = Engine(backend, anchor=False, correction="none")
    engine.extract(TEXT, schema)  # the preamble prefill is not part of the count
    before = backend.forward_passes
    walked = generate_greedy_walk(engine, TEXT, schema)
    view = TokenizerView(smol_tokenizer)
    prompt = ChatPrompt.build(view, schema)
    wave = compile_wave(view, list(schema.fields), boundary_text=prompt.boundary_text, tail_text=prompt.tail_text)
    ids, tail0 = engine.prompt_for(TEXT, schema), engine.schema_prompt(schema)[0].tail0_ids
    context = ids[: len(ids) - len(tail0)] + list(wave.tail_ids[: wave.causal_len])  # as the request feeds it
    full = np.array(
        [
            lm.logprob(context + [wave.tree.tokens[a] for a in _chain(wave.tree.parents, node)], wave.tree.tokens[node])
            for node in range(len(wave.tree))
        ]
    )
    for trie in wave.fields:
        winner = TrieWalk(switch_at=1).decide(trie, full).label
        assert walked.values[trie.spec.name] == trie.spec.labels[winner].value
    longest = max(len(p.nodes) - t.decision_depth for t in wave.fields for p in t.paths)
    assert walked.valid and 1 < walked.forward_passes == backend.forward_passes - before <= longest


# ------------------------------------------------------------------------------------------ tiny models


@pytest.fixture(scope="module", params=both_backends(), ids=lambda p: f"{p[0]}-{p[1]}")
def backend(request, smol_tokenizer, tmp_path_factory):
    return tiny_backend(request.param, smol_tokenizer, tmp_path_factory.mktemp("m"))


@pytest.mark.parametrize("strategy", ["exact", "trie_walk", "marginal"])
def test_tiny_models_staged_equal_one_pass(backend, strategy):
    schema = schema_with(long_labels(60))
    engine = Engine(backend, anchor=False, correction="none")
    whole = engine.extract(TEXT, schema, strategy=strategy, staging="one_pass")
    staged = engine.extract(TEXT, schema, strategy=strategy, staging="staged")
    assert_staged_matches(whole, staged)
    batched = engine.extract_many([TEXT, "Honey and eggs."], schema, strategy=strategy, staging="staged")
    assert_staged_matches(staged, batched[0])


# ------------------------------------------------------------------------------------------ the cost model


def test_the_cost_model_keeps_one_pass_where_passes_are_dear_and_stages_where_nodes_are(smol_tokenizer):
    schema = schema_with(long_labels(255))
    dear_passes = oracle_engine(smol_tokenizer, pass_cost=(10_000.0, 0.001)).extract(TEXT, schema)
    dear_nodes = oracle_engine(smol_tokenizer, pass_cost=(1.0, 1.0)).extract(TEXT, schema)
    assert dear_passes.stats.stage_passes == 0
    assert dear_nodes.stats.stage_passes >= 1  # the default trie walk reads ahead in stages
    assert dear_nodes.values == dear_passes.values
    assert dear_nodes.stats.nodes_scored < dear_passes.stats.nodes_scored / 3
    small = oracle_engine(smol_tokenizer, pass_cost=(1.0, 1.0)).extract(TEXT, schema_with(long_labels(20)))
    assert small.stats.stage_passes == 0  # marginal (20 labels): head only, never staged


def test_the_pass_cost_is_measured_once_without_changing_the_state(backend):
    engine = Engine(backend, anchor=False, correction="none")
    schema = schema_with(long_labels(255))
    first = engine.extract(TEXT, schema)
    cost = engine._pass_cost
    assert isinstance(cost, PassCost) and cost.measured and cost.fixed_ms >= 0 and cost.node_ms >= 0
    again = engine.extract(TEXT, schema)
    assert engine._pass_cost is cost and again.values == first.values
    state = backend.start(engine.schema_prompt(schema)[1])
    length = state.length
    measure_pass_cost(backend, state, token=5, sizes=(2, 6), repeats=1)
    assert state.length == length


def test_staging_options_are_checked():
    with pytest.raises(OptionError, match="staging"):
        ExtractOptions(staging="sometimes")
    with pytest.raises(OptionError, match="pass_cost"):
        EngineOptions(pass_cost=(1.0,))
    with pytest.raises(OptionError, match="pass_cost"):
        EngineOptions(pass_cost=(-1.0, 2.0))
    assert PassCost(2.0, 0.5).ms(nodes=10, passes=2) == 9.0
