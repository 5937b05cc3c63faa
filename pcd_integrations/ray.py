"""Ray Data adapter: tag a dataset with pcd on one machine or a cluster, one engine per actor.

Ray Data's batch-inference pattern: :func:`tag_dataset` maps the dataset's batches through :class:`PCDTagger`, a
callable class that loads one :class:`~pcd_engine.engine.Engine` when its actor starts and tags each batch with
:meth:`~pcd_engine.engine.Engine.extract_many`. The same code runs on a laptop (``ray.init(num_cpus=2)``) and on
a cluster (``ray.init(address=...)``, ``num_gpus=1`` per actor). Ray restarts an actor that dies and retries its
batch, so nothing is lost or written twice. The rows are the tag rows of ``pcd tag``
(:mod:`pcd_engine.tagging.table`); a document that fails becomes an error row. ``pcd tag --ray`` runs its
resumable job through :func:`ray_parts`.

Install with ``pip install "pcd-llm[ray]"``.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import replace
from typing import Any

from pcd_engine import InputError
from pcd_engine.adapters import check_count, pip_install, require

require("ray.data", what="pcd_integrations.ray", install=pip_install("ray"))

import pyarrow as pa
import ray
import ray.data

from pcd_engine import ExtractOptions, Schema, compile_schema, surface_options
from pcd_engine.adapters import CorpusDocument, Runner, tag_columns, tag_outcomes, tag_table

__all__ = ["PCDTagger", "cli_runner", "ray_parts", "tag_dataset"]


class PCDTagger:
    """The callable class of :func:`tag_dataset`: one engine per Ray actor, one call per batch.

    Args:
        schema: The compiled schema.
        model: The model to load (``None``: the embedded default).
        backend: ``"auto"``, ``"torch"`` or ``"mlx"``.
        device: The device (``None``: CUDA when the actor has a GPU, else CPU).
        dtype: The weights' dtype (``None``: the backend's default).
        options: Extraction options for every document.
        text_column: The column holding the texts.
        id_column: The column that names documents in error messages (``None``: their place in the batch).
        keep_text: Keep the text column in the output.
        engine_options: Fields of :class:`~pcd_engine.engine.EngineOptions`.
    """

    def __init__(
        self,
        schema: Schema,
        *,
        model: str | None,
        backend: str,
        device: str | None,
        dtype: str | None,
        options: ExtractOptions,
        text_column: str,
        id_column: str | None,
        keep_text: bool,
        engine_options: Mapping[str, Any],
    ) -> None:
        from pcd_engine import Engine

        try:  # one "Loading weights" bar per actor start is noise in the driver's log
            from transformers.utils import logging as hf_logging

            hf_logging.disable_progress_bar()
        except ImportError:
            pass
        self.engine = Engine.load(model, backend=backend, device=device, dtype=dtype, **dict(engine_options))
        self.schema = schema
        self.options = options
        self.text_column = text_column
        self.id_column = id_column
        self.keep_text = keep_text

    def __call__(self, batch: pa.Table) -> pa.Table:
        """Tag one batch: its other columns (and the text, with ``keep_text``), then the tag columns."""
        texts = batch.column(self.text_column).to_pylist()
        ids = [str(i) for i in batch.column(self.id_column).to_pylist()] if self.id_column else None
        outcomes = tag_outcomes(self.engine, self.schema, texts, ids=ids, options=self.options)
        leading = {n: batch.column(n) for n in batch.column_names if self.keep_text or n != self.text_column}
        return tag_table(self.schema, outcomes, leading=leading)


def _check_columns(ds: Any, schema: Schema, *, text_column: str, id_column: str | None, keep_text: bool) -> None:
    """Refuse a missing text or id column, and tag columns that clash with the input's, when the dataset's schema
    is known without running it.

    Raises:
        InputError: If a named column is missing.
        SchemaError: If a tag column would clash with an input column.
    """
    known = ds.schema(fetch_if_missing=False)
    if known is None:
        return
    names = list(known.names)
    for column in (text_column, id_column):
        if column is not None and column not in names:
            raise InputError(f"tag_dataset: expected a column {column!r}, but the dataset has {names}.")
    tag_columns(schema, reserved=[n for n in names if keep_text or n != text_column])


def tag_dataset(
    ds: ray.data.Dataset,
    schema: Any,
    *,
    model: str | None = None,
    backend: str = "auto",
    device: str | None = None,
    dtype: str | None = None,
    options: ExtractOptions | Mapping[str, Any] | None = None,
    text_column: str = "text",
    id_column: str | None = None,
    keep_text: bool = False,
    batch_size: int = 32,
    concurrency: int = 1,
    num_gpus: float | None = None,
    num_cpus: float | None = None,
    engine_options: Mapping[str, Any] | None = None,
    **ray_remote_args: Any,
) -> ray.data.Dataset:
    """Tag every row of a Ray dataset: a lazy :class:`ray.data.Dataset` of tag rows.

    Args:
        ds: The documents, one per row, with a text column.
        schema: A Pydantic model class, JSON Schema dict, preset dict or compiled schema.
        model: The model each actor loads: ``None`` for the embedded default, an alias, a folder every node can
            read, or a Hugging Face repo id in the nodes' cache.
        backend: ``"auto"``, ``"torch"`` or ``"mlx"`` (chosen on each actor for ``"auto"``).
        device: The device on each actor (``None``: CUDA when it has a GPU, else CPU).
        dtype: The weights' dtype.
        options: Extraction options for every document.
        text_column: The column holding the texts.
        id_column: A column naming documents in error messages.
        keep_text: Keep the text column in the output (other columns always pass through).
        batch_size: Documents per call of an actor (each call is one :meth:`Engine.extract_many`).
        concurrency: The number of actors (engines).
        num_gpus: GPUs per actor (``None``: none).
        num_cpus: CPUs per actor (``None``: Ray's default, 1).
        engine_options: Fields of :class:`~pcd_engine.engine.EngineOptions` for each engine.
        **ray_remote_args: Other arguments of :meth:`ray.data.Dataset.map_batches` (for example
            ``max_restarts``, ``memory``).

    Returns:
        The tagged dataset: the input's columns (less the text, unless ``keep_text``), then the tag columns of
        :mod:`pcd_engine.tagging.table`. Nothing runs until it is consumed (``write_parquet``, ``iter_batches``,
        ``to_pandas``, ...).

    Raises:
        SchemaError: If the schema cannot be decided, or a tag column would clash with an input column.
        InputError: If the text column is missing.
        OptionError: If ``batch_size`` or ``concurrency`` is not a positive integer, or an option is unknown.
    """
    for name, value in (("batch_size", batch_size), ("concurrency", concurrency)):
        check_count(value, f"tag_dataset {name}", optional=False)
    compiled = replace(compile_schema(schema), model=None)  # actors need the fields, not the user's class
    call = surface_options(("tag_dataset options", options))
    _check_columns(ds, compiled, text_column=text_column, id_column=id_column, keep_text=keep_text)
    kwargs = dict(
        model=model, backend=backend, device=device, dtype=dtype, options=call, text_column=text_column,
        id_column=id_column, keep_text=keep_text, engine_options=dict(engine_options or {}),
    )  # fmt: skip
    return ds.map_batches(
        PCDTagger,
        fn_constructor_args=(compiled,),
        fn_constructor_kwargs=kwargs,
        batch_size=batch_size,
        batch_format="pyarrow",
        zero_copy_batch=True,
        compute=ray.data.ActorPoolStrategy(size=concurrency),
        num_gpus=num_gpus,
        num_cpus=num_cpus,
        **ray_remote_args,
    )


def ray_parts(
    schema: Schema,
    *,
    model: str | None,
    backend: str,
    options: ExtractOptions | None = None,
    part_size: int = 64,
    concurrency: int = 1,
    num_gpus: float | None = None,
    num_cpus: float | None = None,
    engine_options: Mapping[str, Any] | None = None,
) -> Runner:
    """The Ray runner of :func:`pcd_engine.tagging.job.run_tag_job` (``pcd tag --ray``): the documents go to
    Ray as blocks of ``part_size``, and each finished block comes back to the job as one part, as it finishes.
    Ray must be initialized (``ray.init``) by the caller. The other arguments are :func:`tag_dataset`'s."""

    def run(docs: Sequence[CorpusDocument]) -> Iterator[pa.Table]:
        blocks = [
            pa.table(
                {
                    "id": pa.array([d.id for d in docs[i : i + part_size]], type=pa.string()),
                    "text": pa.array([d.text for d in docs[i : i + part_size]], type=pa.string()),
                }
            )
            for i in range(0, len(docs), part_size)
        ]
        tagged = tag_dataset(
            ray.data.from_arrow(blocks),
            schema,
            model=model,
            backend=backend,
            options=options,
            id_column="id",
            batch_size=part_size,
            concurrency=concurrency,
            num_gpus=num_gpus,
            num_cpus=num_cpus,
            engine_options=engine_options,
        )
        yield from tagged.iter_batches(batch_size=None, batch_format="pyarrow")

    return run


def cli_runner(
    schema: Schema,
    *,
    model: str | None,
    backend: str,
    options: ExtractOptions | None,
    part_size: int,
    concurrency: int,
    num_gpus: float | None,
    batch_size: int | None,
    address: str | None,
    quiet: bool,
) -> tuple[Runner, bool]:
    """``pcd tag --ray``'s runner, registered as the ``ray`` entry point of ``pcd_engine.tag_runners`` (the command
    line finds it there and never imports this package): starts Ray unless it is running (``address`` joins a
    cluster), then :func:`ray_parts`.

    Returns:
        The runner, and whether Ray was started here (the command line shuts it down after the job).
    """
    if quiet:
        ray.data.DataContext.get_current().enable_progress_bars = False
    started = not ray.is_initialized()
    if started:
        ray.init(address=address, include_dashboard=False, log_to_driver=not quiet)
    runner = ray_parts(
        schema,
        model=model,
        backend=backend,
        options=options,
        part_size=part_size,
        concurrency=concurrency,
        num_gpus=num_gpus,
        engine_options={"batch_size": batch_size} if batch_size else None,
    )
    return runner, started
