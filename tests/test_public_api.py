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
    "Calibrator",
    "ChatMessage",
    "Collector",
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
    "JsonReply",
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
    "json_chat",
    "load_preset",
    "stream_chat",
    "stream_text",
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


def test_ray_all():
    import pcd_integrations.ray

    assert pcd_integrations.ray.__all__ == ["PCDTagger", "ray_parts", "tag_dataset"]


def test_core_does_not_import_torch_at_import_time():
    import subprocess
    import sys

    code = (
        "import sys, pcd_engine, pcd_engine.engine, pcd_engine.tools.cli; "
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
    "pcd_engine.result": [
        "Alternative",
        "abstain",
        "ExtractionResult",
        "ExtractionStats",
        "FieldResult",
        "generated_result",
        "multi_result",
        "scored_result",
    ],
    "pcd_engine.tools.baseline": [
        "BASELINES",
        "INVALID",
        "BaselineResult",
        "BaselineRun",
        "generate_baseline",
        "generate_outlines",
        "generate_walk",
        "json_object_closed",
        "median_ms",
        "parse_against",
        "partial_pairs",
        "ready",
        "stream_baseline",
    ],
    "pcd_engine.chat": [
        "ChatMessage",
        "JsonReply",
        "TextChunk",
        "chat_prompt_ids",
        "document_text",
        "json_chat",
        "stream_chat",
        "stream_text",
    ],
    "pcd_engine.tools.cli": ["build_parser", "main"],
    "pcd_engine.tools.corpus": ["FORMATS", "CorpusDocument", "check_unique", "json_lines", "read_corpus"],
    "pcd_engine.tools.tag_table": [
        "ERROR_COLUMN",
        "WARNINGS_COLUMN",
        "TagColumn",
        "row_values",
        "tag_columns",
        "tag_table",
    ],
    "pcd_engine.tools.tagging": [
        "DEFAULT_PART_SIZE",
        "JOB_KEY",
        "TagSummary",
        "check_output",
        "engine_parts",
        "job_identity",
        "read_tag_table",
        "run_tag_job",
        "tag_corpus",
        "tag_outcomes",
    ],
    "pcd_engine.tools.bench": ["BenchRow", "bench_presets", "one_wave"],
    "pcd_engine.tools.eval": [
        "COVERAGE_THRESHOLDS",
        "CoveragePoint",
        "EvalReport",
        "MethodScore",
        "accuracy_coverage",
        "eval_schema",
        "evaluate",
        "parse_corrections",
    ],
    "pcd_engine.tools.check": [
        "CHECKS",
        "PROBE",
        "PROBE_TEXT",
        "BackendReport",
        "Check",
        "check_backend",
        "compile_preset",
        "default_tolerance",
        "run_checks",
    ],
    "pcd_engine.testing": ["BackendReport", "Check", "check_backend", "default_tolerance"],
    "pcd_engine.tools.datasets": [
        "LabelledText",
        "Metrics",
        "agreement",
        "bbc_news_path",
        "classification_metrics",
        "load_dataset",
        "rotten_tomatoes_path",
    ],
    "pcd_engine.tools.plots": ["bench_figure", "eval_figure", "plot_bench", "plot_eval"],
    "pcd_engine.tools.serve": ["create_app", "header_timeout_protocol"],
    "pcd_engine.tools.serve.app": [
        "LOOPBACK",
        "HostCheck",
        "KeyCheck",
        "Server",
        "create_app",
        "header_timeout_protocol",
    ],
    "pcd_engine.tools.serve.answers": [
        "Answer",
        "Ask",
        "Call",
        "chat_messages",
        "decide",
        "extract_options",
        "function_tool",
        "read_request",
        "respond",
        "schema_in_prompt",
        "stops",
        "text_chunks",
        "token_limit",
    ],
    "pcd_engine.tools.serve.errors": ["STATUS", "HTTPError", "as_http", "error_response", "install_handlers"],
    "pcd_engine.tools.serve.models": [
        "BaselineRequest",
        "ChatCompletionRequest",
        "CompletionRequest",
        "ExtractRequest",
        "ResponsesRequest",
        "documented",
        "parse_body",
    ],
    "pcd_engine.tools.serve.page_api": ["page_router"],
    "pcd_engine.tools.serve.openai_api": ["field_logprobs", "openai_router"],
    "pcd_engine.tools.serve.responses_api": ["responses_router"],
    "pcd_engine.tools.terminal": [
        *("RESULT_HEAD", "dataset_name", "progress", "read_json", "read_preset", "read_text", "result_rows"),
        *("shorten", "show_table", "table", "versions", "write_json"),
    ],
    "pcd_engine.models": [
        *("ALIASES", "DEFAULT_MODEL", "EMBEDDED_PACKAGE", "GGUF_DTYPES", "ModelAlias", "cache_dir"),
        *("default_model_path", "embedded_dir", "embedded_gguf", "gguf_model_path", "hub_offline", "in_hub_cache"),
        *("mlx_config_overrides", "mlx_weights_fix", "ollama_dir", "ollama_gguf", "resolve_model"),
    ],
    "pcd_engine.calibration": [
        *("CALIBRATION_METHODS", "FIT_CHUNK", "Calibrator", "FieldPrior", "em_bias", "mean_prior", "reweight"),
    ],
    "pcd_engine.errors": [
        *("DISTRIBUTION", "pip_install", "require", "BackendUnavailableError", "ContextError", "DatasetError"),
        *("InputError", "LimitError", "ModelLoadError", "OptionError", "PCDError", "PromptAlignmentError"),
        *("RequestCancelled", "RequestTimeout", "SchemaError"),
    ],
    "pcd_engine.tools.default_model": ["ModelSetup", "folder_bytes", "setup_default_model"],
    "pcd_engine.backends.mlx": ["MLXBackend", "load_mlx_model", "preload_blas"],
    "pcd_engine.backends.torch": ["TorchBackend"],
    "pcd_engine.backends.mlx_tree": [
        "INSTALL_HINT",
        "TreeLayer",
        "TreePass",
        "import_mlx",
        "module_wrappers",
        "preload_blas",
    ],
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
    "pcd_engine.request": ["PHASES", "Request", "WavePlan", "prefill"],
    "pcd_engine.options": [
        "CORRECTIONS",
        "STAGINGS",
        "STRATEGIES",
        "STRATEGY_ALIASES",
        "EngineOptions",
        "ExtractOptions",
        "PromptFormat",
        "check_batch_size",
    ],
    "pcd_engine.batch": [
        *("Batch", "Document", "Member", "fits", "groups", "lean_key", "open_batch", "read_batch", "row_groups"),
        "run_batch",
    ],
    "pcd_engine.lru": ["LRU"],
    "pcd_engine.calls": [
        "ANSWER",
        "Tool",
        "ToolCall",
        "ToolDecision",
        "called_text",
        "choice_of",
        "choice_schema",
        "decide_tools",
        "tool_result_text",
    ],
    "pcd_engine.alignment": ["AlignedLines", "align_lines", "common_prefix", "tail_tokens"],
    "pcd_engine.cache": ["CompileCache", "Head"],
    "pcd_engine.correction": [
        *("CONTENT_FREE_TEXTS", "CORRECTION_WINDOW", "MIN_BATCH", "auto_corrects", "batch_priors", "content_free"),
        "correctable",
        *("field_rows", "full_distribution", "reads_content_free", "reads_whole_in_batch"),
    ],
    "pcd_engine.schema": [
        "MAX_INT_LABELS",
        "FieldSpec",
        "Label",
        "LabelValue",
        "Preset",
        "Schema",
        "compile_schema",
        "flag_key",
        "load_preset",
    ],
    "pcd_engine.schema.fields": [
        "FieldSpec",
        "Grade",
        "Label",
        "LabelValue",
        "Preset",
        "Schema",
        "boolean_field",
        "build_schema",
        "enum_field",
        "flag_key",
        "label_of",
        "labels_of",
        "multi_field",
    ],
    "pcd_engine.schema.open_values": ["NotClosed", "UNCONSTRAINED_HINT", "inline_refs", "open_field", "resolve_ref"],
    "pcd_engine.schema.pydantic_reader": ["from_pydantic"],
    "pcd_engine.schema.json_reader": ["from_json_schema"],
    "pcd_engine.schema.presets": [
        "PRESET_FILE_KEYS",
        "PRESET_KEYS",
        "PRESET_TYPES",
        "from_preset",
        "is_preset_field",
        "load_preset",
    ],
    "pcd_engine.budget": ["PassBudget", "largest"],
    "pcd_engine.checks": ["check_budget", "check_sizes", "check_text", "check_window"],
    "pcd_engine.collector": ["Collector"],
    "pcd_engine.drafting": ["PromptLookup"],
    "pcd_engine.tools.greedy_walk": ["generate_greedy_walk"],
    "pcd_engine.decoding": [
        "Decision",
        "Exact",
        "Fixed",
        "Marginal",
        "Strategy",
        "TrieWalk",
        "choose_strategy",
        "sequence_scores",
        "split_paths",
    ],
    "pcd_engine.staging": [
        "FIRST_MARGIN",
        "PassCost",
        "QuestionReading",
        "WaveSearch",
        "mass_bound",
        "measure_pass_cost",
        "plan_reading",
    ],
    "pcd_engine.generation": [
        "Generated",
        "Grammars",
        "OpenRows",
        "RowPlan",
        "compile_rows",
        "generate_open",
        "generate_reply",
        "walk_json",
    ],
    "pcd_engine.backends.base": [
        "Backend",
        "Chooser",
        "Drafter",
        "Growth",
        "Prefix",
        "RequestState",
        "estimate_pass_bytes",
        "serialized",
    ],
}


def test_module_all():
    import importlib

    for name, expected in MODULE_ALL.items():
        module = importlib.import_module(name)
        assert sorted(module.__all__) == sorted(expected), name
        for attr in module.__all__:
            assert hasattr(module, attr), f"{name}.{attr}"
