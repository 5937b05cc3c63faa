"""pcd_engine: structured decisions from local LLMs, decided in parallel from token tries.

Every allowed value of every field is compiled into a token trie, and all the tries of a wave are scored in
one tree-packed forward pass on top of the schema's cached preamble.

The names below are what the README documents. Importing the package loads neither the command line, the server
nor the benchmark comparators; :func:`tag_corpus` (the in-process ``pcd tag`` job, :mod:`pcd_engine.tagging`)
is imported on first use, to keep importing the package light.
"""

from typing import Any

from pcd_engine.calibrate.calibrator import Calibrator
from pcd_engine.calibrate.shares import LabelShares, label_shares
from pcd_engine.engine import Engine, EngineOptions
from pcd_engine.errors import (
    BackendCapabilityError,
    BackendUnavailableError,
    ContextError,
    DatasetError,
    InputError,
    LimitError,
    ModelLoadError,
    OptionError,
    PCDError,
    PromptAlignmentError,
    QuestionError,
    RequestCancelled,
    RequestTimeout,
    SchemaError,
)
from pcd_engine.generate.free_text import ChatMessage, JsonReply, TextChunk, json_chat, stream_chat, stream_text
from pcd_engine.heads.head import Head
from pcd_engine.heads.thresholds import Threshold
from pcd_engine.limits import RequestLimits
from pcd_engine.models.resolve import ALIASES, DEFAULT_MODEL, default_model_path
from pcd_engine.options import ExtractOptions, PromptFormat, surface_options
from pcd_engine.questions import (
    Decisions,
    Question,
    QuestionAnswer,
    content_text,
    decide_questions,
    questions_schema,
    read_decisions,
    state_text,
)
from pcd_engine.result import Alternative, ExtractionResult, ExtractionStats, FieldResult, TokenUsage
from pcd_engine.run.collector import Collector
from pcd_engine.schema import FieldSpec, Label, Preset, Schema, compile_schema, load_preset
from pcd_engine.tool_calls import Tool, ToolCall, ToolDecision, decide_tools

__version__ = "0.1.0"

__all__ = [
    "ALIASES",
    "DEFAULT_MODEL",
    "Alternative",
    "BackendCapabilityError",
    "BackendUnavailableError",
    "Calibrator",
    "ChatMessage",
    "Collector",
    "ContextError",
    "DatasetError",
    "Decisions",
    "Engine",
    "EngineOptions",
    "ExtractOptions",
    "ExtractionResult",
    "ExtractionStats",
    "FieldResult",
    "FieldSpec",
    "Head",
    "InputError",
    "JsonReply",
    "Label",
    "LabelShares",
    "LimitError",
    "ModelLoadError",
    "OptionError",
    "PCDError",
    "Preset",
    "PromptAlignmentError",
    "PromptFormat",
    "Question",
    "QuestionAnswer",
    "QuestionError",
    "RequestCancelled",
    "RequestLimits",
    "RequestTimeout",
    "Schema",
    "SchemaError",
    "TextChunk",
    "Threshold",
    "TokenUsage",
    "Tool",
    "ToolCall",
    "ToolDecision",
    "__version__",
    "compile_schema",
    "content_text",
    "decide_questions",
    "decide_tools",
    "default_model_path",
    "json_chat",
    "label_shares",
    "load_preset",
    "questions_schema",
    "read_decisions",
    "state_text",
    "stream_chat",
    "stream_text",
    "surface_options",
    "tag_corpus",
]


def __getattr__(name: str) -> Any:
    """``tag_corpus``, imported from the tagging job on first use (PEP 562)."""
    if name == "tag_corpus":
        from pcd_engine.tagging.job import tag_corpus

        return tag_corpus
    raise AttributeError(f"module 'pcd_engine' has no attribute {name!r}")
