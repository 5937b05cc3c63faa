"""One mapping of settings: every surface (the CLI, the server, tag_corpus, LangChain, LlamaIndex, Ray) turns its
settings into ExtractOptions through pcd_engine.options.surface_options, and every count is checked by
pcd_engine.errors.check_count."""

from __future__ import annotations

import argparse
import ast
from pathlib import Path

import pytest

from pcd_engine.calibrate.calibrator import Calibrator
from pcd_engine.errors import OptionError, check_count
from pcd_engine.limits import RequestLimits
from pcd_engine.options import ExtractOptions, surface_options

ROOT = Path(__file__).resolve().parent.parent
SURFACES = [
    "pcd_engine/tools/cli/common.py",
    "pcd_engine/tools/serve/server.py",
    "pcd_engine/tools/serve/answers.py",
    "pcd_engine/tagging/job.py",
    "pcd_integrations/langchain/chat_model.py",
    "pcd_integrations/llamaindex/program.py",
    "pcd_integrations/llamaindex/llm.py",
    "pcd_integrations/llamaindex/extractor.py",
    "pcd_integrations/ray.py",
]


def test_layers_win_in_order_over_the_settings_field_by_field():
    got = surface_options(
        ("call", {"temperature": 0.5}),
        ("model", ExtractOptions(temperature=3.0, anchor=False, max_tokens=9)),
        temperature=2.0,
        timeout=5,
        max_tokens=7,
    )
    # the obvious computation: each layer laid over the next, the settings at the bottom
    settings = ExtractOptions(temperature=2.0, limits=RequestLimits(time_limit_s=5), max_tokens=7)
    expected = ExtractOptions(temperature=0.5).over(ExtractOptions(temperature=3.0, anchor=False, max_tokens=9))
    assert got == expected.over(settings)
    assert (got.temperature, got.anchor, got.max_tokens, got.limits) == (0.5, False, 9, RequestLimits(time_limit_s=5))


@pytest.mark.parametrize("temperature", [None, 0, 0.0])
def test_a_chat_temperature_of_zero_keeps_the_engines(temperature):
    assert surface_options(temperature=temperature).temperature is None
    assert surface_options(timeout=0).limits is None


def test_a_calibration_given_as_json_becomes_a_calibrator():
    from pcd_engine.schema import compile_schema

    fitted = Calibrator.from_distributions(
        compile_schema({"properties": {"ok": {"type": "boolean"}}}), {"ok": [[0.7, 0.3], [0.6, 0.4]]}, model="m"
    )
    assert surface_options(calibration=fitted.to_json()).calibration == fitted


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"temperature": -1}, "temperature: expected a number >= 0, but got -1"),
        ({"temperature": "hot"}, "temperature: expected a number >= 0, but got 'hot'"),
        ({"max_tokens": 0}, "max_tokens: expected an integer >= 1, but got 0"),
        ({"timeout": -2}, "time_limit_s: expected a positive number of seconds or None, but got -2"),
    ],
)
def test_bad_settings_are_refused_by_name(kwargs, message):
    with pytest.raises(OptionError, match=message):
        surface_options(**kwargs)


def test_an_unknown_option_names_its_layer():
    with pytest.raises(OptionError, match="llm_kwargs: unknown option 'anchr'. Did you mean 'anchor'"):
        surface_options(("call", {}), ("llm_kwargs", {"anchr": True}))


@pytest.mark.parametrize(
    ("value", "minimum", "optional", "ok"),
    [(1, 1, True, True), (None, 1, True, True), (None, 1, False, False), (0, 1, True, False), (0, 0, True, True),
     (True, 1, True, False), (2.0, 1, True, False), ("3", 1, True, False)],
)  # fmt: skip
def test_check_count(value, minimum, optional, ok):
    if ok:
        assert check_count(value, "n", minimum=minimum, optional=optional) == value
    else:
        with pytest.raises(OptionError, match=f"n: expected an integer >= {minimum}, but got"):
            check_count(value, "n", minimum=minimum, optional=optional)


def _calls(path: Path) -> tuple[set[str], list[str]]:
    """The names a module calls, and its ``ExtractOptions.parse(...)`` / ``ExtractOptions(<arguments>)`` calls."""
    called: set[str] = set()
    direct: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if not isinstance(node, ast.Call):
            continue
        fn = node.func
        if isinstance(fn, ast.Name):
            called.add(fn.id)
            if fn.id == "ExtractOptions" and (node.args or node.keywords):
                direct.append(f"line {node.lineno}: ExtractOptions(...)")
        elif isinstance(fn, ast.Attribute) and isinstance(fn.value, ast.Name) and fn.value.id == "ExtractOptions":
            direct.append(f"line {node.lineno}: ExtractOptions.{fn.attr}(...)")
    return called, direct


@pytest.mark.parametrize("surface", SURFACES)
def test_every_surface_maps_its_settings_through_surface_options(surface):
    called, direct = _calls(ROOT / surface)
    assert "surface_options" in called, f"{surface} does not call surface_options"
    assert not direct, f"{surface} builds options itself: {direct}"


def test_the_static_check_can_fail(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("def f(x):\n    return ExtractOptions.parse(x).over(ExtractOptions(temperature=2))\n")
    called, direct = _calls(probe)
    assert "surface_options" not in called
    assert sorted(direct) == ["line 2: ExtractOptions(...)", "line 2: ExtractOptions.parse(...)"]


def test_the_same_settings_give_the_same_options_on_every_surface(tiny_engine, monkeypatch):
    """ChatPCD, PCDLLM, the metadata extractor (through its PCDLLM), the server and the CLI: one mapping, one
    answer, each reached through surface_options (a spy counts the calls)."""
    pytest.importorskip("langchain_core")
    pytest.importorskip("llama_index.core")
    from pydantic import BaseModel

    import pcd_engine.options
    from pcd_engine.tools.cli import common
    from pcd_engine.tools.serve import answers, server
    from pcd_integrations import langchain, llamaindex
    from pcd_integrations.langchain import chat_model
    from pcd_integrations.llamaindex import extractor, llm, program

    seen: list[str] = []
    real = pcd_engine.options.surface_options

    def spy(*layers, **settings):
        seen.append(layers[0][0] if layers else "settings")
        return real(*layers, **settings)

    for module in (common, answers, server, chat_model, program, llm, extractor):
        monkeypatch.setattr(module, "surface_options", spy)
    options = {"anchor": False}
    chat = langchain.ChatPCD(engine=tiny_engine, temperature=2.0, timeout=5, max_tokens=7, options=options)
    pcd_llm = llamaindex.PCDLLM(engine=tiny_engine, temperature=2.0, timeout=5, max_tokens=7, options=options)

    class Tags(BaseModel):
        ok: bool

    tagger = llamaindex.PCDMetadataExtractor(Tags, llm=pcd_llm)
    expected = real(("options", options), temperature=2.0, timeout=5, max_tokens=7)
    assert chat._call_options() == pcd_llm.extract_options == tagger._call_options() == expected

    serving = server.Server(tiny_engine, "pcd", 1000, 7, RequestLimits(), 1.0)
    got = answers.extract_options(serving, options, 2.0, 7)  # a 7-token reply: each value within it
    assert got == real(("options", options), temperature=2.0, max_tokens=7)  # the server's limits are its own
    flags = argparse.Namespace(
        strategy=None, no_anchor=True, temperature=2.0, max_tokens=7, memory_budget_mb=None, instructions=None,
        no_list_choices=False, quoted_booleans=False, calibration=None, min_probability=None, correction=None,
        label_orders=None,
    )  # fmt: skip
    assert common.extract_options(flags) == real(("options", options), temperature=2.0, max_tokens=7)
    assert {"ChatPCD options", "PCDLLM options", "PCDMetadataExtractor options", "pcd", "pcd flags"} <= set(seen)
