"""The prompt: a schema rendered with the model's own chat template, split into a cached preamble and a tail.

Layout of one request (token boundaries are checked, never assumed)::

    | preamble (cached per schema)       | document block            | tail       | tree ...
    | <system turn: keys, labels, docs>  | <user turn: the document> | assistant  |
    |  ... up to just before the user's  |                           | turn, "{"  |
    |  text                              |                           |            |

The preamble depends only on the schema, so its KV cache is prefilled once and reused. The tail starts at the last
special token of the template (for example ``<|im_start|>``) so that the compiler can tokenize each field's JSON
line in exactly the context the model sees.
"""

from __future__ import annotations

import copy
import json
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pcd_engine.errors import PromptAlignmentError
from pcd_engine.options import PromptFormat
from pcd_engine.schema import FieldSpec, Label, Schema

__all__ = [
    "ChatPrompt",
    "TokenizerView",
    "describe_value",
    "field_line",
    "render_instructions",
    "surface",
    "render_chat",
]

_SENTINEL = "PCDDOCUMENTSENTINEL"
_DEFAULT_FORMAT = PromptFormat()
_FALLBACK_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] | capitalize }}: {{ m['content'] }}{{ end }}\n\n{% endfor %}"
    "{% if add_generation_prompt %}Assistant: {% endif %}"
)
"""The plain format for a tokenizer without a chat template. Each turn ends with the tokenizer's end-of-sequence
control token (``end``) where it has one: with nothing but text after the document, the document's last characters
and the tail's first ones merge into other tokens (``".\n\n"``, SentencePiece's ``"▁"``), and no tail could be
compiled once for every document."""
_HARMONY_TOKENS = frozenset({"<|start|>", "<|channel|>", "<|message|>", "<|end|>"})
_HARMONY_TEMPLATE = (
    "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\n"
    "Knowledge cutoff: 2024-06\n\nReasoning: low\n\n"
    "# Valid channels: analysis, commentary, final. Channel must be included for every message.<|end|>"
    "{% for m in messages %}"
    "{% if m['role'] == 'system' %}<|start|>developer<|message|># Instructions\n\n{{ m['content'] }}<|end|>"
    "{% elif m['role'] == 'assistant' %}<|start|>assistant<|channel|>final<|message|>{{ m['content'] }}<|end|>"
    "{% else %}<|start|>user<|message|>{{ m['content'] }}<|end|>{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|start|>assistant{% endif %}"
)
"""OpenAI's harmony format (gpt-oss), for a tokenizer that has its control tokens but no chat template (the npm
tokenizer packages, some GGUF conversions): a system message with the model's meta, the instructions as the
developer message, and every assistant turn on the ``final`` channel. gpt-oss checkpoints ship a template that
renders the same layout, which is used when present. ``openai-harmony`` renders this format too, but loads its
vocabulary from the network on first use, which pcd never does at run time."""
_HARMONY_ANSWER = "<|channel|>final<|message|>"
"""What opens the assistant's answer in harmony: the ``final`` channel, so the model answers at once instead of
reasoning first on the ``analysis`` channel (whose text pcd would have to generate and discard)."""


class TokenizerView:
    """The few tokenizer operations pcd needs, over a Hugging Face tokenizer.

    Args:
        tokenizer: A ``transformers`` tokenizer (a fast one, as every modern checkpoint ships).
    """

    def __init__(self, tokenizer: Any) -> None:
        self.hf = tokenizer
        self._plain_hf: Any = None
        self._lock = threading.Lock()
        decoder = getattr(tokenizer, "added_tokens_decoder", {}) or {}
        self.added_ids = frozenset(int(i) for i in decoder)
        self.added_text = {int(i): str(getattr(t, "content", t)) for i, t in decoder.items()}
        self.harmony = _HARMONY_TOKENS <= set(self.added_text.values())
        """Whether the vocabulary has OpenAI's harmony control tokens (gpt-oss)."""

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` with no BOS/EOS added; control strings (``<|im_end|>``) become control tokens."""
        return list(self.hf(text, add_special_tokens=False)["input_ids"])

    def encode_plain(self, text: str) -> list[int]:
        """Token ids of ``text`` read as plain text: a control string in it (``<|im_start|>system``) is split
        into ordinary tokens, so a document cannot open a turn of its own."""
        return list(self._plain()(text, add_special_tokens=False)["input_ids"])

    def _plain(self) -> Any:
        # A copy that always splits control strings: asking the shared tokenizer to split them per call flips a
        # flag on it, which a concurrent call on another thread would see. Only what a call mutates is copied: the
        # wrapper (shallow) and its Rust tokenizer; the Python vocabulary tables stay shared (a deep copy of them
        # took 7 s on a 262k vocabulary, against 2 s for the Rust tokenizer alone).
        with self._lock:
            if self._plain_hf is None:
                backend = getattr(self.hf, "_tokenizer", None)
                if hasattr(backend, "encode_special_tokens"):
                    plain = copy.copy(self.hf)
                    plain._tokenizer = copy.copy(backend)
                    plain._tokenizer.encode_special_tokens = True
                else:  # a slow tokenizer keeps its state in Python: copy all of it
                    plain = copy.deepcopy(self.hf)
                plain.split_special_tokens = True
                self._plain_hf = plain
            return self._plain_hf

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """Token ids of each text, with no BOS/EOS added."""
        if not texts:
            return []
        return [list(ids) for ids in self.hf(list(texts), add_special_tokens=False)["input_ids"]]

    def encode_with_offsets(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        """Token ids and ``(start, end)`` character offsets of each token."""
        enc = self.hf(text, add_special_tokens=False, return_offsets_mapping=True)
        return list(enc["input_ids"]), [tuple(o) for o in enc["offset_mapping"]]

    def decode(self, ids: Sequence[int]) -> str:
        """Text of ``ids``, special tokens kept."""
        return str(self.hf.decode(list(ids), skip_special_tokens=False))

    @property
    def eos_ids(self) -> frozenset[int]:
        """Ids that end a turn: the EOS token plus the template's end-of-turn tokens."""
        ids = set()
        if self.hf.eos_token_id is not None:
            ids.add(int(self.hf.eos_token_id))
        for i, text in self.added_text.items():
            if text in ("<|im_end|>", "<end_of_turn>", "<|eot_id|>", "<|end|>", "<|endoftext|>", "</s>"):
                ids.add(i)
        return frozenset(ids)


def render_instructions(schema: Schema, fmt: PromptFormat = _DEFAULT_FORMAT) -> str:
    """The system turn: what the schema is, and every key with its allowed values and description.

    Args:
        schema: The compiled schema.
        fmt: The prompt format: custom instructions, whether to list the choices, quoted booleans.
    """
    lines = []
    if schema.description:
        lines.append(schema.description.strip())
        lines.append("")
    if fmt.instructions is not None:
        lines.append(fmt.instructions.strip())
    else:
        lines.append(
            "Read the user's text and answer with one JSON object that has exactly these keys. "
            + (
                "Each key takes exactly one of its allowed values."
                if all(f.kind in ("boolean", "enum") for f in schema.fields)
                else "Each key takes a value of the kind described."
            )
        )
    lines.append("")
    for spec in schema.fields:
        lines.append(_describe(spec, fmt))
    return "\n".join(lines)


def surface(label: Label, *, quoted_booleans: bool = False) -> str:
    """The JSON text a label is written as: its canonical surface, or ``"true"`` / ``"false"`` for a boolean when
    booleans are quoted (and that spelling is the label's own)."""
    if quoted_booleans and isinstance(label.value, bool) and len(label.surfaces) > 1:
        return label.surfaces[1]
    return label.surfaces[0]


def _describe(spec: FieldSpec, fmt: PromptFormat) -> str:
    key = json.dumps(spec.name, ensure_ascii=False)
    true, false = ('"true"', '"false"') if fmt.quoted_booleans else ("true", "false")
    written = [surface(l, quoted_booleans=fmt.quoted_booleans) for l in spec.labels]
    if spec.kind == "boolean":
        allowed = f"{true} or {false}" if len(spec.labels) == 2 else "one of " + ", ".join(written)
    elif spec.kind == "enum":
        allowed = "one of " + ", ".join(written) if fmt.list_choices else "one of its allowed values"
    elif spec.kind == "multi":
        each = "each of " + ", ".join(written) if fmt.list_choices else "each of its allowed values"
        allowed = f"an object with a {true} or {false} flag for {each}"
        bounds = _item_bounds(spec.min_items, spec.max_items, noun=true)
        allowed += f" ({true} when it applies{'; ' + bounds if bounds else ''})"
    else:
        allowed = describe_value(spec.value_schema)
    text = f"- {key}: {allowed}"
    if spec.description:
        text += f". {spec.description.strip()}"
    return text


def _item_bounds(lo: int, hi: int | None, *, noun: str) -> str:
    """``'at least 1 and at most 2 <noun>'``, or ``""`` when there are no bounds."""
    parts = ([f"at least {lo}"] if lo else []) + ([f"at most {hi}"] if hi is not None else [])
    return f"{' and '.join(parts)} {noun}" if parts else ""


def describe_value(node: Any) -> str:
    """A short English description of a JSON Schema value, for the instructions (``'a string of at most 80
    characters'``, ``'a list of {"city": a string}'``)."""
    if not isinstance(node, dict):
        return "any JSON value"
    if "const" in node:
        return json.dumps(node["const"], ensure_ascii=False)
    if "enum" in node:
        return "one of " + ", ".join(json.dumps(v, ensure_ascii=False) for v in node["enum"])
    for key in ("anyOf", "oneOf"):
        if key in node:
            return " or ".join(describe_value(option) for option in node[key])
    kind = node.get("type")
    if isinstance(kind, list):
        return " or ".join(describe_value({**node, "type": k}) for k in kind)
    if kind == "string":
        text = "a string"
        if node.get("maxLength") is not None:
            text += f" of at most {node['maxLength']} characters"
        if node.get("pattern"):
            text += f" matching the pattern {node['pattern']}"
        return text
    if kind in ("integer", "number"):
        text = "an integer" if kind == "integer" else "a number"
        bounds = [f"{word} {node[k]}" for k, word in (("minimum", ">="), ("maximum", "<=")) if k in node]
        return text + (f" ({', '.join(bounds)})" if bounds else "")
    if kind in ("boolean", "null"):
        return "true or false" if kind == "boolean" else "null"
    if kind == "array":
        limits = _item_bounds(node.get("minItems", 0), node.get("maxItems"), noun="items")
        return "a list of " + describe_value(node.get("items", {})) + (", " + limits if limits else "")
    if kind == "object" or "properties" in node:
        props = node.get("properties") or {}
        if props:
            inner = ", ".join(f"{json.dumps(k, ensure_ascii=False)}: {describe_value(v)}" for k, v in props.items())
            return "an object {" + inner + "}"
        return "an object whose values are " + describe_value(node.get("additionalProperties", {}))
    return "JSON matching " + json.dumps(node, ensure_ascii=False)


def field_line(name: str, surface: str) -> str:
    """The JSON line that writes ``surface`` as the value of key ``name``, led by a newline, ended by a comma."""
    return f"\n  {json.dumps(name, ensure_ascii=False)}: {surface},"


@dataclass(frozen=True)
class ChatPrompt:
    """A schema's prompt, split at the points where its KV cache and its tail begin.

    Attributes:
        prefix_text: Everything before the document (system turn and the user turn's opening).
        suffix_text: Everything after the document, up to and including the ``{`` that opens the answer.
        preamble_ids: Token ids of the cached preamble; every request's token ids start with these.
        boundary_text: The special token where the tail starts, or ``""`` when the template has none.
        tail_text: The text after ``boundary_text`` up to the end of ``suffix_text``.
        system_folded: True when the template has no system role and the instructions went into the user turn.
        plain_from: Where, in ``prefix_text``, the plain-text stretch around the document starts: just after the
            template's last control token before it (0 when there is none).
        plain_until: Where, in ``suffix_text``, that stretch ends: at the template's first control token after
            the document (its length when there is none).
    """

    prefix_text: str
    suffix_text: str
    preamble_ids: tuple[int, ...]
    boundary_text: str
    tail_text: str
    system_folded: bool
    plain_from: int = 0
    plain_until: int = -1

    @classmethod
    def build(cls, tokenizer: TokenizerView, schema: Schema, fmt: PromptFormat = _DEFAULT_FORMAT) -> ChatPrompt:
        """Render ``schema`` with the tokenizer's chat template and find the preamble and tail boundaries.

        Templates without a system role get the instructions at the top of the user turn. Qwen3-style thinking
        is switched off with ``enable_thinking=False`` unless ``fmt.chat_template_kwargs`` says otherwise.

        Args:
            tokenizer: The model's tokenizer.
            schema: The compiled schema.
            fmt: The prompt format.
        """
        system = render_instructions(schema, fmt)
        sentinel = _SENTINEL
        while sentinel in system:  # a description may quote the sentinel; the document goes where ours is
            sentinel += "X"
        text, folded = _render(tokenizer, system, sentinel, dict(fmt.chat_template_kwargs))
        if text.count(sentinel) != 1:
            raise PromptAlignmentError(
                "Chat template: expected the user's text to appear once in the rendered prompt, but it appears "
                f"{text.count(sentinel)} times."
            )
        at = text.index(sentinel)
        prefix_text, suffix_text = text[:at], text[at + len(sentinel) :] + "{"
        ids, offsets = tokenizer.encode_with_offsets(text)
        # The preamble ends one token before the document, so a merge at the seam cannot move its boundary.
        inside = sum(1 for _, end in offsets if end <= at)
        preamble = tuple(ids[: max(0, inside - 1)])
        boundary, tail = "", suffix_text
        after = at + len(sentinel)
        controls = [(offsets[i], tok) for i, tok in enumerate(ids) if tok in tokenizer.added_ids]
        for (boundary_start, boundary_end), tok in controls:
            if boundary_start >= after:
                boundary = (
                    text[boundary_start:boundary_end] if boundary_end > boundary_start else tokenizer.added_text[tok]
                )
                tail = (text + "{")[boundary_start + len(boundary) :]
        plain_from = max((end for (_start, end), _tok in controls if end <= at), default=0)
        plain_until = min((start for (start, _end), _tok in controls if start >= after), default=len(text) + 1) - after
        return cls(prefix_text, suffix_text, preamble, boundary, tail, folded, plain_from, plain_until)

    def request_ids(self, tokenizer: TokenizerView, document: str, *, special_tokens: bool = False) -> list[int]:
        """Token ids of the full prompt for ``document``, checked to start with the cached preamble.

        Args:
            tokenizer: The model's tokenizer.
            document: The text to classify.
            special_tokens: Read control strings in the document as control tokens. By default the document is
                plain text, tokenized apart from the template around it, so that ``<|im_end|>`` in a document
                cannot end its turn.

        Raises:
            PromptAlignmentError: If the document changed how the preamble tokenizes.
        """
        if special_tokens:
            ids = tokenizer.encode(self.prefix_text + document + self.suffix_text)
        else:
            # The template's control tokens bound the stretch around the document, so tokenizing the stretch
            # alone (as plain text) gives the same tokens as the whole prompt would, bar control strings.
            until = len(self.suffix_text) if self.plain_until < 0 else self.plain_until
            stretch = self.prefix_text[self.plain_from :] + document + self.suffix_text[:until]
            ids = tokenizer.encode(self.prefix_text[: self.plain_from]) + tokenizer.encode_plain(stretch)
            ids += tokenizer.encode(self.suffix_text[until:])
        if tuple(ids[: len(self.preamble_ids)]) != self.preamble_ids:
            raise PromptAlignmentError(
                "Preamble: expected the request to start with the cached schema preamble tokens, but the document "
                "changed their tokenization. Strip unusual leading characters from the text."
            )
        return ids


def render_chat(
    tokenizer: TokenizerView, turns: Sequence[Mapping[str, str]], *, extra: Mapping[str, Any] | None = None
) -> tuple[str, bool]:
    """The chat template's text for ``turns``, up to the opening of the assistant's turn.

    A template that refuses a system role, or drops it, gets the system turns folded into the first other turn
    (separated by a blank line). A tokenizer without a template gets a plain ``Role: text`` one, each turn ended
    by the end-of-sequence control token. Harmony (gpt-oss) tokenizers get their own format, and the assistant's
    turn is opened on the ``final`` channel.

    Args:
        tokenizer: The model's tokenizer.
        turns: ``{"role", "content"}`` messages.
        extra: More keyword arguments for ``apply_chat_template`` (thinking is off unless they turn it on).

    Returns:
        The text, and whether the system turns were folded.
    """
    hf = tokenizer.hf
    template = getattr(hf, "chat_template", None)
    kwargs: dict[str, Any] = {"enable_thinking": False, **(extra or {})}
    if not template and tokenizer.harmony:
        template = _HARMONY_TEMPLATE
    elif not template:
        template = _FALLBACK_TEMPLATE
        eos = getattr(hf, "eos_token", None)
        kwargs["end"] = eos if eos and hf.convert_tokens_to_ids(eos) in tokenizer.added_ids else ""
    kwargs.update(tokenize=False, add_generation_prompt=True, chat_template=template)
    text, folded = _apply_template(hf, turns, kwargs)
    if tokenizer.harmony and text.endswith("<|start|>assistant"):
        text += _HARMONY_ANSWER
    return text, folded


def _apply_template(hf: Any, turns: Sequence[Mapping[str, str]], kwargs: dict[str, Any]) -> tuple[str, bool]:
    system = [t["content"] for t in turns if t["role"] == "system"]
    if not system:
        return str(hf.apply_chat_template([dict(t) for t in turns], **kwargs)), False
    try:
        text = str(hf.apply_chat_template([dict(t) for t in turns], **kwargs))
        if all(s in text for s in system):
            return text, False
    except Exception:  # noqa: BLE001 - templates raise anything ("System role not supported"); fold instead.
        pass
    rest = [dict(t) for t in turns if t["role"] != "system"] or [{"role": "user", "content": ""}]
    rest[0]["content"] = "\n\n".join(system) + "\n\n" + rest[0]["content"]
    return str(hf.apply_chat_template(rest, **kwargs)), True


def _render(tokenizer: TokenizerView, system: str, user: str, extra: dict[str, Any]) -> tuple[str, bool]:
    turns = [{"role": "system", "content": system}, {"role": "user", "content": user}]
    text, folded = render_chat(tokenizer, turns, extra=extra)
    if user not in text:
        raise PromptAlignmentError(
            "Chat template: expected the rendered prompt to contain the user's text, but the template dropped it."
        )
    return text, folded
