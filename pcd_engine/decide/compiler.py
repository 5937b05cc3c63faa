"""Labels to token tries, compiled in the exact context the model sees.

Every allowed value of every field in a wave is written as the complete JSON line the model would produce after
the prompt tail, tokenized *together with* the tail, and cut after the token that covers the closing comma. The
lines of all fields go into one trie, so shared prefixes (the indent, a key, ``"1_`` in ``1_HOUR`` and
``12_HOURS``) are computed once::

    tail: ... assistant\\n{            (causal; its last token gives the root distribution)
                 |
               "\\n  "                      node 0 ─ shared by every field of the wave
               /          \\
        ' "', 'deadline', '":'   ' "', 'refund', '":'
            |                              |
          ' "'                     ┌──────┴───────┐
           |                     ' true'  ' false'   ' "' ── 'true' ...   (surface forms)
          '1' ── '_HOUR' ── '",'    |         |
           └── '2' ── '_HOURS' ── '",'  ','   ','
                   ▲
                   decision lands here: the first token where labels differ

Each node is one token. Its log-probability is read from its parent's output (the root's parent is the last
causal token). Only nodes with children are fed to the model ("packed"); leaves are looked up in their
parent's distribution. If the tail tokenizes differently alone than before a line, the tree starts at the
first token where they differ, so nothing is ever scored at a misaligned position.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pcd_engine.errors import PromptAlignmentError
from pcd_engine.prompt.alignment import align_lines
from pcd_engine.prompt.chat_prompt import TokenizerView, field_line, surface
from pcd_engine.schema import FieldSpec, Label, flag_key
from pcd_engine.trees import TokenTree, TrieBuilder

__all__ = [
    "CompiledWave",
    "FieldTrie",
    "LabelPath",
    "TokenTree",
    "compile_wave",
    "questions",
    "written_value",
]


@dataclass(frozen=True)
class LabelPath:
    """The token path of one (label, surface form) of a field.

    Attributes:
        label: Index of the label in the field's labels.
        surface: Index of the surface form in the label's surfaces.
        nodes: Tree node ids, one per token, root side first.
        ident: Index into ``nodes`` of the identifying node: the first node whose subtree holds only this
            label's paths (within the field).
    """

    label: int
    surface: int
    nodes: tuple[int, ...]
    ident: int


@dataclass(frozen=True)
class FieldTrie:
    """One field's part of the wave's tree.

    Attributes:
        spec: The field.
        paths: One path per (label, surface form).
        decision_depth: Number of leading tokens shared by all of the field's paths; the decision lands on
            the token after them, and probabilities and masses are measured from there.
    """

    spec: FieldSpec
    paths: tuple[LabelPath, ...]
    decision_depth: int


@dataclass(frozen=True)
class CompiledWave:
    """The compiled tree of one wave of fields, for one tail text.

    Attributes:
        tail_ids: Token ids of the tail text after the boundary special token, as the prompt must end.
        causal_len: How many of ``tail_ids`` precede the tree; the rest is replaced by each path.
        tree: The trie of every path of every field of the wave.
        fields: The fields, each with its paths into ``tree``.
    """

    tail_ids: tuple[int, ...]
    causal_len: int
    tree: TokenTree
    fields: tuple[FieldTrie, ...]


def compile_wave(
    tokenizer: TokenizerView, fields: Sequence[FieldSpec], *, boundary_text: str, tail_text: str
) -> CompiledWave:
    """Compile ``fields`` into one token trie after ``boundary_text + tail_text``.

    Args:
        tokenizer: The model's tokenizer.
        fields: Fields with two or more labels to decide together.
        boundary_text: The special token that starts the tail (tokenized as one token), or ``""``.
        tail_text: The text from the boundary to the point where the fields' lines start.

    Returns:
        The compiled wave.

    Raises:
        PromptAlignmentError: If the tail and the lines cannot be aligned at a token boundary.
    """
    entries = [
        (f, li, si, field_line(spec.name, text))
        for f, spec in enumerate(fields)
        for li, label in enumerate(spec.labels)
        for si, text in enumerate(label.surfaces)
    ]
    aligned = align_lines(
        tokenizer,
        boundary_text=boundary_text,
        tail_text=tail_text,
        lines=[line for *_, line in entries],
        ends=[len(line) - 1 for *_, line in entries],  # the comma after the value
        follow="\n",
        through=True,
        names=[fields[f].name for f, *_ in entries],
        what="value",
    )
    trie = TrieBuilder()
    per_field: list[list[tuple[int, int, tuple[int, ...]]]] = [[] for _ in fields]
    for (f, li, si, _line), rel in zip(entries, aligned.paths, strict=True):
        per_field[f].append((li, si, tuple(trie.add(rel))))
    tries = [_field_trie(spec, items) for spec, items in zip(fields, per_field, strict=True)]
    with_children = set(trie.parents)
    tree = TokenTree(
        tokens=tuple(trie.tokens),
        parents=tuple(trie.parents),
        depths=tuple(trie.depths),
        packed=tuple(i for i in range(len(trie.tokens)) if i in with_children),
    )
    return CompiledWave(tail_ids=aligned.tail_ids, causal_len=aligned.causal_len, tree=tree, fields=tuple(tries))


def _field_trie(spec: FieldSpec, items: list[tuple[int, int, tuple[int, ...]]]) -> FieldTrie:
    """One field's label paths in the wave's trie, with the depth where its labels part and where each label
    becomes the only one below its node.

    Raises:
        PromptAlignmentError: If one label's tokens are a prefix of another's.
    """
    leaves = {chain[-1] for *_, chain in items}
    for *_, chain in items:
        if any(n in leaves for n in chain[:-1]):
            raise PromptAlignmentError(
                f"Field {spec.name!r}: expected no label's tokens to be a prefix of another's, but the tokenizer "
                "produced one. Rename the labels."
            )
    depth = min(len(n) for *_, n in items)
    for i in range(depth):
        if len({n[i] for *_, n in items}) != 1:
            depth = i
            break
    labels_under: dict[int, set[int]] = {}
    for li, _si, chain in items:
        for node in chain[depth:]:
            labels_under.setdefault(node, set()).add(li)
    paths = []
    for li, si, chain in items:
        ident = next(i for i in range(depth, len(chain)) if labels_under[chain[i]] == {li})
        paths.append(LabelPath(li, si, chain, ident))
    return FieldTrie(spec, tuple(paths), depth)


def questions(spec: FieldSpec) -> tuple[FieldSpec, ...]:
    """The closed questions that decide ``spec``: the field itself, or one yes/no question per label of a
    multi-label field.

    A multi-label field ``tags`` with labels ``"x"`` and ``"y"`` is asked as the flags object the instructions
    describe, one flag at a time and each as if it were the object's first key, so that every flag is decided
    in the same pass and independently of the others' answers::

        \\n  "tags": {"x": true},        \\n  "tags": {"y": true},
        \\n  "tags": {"x": false},       \\n  "tags": {"y": false},
    """
    if spec.kind != "multi":
        return (spec,)
    out = []
    for label in spec.labels:
        key = json.dumps(flag_key(label.value), ensure_ascii=False)
        yes = Label(True, tuple(f"{{{key}: {s}}}" for s in ("true", '"true"')))
        no = Label(False, tuple(f"{{{key}: {s}}}" for s in ("false", '"false"')))
        out.append(FieldSpec(spec.name, "boolean", (yes, no), spec.description))
    return tuple(out)


def written_value(spec: FieldSpec, value: Any, *, quoted_booleans: bool = False) -> str:
    """The JSON text of ``value`` as it is written into the prompt for later waves and the open rows
    (``quoted_booleans`` writes ``"true"`` / ``"false"``, as the instructions then describe them)."""
    if spec.kind == "multi":
        chosen = {spec.label_index(v) for v in value}
        flags: dict[str, Any] = {flag_key(label.value): i in chosen for i, label in enumerate(spec.labels)}
        if quoted_booleans:
            flags = {k: json.dumps(v) for k, v in flags.items()}
        return json.dumps(flags, ensure_ascii=False)
    if spec.kind == "open":
        return json.dumps(value, ensure_ascii=False)
    index = spec.label_index(value)
    if index is None:
        raise ValueError(f"Field {spec.name!r}: {value!r} is not one of its labels.")
    return surface(spec.labels[index], quoted_booleans=quoted_booleans)
