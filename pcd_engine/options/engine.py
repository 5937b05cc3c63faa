"""The engine's own settings: :class:`EngineOptions`, the defaults every call's options are laid over."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from pcd_engine.deciders.corrections import correction_named
from pcd_engine.errors import OptionError, check_count
from pcd_engine.limits import DEFAULT_LIMITS, RequestLimits
from pcd_engine.options.extract import ExtractOptions, PromptFormat

__all__ = ["EngineOptions", "check_batch_size"]


@dataclass(frozen=True)
class EngineOptions:
    """Engine-wide settings.

    Attributes:
        anchor: Decide the first field alone and write it into the prompt before the others (one extra pass,
            usually better answers). ``depends_on`` adds waves either way; a later wave's prompt holds the
            anchor's answer and the answers its fields depend on, not every earlier answer.
        prompt_cache_size: How many schema preambles keep their KV cache (least recently used are dropped).
        memory_budget_mb: Estimated peak memory of one pass, which every pass keeps within: the preamble prefill and
            the document are fed in causal chunks, a wave's tree is split into passes, and open rows that cannot
            fit are refused before any work with :class:`~pcd_engine.errors.LimitError`. ``None`` takes the
            backend's default (1 GiB on CPU, a quarter of the GPU's memory up to 16 GiB).
        marginal_max_labels: Fields with up to this many labels use the marginal strategy by default; larger
            ones use the trie walk.
        top_k: How many alternatives each field reports.
        low_mass_warning: Warn when a field's candidate mass is below this.
        max_tokens: The most tokens generated for one open field's value (a field's own ``max_tokens`` wins);
            a value cut there is flagged ``truncated``.
        draft_tokens: The most tokens an open row proposes from the document per pass (see
            :class:`ExtractOptions`); 0 turns drafting off.
        limits: Per-request limits (labels, generated tokens, time); a call's ``limits`` replaces them. The
            default bounds time alone (:data:`~pcd_engine.limits.DEFAULT_LIMITS`: 600 s a request).
        special_tokens: Read control strings in documents (``<|im_end|>``, ``<|im_start|>system``) as the
            template's control tokens. Off by default: a document is plain text and cannot open a turn.
        strategy: The default strategy (see :class:`ExtractOptions`); ``None`` lets the
            engine choose per field.
        temperature: The default temperature of the reported probabilities.
        staging: The default staging (see :class:`ExtractOptions`).
        pass_cost: ``(fixed_ms, node_ms)``: what one forward pass costs on this device, for the staging cost
            model; ``None`` measures it with a few timed passes the first time a wave could be staged.
        prompt: The default prompt format (custom instructions, listing the choices, quoted booleans, chat
            template arguments).
        batch_size: The most documents :meth:`~pcd_engine.engine.Engine.extract_many` decides in one pass;
            ``None`` lets the engine choose (PyTorch: 4 on CPU; MLX: 1 on CPU; 32 on a GPU or Metal; 1 where the
            backend does not batch documents).
            The memory budget and the documents' lengths may split a batch further.
        correction: The default correction of the model's label lean (see :class:`ExtractOptions`):
            ``"auto"``, the content-free lean (chosen from ``benchmarks/bench_corrections.py``'s table); ``"none"``
            decides with the model's own distributions.
    """

    anchor: bool = True
    prompt_cache_size: int = 8
    memory_budget_mb: float | None = None
    marginal_max_labels: int = 32
    top_k: int = 5
    low_mass_warning: float = 0.1
    max_tokens: int = 64
    draft_tokens: int = 8
    limits: RequestLimits = DEFAULT_LIMITS
    special_tokens: bool = False
    strategy: str | None = None
    temperature: float = 1.0
    staging: str = "auto"
    pass_cost: tuple[float, float] | None = None
    prompt: PromptFormat = field(default_factory=PromptFormat)
    batch_size: int | None = None
    correction: str = "auto"

    def __post_init__(self) -> None:
        check_batch_size(self.batch_size)
        correction_named(self.correction)  # refuses an unknown name
        check_count(self.max_tokens, "max_tokens", optional=False)
        check_count(self.prompt_cache_size, "prompt_cache_size", optional=False)
        if self.memory_budget_mb is not None and self.memory_budget_mb <= 0:
            raise OptionError(f"memory_budget_mb: expected a positive number, but got {self.memory_budget_mb}.")
        check_count(self.top_k, "top_k", optional=False)
        if not isinstance(self.limits, RequestLimits):
            raise OptionError(f"limits: expected a RequestLimits, but got {type(self.limits).__name__}.")
        if not isinstance(self.prompt, PromptFormat):
            raise OptionError(f"prompt: expected a PromptFormat, but got {type(self.prompt).__name__}.")
        cost = self.pass_cost
        if cost is not None and (
            not isinstance(cost, tuple)
            or len(cost) != 2
            or not all(isinstance(c, (int, float)) and not isinstance(c, bool) and math.isfinite(c) for c in cost)
            or min(cost) < 0
        ):
            raise OptionError(f"pass_cost: expected (fixed_ms, node_ms), two numbers >= 0, but got {cost!r}.")
        self.defaults()  # the defaults must themselves be valid options

    def defaults(self) -> ExtractOptions:
        """Every per-call option at this engine's default; a call's :class:`ExtractOptions` is laid over it."""
        return ExtractOptions(
            strategy=self.strategy,
            temperature=self.temperature,
            staging=self.staging,
            anchor=self.anchor,
            max_tokens=self.max_tokens,
            draft_tokens=self.draft_tokens,
            memory_budget_mb=self.memory_budget_mb,
            instructions=self.prompt.instructions,
            list_choices=self.prompt.list_choices,
            quoted_booleans=self.prompt.quoted_booleans,
            chat_template_kwargs=self.prompt.chat_template_kwargs,
            limits=self.limits,
            correction=self.correction,
        )


def check_batch_size(value: Any) -> int | None:
    """``value`` as a batch size: an integer >= 1, or ``None`` for the engine's choice.

    Raises:
        OptionError: If it is anything else (a bool, a float, a string, zero or less).
    """
    count: int | None = check_count(value, "batch_size")
    return count
