"""The engine's parts on their own: the LRU, the pass budget's search, the compile cache, the backends' public
hooks (a plain causal pass, the weights' precision) and the per-request steps."""

from __future__ import annotations

import threading

import pytest

from pcd_engine import Engine, LimitError
from pcd_engine.backends.torch import TorchBackend
from pcd_engine.lru import LRU
from pcd_engine.run.batch import open_lean
from pcd_engine.run.budget import PassBudget, largest
from pcd_engine.run.request import Request
from pcd_engine.schema import compile_schema
from pcd_engine.tools.examples import example_preset
from tests.support import OracleBackend, OracleLM, tiny_model

TEXT = "Hi, I was billed twice for order 5521. Please refund the second charge by tomorrow."


@pytest.fixture(scope="module")
def engine(smol_tokenizer):
    return Engine(TorchBackend(tiny_model("llama", len(smol_tokenizer)), smol_tokenizer))


def test_lru_drops_the_least_recently_used():
    lru: LRU[str, int] = LRU(2)
    lru.put("a", 1)
    lru.put("b", 2)
    assert lru.get("a") == 1  # a is now the most recent
    lru.put("c", 3)
    assert "b" not in lru and lru.get("a") == 1 and lru.get("c") == 3
    assert len(lru) == 2
    built: list[str] = []
    assert lru.get_or_build("d", lambda: built.append("d") or 4) == 4
    assert lru.get_or_build("d", lambda: built.append("again") or 5) == 4
    assert built == ["d"]
    with pytest.raises(ValueError, match="capacity"):
        LRU(0)


def test_lru_is_safe_to_share_between_threads():
    lru: LRU[int, int] = LRU(50)

    def work(offset: int) -> None:
        for i in range(2000):
            lru.put((offset + i) % 97, i)
            lru.get((offset * 7 + i) % 97)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(lru) == 50


@pytest.mark.parametrize("limit", [0, 1, 2, 7, 100, 4095, 70_000])
def test_largest_equals_a_linear_scan(limit):
    fits = lambda n: n <= limit  # noqa: E731
    assert largest(fits) == next(n for n in range(limit + 2) if not fits(n)) - 1


def test_pass_budget_fit_equals_the_backend_estimate(smol_tokenizer):
    backend = OracleBackend(smol_tokenizer, OracleLM(len(smol_tokenizer)))  # pass_bytes = new * 1000
    budget = PassBudget(backend, 50_500)
    assert budget.fit(10) == 50 and budget.fit(10, extra=20) == 30
    assert budget.max_nodes(10, causal=45) == 5 and budget.max_nodes(10, causal=60) == 1
    assert "MiB" in str(budget.over("the text")) and isinstance(budget.over("x"), LimitError)
    assert PassBudget.of(backend, 2.0).bytes == 2 * 2**20


def test_schema_prompts_are_cached_per_prompt_format_and_evicted(smol_tokenizer):
    backend = OracleBackend(smol_tokenizer, OracleLM(len(smol_tokenizer)))
    engine = Engine(backend, prompt_cache_size=1)
    schema = example_preset("support_triage").schema
    engine.extract(TEXT, schema)
    engine.extract(TEXT, schema, instructions="Answer carefully.")
    assert len(engine.cache.prompts) == 1  # the first format's preamble was dropped
    before = backend.forward_passes
    prompt, _prefix = engine.schema_prompt(schema, instructions="Answer carefully.")
    assert backend.forward_passes == before  # cached: no prefill
    engine.schema_prompt(schema)
    assert backend.forward_passes > before  # evicted: prefilled again
    assert prompt.chat.preamble_ids and prompt.tail0_ids


def test_request_steps_equal_extract(smol_tokenizer):
    """Running the four steps by hand gives exactly what extract gives."""
    backend = OracleBackend(smol_tokenizer, OracleLM(len(smol_tokenizer)))
    engine = Engine(backend)
    schema = compile_schema(example_preset("support_triage").schema)
    whole = engine.extract(TEXT, schema)
    call = engine.resolve()
    request = Request.open(engine, schema, call, TEXT, lean=lambda: open_lean(engine, schema, call))
    assert len(request.waves) == whole.stats.waves
    for index in range(len(request.waves)):
        request.decide_wave(index)
    request.generate()
    out = request.result(started=0.0, passes_before=0)
    assert out.values == whole.values
    assert {k: r.probability for k, r in out.fields.items()} == {k: r.probability for k, r in whole.fields.items()}


def test_plain_pass_runs_one_causal_pass_and_leaves_the_preamble(engine):
    out = engine.extract(TEXT, example_preset("support_triage").schema, anchor=False)
    prompt, prefix = engine.schema_prompt(out.schema)
    backend = engine.backend
    before = backend.forward_passes
    run = backend.plain_pass(prefix, prompt.chat.preamble_ids[:5], rows=3)
    run()
    run()
    assert backend.forward_passes == before + 2
    again = engine.extract(TEXT, out.schema, anchor=False)
    assert again.values == out.values
    assert [r.probability for r in again.fields.values()] == pytest.approx([r.probability for r in out.fields.values()])


def test_weights_dtype(engine, smol_tokenizer):
    assert engine.backend.weights_dtype == "float32"
    import torch

    half = TorchBackend(tiny_model("llama", len(smol_tokenizer)).to(torch.bfloat16), smol_tokenizer)
    assert half.weights_dtype == "bfloat16"


def test_require_names_the_missing_package():
    from pcd_engine import BackendUnavailableError
    from pcd_engine.errors import require

    (json_module,) = require("json", what="Test", install="nothing")
    assert json_module.dumps([1]) == "[1]"
    with pytest.raises(
        BackendUnavailableError, match=r"Test: expected json and no_such_pkg_pcd .*'no_such_pkg_pcd'.*pip x"
    ):
        require("json", "no_such_pkg_pcd.sub", what="Test", install="pip x")


def test_every_option_strategy_has_one_decoder():
    from pcd_engine.decide.decoding import choose_strategy
    from pcd_engine.options import STRATEGIES

    assert [choose_strategy(5, name=name).name for name in STRATEGIES] == list(STRATEGIES)


@pytest.mark.parametrize("scorer", ["packed", "rows"])
def test_generate_rows_calls_before_pass_at_every_pass_boundary(smol_tokenizer, scorer):
    backend = TorchBackend(tiny_model("llama", len(smol_tokenizer)), smol_tokenizer, scorer=scorer)
    prefix = backend.prefill([1, 2, 3, 4])
    steps = [0, 0, 0]

    def choose(row, logprobs):
        steps[row] += 1
        return [7], steps[row] >= 4 + row  # rows of 4, 5 and 6 choices

    calls = []
    passes = backend.generate_rows(
        backend.start(prefix), causal=[5], prefixes=[[8], [9], [10]], choose=choose, before_pass=lambda: calls.append(1)
    )
    assert len(calls) == passes - 1 and passes >= 6

    class Stop(Exception):
        pass

    def stop_at_third():
        if backend.forward_passes - before >= 3:
            raise Stop

    steps[:] = [0, 0, 0]
    before = backend.forward_passes
    with pytest.raises(Stop):
        backend.generate_rows(
            backend.start(prefix), causal=[5], prefixes=[[8], [9], [10]], choose=choose, before_pass=stop_at_third
        )
    assert backend.forward_passes - before == 3  # no pass ran after the hook refused


def test_stream_chat_time_limit_stops_between_tokens(smol_tokenizer):
    from pcd_engine import ChatMessage, OptionError, RequestTimeout, stream_chat

    engine = Engine(OracleBackend(smol_tokenizer, OracleLM(len(smol_tokenizer))))
    turns = [ChatMessage("user", "Say something")]
    free = "".join(c.text for c in stream_chat(engine, turns, max_new_tokens=5))
    assert free == "".join(c.text for c in stream_chat(engine, turns, max_new_tokens=5, time_limit_s=600))
    with pytest.raises(RequestTimeout, match="time limit of 1e-09 s"):
        list(stream_chat(engine, turns, max_new_tokens=5, time_limit_s=1e-9))
    with pytest.raises(OptionError, match="time_limit_s"):
        list(stream_chat(engine, turns, time_limit_s=0))


CLOSED_REPLY = {"type": "object", "properties": {"late": {"type": "boolean"}}, "required": ["late"]}
CLOSED_REPLY["additionalProperties"] = False


@pytest.mark.parametrize(
    "schema",
    [None, {"type": "object", "properties": {"order": {"type": "integer"}, "late": {"type": "boolean"}}}, CLOSED_REPLY],
)
def test_json_chat_equals_the_obvious_constrained_generator(smol_tokenizer, schema):
    from pcd_engine.generate.free_text import ChatMessage, chat_prompt_ids, json_chat
    from pcd_engine.prompt.chat_prompt import TokenizerView
    from tests.support import greedy_constrained

    lm = OracleLM(len(smol_tokenizer), salt="json")
    engine = Engine(OracleBackend(smol_tokenizer, lm))
    turns = [ChatMessage("user", "Order 5521 is late. Answer in JSON.")]
    reply = json_chat(engine, turns, schema=schema, max_new_tokens=24)
    ids = chat_prompt_ids(engine.tokenizer, turns)
    out, finished, _ = greedy_constrained(lm, smol_tokenizer, None, schema or {"type": "object"}, 24, ids=ids)
    assert reply.completion_tokens == len(out) and reply.prompt_tokens == len(ids)
    assert reply.finish_reason == ("stop" if finished else "length")
    written = TokenizerView(smol_tokenizer).decode(out).strip()
    assert reply.text == written if finished else reply.text.startswith(written.rstrip("\\"))
    assert reply.valid == (reply.value is not None) and (reply.value is None or isinstance(reply.value, dict))
    if schema is CLOSED_REPLY:  # a reply the grammar closes quickly: complete and valid
        assert finished and reply.valid and set(reply.value) == {"late"}
