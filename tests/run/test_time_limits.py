"""Every request bounded (issue 45): a default time limit on every surface, and no request running longer than its
limit plus one step, on the schema shapes that ran longest (UUIDs, datetimes, dicts, tuples).

Time is virtual, so nothing here is a timed test: the clocks the limits read (:class:`~pcd_engine.limits.Watch`'s
and free text's) are replaced by one that reads the backend's forward passes, one virtual second each (or more, to
reach the 600 s default). A request with a limit of ``L`` seconds then runs at most ``L + 1`` passes after it is
admitted: proof that the limit is checked before every step, whatever the shape being generated.
"""

from __future__ import annotations

import datetime
import types
import uuid

import pytest
from pydantic import BaseModel

import pcd_engine.generate.free_text as free_text_module
import pcd_engine.limits as limits_module
from pcd_engine import Engine, RequestTimeout
from pcd_engine.limits import DEFAULT_TIME_LIMIT_S, RequestLimits

TEXT = "Order 1182 arrived on 2024-03-05 10:00, broken; ticket 6f1c-22 asks for a refund of 30 euros."


class Slow(BaseModel):
    """The shapes that took 44-90 s for 64 tokens before (issue 45)."""

    ident: uuid.UUID
    when: datetime.datetime
    counts: dict[str, int]
    pair: tuple[str, int, float]


@pytest.fixture
def engine(tiny_engine):
    return Engine(tiny_engine.backend, max_tokens=64, correction="none")


@pytest.fixture
def pass_clock(monkeypatch, engine):
    """Replace the clocks the limits read by the backend's pass count times ``seconds_per_pass``."""
    backend = engine.backend
    scale = {"seconds_per_pass": 1.0}

    def now() -> float:
        return backend.forward_passes * scale["seconds_per_pass"]

    fake = types.SimpleNamespace(monotonic=now, perf_counter=now, time=now, sleep=lambda s: None)
    monkeypatch.setattr(limits_module, "time", fake)
    monkeypatch.setattr(free_text_module, "time", fake)
    return scale


def passes_of(engine, call) -> int:
    before = engine.backend.forward_passes
    with pytest.raises(RequestTimeout):
        call()
    return engine.backend.forward_passes - before


def test_the_slow_shapes_stop_within_their_limit_plus_one_step(engine, pass_clock):
    unbounded = engine.backend.forward_passes
    engine.extract(TEXT, Slow, limits=RequestLimits())  # warm the head; RequestLimits(): no time limit at all
    assert engine.backend.forward_passes - unbounded > 12  # the shape runs long enough to be cut
    for limit in (2, 5, 9):
        assert passes_of(engine, lambda: engine.extract(TEXT, Slow, limits=RequestLimits(time_limit_s=limit))) <= (
            limit + 1
        )
    outs = engine.extract_many([TEXT, TEXT + " Again."], Slow, limits=RequestLimits(time_limit_s=4),
                               return_exceptions=True)  # fmt: skip
    assert all(isinstance(o, RequestTimeout) for o in outs)


def test_the_default_limit_bounds_a_call_that_names_none(engine, pass_clock):
    assert engine.options.limits.time_limit_s == DEFAULT_TIME_LIMIT_S == 600
    pass_clock["seconds_per_pass"] = 100.0  # six passes reach the default
    assert passes_of(engine, lambda: engine.extract(TEXT, Slow)) <= 7
    with pytest.raises(RequestTimeout, match=r"time limit of 600 s.*Raise the limit \(timeout=, or limits="):
        engine.extract(TEXT, Slow)
    lifted = Engine(engine.backend, limits=RequestLimits(), max_tokens=12, correction="none")
    assert set(lifted.extract(TEXT, Slow).values) == set(Slow.model_fields)  # the default lifted: it finishes


def test_free_text_has_the_default_limit_too(engine, pass_clock):
    from pcd_engine import ChatMessage, stream_chat

    pass_clock["seconds_per_pass"] = 100.0
    before = engine.backend.forward_passes
    with pytest.raises(RequestTimeout, match="time limit of 600 s"):
        list(stream_chat(engine, [ChatMessage("user", "Tell me a long story.")], max_new_tokens=200))
    assert engine.backend.forward_passes - before <= 8


def test_the_adapters_bound_free_text_by_the_engine_s_limit(engine, pass_clock):
    pytest.importorskip("langchain_core")
    from pcd_integrations.langchain import ChatPCD

    pass_clock["seconds_per_pass"] = 100.0
    chat = ChatPCD(engine=engine, max_tokens=200)  # no timeout of its own: the engine's 600 s
    assert passes_of(engine, lambda: chat.invoke("Tell me a long story.")) <= 8
    structured = chat.with_structured_output(Slow)
    assert passes_of(engine, lambda: structured.invoke(TEXT)) <= 7
    pass_clock["seconds_per_pass"] = 1.0
    assert passes_of(engine, lambda: chat.invoke("Tell me a long story.", timeout=3)) <= 5  # a call's own wins


def test_the_llamaindex_llm_bounds_free_text_by_the_engine_s_limit(engine, pass_clock):
    pytest.importorskip("llama_index.core")
    from pcd_integrations.llamaindex import PCDLLM

    pass_clock["seconds_per_pass"] = 100.0
    assert passes_of(engine, lambda: PCDLLM(engine=engine, max_tokens=200).complete("Tell me a story.")) <= 8


def test_the_server_bounds_the_slow_shapes_with_a_504(engine, pass_clock):
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from pcd_engine.tools.serve import create_app

    client = TestClient(create_app(engine, limits=RequestLimits(time_limit_s=5)), base_url="http://localhost")
    schema = Slow.model_json_schema()
    before = engine.backend.forward_passes
    response = client.post("/api/extract", json={"schema": schema, "context": TEXT})
    assert response.status_code == 504 and "time limit of 5 s" in response.json()["error"]["message"]
    assert engine.backend.forward_passes - before <= 6
    before = engine.backend.forward_passes
    body = {"model": "pcd", "messages": [{"role": "user", "content": TEXT}],
            "response_format": {"type": "json_schema", "json_schema": {"name": "Slow", "schema": schema}}}  # fmt: skip
    response = client.post("/v1/chat/completions", json=body)
    assert response.status_code == 504
    assert engine.backend.forward_passes - before <= 7
