"""One options object for every call, from every surface: :class:`ExtractOptions` (:mod:`~pcd_engine.options.extract`;
the engine's defaults in :mod:`~pcd_engine.options.engine`, every surface's settings in
:mod:`~pcd_engine.options.surfaces`).

The command line, the HTTP APIs and the LangChain and LlamaIndex adapters each map their own knobs onto an
:class:`ExtractOptions`; the engine merges it over its :class:`EngineOptions` field by field
(a field left ``None`` keeps the engine's default). A setting is honoured or refused, never dropped: an unknown
name is an :class:`~pcd_engine.errors.OptionError` that names it and the nearest known one, on every surface.

The prompt format (``instructions``, ``list_choices``, ``quoted_booleans``, ``chat_template_kwargs``) changes the
prompt the model sees, so it is part of the key of the schema's cached preamble.
"""

from __future__ import annotations

from pcd_engine.options.engine import EngineOptions, check_batch_size
from pcd_engine.options.extract import (
    CORRECTIONS,
    STAGINGS,
    STRATEGIES,
    STRATEGY_ALIASES,
    ExtractOptions,
    PromptFormat,
)
from pcd_engine.options.surfaces import surface_options

__all__ = [
    "CORRECTIONS",
    "STAGINGS",
    "STRATEGIES",
    "STRATEGY_ALIASES",
    "EngineOptions",
    "ExtractOptions",
    "PromptFormat",
    "check_batch_size",
    "surface_options",
]
