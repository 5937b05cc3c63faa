"""The layering, read from the import statements (module level and inside functions alike).

* The backends import only the token trees, the errors, each other and (to load a model) the model resolver:
  never the schema, the prompt, the compiler or the planner.
* The core (what :class:`~pcd_engine.Engine` is made of) never imports the command-line and server tools.
* The tree module imports nothing of pcd at all.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "pcd_engine"
BACKEND_MAY_IMPORT = {"pcd_engine.tree", "pcd_engine.errors", "pcd_engine.models", "pcd_engine.backends"}
CORE = [
    "engine", "request", "options", "limits", "schema", "constraints", "prompt", "compiler", "generation",
    "planner", "decoding", "tree", "result", "errors", "models", "chat", "lru", "cache", "budget", "checks",
]  # fmt: skip
TOOLS = {"cli", "server", "diagnostics", "comparison", "evaluation", "plots", "examples", "baseline"}


def pcd_imports(path: Path) -> set[str]:
    """Every ``pcd_engine...`` module that ``path`` imports, anywhere in the file."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("pcd_engine"):
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names if node.module == "pcd_engine")
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name.startswith("pcd_engine"))
    return found


def allowed_for_backend(module: str) -> bool:
    return any(module == ok or module.startswith(ok + ".") for ok in BACKEND_MAY_IMPORT)


@pytest.mark.parametrize("path", sorted((PACKAGE / "backends").glob("*.py")), ids=lambda p: p.name)
def test_backends_import_only_trees_and_errors(path):
    wrong = sorted(m for m in pcd_imports(path) if not allowed_for_backend(m))
    assert not wrong, f"{path.name} imports {wrong}"


@pytest.mark.parametrize("name", CORE)
def test_the_core_never_imports_the_tools(name):
    imported = {m.split(".")[1] for m in pcd_imports(PACKAGE / f"{name}.py") if m.count(".") >= 1}
    assert not imported & TOOLS, f"{name}.py imports {sorted(imported & TOOLS)}"


def test_the_tree_module_imports_nothing_of_pcd():
    assert pcd_imports(PACKAGE / "tree.py") == set()


def test_the_check_can_fail(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text(
        "def f():\n    from pcd_engine.planner import plan_passes\n    from pcd_engine.schema import Schema\n"
    )
    assert {m for m in pcd_imports(bad) if not allowed_for_backend(m)} == {"pcd_engine.planner", "pcd_engine.schema"}
