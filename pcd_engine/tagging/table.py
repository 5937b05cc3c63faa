"""The columns of a tag table: one schema's extraction results as Arrow / Parquet rows (``pcd tag``, Ray Data).

One row per document. For each field of the schema, in order:

* ``<field>``: its value, typed from the schema where one Arrow type holds every allowed value (``bool``,
  ``string``, ``int64``, ``double``, a nullable one for an ``Optional``, a list of one for a multi-label field);
  any other value (an object, a list of mixed labels, a label set of mixed types) as its JSON text.
* ``<field>__probability`` for a scored field: the probability of the value (see
  :attr:`~pcd_engine.result.FieldResult.probability`).
* ``<field>__truncated`` for a generated field: whether its value hit the token limit and was cut.

Then ``warnings`` (a list of strings) and ``error`` (``"ErrorType: message"`` for a document that failed, whose
other cells are null; null otherwise). The columns are fixed by the schema alone, so every part of a job has
the same Arrow schema. :func:`row_values` reads a row back into the values :meth:`Engine.extract` returns.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pcd_engine.errors import SchemaError, pip_install, require
from pcd_engine.result import ExtractionResult
from pcd_engine.schema import FieldSpec, Schema

__all__ = ["ERROR_COLUMN", "WARNINGS_COLUMN", "TagColumn", "row_values", "tag_columns", "tag_table"]

ERROR_COLUMN = "error"
WARNINGS_COLUMN = "warnings"

ColumnPart = Literal["value", "probability", "truncated"]
Scalar = Literal["bool", "string", "int64", "double"]

_SCALARS: dict[type, Scalar] = {bool: "bool", str: "string", int: "int64", float: "double"}
_JSON_TYPES: dict[str, Scalar] = {"boolean": "bool", "string": "string", "integer": "int64", "number": "double"}


def _pa() -> Any:
    (pa,) = require("pyarrow", what="tag tables (pcd tag)", install=pip_install("tag"))
    return pa


@dataclass(frozen=True)
class TagColumn:
    """One column of a tag table that reports on a schema field.

    Attributes:
        name: The column's name.
        field: The schema field it reports on.
        part: ``"value"``, ``"probability"`` or ``"truncated"``.
        scalar: The Arrow type of a value (or of a list's items): ``"bool"``, ``"string"``, ``"int64"`` or
            ``"double"``; ``None`` for a value stored as JSON text.
        is_list: True when the value is a list of ``scalar`` (a multi-label field).
    """

    name: str
    field: str
    part: ColumnPart
    scalar: Scalar | None = None
    is_list: bool = False

    @property
    def json(self) -> bool:
        """True when values are stored as their JSON text."""
        return self.part == "value" and self.scalar is None

    def arrow_type(self) -> Any:
        """The column's :mod:`pyarrow` type."""
        pa = _pa()
        if self.part == "probability":
            return pa.float64()
        if self.part == "truncated":
            return pa.bool_()
        item = {"bool": pa.bool_(), "string": pa.string(), "int64": pa.int64(), "double": pa.float64()}.get(
            self.scalar or "string"
        )
        return pa.list_(item) if self.is_list else item

    def cell(self, result: ExtractionResult) -> Any:
        """This column's cell for ``result``."""
        f = result.fields[self.field]
        if self.part == "probability":
            return f.probability
        if self.part == "truncated":
            return f.truncated
        if self.json:
            return json.dumps(f.value, ensure_ascii=False)
        if self.scalar == "double" and f.value is not None:
            return float(f.value)
        return f.value


def _label_scalar(values: Sequence[Any]) -> Scalar | None:
    kinds = {type(v) for v in values if v is not None}
    return _SCALARS.get(next(iter(kinds))) if len(kinds) == 1 else None


def _open_scalar(spec: FieldSpec) -> Scalar | None:
    kind = spec.value_schema.get("type")
    if isinstance(kind, list):
        kinds = [k for k in kind if k != "null"]
        kind = kinds[0] if len(kinds) == 1 else None
    return _JSON_TYPES.get(kind) if isinstance(kind, str) else None


def _value_column(spec: FieldSpec) -> TagColumn:
    if spec.kind == "open":
        return TagColumn(spec.name, spec.name, "value", _open_scalar(spec))
    scalar = _label_scalar(spec.values)
    if spec.kind == "multi":
        return TagColumn(spec.name, spec.name, "value", scalar, is_list=scalar is not None)
    return TagColumn(spec.name, spec.name, "value", scalar)


def tag_columns(schema: Schema, *, reserved: Sequence[str] = ()) -> tuple[TagColumn, ...]:
    """The field columns of ``schema``'s tag table, in order (``warnings`` and ``error`` follow them).

    Args:
        schema: The compiled schema.
        reserved: Other column names the table holds (an id column, columns passed through).

    Raises:
        SchemaError: If a column name is taken twice (a field named ``error``, or ``x__probability`` next to a
            field ``x``, or one of ``reserved``).
    """
    columns: list[TagColumn] = []
    for spec in schema.fields:
        columns.append(_value_column(spec))
        if spec.scored:
            columns.append(TagColumn(f"{spec.name}__probability", spec.name, "probability"))
        else:
            columns.append(TagColumn(f"{spec.name}__truncated", spec.name, "truncated"))
    taken: dict[str, str] = {name: "a column of the input" for name in reserved}
    taken.update({WARNINGS_COLUMN: "the warnings column", ERROR_COLUMN: "the error column"})
    for column in columns:
        if column.name in taken:
            raise SchemaError(
                f"Tag table of {schema.title!r}: expected distinct column names, but field {column.field!r} needs a "
                f"column {column.name!r}, which is {taken[column.name]}. Rename the field or the other column."
            )
        taken[column.name] = f"the {column.part} column of field {column.field!r}"
    return tuple(columns)


def _error_text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {' '.join(str(exc).split()) or type(exc).__name__}"


def tag_table(
    schema: Schema,
    outcomes: Sequence[ExtractionResult | BaseException | str],
    *,
    leading: Mapping[str, Any] | None = None,
    columns: Sequence[TagColumn] | None = None,
) -> Any:
    """A :class:`pyarrow.Table` of tag rows, one per outcome.

    Args:
        schema: The compiled schema the results fill in.
        outcomes: Per document: its result, the exception that failed it, or an error message.
        leading: Columns to put first (for example the ids), each a pyarrow array or a list with one value per
            outcome.
        columns: The field columns, when already computed with :func:`tag_columns`.

    Returns:
        The table, with the columns of :func:`tag_columns` after ``leading``.

    Raises:
        BackendUnavailableError: If pyarrow is not installed.
        SchemaError: If column names clash (see :func:`tag_columns`).
    """
    pa = _pa()
    leading = dict(leading or {})
    columns = tuple(columns) if columns is not None else tag_columns(schema, reserved=list(leading))
    arrays: dict[str, Any] = {}
    for name, values in leading.items():
        arrays[name] = values if isinstance(values, (pa.Array, pa.ChunkedArray)) else pa.array(values)
    results = [o if isinstance(o, ExtractionResult) else None for o in outcomes]
    for column in columns:
        cells = [None if r is None else column.cell(r) for r in results]
        arrays[column.name] = pa.array(cells, type=column.arrow_type())
    arrays[WARNINGS_COLUMN] = pa.array(
        [list(r.warnings) if r is not None else [] for r in results], type=pa.list_(pa.string())
    )
    errors = [
        None if isinstance(o, ExtractionResult) else o if isinstance(o, str) else _error_text(o) for o in outcomes
    ]
    arrays[ERROR_COLUMN] = pa.array(errors, type=pa.string())
    return pa.table(arrays)


def row_values(schema: Schema, row: Mapping[str, Any]) -> dict[str, Any] | None:
    """The values of one tag-table row (a mapping of column to cell, as ``Table.to_pylist()`` gives), as
    :attr:`~pcd_engine.result.ExtractionResult.values` has them: JSON cells parsed, in schema order. ``None`` for
    an error row."""
    if row.get(ERROR_COLUMN) is not None:
        return None
    out = {}
    for spec in schema.fields:
        column = _value_column(spec)
        cell = row[column.name]
        out[spec.name] = json.loads(cell) if column.json and cell is not None else cell
    return out
