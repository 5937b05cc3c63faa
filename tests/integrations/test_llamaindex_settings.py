"""Every LlamaIndex constructor argument is honoured or refused, on a tiny random model (no real weights)."""

from __future__ import annotations

from typing import Literal

import pytest
from pydantic import BaseModel

pytest.importorskip("llama_index.core", reason="pip install 'pcd-llm[llamaindex]'")

from llama_index.core import Settings  # noqa: E402
from llama_index.core.llms import ChatMessage  # noqa: E402
from llama_index.core.llms.mock import MockLLM  # noqa: E402
from llama_index.core.prompts import PromptTemplate  # noqa: E402
from llama_index.core.schema import TextNode  # noqa: E402

from pcd_engine import OptionError, RequestTimeout  # noqa: E402
from pcd_integrations.llamaindex import PCDLLM, PCDMetadataExtractor, PCDPydanticProgram  # noqa: E402
from tests.support import seen_options  # noqa: E402


class Tags(BaseModel):
    urgency: Literal["low", "high"]
    refund: bool


PROMPT = PromptTemplate("Tag this ticket.\n\n{text}")
TEXT = "My parcel is lost and I want my money back now."


def test_temperature_reaches_structured_predictions_and_is_refused_for_free_text(tiny_engine, monkeypatch):
    seen = seen_options(tiny_engine, monkeypatch)
    llm = PCDLLM(engine=tiny_engine, temperature=2.0)
    llm.structured_predict(Tags, PROMPT, text=TEXT)
    assert seen[-1].temperature == 2.0
    PCDLLM(engine=tiny_engine, temperature=2.0, options={"temperature": 0.5}).structured_predict(
        Tags, PROMPT, text=TEXT
    )
    assert seen[-1].temperature == 0.5  # the model's options win over the generic setting
    PCDLLM(engine=tiny_engine, temperature=0).structured_predict(Tags, PROMPT, text=TEXT)
    assert seen[-1].temperature == 1.0  # 0 is greedy: the engine's default probabilities
    with pytest.raises(OptionError, match="greedily"):
        llm.complete("Hello")
    with pytest.raises(OptionError, match="greedily"):
        llm.chat([ChatMessage(role="user", content="Hello")])
    with pytest.raises(OptionError, match="temperature"):
        PCDLLM(engine=tiny_engine, temperature=-1)


def test_max_tokens_and_stop_reach_free_text_and_a_call_wins(tiny_engine):
    free = PCDLLM(engine=tiny_engine, max_tokens=6)
    text = free.complete("Say something").text
    assert 0 < len(tiny_engine.tokenizer.encode(text)) <= 7
    assert len(tiny_engine.tokenizer.encode(free.complete("Say something", max_tokens=2).text)) <= 3
    stop = text[len(text) // 2 :].strip()[:2] or text[-1]
    cut = PCDLLM(engine=tiny_engine, max_tokens=6, stop=[stop]).complete("Say something").text
    assert stop not in cut and text.startswith(cut)
    assert free.complete("Say something", stop=[stop]).text == cut
    streamed = "".join(r.delta or "" for r in free.stream_complete("Say something"))
    assert streamed == text


def test_timeout_bounds_structured_predictions_and_free_text(tiny_engine, monkeypatch):
    seen = seen_options(tiny_engine, monkeypatch)
    PCDLLM(engine=tiny_engine, timeout=30).structured_predict(Tags, PROMPT, text=TEXT)
    assert seen[-1].limits.time_limit_s == 30
    with pytest.raises(RequestTimeout, match="time limit of 1e-09 s"):
        PCDLLM(engine=tiny_engine, timeout=1e-9, max_tokens=8).complete("Hello")
    with pytest.raises(OptionError, match="timeout"):
        PCDLLM(engine=tiny_engine, timeout=0)
    with pytest.raises(OptionError, match="temperature=0.7 asks for sampled free text"):  # a call's own, not dropped
        PCDLLM(engine=tiny_engine, max_tokens=4).complete("Hello", temperature=0.7)


def test_model_name_typos_and_unknown_arguments(tiny_engine, monkeypatch):
    import pcd_integrations.llamaindex.llm as adapter

    assert PCDLLM(model_name="smollm2-135m").model == "smollm2-135m"
    with pytest.raises(OptionError, match="name different models"):
        PCDLLM(model="a", model_name="b")
    with pytest.raises(OptionError, match="'temprature'.*Did you mean 'temperature'"):
        PCDLLM(engine=tiny_engine, temprature=0.5)
    with pytest.raises(OptionError, match="unknown argument 'api_key'"):
        PCDLLM(engine=tiny_engine, api_key="sk-test")
    with pytest.raises(OptionError, match="anchr"):
        PCDLLM(engine=tiny_engine, options={"anchr": False})
    loaded = []
    monkeypatch.setattr(adapter, "shared_engine", lambda model, backend: loaded.append((model, backend)) or tiny_engine)
    PCDLLM(model_name="smollm2-135m", backend="torch").complete("Hi", max_tokens=1)
    assert loaded == [("smollm2-135m", "torch")]  # the name given is the model loaded


def test_program_takes_verbose_llm_kwargs_and_settings_llm(tiny_engine, monkeypatch, capsys):
    seen = seen_options(tiny_engine, monkeypatch)
    program = PCDPydanticProgram.from_defaults(Tags, prompt=PROMPT, engine=tiny_engine, verbose=True, anchor=False)
    program(text=TEXT, llm_kwargs={"temperature": 3.0})
    assert (seen[-1].anchor, seen[-1].temperature) == (False, 3.0)
    assert "> Tags: urgency=" in capsys.readouterr().out
    with pytest.raises(OptionError, match="anchr"):
        program(text=TEXT, llm_kwargs={"anchr": True})

    monkeypatch.setattr(Settings, "_llm", PCDLLM(engine=tiny_engine, options={"temperature": 4.0}))
    PCDPydanticProgram.from_defaults(Tags, prompt=PROMPT)(text=TEXT)
    assert seen[-1].temperature == 4.0  # Settings.llm's engine and options
    monkeypatch.setattr(Settings, "_llm", _OtherLLM())
    with pytest.raises(OptionError, match="expected Settings.llm to be a PCDLLM .*, but got _OtherLLM"):
        PCDPydanticProgram.from_defaults(Tags, prompt=PROMPT)


class _OtherLLM(MockLLM):
    """Some LLM that is not pcd's (a MockLLM subclass, but not LlamaIndex's own "no LLM")."""


def test_extractor_takes_settings_llm_and_refuses_another_llm(tiny_engine, monkeypatch):
    import pcd_integrations.llamaindex.extractor as adapter

    seen = seen_options(tiny_engine, monkeypatch)
    monkeypatch.setattr(Settings, "_llm", PCDLLM(engine=tiny_engine, options={"temperature": 4.0}))
    PCDMetadataExtractor(Tags).extract_batches([TextNode(text=TEXT)])
    assert seen[-1].temperature == 4.0

    loaded = []
    monkeypatch.setattr(adapter, "shared_engine", lambda model, backend: loaded.append((model, backend)) or tiny_engine)
    PCDMetadataExtractor(Tags, model="smollm2-135m").extract_batches([TextNode(text=TEXT)])
    assert loaded == [("smollm2-135m", "auto")]  # an explicit model wins over Settings.llm

    monkeypatch.setattr(Settings, "_llm", MockLLM())  # what Settings.llm = None sets: no LLM
    PCDMetadataExtractor(Tags).extract_batches([TextNode(text=TEXT)])
    assert loaded[-1] == (None, "auto")

    monkeypatch.setattr(Settings, "_llm", _OtherLLM())
    with pytest.raises(OptionError, match="expected Settings.llm to be a PCDLLM .*, but got _OtherLLM"):
        PCDMetadataExtractor(Tags)
    with pytest.raises(OptionError, match="expected llm to be a PCDLLM .*, but got MockLLM"):
        PCDMetadataExtractor(Tags, llm=MockLLM())
    with pytest.raises(OptionError, match="unknown option"):
        PCDMetadataExtractor(Tags, engine=tiny_engine, options={"temprature": 1.0})


def test_context_window_is_taken_and_checked_against_the_models_window(tiny_engine):
    window = tiny_engine.backend.max_context
    assert PCDLLM(engine=tiny_engine).metadata.context_window == window
    assert PCDLLM(engine=tiny_engine, context_window=1024).metadata.context_window == 1024
    with pytest.raises(OptionError, match=f"context_window: expected at most the model's window \\({window} tokens"):
        PCDLLM(engine=tiny_engine, context_window=window + 1)
    with pytest.raises(OptionError, match="context_window"):
        PCDLLM(context_window=0)
