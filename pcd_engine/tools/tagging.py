"""Tagging a corpus into one Parquet table, resumable and loss-free (``pcd tag`` and :func:`tag_corpus`).

A job reads the documents (:mod:`pcd_engine.tools.corpus`), skips those whose ids its output already holds, and
tags the rest in parts: each part (a few dozen documents, decided with :meth:`Engine.extract_many`) is written
as its own Parquet file into ``OUT.parts/``, atomically (written under a temporary name, then renamed), so that
a job stopped at any moment (Ctrl-C, a killed process, a lost machine) loses at most the part in flight. When
every document is in, the parts are merged with any earlier output into ``OUT`` (again atomically), in input
order with every id exactly once, and the parts are removed. Running the same job again therefore finishes
what an interrupted run left, and adds what a grown input has new.

A job is the schema, the model, the extraction options and the input columns; it is written next to the parts
(``OUT.parts/job.json``) and into the output's Parquet metadata (key ``pcd.tag``). Resuming under a different
job is an :class:`~pcd_engine.errors.InputError` (never a silent mix); ``overwrite=True`` starts afresh. One
process at a time writes an output (a lock file ``OUT.lock`` while it runs).

The rows are :func:`~pcd_engine.tools.tag_table.tag_table`'s; a document that fails (empty, too long, a
decoding error) becomes an error row and the job goes on.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pcd_engine.errors import (
    BackendUnavailableError,
    ContextError,
    InputError,
    check_count,
    pip_install,
    require,
)
from pcd_engine.options import ExtractOptions, surface_options
from pcd_engine.run.admission import check_text
from pcd_engine.schema import Schema, compile_schema
from pcd_engine.tools.corpus import CorpusDocument, check_unique, read_corpus
from pcd_engine.tools.tag_table import ERROR_COLUMN, tag_columns, tag_table

if TYPE_CHECKING:
    from pcd_engine.engine import Engine

__all__ = [
    "DEFAULT_PART_SIZE",
    "JOB_KEY",
    "TagSummary",
    "check_output",
    "engine_parts",
    "job_identity",
    "read_tag_table",
    "run_tag_job",
    "tag_corpus",
    "tag_outcomes",
    "tag_runner",
]

RUNNERS_GROUP = "pcd_engine.tag_runners"
"""The entry-point group of the runners that live outside the engine (``ray``: pcd_integrations' Ray runner)."""

DEFAULT_PART_SIZE = 64
"""Documents per part file: the most work an interrupted job can lose."""

JOB_KEY = b"pcd.tag"
"""The Parquet metadata key of an output's job description."""

Runner = Callable[[Sequence[CorpusDocument]], Iterator[Any]]
"""Tags documents: takes the readable documents still to do (:attr:`CorpusDocument.error` unset; the job writes the
error rows of the others itself), yields pyarrow tables of finished rows (``id`` first)."""


@dataclass(frozen=True)
class TagSummary:
    """What a tagging job did.

    Attributes:
        output: The Parquet file written.
        documents: Documents in the input (and rows in the output).
        tagged: Documents tagged by this run.
        skipped: Documents already in the output (or its parts) before this run.
        errors: Error rows in the output.
        dropped: Rows of an earlier output whose ids are no longer in the input (not kept).
        seconds: Wall time of this run's tagging.
    """

    output: Path
    documents: int
    tagged: int
    skipped: int
    errors: int
    dropped: int
    seconds: float

    @property
    def documents_per_second(self) -> float:
        """Documents tagged per second by this run (0 when it tagged none)."""
        return self.tagged / self.seconds if self.tagged and self.seconds > 0 else 0.0


def _pq() -> Any:
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
    if "calibration" in set_fields:  # a calibration is part of the job as the JSON it is saved as
        set_fields["calibration"] = set_fields["calibration"].to_json()
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


class _Output:
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
            return dict(json.loads(self.job_file.read_text(encoding="utf-8")))
        except (OSError, ValueError) as exc:
            raise InputError(f"Output parts {str(self.parts)!r}: expected a readable job.json ({exc}).") from None

    def _job_of_output(self) -> dict[str, Any] | None:
        if not self.path.exists():
            return None
        try:
            metadata = _pq().read_schema(self.path).metadata or {}
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
        _atomic_write_text(self.job_file, json.dumps(self.identity, indent=2, ensure_ascii=False))
        numbers = [int(p.stem.split("-")[1]) for p in self.part_files()]
        self._next = max(numbers, default=-1) + 1

    def done_ids(self) -> set[str]:
        pq = _pq()
        done: set[str] = set()
        for source in ([self.path] if self.path.exists() else []) + self.part_files():
            done.update(pq.read_table(source, columns=["id"]).column("id").to_pylist())
        return done

    def write_part(self, table: Any) -> None:
        final = self.parts / f"part-{self._next:06d}.parquet"
        self._next += 1
        tmp = final.with_name(final.name + ".tmp")
        _pq().write_table(table, tmp)
        os.replace(tmp, final)

    def finish(self, order: Sequence[str], empty: Any) -> tuple[Any, int]:
        """Merge the earlier output and the parts into the output, in ``order``; returns it and the rows dropped."""
        pq = _pq()
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


def _ids(ids: Sequence[str]) -> Any:
    import pyarrow as pa

    return pa.array(ids, type=pa.string())


def _atomic_write_text(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def tag_outcomes(
    engine: Engine,
    schema: Schema,
    texts: Sequence[Any],
    *,
    ids: Sequence[str] | None = None,
    options: ExtractOptions | None = None,
    batch_size: int | None = None,
) -> list[Any]:
    """Tag ``texts`` with :meth:`Engine.extract_many`: per text its result, or the exception that failed it.

    A text that is not a string or holds no text fails with a :class:`~pcd_engine.errors.ContextError` that names
    it by its id (from ``ids``, else its index) without going to the model.
    """
    outcomes: list[Any] = []
    present: list[int] = []
    for i, text in enumerate(texts):
        try:
            check_text(text, where=f"document {ids[i]!r}" if ids is not None else f"texts[{i}]")
        except ContextError as exc:
            outcomes.append(exc)
        else:
            outcomes.append(None)
            present.append(i)
    if present:
        done = engine.extract_many(
            [texts[i] for i in present], schema, options, batch_size=batch_size, return_exceptions=True
        )
        for i, result in zip(present, done, strict=True):
            outcomes[i] = result
    return outcomes


def engine_parts(
    engine: Engine,
    schema: Schema,
    *,
    options: ExtractOptions | None = None,
    part_size: int = DEFAULT_PART_SIZE,
    batch_size: int | None = None,
) -> Runner:
    """The in-process runner of :func:`run_tag_job`: parts of ``part_size`` documents tagged on ``engine``."""
    columns = tag_columns(schema, reserved=["id"])

    def run(docs: Sequence[CorpusDocument]) -> Iterator[Any]:
        for first in range(0, len(docs), part_size):
            part = docs[first : first + part_size]
            ids = [d.id for d in part]
            outcomes = tag_outcomes(
                engine, schema, [d.text for d in part], ids=ids, options=options, batch_size=batch_size
            )
            yield tag_table(schema, outcomes, leading={"id": _ids(ids)}, columns=columns)

    return run


def tag_runner(name: str) -> Callable[..., Any]:
    """The factory of the ``name`` runner registered in the :data:`RUNNERS_GROUP` entry points (the engine finds an
    integration's runner there instead of importing it).

    Raises:
        BackendUnavailableError: If no installed package registers one of that name.
    """
    from importlib.metadata import entry_points

    found = list(entry_points(group=RUNNERS_GROUP, name=name))
    if not found:
        raise BackendUnavailableError(
            f"pcd tag --{name}: expected a '{name}' runner registered under {RUNNERS_GROUP!r} (pcd_integrations "
            f"registers it), but none is installed. Install it with: {pip_install(name)}"
        )
    factory: Callable[..., Any] = found[0].load()
    return factory


def check_output(output: str | os.PathLike[str], identity: Mapping[str, Any], *, overwrite: bool = False) -> None:
    """Fail early, before any model loads, when ``output`` cannot take this job: a name that is not
    ``.parquet``, a missing folder, or (unless ``overwrite``) an output or parts written by another job.

    Raises:
        InputError: Saying which.
    """
    path = _output_path(output)
    if not overwrite:
        _Output(path, identity).check(overwrite=False)


def _output_path(output: str | os.PathLike[str]) -> Path:
    path = Path(output)
    if path.suffix.lower() not in (".parquet", ".pq"):
        raise InputError(f"Output {str(path)!r}: expected a .parquet file name, but got {path.suffix or 'none'}.")
    if not path.parent.exists():
        raise InputError(
            f"Output {str(path)!r}: expected an existing folder {str(path.parent)!r}, but it does not exist."
        )
    return path


def run_tag_job(
    docs: Sequence[CorpusDocument],
    schema: Schema,
    output: str | os.PathLike[str],
    *,
    identity: Mapping[str, Any],
    runner: Runner,
    overwrite: bool = False,
    quiet: bool = True,
    on_part: Callable[[int], None] | None = None,
) -> TagSummary:
    """Run a tagging job: skip the ids already written, tag the rest in parts, merge.

    Args:
        docs: The documents, in input order, with unique ids.
        schema: The compiled schema.
        output: The Parquet file to write.
        identity: The job (:func:`job_identity`); an output written by another job is refused.
        runner: Tags the documents still to do (:func:`engine_parts`, or Ray Data's
            :func:`pcd_integrations.ray.ray_parts`), yielding tables of finished rows.
        overwrite: Delete the output and its parts first.
        quiet: No progress bar (else tqdm on stderr: documents per second and the time left).
        on_part: Called with the number of rows after each part is written.

    Returns:
        What the job did.

    Raises:
        InputError: If two documents share an id, the output belongs to another job, another process is writing
            it, or it cannot be written.
        BackendUnavailableError: If pyarrow is not installed.
    """
    from filelock import FileLock, Timeout
    from tqdm.auto import tqdm

    path = _output_path(output)
    check_unique(docs)
    columns = tag_columns(schema, reserved=["id"])
    empty = tag_table(schema, [], leading={"id": _ids([])}, columns=columns)
    store = _Output(path, identity)
    lock = FileLock(str(path.with_name(path.name + ".lock")))
    try:
        lock.acquire(timeout=0)
    except Timeout:
        raise InputError(f"Output {str(path)!r}: expected no other job writing it, but one holds its lock.") from None
    try:
        store.check(overwrite=overwrite)
        store.start()
        done = store.done_ids()
        todo = [d for d in docs if d.id not in done]
        skipped = len(docs) - len(todo)
        started = time.perf_counter()
        bar = tqdm(total=len(docs), initial=skipped, unit="doc", file=sys.stderr, disable=quiet, dynamic_ncols=True)
        tagged = 0
        try:
            unreadable = [d for d in todo if d.error is not None]
            readable = [d for d in todo if d.error is None]
            errors = [f"InputError: {d.error}" for d in unreadable]
            first = [tag_table(schema, errors, leading={"id": _ids([d.id for d in unreadable])}, columns=columns)]
            for table in itertools.chain(first, runner(readable) if readable else ()):
                if table.num_rows == 0:
                    continue
                store.write_part(table.select(empty.column_names).cast(empty.schema))
                tagged += table.num_rows
                bar.update(table.num_rows)
                if on_part is not None:
                    on_part(table.num_rows)
        finally:
            bar.close()
        seconds = time.perf_counter() - started
        final, dropped = store.finish([d.id for d in docs], empty)
    finally:
        lock.release()
        Path(lock.lock_file).unlink(missing_ok=True)
    errors = final.num_rows - final.column(ERROR_COLUMN).null_count
    return TagSummary(path, len(docs), tagged, skipped, errors, dropped, seconds)


def tag_corpus(
    input: str | os.PathLike[str] | Iterable[CorpusDocument],
    schema: Any,
    output: str | os.PathLike[str],
    *,
    engine: Engine | None = None,
    model: str | None = None,
    backend: str = "auto",
    options: ExtractOptions | Mapping[str, Any] | None = None,
    text_column: str = "text",
    id_column: str | None = None,
    part_size: int = DEFAULT_PART_SIZE,
    batch_size: int | None = None,
    overwrite: bool = False,
    quiet: bool = True,
) -> TagSummary:
    """Tag a corpus into a Parquet file on one machine, resumably (the Python side of ``pcd tag``).

    Args:
        input: A JSONL, CSV or Parquet file or a folder of text files (see
            :func:`~pcd_engine.tools.corpus.read_corpus`), or the documents themselves.
        schema: A Pydantic model class, JSON Schema dict, preset dict or compiled schema.
        output: The ``.parquet`` file to write; its parts go to ``<output>.parts/`` meanwhile.
        engine: The engine to tag with; ``None`` loads ``model`` on ``backend``.
        model: The model to load (``None``: the embedded default); with ``engine``, the name recorded for it in
            the job (``None`` records the engine's backend only).
        backend: ``"auto"``, ``"torch"`` or ``"mlx"``, when loading.
        options: Extraction options for every document.
        text_column: The input column holding the text.
        id_column: The input column holding the ids (``None``: row numbers, or a folder's relative paths).
        part_size: Documents per part file.
        batch_size: Documents per forward pass (``None``: the engine's choice).
        overwrite: Start afresh instead of resuming.
        quiet: No progress bar.

    Returns:
        What the job did; read the table with ``pandas.read_parquet(output)`` or :func:`read_tag_table`.

    Raises:
        InputError: If the input cannot be read, or the output belongs to another job.
        SchemaError: If the schema cannot be decided, or a field's column clashes with ``id``, ``error`` or
            ``warnings``.
        OptionError: If ``part_size`` or an option is out of range.
    """
    from pcd_engine.backends import select_backend
    from pcd_engine.engine import Engine
    from pcd_engine.models.resolve import resolve_model

    check_count(part_size, "part_size", optional=False)
    compiled = compile_schema(schema)
    tag_columns(compiled, reserved=["id"])  # clashing names fail before any model work
    if isinstance(input, (str, os.PathLike)):
        docs = read_corpus(input, text_column=text_column, id_column=id_column)
    else:
        docs = list(input)
    call = surface_options(("tag_corpus options", options))
    if engine is None:
        chosen = select_backend(backend)
        model_id = f"{resolve_model(model, backend=chosen)} ({chosen})"
        engine = Engine.load(model, backend=chosen)
    else:
        model_id = f"{model or 'an engine'} ({engine.backend.name})"
    identity = job_identity(compiled, model=model_id, options=call, columns={"text": text_column, "id": id_column})
    runner = engine_parts(engine, compiled, options=call, part_size=part_size, batch_size=batch_size)
    return run_tag_job(docs, compiled, output, identity=identity, runner=runner, overwrite=overwrite, quiet=quiet)


def read_tag_table(path: str | os.PathLike[str]) -> tuple[Any, dict[str, Any]]:
    """A tag table and its job description.

    Raises:
        InputError: If the file cannot be read or was not written by ``pcd tag``.
    """
    pq = _pq()
    try:
        table = pq.read_table(path)
    except Exception as exc:  # noqa: BLE001 - pyarrow raises several types for a file that is not Parquet
        raise InputError(f"Tag table {str(path)!r}: expected a Parquet file, but reading it failed ({exc}).") from None
    metadata = table.schema.metadata or {}
    if JOB_KEY not in metadata:
        raise InputError(f"Tag table {str(path)!r}: expected a file written by pcd tag, but it has no job description.")
    return table.replace_schema_metadata(None), dict(json.loads(metadata[JOB_KEY]))
