"""What the engine compiles once and shares between calls: schema preambles (with their prefilled KV), compiled
waves, pass plans, open-row plans and content-free leans, each a bounded :class:`~pcd_engine.lru.LRU`."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pcd_engine.backends.contract import Prefix
from pcd_engine.decide.compiler import CompiledWave, compile_wave
from pcd_engine.decide.planner import plan_passes
from pcd_engine.generate.open_rows import RowPlan, compile_rows
from pcd_engine.lru import LRU
from pcd_engine.options import PromptFormat
from pcd_engine.prompt.alignment import tail_tokens
from pcd_engine.prompt.chat_prompt import ChatPrompt, TokenizerView
from pcd_engine.schema import FieldSpec, Schema
from pcd_engine.trees import TreeBatch

__all__ = ["CompileCache", "SchemaPrompt"]


@dataclass(frozen=True)
class SchemaPrompt:
    """A schema's prompt in one format, and the tail tokens every request ends with.

    Attributes:
        chat: The chat prompt around the document (its preamble is what the engine prefills and caches).
        tail0_ids: The tokens of the tail before any answer (up to ``{``), as they follow the document.
    """

    chat: ChatPrompt
    tail0_ids: tuple[int, ...]


class CompileCache:
    """The engine's compile-once state: schema preambles (with their prefilled KV), compiled waves, pass plans,
    open-row plans and content-free leans (:mod:`pcd_engine.deciders.corrections`), each in an :class:`LRU`.

    Args:
        tokenizer: The model's tokenizer view.
        prompts: How many prefilled schema preambles to keep; the other stores keep 64 entries per preamble.
    """

    def __init__(self, tokenizer: TokenizerView, *, prompts: int) -> None:
        self.tokenizer = tokenizer
        self.prompts: LRU[str, tuple[SchemaPrompt, Prefix]] = LRU(prompts)
        self.waves: LRU[tuple[str, ...], CompiledWave] = LRU(64 * prompts)
        self.rows: LRU[tuple[str, ...], RowPlan] = LRU(64 * prompts)
        self.pass_plans: LRU[tuple[int, int, frozenset[int] | None], tuple[CompiledWave, list[TreeBatch]]] = LRU(
            64 * prompts
        )
        self.leans: LRU[tuple[Any, ...], Any] = LRU(64 * prompts)

    @staticmethod
    def prompt_key(schema: Schema, fmt: PromptFormat) -> str:
        """The key of a schema's preamble in one prompt format."""
        return schema.fingerprint + fmt.key

    def prompt(self, schema: Schema, fmt: PromptFormat) -> tuple[SchemaPrompt, Prefix | None]:
        """The schema's cached preamble, or its plan and ``None`` when it must be prefilled (nothing is stored)."""
        hit = self.prompts.get(self.prompt_key(schema, fmt))
        if hit is not None:
            return hit
        prompt = ChatPrompt.build(self.tokenizer, schema, fmt)
        tail0, skip = tail_tokens(self.tokenizer, prompt.boundary_text, prompt.tail_text)
        return SchemaPrompt(prompt, tuple(tail0[skip:])), None

    def wave(self, schema: Schema, prompt: ChatPrompt, fields: Sequence[FieldSpec], tail_text: str) -> CompiledWave:
        """The compiled tree of one wave's questions after ``tail_text``."""
        key = (schema.fingerprint, prompt.boundary_text, tail_text, *(f.name for f in fields))
        return self.waves.get_or_build(
            key, lambda: compile_wave(self.tokenizer, fields, boundary_text=prompt.boundary_text, tail_text=tail_text)
        )

    def row_plan(self, schema: Schema, prompt: ChatPrompt, fields: Sequence[FieldSpec], tail_text: str) -> RowPlan:
        """The open rows' prefixes after ``tail_text``."""
        key = (schema.fingerprint, prompt.boundary_text, tail_text, *(f.name for f in fields))
        return self.rows.get_or_build(
            key, lambda: compile_rows(self.tokenizer, fields, boundary_text=prompt.boundary_text, tail_text=tail_text)
        )

    def passes(self, wave: CompiledWave, max_nodes: int, queries: frozenset[int] | None = None) -> list[TreeBatch]:
        """The passes that read ``queries`` of the wave's tree (``None``: every node), at most ``max_nodes`` nodes
        each."""
        cache_key = (id(wave), max_nodes, queries)
        plan = self.pass_plans.get_or_build(
            cache_key, lambda: (wave, plan_passes(wave.tree, max_nodes=max_nodes, queries=queries))
        )
        if plan[0] is not wave:  # an id reused after its wave was evicted
            plan = (wave, plan_passes(wave.tree, max_nodes=max_nodes, queries=queries))
            self.pass_plans.put(cache_key, plan)
        return plan[1]
