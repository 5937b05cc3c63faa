"""JSON-lines files read line by line, each object with where it came from (``file:LINE``): the corpora of ``pcd
tag`` and ``pcd fit``, datasets and decision cases. A utility with no pcd imports but the errors, below every layer
that reads such files.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from pcd_engine.errors import InputError, PCDError

__all__ = ["json_lines"]


def json_lines(
    path: Path,
    *,
    what: str = "Input",
    error: type[PCDError] = InputError,
    skip: Callable[[str, str, bool], None] | None = None,
) -> Iterator[tuple[str, dict[str, Any]]]:
    """The JSON objects of a JSON-lines file with where each came from (``file:LINE``); blank lines are skipped.

    Args:
        path: The file.
        what: What the file is, for messages.
        error: The error a line that is not a JSON object raises.
        skip: Instead of raising, call ``skip(where, problem, torn)`` for such a line and go on; ``torn`` is true
            for a last line without its newline (what a crash while writing leaves).

    Raises:
        PCDError: ``error`` (an :class:`~pcd_engine.errors.InputError` by default), naming ``what`` and the line,
            for a line that is not a JSON object (without ``skip``).
    """
    with path.open(encoding="utf-8", errors="strict" if skip is None else "replace") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"{path}:{number}"
            try:
                row = json.loads(line)
                problem = None if isinstance(row, dict) else f"got {type(row).__name__}"
            except json.JSONDecodeError as exc:
                problem = f"got bad JSON ({exc.msg})"
            if problem is None:
                yield where, row
            elif skip is None:
                raise error(f"{what} {where}: expected a JSON object per line, but {problem}.")
            else:
                skip(where, problem, not line.endswith("\n"))
