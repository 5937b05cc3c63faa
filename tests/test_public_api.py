"""The public API is pinned: adding or removing a name is a deliberate change to this test."""

import pcd_engine
import pcd_engine.backends
import pcd_integrations

EXPECTED_ENGINE = [
    "ALIASES",
    "DEFAULT_MODEL",
    "Alternative",
    "BackendUnavailableError",
    "BaselineResult",
    "ChatMessage",
    "ContextError",
    "DatasetError",
    "Decision",
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
    "LimitError",
    "ModelLoadError",
    "OptionError",
    "PCDError",
    "Preset",
    "PromptAlignmentError",
    "PromptFormat",
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
    "load_preset",
    "stream_chat",
]


def test_engine_all():
    assert sorted(pcd_engine.__all__) == sorted(EXPECTED_ENGINE)
    for name in pcd_engine.__all__:
        assert hasattr(pcd_engine, name)


def test_backends_all():
    assert sorted(pcd_engine.backends.__all__) == ["BACKENDS", "Backend", "Prefix", "RequestState", "select_backend"]


def test_integrations_all():
    assert pcd_integrations.__all__ == []


def test_langchain_all():
    import pcd_integrations.langchain

    assert pcd_integrations.langchain.__all__ == ["ChatPCD"]


def test_llamaindex_all():
    import pcd_integrations.llamaindex

    assert pcd_integrations.llamaindex.__all__ == ["PCDLLM", "PCDMetadataExtractor", "PCDPydanticProgram"]


def test_core_does_not_import_torch_at_import_time():
    import subprocess
    import sys

    code = (
        "import sys, pcd_engine, pcd_engine.engine, pcd_engine.cli; "
        "print('torch' in sys.modules, 'transformers' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "False False"


def test_errors_share_one_base():
    for name in [
        "SchemaError",
        "ContextError",
        "PromptAlignmentError",
        "ModelLoadError",
        "OptionError",
        "BackendUnavailableError",
        "DatasetError",
        "InputError",
        "LimitError",
        "RequestCancelled",
        "RequestTimeout",
    ]:
        assert issubclass(getattr(pcd_engine, name), pcd_engine.PCDError)


MODULE_ALL = {
    "pcd_engine.baseline": [
        "BaselineResult",
        "generate_baseline",
        "generate_outlines",
        "json_object_closed",
        "partial_pairs",
        "stream_baseline",
    ],
    "pcd_engine.chat": ["ChatMessage", "TextChunk", "chat_prompt_ids", "document_text", "stream_chat"],
    "pcd_engine.cli": ["build_parser", "main"],
    "pcd_engine.comparison": [
        "BASELINES",
        "BaselineRun",
        "BenchRow",
        "EvalReport",
        "MethodScore",
        "bench_presets",
        "eval_schema",
        "evaluate",
        "median_ms",
        "one_wave",
        "parse_against",
    ],
    "pcd_engine.diagnostics": ["CHECKS", "PROBE", "PROBE_TEXT", "Check", "run_checks"],
    "pcd_engine.evaluation": [
        "LabelledText",
        "Metrics",
        "agreement",
        "bbc_news_path",
        "classification_metrics",
        "load_dataset",
    ],
    "pcd_engine.plots": ["plot_bench", "plot_eval"],
    "pcd_engine.server": ["create_app", "header_timeout_protocol"],
    "pcd_engine.constraints": [
        "MAX_INT_LABELS",
        "MAX_SCHEMA_DEPTH",
        "WideRange",
        "check_depth",
        "check_keywords",
        "filter_values",
        "int_values",
        "is_valid",
        "number_bound",
        "too_deep",
    ],
    "pcd_engine.limits": ["SERVER_LIMITS", "RequestLimits", "Watch"],
    "pcd_engine.request": ["PHASES", "Request", "prefill"],
    "pcd_engine.options": ["STRATEGIES", "STRATEGY_ALIASES", "EngineOptions", "ExtractOptions", "PromptFormat"],
    "pcd_engine.lru": ["LRU"],
    "pcd_engine.cache": ["CompileCache", "Head"],
    "pcd_engine.budget": ["PassBudget", "largest"],
    "pcd_engine.checks": ["check_budget", "check_sizes", "check_text", "check_window"],
}


def test_module_all():
    import importlib

    for name, expected in MODULE_ALL.items():
        module = importlib.import_module(name)
        assert sorted(module.__all__) == sorted(expected), name
        for attr in module.__all__:
            assert hasattr(module, attr), f"{name}.{attr}"
