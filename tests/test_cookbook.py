"""The cookbook: every notebook runs top to bottom on the embedded model (nbclient, a fresh kernel each), and the
committed notebooks are what ``cookbook/build.py`` writes, with the outputs of a real run stored."""

from __future__ import annotations

import nbformat
import pytest

from cookbook.build import HERE, NOTEBOOKS, build, execute

pytestmark = pytest.mark.real_model


@pytest.mark.parametrize("name", sorted(NOTEBOOKS))
def test_committed_notebook_is_built_from_its_source_with_outputs(name):
    committed = nbformat.read(HERE / name, as_version=4)
    nbformat.validate(committed)
    source = build(name, NOTEBOOKS[name])
    assert [(c.cell_type, c.source) for c in committed.cells] == [(c.cell_type, c.source) for c in source.cells]
    code = [c for c in committed.cells if c.cell_type == "code"]
    assert code and all(c.execution_count for c in code), "run cookbook/build.py to store outputs"
    assert all(o.output_type != "error" for c in code for o in c.outputs)
    assert sum(bool(c.outputs) for c in code) >= len(code) - 1


@pytest.mark.parametrize(
    "name", [pytest.param(name, marks=pytest.mark.xdist_group(f"notebook-{name}")) for name in sorted(NOTEBOOKS)]
)
def test_notebook_runs_top_to_bottom(name):
    """Each notebook is its own group under the test workers: its kernel needs nothing of the others."""
    nb = execute(nbformat.read(HERE / name, as_version=4))
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(o.output_type != "error" for c in code for o in c.outputs)
    assert code[-1].outputs, "the last cell shows a result"
