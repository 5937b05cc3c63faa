"""The layering, read from the import statements (module level, inside functions and under ``TYPE_CHECKING``
alike): one rule per layer of ``pcd_engine``.

The layers, bottom to top (each may import the layers below it and itself, nothing above):

``errors``, ``lru``, ``jsonl`` < ``trees`` < ``backends`` < ``models`` < ``schema`` < ``calibrate.estimators`` <
``calibrate.fitted`` < ``calibrate.calibrator`` < ``heads.gates`` < ``heads.fields`` <
``heads.head`` < ``heads`` < ``deciders`` < ``limits`` < ``options`` < ``prompt`` < ``decide`` < ``calibrate`` <
``generate`` < ``result`` < ``run`` < ``engine`` < ``tool_calls`` < ``questions`` < ``tagging`` < ``tools``;
the facades (the package, ``__main__``, ``testing``, ``adapters``) may import anything of pcd_engine. What a
lower layer needs of a higher one it names as a protocol (``run.host.Host``: the engine as a request sees it;
``generate.free_text.ChatModel``), never by importing it.

The backends, the only code that touches tensors, import the token trees and the errors only (the rule above
adds the lower utilities, of which they import none). No module is exempt, and no import circle is left, even
through ``TYPE_CHECKING`` or a function-level import (:func:`import_circles`).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "pcd_engine"
LAYERS = [
    "errors",
    "lru",
    "jsonl",
    "trees",
    "backends",
    "models",
    "schema",
    "heads.thresholds",
    "calibrate.estimators",
    "calibrate.fitted",
    "calibrate.examples",
    "calibrate.calibrator",
    "heads.gates",
    "heads.fields",
    "heads.head",
    "heads",
    "deciders",
    "limits",
    "options",
    "prompt",
    "decide",
    "calibrate",
    "generate",
    "result",
    "run",
    "engine",
    "tool_calls",
    "questions",
    "tagging",
    "tools",
]
FACADES = {"__init__.py", "__main__.py", "testing.py", "adapters.py"}
RANK = {name: n for n, name in enumerate(LAYERS)}
# Modules that sit below the rest of their package: thresholds from held-out evidence, the lean estimators, what
# fitted files share, the calibrator and the decision heads (values the options carry).
SUBLAYERS = {*LAYERS[LAYERS.index("heads.thresholds") : LAYERS.index("heads.head") + 1]}


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


def module_graph() -> dict[str, set[str]]:
    """Every module of pcd_engine (dotted; a package by its name) with the pcd_engine modules it imports anywhere
    in its file. ``from package import name`` counts as importing the submodule ``name`` when there is one (the
    package's own ``__init__`` is then only the parent every submodule has)."""
    files = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("pcd_engine"):
                subs = {f"{node.module}.{a.name}" for a in node.names} & files.keys()
                found |= subs or {node.module}
            elif isinstance(node, ast.Import):
                found |= {a.name for a in node.names if a.name.startswith("pcd_engine")}
        graph[name] = {_known(m, files) for m in found} - {name, None}  # type: ignore[misc]
    return graph


def _known(module: str, files: dict[str, Path]) -> str | None:
    """The longest prefix of ``module`` that is a module of pcd_engine (an imported name is not one)."""
    parts = module.split(".")
    while parts and ".".join(parts) not in files:
        parts.pop()
    return ".".join(parts) or None


def import_circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of ``graph`` with more than one module (Tarjan's algorithm,
    iterative): each is an import circle."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            nxt = next((w for w in edges), None)
            if nxt is not None:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph.get(nxt, ())))))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    circles.append(sorted(component))
    return circles


def layer(module: str) -> str | None:
    """The layer of a ``pcd_engine...`` module name (or of a file's path relative to the package, dotted),
    ``None`` for the package itself and what it re-exports."""
    parts = module.removeprefix("pcd_engine").strip(".").split(".")
    if ".".join(parts[:2]) in SUBLAYERS:
        return ".".join(parts[:2])
    return parts[0] if parts[0] in RANK else None


def upward(path: Path, rel: str | None = None) -> list[str]:
    """The layers above its own that the module at ``path`` imports (``rel``: its path within the package, when
    it is not there)."""
    rel = rel or path.relative_to(PACKAGE).as_posix()
    own = layer(rel.removesuffix(".py").replace("/", "."))
    assert own is not None, f"{rel} is in no layer: add it to LAYERS"
    found = {layer(m) for m in pcd_imports(path)}
    return sorted(x for x in found if x is not None and RANK[x] > RANK[own])


MODULES = sorted(p for p in PACKAGE.rglob("*.py") if p.relative_to(PACKAGE).as_posix() not in FACADES)


@pytest.mark.parametrize("path", MODULES, ids=lambda p: p.relative_to(PACKAGE).as_posix())
def test_every_module_imports_only_its_layer_and_those_below(path):
    wrong = upward(path)
    assert not wrong, f"{path.relative_to(PACKAGE)} imports {wrong}, above its layer"


@pytest.mark.parametrize("path", sorted((PACKAGE / "backends").glob("*.py")), ids=lambda p: p.name)
def test_backends_import_only_trees_and_errors(path):
    allowed = {"trees", "errors", "backends"}
    wrong = sorted(m for m in pcd_imports(path) if layer(m) not in allowed)
    assert not wrong, f"{path.name} imports {wrong}"


def integration_imports(path: Path) -> set[str]:
    """Every ``pcd_integrations...`` module that ``path`` imports."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("pcd_integrations"):
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name.startswith("pcd_integrations"))
    return found


@pytest.mark.parametrize("path", sorted(PACKAGE.rglob("*.py")), ids=lambda p: p.relative_to(PACKAGE).as_posix())
def test_the_engine_never_imports_the_integrations(path):
    found = integration_imports(path)
    assert not found, f"{path.relative_to(PACKAGE)} imports {sorted(found)}"


def test_the_ray_runner_is_found_by_its_entry_point_not_imported():
    """``pcd tag --ray`` reaches pcd_integrations' runner through the ``pcd_engine.tag_runners`` entry point."""
    from pcd_engine.tagging.job import RUNNERS_GROUP, tag_runner

    pytest.importorskip("ray")
    from pcd_integrations.ray import cli_runner

    assert tag_runner("ray") is cli_runner
    pyproject = (PACKAGE.parent / "pyproject.toml").read_text(encoding="utf-8")
    assert f'[project.entry-points."{RUNNERS_GROUP}"]\nray = "pcd_integrations.ray:cli_runner"' in pyproject


def test_an_unknown_runner_is_refused_by_name():
    from pcd_engine.errors import BackendUnavailableError
    from pcd_engine.tagging.job import tag_runner

    with pytest.raises(BackendUnavailableError, match="expected a 'dask' runner registered under"):
        tag_runner("dask")


def test_the_tree_module_imports_nothing_of_pcd():
    assert pcd_imports(PACKAGE / "trees.py") == set()


def test_the_top_level_holds_at_most_twelve_modules():
    top = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(top) <= 12, top
    assert {"decide", "run", "prompt", "generate", "calibrate", "heads", "models", "schema", "backends", "tools"} <= {
        p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()
    }


def test_no_import_circle_even_through_type_checking():
    assert import_circles(module_graph()) == []


def test_the_circle_check_can_fail():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e"}}
    assert import_circles(graph) == [["a", "b", "c"]]


def test_the_rule_can_fail(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("def f():\n    from pcd_engine.run.request import Request\n    import pcd_engine.tools.cli\n")
    assert upward(probe, "decide/probe.py") == ["run", "tools"]
    assert upward(probe, "run/probe.py") == ["tools"]
    assert upward(probe, "run/request.py") == ["tools"]  # its own layer is allowed


def test_the_backend_check_can_fail(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text(
        "def f():\n    from pcd_engine.decide.planner import plan_passes\n    from pcd_engine.schema import Schema\n"
    )
    assert {m for m in pcd_imports(bad) if layer(m) not in {"trees", "errors", "backends"}} == {
        "pcd_engine.decide.planner",
        "pcd_engine.schema",
    }


SOURCES = sorted([*PACKAGE.rglob("*.py"), *(PACKAGE.parent / "pcd_integrations").rglob("*.py")])


def long_parts(path: Path, *, max_lines: int = 500, max_function: int = 80) -> list[str]:
    """What in ``path`` is too long to read in one sitting: the file past ``max_lines`` lines, functions past
    ``max_function`` (docstrings included)."""
    text = path.read_text(encoding="utf-8")
    found = [f"{len(text.splitlines())} lines"] if len(text.splitlines()) > max_lines else []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            length = (node.end_lineno or node.lineno) - node.lineno + 1
            if length > max_function:
                found.append(f"{node.name}: {length} lines")
    return found


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: p.relative_to(PACKAGE.parent).as_posix())
def test_no_file_over_500_lines_and_no_function_over_80(path):
    assert not long_parts(path), f"{path.relative_to(PACKAGE.parent)}: {long_parts(path)}"


def test_the_length_check_can_fail(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("def f():\n" + "    x = 1\n" * 90 + "\n" * 420)
    assert long_parts(probe) == ["511 lines", "f: 91 lines"]


def test_the_tests_mirror_the_tree():
    """Each folder of tests is named for the layer (sub-package of pcd_engine) it tests, or the integrations."""
    tests = Path(__file__).resolve().parent
    folders = {p.name for p in tests.iterdir() if (p / "__init__.py").exists()}
    layers = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()}
    assert folders and folders <= layers | {"integrations"}, sorted(folders - layers)
