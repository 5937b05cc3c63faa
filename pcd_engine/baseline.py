"""The autoregressive baseline: the same model writes the JSON token by token, greedily, from the same prompt.

Benchmarks measure pcd against it. It reports how valid the written object is: a parse error, missing keys,
extra keys, or values outside the allowed labels.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

from pcd_engine.schema import compile_schema

__all__ = ["BaselineResult", "generate_baseline", "json_object_closed"]


@dataclass(frozen=True)
class BaselineResult:
    """What the autoregressive baseline wrote and whether it is valid.

    Attributes:
        text: The JSON text, starting with the ``{`` that the prompt opened.
        values: The parsed object, or ``None`` on a parse error.
        valid: True when the object parses, has exactly the schema's keys, and every value is allowed.
        errors: What is wrong, in words.
        tokens: Generated tokens.
        forward_passes: Forward passes run.
        ms: Wall time of the generation.
    """

    text: str
    values: dict[str, Any] | None
    valid: bool
    errors: tuple[str, ...]
    tokens: int
    forward_passes: int
    ms: float


def json_object_closed(text: str) -> bool:
    """True once ``text`` (starting at ``{``) holds a complete top-level JSON object, strings respected."""
    depth, in_string, escaped = 0, False, False
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
            depth += 1
        elif ch in "}]":
            depth -= 1
            if depth == 0:
                return True
    return False


def _same(a: Any, b: Any) -> bool:
    return type(a) is type(b) and a == b


def generate_baseline(engine: Any, text: str, schema: Any, *, max_new_tokens: int | None = None) -> BaselineResult:
    """Let the engine's model write the JSON object greedily after the same prompt pcd uses.

    Args:
        engine: A loaded :class:`~pcd_engine.engine.Engine`.
        text: The document.
        schema: Anything :func:`~pcd_engine.schema.compile_schema` accepts.
        max_new_tokens: Token limit; defaults to 12 tokens per field plus 32.

    Returns:
        The text, the parsed values and the validity report.
    """
    compiled = compile_schema(schema)
    ids = engine.prompt_for(text, compiled)
    limit = max_new_tokens or 12 * len(compiled.fields) + 32
    tokenizer = engine.tokenizer
    eos = tokenizer.eos_ids

    def stop(out: list[int]) -> bool:
        return out[-1] in eos or json_object_closed("{" + tokenizer.decode(out))

    before = engine.backend.forward_passes
    started = time.perf_counter()
    out = engine.backend.generate_greedy(ids, max_new_tokens=limit, stop=stop)
    ms = (time.perf_counter() - started) * 1000
    body = tokenizer.decode([t for t in out if t not in eos])
    written = "{" + body
    errors: list[str] = []
    values: dict[str, Any] | None = None
    try:
        parsed = json.loads(written)
        if not isinstance(parsed, dict):
            errors.append(f"expected a JSON object, but got {type(parsed).__name__}")
        else:
            values = parsed
    except json.JSONDecodeError as exc:
        errors.append(f"parse error: {exc.msg} at character {exc.pos}")
    if values is not None:
        for spec in compiled.fields:
            if spec.name not in values:
                errors.append(f"missing key {spec.name!r}")
            elif not any(_same(values[spec.name], v) for v in spec.values):
                errors.append(f"invalid value for {spec.name!r}: {values[spec.name]!r}")
        known = {f.name for f in compiled.fields}
        errors.extend(f"extra key {k!r}" for k in values if k not in known)
    return BaselineResult(
        text=written,
        values=values,
        valid=not errors,
        errors=tuple(errors),
        tokens=len(out),
        forward_passes=engine.backend.forward_passes - before,
        ms=ms,
    )
