"""The one rule for an open value: what the model wrote, when it is complete and valid; otherwise the nearest valid
value (closed where it was cut, cut back to its last complete item, the field's default, the smallest value its schema
accepts), and what was done, so that a result says it (issue 45: every value valid).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from pcd_engine.schema import FieldSpec
from pcd_engine.schema.smallest import smallest_value

__all__ = ["complete_value", "cut_backs", "walk_json"]

CUT_BACKS = 64
"""The most cut-back candidates tried for one cut value."""


def walk_json(text: str) -> Iterator[tuple[str, bool, tuple[str, ...]]]:
    """Walk a JSON text character by character, strings respected.

    Yields:
        ``(char, in_string, closers)`` after each character: whether it is inside a string, and the characters
        that would close the arrays and objects still open, outermost first.
    """
    stack: list[str] = []
    in_string = escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "{[":
            stack.append("}" if ch == "{" else "]")
        elif ch in "}]" and stack:
            stack.pop()
        yield ch, in_string, tuple(stack)


def close_text(text: str) -> str:
    """The characters that close a cut JSON text (the caller strips a trailing backslash first): an open
    string's quote, then the open arrays and objects, innermost first."""
    _ch, in_string, closers = next(iter(reversed(list(walk_json(text)))), ("", False, ()))
    return ('"' if in_string else "") + "".join(reversed(closers))


def cut_backs(text: str) -> list[str]:
    """A cut JSON text cut back to each of its complete items, longest first: the text before each comma (and
    after each opening bracket) outside strings, closed (the last, unfinished item dropped)."""
    out = []
    for i, (ch, in_string, closers) in enumerate(walk_json(text)):
        if in_string:
            continue
        if ch == ",":
            out.append(text[:i] + "".join(reversed(closers)))
        elif ch in "[{":
            out.append(text[: i + 1] + "".join(reversed(closers)))
    return out[::-1][:CUT_BACKS]


def complete_value(spec: FieldSpec, text: str, *, truncated: bool, fill: bool = True) -> tuple[Any, str, bool, str]:
    """A generated JSON text as a valid value of ``spec``, by the one rule: as written when complete and valid; a
    cut value closed where it was cut, or else (``fill``) cut back to its last complete item that is valid; otherwise
    (``fill``) the field's default, or else the smallest value its schema accepts; null only when there is none.

    Args:
        spec: The open field.
        text: Its JSON text as generated.
        truncated: Whether the text was cut at the field's token limit.
        fill: Whether to go past closing (an open field's value); a whole reply (``False``) keeps what was written.

    Returns:
        ``(value, text, valid, how)``, ``how`` as :attr:`~pcd_engine.generate.open_rows.Generated.how` names it.
    """
    if truncated:
        trimmed = text.rstrip("\\")
        candidates = [("closed", trimmed + close_text(trimmed))]
        candidates += [("cut back", c) for c in cut_backs(trimmed)] if fill else []
    else:
        candidates = [("written", text)]
    for how, candidate in candidates:
        try:
            value = json.loads(candidate)
        except json.JSONDecodeError:
            continue
        if spec.allows(value):
            return value, candidate, True, how
    if fill:
        for how, (found, value) in (("default", spec.default), ("smallest", smallest_value(spec.value_schema))):
            if found and spec.allows(value):
                return value, text, True, how
    return None, text, False, "none"
