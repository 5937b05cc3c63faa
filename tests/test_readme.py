"""The README runs as written: its Python blocks in order in one fresh interpreter (as a reader pastes them into one
session), and each shell block in a folder of small example files (:mod:`tests.readme_files`), offline, on the
embedded model.

A block that cannot run here says so beside it, in the README, with a paragraph that starts ``*Not run by the tests``
just before the block (a Hub model, a GPU, s3, a server that blocks, an install from PyPI, the test run itself);
exactly those are skipped. A shell block that calls the clone's own ``./scripts/`` runs in the clone; every other one
in a fresh folder of the example files, where each file it says it writes (``-o``, ``--output``, ``--plot``,
``--json``) must then exist. The counts of blocks run and marked are printed at the end of the run
(tests/conftest.py).
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.readme_files import README_FILES, write_readme_files

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
FENCE = re.compile(r"^```(?P<lang>\w*)\n(?P<body>.*?)^```", re.S | re.M)
MARKER = "*Not run by the tests"
SHELL = ("bash", "sh", "shell")
WRITES = ("-o", "--output", "--plot", "--json")
"""The options whose value is a file the command writes."""


def readme_blocks() -> list[tuple[int, str, str, bool]]:
    """Every fenced block: ``(line, language, source, marked not run)``; a block is marked when the paragraph just
    before it starts with :data:`MARKER`."""
    text = README.read_text(encoding="utf-8")
    out = []
    for match in FENCE.finditer(text):
        paragraphs = [p.strip() for p in text[: match.start()].split("\n\n") if p.strip()]
        marked = bool(paragraphs) and paragraphs[-1].startswith(MARKER)
        out.append((text.count("\n", 0, match.start()) + 1, match["lang"], match["body"], marked))
    return out


BLOCKS = readme_blocks()
SHELL_BLOCKS = [(line, body) for line, lang, body, skip in BLOCKS if lang in SHELL and not skip]


def written_files(body: str) -> list[str]:
    """The files a shell block's commands say they write: the value after each of :data:`WRITES`."""
    out = []
    for command in body.splitlines():
        words = [part for word in shlex.split(command, comments=True) for part in word.split("=", 1)]
        out += [value for flag, value in zip(words, words[1:]) if flag in WRITES]
    return out


def test_the_parser_finds_the_blocks_and_their_markers(record_property):
    assert sum(lang == "python" for _, lang, _, _ in BLOCKS) >= 10
    assert len(SHELL_BLOCKS) >= 6
    marked = [body.splitlines()[0] for _, lang, body, skip in BLOCKS if skip]
    assert "import ray" in marked and "from openai import OpenAI" in marked
    assert any(first.startswith("./scripts/test") for first in marked)
    assert any(first.startswith("pcd serve") for first in marked)
    written = written_files("pcd fit x -o a.json --json=b  # --output c\npcd bench --plot p.png --json j.json")
    assert written == ["a.json", "b", "p.png", "j.json"]
    record_property("readme_blocks", {
        "python": sum(lang == "python" and not skip for _, lang, _, skip in BLOCKS),
        "shell": len(SHELL_BLOCKS),
        "marked": [line for line, lang, _, skip in BLOCKS if skip],
    })  # fmt: skip


def test_the_example_files_are_the_ones_the_blocks_name(tmp_path):
    write_readme_files(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(README_FILES)
    read = {word for _, body in SHELL_BLOCKS for word in shlex.split(body, comments=True)}
    named = {w.rstrip("/") for w in read if w.rstrip("/") in README_FILES}
    assert named == set(README_FILES)  # no example file goes unread (a file a block reads and lacks fails its run)


def _environment() -> dict[str, str]:
    """The test's environment, with this interpreter's ``pcd`` first on the path and the Hub off."""
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    return {**os.environ, "PATH": path, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


@pytest.mark.real_model
@pytest.mark.xdist_group("readme-python")
def test_the_readmes_python_blocks_run_as_written(tmp_path, record_property):
    runnable = [(line, body) for line, lang, body, skip in BLOCKS if lang == "python" and not skip]
    program = ["ns = {'__name__': '__main__'}"]
    for line, body in runnable:
        program.append(f"print('README block at line {line}', flush=True)")
        program.append(f"exec(compile({body!r}, 'README.md block at line {line}', 'exec'), ns)")
    done = subprocess.run(
        [sys.executable, "-c", "\n".join(program)], cwd=tmp_path, env={**_environment(), "TQDM_DISABLE": "1"},
        capture_output=True, text=True, timeout=1200,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    assert done.stdout.count("README block at line") == len(runnable)
    record_property("readme_ran", [f"python {line}" for line, _ in runnable])


def _demo_rows() -> list[list[str]]:
    """The field and value of each row of the demo's output the README shows (the plain block after the demo's)."""
    demo = next(line for line, body in SHELL_BLOCKS if "./scripts/demo" in body)
    after = next(body for line, lang, body, _ in BLOCKS if lang == "" and line > demo)
    return [[cell.strip() for cell in row.strip("|").split("|")][:2] for row in after.splitlines()]


def shell_group(body: str) -> str:
    """A shell block's test group, named by its first command's first two words (``readme-pcd-fit``): each block
    runs on whichever worker is free, and tests/conftest.py can hand the long ones out first."""
    return "readme-" + "-".join(body.split()[:2])


@pytest.mark.real_model
@pytest.mark.parametrize(
    "line, body", [pytest.param(*b, marks=pytest.mark.xdist_group(shell_group(b[1])), id=f"line-{b[0]}")
                   for b in SHELL_BLOCKS],
)  # fmt: skip
def test_the_readmes_shell_blocks_run_as_written(line, body, tmp_path, record_property):
    folder = ROOT if body.lstrip().startswith("./scripts/") else tmp_path  # the clone's own scripts run in it
    if folder == tmp_path:
        write_readme_files(tmp_path)
    done = subprocess.run(
        ["bash", "-e", "-o", "pipefail", "-c", body], cwd=folder, env=_environment(), capture_output=True,
        text=True, timeout=900,
    )  # fmt: skip
    assert done.returncode == 0, f"README block at line {line}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    missing = [name for name in written_files(body) if not (folder / name).exists()]
    assert not missing, f"README block at line {line} did not write {missing}"
    if "./scripts/demo" in body:  # the first screen's output is the demo's
        for field, value in _demo_rows():
            assert re.search(rf"\|\s*{re.escape(field)}\s*\|\s*{re.escape(value)}\s*\|", done.stdout), (field, value)
    record_property("readme_ran", [f"shell {line}"])
