"""What every fitted file pcd reads has in common (a calibration, a decision head): it is JSON, read as untrusted
input, and it is tied to the schema and the model it was fitted on, which it must name and match before any use.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol, TypeVar

from pcd_engine.errors import InputError, OptionError
from pcd_engine.schema import Schema

__all__ = [
    "Reader",
    "check_fitted_on",
    "finite_real",
    "from_fitted_json",
    "read_json_file",
    "same_labels",
    "write_json_file",
]

T = TypeVar("T")


class Reader(Protocol):
    """What fitting a calibration or a head needs of the engine: its public reading of documents (the
    :class:`~pcd_engine.engine.Engine` is one). Named here so that the fits never reach up to the engine's layer."""

    @property
    def model_id(self) -> str:
        """Which model reads (what a fitted file is tied to)."""

    def resolve(self, options: Any = None, **knobs: Any) -> Any:
        """The options a call runs with (an :class:`~pcd_engine.options.ExtractOptions`)."""

    def read_closed(self, texts: Any, schema: Any, options: Any = None, *, batch_size: int | None = None) -> Any:
        """Each text's closed fields' results, decided under ``options`` (nothing generated)."""

    def read_features(
        self, texts: Any, schema: Any, options: Any = None, *, fields: Any = None, batch_size: int | None = None
    ) -> Any:
        """:meth:`read_closed`, with the features a head reads of ``fields``."""


def finite_real(value: Any) -> float | None:
    """``value`` as a float when it is a finite real number (not a bool, not NaN or infinite, not an integer too
    large for a float); ``None`` otherwise. The one reading of a number a fitted file holds."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def read_json_file(path: str | os.PathLike[str], kind: str) -> Any:
    """The JSON data of a fitted file.

    Args:
        path: The file.
        kind: What it is, for messages (``"Calibration"``, ``"Head"``).

    Raises:
        InputError: If it is missing, unreadable, not UTF-8, not JSON, or nested too deep.
    """
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError(f"{kind} {str(path)!r}: expected an existing file, but it does not exist.") from None
    except (OSError, ValueError, RecursionError) as exc:
        raise InputError(f"{kind} {str(path)!r}: expected a JSON file, but reading failed ({exc}).") from None


def write_json_file(path: str | os.PathLike[str], data: Any, *, indent: int | None = None) -> Path:
    """Write ``data`` as UTF-8 JSON to ``path`` (what :func:`read_json_file` reads back)."""
    out = Path(path)
    out.write_text(json.dumps(data, indent=indent, ensure_ascii=False) + "\n", encoding="utf-8")
    return out


def from_fitted_json(data: Any, *, where: str, kind: str, fmt: str, build: Callable[[Mapping[str, Any]], T]) -> T:
    """``build(data)`` for a fitted file's JSON data, its format checked first and every failure an InputError.

    Args:
        data: The JSON data.
        where: The file or option, for messages.
        kind: What it is (``"pcd calibration"``), for messages.
        fmt: The format it must name (``"pcd-calibration/1"``).
        build: Makes the object; the values are checked where they are held (an OptionError naming them).

    Raises:
        InputError: If the format is another, an entry is missing, a value has the wrong type, or a check fails.
    """
    if not isinstance(data, Mapping) or data.get("format") != fmt:
        got = data.get("format") if isinstance(data, Mapping) else type(data).__name__
        raise InputError(f"{where}: expected a {kind} ({fmt!r}), but got format {got!r}.")
    try:
        return build(data)
    except OptionError as exc:  # named where the value is held
        raise InputError(f"{where}: {exc}") from None
    except KeyError as exc:
        raise InputError(f"{where}: expected a {kind}, but it has no {exc} entry.") from None
    except TypeError as exc:
        raise InputError(f"{where}: expected a {kind}, but it is malformed ({exc}).") from None


def check_fitted_on(
    kind: str, *, fingerprint: str, title: str, model: str, schema: Schema, model_id: str, hint: str = ""
) -> None:
    """Refuse a schema or model other than the ones a fitted file names.

    Args:
        kind: What was fitted, for messages.
        fingerprint: The fingerprint of the schema it was fitted on.
        title: That schema's title.
        model: The model it was fitted with.
        schema: The schema it is used with.
        model_id: The model it is used with.
        hint: Said after a schema mismatch (what to do).

    Raises:
        OptionError: On a mismatch, naming both sides.
    """
    if schema.fingerprint != fingerprint:
        raise OptionError(
            f"{kind}: expected the schema it was fitted on ({title!r}, fingerprint {fingerprint}), but got "
            f"{schema.title!r} (fingerprint {schema.fingerprint}){hint}."
        )
    if model_id != model:
        raise OptionError(f"{kind}: expected the model it was fitted with ({model!r}), but got {model_id!r}.")


def same_labels(fitted: Sequence[Any], expected: Sequence[Any]) -> bool:
    """Whether a fitted file's labels are the schema's: the same values, of the same JSON types, in the same order
    (``1`` is not ``true``, ``"1"`` is not ``1``)."""
    return [(type(v), v) for v in fitted] == [(type(v), v) for v in expected]
