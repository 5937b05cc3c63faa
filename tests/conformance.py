"""The backend conformance suite: tree-packed scoring equals scoring each label path alone (fp32, 1e-4).

Each backend's test file subclasses :class:`BackendConformance` (or, for a model that can only run the row-broadcast
fallback, :class:`RowsConformance`) and supplies, as fixtures and methods:

- ``backend``: a backend on a tiny random model, parametrized over the architectures it can build;
- ``brute_force``: log p of each path token, scoring each path alone with the model's own caches and masks;
- ``snapshot`` / ``cache_lengths``: read a prefix's cache contents and a state's per-layer lengths;
- ``rows_backend``: the same model behind the row-broadcast fallback.

The tests use one label set with shared prefixes and one 300-label field.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from pcd_engine import Engine, compile_schema
from pcd_engine.backends.taps import FeatureTap, middle_layer
from pcd_engine.decide.compiler import compile_wave
from pcd_engine.decide.planner import TreeBatch, plan_passes
from pcd_engine.prompt.chat_prompt import ChatPrompt, TokenizerView, field_line
from pcd_engine.tools.check import PROBE, PROBE_TEXT

# The same probe `pcd check` runs on real models: labels that share token prefixes.
TEXT = PROBE_TEXT
SHARED_PREFIXES = PROBE


def shift_tree_positions(monkeypatch: Any) -> None:
    """Break the packer on purpose: every tree node's position moves one step too far."""
    original = TreeBatch.visibility

    def shifted(batch: TreeBatch, past: int, causal: int) -> Any:
        visible, qpos, kpos = original(batch, past, causal)
        qpos, kpos = qpos.copy(), kpos.copy()
        qpos[causal:] += 1
        kpos[past + causal :] += 1
        return visible, qpos, kpos

    monkeypatch.setattr(TreeBatch, "visibility", shifted)


BIG = {"product": {"type": "enum", "choices": [f"SKU-{i:03d}" for i in range(300)]}}


def decision_nodes(wave: Any) -> frozenset[int]:
    """Each field's decision node of a compiled wave (the first token where its labels differ)."""
    return frozenset(t.paths[0].nodes[t.decision_depth] for t in wave.fields)


def packed_logprobs(
    backend: Any,
    preset: dict,
    *,
    max_nodes: int = 10_000,
    tap: bool = False,
    chunk: int | None = None,
    text: str = TEXT,
) -> dict[str, Any]:
    """Score ``preset``'s whole first wave on ``backend`` the way the engine does, pass by pass; with ``tap``, the
    state carries a feature tap on the document and every field's decision node; with ``chunk``, the document is
    fed ahead in causal chunks of that many tokens first (the engine's way when a document does not fit one
    pass)."""
    tv = TokenizerView(backend.tokenizer)
    schema = compile_schema(preset)
    prompt = ChatPrompt.build(tv, schema)
    ids = prompt.request_ids(tv, text)
    wave = compile_wave(tv, schema.fields, boundary_text=prompt.boundary_text, tail_text=prompt.tail_text)
    assert tuple(ids[len(ids) - len(wave.tail_ids) :]) == wave.tail_ids
    causal_end = len(ids) - len(wave.tail_ids) + wave.causal_len
    prefix = backend.prefill(prompt.preamble_ids)
    state = backend.start(prefix)
    pending = ids[len(prompt.preamble_ids) : causal_end]
    if tap:
        span = (len(prompt.preamble_ids), len(ids) - len(wave.tail_ids))
        state.tap = FeatureTap(middle_layer(backend.hidden_layers), span, decision_nodes(wave))
    while chunk and len(pending) > 1:  # the last token stays: the tree reads its root from it
        step = min(chunk, len(pending) - 1)
        backend.score_tree(state, causal=pending[:step], batch=TreeBatch((), (), (), (), (), ()))
        pending = pending[step:]
    logprobs = np.full(len(wave.tree), np.nan)
    passes = plan_passes(wave.tree, max_nodes=max_nodes)
    for batch in passes:
        logprobs[list(batch.query_nodes)] = backend.score_tree(state, causal=pending, batch=batch)
        pending = []
    return {
        "context": ids[:causal_end],
        "wave": wave,
        "logprobs": logprobs,
        "passes": passes,
        "prefix": prefix,
        "state": state,
    }


def check_paths(brute_force: Any, wave: Any, context: list[int], logprobs: np.ndarray) -> None:
    """Every label path's packed log-probs equal ``brute_force(context, paths)`` (fp32, 1e-4)."""
    paths = [path for trie in wave.fields for path in trie.paths]
    tokens = [[wave.tree.tokens[n] for n in path.nodes] for path in paths]
    for path, expected in zip(paths, brute_force(list(context), tokens), strict=True):
        np.testing.assert_allclose(logprobs[list(path.nodes)], expected, atol=1e-4, rtol=0)


PRESET_IDS = ["shared-prefixes", "300-labels"]


class RowsConformance:
    """Tests every scorer must pass, the row-broadcast fallback included; see the module docstring for what a
    subclass provides. Hybrid models (convolution or recurrent layers, which no tree mask can branch) run only
    these."""

    def brute_force(self, backend: Any, context: list[int], paths: list[list[int]]) -> list[np.ndarray]:
        raise NotImplementedError

    def snapshot(self, prefix: Any) -> Any:
        raise NotImplementedError

    @pytest.fixture
    def rows_backend(self) -> Any:
        raise NotImplementedError

    def check_against_brute_force(self, backend: Any, wave: Any, context: list[int], logprobs: np.ndarray) -> None:
        check_paths(lambda c, p: self.brute_force(backend, c, p), wave, context, logprobs)

    def hidden_reference(self, backend: Any, ids: list[int], layer: int) -> tuple[np.ndarray, np.ndarray]:
        """Hidden-state ``layer`` and the final states (after the final norm), ``[len(ids), hidden]`` each, from
        one plain causal pass of the model's own library (a backend without one skips the tap tests; MLX's taps
        are held to PyTorch's on the same weights in test_backend_agreement)."""
        pytest.skip("no plain hidden-state reference for this backend")

    def check_tap(self, backend: Any, run: dict[str, Any]) -> None:
        """The tap's document mean and answer states equal the plain pass's: the document mean over the document's
        rows, each decision node's state at its parent's row of the sequence ``context + ancestors``."""
        tap, tree, context = run["state"].tap, run["wave"].tree, run["context"]
        middle, _ = self.hidden_reference(backend, context, tap.layer)
        lo, hi = tap.span
        scale = float(np.abs(middle).max())
        np.testing.assert_allclose(tap.document_mean(middle.shape[1]), middle[lo:hi].mean(axis=0), atol=1e-4 * scale)
        assert tap.count == hi - lo > 0
        assert tap.nodes and set(tap.answers) == set(tap.nodes)
        for node in sorted(tap.nodes):
            chain, parent = [], tree.parents[node]
            while parent >= 0:
                chain.append(tree.tokens[parent])
                parent = tree.parents[parent]
            _, final = self.hidden_reference(backend, [*context, *reversed(chain)], tap.layer)
            np.testing.assert_allclose(tap.answers[node], final[-1], atol=1e-4 * float(np.abs(final).max()))

    def test_rows_tap_equals_plain_hidden_states(self, rows_backend):
        self.check_tap(rows_backend, packed_logprobs(rows_backend, SHARED_PREFIXES, tap=True, chunk=7))

    def check_prefix_untouched(self, backend: Any) -> dict[str, Any]:
        """Score a wave twice from one prefix: the prefix's cache must not change, nor the answers."""
        first = packed_logprobs(backend, SHARED_PREFIXES)
        before = self.snapshot(first["prefix"])
        state = backend.start(first["prefix"])
        tokens = first["context"][first["prefix"].length :]
        batch = plan_passes(first["wave"].tree, max_nodes=10_000)[0]
        again = np.zeros(len(first["wave"].tree))
        again[list(batch.query_nodes)] = backend.score_tree(state, causal=tokens, batch=batch)
        after = self.snapshot(first["prefix"])
        assert len(before) > 0
        for a, b in zip(before, after, strict=True):
            np.testing.assert_array_equal(a, b)
        np.testing.assert_allclose(again, first["logprobs"], atol=1e-5, rtol=0)
        assert state.length == len(first["context"])
        return {"state": state, "context": first["context"]}

    def test_rows_prefix_untouched(self, rows_backend):
        self.check_prefix_untouched(rows_backend)

    @pytest.mark.parametrize("preset", [SHARED_PREFIXES, pytest.param(BIG, marks=pytest.mark.slow)], ids=PRESET_IDS)
    def test_rows_fallback_equals_brute_force(self, rows_backend, preset):
        assert rows_backend.scorer == "rows"
        run = packed_logprobs(rows_backend, preset)
        self.check_against_brute_force(rows_backend, run["wave"], run["context"], run["logprobs"])

    def scripted_rows(self, backend: Any, scripts: list[list[list[int]]]) -> dict[str, Any]:
        """Grow three rows (two sharing their first prefix token) with a scripted chooser: each row's script is a
        list of choices, a choice one or more tokens (more, as when a grammar forces what follows); the chooser
        records the log-probability of each choice's first token."""
        tv = TokenizerView(backend.tokenizer)
        schema = compile_schema(SHARED_PREFIXES)
        prompt = ChatPrompt.build(tv, schema)
        ids = prompt.request_ids(tv, TEXT)
        prefix = backend.prefill(prompt.preamble_ids)
        before = self.snapshot(prefix)
        heads = ['\n  "setup":', '\n  "punchline_text":', '\n  "n":']
        prefixes = [tv.encode(h) for h in heads]
        assert prefixes[0][0] == prefixes[1][0] and len({len(p) for p in prefixes}) > 1
        seen: list[list[float]] = [[] for _ in scripts]

        def choose(row: int, logprobs: np.ndarray) -> tuple[list[int], bool]:
            assert logprobs.shape == (len(backend.tokenizer),) or logprobs.shape[0] >= len(backend.tokenizer)
            step = len(seen[row])
            seen[row].append(float(logprobs[scripts[row][step][0]]))
            return scripts[row][step], step + 1 == len(scripts[row])

        causal = ids[len(prompt.preamble_ids) :]
        passes = backend.generate_rows(backend.start(prefix), causal=causal, prefixes=prefixes, choose=choose)
        for a, b in zip(before, self.snapshot(prefix), strict=True):
            np.testing.assert_array_equal(a, b)
        return {"context": ids, "prefixes": prefixes, "seen": seen, "passes": passes}

    SCRIPTS = [[[476], [28120, 905], [1002]], [[476, 1002]], [[216], [33], [34, 35, 36], [37], [28]]]

    def check_rows(self, backend: Any, run: dict[str, Any]) -> None:
        for prefix, script, seen in zip(run["prefixes"], self.SCRIPTS, run["seen"], strict=True):
            flat = [t for choice in script for t in choice]
            starts = np.cumsum([0] + [len(choice) for choice in script[:-1]])
            lps = self.brute_force(backend, list(run["context"]), [prefix + flat])[0][len(prefix) :]
            np.testing.assert_allclose(seen, lps[starts], atol=1e-4, rtol=0)

    def test_rows_fallback_rows_equal_brute_force(self, rows_backend):
        """The broadcast fallback extends the state by the causal tokens (one pass), then feeds one token per row
        per pass, prefixes first."""
        run = self.scripted_rows(rows_backend, self.SCRIPTS)
        self.check_rows(rows_backend, run)
        steps = max(len(p) + sum(map(len, s)) - 1 for p, s in zip(run["prefixes"], self.SCRIPTS, strict=True))
        assert run["passes"] == 1 + steps

    def check_sequence_logprobs(self, backend: Any) -> None:
        """The plain reference ``pcd check`` compares against: one causal pass, no cache, equals the brute force."""
        run = packed_logprobs(backend, SHARED_PREFIXES)
        context = list(run["context"])
        nodes = list(run["wave"].fields[0].paths[1].nodes)
        path = [run["wave"].tree.tokens[n] for n in nodes]
        got = backend.sequence_logprobs(context + path)
        assert got.shape == (len(context) + len(path) - 1,) and got.dtype == np.float64
        expected = self.brute_force(backend, context, [path])[0]
        np.testing.assert_allclose(got[-len(path) :], expected, atol=1e-4, rtol=0)
        np.testing.assert_allclose(got[-len(path) :], run["logprobs"][nodes], atol=1e-4, rtol=0)

    def test_rows_sequence_logprobs_equal_brute_force(self, rows_backend):
        self.check_sequence_logprobs(rows_backend)

    def check_second_wave(self, backend: Any) -> None:
        """A wave after the anchor: written answers ride as causal tokens in front of the next tree."""
        tv = TokenizerView(backend.tokenizer)
        schema = compile_schema(SHARED_PREFIXES)
        prompt = ChatPrompt.build(tv, schema)
        ids = prompt.request_ids(tv, TEXT)
        first = compile_wave(tv, schema.fields[:1], boundary_text=prompt.boundary_text, tail_text=prompt.tail_text)
        tail = prompt.tail_text + field_line("deadline", '"12_HOURS"')
        second = compile_wave(tv, schema.fields[1:], boundary_text=prompt.boundary_text, tail_text=tail)
        base = len(ids) - len(first.tail_ids)
        state = backend.start(backend.prefill(prompt.preamble_ids))
        backend.score_tree(
            state,
            causal=ids[len(prompt.preamble_ids) : base + first.causal_len],
            batch=plan_passes(first.tree, max_nodes=999)[0],
        )
        causal = list(second.tail_ids[first.causal_len : second.causal_len])
        batch = plan_passes(second.tree, max_nodes=999)[0]
        logprobs = np.zeros(len(second.tree))
        logprobs[list(batch.query_nodes)] = backend.score_tree(state, causal=causal, batch=batch)
        context = ids[:base] + list(second.tail_ids[: second.causal_len])
        self.check_against_brute_force(backend, second, context, logprobs)

    def test_rows_second_wave_matches_brute_force(self, rows_backend):
        self.check_second_wave(rows_backend)

    def check_documents(self, backend: Any) -> None:
        """``extract_many`` on documents of mixed lengths, with waves, a multi-label field and an open field:
        every answer equals the document decided alone; documents share passes where the backend batches them,
        and take one pass each where it does not."""
        schema = {
            "tone": {"type": "enum", "choices": ["calm", "angry", "sad"]},
            "refund": {"type": "boolean", "depends_on": ["tone"]},
            "tags": {"type": "multi", "choices": ["late", "broken", "billing"], "max_items": 2},
            "summary": {"type": "string", "max_tokens": 3},
        }
        texts = ["Short.", TEXT, f"{TEXT} {TEXT}"]
        engine = Engine(backend, batch_size=8)
        batched = engine.extract_many(texts, schema)
        for text, got in zip(texts, batched, strict=True):
            alone = engine.extract(text, schema)
            assert got.values == alone.values
            for name, field in alone.fields.items():
                if field.probability is not None:
                    assert got.fields[name].probability == pytest.approx(field.probability, abs=1e-4)
        shared = {n for r in batched for n in r.stats.documents_per_pass}
        assert max(shared) > 1 if backend.batches_documents else shared == {1}

    def test_rows_documents_equal_one_at_a_time(self, rows_backend):
        self.check_documents(rows_backend)


class BackendConformance(RowsConformance):
    """Tests of the tree-packed scorer on top of :class:`RowsConformance`; see the module docstring."""

    def cache_lengths(self, state: Any) -> list[int]:
        raise NotImplementedError

    @pytest.mark.parametrize("preset", [SHARED_PREFIXES, pytest.param(BIG, marks=pytest.mark.slow)], ids=PRESET_IDS)
    def test_packed_equals_brute_force(self, backend, preset):
        run = packed_logprobs(backend, preset)
        assert len(run["passes"]) == 1
        assert not np.isnan(run["logprobs"]).any()
        self.check_against_brute_force(backend, run["wave"], run["context"], run["logprobs"])

    def test_sequence_logprobs_equal_brute_force(self, backend):
        self.check_sequence_logprobs(backend)

    @pytest.mark.parametrize(("max_nodes", "chunk"), [(10_000, None), (5, None), (10_000, 7)],
                             ids=["one-pass", "split-tree", "document-in-chunks"])  # fmt: skip
    def test_tap_equals_plain_hidden_states(self, backend, max_nodes, chunk):
        """A feature tap reads the same states as a plain pass, whether the tree is read in one pass or several
        and the document fed with it or ahead in chunks; the tapped pass's log-probs are unchanged."""
        run = packed_logprobs(backend, SHARED_PREFIXES, max_nodes=max_nodes, tap=True, chunk=chunk)
        self.check_tap(backend, run)
        plain = packed_logprobs(backend, SHARED_PREFIXES)
        # The same pass agrees to 1e-5; a tree split over passes or a document fed in chunks sums attention in
        # another order, so it agrees as split and one pass do (1e-4 below: fp32 on log-probs near -13 moved
        # 1.1e-5 once on gpt_oss).
        atol = 1e-5 if max_nodes == 10_000 and chunk is None else 1e-4
        np.testing.assert_allclose(run["logprobs"], plain["logprobs"], atol=atol, rtol=0)

    def test_tap_reads_the_layer_it_names(self, backend):
        """The check can fail: the plain pass's other layers differ from what the tap read."""
        run = packed_logprobs(backend, SHARED_PREFIXES, tap=True)
        tap = run["state"].tap
        others = [k for k in range(backend.hidden_layers + 1) if k != tap.layer]
        lo, hi = tap.span
        for k in others:
            middle, _ = self.hidden_reference(backend, run["context"], k)
            assert np.abs(middle[lo:hi].mean(axis=0) - tap.document_mean(middle.shape[1])).max() > 1e-3

    def test_batched_taps_equal_one_at_a_time(self, backend):
        """Documents scored as batch rows of one pass hand each tap what it reads alone."""
        texts = ["Short.", TEXT, f"{TEXT} {TEXT}"]
        runs = [packed_logprobs(backend, SHARED_PREFIXES, tap=True, text=t) for t in texts]
        alone = [r["state"].tap for r in runs]
        states = [backend.start(r["prefix"]) for r in runs]
        for state, run in zip(states, runs, strict=True):
            state.tap = FeatureTap(run["state"].tap.layer, run["state"].tap.span, run["state"].tap.nodes)
        batches = [plan_passes(r["wave"].tree, max_nodes=10_000)[0] for r in runs]
        causals = [r["context"][r["prefix"].length :] for r in runs]
        before = backend.forward_passes
        backend.score_trees(states, causals=causals, batches=batches)
        assert backend.forward_passes - before == (1 if backend.batches_documents else len(texts))
        for state, one in zip(states, alone, strict=True):
            width = len(next(iter(one.answers.values())))
            mean = one.document_mean(width)
            np.testing.assert_allclose(state.tap.document_mean(width), mean, atol=1e-4 * np.abs(mean).max())
            assert state.tap.count == one.count and set(state.tap.answers) == set(one.answers)
            for node, vector in one.answers.items():
                np.testing.assert_allclose(state.tap.answers[node], vector, atol=1e-4 * np.abs(vector).max())

    def test_second_wave_matches_brute_force(self, backend):
        self.check_second_wave(backend)

    def test_batched_documents_equal_one_at_a_time(self, backend):
        self.check_documents(backend)

    def test_prefix_untouched_and_tree_cropped(self, backend):
        """Requests never write into the shared prefix, and a state holds exactly its causal tokens afterwards."""
        run = self.check_prefix_untouched(backend)
        assert set(self.cache_lengths(run["state"])) == {len(run["context"])}

    def test_split_passes_equal_one_pass(self, backend):
        one = packed_logprobs(backend, SHARED_PREFIXES)
        split = packed_logprobs(backend, SHARED_PREFIXES, max_nodes=5)
        assert len(split["passes"]) > 2
        np.testing.assert_allclose(split["logprobs"], one["logprobs"], atol=1e-4, rtol=0)

    def test_wrong_positions_are_detected(self, backend, monkeypatch):
        """The check can fail: shifting every tree position by one moves the log-probs well past the tolerance."""
        good = packed_logprobs(backend, SHARED_PREFIXES)["logprobs"]
        shift_tree_positions(monkeypatch)
        bad = packed_logprobs(backend, SHARED_PREFIXES)["logprobs"]
        assert np.abs(bad - good).max() > 1e-3

    def test_rows_fallback_equals_packed(self, backend, rows_backend):
        packed = Engine(backend, anchor=True).extract(TEXT, SHARED_PREFIXES)
        fallback = Engine(rows_backend, anchor=True).extract(TEXT, SHARED_PREFIXES)
        assert fallback.values == packed.values
        for name in packed.values:
            assert fallback.fields[name].probability == pytest.approx(packed.fields[name].probability, abs=1e-4)
        assert any("one row each" in w for w in fallback.warnings)

    def test_engine_one_pass_per_wave(self, backend):
        engine = Engine(backend, anchor=False)
        engine.extract(TEXT, SHARED_PREFIXES)  # warm the preamble cache
        out = engine.extract(TEXT, SHARED_PREFIXES)
        assert out.stats.forward_passes == 1
        assert out.stats.cached_tokens > 0
        anchored = Engine(backend, anchor=True)
        anchored.extract(TEXT, SHARED_PREFIXES)
        assert anchored.extract(TEXT, SHARED_PREFIXES).stats.forward_passes == 2

    def test_packed_rows_equal_brute_force(self, backend):
        """Rows grown as one tree: each row's distributions equal its own plain causal continuation, a choice of
        several tokens is one chain in one pass, and the rows take as many passes as the longest row has
        choices, not the sum."""
        run = self.scripted_rows(backend, self.SCRIPTS)
        self.check_rows(backend, run)
        assert run["passes"] == max(len(s) for s in self.SCRIPTS)

    def test_wrong_row_positions_are_detected(self, backend, monkeypatch):
        """The rows check can fail: shifted positions move the generated distributions past the tolerance."""
        good = self.scripted_rows(backend, self.SCRIPTS)["seen"]
        shift_tree_positions(monkeypatch)
        bad = self.scripted_rows(backend, self.SCRIPTS)["seen"]
        assert max(abs(a - b) for g, w in zip(good, bad, strict=True) for a, b in zip(g, w, strict=True)) > 1e-3


class RowsProbeOnly:
    """Mixed in before a rows conformance class: its rows comparison on the shared-prefix probe only, for the
    architectures beyond the main matrix (the 300-label field runs there)."""

    @pytest.mark.parametrize("preset", [SHARED_PREFIXES], ids=["shared-prefixes"])
    def test_rows_fallback_equals_brute_force(self, rows_backend, preset):
        super().test_rows_fallback_equals_brute_force(rows_backend, preset)


class ProbeOnly(RowsProbeOnly):
    """:class:`RowsProbeOnly`, and the packed comparison on the probe only too."""

    @pytest.mark.parametrize("preset", [SHARED_PREFIXES], ids=["shared-prefixes"])
    def test_packed_equals_brute_force(self, backend, preset):
        super().test_packed_equals_brute_force(backend, preset)
