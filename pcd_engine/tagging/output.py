"""The output of a tagging job (``pcd tag``, :func:`~pcd_engine.tagging.job.tag_corpus`): the Parquet file, its
parts folder and job file (:class:`TagOutput`), what makes two runs the same job (:func:`job_identity`), and how a
finished table is read back (:func:`read_tag_table`). See :mod:`pcd_engine.tagging.job` for the job itself.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pcd_engine.errors import InputError, pip_install, require
from pcd_engine.options import ExtractOptions
from pcd_engine.schema import Schema

__all__ = [
    "JOB_KEY",
    "TagOutput",
    "atomic_write_text",
    "check_output",
    "job_identity",
    "output_path",
    "parquet",
    "read_tag_table",
]

JOB_KEY = b"pcd.tag"
"""The Parquet metadata key of an output's job description."""


def parquet() -> Any:
    """``pyarrow.parquet``, or an error that says how to install it."""
    (pq,) = require("pyarrow.parquet", what="pcd tag (Parquet output)", install=pip_install("tag"))
    return pq


def job_identity(
    schema: Schema, *, model: str, options: ExtractOptions | None = None, columns: Mapping[str, str | None]
) -> dict[str, Any]:
    """What makes two runs the same job: the schema, the model, the options that change values, the input columns.

    Args:
        schema: The compiled schema.
        model: The model as the user named it resolved to a path or repo id, with its backend and dtype.
        options: The extraction options given (unset ones are the engine's defaults).
        columns: The input columns read (``{"text": ..., "id": ...}``).
    """
    set_fields = (options or ExtractOptions()).set_fields()
    for fitted in ("calibration", "head"):  # a calibration or a head is part of the job as the JSON it is saved as
        if fitted in set_fields:
            set_fields[fitted] = set_fields[fitted].to_json()
    return {
        "schema": {"title": schema.title, "fingerprint": schema.fingerprint, "json": schema.json_schema()},
        "model": model,
        "options": json.loads(json.dumps(set_fields, default=repr, sort_keys=True)),
        "columns": dict(columns),
    }


def _differences(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    names = {"schema": "schema", "model": "model", "options": "options", "columns": "input columns"}
    out = []
    for key, name in names.items():
        if old.get(key) != new.get(key):
            if key == "schema":
                out.append(f"schema ({old.get('schema', {}).get('title')!r} then, {new['schema']['title']!r} now)")
            else:
                out.append(f"{name} ({old.get(key)!r} then, {new[key]!r} now)")
    return out


class TagOutput:
    """The output file, its parts folder and job file, and the lock."""

    def __init__(self, path: Path, identity: Mapping[str, Any]) -> None:
        self.path = path
        self.parts = path.with_name(path.name + ".parts")
        self.job_file = self.parts / "job.json"
        self.identity = dict(identity)
        self._next = 0

    def check(self, *, overwrite: bool) -> None:
        """Start afresh (``overwrite``) or make sure what is there was written by this job."""
        if overwrite:
            shutil.rmtree(self.parts, ignore_errors=True)
            if self.path.exists():
                self.path.unlink()
            return
        for where, old in (("its parts", self._job_of_parts()), ("it", self._job_of_output())):
            if old is not None and old != self.identity:
                differs = "; ".join(_differences(old, self.identity)) or "its description"
                raise InputError(
                    f"Output {str(self.path)!r}: expected {where} to come from this job, but the {differs} differ. "
                    "Pass --overwrite (overwrite=True) to start again, or choose another output."
                )

    def _job_of_parts(self) -> dict[str, Any] | None:
        if not self.job_file.exists():
            return None
        try:
            job = json.loads(self.job_file.read_text(encoding="utf-8"))
        except (OSError, ValueError, RecursionError) as exc:
            raise InputError(f"Output parts {str(self.parts)!r}: expected a readable job.json ({exc}).") from None
        if not isinstance(job, dict):
            raise InputError(
                f"Output parts {str(self.parts)!r}: expected job.json to hold a JSON object, but got "
                f"{type(job).__name__}. Pass --overwrite (overwrite=True) to start again."
            )
        return job

    def _job_of_output(self) -> dict[str, Any] | None:
        if not self.path.exists():
            return None
        try:
            metadata = parquet().read_schema(self.path).metadata or {}
        except Exception as exc:  # noqa: BLE001 - pyarrow raises several types for a file that is not Parquet
            raise InputError(
                f"Output {str(self.path)!r}: expected a Parquet file written by pcd tag, but reading it failed "
                f"({exc}). Pass --overwrite to replace it."
            ) from None
        if JOB_KEY not in metadata:
            raise InputError(
                f"Output {str(self.path)!r}: expected a Parquet file written by pcd tag, but it has no pcd job "
                "description. Pass --overwrite to replace it."
            )
        return dict(json.loads(metadata[JOB_KEY]))

    def part_files(self) -> list[Path]:
        return sorted(self.parts.glob("part-*.parquet")) if self.parts.exists() else []

    def start(self) -> None:
        """Make the parts folder, write the job file, clear temporary files a killed run left."""
        self.parts.mkdir(parents=True, exist_ok=True)
        for stale in self.parts.glob("*.tmp"):
            stale.unlink()
        atomic_write_text(self.job_file, json.dumps(self.identity, indent=2, ensure_ascii=False))
        numbers = [int(p.stem.split("-")[1]) for p in self.part_files()]
        self._next = max(numbers, default=-1) + 1

    def done_ids(self) -> set[str]:
        pq = parquet()
        done: set[str] = set()
        for source in ([self.path] if self.path.exists() else []) + self.part_files():
            done.update(pq.read_table(source, columns=["id"]).column("id").to_pylist())
        return done

    def write_part(self, table: Any) -> None:
        final = self.parts / f"part-{self._next:06d}.parquet"
        self._next += 1
        tmp = final.with_name(final.name + ".tmp")
        parquet().write_table(table, tmp)
        os.replace(tmp, final)

    def finish(self, order: Sequence[str], empty: Any) -> tuple[Any, int]:
        """Merge the earlier output and the parts into the output, in ``order``; returns it and the rows dropped."""
        pq = parquet()
        import pyarrow as pa

        sources = ([self.path] if self.path.exists() else []) + self.part_files()
        tables = [pq.read_table(s).replace_schema_metadata(None) for s in sources]
        merged = pa.concat_tables([empty, *tables], promote_options="none") if tables else empty
        first: dict[str, int] = {}
        for index, doc_id in enumerate(merged.column("id").to_pylist()):
            first.setdefault(doc_id, index)
        missing = [doc_id for doc_id in order if doc_id not in first]
        if missing:
            raise InputError(f"Output {str(self.path)!r}: expected every document tagged, but {len(missing)} are not.")
        dropped = len(set(first) - set(order))
        out = merged.take(pa.array([first[doc_id] for doc_id in order], type=pa.int64()))
        out = out.replace_schema_metadata({JOB_KEY: json.dumps(self.identity, ensure_ascii=False).encode("utf-8")})
        tmp = self.path.with_name(self.path.name + ".tmp")
        pq.write_table(out, tmp)
        os.replace(tmp, self.path)
        shutil.rmtree(self.parts, ignore_errors=True)
        return out, dropped


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` under a temporary name, then rename it into place."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def check_output(output: str | os.PathLike[str], identity: Mapping[str, Any], *, overwrite: bool = False) -> None:
    """Fail early, before any model loads, when ``output`` cannot take this job: a name that is not
    ``.parquet``, a missing folder, or (unless ``overwrite``) an output or parts written by another job.

    Raises:
        InputError: Saying which.
    """
    path = output_path(output)
    if not overwrite:
        TagOutput(path, identity).check(overwrite=False)


def output_path(output: str | os.PathLike[str]) -> Path:
    path = Path(output)
    if path.suffix.lower() not in (".parquet", ".pq"):
        raise InputError(f"Output {str(path)!r}: expected a .parquet file name, but got {path.suffix or 'none'}.")
    if not path.parent.exists():
        raise InputError(
            f"Output {str(path)!r}: expected an existing folder {str(path.parent)!r}, but it does not exist."
        )
    if not path.parent.is_dir():
        raise InputError(f"Output {str(path)!r}: expected {str(path.parent)!r} to be a folder, but it is a file.")
    for what, there in (("the table", path), ("its parts folder", Path(f"{path}.parts"))):
        if there.exists() and there.is_dir() != (what != "the table"):
            kind = "a folder" if there.is_dir() else "a file"
            raise InputError(f"Output {str(path)!r}: expected {what} {str(there)!r} to be pcd's own, but it is {kind}.")
    try:  # a read-only or pseudo filesystem (/proc, /sys) says so here, not after the model has loaded
        with tempfile.TemporaryFile(dir=path.parent):
            pass
    except OSError as exc:
        raise InputError(
            f"Output {str(path)!r}: expected a folder pcd can write in, but creating a file in {str(path.parent)!r} "
            f"failed ({exc.strerror or exc})."
        ) from None
    return path


def read_tag_table(path: str | os.PathLike[str]) -> tuple[Any, dict[str, Any]]:
    """A tag table and its job description.

    Raises:
        InputError: If the file cannot be read or was not written by ``pcd tag``.
    """
    pq = parquet()
    try:
        table = pq.read_table(path)
    except Exception as exc:  # noqa: BLE001 - pyarrow raises several types for a file that is not Parquet
        raise InputError(f"Tag table {str(path)!r}: expected a Parquet file, but reading it failed ({exc}).") from None
    metadata = table.schema.metadata or {}
    if JOB_KEY not in metadata:
        raise InputError(f"Tag table {str(path)!r}: expected a file written by pcd tag, but it has no job description.")
    return table.replace_schema_metadata(None), dict(json.loads(metadata[JOB_KEY]))
