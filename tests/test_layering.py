"""The layering, read from the import statements (module level and inside functions alike).

* The backends import only the token trees, the errors, each other and (to load a model) the model resolver:
  never the schema, the prompt, the compiler or the planner.
* The core (every module of ``pcd_engine`` outside ``pcd_engine/tools/``) never imports the tools wing (the
  command line, the server, bench, eval, check).
* The tree module imports nothing of pcd at all.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "pcd_engine"
BACKEND_MAY_IMPORT = {"pcd_engine.tree", "pcd_engine.errors", "pcd_engine.models", "pcd_engine.backends"}
# The core: every module of pcd_engine outside the tools wing, except the package's own facades (the package,
# __main__, and pcd_engine.testing, which re-exports the tools' backend check as a public API).
FACADE = ("__init__.py", "__main__.py", "testing.py")
CORE = sorted(
    p for p in PACKAGE.rglob("*.py")
    if "tools" not in p.relative_to(PACKAGE).parts and p.relative_to(PACKAGE).as_posix() not in FACADE
)  # fmt: skip


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


def imports_tools(path: Path) -> list[str]:
    return sorted(m for m in pcd_imports(path) if m == "pcd_engine.tools" or m.startswith("pcd_engine.tools."))


@pytest.mark.parametrize("path", CORE, ids=lambda p: p.relative_to(PACKAGE).as_posix())
def test_the_core_never_imports_the_tools(path):
    assert not imports_tools(path), f"{path.name} imports {imports_tools(path)}"


def test_the_core_is_everything_but_the_tools():
    names = {p.relative_to(PACKAGE).as_posix() for p in CORE}
    assert {"engine.py", "request.py", "schema/__init__.py", "schema/json_reader.py", "backends/torch.py"} <= names
    assert not any(n.startswith("tools/") for n in names)
    assert (PACKAGE / "tools" / "cli.py").exists() and (PACKAGE / "tools" / "serve" / "app.py").exists()


def test_the_tree_module_imports_nothing_of_pcd():
    assert pcd_imports(PACKAGE / "tree.py") == set()


def test_the_tools_check_can_fail(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from pcd_engine.tools.bench import one_wave\n    import pcd_engine.tools.serve\n")
    assert imports_tools(bad) == ["pcd_engine.tools.bench", "pcd_engine.tools.serve"]


def test_the_check_can_fail(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text(
        "def f():\n    from pcd_engine.planner import plan_passes\n    from pcd_engine.schema import Schema\n"
    )
    assert {m for m in pcd_imports(bad) if not allowed_for_backend(m)} == {"pcd_engine.planner", "pcd_engine.schema"}
