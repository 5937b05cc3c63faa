"""The Engine on tiny random models: results, bad input, awkward input, chat templates and caches."""

from __future__ import annotations

import copy
import enum
import re
from typing import Annotated, Any, Literal

import numpy as np
import pytest
from pydantic import BaseModel, Field

from pcd_engine import ContextError, Engine, OptionError, SchemaError
from pcd_engine.backends.torch import TorchBackend
from pcd_engine.decide.compiler import compile_wave
from pcd_engine.decide.planner import plan_passes
from pcd_engine.prompt.chat_prompt import ChatPrompt, TokenizerView
from pcd_engine.schema import compile_schema
from tests.support import check_against_brute_force, template_tokenizer, tiny_model

TEXT = "Hi, I was billed twice for order 5521. Please refund the second charge by tomorrow."


class Mood(str, enum.Enum):
    HAPPY = "happy"
    SAD = "sad"


class Ticket(BaseModel):
    """A support ticket."""

    sentiment: Literal["POSITIVE", "NEUTRAL", "NEGATIVE"]
    wants_refund: bool = Field(description="Whether the customer asks for money back")
    deadline: Literal["1_HOUR", "12_HOURS", "1_WEEK", "NONE"]
    mood: Mood
    stars: Literal[1, 2, 3, 4, 5]


@pytest.fixture(scope="module")
def engine(smol_tokenizer):
    return Engine(TorchBackend(tiny_model("llama", len(smol_tokenizer)), smol_tokenizer))


def test_result_shape(engine):
    out = engine.extract(TEXT, Ticket)
    assert list(out.values) == ["sentiment", "wants_refund", "deadline", "mood", "stars"]
    assert isinstance(out.values["wants_refund"], bool)
    assert out.values["mood"] in ("happy", "sad")
    model = out.model
    assert isinstance(model, Ticket) and isinstance(model.mood, Mood)
    for name, field in out.fields.items():
        spec = out.schema.field(name)
        assert field.value in spec.values
        assert 0.0 < field.probability <= 1.0
        assert 0.0 < field.candidate_mass <= 1.0 + 1e-9
        assert field.method == "marginal"
        probs = [a.probability for a in field.alternatives]
        assert probs == sorted(probs, reverse=True)
        assert field.alternatives[0].value == field.value
        assert sum(probs) == pytest.approx(1.0) or len(probs) == engine.options.top_k
    assert out.fields["sentiment"].wave == 0 and out.fields["stars"].wave == 1
    stats = out.stats
    assert stats.prompt_tokens > stats.cached_tokens > 0
    assert stats.nodes_scored > 0 and stats.waves == 2
    phases = {"tokenize", "prefill", "correction", "compile", "forward", "decode", "generate", "total"}
    assert set(stats.phases_ms) == phases
    assert stats.generation_passes == stats.generated_tokens == 0 and stats.phases_ms["generate"] == 0


def test_low_confidence_thresholds(engine):
    out = engine.extract(TEXT, Ticket)
    assert out.low_confidence(min_probability=0.0, min_candidate_mass=0.0) == []
    everything = out.low_confidence(min_probability=1.01)
    assert [f.name for f in everything] == list(out.values)


def test_runners_up_never_repeat_the_answer():
    from pcd_engine.result import Alternative, FieldResult

    alts = (Alternative("a", 0.5), Alternative("b", 0.3), Alternative("c", 0.15), Alternative("d", 0.05))
    single = FieldResult("f", "b", 0.3, 0.9, "exact", alts, 0)  # chosen below the top (a threshold, a tie rule)
    assert [a.value for a in single.runners_up()] == ["a", "c"]
    multi = FieldResult("m", ["a", "c"], 0.15, 0.9, "exact", alts, 0)
    assert [a.value for a in multi.runners_up()] == ["b", "d"]
    assert [a.value for a in multi.runners_up(1)] == ["b"]
    assert FieldResult("g", "x", None, None, "generated", (), 1).runners_up() == ()


def test_extract_many_in_order(engine):
    texts = [TEXT, "Great service, thanks!", "Where is my parcel?"]
    many = engine.extract_many(texts, Ticket)
    assert [m.values for m in many] == [engine.extract(t, Ticket).values for t in texts]


@pytest.mark.parametrize("text", ["", "   \n\t ", None, 12])
def test_empty_or_non_text(engine, text):
    before = engine.backend.forward_passes
    with pytest.raises(ContextError, match="Context: expected text to"):
        engine.extract(text, Ticket)
    assert engine.backend.forward_passes == before


def test_extract_many_checks_every_text_first(engine):
    before = engine.backend.forward_passes
    with pytest.raises(ContextError, match=r"texts\[1\]"):
        engine.extract_many([TEXT, " "], Ticket)
    assert engine.backend.forward_passes == before


def test_extract_many_refuses_a_single_string(engine):
    """A string is iterable: taken as the texts, it would be one document per character."""
    before = engine.backend.forward_passes
    for texts in (TEXT, TEXT.encode()):
        with pytest.raises(ContextError, match=rf"expected a list .* but got a single {type(texts).__name__} of "):
            engine.extract_many(texts, Ticket)
    assert engine.backend.forward_passes == before
    assert len(engine.extract_many((t for t in [TEXT]), Ticket)) == 1  # any other iterable of texts is taken


def test_context_longer_than_window(engine):
    long_text = "word " * 5000
    with pytest.raises(ContextError, match=r"window of 4096 tokens, but it needs \d+ tokens"):
        engine.extract(long_text, Ticket)
    assert engine.extract(TEXT, Ticket).values  # nothing half-done: the engine still works


def test_bad_schema_before_model_work(engine):
    class Bad(BaseModel):
        name: dict[str, Any]

    before = engine.backend.forward_passes
    with pytest.raises(SchemaError, match=r"Field 'name': expected an object with known keys .*dict\[str, Any\]"):
        engine.extract(TEXT, Bad)
    # A value schema the constrained generator cannot honour is refused before any model work too.
    weird = {"properties": {"ok": {"type": "boolean"}, "when": {"type": "string", "format": "no-such-format"}}}
    with pytest.raises(
        SchemaError, match=r"Field 'when': expected a JSON Schema the constrained generator \(llguidance\) can hon"
    ):
        engine.extract(TEXT, weird)
    assert engine.backend.forward_passes == before


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [({"temperature": 0}, "temperature: expected a number > 0"), ({"strategy": "beam"}, "Strategy: expected one of")],
)
def test_bad_options(engine, kwargs, match):
    with pytest.raises(OptionError, match=match):
        engine.extract(TEXT, Ticket, **kwargs)


def test_bad_engine_options(engine):
    with pytest.raises(OptionError, match="Known options"):
        Engine(engine.backend, colour="red")
    with pytest.raises(OptionError, match="prompt_cache_size"):
        Engine(engine.backend, prompt_cache_size=0)


AWKWARD = {
    "schema": {"type": "enum", "choices": ["ü-ñ", 'say "hi"', "back\\slash", "日本語"]},
    "properties": {"type": "boolean"},
    "type": {"type": "enum", "choices": [1, 10, 100, 2]},
    "tone": {"type": "enum", "choices": ["angr", "angry", "an"]},
    "single": {"type": "enum", "choices": ["only"]},
}


def test_awkward_but_valid(engine):
    engine.extract(TEXT, AWKWARD, anchor=False)  # warm the preamble cache
    out = engine.extract('Ça coûte 10 €, "vraiment" \\ trop.', AWKWARD, anchor=False)
    schema = compile_schema(AWKWARD)
    for spec in schema.fields:
        assert out.values[spec.name] in spec.values
    assert out.fields["single"].method == "fixed" and out.values["single"] == "only"
    assert out.stats.forward_passes == 1


def test_awkward_labels_packed_equal_brute_force(engine):
    backend = engine.backend
    tv = TokenizerView(backend.tokenizer)
    schema = compile_schema(AWKWARD)
    fields = [f for f in schema.fields if len(f.labels) > 1]
    prompt = ChatPrompt.build(tv, schema)
    ids = prompt.request_ids(tv, TEXT)
    wave = compile_wave(tv, fields, boundary_text=prompt.boundary_text, tail_text=prompt.tail_text)
    causal_end = len(ids) - len(wave.tail_ids) + wave.causal_len
    state = backend.start(backend.prefill(prompt.preamble_ids))
    logprobs = np.zeros(len(wave.tree))
    batch = plan_passes(wave.tree, max_nodes=10_000)[0]
    logprobs[list(batch.query_nodes)] = backend.score_tree(
        state, causal=ids[len(prompt.preamble_ids) : causal_end], batch=batch
    )
    check_against_brute_force(backend, wave, ids[:causal_end], logprobs)


def test_head_cache_is_bounded_and_reused(smol_tokenizer, engine):
    small = Engine(engine.backend, prompt_cache_size=1)
    other = {"x": {"type": "boolean"}}
    first = small.extract(TEXT, Ticket)
    again = small.extract(TEXT, Ticket)
    assert first.stats.prefill_passes == 1 and first.stats.correction_passes >= 1  # the head; its content-free lean
    # neither the preamble prefill nor the lean's reading is repeated
    assert first.stats.forward_passes == again.stats.forward_passes + 1 + first.stats.correction_passes
    assert again.stats.prefill_passes == again.stats.correction_passes == 0
    small.extract(TEXT, other)
    evicted = small.extract(TEXT, Ticket)
    assert evicted.stats.prefill_passes == 1 and evicted.stats.correction_passes == 0  # the lean is kept apart
    assert evicted.stats.forward_passes == again.stats.forward_passes + 1
    assert again.values == first.values


# ------------------------------------------------------------------------------------------ chat templates


@pytest.mark.slow
@pytest.mark.parametrize("name", ["qwen3", "llama3", "gemma3"])
def test_real_chat_templates(name):
    tokenizer = template_tokenizer(name)
    arch = {"qwen3": "qwen3", "llama3": "llama", "gemma3": "gemma3"}[name]
    backend = TorchBackend(tiny_model(arch, len(tokenizer)), tokenizer)
    engine = Engine(backend, anchor=False)
    out = engine.extract(TEXT, Ticket)
    # preamble prefill + one pass; the content-free lean (three texts) was read in one batched pass before it
    assert out.stats.forward_passes - out.stats.correction_passes == 2 and out.stats.correction_passes == 1
    tv = TokenizerView(tokenizer)
    schema = compile_schema(Ticket)
    prompt = ChatPrompt.build(tv, schema)
    text = tv.decode(prompt.request_ids(tv, TEXT))
    assert "wants_refund" in text and TEXT in text
    if name == "qwen3":
        assert "<think>\n\n</think>" in prompt.suffix_text  # thinking is switched off
    ids = prompt.request_ids(tv, TEXT)
    wave = compile_wave(tv, schema.fields, boundary_text=prompt.boundary_text, tail_text=prompt.tail_text)
    causal_end = len(ids) - len(wave.tail_ids) + wave.causal_len
    state = backend.start(backend.prefill(prompt.preamble_ids))
    batch = plan_passes(wave.tree, max_nodes=10_000)[0]
    logprobs = np.zeros(len(wave.tree))
    logprobs[list(batch.query_nodes)] = backend.score_tree(
        state, causal=ids[len(prompt.preamble_ids) : causal_end], batch=batch
    )
    check_against_brute_force(backend, wave, ids[:causal_end], logprobs)


NO_SYSTEM = (
    "{{ bos_token }}{% for m in messages %}{% if m['role'] == 'system' %}"
    "{{ raise_exception('System role not supported') }}{% endif %}"
    "<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def test_template_without_system_role(smol_tokenizer, engine):
    tokenizer = copy.deepcopy(smol_tokenizer)
    tokenizer.chat_template = NO_SYSTEM
    folded = Engine(TorchBackend(engine.backend.model, tokenizer))
    out = folded.extract(TEXT, Ticket)
    assert any("no system role" in w for w in out.warnings)
    prompt = ChatPrompt.build(TokenizerView(tokenizer), compile_schema(Ticket))
    assert prompt.system_folded and "wants_refund" in prompt.prefix_text
    assert len(prompt.preamble_ids) > 20  # the instructions are still cached


class Mixed(BaseModel):
    """Closed fields scored in one pass, three open fields generated in parallel rows."""

    mood: Mood
    urgent: bool
    summary: str = Field(json_schema_extra={"x-max-tokens": 7})
    code: str = Field(json_schema_extra={"x-max-tokens": 2})
    count: int = Field(json_schema_extra={"x-max-tokens": 4})


def test_open_rows_take_the_longest_rows_steps_not_the_sum(engine):
    """Counted by the backend: three open rows take max(len) forward passes, not the sum."""
    engine.extract(TEXT, Mixed)  # warm the preamble cache
    before = engine.backend.forward_passes
    out = engine.extract(TEXT, Mixed)
    lengths = [out.fields[name].tokens for name in ("summary", "code", "count")]
    assert out.stats.generation_passes == max(lengths) < sum(lengths)
    assert out.stats.generated_tokens == sum(lengths)
    assert engine.backend.forward_passes - before == out.stats.forward_passes == 2 + max(lengths)
    assert [out.fields[n].source for n in ("mood", "urgent", "summary")] == ["scored", "scored", "generated"]
    assert out.fields["summary"].wave == out.stats.waves == 2
    model = out.model  # every value is valid: cut strings are closed where they were cut
    assert isinstance(model, Mixed)
    code = out.fields["code"]
    assert code.tokens <= 2
    if code.truncated:
        assert any("'code': the value reached its limit of 2 tokens" in w for w in out.warnings)
        assert code in out.low_confidence()
    data = out.to_json()["fields"]["summary"]
    assert data["source"] == "generated" and data["probability"] is None and "mean_logprob" in data


def test_open_field_token_limit_option(engine):
    with pytest.raises(OptionError, match="max_tokens: expected an integer >= 1, but got 0"):
        Engine(engine.backend, max_tokens=0)
    out = Engine(engine.backend, max_tokens=3).extract(TEXT, {"properties": {"note": {"type": "string"}}})
    assert out.fields["note"].tokens <= 3 and isinstance(out.values["note"], str)
    assert out.stats.waves == 0  # no closed field: the document rides in the first row step


def test_cut_values_are_closed_or_the_smallest_valid_and_flagged(engine):
    """A string cut at its token limit is closed where it was cut; an object that cannot be completed validly
    is the smallest value its schema accepts (issue 45: never an invalid None); both are flagged and warned about."""
    who = {
        "type": "object",
        "properties": {"name": {"type": "string"}, "vip": {"type": "boolean"}},
        "required": ["name", "vip"],
        "x-max-tokens": 4,
    }
    schema = {"properties": {"who": who, "note": {"type": "string", "x-max-tokens": 1}}}
    out = engine.extract(TEXT, schema)
    note, person = out.fields["note"], out.fields["who"]
    assert note.truncated and isinstance(note.value, str) and out.schema.field("note").allows(note.value)
    assert person.truncated and person.tokens <= 4 and out.schema.field("who").allows(person.value)
    assert person.value in ({"name": "", "vip": False}, {"name": person.value["name"], "vip": False})
    said = "tokens; it could not be completed and is the smallest value"
    assert any("'who'" in w and said in w for w in out.warnings)
    assert any("'note'" in w and "tokens; it was closed where it was cut." in w for w in out.warnings)
    assert {f.name for f in out.low_confidence()} == {"note", "who"}


def test_generated_values_honour_their_json_schema(engine):
    """Whatever a random model wants, the grammar holds: patterns, bounds, enums inside objects, list items."""

    class Constrained(BaseModel):
        code: str = Field(pattern=r"^[A-Z]{3}-[0-9]{2}$")
        score: float = Field(ge=0, le=1)
        year: int = Field(ge=1900, le=2100)
        items: list[Annotated[str, Field(max_length=5)]] = Field(max_length=2)

    out = engine.extract(TEXT, Constrained, max_tokens=24)
    for name in ("code", "score", "year", "items"):
        field = out.fields[name]
        assert field.value is not None and out.schema.field(name).allows(field.value), (name, field)
    assert re.fullmatch(r"[A-Z]{3}-[0-9]{2}", out.values["code"])
    assert isinstance(out.model, Constrained)
