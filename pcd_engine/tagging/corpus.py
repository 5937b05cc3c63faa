"""The documents of a corpus to tag (``pcd tag``): JSONL, CSV or Parquet rows, or a folder of text files.

Every document gets an id, a string: the ``id_column``'s value when one is named, else a stable id of its place
in the input (the row number, from 0, for a table; the path relative to the folder for a text file). Ids must be
unique, since resuming a job skips the ids already written. A document that cannot be read (a text file that is
not UTF-8, a row whose text is missing) keeps its id and carries the reason in :attr:`CorpusDocument.error`, so
that the job writes an error row for it instead of losing it. A file that cannot be read at all, a missing
column or a repeated id is an :class:`~pcd_engine.errors.InputError` before any model work.
"""

from __future__ import annotations

import csv
import json
import os
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pcd_engine.errors import InputError, pip_install, require
from pcd_engine.jsonl import json_lines

__all__ = ["FORMATS", "CorpusDocument", "check_unique", "read_corpus", "read_records"]

FORMATS = ("jsonl", "csv", "parquet", "folder")
"""The input layouts :func:`read_corpus` reads."""

_SUFFIXES = {".jsonl": "jsonl", ".ndjson": "jsonl", ".csv": "csv", ".parquet": "parquet", ".pq": "parquet"}


@dataclass(frozen=True)
class CorpusDocument:
    """One document of a corpus.

    Attributes:
        id: The document's id, unique within the corpus.
        text: Its text (empty when it could not be read).
        error: Why it could not be read, or ``None``.
    """

    id: str
    text: str
    error: str | None = None


def _format_of(path: Path) -> str:
    if path.is_dir():
        return "folder"
    kind = _SUFFIXES.get(path.suffix.lower())
    if kind is None:
        raise InputError(
            f"Input {str(path)!r}: expected a .jsonl, .csv or .parquet file or a folder of text files, but got a "
            f"{path.suffix or 'suffix-less'} file."
        )
    return kind


def _cell_id(value: Any, where: str, column: str) -> str:
    if value is None or isinstance(value, (dict, list)) or (isinstance(value, str) and not value.strip()):
        raise InputError(f"Input {where}: expected an id in column {column!r}, but got {value!r}.")
    return value if isinstance(value, str) else json.dumps(value)


def _cell_text(value: Any, column: str) -> tuple[str, str | None]:
    if isinstance(value, str):
        return value, None
    return "", f"expected text in column {column!r}, but got {'nothing' if value is None else type(value).__name__}"


def _missing_column(path: Path, column: str, available: list[str], what: str) -> InputError:
    return InputError(
        f"Input {str(path)!r}: expected a {what} column {column!r}, but the columns are {sorted(available)}."
    )


def _csv_rows(path: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    csv.field_size_limit(min(sys.maxsize, 2**31 - 1))  # whole articles in one cell
    with path.open(encoding="utf-8", newline="") as f:
        reader = csv.DictReader(f)
        if reader.fieldnames is None:
            raise InputError(f"Input {str(path)!r}: expected a CSV file with a header row, but it is empty.")
        for row in reader:
            yield f"{path}:{reader.line_num}", row


def _parquet_rows(path: Path, columns: list[str]) -> Iterator[tuple[str, dict[str, Any]]]:
    (pq,) = require("pyarrow.parquet", what="reading Parquet input", install=pip_install("tag"))
    try:
        names = pq.read_schema(path).names
    except Exception as exc:  # noqa: BLE001 - pyarrow raises several types for a file that is not Parquet
        raise InputError(f"Input {str(path)!r}: expected a Parquet file, but reading it failed ({exc}).") from None
    for column in columns:
        if column not in names:
            raise _missing_column(path, column, names, "text" if column == columns[0] else "id")
    table = pq.read_table(path, columns=columns)
    for index, row in enumerate(table.to_pylist()):
        yield f"{path} row {index}", row


def _table_documents(path: Path, kind: str, text_column: str, id_column: str | None) -> list[CorpusDocument]:
    columns = [text_column] + ([id_column] if id_column else [])
    if kind == "jsonl":
        rows = json_lines(path)
    elif kind == "csv":
        rows = _csv_rows(path)
    else:
        rows = _parquet_rows(path, columns)
    out = []
    for index, (where, row) in enumerate(rows):
        for column in columns:
            if column not in row:
                if kind == "jsonl":
                    raise InputError(
                        f"Input {where}: expected a {'text' if column == text_column else 'id'} key {column!r}, "
                        f"but the keys are {sorted(row)}."
                    )
                raise _missing_column(path, column, list(row), "text" if column == text_column else "id")
        doc_id = _cell_id(row[id_column], where, id_column) if id_column else str(index)
        text, error = _cell_text(row[text_column], text_column)
        out.append(CorpusDocument(doc_id, text, error))
    return out


def _folder_documents(path: Path) -> list[CorpusDocument]:
    out = []
    for file in sorted(p for p in path.rglob("*") if p.is_file() and not p.name.startswith(".")):
        relative = file.relative_to(path)
        if any(part.startswith(".") for part in relative.parts):
            continue
        try:
            out.append(CorpusDocument(relative.as_posix(), file.read_text(encoding="utf-8")))
        except UnicodeDecodeError as exc:
            out.append(CorpusDocument(relative.as_posix(), "", f"expected a UTF-8 text file, but {exc.reason}"))
        except OSError as exc:
            out.append(CorpusDocument(relative.as_posix(), "", f"expected a readable file, but {exc.strerror}"))
    return out


def check_unique(docs: Sequence[CorpusDocument], *, where: str = "Documents") -> None:
    """Make sure no two documents share an id.

    Raises:
        InputError: Naming the first repeated id and both places, prefixed with ``where``.
    """
    seen: dict[str, int] = {}
    for index, doc in enumerate(docs):
        if doc.id in seen:
            raise InputError(
                f"{where}: expected unique document ids, but id {doc.id!r} is used by documents {seen[doc.id]} and "
                f"{index} (name an id column with unique values, or leave it out)."
            )
        seen[doc.id] = index


def read_corpus(
    path: str | os.PathLike[str], *, text_column: str = "text", id_column: str | None = None, limit: int | None = None
) -> list[CorpusDocument]:
    """Read the documents to tag.

    Args:
        path: A ``.jsonl`` / ``.ndjson`` file (one JSON object per line), a ``.csv`` file with a header row, a
            ``.parquet`` file, or a folder whose files (searched recursively; hidden ones skipped) are one
            document each.
        text_column: The column (or JSON key) holding each document's text; not used for a folder.
        id_column: The column holding each document's id; ``None`` numbers the rows from 0 (a folder's ids are
            the files' relative paths either way).
        limit: Read only the first ``limit`` documents.

    Returns:
        The documents, in input order.

    Raises:
        InputError: If the path is missing or of an unknown kind, a file cannot be read or parsed, a column is
            missing, an id is missing, or two documents share an id; ``limit`` is not positive.
    """
    path = Path(path)
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise InputError(f"Input limit: expected a positive integer, but got {limit!r}.")
    if not path.exists():
        raise InputError(f"Input {str(path)!r}: expected a file or a folder, but it does not exist.")
    kind = _format_of(path)
    try:
        docs = _folder_documents(path) if kind == "folder" else _table_documents(path, kind, text_column, id_column)
    except UnicodeDecodeError as exc:
        raise InputError(f"Input {str(path)!r}: expected UTF-8 text, but {exc.reason} at byte {exc.start}.") from None
    except csv.Error as exc:
        raise InputError(f"Input {str(path)!r}: expected CSV, but reading failed ({exc}).") from None
    except OSError as exc:
        raise InputError(f"Input {str(path)!r}: expected a readable file, but reading failed ({exc}).") from None
    if limit is not None:
        docs = docs[:limit]
    check_unique(docs, where=f"Input {str(path)!r}")
    if not docs:
        raise InputError(f"Input {str(path)!r}: expected at least one document, but found none.")
    return docs


def read_records(path: str | os.PathLike[str], *, what: str = "Input") -> list[tuple[str, dict[str, Any]]]:
    """Every row of a ``.jsonl``, ``.csv`` or ``.parquet`` table with all its columns, each with where it came from
    (``file:LINE`` or ``file row N``): what ``pcd fit`` reads labelled examples from.

    Raises:
        InputError: If the path is missing, a folder or of an unknown kind, or cannot be read or parsed; naming
            ``what``.
    """
    path = Path(path)
    if not path.is_file():
        raise InputError(f"{what} {str(path)!r}: expected a .jsonl, .csv or .parquet file, but there is none.")
    kind = _format_of(path)
    try:
        if kind == "jsonl":
            return list(json_lines(path, what=what))
        if kind == "csv":
            return list(_csv_rows(path))
        (pq,) = require("pyarrow.parquet", what="reading Parquet input", install=pip_install("tag"))
        try:
            table = pq.read_table(path)
        except Exception as exc:  # noqa: BLE001 - pyarrow raises several types for a file that is not Parquet
            raise InputError(f"{what} {str(path)!r}: expected a Parquet file, but reading it failed ({exc}).") from None
        return [(f"{path} row {i}", row) for i, row in enumerate(table.to_pylist())]
    except UnicodeDecodeError as exc:
        raise InputError(f"{what} {str(path)!r}: expected UTF-8 text, but {exc.reason} at byte {exc.start}.") from None
    except csv.Error as exc:
        raise InputError(f"{what} {str(path)!r}: expected CSV, but reading failed ({exc}).") from None
