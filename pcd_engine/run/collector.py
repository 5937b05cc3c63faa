"""Extractions submitted from many threads, collected for a short window and decided as one batch.

A server answers concurrent requests one pass at a time; deciding them together (:mod:`pcd_engine.run.batch`) turns
N passes per wave into one. A :class:`Collector` owns one worker thread: the first extraction submitted opens a
window of ``window_ms``; everything submitted before it closes (up to ``max_documents``) is decided in one
:class:`~pcd_engine.run.batch.Batch`, and whatever arrives meanwhile waits for the next one. Requests may have
different schemas and options. Each answer is the one the request gets alone (decisions identical, log-probs
within float rounding), and each request's failure (a bad text, its time limit, its client gone) is its own.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from pcd_engine.errors import OptionError
from pcd_engine.options import ExtractOptions
from pcd_engine.result import ExtractionResult
from pcd_engine.run.batch import Document, run_batch
from pcd_engine.run.host import Host
from pcd_engine.run.orders import averaged, orders_of
from pcd_engine.schema import compile_schema

__all__ = ["Collector"]


@dataclass(frozen=True)
class _Job:
    document: Document
    future: Future[ExtractionResult]


def _joined(futures: list[Future[ExtractionResult]], combine: Callable[[list[ExtractionResult]], ExtractionResult]
            ) -> Future[ExtractionResult]:  # fmt: skip
    """A future of ``combine`` of every future's result, once all are done; the first failure's exception if one
    failed."""
    out: Future[ExtractionResult] = Future()
    left = [len(futures)]
    lock = threading.Lock()

    def done(_: Future[ExtractionResult]) -> None:
        with lock:
            left[0] -= 1
            if left[0]:
                return
        failed = next((f.exception() for f in futures if f.exception() is not None), None)
        if failed is not None:
            out.set_exception(failed)
            return
        try:
            out.set_result(combine([f.result() for f in futures]))
        except Exception as exc:  # noqa: BLE001 - the caller's future holds it
            out.set_exception(exc)

    for future in futures:
        future.add_done_callback(done)
    return out


class Collector:
    """Decides extractions submitted from many threads in shared batches.

    Args:
        engine: The engine every extraction runs on.
        window_ms: How long the first extraction of a batch waits for others (0 takes only those already
            waiting).
        max_documents: The most extractions in one batch; ``None`` takes the engine's batch size.

    Example:
        >>> collector = Collector(engine, window_ms=5)                      # doctest: +SKIP
        >>> futures = [collector.submit(text, Ticket) for text in texts]   # doctest: +SKIP
        >>> [f.result().values for f in futures]                            # doctest: +SKIP
    """

    def __init__(self, engine: Host, *, window_ms: float = 5.0, max_documents: int | None = None) -> None:
        if not window_ms >= 0:
            raise OptionError(f"window_ms: expected a number >= 0, but got {window_ms!r}.")
        self.engine = engine
        self.window_s = float(window_ms) / 1000
        self.max_documents = engine.batch_size(max_documents)
        self._jobs: queue.Queue[_Job | None] = queue.Queue()
        self._lock = threading.Lock()
        self._worker: threading.Thread | None = None
        self.batches: list[int] = []  # the size of every batch decided so far (for tests and benchmarks)

    def submit(
        self,
        text: str,
        schema: Any,
        options: ExtractOptions | Mapping[str, Any] | None = None,
        *,
        cancelled: Callable[[], bool] | None = None,
        **knobs: Any,
    ) -> Future[ExtractionResult]:
        """Queue one extraction (arguments as for :meth:`Engine.extract`).

        Returns:
            A future of its result; it holds the extraction's own exception if it fails.

        Raises:
            SchemaError: If the schema has a field pcd cannot decide (at once, in the caller's thread).
            OptionError: If an option is unknown or out of range (at once).
        """
        # Each caller's request is its own group: a correction that estimates its lean on a batch never pools the
        # documents of different callers, so an answer never depends on what others sent at the same moment.
        call = self.engine.resolve(options, **knobs)
        compiled = compile_schema(schema)
        orders, each = orders_of(compiled, call)  # label_orders: one job per order, averaged when all are done
        group = object()
        jobs = [_Job(Document(text, s, each, cancelled, group=group), Future()) for s in orders]
        self._start()
        for job in jobs:
            self._jobs.put(job)
        if len(jobs) == 1:
            return jobs[0].future
        top_k = self.engine.options.top_k
        return _joined([j.future for j in jobs], lambda done: averaged(compiled, call, done, orders, top_k=top_k))

    def extract(
        self,
        text: str,
        schema: Any,
        options: ExtractOptions | Mapping[str, Any] | None = None,
        *,
        cancelled: Callable[[], bool] | None = None,
        **knobs: Any,
    ) -> ExtractionResult:
        """:meth:`submit`, then wait for the result (raising the extraction's own error)."""
        return self.submit(text, schema, options, cancelled=cancelled, **knobs).result()

    def close(self) -> None:
        """Decide what is queued, then stop the worker thread (a later submit starts a new one)."""
        with self._lock:
            worker, self._worker = self._worker, None
        if worker is not None:
            self._jobs.put(None)
            worker.join()

    def _start(self) -> None:
        with self._lock:
            if self._worker is None:
                self._worker = threading.Thread(target=self._work, name="pcd-collector", daemon=True)
                self._worker.start()

    def _work(self) -> None:
        while True:
            first = self._jobs.get()
            if first is None:
                return
            jobs, stop = [first], False
            deadline = time.monotonic() + self.window_s
            while len(jobs) < self.max_documents:
                try:
                    job = self._jobs.get(timeout=max(0.0, deadline - time.monotonic()))
                except queue.Empty:
                    break
                if job is None:
                    stop = True
                    break
                jobs.append(job)
            self._decide(jobs)
            if stop:
                return

    def _decide(self, jobs: list[_Job]) -> None:
        live = [j for j in jobs if j.future.set_running_or_notify_cancel()]
        if not live:
            return
        self.batches.append(len(live))

        try:
            done = run_batch(self.engine, [j.document for j in live], max_documents=self.max_documents)
        except Exception as exc:  # noqa: BLE001 - a failure of the shared pass is every request's failure
            for job in live:
                job.future.set_exception(exc)
            return
        for job, outcome in zip(live, done, strict=True):
            if isinstance(outcome, Exception):
                job.future.set_exception(outcome)
            else:
                job.future.set_result(outcome)
