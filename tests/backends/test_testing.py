"""``pcd_engine.testing.check_backend``: the conformance checks of ``pcd check`` as a public API."""

from __future__ import annotations

import pytest

from pcd_engine import Engine
from pcd_engine.backends.torch import TorchBackend
from pcd_engine.errors import OptionError
from pcd_engine.testing import BackendReport, check_backend
from pcd_engine.tools.check import CHECKS
from tests.conformance import shift_tree_positions
from tests.support import ARCHS, HYBRID_ARCHS, MORE_ARCHS, load_mlx_twin, mlx_available, save_tiny, tiny_model


@pytest.fixture(scope="module", params=ARCHS + MORE_ARCHS + HYBRID_ARCHS)
def tiny_arch_engine(request, smol_tokenizer):
    return Engine(TorchBackend(tiny_model(request.param, len(smol_tokenizer)), smol_tokenizer))


def test_check_backend_passes_on_every_tiny_architecture(tiny_arch_engine):
    seen = []
    report = check_backend(tiny_arch_engine, on_check=seen.append)
    assert isinstance(report, BackendReport)
    assert report.passed, str(report)
    assert report.failures == () and list(report.checks) == seen
    assert [c.name for c in report.checks] == [name for name, _ in CHECKS]
    expected_scorer = "rows" if tiny_arch_engine.backend.scorer == "rows" else "packed"
    assert (report.backend, report.scorer, report.weights_dtype) == ("torch", expected_scorer, "float32")
    assert report.tolerance == 2e-3
    assert str(report).endswith(f"{len(CHECKS)}/{len(CHECKS)} checks passed")


@pytest.mark.mlx
@pytest.mark.skipif(not mlx_available(), reason="mlx and mlx-lm are not installed (pip install 'pcd-llm[mlx]')")
@pytest.mark.parametrize(("arch", "scorer"), [("llama", "packed"), ("gpt_oss", "packed"), ("ministral3", "rows")])
def test_check_backend_passes_on_mlx(arch, scorer, smol_tokenizer, tmp_path):
    folder = save_tiny(tiny_model(arch, len(smol_tokenizer)), smol_tokenizer, tmp_path)
    report = check_backend(Engine(load_mlx_twin(folder, smol_tokenizer)[0]))
    assert report.passed, str(report)
    assert (report.backend, report.scorer) == ("mlx", scorer)


def test_check_backend_fails_on_a_shifted_position(tiny_engine, monkeypatch):
    """Every tree position one step too far: packed scoring no longer equals the plain reference."""
    shift_tree_positions(monkeypatch)
    report = check_backend(tiny_engine, tol=1e-4)
    assert not report.passed and report.tolerance == 1e-4
    assert [c.name for c in report.failures][0] == "packed = one at a time"
    assert "example presets compile" not in [c.name for c in report.failures]
    assert "FAIL  packed = one at a time" in str(report)


@pytest.mark.parametrize("tol", [0, -1.0, "1e-3", True])
def test_check_backend_rejects_a_bad_tolerance(tiny_engine, tol):
    with pytest.raises(OptionError, match=f"tol: expected a positive number, but got {tol!r}"):
        check_backend(tiny_engine, tol=tol)
