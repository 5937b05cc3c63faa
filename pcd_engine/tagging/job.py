"""Tagging a corpus into one Parquet table, resumable and loss-free (``pcd tag`` and :func:`tag_corpus`).

A job reads the documents (:mod:`pcd_engine.tagging.corpus`), skips those whose ids its output already holds, and
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

The rows are :func:`~pcd_engine.tagging.table.tag_table`'s; a document that fails (empty, too long, a
decoding error) becomes an error row and the job goes on. The output's files and the job description are
:mod:`pcd_engine.tagging.output`'s.
"""

from __future__ import annotations

import itertools
import os
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pcd_engine.calibrate.shares import LabelShares, value_shares
from pcd_engine.errors import (
    BackendUnavailableError,
    ContextError,
    InputError,
    check_count,
    pip_install,
)
from pcd_engine.options import ExtractOptions, surface_options
from pcd_engine.run.admission import check_text
from pcd_engine.schema import Schema, compile_schema
from pcd_engine.tagging.corpus import CorpusDocument, check_unique, read_corpus
from pcd_engine.tagging.output import TagOutput, job_identity, output_path
from pcd_engine.tagging.table import ERROR_COLUMN, row_values, tag_columns, tag_table

if TYPE_CHECKING:
    from pcd_engine.engine import Engine

__all__ = [
    "DEFAULT_PART_SIZE",
    "TagSummary",
    "engine_parts",
    "run_tag_job",
    "tag_corpus",
    "tag_outcomes",
    "tag_runner",
]

RUNNERS_GROUP = "pcd_engine.tag_runners"
"""The entry-point group of the runners that live outside the engine (``ray``: pcd_integrations' Ray runner)."""

DEFAULT_PART_SIZE = 64
"""Documents per part file: the most work an interrupted job can lose."""

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
        shares: Each closed field's label shares among the output's decided rows (all of them, earlier runs'
            included): the share of rows each label is the value of, with a 95% bootstrap interval
            (:func:`~pcd_engine.calibrate.shares.value_shares`; the table keeps no distributions to run EM on).
    """

    output: Path
    documents: int
    tagged: int
    skipped: int
    errors: int
    dropped: int
    seconds: float
    shares: Mapping[str, LabelShares] = field(default_factory=dict)

    @property
    def documents_per_second(self) -> float:
        """Documents tagged per second by this run (0 when it tagged none)."""
        return self.tagged / self.seconds if self.tagged and self.seconds > 0 else 0.0


def _ids(ids: Sequence[str]) -> Any:
    import pyarrow as pa

    return pa.array(ids, type=pa.string())


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

    path = output_path(output)
    check_unique(docs)
    columns = tag_columns(schema, reserved=["id"])
    empty = tag_table(schema, [], leading={"id": _ids([])}, columns=columns)
    store = TagOutput(path, identity)
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
        bar = tqdm(total=len(docs), initial=skipped, unit="doc", desc="tagging", file=sys.stderr, disable=quiet,
                   dynamic_ncols=True)  # fmt: skip
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
    return TagSummary(path, len(docs), tagged, skipped, errors, dropped, seconds, shares=_table_shares(schema, final))


def _table_shares(schema: Schema, table: Any) -> dict[str, LabelShares]:
    """The closed fields' label shares among a tag table's decided rows (:func:`value_shares` picks the fields)."""
    rows = table.select([*(s.name for s in schema.fields), ERROR_COLUMN]).to_pylist()
    return value_shares([row_values(schema, row) for row in rows], schema)


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
            :func:`~pcd_engine.tagging.corpus.read_corpus`), or the documents themselves.
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
