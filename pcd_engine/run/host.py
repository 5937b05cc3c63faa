"""What running a request needs of the engine it runs on: :class:`Host`.

The requests, batches and the collector of :mod:`pcd_engine.run` are driven by an
:class:`~pcd_engine.engine.Engine`, which is built on top of them. They name the engine's parts they use through
this protocol instead of importing the engine, so the engine sits above the run layer with no import going back
up; any object with these attributes can host a request (the engine is the only one in pcd).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from pcd_engine.backends.contract import Backend, Prefix, RequestState
from pcd_engine.decide.staging import PassCost
from pcd_engine.generate.open_rows import Grammars
from pcd_engine.options import EngineOptions, ExtractOptions, PromptFormat
from pcd_engine.prompt.chat_prompt import TokenizerView
from pcd_engine.run.budget import PassBudget
from pcd_engine.run.compile_cache import CompileCache, SchemaPrompt
from pcd_engine.schema import Schema

__all__ = ["Host"]


class Host(Protocol):
    """The engine as a request, a batch and the collector see it.

    Attributes:
        backend: The model's backend.
        tokenizer: The model's tokenizer, as prompts use it.
        cache: The compile cache shared by every call (schema prompts, waves, pass and row plans, leans).
        grammars: The open fields' grammar cache.
        options: The engine's settings.
        model_id: The model's name, as calibrations record it.
    """

    @property
    def backend(self) -> Backend: ...

    @property
    def tokenizer(self) -> TokenizerView: ...

    @property
    def cache(self) -> CompileCache: ...

    @property
    def grammars(self) -> Grammars: ...

    @property
    def options(self) -> EngineOptions: ...

    @property
    def model_id(self) -> str: ...

    @property
    def known_pass_cost(self) -> PassCost | None:
        """The pass cost if it is known already, else ``None``."""

    def pass_cost(self, state: RequestState, *, token: int) -> PassCost:
        """What one forward pass costs (measured once on ``state`` when not known)."""

    def prefill_prompt(self, schema: Schema, fmt: PromptFormat, prompt: SchemaPrompt, budget: PassBudget) -> Prefix:
        """Prefill a schema's preamble within ``budget`` and cache it."""

    def batch_size(self, given: int | None = None) -> int:
        """The most documents one pass holds."""

    def resolve(self, options: ExtractOptions | Mapping[str, Any] | None = None, **knobs: Any) -> ExtractOptions:
        """The options a call runs with, over the engine's defaults."""
