"""The ``pcd tag`` job as a library: a corpus in, a resumable Parquet table of tags out.

:mod:`~pcd_engine.tagging.corpus` reads the documents (JSONL, CSV, Parquet or a folder), :mod:`~pcd_engine.tagging.job`
runs the job (:func:`~pcd_engine.tagging.job.tag_corpus`, in process or on a registered runner such as Ray's),
:mod:`~pcd_engine.tagging.table` turns results into rows and back, and :mod:`~pcd_engine.tagging.output` keeps the
parts, the lock and the job's identity. The command line (``pcd tag``), the Ray integration and the facades use it;
it uses only the engine's layers below it.
"""

__all__: list[str] = []  # the modules are the API: tag_corpus is in job, read_tag_table in output
