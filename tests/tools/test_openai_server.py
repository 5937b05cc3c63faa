"""``pcd serve``'s OpenAI API driven by the official ``openai`` client on a live loopback server, on the embedded
model: tools decided by the engine, streamed usage, model names, and every refusal as the client's own exception
type (nothing silently ignored)."""

from __future__ import annotations

import json
from typing import Any

import pytest

pytest.importorskip("fastapi", reason="pip install 'pcd-llm[serve]'")
openai = pytest.importorskip("openai")

from pcd_engine.models.resolve import default_model_path  # noqa: E402
from pcd_engine.tool_calls import Tool, decide_tools  # noqa: E402
from pcd_engine.tools.serve import create_app  # noqa: E402
from tests.support import serve_on_loopback  # noqa: E402

pytestmark = pytest.mark.real_model

MODEL = "smollm2-135m"
ASK = "Where is my order 5521? It has not arrived yet."
STATUS = {
    "type": "function",
    "function": {
        "name": "get_order_status",
        "description": "Look up the shipping status of an order by its number.",
        "parameters": {"type": "object", "properties": {"order_id": {"type": "string"}}, "required": ["order_id"]},
    },
}
REFUND = {
    "type": "function",
    "function": {
        "name": "refund",
        "description": "Refund an order.",
        "parameters": {
            "type": "object",
            "properties": {"reason": {"enum": ["late", "broken", "other"]}, "full": {"type": "boolean"}},
            "required": ["reason", "full"],
        },
    },
}
TOOLS = [STATUS, REFUND]


@pytest.fixture(scope="module")
def live(default_engine):
    app = create_app(default_engine, model_name=MODEL, aliases=[str(default_model_path())])
    with serve_on_loopback(app) as port:
        yield openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0)


def _valid(call: Any) -> dict:
    import jsonschema

    tool = next(t for t in TOOLS if t["function"]["name"] == call.function.name)
    arguments = json.loads(call.function.arguments)
    jsonschema.validate(arguments, tool["function"]["parameters"])
    assert call.id.startswith("call_") and call.type == "function"
    return arguments


def _as_tools(specs: list[dict]) -> list[Tool]:
    return [Tool(s["function"]["name"], s["function"]["description"], s["function"]["parameters"]) for s in specs]


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "refund"}}])
def test_tools_are_decided_by_the_engine(live, default_engine, choice):
    out = live.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": ASK}],
        tools=TOOLS,
        tool_choice=choice,
        parallel_tool_calls=False,
    )
    (reply,) = out.choices
    assert reply.finish_reason == "tool_calls" and reply.message.content is None
    (call,) = reply.message.tool_calls
    arguments = _valid(call)
    expected = decide_tools(
        default_engine, ASK, _as_tools(TOOLS), choice=choice if isinstance(choice, str) else "refund"
    )  # the same decision, made directly on the same document
    assert call.function.name == expected.calls[0].name and arguments == expected.calls[0].arguments
    evidence = out.model_extra["pcd"]
    if choice == "required":
        assert evidence["tool_choice"]["value"] == call.function.name
        assert set(dict(evidence["tool_choice"]["alternatives"])) == {"get_order_status", "refund"}
    else:
        assert evidence["tool_choice"] is None  # forced: nothing to choose


def test_auto_parallel_and_none(live, default_engine):
    auto = live.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": ASK}], tools=TOOLS)
    decided = decide_tools(default_engine, ASK, _as_tools(TOOLS), choice="auto", parallel=True)
    names = [c.function.name for c in auto.choices[0].message.tool_calls or []]
    assert names == [c.name for c in decided.calls]  # parallel_tool_calls defaults to true, as in OpenAI
    assert auto.choices[0].finish_reason == ("tool_calls" if names else "stop")
    for call in auto.choices[0].message.tool_calls or []:
        _valid(call)
    none = live.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": ASK}], tools=TOOLS, tool_choice="none", max_tokens=4
    )
    assert none.choices[0].message.tool_calls is None and isinstance(none.choices[0].message.content, str)


def test_tool_results_in_the_history_reach_the_decision(live, monkeypatch):
    import pcd_engine.tools.serve.answers as api

    seen = []
    real = api.decide_tools

    def spy(engine, text, tools, **kwargs):
        seen.append(text)
        return real(engine, text, tools, **kwargs)

    monkeypatch.setattr(api, "decide_tools", spy)
    history = [
        {"role": "user", "content": ASK},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_order_status", "arguments": '{"order_id": "5521"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "Order 5521 shipped on Monday."},
    ]
    live.chat.completions.create(model=MODEL, messages=history, tools=TOOLS, tool_choice="required")
    assert seen[-1] == (
        f"User: {ASK}\n\n"
        'Assistant: Called get_order_status({"order_id": "5521"})\n\n'
        "Tool result (get_order_status): Order 5521 shipped on Monday."
    )


def test_streamed_tool_calls_and_usage(live):
    stream = live.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": ASK}],
        tools=TOOLS,
        tool_choice="required",
        parallel_tool_calls=False,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    calls = [tc for c in chunks if c.choices for tc in c.choices[0].delta.tool_calls or []]
    assert len(calls) == 1 and calls[0].function.name in ("get_order_status", "refund")
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens > 0

    text = list(
        live.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "Say hi"}],
            max_tokens=5,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert text[-1].choices == [] and text[-1].usage.completion_tokens <= 5
    assert "".join(c.choices[0].delta.content or "" for c in text if c.choices)
    plain = list(
        live.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Say hi"}], max_tokens=3, stream=True
        )
    )
    assert all(c.usage is None for c in plain)  # usage only when asked for


def test_every_model_name_listed_is_accepted(live):
    names = [m.id for m in live.models.list()]
    assert names == [MODEL, str(default_model_path()), "default"]
    for name in names:
        out = live.chat.completions.create(model=name, messages=[{"role": "user", "content": "Hi"}], max_tokens=2)
        assert out.model == MODEL
    with pytest.raises(openai.NotFoundError, match="expected one of"):
        live.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "Hi"}], max_tokens=2)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("n", 2),
        ("logprobs", True),
        ("presence_penalty", 0.5),
        ("logit_bias", {"42": 5}),
        ("functions", [{"name": "f", "parameters": {}}]),
        ("reasoning_effort", "high"),
        ("no_such_field", 1),
    ],
)
def test_fields_pcd_cannot_honour_are_refused_by_name(live, field, value):
    with pytest.raises(openai.BadRequestError) as exc:
        live.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=2, extra_body={field: value}
        )
    assert exc.value.param == field and field in exc.value.message


def test_neutral_values_and_harmless_fields_are_accepted(live):
    out = live.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Hi"}],
        max_tokens=2,
        n=1,
        logprobs=False,
        presence_penalty=0,
        seed=7,
        top_p=0.9,
        user="u-1",
        metadata={"run": "test"},
    )
    assert len(out.choices) == 1


def test_images_bad_tools_and_unknown_routes_are_refused(live):
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    refused = r"messages\[0\].content\[1\]: expected text, but got media \(a 'image_url' block\)"
    with pytest.raises(openai.BadRequestError, match=refused):
        live.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": [{"type": "text", "text": "Hi"}, image]}], max_tokens=2
        )
    with pytest.raises(openai.BadRequestError, match="tool_choice: expected"):
        live.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": ASK}],
            tools=TOOLS,
            tool_choice={"type": "function", "function": {"name": "search"}},
        )
    with pytest.raises(openai.BadRequestError, match=r"tools\[0\]"):
        live.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": ASK}], tools=[{"type": "web_search"}]
        )
    with pytest.raises(openai.NotFoundError) as exc:
        live.embeddings.create(model=MODEL, input="hi")
    assert exc.value.code == "not_found" and "POST /v1/embeddings" in exc.value.message
    with pytest.raises(openai.APIStatusError) as exc:
        live.delete("/models", cast_to=object)
    assert exc.value.status_code == 405 and exc.value.body["code"] == "method_not_allowed"


def test_api_key(default_engine):
    with serve_on_loopback(create_app(default_engine, model_name=MODEL, api_key="s3cret")) as port:
        base = f"http://127.0.0.1:{port}/v1"
        with pytest.raises(openai.AuthenticationError, match="Authorization"):
            openai.OpenAI(base_url=base, api_key="wrong", max_retries=0).models.list()
        assert [m.id for m in openai.OpenAI(base_url=base, api_key="s3cret", max_retries=0).models.list()]
        import httpx

        assert httpx.get(f"http://127.0.0.1:{port}/v1/models").status_code == 401
        assert httpx.get(f"http://127.0.0.1:{port}/").status_code == 200  # the page holds no data


def test_json_object_is_written_under_a_json_grammar(live, default_engine):
    from pcd_engine import ChatMessage, json_chat

    ask = "Tell me a joke about cats. Return a JSON object with 'setup' and 'punchline' keys."
    out = live.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": ask}], response_format={"type": "json_object"}, max_tokens=60
    )
    content = out.choices[0].message.content
    assert isinstance(json.loads(content), dict) or out.choices[0].finish_reason == "length"
    direct = json_chat(default_engine, [ChatMessage("user", ask)], max_new_tokens=60)
    assert content == direct.text and out.choices[0].finish_reason == direct.finish_reason
    assert out.usage.completion_tokens == direct.completion_tokens
    chunks = list(
        live.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": ask}],
            response_format={"type": "json_object"},
            max_tokens=60,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == content
    assert chunks[-1].usage.completion_tokens == direct.completion_tokens


def test_schema_in_prompt_finds_the_last_compilable_object_schema():
    from pcd_engine.adapters import Conversation, Turn
    from pcd_engine.tools.serve.answers import schema_in_prompt

    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
    system = f'Be brief. Not this: {{"a": 1}} nor {{"properties": 3}}. Match:\n{json.dumps(schema, indent=2)}\nThanks.'
    ask = Turn("user", "Is it fine?")
    found = schema_in_prompt(Conversation((Turn("system", system), ask)))
    assert found is not None
    got, rest = found
    assert got == schema
    kept = 'Be brief. Not this: {"a": 1} nor {"properties": 3}. Match:\n\nThanks.'
    assert rest == Conversation((Turn("system", kept), ask))
    only = Conversation((Turn("system", json.dumps(schema)), ask))
    assert schema_in_prompt(only) == (schema, Conversation((ask,)))  # a turn that was only the schema is dropped
    user = Conversation((Turn("user", json.dumps(schema)),))
    assert schema_in_prompt(user) is None  # user turns are content, not format
    assert schema_in_prompt(Conversation((Turn("system", '{"properties": {"x": {"$ref": "#/no"}}}'),))) is None


def test_json_object_with_a_schema_in_the_system_turn_is_scored(live, default_engine):
    schema = {"type": "object", "properties": {"wants_refund": {"type": "boolean"}}, "required": ["wants_refund"]}
    text = "I was charged twice. Give me my money back."
    messages = [
        {"role": "system", "content": f"Answer in JSON matching this schema:\n{json.dumps(schema)}"},
        {"role": "user", "content": text},
    ]
    raw = live.chat.completions.with_raw_response.create(
        model=MODEL, messages=messages, response_format={"type": "json_object"}
    )
    body = json.loads(raw.text)
    expected = default_engine.extract(f"Answer in JSON matching this schema:\n\n{text}", schema)
    assert json.loads(body["choices"][0]["message"]["content"]) == expected.values
    assert body["pcd"]["schema_source"] == "prompt"


def test_legacy_completions_continue_the_raw_prompt(live, default_engine):
    from pcd_engine import stream_text

    prompt = "The capital of France is"
    out = live.completions.create(model=MODEL, prompt=prompt, max_tokens=5)
    direct = list(stream_text(default_engine, prompt, max_new_tokens=5))
    assert out.object == "text_completion" and out.choices[0].text == "".join(c.text for c in direct)
    assert out.choices[0].finish_reason == direct[-1].finish_reason
    assert out.usage.completion_tokens == direct[-1].completion_tokens <= 5
    assert len(live.completions.create(model=MODEL, prompt=[prompt]).choices) == 1  # max_tokens defaults to 16
    chunks = list(
        live.completions.create(
            model=MODEL, prompt=prompt, max_tokens=5, stream=True, stream_options={"include_usage": True}
        )
    )
    assert "".join(c.choices[0].text for c in chunks if c.choices) == out.choices[0].text
    assert chunks[-1].usage.completion_tokens == out.usage.completion_tokens
    for field, value in [("echo", True), ("best_of", 3), ("suffix", "x"), ("n", 2), ("logprobs", 2)]:
        with pytest.raises(openai.BadRequestError) as exc:
            live.completions.create(model=MODEL, prompt=prompt, max_tokens=2, extra_body={field: value})
        assert exc.value.param == field
    with pytest.raises(openai.BadRequestError, match="non-empty prompt"):
        live.completions.create(model=MODEL, prompt="", max_tokens=2)


def test_responses_text_schema_and_tools(live, default_engine):
    from pcd_engine import ChatMessage, stream_chat

    text = live.responses.create(model=MODEL, input="Say hi", instructions="Be brief.", max_output_tokens=6)
    direct = list(
        stream_chat(
            default_engine, [ChatMessage("system", "Be brief."), ChatMessage("user", "Say hi")], max_new_tokens=6
        )
    )
    assert text.output_text == "".join(c.text for c in direct)
    assert text.status == ("incomplete" if direct[-1].finish_reason == "length" else "completed")
    assert text.usage.output_tokens == direct[-1].completion_tokens

    schema = {
        "type": "object",
        "properties": {"urgent": {"type": "boolean"}, "topic": {"enum": ["billing", "shipping"]}},
        "required": ["urgent", "topic"],
        "additionalProperties": False,
    }
    fmt = {"format": {"type": "json_schema", "name": "ticket", "schema": schema, "strict": True}}
    scored = live.responses.create(model=MODEL, input=ASK, text=fmt)
    assert json.loads(scored.output_text) == default_engine.extract(ASK, schema).values
    assert set(scored.model_extra["pcd"]["fields"]) == {"urgent", "topic"}

    tools = [{"type": "function", **t["function"]} for t in TOOLS]
    called = live.responses.create(
        model=MODEL, input=ASK, tools=tools, tool_choice="required", parallel_tool_calls=False
    )
    (item,) = called.output
    assert item.type == "function_call" and item.call_id.startswith("call_")
    expected = decide_tools(default_engine, ASK, _as_tools(TOOLS), choice="required")
    assert item.name == expected.calls[0].name and json.loads(item.arguments) == expected.calls[0].arguments
    follow_up = [
        {"role": "user", "content": ASK},
        {"type": "function_call", "call_id": item.call_id, "name": item.name, "arguments": item.arguments},
        {"type": "function_call_output", "call_id": item.call_id, "output": "Order 5521 shipped on Monday."},
    ]
    again = live.responses.create(model=MODEL, input=follow_up, tools=tools, tool_choice="none", max_output_tokens=4)
    assert again.output[0].type == "message"


def test_responses_stream_and_refusals(live):
    events = list(live.responses.create(model=MODEL, input="Say hi", max_output_tokens=8, stream=True))
    kinds = [e.type for e in events]
    assert kinds[0] == "response.created" and kinds[-1] in ("response.completed", "response.incomplete")
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert len(deltas) > 1  # free text is streamed as it is written, not in one piece
    assert "".join(deltas) == events[-1].response.output_text
    assert events[0].response.id == events[-1].response.id
    assert [e.sequence_number for e in events] == list(range(1, len(events) + 1))
    added, done = (next(e.item.id for e in events if e.type == f"response.output_item.{k}") for k in ("added", "done"))
    assert added == done == events[-1].response.output[0].id
    tools = [{"type": "function", **t["function"]} for t in TOOLS]
    streamed = list(live.responses.create(model=MODEL, input=ASK, tools=tools, tool_choice="required", stream=True))
    done = [e for e in streamed if e.type == "response.function_call_arguments.done"]
    assert done and json.loads(done[0].arguments) is not None
    for field, value in [("store", True), ("previous_response_id", "resp_1"), ("reasoning", {"effort": "high"})]:
        with pytest.raises(openai.BadRequestError) as exc:
            live.responses.create(model=MODEL, input="Hi", max_output_tokens=2, extra_body={field: value})
        assert exc.value.param == field
    with pytest.raises(openai.BadRequestError, match="hosted tools"):
        live.responses.create(model=MODEL, input="Hi", tools=[{"type": "web_search"}])
    image = {"type": "input_image", "image_url": "data:image/png;base64,AAAA"}
    with pytest.raises(openai.BadRequestError, match=r"expected text, but got media \(a 'input_image' block\)"):
        live.responses.create(model=MODEL, input=[{"role": "user", "content": [image]}])


def test_logprobs_carry_each_scored_fields_probability(live, default_engine):
    import math

    schema = {
        "type": "object",
        "properties": {"urgent": {"type": "boolean"}, "topic": {"enum": ["billing", "shipping", "other"]}},
        "required": ["urgent", "topic"],
        "additionalProperties": False,
    }
    fmt = {"type": "json_schema", "json_schema": {"name": "t", "schema": schema}}
    out = live.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": ASK}], response_format=fmt, logprobs=True, top_logprobs=2
    )
    entries = out.choices[0].logprobs.content
    result = default_engine.extract(ASK, schema)
    assert [e.token for e in entries] == [f"{n}={json.dumps(f.value)}" for n, f in result.fields.items()]
    for e, f in zip(entries, result.fields.values(), strict=True):
        assert e.logprob == pytest.approx(math.log(f.probability))
        assert [t.token.split("=", 1)[1] for t in e.top_logprobs] == [json.dumps(a.value) for a in f.alternatives[:2]]
    forced = live.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": ASK}], tools=TOOLS, tool_choice="required", logprobs=True
    )
    tokens = [e.token for e in forced.choices[0].logprobs.content]
    assert tokens[0].startswith("tool=") and all("=" in t for t in tokens)
    with pytest.raises(openai.BadRequestError) as exc:
        live.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}], logprobs=True)
    assert exc.value.param == "logprobs"
