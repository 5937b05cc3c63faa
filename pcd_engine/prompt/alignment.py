"""Where the prompt's tail begins, and how lines written after it are cut into tokens.

The cached preamble ends at a boundary token (the template's last control token before the answer), so that the tail
(everything from there on, answers included) tokenizes the same way whatever the document. :func:`tail_tokens`
tokenizes the tail and checks the boundary stayed one token; :func:`align_lines` tokenizes lines after it (label
lines for a scored tree, key lines for open rows), cuts each at a character, and finds where they part from the
tail, refusing any line that would re-tokenize the tail or the boundary.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pcd_engine.errors import PromptAlignmentError

if TYPE_CHECKING:
    from pcd_engine.prompt.chat_prompt import TokenizerView

__all__ = ["AlignedLines", "align_lines", "common_prefix", "tail_tokens"]


def tail_tokens(tokenizer: TokenizerView, boundary_text: str, tail_text: str) -> tuple[list[int], int]:
    """Token ids of ``boundary_text + tail_text`` and how many of them are the boundary.

    Raises:
        PromptAlignmentError: If the boundary merged with the tail text.
    """
    ids = tokenizer.encode(boundary_text + tail_text)
    boundary_ids = tokenizer.encode(boundary_text) if boundary_text else []
    if ids[: len(boundary_ids)] != boundary_ids:
        raise PromptAlignmentError(
            f"Prompt tail: expected {boundary_text!r} to stay one token before the tail, but it merged with the text."
        )
    return ids, len(boundary_ids)


@dataclass(frozen=True)
class AlignedLines:
    """Lines tokenized after the tail, and where they part from it.

    Attributes:
        tail_ids: The tail's tokens after the boundary token.
        causal_len: How many of them every line shares (they are fed causally; the lines' own tokens follow).
        paths: Each line's own tokens after those.
        covered: Per line, how many characters of ``boundary_text + tail_text + line`` its tokens cover.
    """

    tail_ids: tuple[int, ...]
    causal_len: int
    paths: tuple[tuple[int, ...], ...]
    covered: tuple[int, ...]


def align_lines(
    tokenizer: TokenizerView,
    *,
    boundary_text: str,
    tail_text: str,
    lines: Sequence[str],
    ends: Sequence[int],
    follow: str,
    through: bool,
    names: Sequence[str],
    what: str,
) -> AlignedLines:
    """Tokenize each line after the tail (with ``follow`` after it, so the last token splits the way it will in
    the answer) and cut it at a character: the one scored tree and the open rows both start this way.

    Args:
        tokenizer: The model's tokenizer.
        boundary_text: The special token that starts the tail, or ``""``.
        tail_text: The tail before the lines.
        lines: The lines (for example ``\n  "key": value,``).
        ends: Per line, the character of the line (counted from its start) to cut at.
        follow: Text written after each line while tokenizing.
        through: Keep the token that covers the cut character (``True``), or stop before it (``False``).
        names: Per line, the field it belongs to, for messages.
        what: What the lines are, for messages.

    Raises:
        PromptAlignmentError: If a cut has no token, the lines change the boundary token, or a line has no tokens
            of its own after the shared tail.
    """
    base, skip = tail_tokens(tokenizer, boundary_text, tail_text)
    prefix = boundary_text + tail_text
    encoded = tokenizer.hf([prefix + line + follow for line in lines], add_special_tokens=False,
                           return_offsets_mapping=True)  # fmt: skip
    start, cut_ids, covered = len(base), [], []
    for name, end, ids, offsets in zip(names, ends, encoded["input_ids"], encoded["offset_mapping"], strict=True):
        at = len(prefix) + end
        crossing = next((i for i, (_s, e) in enumerate(offsets) if e > at), None)
        if crossing is None and through:
            raise PromptAlignmentError(f"Field {name!r}: expected a token covering the character at {end} of its line.")
        cut = len(ids) if crossing is None else crossing + int(through)
        cut_ids.append(list(ids)[:cut])
        covered.append(max((e for _s, e in offsets[:cut]), default=0))
        start = min(start, common_prefix(base, cut_ids[-1]))
    if start < skip:
        raise PromptAlignmentError(
            f"Prompt tail: expected the {what} lines to leave the boundary token {boundary_text!r} intact, but they "
            "changed it."
        )
    for name, ids in zip(names, cut_ids, strict=True):
        if len(ids) <= start:
            raise PromptAlignmentError(f"Field {name!r}: expected {what} tokens after the tail, but got none.")
    paths = tuple(tuple(ids[start:]) for ids in cut_ids)
    return AlignedLines(tuple(base[skip:]), start - skip, paths, tuple(covered))


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading tokens ``a`` and ``b`` share."""
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i
