"""LangChain adapter: ChatPCD on the embedded SmolLM2, plus langchain-tests' standard unit suite."""

from __future__ import annotations

import asyncio
import json
from enum import Enum
from typing import Any, Literal

import pytest
from pydantic import BaseModel, Field
from typing_extensions import TypedDict

pytest.importorskip("langchain_core", reason="pip install 'pcd-llm[langchain]'")

from langchain_core.callbacks import BaseCallbackHandler  # noqa: E402
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage  # noqa: E402
from langchain_core.prompts import ChatPromptTemplate  # noqa: E402
from langchain_tests.integration_tests import ChatModelIntegrationTests  # noqa: E402
from langchain_tests.unit_tests import ChatModelUnitTests  # noqa: E402

from pcd_engine import SchemaError  # noqa: E402
from pcd_integrations.langchain import ChatPCD  # noqa: E402
from tests.support import seen_options  # noqa: E402

TICKET = "I was charged twice for order 5521. Refund the second charge today or I will dispute it with my bank."


class Urgency(str, Enum):
    LOW = "low"
    HIGH = "high"


class Ticket(BaseModel):
    """A support ticket."""

    urgency: Urgency
    wants_refund: bool = Field(description="Whether the customer asks for money back")
    topic: Literal["billing", "shipping", "account"]


class TicketDict(TypedDict):
    wants_refund: bool
    topic: Literal["billing", "shipping", "account"]


JSON_SCHEMA = {
    "title": "Ticket",
    "type": "object",
    "properties": {"wants_refund": {"type": "boolean"}, "topic": {"enum": ["billing", "shipping", "account"]}},
    "required": ["wants_refund", "topic"],
}
TOOL = {"type": "function", "function": {"name": "Ticket", "description": "A ticket", "parameters": JSON_SCHEMA}}


class PCDCapabilities:
    """What ChatPCD declares to langchain-tests, honestly: structured output and tool calling (scored decisions)."""

    @property
    def chat_model_class(self) -> type[ChatPCD]:
        return ChatPCD

    @property
    def chat_model_params(self) -> dict:
        return {"model": "smollm2-135m"}

    @property
    def has_tool_calling(self) -> bool:
        return True

    @property
    def tool_choice_value(self) -> str | None:
        return "any"  # pcd forces a call when asked; with "auto" a 135M model may rightly answer instead

    @property
    def has_structured_output(self) -> bool:
        return True

    @property
    def returns_usage_metadata(self) -> bool:
        return True


class TestChatPCDStandardUnit(PCDCapabilities, ChatModelUnitTests):
    @pytest.mark.xfail(
        strict=True,
        reason="langchain-core's load(allowed_objects='all') admits only the classes of its own mapping, so no "
        "third-party chat model can pass; ChatPCD round-trips with allowed_objects=[ChatPCD] "
        "(test_dumps_and_loads_round_trip)",
    )
    def test_serdes(self, model, snapshot):
        super().test_serdes(model, snapshot)


@pytest.fixture(scope="module")
def llm(default_engine):
    return ChatPCD(engine=default_engine)


@pytest.fixture
def counted(llm, monkeypatch):
    """Counts engine calls (one per extract_many, however many texts it is given)."""
    engine = llm.get_engine()
    calls: list[int] = []
    original = engine.extract_many

    def counting(texts, schema, **kwargs):
        calls.append(len(list(texts)) if not isinstance(texts, list) else len(texts))
        return original(texts, schema, **kwargs)

    monkeypatch.setattr(engine, "extract_many", counting)
    return calls


@pytest.mark.real_model
def test_free_text_invoke_and_stream(llm):
    reply = llm.invoke([SystemMessage("Answer briefly."), HumanMessage("Name a colour.")], max_tokens=12)
    assert isinstance(reply, AIMessage) and reply.content
    assert reply.usage_metadata["output_tokens"] <= 12
    assert reply.response_metadata["finish_reason"] in ("stop", "length")
    chunks = list(llm.stream("Count from one to ten in words, separated by commas.", max_tokens=40))
    assert chunks[-1].chunk_position == "last" and chunks[-1].usage_metadata["total_tokens"] > 0
    assert sum(1 for c in chunks if c.content) > 3
    text = "".join(c.content for c in chunks)
    assert text == llm.invoke("Count from one to ten in words, separated by commas.", max_tokens=40).content


@pytest.mark.real_model
def test_stop_sequences_cut_the_text(llm):
    question = "Count from one to ten in words, separated by commas."
    full = llm.invoke(question, max_tokens=40).content
    assert len(full) > 12
    stop = full[6:9]  # a stop sequence that the greedy reply is known to contain
    cut = llm.invoke(question, max_tokens=40, stop=["never-in-the-text", stop])
    assert cut.content == full[: full.find(stop)]
    assert cut.response_metadata["finish_reason"] == "stop"
    streamed = "".join(c.content for c in llm.stream(question, max_tokens=40, stop=[stop]))
    assert streamed == cut.content


@pytest.mark.real_model
@pytest.mark.parametrize(
    "schema", [Ticket, TicketDict, JSON_SCHEMA, TOOL], ids=["pydantic", "typeddict", "json-schema", "tool"]
)
def test_structured_output_kinds(llm, schema):
    out = llm.with_structured_output(schema).invoke(TICKET)
    if schema is Ticket:
        assert isinstance(out, Ticket)
        assert set(out.model_dump()) == {"urgency", "wants_refund", "topic"}
    else:
        assert isinstance(out, dict) and set(out) == {"wants_refund", "topic"}
        assert isinstance(out["wants_refund"], bool) and out["topic"] in ("billing", "shipping", "account")


@pytest.mark.real_model
def test_raw_message_carries_probabilities(llm):
    out = llm.with_structured_output(Ticket, include_raw=True).invoke(TICKET)
    assert out["parsing_error"] is None and isinstance(out["parsed"], Ticket)
    meta = out["raw"].response_metadata["pcd"]["fields"]
    assert set(meta) == {"urgency", "wants_refund", "topic"}
    for field in meta.values():
        assert 0.0 < field["probability"] <= 1.0
        assert field["alternatives"][0][1] == field["probability"]
    assert json.loads(out["raw"].content) == json.loads(out["parsed"].model_dump_json())


@pytest.mark.real_model
def test_unsupported_field_fails_when_invoked_not_when_built(llm):
    class Summary(BaseModel):
        extra: dict[str, Any]

    runnable = llm.with_structured_output(Summary)  # building it is fine
    with pytest.raises(SchemaError, match=r"Field 'extra': expected an object with known keys"):
        runnable.invoke(TICKET)
    raw = llm.with_structured_output(Summary, include_raw=True).invoke(TICKET)
    assert raw["parsed"] is None and isinstance(raw["parsing_error"], SchemaError)


def test_bad_arguments_are_value_errors():
    llm = ChatPCD()
    with pytest.raises(ValueError, match="temperature: expected a number > 0"):  # an OptionError
        llm.with_structured_output(Ticket, temperature=0)
    with pytest.raises(ValueError, match="unknown option 'beam'"):
        llm.with_structured_output(Ticket, beam=3)
    with pytest.raises(ValueError, match="expected method in"):
        llm.with_structured_output(Ticket, method="xml")
    with pytest.raises(ValueError, match="Schema: expected a Pydantic model class, a TypedDict"):
        llm.with_structured_output(42)  # type: ignore[arg-type]
    assert llm.engine is None  # nothing was loaded


@pytest.mark.real_model
def test_batch_is_one_engine_call(llm, counted):
    texts = [TICKET, "Where is my parcel? It is a week late.", "I cannot log in to my account."] * 5 + [TICKET]
    seen: list[dict] = []

    class Options(BaseCallbackHandler):
        def on_chat_model_start(self, serialized, messages, **kwargs):
            seen.append(kwargs.get("options") or {})

    runnable = llm.with_structured_output(Ticket)
    outs = runnable.batch(texts, config={"callbacks": [Options()]})
    assert counted == [16]
    raw = llm.with_structured_output(Ticket, include_raw=True).batch(texts[:4])
    assert all(max(r["raw"].response_metadata["pcd"]["documents_per_pass"]) > 1 for r in raw)  # shared passes
    assert len(outs) == 16 and all(isinstance(o, Ticket) for o in outs)
    assert outs[0] == outs[-1]  # the same text, the same answer within the batch (16: corrected by its own lean)
    assert len(seen) == 16
    assert seen[0]["ls_structured_output_format"]["kwargs"]["method"] == "json_schema"
    assert seen[0]["ls_structured_output_format"]["schema"]["title"] == "Ticket"
    counted.clear()
    few = asyncio.run(runnable.abatch(texts[:4]))  # under 16: each decided as a single call is (content-free lean)
    assert counted == [4]
    assert few == [runnable.invoke(t) for t in texts[:4]]


@pytest.mark.real_model
def test_async_and_streaming_give_the_final_object(llm):
    runnable = llm.with_structured_output(Ticket)
    expected = runnable.invoke(TICKET)
    assert asyncio.run(runnable.ainvoke(TICKET)) == expected
    assert list(runnable.stream(TICKET)) == [expected]

    async def collect():
        return [x async for x in runnable.astream(TICKET)]

    assert asyncio.run(collect()) == [expected]


@pytest.mark.real_model
def test_lcel_chain_routes_tickets(llm):
    prompt = ChatPromptTemplate.from_messages([("system", "Triage the support ticket."), ("human", "{ticket}")])
    chain = prompt | llm.with_structured_output(Ticket)
    routes = {"billing": "finance-queue", "shipping": "logistics-queue", "account": "identity-queue"}
    routed = (chain | (lambda t: routes[t.topic])).invoke({"ticket": TICKET})
    assert routed in routes.values()


class Route(BaseModel):
    """Where a support ticket goes."""

    team: Literal["billing", "shipping", "account"]
    urgent: bool


@pytest.mark.real_model
@pytest.mark.parametrize("strategy", ["auto", "provider", "tool"])
def test_create_agent_router(llm, strategy):
    """A tool-less router agent: classify, then route, through each structured-output strategy."""
    from langchain.agents import create_agent
    from langchain.agents.structured_output import ProviderStrategy, ToolStrategy

    fmt = {"auto": Route, "provider": ProviderStrategy(Route), "tool": ToolStrategy(Route)}[strategy]
    agent = create_agent(llm, tools=[], response_format=fmt)
    out = agent.invoke({"messages": [{"role": "user", "content": TICKET}]})
    route = out["structured_response"]
    assert isinstance(route, Route)
    assert route == llm.with_structured_output(Route).invoke(TICKET)
    kinds = [type(m).__name__ for m in out["messages"]]
    assert kinds == (
        ["HumanMessage", "AIMessage", "ToolMessage"] if strategy == "tool" else ["HumanMessage", "AIMessage"]
    )


@pytest.mark.real_model
def test_every_name_of_the_default_model_shares_one_engine(default_engine, monkeypatch):
    """Issue 36: ``ChatPCD()``, ``ChatPCD(model="smollm2-135m")``, ``PCDLLM()`` and the tests' own fixture hold one
    engine per process: the registry keys engines by what they load, not by the name given, so no name loads the
    model a second time."""
    from pcd_engine.backends.torch import TorchBackend
    from pcd_engine.models.resolve import default_model_path
    from pcd_integrations.llamaindex import PCDLLM

    loads: list[str] = []
    load = TorchBackend.load

    def counting(path, **kwargs):
        loads.append(path)
        return load(path, **kwargs)

    monkeypatch.setattr(TorchBackend, "load", counting)
    engines = [
        ChatPCD().get_engine(),
        ChatPCD(model="smollm2-135m").get_engine(),
        ChatPCD(model="smollm2-135m", backend="torch").get_engine(),
        ChatPCD(model=str(default_model_path())).get_engine(),
        PCDLLM().get_engine(),
        PCDLLM(model="smollm2-135m").get_engine(),
    ]
    assert loads == []
    assert all(engine is default_engine for engine in engines)


def test_bind_tools_takes_every_choice_and_loads_nothing():
    """Issue 17: binding tools without a forced choice is a decision now (it used to be refused)."""
    llm = ChatPCD()

    def lookup(order: str) -> str:
        """Look an order up."""
        return order

    for choice in (None, "auto", "any", "required", True, "none", False, "lookup", {"function": {"name": "Route"}}):
        llm.bind_tools([lookup, Route], tool_choice=choice)
    llm.bind_tools([lookup, Route], parallel_tool_calls=True)
    with pytest.raises(
        ValueError, match=r"tool_choice: expected 'auto', 'required', 'none' or one of \['lookup', 'Route'\]"
    ):
        llm.bind_tools([lookup, Route], tool_choice="search")
    assert llm.profile["structured_output"] is True and llm.profile["tool_calling"] is True
    assert llm.engine is None


@pytest.mark.real_model
def test_forced_tool_call_fills_the_arguments(llm):
    reply = llm.bind_tools([Route], tool_choice="Route").invoke(TICKET)
    assert reply.content == "" and len(reply.tool_calls) == 1
    call = reply.tool_calls[0]
    assert call["name"] == "Route" and Route(**call["args"]) == llm.with_structured_output(Route).invoke(TICKET)


@pytest.mark.real_model
class TestChatPCDStandardIntegration(PCDCapabilities, ChatModelIntegrationTests):
    """langchain-tests' integration suite on the embedded SmolLM2."""

    @property
    def chat_model_params(self) -> dict:
        # Short free-text replies keep CI time sane: the suite checks what a reply is, not how long (24 tokens took
        # this class 171 s, 10 take 108 s).
        return {"model": "smollm2-135m", "max_tokens": 10}

    @property
    def structured_output_kwargs(self) -> dict:
        return {"method": "json_schema"}

    @property
    def supports_json_mode(self) -> bool:
        return True  # with_structured_output(method="json_mode") is answered by the engine like any method

    @property
    def supports_model_override(self) -> bool:
        return True

    @property
    def model_override_value(self) -> str:
        from pcd_engine.models.resolve import default_model_path

        return str(default_model_path())  # the same weights named by folder: a second engine, loaded by name

    @pytest.mark.xfail(
        strict=False,
        reason="the embedded 135M model, its tool-choice lean divided out as for any closed field (issue 48), "
        "answers 'What is the weather in San Francisco, CA?' with one undescribed get_weather tool instead of "
        "calling it (answer 0.76); langchain-tests' own advice for a model that does not call tools consistently. "
        "The agent loops that matter end: tests/integrations/test_agents.py",
    )
    def test_agent_loop(self, model) -> None:
        super().test_agent_loop(model)


@pytest.mark.real_model
def test_pydantic_v1_schema(llm):
    from pydantic.v1 import BaseModel as V1Model

    class TicketV1(V1Model):
        wants_refund: bool
        topic: Literal["billing", "shipping", "account"]

    out = llm.with_structured_output(TicketV1).invoke(TICKET)
    assert isinstance(out, TicketV1) and out.topic in ("billing", "shipping", "account")
    assert out.dict() == llm.with_structured_output(TicketDict).invoke(TICKET)


@pytest.mark.real_model
def test_mixed_schema_scores_closed_fields_and_generates_open_ones(llm):
    class Customer(BaseModel):
        name: str = Field(max_length=20)
        vip: bool

    class Triage(BaseModel):
        topic: Literal["billing", "shipping"]
        tags: list[Literal["refund", "duplicate", "angry"]]
        summary: str = Field(description="One short sentence")
        customer: Customer

    out = llm.with_structured_output(Triage, include_raw=True).invoke(TICKET)
    assert isinstance(out["parsed"], Triage) and out["parsing_error"] is None
    fields = out["raw"].response_metadata["pcd"]["fields"]
    assert fields["topic"]["source"] == "scored" and fields["summary"]["source"] == "generated"
    assert fields["summary"]["probability"] is None and fields["summary"]["tokens"] > 0
    assert out["raw"].usage_metadata["output_tokens"] > 0


class Thread(BaseModel):
    text: str
    replies: list[Thread]


@pytest.mark.real_model
def test_recursive_model_is_a_typed_error_naming_it(llm):
    class Post(BaseModel):
        thread: Thread
        topic: Literal["billing", "shipping"]

    with pytest.raises(SchemaError, match="Field 'thread': expected a non-recursive schema"):
        llm.with_structured_output(Post).invoke(TICKET)


def test_model_name_is_honoured_as_the_model():
    assert ChatPCD(model_name="qwen2.5-1.5b").model == "qwen2.5-1.5b"
    assert ChatPCD(model="smollm2-135m", model_name="smollm2-135m").model_name == "smollm2-135m"
    with pytest.raises(ValueError, match="name different models"):
        ChatPCD(model="smollm2-135m", model_name="qwen2.5-1.5b")


def test_token_counts_use_the_models_own_tokenizer(smol_tokenizer):
    from pcd_engine import Engine
    from pcd_engine.backends.torch import TorchBackend
    from tests.support import tiny_model

    engine = Engine(TorchBackend(tiny_model("llama", len(smol_tokenizer)), smol_tokenizer))
    llm = ChatPCD(engine=engine)
    text = "Refund the second charge today, please."
    ids = smol_tokenizer(text, add_special_tokens=False)["input_ids"]
    assert llm.get_token_ids(text) == ids
    assert llm.get_num_tokens(text) == len(ids) > 0
    assert ChatPCD(engine=engine, custom_get_token_ids=lambda t: [1, 2]).get_num_tokens(text) == 2


def test_importing_an_adapter_without_its_extra_names_the_extra():
    import subprocess
    import sys

    for module, package, extra in [
        ("pcd_integrations.langchain", "langchain_core", "pcd-llm[langchain]"),
        ("pcd_integrations.llamaindex", "llama_index.core", "pcd-llm[llamaindex]"),
    ]:
        code = f"import sys; sys.modules[{package!r}] = None; import {module}"
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
        assert out.returncode != 0
        last = out.stderr.strip().splitlines()[-1]
        assert "BackendUnavailableError" in last and extra in last and package.split(".")[0] in last, last


def test_the_adapters_ship_type_information():
    from pathlib import Path

    import pcd_integrations

    assert (Path(pcd_integrations.__file__).parent / "py.typed").exists()


def test_temperature_reaches_structured_output_and_is_refused_for_free_text(tiny_engine, monkeypatch):
    seen = seen_options(tiny_engine, monkeypatch)
    llm = ChatPCD(engine=tiny_engine, temperature=2.0)
    llm.with_structured_output(Ticket).invoke(TICKET)
    assert seen[-1].temperature == 2.0
    ChatPCD(engine=tiny_engine, temperature=0).with_structured_output(Ticket).invoke(TICKET)
    assert seen[-1].temperature == 1.0  # 0 is greedy: the engine's default probabilities
    with pytest.raises(ValueError, match="greedily"):
        llm.invoke("Hello")
    assert (
        ChatPCD(engine=tiny_engine, temperature=2.0, options={"temperature": 0.5})._setting_options().temperature == 2.0
    )
    ChatPCD(engine=tiny_engine, temperature=2.0, options={"temperature": 0.5}).with_structured_output(Ticket).invoke(
        TICKET
    )
    assert seen[-1].temperature == 0.5  # the model's options win over the generic setting


def test_timeout_bounds_structured_calls_and_free_text(tiny_engine, monkeypatch):
    from pcd_engine import RequestTimeout

    seen = seen_options(tiny_engine, monkeypatch)
    ChatPCD(engine=tiny_engine, timeout=30).with_structured_output(Ticket).invoke(TICKET)
    assert seen[-1].limits.time_limit_s == 30
    llm = ChatPCD(engine=tiny_engine, timeout=1e-9, max_tokens=8)
    with pytest.raises(RequestTimeout, match="time limit of 1e-09 s"):
        llm.invoke("Hello")
    with pytest.raises(ValueError, match="timeout") as caught:
        ChatPCD(engine=tiny_engine, timeout=0)
    assert type(caught.value).__name__ == "OptionError"  # pcd's own error, not pydantic's wrapper (issue 45)
    with pytest.raises(ValueError, match="temperature=0.7 asks for sampled free text"):  # a call's own, not dropped
        ChatPCD(engine=tiny_engine, max_tokens=4).invoke("Hello", temperature=0.7)


def test_an_explicit_max_tokens_bounds_open_fields_of_structured_output(tiny_engine, monkeypatch):
    seen = seen_options(tiny_engine, monkeypatch)
    ChatPCD(engine=tiny_engine).with_structured_output(Ticket).invoke(TICKET)
    assert seen[-1].max_tokens == 64  # unset: the engine's default, not the 256 of free text
    ChatPCD(engine=tiny_engine, max_tokens=5).with_structured_output(Ticket).invoke(TICKET)
    assert seen[-1].max_tokens == 5
    ChatPCD(engine=tiny_engine, max_tokens=5, options={"max_tokens": 9}).with_structured_output(Ticket).invoke(TICKET)
    assert seen[-1].max_tokens == 9  # the model's options win


def test_stop_max_tokens_and_streaming_reach_free_text(tiny_engine):
    free = ChatPCD(engine=tiny_engine, max_tokens=6)
    text = free.invoke("Say something").content
    assert 0 < len(tiny_engine.tokenizer.encode(text)) <= 7
    stop = text[len(text) // 2 :].strip()[:2] or text[-1]
    cut = ChatPCD(engine=tiny_engine, max_tokens=6, stop=[stop]).invoke("Say something").content
    assert stop not in cut and text.startswith(cut)
    assert ChatPCD(engine=tiny_engine, max_tokens=6, stop=[stop])._get_ls_params()["ls_stop"] == [stop]

    calls = []
    real = ChatPCD._generate

    def generate(self, *args, **kwargs):
        calls.append("generate")
        return real(self, *args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ChatPCD, "_generate", generate)
        ChatPCD(engine=tiny_engine, max_tokens=6).invoke("Say something")
        assert calls == ["generate"]
        streamed = ChatPCD(engine=tiny_engine, max_tokens=6, streaming=True).invoke("Say something")
        assert calls == ["generate"] and streamed.content == text  # invoke went through _stream, same reply


def test_unknown_arguments_typos_are_refused_and_others_warned(tiny_engine):
    with pytest.raises(ValueError, match="'temprature'.*Did you mean 'temperature'"):
        ChatPCD(engine=tiny_engine, temprature=0.5)
    with pytest.warns(UserWarning, match="'api_key' is ignored"):
        llm = ChatPCD(engine=tiny_engine, api_key="sk-test")
    assert not hasattr(llm, "api_key")
    with pytest.raises(ValueError, match="max_retries"):
        ChatPCD(engine=tiny_engine, max_retries=-1)
    assert ChatPCD(engine=tiny_engine, max_retries=3).max_retries == 3


def test_structured_batch_keeps_runnable_semantics(tiny_engine, monkeypatch):
    """Per-input configs reach the callbacks, the engine call happens inside the runs, one blank input fails
    alone, and return_exceptions returns its error in its place; still one engine call."""
    import time

    from langchain_core.callbacks import BaseCallbackHandler

    from pcd_engine import ContextError

    calls = []
    real = tiny_engine.extract_many

    def slow(texts, schema, **kwargs):
        calls.append(len(list(texts)))
        time.sleep(0.2)
        return real(texts, schema, **kwargs)

    monkeypatch.setattr(tiny_engine, "extract_many", slow)

    class Runs(BaseCallbackHandler):
        def __init__(self):
            self.started, self.ended = {}, {}

        def on_chat_model_start(self, serialized, messages, *, run_id, tags=None, metadata=None, **kwargs):
            self.started[run_id] = (time.perf_counter(), tuple(tags or ()), dict(metadata or {}))

        def on_llm_end(self, response, *, run_id, **kwargs):
            self.ended[run_id] = time.perf_counter()

    runs = Runs()
    runnable = ChatPCD(engine=tiny_engine).with_structured_output(Ticket)
    inputs = [TICKET, "   ", "Where is my parcel?"]
    configs = [{"callbacks": [runs], "tags": [f"doc-{i}"], "metadata": {"i": i}} for i in range(3)]
    outs = runnable.batch(inputs, configs, return_exceptions=True)
    assert calls == [2]  # one engine call for the two readable inputs
    assert isinstance(outs[0], Ticket) and isinstance(outs[2], Ticket)
    assert isinstance(outs[1], ContextError) and "input 1" in str(outs[1])
    assert outs[0] == runnable.invoke(TICKET)
    assert sorted(t for _, tags, _ in runs.started.values() for t in tags if t.startswith("doc-")) == [
        "doc-0",
        "doc-1",
        "doc-2",
    ]
    assert sorted(m["i"] for _, _, m in runs.started.values()) == [0, 1, 2]
    durations = [runs.ended[r] - runs.started[r][0] for r in runs.ended]
    assert len(durations) == 2 and max(durations) >= 0.2  # the engine call ran inside the runs
    with pytest.raises(ContextError, match="input 1"):
        runnable.batch(inputs, configs)


def test_dumps_and_loads_round_trip():
    from langchain_core.load import dumps, loads

    llm = ChatPCD(model="smollm2-135m", options={"anchor": False}, temperature=0.5, stop=["\n"], timeout=30)
    text = dumps(llm)
    assert '"not_implemented"' not in text and '"id": ["pcd_integrations", "langchain", "ChatPCD"]' in text
    back = loads(text, valid_namespaces=["pcd_integrations"], allowed_objects=[ChatPCD])
    assert isinstance(back, ChatPCD) and back.model_dump() == llm.model_dump()
    assert back.engine is None  # a loaded engine is never serialized; the copy loads its model by name


def _order_status(order_id: str) -> str:
    """Look up the shipping status of an order by its number."""
    return f"Order {order_id} shipped on Monday and arrives Friday."


def _refund(order_id: str, amount: int) -> str:
    """Refund an amount of money for an order."""
    return f"Refunded {amount} for order {order_id}."


@pytest.mark.parametrize("choice", [None, "auto", "any", "required", True, "_refund", "none"])
def test_bind_tools_decides_the_call_and_fills_its_arguments(tiny_engine, choice):
    from pcd_engine.tool_calls import Tool, choice_schema

    llm = ChatPCD(engine=tiny_engine).bind_tools([_order_status, _refund], tool_choice=choice)
    reply = llm.invoke("Where is my order 5521? It has not arrived.")
    if choice == "none":
        assert not reply.tool_calls and isinstance(reply.content, str)
        return
    if choice == "_refund":
        assert [c["name"] for c in reply.tool_calls] == ["_refund"]
    if choice in (None, "auto") and not reply.tool_calls:
        assert isinstance(reply.content, str)  # the model chose to answer
        return
    (call,) = reply.tool_calls
    assert call["name"] in ("_order_status", "_refund") and call["id"].startswith("call_")
    assert set(call["args"]) == ({"order_id"} if call["name"] == "_order_status" else {"order_id", "amount"})
    evidence = reply.response_metadata["pcd"]
    if choice != "_refund":
        alternatives = dict(evidence["tool_choice"]["alternatives"])
        expected = {"_order_status", "_refund"} | ({"answer"} if choice in (None, "auto") else set())
        assert set(alternatives) == expected and abs(sum(alternatives.values()) - 1) < 1e-6
        assert evidence["tool_choice"]["value"] == call["name"]
    assert choice_schema([Tool("a"), Tool("b")], choice="auto")["properties"]["next"]["enum"] == ["a", "b", "answer"]


def test_tool_choice_equals_the_engine_decision_on_the_same_document(tiny_engine):
    from langchain_core.utils.function_calling import convert_to_openai_tool

    from pcd_engine.tool_calls import Tool, as_read, choice_schema, leans_to_calling

    llm = ChatPCD(engine=tiny_engine).bind_tools([_order_status, _refund], tool_choice="auto")
    reply = llm.invoke("Where is my order 5521? It has not arrived.")
    specs = [convert_to_openai_tool(t)["function"] for t in (_order_status, _refund)]
    tools = [Tool(s["name"], s["description"], s["parameters"]) for s in specs]
    question = choice_schema(tools, choice="auto")
    field = tiny_engine.extract("Where is my order 5521? It has not arrived.", question).fields["next"]
    labels = question["properties"]["next"]["enum"]
    field = field if leans_to_calling(field, labels) else as_read(field, labels)  # decide_tools' rule
    evidence = reply.response_metadata.get("pcd", {}).get("tool_choice")
    if field.value == "answer":
        assert not reply.tool_calls
    else:
        assert evidence["value"] == field.value and evidence["probability"] == pytest.approx(field.probability)


def test_tool_results_in_the_history_reach_the_decision(tiny_engine, monkeypatch):
    from langchain_core.messages import ToolMessage

    import pcd_integrations.langchain.chat_model as adapter

    seen = []
    real = adapter.decide_tools

    def spy(engine, text, tools, **kwargs):
        seen.append(text)
        return real(engine, text, tools, **kwargs)

    monkeypatch.setattr(adapter, "decide_tools", spy)
    llm = ChatPCD(engine=tiny_engine).bind_tools([_order_status], tool_choice="auto")
    history = [
        HumanMessage("Where is order 5521?"),
        AIMessage("", tool_calls=[{"name": "_order_status", "args": {"order_id": "5521"}, "id": "call_1"}]),
        ToolMessage(_order_status("5521"), tool_call_id="call_1", name="_order_status"),
    ]
    llm.invoke(history)
    assert 'Called _order_status({"order_id": "5521"})' in seen[-1]
    assert "Tool result (_order_status): Order 5521 shipped on Monday" in seen[-1]
    with pytest.raises(ValueError, match=r"tool_choice: expected .* one of \[._order_status.\], but got .nope."):
        ChatPCD(engine=tiny_engine).bind_tools([_order_status], tool_choice="nope")


def test_a_calls_model_overrides_the_chat_models(tiny_engine, monkeypatch):
    import pcd_integrations.langchain.chat_model as adapter

    loaded = []
    monkeypatch.setattr(adapter, "shared_engine", lambda model, backend: loaded.append((model, backend)) or tiny_engine)
    llm = ChatPCD(engine=tiny_engine, max_tokens=3)
    assert llm.invoke("Hi").response_metadata["model_name"] == "smollm2-135m" and loaded == []
    reply = llm.invoke("Hi", model="other-model")
    assert reply.response_metadata["model_name"] == "other-model" and loaded == [("other-model", "auto")]
    structured = llm.with_structured_output(TicketDict).invoke(TICKET, model="third-model")
    assert set(structured) == {"wants_refund", "topic"} and loaded[-1] == ("third-model", "auto")
    assert llm.model is None and llm.engine is tiny_engine  # the chat model itself is unchanged


def leaning_against(engine, text, schema, field):
    """A calibrator that leans hard towards whatever ``field`` answers raw: the calibrated answer then differs."""
    from pcd_engine import compile_schema
    from pcd_engine.calibrate.calibrator import Calibrator

    compiled = compile_schema(schema)
    raw = engine.extract(text, schema, strategy="exact", staging="one_pass", correction="none").fields[field]
    top = max(range(len(raw.label_distribution)), key=raw.label_distribution.__getitem__)
    lean = [p * (1e6 if i == top else 1.0) for i, p in enumerate(raw.label_distribution)]
    return Calibrator.from_distributions(compiled, {field: [lean]}, model=engine.model_id)


def test_a_correction_reaches_the_batched_structured_calls(tiny_engine):
    """16 tickets through with_structured_output(...).batch are one engine call: the batch correction's lean is
    estimated on all of them, and the answers are extract_many's with the same correction."""
    texts = [f"{TICKET} (ticket {i})" for i in range(16)]
    expected = tiny_engine.extract_many(texts, Ticket, correction="batch")
    assert all(r.fields["urgency"].correction == "batch" for r in expected)
    llm = ChatPCD(engine=tiny_engine, options={"correction": "batch"})
    assert llm.with_structured_output(Ticket).batch(texts) == [r.model for r in expected]
    single = tiny_engine.extract(TICKET, Ticket, correction="content_free")
    alone = ChatPCD(engine=tiny_engine, options={"correction": "content_free"})
    assert alone.with_structured_output(Ticket).invoke(TICKET) == single.model


def test_a_calibration_reaches_every_structured_call(tiny_engine, tmp_path):
    cal = leaning_against(tiny_engine, TICKET, Ticket, "topic")
    expected = tiny_engine.extract(TICKET, Ticket, calibration=cal)
    assert expected.values["topic"] != tiny_engine.extract(TICKET, Ticket, correction="none").values["topic"]
    path = cal.save(tmp_path / "cal.json")
    for given in (cal, cal.to_json(), str(path), path):
        llm = ChatPCD(engine=tiny_engine, calibration=given)
        assert llm.calibration == cal.to_json()  # kept as JSON: the model still serializes
        assert llm.with_structured_output(Ticket).invoke(TICKET) == expected.model
    with pytest.raises(ValueError, match="calibration: expected a Calibrator, its JSON or the path"):
        ChatPCD(engine=tiny_engine, calibration=3)
    other = ChatPCD(engine=tiny_engine, calibration={**cal.to_json(), "model": "another/model"})
    with pytest.raises(ValueError, match="expected the model it was fitted with"):
        other.with_structured_output(Ticket).invoke(TICKET)


def test_a_head_reaches_every_structured_call(tiny_engine, tmp_path):
    from tests.support import forcing_head

    own = tiny_engine.extract(TICKET, Ticket, correction="none").values["topic"]
    forced = next(v for v in ("billing", "shipping", "account") if v != own)
    head = forcing_head(tiny_engine, Ticket, "topic", forced)
    expected = tiny_engine.extract(TICKET, Ticket, head=head)
    assert expected.values["topic"] == forced and expected.fields["topic"].method == "head"
    path = head.save(tmp_path / "topic.head.json")
    for given in (head, head.to_json(), str(path), path):
        llm = ChatPCD(engine=tiny_engine, head=given)
        assert llm.head == head.to_json()  # kept as JSON: the model still serializes
        assert llm.with_structured_output(Ticket).invoke(TICKET) == expected.model
        assert llm.with_structured_output(Ticket).batch([TICKET, TICKET]) == [expected.model] * 2
    with pytest.raises(ValueError, match="head: expected a Head, its JSON or the path"):
        ChatPCD(engine=tiny_engine, head=3)
    other = ChatPCD(engine=tiny_engine, head={**head.to_json(), "model": "another/model"})
    with pytest.raises(ValueError, match="expected the model it was fitted with"):
        other.with_structured_output(Ticket).invoke(TICKET)
