"""The baselines pcd is measured against: the same model writing the JSON token by token, from the same prompt.

* :func:`generate_baseline`: plain greedy autoregressive (AR) generation after the prompt's opening ``{``.
* :func:`generate_outlines`: greedy generation constrained to the schema's JSON Schema by outlines
  (``outlines_core``), through ``transformers``' ``generate`` on the engine's own PyTorch model. The prompt is
  pcd's prompt without the opening ``{``, which the grammar writes itself.

Both report how valid the written object is: a parse error, missing keys, extra keys, or values outside the
allowed labels. :data:`~pcd_engine.tools.comparators.BASELINES` names them, with the first pcd's greedy walk
(:mod:`pcd_engine.tools.greedy_walk`), for ``pcd bench`` and ``pcd eval`` (``--against``).
"""

from __future__ import annotations

import json
import time
import weakref
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pydantic_core

from pcd_engine.errors import BackendUnavailableError, ContextError, pip_install, require
from pcd_engine.generate.values import walk_json
from pcd_engine.schema import Schema, compile_schema

if TYPE_CHECKING:
    from pcd_engine.backends.torch import TorchBackend
    from pcd_engine.engine import Engine

__all__ = [
    "BaselineResult",
    "generate_baseline",
    "generate_outlines",
    "json_object_closed",
    "partial_pairs",
    "stream_baseline",
]


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
        setup_ms: One-off work before generation that a later call with the same schema skips (outlines compiling
            its token index); 0 when there was none or it was cached.
    """

    text: str
    values: dict[str, Any] | None
    valid: bool
    errors: tuple[str, ...]
    tokens: int
    forward_passes: int
    ms: float
    setup_ms: float = 0.0


def json_object_closed(text: str) -> bool:
    """True once ``text`` (starting at ``{``) holds a complete top-level JSON object, strings respected."""
    return any(ch == "}" and not in_string and not closers for ch, in_string, closers in walk_json(text))


def _check(compiled: Schema, written: str) -> tuple[dict[str, Any] | None, list[str]]:
    """Parse ``written`` and list what makes it an invalid answer to ``compiled``."""
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
        errors += compiled.grade(values).errors(values)
    return values, errors


def _result(
    compiled: Schema, written: str, tokens: int, passes: int, ms: float, setup_ms: float = 0.0
) -> BaselineResult:
    values, errors = _check(compiled, written)
    return BaselineResult(written, values, not errors, tuple(errors), tokens, passes, ms, setup_ms)


def partial_pairs(text: str) -> dict[str, Any]:
    """The top-level ``"key": value`` pairs readable in a possibly broken JSON object text.

    For showing what an autoregressive answer did write when the whole object does not parse (cut off, or
    followed by more text). pydantic_core's partial JSON parser reads it: a string cut in the middle is left
    out, a list or object cut in the middle keeps its complete items, and text after the object is ignored.
    """
    start = text.find("{")
    if start < 0:
        return {}
    try:
        value = pydantic_core.from_json(text[start:], allow_partial=True)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _default_limit(compiled: Schema, engine: Engine) -> int:
    """The AR answer's default token limit: 12 tokens per closed field, and per open field 12 plus its token limit
    (the field's own, else the engine's ``max_tokens``, the same limit pcd's open rows get), plus 32."""
    per_field = [12 if f.scored else 12 + f.token_limit(engine.options.max_tokens) for f in compiled.fields]
    return sum(per_field) + 32


def stream_baseline(
    engine: Engine, text: str, schema: Any, *, max_new_tokens: int | None = None
) -> Iterator[str | BaselineResult]:
    """:func:`generate_baseline`, streamed: the text each generated token adds, then the :class:`BaselineResult`.

    The schema and text are checked before the first token, so bad input raises before anything is yielded.

    Yields:
        ``str`` pieces of the written JSON (the opening ``{`` first), then one ``BaselineResult``.

    Raises:
        ContextError: If the prompt and the token limit do not fit the model's window (before any generation).
    """
    compiled = compile_schema(schema)
    ids = engine.prompt_for(text, compiled)
    limit = max_new_tokens or _default_limit(compiled, engine)
    _check_window(engine, ids, limit)
    return _stream(engine, compiled, ids, limit)


def _check_window(engine: Engine, ids: Sequence[int], limit: int) -> None:
    """The prompt plus the answer's token limit against the model's window, before any token is generated.

    Raises:
        ContextError: If they do not fit.
    """
    window = engine.backend.max_context
    if len(ids) + limit > window:
        raise ContextError(
            f"Context: expected the prompt and the answer to fit the model's window of {window} tokens, but the "
            f"prompt takes {len(ids)} tokens and the answer may take {limit}. Shorten the text."
        )


def _stream(engine: Engine, compiled: Schema, ids: list[int], limit: int) -> Iterator[str | BaselineResult]:
    tokenizer = engine.tokenizer
    eos = tokenizer.eos_ids
    before = engine.backend.forward_passes
    started = time.perf_counter()
    out: list[int] = []
    sent = "{"
    yield sent
    for token in engine.backend.stream_greedy(ids, max_new_tokens=limit):
        out.append(token)
        if token in eos:
            break
        written = "{" + tokenizer.decode(out)
        if len(written) > len(sent) and not written.endswith("\ufffd"):
            yield written[len(sent) :]
            sent = written
        if json_object_closed(written):
            break
    ms = (time.perf_counter() - started) * 1000
    written = "{" + tokenizer.decode([t for t in out if t not in eos])
    if len(written) > len(sent):
        yield written[len(sent) :]
    yield _result(compiled, written, len(out), engine.backend.forward_passes - before, ms)


def generate_baseline(engine: Engine, text: str, schema: Any, *, max_new_tokens: int | None = None) -> BaselineResult:
    """Let the engine's model write the JSON object greedily after the same prompt pcd uses.

    Generation stops at EOS, when the object closes, or at the token limit.

    Args:
        engine: A loaded :class:`~pcd_engine.engine.Engine`.
        text: The document.
        schema: Anything :func:`~pcd_engine.schema.compile_schema` accepts.
        max_new_tokens: Token limit; defaults to 12 tokens per closed field, 12 plus its ``max_tokens`` (or the
            engine's) per open field, plus 32.

    Returns:
        The text, the parsed values and the validity report.

    Raises:
        ContextError: If the prompt and the token limit do not fit the model's window (before any generation).
    """
    *_, result = stream_baseline(engine, text, schema, max_new_tokens=max_new_tokens)
    assert isinstance(result, BaselineResult)
    return result


# Per engine: the outlines model wrapper and one compiled logits processor per schema fingerprint.
_OUTLINES: weakref.WeakKeyDictionary[Any, tuple[Any, dict[str, Any]]] = weakref.WeakKeyDictionary()


def _torch_backend(engine: Engine) -> TorchBackend:
    from pcd_engine.backends.torch import TorchBackend

    backend = engine.backend
    if not isinstance(backend, TorchBackend):
        raise BackendUnavailableError(
            f"Outlines baseline: expected the torch backend (outlines drives a transformers model), but the engine "
            f"runs on {backend.name!r}. Load it with backend='torch'."
        )
    return backend


def outlines_model(engine: Engine) -> Any:
    """The engine's model wrapped for outlines (cached per engine); call it early to fail before any work.

    Raises:
        BackendUnavailableError: If outlines is not installed or the engine is not on the torch backend.
    """
    backend = _torch_backend(engine)
    (outlines,) = require("outlines", what="Outlines baseline", install=pip_install("bench"))
    if engine not in _OUTLINES:
        _OUTLINES[engine] = (outlines.from_transformers(backend.model, backend.tokenizer), {})
    return _OUTLINES[engine][0]


def _outlines_processor(engine: Engine, compiled: Schema) -> tuple[Any, float]:
    wrapped = outlines_model(engine)
    processors = _OUTLINES[engine][1]
    if compiled.fingerprint in processors:
        return processors[compiled.fingerprint], 0.0
    from outlines.backends import get_json_schema_logits_processor

    started = time.perf_counter()
    processor = get_json_schema_logits_processor("outlines_core", wrapped, json.dumps(compiled.json_schema()))
    processors[compiled.fingerprint] = processor
    return processor, (time.perf_counter() - started) * 1000


def generate_outlines(engine: Engine, text: str, schema: Any, *, max_new_tokens: int | None = None) -> BaselineResult:
    """Let the engine's model write the JSON object under outlines' JSON-Schema constraint, greedily.

    The constraint is the schema's :meth:`~pcd_engine.schema.Schema.json_schema` compiled by outlines' default
    JSON backend (``outlines_core``); generation is ``transformers``' ``generate`` with outlines' logits processor,
    which is what ``outlines.Generator`` runs, minus its own chat wrapping: the prompt is pcd's, up to the opening
    ``{``. The compiled processor is cached per engine and schema; its first compilation is reported as
    ``setup_ms``.

    Args:
        engine: A loaded :class:`~pcd_engine.engine.Engine` on the torch backend.
        text: The document.
        schema: Anything :func:`~pcd_engine.schema.compile_schema` accepts.
        max_new_tokens: Token limit; defaults to 12 tokens per closed field, 12 plus its ``max_tokens`` (or the
            engine's) per open field, plus 32.

    Returns:
        The text, the parsed values and the validity report (outlines output can still be cut by the limit).

    Raises:
        BackendUnavailableError: If outlines is not installed or the engine is not on the torch backend.
        ContextError: If the prompt and the token limit do not fit the model's window.
    """
    compiled = compile_schema(schema)
    processor, setup_ms = _outlines_processor(engine, compiled)
    import torch
    from transformers import LogitsProcessorList

    ids = engine.prompt_for(text, compiled)
    # The prompt ends with the answer's opening "{"; the grammar writes it, so it must not be in the prompt.
    opening = engine.tokenizer.decode(ids[-1:])
    if not opening.endswith("{"):
        raise BackendUnavailableError(
            f"Outlines baseline: expected the prompt's last token to open the answer with '{{', but got {opening!r}."
        )
    trimmed = opening[:-1]
    ids = ids[:-1] + (engine.tokenizer.encode(trimmed) if trimmed else [])
    limit = max_new_tokens or _default_limit(compiled, engine)
    _check_window(engine, ids, limit)
    model = _torch_backend(engine).model
    device = next(model.parameters()).device
    processor.reset()
    started = time.perf_counter()
    with torch.no_grad():
        out = model.generate(
            input_ids=torch.tensor([ids], device=device),
            attention_mask=torch.ones(1, len(ids), dtype=torch.long, device=device),
            logits_processor=LogitsProcessorList([processor]),
            max_new_tokens=limit,
            do_sample=False,
            pad_token_id=engine.backend.tokenizer.eos_token_id,
        )
    ms = (time.perf_counter() - started) * 1000
    new = out[0, len(ids) :].tolist()
    eos = engine.tokenizer.eos_ids
    written = engine.tokenizer.decode([t for t in new if t not in eos])
    return _result(compiled, written, len(new), len(new), ms, setup_ms)
