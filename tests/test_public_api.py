"""The public API is pinned: adding or removing a name is a deliberate change to this test."""

import pcd_engine
import pcd_engine.backends
import pcd_integrations

EXPECTED_ENGINE = [
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
"""What the README documents, sorted, each name once. The strategies are not here (options take their names), nor
the benchmark comparators (``pcd_engine.tools.comparators``)."""


def test_engine_all():
    assert pcd_engine.__all__ == EXPECTED_ENGINE  # sorted, each once
    # isort's order (ruff RUF022): constants, then classes, then the rest, each alphabetically
    order = sorted(EXPECTED_ENGINE, key=lambda n: (0 if n.isupper() else 1 if n[:1].isupper() else 2, n))
    assert len(set(EXPECTED_ENGINE)) == len(EXPECTED_ENGINE) and order == EXPECTED_ENGINE
    for name in pcd_engine.__all__:
        assert hasattr(pcd_engine, name)


def test_every_public_name_is_in_the_readme():
    from pathlib import Path

    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text(encoding="utf-8")
    missing = [name for name in EXPECTED_ENGINE if name != "__version__" and name not in readme]
    assert not missing, missing


def test_importing_the_package_loads_neither_the_tools_nor_the_comparators():
    import subprocess
    import sys

    code = (
        "import sys, pcd_engine; print(sorted(m for m in sys.modules if m.startswith('pcd_engine.tools')));"
        "pcd_engine.tag_corpus; print('pcd_engine.tagging.job' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split("\n")
    assert out[:2] == ["[]", "True"]


def test_backends_all():
    assert sorted(pcd_engine.backends.__all__) == ["BACKENDS", "Backend", "Prefix", "RequestState", "select_backend"]


EXPECTED_ADAPTERS = [
    "Conversation",
    "CorpusDocument",
    "PastCall",
    "Runner",
    "Turn",
    "check_count",
    "check_text",
    "choice_of",
    "openai_conversation",
    "pip_install",
    "require",
    "tag_columns",
    "tag_outcomes",
    "tag_table",
]
"""``pcd_engine.adapters``: what framework adapters use beyond ``pcd_engine``'s names (the README documents it)."""


def test_adapters_all_is_pinned_and_documented():
    from pathlib import Path

    import pcd_engine.adapters

    assert pcd_engine.adapters.__all__ == EXPECTED_ADAPTERS
    for name in EXPECTED_ADAPTERS:
        assert getattr(pcd_engine.adapters, name) is not None
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text(encoding="utf-8")
    assert "pcd_engine.adapters" in readme


def test_integrations_import_only_the_engines_public_api():
    """Every import of pcd_engine in pcd_integrations names ``pcd_engine``'s documented names or
    ``pcd_engine.adapters``' (checked on the source, so a new internal import anywhere fails here)."""
    import ast
    from pathlib import Path

    public = {"pcd_engine": set(EXPECTED_ENGINE), "pcd_engine.adapters": set(EXPECTED_ADAPTERS)}
    root = Path(pcd_integrations.__file__).resolve().parent
    offences, seen = [], 0
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                offences += [f"{path.name}: import {a.name}" for a in node.names if a.name.startswith("pcd_engine")]
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("pcd_engine"):
                seen += 1
                allowed = public.get(node.module or "", set())
                offences += [f"{path.name}: from {node.module} import {a.name}" for a in node.names
                             if a.name not in allowed]  # fmt: skip
    assert seen > 10  # the walk found the adapters' imports
    assert not offences, offences


def test_integrations_all():
    assert pcd_integrations.__all__ == []


def test_langchain_all():
    import pcd_integrations.langchain

    assert pcd_integrations.langchain.__all__ == ["ChatPCD", "PCDDecisionModel"]


def test_llamaindex_all():
    import pcd_integrations.llamaindex

    assert pcd_integrations.llamaindex.__all__ == ["PCDLLM", "PCDMetadataExtractor", "PCDPydanticProgram"]


def test_ray_all():
    import pcd_integrations.ray

    assert pcd_integrations.ray.__all__ == ["PCDTagger", "cli_runner", "ray_parts", "tag_dataset"]


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


def test_every_module_lists_its_own_names_once():
    """Every module of both packages has an ``__all__`` (the names it offers the rest of pcd): each once, each
    defined. Which names an internal module offers is not pinned: only the packages above are public."""
    import importlib
    from pathlib import Path

    root = Path(pcd_engine.__file__).resolve().parent.parent
    for package in ("pcd_engine", "pcd_integrations"):
        for path in sorted((root / package).rglob("*.py")):
            rel = path.relative_to(root).with_suffix("")
            if rel.name == "__main__":
                continue
            name = ".".join(rel.parts).removesuffix(".__init__")
            if name.startswith(("pcd_integrations.langchain", "pcd_integrations.llamaindex", "pcd_integrations.ray")):
                continue  # pinned above; importing them needs their frameworks
            module = importlib.import_module(name)
            names = getattr(module, "__all__", None)
            assert names is not None, f"{name} has no __all__"
            assert len(set(names)) == len(names), name
            for attr in names:
                assert hasattr(module, attr), f"{name}.{attr}"
