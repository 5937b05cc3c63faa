"""``bench_engine.py`` on two revisions of pcd, side by side in one run: did a change cost speed?

Each revision runs its own ``benchmarks/bench_engine.py`` (``--skip-ar``) in a subprocess, from its own source
tree (a ``git archive`` of the revision; the working tree for ``--after .``), alternating ``--rounds`` times on
the same machine and the same model, so that a noisy machine spreads its noise over both. The table gives, per
preset, the median over rounds of each run's medians: the 1-pass extract, the default extract, the floor (one
plain causal pass over the same tokens) and the 1-pass/floor ratio, and the after/before ratio of each time.

Usage::

    python benchmarks/compare_revisions.py --before 90ca7aa --rounds 3 --repeats 5
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
from io import BytesIO
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
KEYS = ("one_wave_ms", "default_ms", "floor_ms", "ratio")


def source_tree(rev: str, into: Path) -> Path:
    """The source of ``rev`` (``.`` for the working tree) as a folder."""
    if rev == ".":
        return ROOT
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev], capture_output=True, check=True).stdout
    folder = into / rev
    folder.mkdir(parents=True)
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        tar.extractall(folder, filter="data")
    return folder


def run_bench(tree: Path, presets: list[str], repeats: int) -> dict[str, dict[str, Any]]:
    """One run of ``tree``'s own bench_engine.py; its speed rows by preset."""
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        env = {**os.environ, "PYTHONPATH": str(tree)}
        command = [sys.executable, str(tree / "benchmarks" / "bench_engine.py"), "--skip-ar"]
        command += ["--repeats", str(repeats), "--json", out.name, "--presets", *presets]
        subprocess.run(command, cwd=tree, env=env, check=True, stdout=subprocess.DEVNULL)
        rows = json.loads(Path(out.name).read_text())["speed"]
    return {row["preset"]: row for row in rows}


def imported_from(tree: Path) -> str:
    """Where ``import pcd_engine`` resolves from ``tree`` (it must be the tree itself)."""
    code = "import pcd_engine, sys; print(pcd_engine.__file__)"
    env = {**os.environ, "PYTHONPATH": str(tree)}
    found = subprocess.run([sys.executable, "-c", code], cwd=tree, env=env, capture_output=True, text=True, check=True)
    return found.stdout.strip()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--before", required=True, help="a git revision")
    parser.add_argument("--after", default=".", help="a git revision, or . for the working tree (default)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--presets", nargs="*", default=["support_triage", "fintech_fraud", "catalogue_255"])
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory() as scratch:
        trees = {"before": source_tree(args.before, Path(scratch)), "after": source_tree(args.after, Path(scratch))}
        for name, tree in trees.items():
            where = imported_from(tree)
            if not where.startswith(str(tree)):
                raise SystemExit(f"{name}: pcd_engine resolves to {where}, not to {tree}")
        runs: dict[str, list[dict[str, dict[str, Any]]]] = {"before": [], "after": []}
        for round_ in range(args.rounds):
            for name in ("before", "after") if round_ % 2 == 0 else ("after", "before"):
                print(f"round {round_ + 1}/{args.rounds}: {name}", file=sys.stderr)
                runs[name].append(run_bench(trees[name], args.presets, args.repeats))

    def med(name: str, preset: str, key: str) -> float:
        return statistics.median(run[preset][key] for run in runs[name])

    print(f"before: {args.before}; after: {args.after}; {args.rounds} rounds (alternating), medians of {args.repeats}")
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} cpus\n")
    head = "| preset | revision | 1-pass ms | default ms | floor ms | 1-pass/floor |"
    print(head + "\n|" + "---|" * (head.count("|") - 1))
    for preset in args.presets:
        for name in ("before", "after"):
            one, default, floor, ratio = (med(name, preset, k) for k in KEYS)
            print(f"| {preset} | {name} | {one:.1f} | {default:.1f} | {floor:.1f} | {ratio:.2f}x |")
        changes = " | ".join(f"{med('after', preset, k) / med('before', preset, k):.2f}" for k in KEYS)
        print(f"| {preset} | after/before | {changes} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
