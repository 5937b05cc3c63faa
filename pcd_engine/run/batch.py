"""Many documents, one pass per wave: requests decided together.

A batch is a list of opened :class:`~pcd_engine.run.request.Request` objects (one per document; they may have
different schemas and options). Their waves run in lockstep: for wave ``k`` every request still deciding plans its
tree, and the requests whose tree fits one pass are scored together by
:meth:`~pcd_engine.backends.contract.Backend.score_trees`, one batch row each over its own cache (the schema
preambles are prefilled once and shared by reference). A request whose tree needs several passes (a very large
wave under the memory budget) scores alone, and so does every request on a backend that cannot batch
(:attr:`~pcd_engine.backends.contract.Backend.batches_documents` is False: the rows fallback). Each request's
answer is the one it would get alone: the decisions are its own and the log-probs differ only by float rounding.

Why batch rows and not one packed forest: in one sequence every query pays for every other document's keys, so a
pass costs ``(sum of lengths)^2``; as batch rows it costs ``sum(length x own past)``, and documents are sorted by
length first so that padding stays a small part of each pass (a group is cut where padding would exceed its real
tokens).

Failures stay with their document: a request that fails to open, plan or finish (an empty text, a text over the
window, a time limit) is recorded as that document's exception and the rest of the batch goes on.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import TypeVar

import numpy as np

from pcd_engine.calibrate.calibrator import Calibrator, FieldPrior, result_rows
from pcd_engine.decide.decoding import Decision
from pcd_engine.deciders import Lean
from pcd_engine.deciders.corrections import CONTENT_FREE_TEXTS, MIN_BATCH, batch_priors, content_free_fit, field_rows
from pcd_engine.generate.open_rows import OpenRows
from pcd_engine.options import ExtractOptions
from pcd_engine.result import ExtractionResult, FieldResult
from pcd_engine.run.admission import check_text
from pcd_engine.run.host import Host
from pcd_engine.run.request import Request, WavePlan
from pcd_engine.schema import Schema
from pcd_engine.trees import TreeBatch

__all__ = [
    "Batch",
    "Document",
    "Member",
    "fits",
    "groups",
    "lean_key",
    "open_batch",
    "open_lean",
    "read_batch",
    "read_features",
    "row_groups",
    "run_batch",
]

# A request in a stage's shared pass: the caller's key, the request, and its one tree batch.
Member = tuple[int, Request, TreeBatch]
T = TypeVar("T")


@dataclass
class Batch:
    """Requests decided together, and what became of each.

    Attributes:
        requests: The live requests, by the caller's index.
        failed: The caller's index to the exception that ended that request.
        started: ``perf_counter`` reading when the batch began (each result's total time counts from it).
        max_documents: The most documents one pass may hold.
    """

    requests: dict[int, Request]
    failed: dict[int, Exception] = field(default_factory=dict)
    started: float = field(default_factory=time.perf_counter)
    max_documents: int = 64

    def run(self) -> dict[int, ExtractionResult | Exception]:
        """Decide every wave of every request (together where the backend can), generate the open fields, and
        return each request's result or exception by index."""
        self.decide()
        self.generate()
        out: dict[int, ExtractionResult | Exception] = dict(self.failed)
        for key, request in sorted(self.requests.items()):
            with self.step(key, request):
                out[key] = request.result(started=self.started)
        return out

    def decide(self) -> None:
        """Decide every wave of every request, together where the backend can."""
        depth = max((len(r.waves) for r in self.requests.values()), default=0)
        for index in range(depth):
            self.wave(index)

    def closed(self) -> dict[int, dict[str, FieldResult] | Exception]:
        """Decide every wave of every request and return each one's closed fields' results (nothing generated),
        or its exception, by index."""
        self.decide()
        out: dict[int, dict[str, FieldResult] | Exception] = dict(self.failed)
        out.update({key: dict(request.results) for key, request in self.requests.items()})
        return out

    def generate(self) -> None:
        """Grow the open rows of every request that has some: together (one pass per step for every row of
        every request in a group) where the backend batches documents, in groups within the memory budget."""
        ready: list[tuple[int, Request, OpenRows]] = []
        for key, request in list(self.requests.items()):
            with self.step(key, request), counted(request):
                rows = request.open_rows()
                if rows is not None:
                    ready.append((key, request, rows))
        batches = any(r.backend.batches_documents for _, r, _ in ready)
        for group in row_groups(ready, limit=self.max_documents if batches else 1):
            tick = time.perf_counter()
            backend = group[0][1].backend
            outcomes = backend.generate_rows_many(
                [r.state for _, r, _ in group],
                causals=[r.pending for _, r, _ in group],
                prefixes=[rows.plan.prefixes for _, _, rows in group],
                chooses=[rows.choose for _, _, rows in group],
                before_passes=[r.generation_check for _, r, _ in group],
                drafts=[rows.draft if rows.lookup is not None else None for _, _, rows in group],
            )
            elapsed = (time.perf_counter() - tick) * 1000
            for (key, request, rows), (passes, failure) in zip(group, outcomes, strict=True):
                request.passes += passes
                request.phases["generate"] += elapsed
                with self.step(key, request):
                    if failure is not None:
                        raise failure
                    request.finish_rows(rows, passes)

    def wave(self, index: int) -> None:
        """Wave ``index`` of every request that has one: plan, score its stages (shared passes where possible),
        finish."""
        plans: dict[int, WavePlan] = {}
        for key, request in list(self.requests.items()):
            if index < len(request.waves):
                with self.step(key, request), counted(request):
                    plans[key] = request.plan_wave(index)
        logprobs = {k: p.fresh_logprobs() for k, p in plans.items() if p.compiled is not None}
        stage = {k: plans[k].passes for k in logprobs}
        while stage:
            self.stage(stage, logprobs, index)
            stage = {}
            for key in logprobs:
                if key in self.requests:
                    with self.step(key, self.requests[key]):
                        passes = self.requests[key].next_stage(plans[key], logprobs[key])
                        if passes:
                            stage[key] = passes
        decided: dict[int, list[Decision]] = {}
        for key, plan in plans.items():
            if key in self.requests:
                with self.step(key, self.requests[key]):
                    decided[key] = self.requests[key].decide(plan, logprobs.get(key))
        leans = self.leans(plans, decided)
        for key, decisions in decided.items():
            if key in self.requests:
                with self.step(key, self.requests[key]):
                    self.requests[key].record_wave(index, plans[key].asked, decisions, leans=leans.get(key))

    def leans(self, plans: dict[int, WavePlan], decided: dict[int, list[Decision]]) -> dict[int, dict[str, FieldPrior]]:
        """Under a correction that estimates its lean on the batch, each request's leans for this wave: estimated on
        every live request of the same group (one caller's documents) that reads the same wave of the same schema
        in the same way (:func:`~pcd_engine.deciders.corrections.batch_priors`), when there are at least
        :data:`~pcd_engine.deciders.corrections.MIN_BATCH` of them."""
        together: dict[tuple[object, ...], list[int]] = {}
        for key in decided:
            request = self.requests.get(key)
            if request is not None and request.call.decider.estimates_on_batch:
                same = (*lean_key(request.schema, request.call, request.group), plans[key].index)
                together.setdefault(same, []).append(key)
        out: dict[int, dict[str, FieldPrior]] = {}
        for keys in together.values():
            first = self.requests[keys[0]]
            for key in keys:
                self.requests[key].batch_documents = len(keys)
            if len(keys) < MIN_BATCH:
                continue
            rows: dict[str, list[list[float]]] = {}
            specs = {spec.name: spec for spec, _ in plans[keys[0]].asked}
            partial: set[str] = set()  # fields some document read in a way its decider leaves as read
            for key in keys:
                for name, decisions in Request.by_field(plans[key].asked, decided[key]).items():
                    rows.setdefault(name, []).append(field_rows(specs[name], decisions))
                    if not self.requests[key].correctable(specs[name], decisions):
                        partial.add(name)
            rows = {name: r for name, r in rows.items() if name not in partial}
            if rows:
                priors = batch_priors(first.schema, first.engine.model_id, rows)
                out.update(dict.fromkeys(keys, priors))
        return out

    def stage(self, stage: dict[int, list[TreeBatch]], logprobs: dict[int, np.ndarray], index: int) -> None:
        """Run one stage of passes, ``stage[key]`` for each request, into ``logprobs[key]``: requests with one
        pass share forward passes where the backend batches documents; the others score alone."""
        backend_batches = any(r.backend.batches_documents for r in self.requests.values())
        shared = {k: p for k, p in stage.items() if len(p) == 1} if backend_batches else {}
        for key, passes in stage.items():
            request = self.requests.get(key)
            if request is not None and key not in shared:
                with self.step(key, request), counted(request), request.timed("forward"):
                    request.score(passes, logprobs[key], index)
        members = [(k, self.requests[k], p[0]) for k, p in shared.items() if k in self.requests]
        for group in groups(members, limit=self.max_documents):
            self.shared_pass(group, logprobs, index)

    def shared_pass(self, group: list[Member], logprobs: dict[int, np.ndarray], index: int) -> None:
        """One forward pass for ``group`` (each request's single pass of this stage), read into each live
        request's ``logprobs``."""
        live = []
        for key, request, batch in group:
            with self.step(key, request):
                request.watch.check(f"a scoring pass of wave {index}")
                live.append((key, request, batch))
        if not live:
            return
        if len(live) == 1:
            key, request, batch = live[0]
            with self.step(key, request), counted(request), request.timed("forward"):
                request.score([batch], logprobs[key], index)
            return
        backend = live[0][1].backend
        tick = time.perf_counter()
        batches = [b for _, _, b in live]
        outs = backend.score_trees(
            [r.state for _, r, _ in live], causals=[r.pending for _, r, _ in live], batches=batches
        )
        elapsed = (time.perf_counter() - tick) * 1000
        for (key, request, batch), out in zip(live, outs, strict=True):
            request.absorb(batch, out, logprobs[key], documents=len(live))
            request.passes += 1
            request.phases["forward"] += elapsed

    @contextmanager
    def step(self, key: int, request: Request) -> Iterator[None]:
        """Run one request's step; an exception ends that request only (recorded as its result)."""
        try:
            yield
        except Exception as exc:  # noqa: BLE001 - recorded as this document's result, re-raised by the caller
            self.failed[key] = exc
            self.requests.pop(key, None)


@contextmanager
def counted(request: Request) -> Iterator[None]:
    """Add the forward passes the block runs on this thread to ``request.passes``."""
    before = request.backend.thread_passes
    try:
        yield
    finally:
        request.passes += request.backend.thread_passes - before


def groups(items: Sequence[Member], *, limit: int) -> list[list[Member]]:
    """Requests whose single pass of a stage can share one forward pass: sorted by the tokens they feed, cut where a
    group would hold more than ``limit`` documents, exceed the smallest memory budget among them, or spend more
    on padding than on real tokens.

    Args:
        items: ``(key, request, tree batch)``, each request with exactly that one pass planned and its causal
            tokens pending.
        limit: The most documents in one group.

    Returns:
        The groups, each in feeding-length order.
    """
    return _cut(sorted(items, key=lambda m: len(m[1].pending) + len(m[2].tokens)), limit, fits)


def fits(group: Sequence[Member]) -> bool:
    """Whether ``group`` can share one pass: padding at most its real tokens, and the padded pass within the
    smallest memory budget among its requests (the backend's estimate of one row, times the rows)."""
    causal = max(len(r.pending) for _, r, _ in group)
    nodes = max(len(b.tokens) for _, _, b in group)
    real = sum(len(r.pending) + len(b.tokens) for _, r, b in group)
    if len(group) * (causal + nodes) > 2 * real:
        return False
    first = group[0][1]
    past = max(r.state.length for _, r, _ in group)
    need = len(group) * first.backend.pass_bytes(past=past, new=causal + nodes, rows=nodes + 1)
    return need <= min(r.budget.bytes for _, r, _ in group)


def row_groups(
    ready: Sequence[tuple[int, Request, OpenRows]], *, limit: int
) -> list[list[tuple[int, Request, OpenRows]]]:
    """Requests whose open rows can grow together: at most ``limit`` per group, and the group's last pass (every
    request's rows at their longest, as one batch row each) within the smallest memory budget among them."""
    return _cut(list(ready), limit, _rows_fit)


def _cut(items: list[T], limit: int, fits: Callable[[list[T]], bool]) -> list[list[T]]:
    """``items`` in order, cut into groups of at most ``limit`` where ``fits`` still holds (a group of one
    always)."""
    out: list[list[T]] = []
    current: list[T] = []
    for item in items:
        trial = [*current, item]
        if current and (len(trial) > limit or not fits(trial)):
            out.append(current)
            trial = [item]
        current = trial
    if current:
        out.append(current)
    return out


def _rows_fit(group: Sequence[tuple[int, Request, OpenRows]]) -> bool:
    first = group[0][1]
    past = max(r.rows_past(rows) for _, r, rows in group)
    n = max(len(rows.plan.prefixes) for _, _, rows in group)
    need = len(group) * first.backend.pass_bytes(past=past, new=n, rows=n)
    return need <= min(r.budget.bytes for _, r, _ in group)


def lean_key(schema: Schema, call: ExtractOptions, group: object = None) -> tuple[object, ...]:
    """What documents must share for one batch lean to be estimated on them: the caller's group, the schema, the
    prompt format, the reading options and the correction."""
    return (id(group) if group is not None else None, schema.fingerprint, call.prompt_format.key, call.temperature,
            call.strategy, call.anchor, call.staging, call.correction)  # fmt: skip


@dataclass(frozen=True)
class Document:
    """One extraction to decide in a batch.

    Attributes:
        text: The document (checked when its request opens).
        schema: The compiled schema.
        call: The resolved options.
        cancelled: Checked before every pass; once it returns True the request stops.
        where: How errors name the text (``"texts[3]"``).
        group: Whose document it is: a batch correction pools only documents of one group (``None``: the
            documents of one call, such as :meth:`~pcd_engine.engine.Engine.extract_many`'s; the collector gives
            each caller's request its own).
        features: The closed fields whose features the request keeps (what a head is fitted on; see
            :attr:`~pcd_engine.run.request.Request.features`).
    """

    text: str
    schema: Schema
    call: ExtractOptions
    cancelled: Callable[[], bool] | None = None
    where: str = "text"
    group: object = None
    features: frozenset[str] = frozenset()


def run_batch(
    engine: Host, documents: Sequence[Document], *, max_documents: int, started: float | None = None
) -> list[ExtractionResult | Exception]:
    """Open each document's request (a failure to open is that document's exception), decide them as one
    :class:`Batch`, and return a result or exception per document, in order.

    Args:
        engine: The engine the requests run on.
        documents: The extractions.
        max_documents: The most documents one pass may hold.
        started: ``perf_counter`` reading each result's total time counts from (now by default).
    """
    done = open_batch(engine, documents, max_documents=max_documents, started=started).run()
    return [done[k] for k in range(len(documents))]


def read_batch(
    engine: Host, documents: Sequence[Document], *, max_documents: int
) -> list[dict[str, FieldResult] | Exception]:
    """:func:`run_batch` for the closed fields only: each document's closed fields' results by name (the open
    fields are not generated), or its exception, in order. What a calibration is fitted from."""
    done = open_batch(engine, documents, max_documents=max_documents).closed()
    return [done[k] for k in range(len(documents))]


def read_features(
    engine: Host, documents: Sequence[Document], *, max_documents: int
) -> list[tuple[dict[str, FieldResult], dict[str, np.ndarray]] | Exception]:
    """:func:`read_batch` with each document's features of its :attr:`Document.features` fields: per document its
    closed fields' results and those features by field, or its exception, in order. What a head is fitted on."""
    batch = open_batch(engine, documents, max_documents=max_documents)
    done = batch.closed()
    return [
        done[k] if isinstance(done[k], Exception) else (done[k], dict(batch.requests[k].features))  # type: ignore[misc]
        for k in range(len(documents))
    ]


def open_batch(
    engine: Host, documents: Sequence[Document], *, max_documents: int, started: float | None = None
) -> Batch:
    """Open each document's request into one :class:`Batch`, with the lean its call opens with
    (:func:`open_lean`, read once per schema and options); a failure to open is that document's exception."""
    batch = Batch({}, max_documents=max_documents, started=started or time.perf_counter())
    leans: dict[tuple[object, ...], Lean] = {}

    def lean_of(doc: Document) -> Callable[[], Lean]:
        same = (doc.schema.fingerprint, id(doc.call))  # one call's documents share its options object

        def opened() -> Lean:
            if same in leans:
                return leans[same]
            lean = open_lean(engine, doc.schema, doc.call)
            leans[same] = Lean(lean.source, lean.priors)  # read once: the next documents spend nothing on it
            return lean

        return opened

    for key, doc in enumerate(documents):
        try:
            text = check_text(doc.text, where=doc.where)
            request = Request.open(engine, doc.schema, doc.call, text, cancelled=doc.cancelled, lean=lean_of(doc),
                                   group=doc.group, features=doc.features)  # fmt: skip
        except Exception as exc:  # noqa: BLE001 - this document's result
            batch.failed[key] = exc
            continue
        request.passes = request.prefill_passes + request.correction_passes
        batch.requests[key] = request
    return batch


def open_lean(host: Host, schema: Schema, call: ExtractOptions) -> Lean:
    """The lean a request of ``schema`` under ``call`` opens with, as the call's decider asks
    (:meth:`~pcd_engine.deciders.Decider.open_lean`): a fitted one, none, or the content-free lean, read here once
    per schema, prompt format and reading (:data:`~pcd_engine.deciders.corrections.CONTENT_FREE_TEXTS` decided
    uncorrected in one batch, nothing generated) and kept in the host's compile cache; a batch's leans come with
    each wave."""
    before, tick = host.backend.thread_passes, time.perf_counter()
    asked: list[str | None] = []  # the strategies it was read with: nothing is spent on a lean not read

    def read_content_free(strategy: str | None) -> Calibrator:
        asked.append(strategy)
        plain = replace(call.uncorrected(), min_probability=None, prediction_set=None, strategy=strategy).read_whole()
        key = (schema.fingerprint, call.prompt_format.key, call.temperature, call.anchor, strategy)

        def read() -> Calibrator:
            closed = [s for s in schema.fields if s.scored and len(s.labels) > 1]
            documents = [Document(t, schema, plain, where=f"content-free input {t!r}") for t in CONTENT_FREE_TEXTS]
            results = []
            for done in read_batch(host, documents, max_documents=host.batch_size()):
                if isinstance(done, Exception):
                    raise done
                results.append(done)
            return content_free_fit(schema, result_rows(closed, results), model=host.model_id)

        return host.cache.leans.get_or_build(key, read)

    lean = call.decider.open_lean(
        schema, strategy=call.strategy, marginal_max_labels=host.options.marginal_max_labels, read=read_content_free
    )
    if not asked:
        return lean
    return replace(lean, passes=host.backend.thread_passes - before, ms=(time.perf_counter() - tick) * 1000)
