"""Opening a request, before its first wave: the checks and the tokenization that come before any model work
(:func:`admit`) and the schema preamble's prefill when it is not cached (:func:`prefill`). The lean a request opens
with is read by the batch layer (:func:`pcd_engine.run.batch.open_lean`), which can decide the content-free inputs.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from pcd_engine.backends.contract import Backend, Prefix
from pcd_engine.errors import PromptAlignmentError
from pcd_engine.limits import RequestLimits, Watch
from pcd_engine.options import ExtractOptions
from pcd_engine.run.admission import check_budget, check_sizes, check_window
from pcd_engine.run.budget import PassBudget
from pcd_engine.run.compile_cache import SchemaPrompt
from pcd_engine.run.host import Host
from pcd_engine.schema import Schema

__all__ = ["Admitted", "admit", "prefill"]


@dataclass(frozen=True)
class Admitted:
    """A request that passed every check, tokenized; nothing of the model has run.

    Attributes:
        prompt: The schema's prompt in the call's prompt format.
        prefix: The preamble's cached prefix, or ``None`` when it is still to be prefilled (:meth:`prefilled`).
        ids: The whole prompt's token ids (preamble, document, tail).
        budget: The memory budget of one pass.
        watch: The call's deadline and cancellation flag.
        tokenize_ms: Milliseconds spent on the checks and the tokenization.
    """

    prompt: SchemaPrompt
    prefix: Prefix | None
    ids: list[int]
    budget: PassBudget
    watch: Watch
    tokenize_ms: float

    def prefilled(self, host: Host, schema: Schema, call: ExtractOptions) -> tuple[Prefix, int, float]:
        """The preamble's prefix, prefilled now (and cached) when it was not: with the passes and milliseconds that
        took (0 when cached).

        Raises:
            RequestCancelled: If the call was cancelled, or ran out of time, before the prefill.
        """
        if self.prefix is not None:
            return self.prefix, 0, 0.0
        self.watch.check("the preamble prefill")
        before, tick = host.backend.thread_passes, time.perf_counter()
        prefix = host.prefill_prompt(schema, call.prompt_format, self.prompt, self.budget)
        return prefix, host.backend.thread_passes - before, (time.perf_counter() - tick) * 1000


def admit(
    host: Host, schema: Schema, call: ExtractOptions, document: str, *, cancelled: Callable[[], bool] | None = None
) -> Admitted:
    """Check a request and tokenize it, before any model work.

    Raises:
        LimitError: If the request needs more labels, tokens or memory than allowed.
        ContextError: If it does not fit the model's window.
        SchemaError: If an open field's JSON Schema cannot be constrained.
        PromptAlignmentError: If the document changed the tokenization of the prompt's tail.
        OptionError: If the call's calibration or head was fitted on another schema or model.
    """
    backend = host.backend
    call.decider.check(schema, host.model_id)
    open_fields = [f for f in schema.fields if not f.scored]
    check_sizes(schema, open_fields, call)
    for spec in open_fields:
        host.grammars.grammar(spec)  # llguidance must accept the value schema before any model work
    tick = time.perf_counter()
    prompt, prefix = host.cache.prompt(schema, call.prompt_format)
    ids = prompt.chat.request_ids(host.tokenizer, document, special_tokens=host.options.special_tokens)
    if tuple(ids[len(ids) - len(prompt.tail0_ids) :]) != prompt.tail0_ids:
        raise PromptAlignmentError(
            "Prompt tail: expected the request to end with the template's tail tokens, but the document changed "
            "their tokenization. Strip unusual trailing characters from the text."
        )
    deepest = check_window(
        backend,
        schema,
        open_fields,
        preamble_tokens=len(prompt.chat.preamble_ids),
        tail_tokens=len(prompt.tail0_ids),
        prompt_tokens=len(ids),
        limit=call.value_tokens,
    )
    budget = PassBudget.of(backend, call.memory_budget_mb)
    check_budget(budget, prompt_tokens=len(ids), deepest=deepest)
    watch = Watch((call.limits or RequestLimits()).time_limit_s, cancelled)
    return Admitted(prompt, prefix, ids, budget, watch, (time.perf_counter() - tick) * 1000)


def prefill(backend: Backend, prompt: SchemaPrompt, budget: PassBudget) -> Prefix:
    """Prefill a schema's preamble in causal chunks that fit the budget.

    Raises:
        LimitError: If not even one token of the instructions fits.
    """
    ids = prompt.chat.preamble_ids
    chunk = budget.fit(len(ids))
    if chunk < 1 and ids:
        raise budget.over("the schema's instructions")
    return backend.prefill(ids, chunk=chunk if chunk < len(ids) else None)
