"""``head`` names decision heads only (:mod:`pcd_engine.heads`): the prompt's cached part is its *preamble*
(:class:`~pcd_engine.run.compile_cache.SchemaPrompt`), a label path's nodes down to its identifying token its *stem*,
attention heads are ``attention_heads`` and a table's column names its ``columns``."""

from __future__ import annotations

import ast
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "pcd_engine"
# The packages that own decision heads and what decides with them.
OWNERS = ("heads/", "deciders/", "calibrate/")
# Outside them, the identifiers that say "head", each naming a decision head (or the option that carries one).
DECISION_HEAD_NAMES = {"Head", "head", "_head", "headed", "HEADED_KINDS", "heads", "ServedHead", "served_heads",
                       "_refuse_head"}  # fmt: skip
# Other words that merely contain the letters: HTTP headers, "ahead", and requests' HTTP HEAD.
NOT_THE_WORD = re.compile(r"header|ahead|^attention_heads$", re.IGNORECASE)


def head_identifiers(source: str) -> set[str]:
    """Every identifier of ``source`` (names, attributes, definitions, arguments, keywords, imports) with ``head`` in
    it, other than the words that merely contain it."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Name):
            names = [node.id]
        elif isinstance(node, ast.Attribute):
            names = [node.attr]
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names = [node.name]
        elif isinstance(node, ast.arg):
            names = [node.arg]
        elif isinstance(node, ast.keyword) and node.arg:
            names = [node.arg]
        elif isinstance(node, ast.alias):
            names = [node.asname or node.name.rpartition(".")[2]]
        else:
            continue
        found.update(n for n in names if "head" in n.lower() and not NOT_THE_WORD.search(n))
    return found


def test_head_names_decision_heads_only():
    wrong: dict[str, set[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel.startswith(OWNERS):
            continue
        others = head_identifiers(path.read_text(encoding="utf-8")) - DECISION_HEAD_NAMES
        if rel == "models/resolve.py":
            others.discard("head")  # requests' Session.head: an HTTP HEAD request
        if others:
            wrong[rel] = others
    assert wrong == {}


def test_the_prompt_head_names_are_gone():
    """The cached part of the prompt had five names with ``head`` in them; none is left anywhere in the package."""
    old = re.compile(r"\b(head_ids|head_key|prefill_head|head_cache_size|head_tokens|head_nodes)\b")
    hits = [p.relative_to(PACKAGE).as_posix() for p in PACKAGE.rglob("*.py") if old.search(p.read_text("utf-8"))]
    assert hits == []


def test_the_scan_can_fail():
    source = "def prefill_head(heads, *, head_room=1):\n    return heads.preamble_head + len(header) + ahead\n"
    assert head_identifiers(source) == {"prefill_head", "heads", "head_room", "preamble_head"}
