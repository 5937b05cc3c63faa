"""One options object from every surface to the engine: :class:`~pcd_engine.ExtractOptions`.

For each surface (the command line, ``/api/extract``, ``/v1/chat/completions``, ``ChatPCD``, ``PCDLLM``,
``PCDPydanticProgram``, ``PCDMetadataExtractor``) a non-default anchor, temperature and custom instruction reach
the engine, and an unknown option is refused. The prompt-format switches change the prompt the model sees and
the answers still equal brute force.
"""

from __future__ import annotations

import json
from typing import Any, Literal

import pytest
from pydantic import BaseModel

from pcd_engine import Engine, ExtractOptions, OptionError, PromptFormat, compile_schema
from pcd_engine.decide.compiler import written_value
from pcd_engine.prompt.chat_prompt import ChatPrompt, TokenizerView, field_line
from tests.decide.test_decoding_oracle import PRESET, TEXT
from tests.support import OracleBackend, OracleLM, enumerate_paths
from tests.support import oracle_brute_force as brute_force

CHOSEN = {"anchor": False, "temperature": 2.0, "instructions": "Label the ticket; be literal."}


class Ticket(BaseModel):
    urgency: Literal["low", "high"]
    refund: bool


class Spy(Engine):
    """An oracle engine that records the options every call resolves to."""

    def __init__(self, backend: Any, **options: Any) -> None:
        super().__init__(backend, **options)
        self.seen: list[ExtractOptions] = []

    def resolve(self, options=None, **knobs):  # every call (extract, extract_many, ...) resolves its options here
        resolved = super().resolve(options, **knobs)
        self.seen.append(resolved)
        return resolved


@pytest.fixture()
def spy(smol_tokenizer) -> Spy:
    return Spy(OracleBackend(smol_tokenizer, OracleLM(len(smol_tokenizer))))


def reached(spy: Spy) -> None:
    assert spy.seen, "the engine was not called"
    last = spy.seen[-1]
    assert (last.anchor, last.temperature, last.instructions) == (False, 2.0, CHOSEN["instructions"])


# ---------------------------------------------------------------------------------------------- the object


def test_unknown_names_are_refused_with_the_nearest_one():
    with pytest.raises(OptionError, match="unknown option 'anchr'. Did you mean 'anchor'"):
        ExtractOptions.parse({"anchr": False})
    with pytest.raises(OptionError, match="temperature: expected a number > 0"):
        ExtractOptions(temperature=0)
    with pytest.raises(OptionError, match="list_choices: expected true or false"):
        ExtractOptions(list_choices="no")
    with pytest.raises(OptionError, match="chat_template_kwargs"):
        ExtractOptions(chat_template_kwargs=["x"])


@pytest.mark.parametrize(
    ("name", "means"), [("auto", None), ("first_token", "marginal"), ("trie", "trie_walk"), ("greedy", "trie_walk")]
)
def test_the_first_pcds_strategy_names_are_aliases(name, means):
    assert ExtractOptions(strategy=name).strategy == means


def test_hybrid_and_typos_are_refused_with_the_nearest_real_name():
    with pytest.raises(OptionError, match="'hybrid'.*nearest is 'auto'"):
        ExtractOptions(strategy="hybrid")
    with pytest.raises(OptionError, match="Did you mean 'marginal'"):
        ExtractOptions(strategy="marginl")


def test_call_options_override_the_engines_field_by_field(spy):
    engine = Spy(spy.backend, temperature=0.5, prompt=PromptFormat(list_choices=False), anchor=False)
    resolved = engine.resolve({"temperature": 3.0, "anchor": True}, anchor=False)
    assert (resolved.temperature, resolved.anchor, resolved.list_choices) == (3.0, False, False)
    assert resolved.max_tokens == engine.options.max_tokens and resolved.limits == engine.options.limits
    with pytest.raises(OptionError, match="extract: unknown option 'temprature'"):
        engine.extract(TEXT, PRESET, temprature=2.0)
    assert spy.backend.forward_passes == 0


# ---------------------------------------------------------------------------------------------- the prompt


FORMATS = {
    "instructions": {"instructions": "Decide every key from the ticket; answer in JSON."},
    "no_choices": {"list_choices": False},
    "quoted": {"quoted_booleans": True},
    "template": {"chat_template_kwargs": {"enable_thinking": True}},
}


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_prompt_format_changes_the_prompt_and_equals_brute_force(smol_tokenizer, name):
    lm = OracleLM(len(smol_tokenizer))
    engine = Engine(OracleBackend(smol_tokenizer, lm), correction="none")  # against the raw brute force
    fmt = FORMATS[name]
    if name != "template":  # SmolLM2's template ignores enable_thinking; the others change the text
        assert engine.prompt_for(TEXT, PRESET, fmt) != engine.prompt_for(TEXT, PRESET)
    out = engine.extract(TEXT, PRESET, fmt, strategy="exact")
    schema = compile_schema(PRESET)
    options = ExtractOptions.parse(fmt)
    prompt = ChatPrompt.build(TokenizerView(smol_tokenizer), schema, options.prompt_format)
    first = schema.fields[0]
    quoted = bool(options.quoted_booleans)
    anchor_line = field_line(first.name, written_value(first, out.values[first.name], quoted_booleans=quoted))
    context = prompt.prefix_text + TEXT + prompt.suffix_text + anchor_line
    for spec in schema.fields[1:]:
        if len(spec.labels) < 2:
            continue
        winner, probs, _ = brute_force(lm, enumerate_paths(smol_tokenizer, context, spec), "exact")
        assert out.values[spec.name] == spec.labels[winner].value, spec.name
        assert out.fields[spec.name].probability == pytest.approx(probs[winner], abs=1e-9)


def test_quoted_booleans_and_hidden_choices_read_as_asked(smol_tokenizer):
    tv = TokenizerView(smol_tokenizer)
    schema = compile_schema(PRESET)
    quoted = ChatPrompt.build(tv, schema, PromptFormat(quoted_booleans=True)).prefix_text
    assert '"urgent": "true" or "false"' in quoted
    hidden = ChatPrompt.build(tv, schema, PromptFormat(list_choices=False)).prefix_text
    assert "ITEM_7" not in hidden and '"catalogue": one of its allowed values' in hidden


# ---------------------------------------------------------------------------------------------- every surface


def test_cli(spy, monkeypatch, capsys, tmp_path):
    import pcd_engine.tools.cli as cli
    from pcd_engine.tools.cli import common

    monkeypatch.setattr(common, "load_engine", lambda args: spy)
    schema = tmp_path / "s.json"
    schema.write_text(json.dumps(PRESET))
    argv = ["run", "m", "--schema", str(schema), "--text", TEXT, "-q", "--no-anchor", "--temperature", "2.0"]
    assert cli.main([*argv, "--instructions", CHOSEN["instructions"]]) == 0
    reached(spy)
    with pytest.raises(SystemExit) as exc:
        cli.main([*argv, "--tempreature", "2"])
    assert exc.value.code == 2 and "--tempreature" in capsys.readouterr().err


@pytest.fixture()
def client(spy):
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from pcd_engine.tools.serve import create_app

    return TestClient(create_app(spy, model_name="m"), base_url="http://localhost")


def test_api_extract(client, spy):
    response = client.post("/api/extract", json={"schema": PRESET, "context": TEXT, "options": CHOSEN})
    assert response.status_code == 200, response.text
    reached(spy)
    bad = client.post("/api/extract", json={"schema": PRESET, "context": TEXT, "options": {"anchr": False}})
    assert bad.status_code == 400 and "'anchr'" in bad.json()["error"]["message"]
    server_side = client.post("/api/extract", json={"schema": PRESET, "context": TEXT, "options": {"limits": {}}})
    assert server_side.status_code == 400 and "set by the server" in server_side.json()["error"]["message"]


def test_openai_chat_completions(client, spy):
    schema = Ticket.model_json_schema()
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": TEXT}],
        "response_format": {"type": "json_schema", "json_schema": {"name": "t", "schema": schema}},
        "temperature": 2.0,
        "pcd": {"anchor": False, "instructions": CHOSEN["instructions"]},
    }
    response = client.post("/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text
    reached(spy)
    bad = client.post("/v1/chat/completions", json={**body, "pcd": {"anchr": False}})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "pcd"


def test_langchain_chat_model(spy):
    pytest.importorskip("langchain_core")
    from pcd_integrations.langchain import ChatPCD

    chat = ChatPCD(engine=spy, options={"anchor": False, "instructions": CHOSEN["instructions"]})
    answer = chat.with_structured_output(Ticket, temperature=2.0).invoke(TEXT)
    assert isinstance(answer, Ticket)
    reached(spy)
    with pytest.raises(OptionError, match="'anchr'"):
        ChatPCD(engine=spy, options={"anchr": False})
    with pytest.raises(OptionError, match="with_structured_output: unknown option 'temprature'"):
        chat.with_structured_output(Ticket, temprature=2.0)


def test_llamaindex_llm_program_and_extractor(spy):
    pytest.importorskip("llama_index.core")
    from llama_index.core.prompts import PromptTemplate
    from llama_index.core.schema import TextNode

    from pcd_integrations.llamaindex import PCDLLM, PCDMetadataExtractor, PCDPydanticProgram

    llm = PCDLLM(engine=spy, options=CHOSEN)
    assert isinstance(llm.structured_predict(Ticket, PromptTemplate("{text}"), text=TEXT), Ticket)
    reached(spy)
    spy.seen.clear()
    program = PCDPydanticProgram.from_defaults(Ticket, "{text}", engine=spy, **CHOSEN)
    assert isinstance(program(text=TEXT), Ticket)
    reached(spy)
    spy.seen.clear()
    extractor = PCDMetadataExtractor(Ticket, engine=spy, options=CHOSEN)
    assert extractor.extract_batches([TextNode(text=TEXT)])[0]["urgency"] in ("low", "high")
    reached(spy)
    with pytest.raises(OptionError, match="'anchr'"):
        PCDLLM(engine=spy, options={"anchr": False})
    with pytest.raises(OptionError, match="'anchr'"):
        PCDPydanticProgram.from_defaults(Ticket, "{text}", engine=spy, anchr=False)
    with pytest.raises(OptionError, match="'anchr'"):
        PCDMetadataExtractor(Ticket, engine=spy, options={"anchr": False})


def test_the_token_limit_fallback_is_worked_out_in_one_place():
    """A field's own limit wins over the call's (FieldSpec.token_limit), a call's limit per value is
    ExtractOptions.value_tokens; no other module works either fallback out with ``max_tokens or ...``."""
    import re
    from pathlib import Path

    schema = compile_schema({"a": {"type": "string", "max_tokens": 3}, "b": {"type": "string"}})
    assert schema.field("a").token_limit(64) == 3 and schema.field("b").token_limit(64) == 64
    assert ExtractOptions(max_tokens=9).value_tokens == 9 and ExtractOptions().value_tokens == 1
    root = Path(__file__).resolve().parent.parent
    owners = {root / "pcd_engine" / "schema" / "fields.py", root / "pcd_engine" / "options" / "extract.py"}
    found = [
        f"{path.relative_to(root)}:{n}: {line.strip()}"
        for path in sorted([*(root / "pcd_engine").rglob("*.py"), *(root / "pcd_integrations").rglob("*.py")])
        if path not in owners
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if re.search(r"max_tokens\)? or\b", line)
    ]
    assert found == []
