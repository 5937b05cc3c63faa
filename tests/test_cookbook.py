"""The cookbook: every notebook runs top to bottom on the embedded model (nbclient, a fresh kernel each), and the
committed notebooks are what ``cookbook/build.py`` writes, with the outputs of a real run stored."""

from __future__ import annotations

import nbformat
import pytest

from cookbook.build import HERE, NOTEBOOKS, build, execute, with_parameters

pytestmark = pytest.mark.real_model

SMALLER = {
    "04_trust_the_answer.ipynb": {"ARTICLES": 20},
    "06_corpus_tagging.ipynb": {"ARTICLES": 16},
    "07_few_labels.ipynb": {"PER_TOPIC": 4, "TEST_ARTICLES": 10},
}
"""Parameters the tests run the longer notebooks with (papermill's convention: set after the notebook's cell tagged
``parameters``): every cell still runs, on fewer documents, and the committed outputs are the full run's. At full
size these three took 260 s of CI; 05_speed runs in full, since its every preset costs about as much (the
autoregressive baseline it times writes the whole answer)."""


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
    nb = nbformat.read(HERE / name, as_version=4)
    nb = execute(with_parameters(nb, SMALLER[name]) if name in SMALLER else nb)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(o.output_type != "error" for c in code for o in c.outputs)
    assert code[-1].outputs, "the last cell shows a result"


def test_parameters_go_after_the_parameters_cell_and_must_be_set_there():
    nb = build("05_speed.ipynb", NOTEBOOKS["05_speed.ipynb"])
    at = next(i for i, c in enumerate(nb.cells) if "parameters" in c.metadata.get("tags", []))
    injected = with_parameters(nb, {"PRESET": "order_extraction"})
    assert injected.cells[at + 1].source == "PRESET = 'order_extraction'"
    assert injected.cells[at + 1].metadata["tags"] == ["injected-parameters"]
    assert len(injected.cells) == len(nb.cells) + 1 and "injected-parameters" not in str(nb.cells)
    with pytest.raises(ValueError, match=r"\['ARTICLES'\] are not set.*PRESET"):
        with_parameters(nb, {"ARTICLES": 3})
    with pytest.raises(ValueError, match="no cell tagged 'parameters'"):
        with_parameters(build("01_quickstart.ipynb", NOTEBOOKS["01_quickstart.ipynb"]), {"ARTICLES": 3})


@pytest.mark.parametrize("name", sorted(SMALLER))
def test_smaller_runs_set_only_what_the_notebook_declares(name):
    with_parameters(nbformat.read(HERE / name, as_version=4), SMALLER[name])  # raises on a name it does not set
