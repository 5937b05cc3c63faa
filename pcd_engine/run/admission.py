"""The checks a request passes before any model work: its text, its sizes, the model's window, the memory budget.

Each check counts only (tokens, labels, bytes); none runs the model, so a request that fails here has cost
nothing and left nothing cached. Messages blame what is too big: a field's token limit, the schema, or the text.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pcd_engine.backends.contract import Backend
from pcd_engine.decide.compiler import questions
from pcd_engine.errors import ContextError, LimitError
from pcd_engine.limits import RequestLimits
from pcd_engine.options import ExtractOptions
from pcd_engine.run.budget import PassBudget
from pcd_engine.schema import FieldSpec, Schema

__all__ = ["check_budget", "check_sizes", "check_text", "check_window"]


def check_text(text: Any, *, where: str = "text") -> str:
    """The document, stripped.

    Raises:
        ContextError: If ``text`` is not a string, holds only whitespace, or is not valid Unicode.
    """
    if not isinstance(text, str):
        raise ContextError(f"Context: expected {where} to be a str, but got {type(text).__name__}.")
    stripped = text.strip()
    if not stripped:
        raise ContextError(f"Context: expected {where} to contain some text, but got only whitespace or nothing.")
    try:
        stripped.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ContextError(
            f"Context: expected {where} to be valid Unicode, but it has a lone surrogate "
            f"{stripped[exc.start]!r} at character {exc.start}. Decode the text with errors='replace'."
        ) from None
    return stripped


def check_sizes(schema: Schema, open_fields: Sequence[FieldSpec], call: ExtractOptions) -> None:
    """The request's labels and generated tokens against its limits (``call`` is resolved: every field set).

    Raises:
        LimitError: If the schema has too many labels, or the open fields ask for too many tokens.
    """
    limits, default = call.limits or RequestLimits(), call.value_tokens
    labels = sum(len(q.labels) for spec in schema.fields if spec.scored for q in questions(spec))
    if limits.max_labels is not None and labels > limits.max_labels:
        raise LimitError(
            f"Labels: expected at most {limits.max_labels} allowed values in one request, but the schema has "
            f"{labels}. Split the schema or raise max_labels."
        )
    if limits.max_generated_tokens is None:
        return
    total = 0
    for spec in open_fields:
        own = spec.token_limit(default)
        if own > limits.max_generated_tokens:
            source = "its x-max-tokens" if spec.max_tokens else "max_tokens"
            raise LimitError(
                f"Field {spec.name!r}: expected a token limit of at most {limits.max_generated_tokens}, but "
                f"{source} asks for {own}. Lower it."
            )
        total += own
    if total > limits.max_generated_tokens:
        raise LimitError(
            f"Generated tokens: expected the open fields to ask for at most {limits.max_generated_tokens} tokens "
            f"in all, but their limits add up to {total}. Lower the fields' x-max-tokens or max_tokens."
        )


def check_window(
    backend: Backend,
    schema: Schema,
    open_fields: Sequence[FieldSpec],
    *,
    preamble_tokens: int,
    tail_tokens: int,
    prompt_tokens: int,
    limit: int,
) -> int:
    """The whole request against the model's window.

    Args:
        backend: The model's backend (its window).
        schema: The request's schema.
        open_fields: Its generated fields.
        preamble_tokens: Tokens of the cached preamble (the instructions).
        tail_tokens: Tokens of the tail before any answer.
        prompt_tokens: Tokens of the whole prompt, document included.
        limit: The default token limit of an open field.

    Returns:
        The most tokens the answers may add after the prompt.

    Raises:
        ContextError: If a field's token limit, the schema or the text cannot fit.
    """
    window = backend.max_context
    labels = [len(l.surfaces[0]) for f in schema.fields if f.scored for q in questions(f) for l in q.labels]
    answers = 0
    if open_fields:  # the rows' prompt also holds every closed answer
        answers = sum(
            12 + max(len(l.surfaces[0]) for l in q.labels) for f in schema.fields if f.scored for q in questions(f)
        )
    fixed = preamble_tokens + tail_tokens + 2
    for spec in open_fields:
        own = spec.token_limit(limit)
        if fixed + answers + own + 8 > window:
            source = "its x-max-tokens" if spec.max_tokens else "max_tokens"
            raise ContextError(
                f"Field {spec.name!r}: expected its token limit to fit the model's window of {window} tokens, "
                f"but {source} asks for {own} after a prompt of {fixed + answers}. Lower it."
            )
    deepest = 2 + max([*labels, *[8 + f.token_limit(limit) for f in open_fields]]) + answers
    if fixed + deepest > window:
        raise ContextError(
            f"Schema {schema.title!r}: expected its prompt to fit the model's window of {window} tokens, but the "
            f"instructions take {preamble_tokens} tokens and the answers up to {deepest}. Use fewer labels or fields."
        )
    if prompt_tokens + deepest > window:
        raise ContextError(
            f"Context: expected the prompt to fit the model's window of {window} tokens, but it needs "
            f"{prompt_tokens} tokens (plus up to {deepest} for the answers). Shorten the text."
        )
    return deepest


def check_budget(budget: PassBudget, *, prompt_tokens: int, deepest: int) -> None:
    """Whether the request can run within the memory budget at all: its longest root-to-leaf chain (or a pass of
    one token per open row) after the whole prompt and answers.

    Raises:
        LimitError: If even that does not fit.
    """
    if not budget.fits(past=prompt_tokens + deepest, new=1, rows=2):
        need = budget.backend.pass_bytes(past=prompt_tokens + deepest, new=1, rows=2)
        raise LimitError(
            f"Memory budget: expected a pass after this prompt to fit the budget of {budget.mib:.0f} MiB, "
            f"but even one token needs about {need / 2**20:.1f} MiB. Raise memory_budget_mb or shorten the text."
        )
