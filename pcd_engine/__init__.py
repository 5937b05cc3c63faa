"""pcd_engine: structured decisions from local LLMs, decided in parallel from token tries.

Every allowed value of every field is compiled into a token trie, and all the tries of a wave are scored in
one tree-packed forward pass on top of the schema's cached prompt head.
"""

from pcd_engine.calibration import Calibrator
from pcd_engine.chat import ChatMessage, JsonReply, TextChunk, json_chat, stream_chat, stream_text
from pcd_engine.collector import Collector
from pcd_engine.decoding import Decision, Exact, Fixed, Marginal, Strategy, TrieWalk
from pcd_engine.engine import Engine, EngineOptions
from pcd_engine.errors import (
    BackendUnavailableError,
    ContextError,
    DatasetError,
    InputError,
    LimitError,
    ModelLoadError,
    OptionError,
    PCDError,
    PromptAlignmentError,
    RequestCancelled,
    RequestTimeout,
    SchemaError,
)
from pcd_engine.limits import RequestLimits
from pcd_engine.models import ALIASES, DEFAULT_MODEL, default_model_path
from pcd_engine.options import ExtractOptions, PromptFormat
from pcd_engine.result import Alternative, ExtractionResult, ExtractionStats, FieldResult
from pcd_engine.schema import FieldSpec, Label, Preset, Schema, compile_schema, load_preset
from pcd_engine.tools.baseline import BaselineResult, generate_baseline, generate_outlines

__version__ = "0.1.0"

__all__ = [
    "ALIASES",
    "DEFAULT_MODEL",
    "Alternative",
    "BackendUnavailableError",
    "BaselineResult",
    "Calibrator",
    "ChatMessage",
    "ContextError",
    "DatasetError",
    "Decision",
    "Collector",
    "Engine",
    "EngineOptions",
    "Exact",
    "ExtractOptions",
    "ExtractionResult",
    "ExtractionStats",
    "FieldResult",
    "FieldSpec",
    "Fixed",
    "Label",
    "Marginal",
    "InputError",
    "JsonReply",
    "LimitError",
    "ModelLoadError",
    "OptionError",
    "PCDError",
    "Preset",
    "PromptFormat",
    "PromptAlignmentError",
    "RequestCancelled",
    "RequestLimits",
    "RequestTimeout",
    "Schema",
    "SchemaError",
    "Strategy",
    "TextChunk",
    "TrieWalk",
    "__version__",
    "compile_schema",
    "default_model_path",
    "generate_baseline",
    "generate_outlines",
    "json_chat",
    "load_preset",
    "stream_chat",
    "stream_text",
]
