"""One extraction, kept apart from what the engine compiles once: :class:`Request`.

The engine's compile cache (schema preambles, compiled waves, pass plans, row plans;
:mod:`pcd_engine.run.compile_cache`) is shared by every call. Everything here belongs to one call only (the tokens
fed and pending, the tail text with the answers written so far, the results, warnings and timings), so concurrent
calls never see each other's tokens. A request runs in steps, one method each: :meth:`Request.open` (check,
tokenize, prefill the preamble if it is not cached; :mod:`pcd_engine.run.opening`), :meth:`Request.decide_wave`
per wave, :meth:`Request.generate` for the open rows, and :meth:`Request.result`. What a request feeds the
model's cache is its base, :class:`~pcd_engine.run.feeding.Feeding`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np

from pcd_engine.backends.capabilities import feature_taps
from pcd_engine.backends.contract import RequestState
from pcd_engine.backends.taps import FeatureTap, middle_layer
from pcd_engine.calibrate.calibrator import FieldPrior
from pcd_engine.decide.compiler import CompiledWave, questions, written_value
from pcd_engine.decide.decoding import Decision, Fixed, Strategy, choose_strategy
from pcd_engine.decide.planner import plan_passes, plan_waves
from pcd_engine.decide.staging import PassCost, WaveSearch, plan_reading
from pcd_engine.deciders import Lean
from pcd_engine.errors import LimitError
from pcd_engine.generate.open_rows import OpenRows
from pcd_engine.limits import Watch
from pcd_engine.options import ExtractOptions
from pcd_engine.prompt.chat_prompt import field_line
from pcd_engine.result import (
    ExtractionResult,
    ExtractionStats,
    FieldResult,
    abstain,
    field_result,
    generated_result,
    with_prediction_sets,
)
from pcd_engine.run.budget import PassBudget
from pcd_engine.run.compile_cache import SchemaPrompt
from pcd_engine.run.feeding import Feeding
from pcd_engine.run.host import Host
from pcd_engine.run.opening import admit
from pcd_engine.schema import FieldSpec, Schema
from pcd_engine.trees import TreeBatch

__all__ = ["PHASES", "Request", "WavePlan"]

PHASES = ("tokenize", "prefill", "correction", "compile", "forward", "decode", "generate")


@dataclass(frozen=True)
class WavePlan:
    """A wave of one request, compiled and ready to score.

    Attributes:
        index: The wave's index.
        asked: The wave's questions (one per field, one per label of a multi-label field) with more than one
            label, each with its field.
        compiled: The compiled wave (tree and tail), or ``None`` when nothing is asked.
        passes: The first stage's passes within the budget (the first one also feeds the pending tokens).
        search: Which nodes each stage reads, and the decisions (see :mod:`pcd_engine.decide.staging`); ``None`` when
            nothing is asked.
        nodes_before: The request's fed nodes before this wave.
    """

    index: int
    asked: list[tuple[FieldSpec, FieldSpec]]
    compiled: CompiledWave | None
    passes: list[TreeBatch]
    search: WaveSearch | None = None
    nodes_before: int = 0

    def fresh_logprobs(self) -> np.ndarray:
        """The wave's log-probabilities before any pass: every node unread (``NaN``)."""
        assert self.compiled is not None
        return np.full(len(self.compiled.tree), np.nan)


@dataclass
class Request(Feeding):
    """What one extraction has done so far, and its steps.

    Attributes:
        engine: The engine it runs on (its backend, compile cache, grammars and settings).
        schema: The compiled schema.
        call: The resolved options (every field set).
        prompt: The schema's prompt in this call's format.
        state: The backend's view of the model for this call: the schema preamble plus the causal tokens fed.
        pending: Causal tokens not fed yet (the document, then the written answers); the next pass feeds them.
        tail_text: The prompt's tail as the next wave or the open rows see it (written answers included).
        watch: Stops the call at a pass boundary when its time is up or it was cancelled.
        budget: The memory budget of one pass.
        prompt_tokens: Tokens of the whole prompt (preamble, document, tail).
        waves: The closed fields in the order they are decided.
        committed: Tail tokens already fed or pending; a later tail must extend them.
        written: Names of the fields whose answers are written into the tail.
        nodes_scored: Tree nodes fed to the model so far.
        nodes_saved: Tree nodes a one-pass reading of every wave would have fed beyond :attr:`nodes_scored`.
        stage_passes: Scoring passes spent on later stages of staged waves.
        prefill_passes: Passes spent prefilling the schema preamble (0 when it was cached).
        correction_passes: Passes spent reading the content-free lean (0 when the engine had it already).
        generation_passes: Passes spent generating the open rows.
        generated_tokens: Tokens generated for the open rows.
        passes: Forward passes this request took part in, as a batch counts them (see :meth:`result`).
        documents_per_pass: For each scoring pass, how many documents shared it.
        draft_tokens: Tokens the open rows proposed from the document.
        accepted_tokens: Of those, the tokens the model chose as proposed.
        phases: Milliseconds per phase.
        results: Each decided field's result, by name.
        warnings: What the caller should know, in order.
        lean: The lean the request opened with (:class:`~pcd_engine.deciders.corrections.Lean`: the call's
            calibration, the content-free lean, or none; a batch correction's leans come with each wave).
        batch_documents: How many documents the last wave's batch correction saw (1 when decided alone).
        group: Whose documents these are: a batch correction estimates a lean only on documents of one group (one
            caller's call), never across callers.
        tapped_nodes: Each tapped field's decision nodes in the current wave's tree (one per label of a multi-label
            field): the fields the call's decision head decides, and :attr:`feature_fields`.
        feature_fields: The closed fields whose features the request keeps in :attr:`features` (what a head is
            fitted on).
        features: Per field of :attr:`feature_fields`, the features a head reads (:meth:`field_features`).
    """

    engine: Host
    schema: Schema
    call: ExtractOptions
    prompt: SchemaPrompt
    state: RequestState
    pending: list[int]
    tail_text: str
    watch: Watch
    budget: PassBudget
    prompt_tokens: int
    waves: list[list[FieldSpec]]
    committed: tuple[int, ...] = ()
    written: set[str] = field(default_factory=set)
    nodes_scored: int = 0
    nodes_saved: int = 0
    stage_passes: int = 0
    prefill_passes: int = 0
    correction_passes: int = 0
    generation_passes: int = 0
    generated_tokens: int = 0
    passes: int = 0
    documents_per_pass: list[int] = field(default_factory=list)
    draft_tokens: int = 0
    accepted_tokens: int = 0
    phases: dict[str, float] = field(default_factory=lambda: dict.fromkeys(PHASES, 0.0))
    results: dict[str, FieldResult] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    lean: Lean = field(default_factory=Lean)
    batch_documents: int = 1
    group: object = None
    tapped_nodes: dict[str, list[int]] = field(default_factory=dict)
    feature_fields: frozenset[str] = frozenset()
    features: dict[str, np.ndarray] = field(default_factory=dict)

    # ------------------------------------------------------------------------------------------ steps

    @classmethod
    def open(
        cls,
        engine: Host,
        schema: Schema,
        call: ExtractOptions,
        document: str,
        *,
        cancelled: Callable[[], bool] | None = None,
        lean: Callable[[], Lean] | None = None,
        group: object = None,
        features: frozenset[str] = frozenset(),
    ) -> Request:
        """Check the request, tokenize it, and start it on the schema's preamble (prefilled now if not cached).

        ``lean`` gives the lean the call opens with, called once the request passed its checks and its preamble is
        prefilled (:func:`~pcd_engine.run.batch.open_lean`; ``None``: none), ``group`` says whose document it
        is (see :attr:`group`), and ``features`` names the fields whose features it keeps (:attr:`features`).

        Raises:
            LimitError: If the request needs more labels, tokens or memory than allowed.
            ContextError: If it does not fit the model's window.
            SchemaError: If an open field's JSON Schema cannot be constrained.
            PromptAlignmentError: If the document changed the tokenization of the prompt's tail.
            RequestCancelled: If cancelled, or out of time, before the preamble prefill.
        """
        backend = engine.backend
        if call.decider.reads_features or features:
            backend.require("feature taps", "to read the hidden states a decision head reads")
        open_fields = [f.name for f in schema.fields if not f.scored]
        if open_fields:
            backend.require("open rows", f"to generate the open fields {open_fields}")
        admitted = admit(engine, schema, call, document, cancelled=cancelled)
        prefix, prefill_passes, prefill_ms = admitted.prefilled(engine, schema, call)
        prompt, ids = admitted.prompt, admitted.ids
        request = cls(
            engine=engine,
            schema=schema,
            call=call,
            prompt=prompt,
            state=engine.backend.start(prefix),
            pending=list(ids[len(prompt.chat.preamble_ids) : len(ids) - len(prompt.tail0_ids)]),
            tail_text=prompt.chat.tail_text,
            watch=admitted.watch,
            budget=admitted.budget,
            prompt_tokens=len(ids),
            waves=plan_waves(schema, anchor=bool(call.anchor)),
            prefill_passes=prefill_passes,
            group=group,
            feature_fields=features,
        )
        if call.decider.reads_features or features:  # what heads read, kept from the passes it runs anyway
            span = (len(prompt.chat.preamble_ids), len(ids) - len(prompt.tail0_ids))
            layers = feature_taps(backend, "to read hidden states").hidden_layers
            request.state.tap = FeatureTap(middle_layer(layers), span)
        request.lean = lean() if lean is not None else Lean()
        request.correction_passes = request.lean.passes
        request.phases.update(tokenize=admitted.tokenize_ms, prefill=prefill_ms, correction=request.lean.ms)
        return request

    def decide_wave(self, index: int) -> None:
        """Score wave ``index``'s tree (one pass unless the budget splits it or the wave is staged), record each
        field's result, and write the answers later waves read into the tail."""
        plan = self.plan_wave(index)
        logprobs = None
        if plan.compiled is not None:
            logprobs = plan.fresh_logprobs()
            with self.timed("forward"):
                self.score(plan.passes, logprobs, index)
                while passes := self.next_stage(plan, logprobs):
                    self.score(passes, logprobs, index)
        self.finish_wave(plan, logprobs)

    def plan_wave(self, index: int) -> WavePlan:
        """Compile wave ``index`` for this request's tail, queue its tail tokens, choose how its tree is read, and
        plan the first stage's passes within the budget (the first step of :meth:`decide_wave`; a batch runs the
        passes of many requests together)."""
        asked = self.asked(index)
        if not asked:
            return WavePlan(index, asked, None, [])
        with self.timed("compile"):
            cw = self.engine.cache.wave(self.schema, self.prompt.chat, [q for _, q in asked], self.tail_text)
            strategies = [self.strategy(q) for _, q in asked]
            staging = str(self.call.staging or "auto")
            readings = plan_reading(cw, strategies, staging=staging, cost=self.pass_cost(cw))
            search = WaveSearch(readings, cost=self.engine.known_pass_cost)
            self.extend(cw.tail_ids, cw.causal_len, where=f"Wave {index}", need_new=True)
            self.tap_wave(cw)
            passes = self.tree_passes(cw, search.first())
        return WavePlan(index, asked, cw, passes, search, self.nodes_scored)

    def asked(self, index: int) -> list[tuple[FieldSpec, FieldSpec]]:
        """Wave ``index``'s questions with more than one label (one per field, one per label of a multi-label
        field), each with its field."""
        return [(spec, q) for spec in self.waves[index] for q in questions(spec) if len(q.labels) > 1]

    def next_stage(self, plan: WavePlan, logprobs: np.ndarray) -> list[TreeBatch]:
        """The passes of the wave's next stage, given what its stages so far read (none when it is decided)."""
        if plan.search is None or not plan.search.staged or plan.compiled is None:
            return []
        more = plan.search.next(logprobs)
        if not more:
            return []
        max_nodes = self.budget.max_nodes(self.state.length, 0)
        passes = plan_passes(plan.compiled.tree, max_nodes=max_nodes, queries=more, causal=False)
        self.stage_passes += len(passes)
        return passes

    def finish_wave(self, plan: WavePlan, logprobs: np.ndarray | None) -> None:
        """Decide a planned wave from its tree's log-probabilities (``None`` when nothing was asked; ``NaN`` for
        nodes no stage read), record each field's result, and write the answers later waves read into the tail."""
        self.record_wave(plan.index, plan.asked, self.decide(plan, logprobs))

    def decide(self, plan: WavePlan, logprobs: np.ndarray | None) -> list[Decision]:
        """The decisions of a planned wave, one per asked question, from its tree's log-probabilities (the first
        step of :meth:`finish_wave`; a batch estimates its leans from every request's decisions in between)."""
        if plan.compiled is None or plan.search is None or logprobs is None:
            return []
        self.nodes_saved += len(plan.compiled.tree.packed) - (self.nodes_scored - plan.nodes_before)
        with self.timed("decode"):
            return plan.search.decide(logprobs, temperature=float(self.call.temperature or 1.0))

    @staticmethod
    def by_field(
        asked: Sequence[tuple[FieldSpec, FieldSpec]], decisions: Sequence[Decision]
    ) -> dict[str, list[Decision]]:
        """The decisions of a wave grouped by field (a multi-label field has one per label), in wave order."""
        decided: dict[str, list[Decision]] = {}
        for (spec, _q), decision in zip(asked, decisions, strict=True):
            decided.setdefault(spec.name, []).append(decision)
        return decided

    def record_wave(
        self,
        index: int,
        asked: Sequence[tuple[FieldSpec, FieldSpec]],
        decisions: Sequence[Decision],
        *,
        leans: Mapping[str, FieldPrior] | None = None,
    ) -> None:
        """Record wave ``index``'s results from one decision per asked question (fields with one label need none),
        and write the answers later waves read into the tail.

        Args:
            index: The wave.
            asked: Its questions, each with its field.
            decisions: One decision per question.
            leans: Under a batch correction, the leans the batch estimated for this wave's fields (``None``:
                the batch was too small, or the request has no batch correction).
        """
        wave = self.waves[index]
        decided = self.by_field(asked, decisions)
        options, decider = self.engine.options, self.call.decider
        note = decider.small_batch_warning(self.batch_documents)
        if note is not None and leans is None and decided and note not in self.warnings:
            self.warnings.append(note)
        fixed = Decision(label=0, probabilities=(1.0,), candidate_mass=None, method=Fixed.name)
        for spec in wave:
            features = self.field_features(spec)
            if features is not None and spec.name in self.feature_fields:
                self.features[spec.name] = features
            field_decisions = decided.get(spec.name) or [fixed]
            reading = decider.decide(
                spec, field_decisions, lean=leans.get(spec.name) if leans is not None else self.lean.field(spec.name),
                features=features, strategy=self.call.strategy, marginal_max_labels=options.marginal_max_labels,
            )  # fmt: skip
            self.results[spec.name] = field_result(
                spec, field_decisions, reading, index, self.warnings, top_k=options.top_k,
                low_mass_warning=options.low_mass_warning,
            )  # fmt: skip
        # Later waves read the anchor and the answers they depend on; writing every answer would only add prompt
        # tokens to process (a 28-field schema writes ~9 tokens per field).
        needed = {dep for later in self.waves[index + 1 :] for spec in later for dep in spec.depends_on}
        for spec in wave:
            if spec.name in needed or (self.call.anchor and index == 0):
                self.write(spec)

    def generate(self) -> None:
        """Write every closed answer into the prompt, then generate the open rows together (one pass per token
        for all rows) and record their results."""
        rows = self.open_rows()
        if rows is None:
            return
        with self.timed("generate"):
            before = self.backend.thread_passes
            self.backend.generate_rows(
                self.state, causal=self.pending, prefixes=rows.plan.prefixes, choose=rows.choose,
                before_pass=self.generation_check, draft=rows.draft if rows.lookup is not None else None,
            )  # fmt: skip
            self.finish_rows(rows, self.backend.thread_passes - before)

    def open_rows(self) -> OpenRows | None:
        """Get the open rows ready (the first step of :meth:`generate`; a batch grows many requests' rows
        together): every closed answer written into the tail, the tail queued, the budget checked.

        Returns:
            The rows with their plan, or ``None`` when the schema has no open field.

        Raises:
            LimitError: If the rows' last pass would not fit the memory budget.
        """
        open_fields = [f for f in self.schema.fields if not f.scored]
        if not open_fields:
            return None
        limit = self.call.value_tokens
        with self.timed("generate"):
            for spec in self.schema.fields:  # the open rows see every closed answer
                if spec.scored and spec.name not in self.written:
                    self.write(spec)
            engine = self.engine
            rows = engine.cache.row_plan(self.schema, self.prompt.chat, open_fields, self.tail_text)
            self.extend(rows.tail_ids, rows.causal_len, where="Open rows", need_new=False)
            prefix_tokens = sum(len(p) for p in rows.prefixes)
            self.fit_causal(extra=prefix_tokens, keep=0)
            draft, n = int(self.call.draft_tokens or 0), len(open_fields)
            context = [*self.state.ids, *self.pending]
            opened = OpenRows.start(rows, open_fields, engine.grammars, limit, context=context, draft_tokens=draft)
            widest = n * (1 + draft)
            if draft and not self.budget.fits(past=self.rows_past(opened), new=widest, rows=widest):
                opened = OpenRows.start(rows, open_fields, engine.grammars, limit)  # drafts would not fit: none
            past = self.rows_past(opened)
            if not self.budget.fits(past=past, new=n, rows=n):
                need = self.backend.pass_bytes(past=past, new=n, rows=n)
                raise LimitError(
                    f"Memory budget: expected the open rows to fit the budget of {self.budget.mib:.0f} MiB, but "
                    f"their last pass needs about {need / 2**20:.0f} MiB. Raise memory_budget_mb, lower the fields' "
                    "token limits, or shorten the text."
                )
            return opened

    def rows_past(self, rows: OpenRows) -> int:
        """The most tokens the open rows' last pass can find in the cache: the state, the pending tokens, every
        row's prefix and every row's limit."""
        return self.state.length + len(self.pending) + rows.grown

    def generation_check(self) -> None:
        """Before every generation pass after the first: stop when the time is up or the call was cancelled."""
        self.watch.check("a generation pass")

    def finish_rows(self, rows: OpenRows, passes: int) -> None:
        """Record the grown rows' values (``passes``: the generation passes this request took part in)."""
        limit = self.call.value_tokens
        self.generation_passes = passes
        self.pending = []
        for spec, generated in zip(rows.fields, rows.values(self.engine.tokenizer), strict=True):
            self.results[spec.name] = generated_result(spec, generated, len(self.waves), limit, self.warnings)
            self.generated_tokens += generated.tokens
        self.draft_tokens, self.accepted_tokens = rows.drafted, rows.accepted

    def result(self, *, started: float, passes_before: int | None = None) -> ExtractionResult:
        """The extraction's result, with its statistics since ``started`` (a ``perf_counter`` reading) and
        ``passes_before`` (the thread's pass count when the call began; ``None`` takes :attr:`passes`, the count
        a batch keeps per request)."""
        warnings = list(self.warnings)
        if self.prompt.chat.system_folded:
            warnings.insert(0, "The chat template has no system role; the instructions were put in the user turn.")
        if self.backend.scorer == "rows":
            warnings.insert(0, "This model's cache cannot branch by masking; labels were scored one row each (slower).")
        ordered = {f.name: self.results[f.name] for f in self.schema.fields}
        thresholds = self.call.thresholds(self.schema.fields)
        if thresholds:
            ordered = abstain(self.schema.fields, ordered, thresholds, warnings)
        if self.call.prediction_set is not None:
            cutoffs = self.call.set_cutoffs(self.schema.fields)
            ordered = with_prediction_sets(self.schema.fields, ordered, cutoffs, self.call.prediction_set, warnings)
        phases = {**self.phases, "total": (time.perf_counter() - started) * 1000}
        stats = ExtractionStats(
            phases_ms=phases,
            prompt_tokens=self.prompt_tokens,
            cached_tokens=len(self.prompt.chat.preamble_ids),
            forward_passes=self.passes if passes_before is None else self.backend.thread_passes - passes_before,
            nodes_scored=self.nodes_scored,
            nodes_saved=self.nodes_saved,
            stage_passes=self.stage_passes,
            waves=len(self.waves),
            generation_passes=self.generation_passes,
            generated_tokens=self.generated_tokens,
            prefill_passes=self.prefill_passes,
            correction_passes=self.correction_passes,
            documents_per_pass=tuple(self.documents_per_pass),
            draft_tokens=self.draft_tokens,
            accepted_tokens=self.accepted_tokens,
        )
        values = {name: r.value for name, r in ordered.items()}
        return ExtractionResult(values, ordered, tuple(warnings), stats, self.schema)

    # ------------------------------------------------------------------------------------------ parts

    @contextmanager
    def timed(self, phase: str) -> Iterator[None]:
        """Add the time spent in the block to ``phase``."""
        tick = time.perf_counter()
        try:
            yield
        finally:
            self.phases[phase] += (time.perf_counter() - tick) * 1000

    def write(self, spec: FieldSpec) -> None:
        """Write a decided field's answer into the tail, as the next wave or the open rows read it."""
        value = written_value(spec, self.results[spec.name].value, quoted_booleans=bool(self.call.quoted_booleans))
        self.tail_text += field_line(spec.name, value)
        self.written.add(spec.name)

    def strategy(self, question: FieldSpec) -> Strategy:
        """One question's strategy under this call's options."""
        n = len(question.labels)
        return choose_strategy(n, name=self.call.strategy, marginal_max_labels=self.engine.options.marginal_max_labels)

    def correctable(self, spec: FieldSpec, decisions: Sequence[Decision]) -> bool:
        """Whether this request's decider may divide a lean out of field ``spec``'s decisions."""
        return self.call.decider.correctable(
            spec, decisions, strategy=self.call.strategy, marginal_max_labels=self.engine.options.marginal_max_labels
        )

    def pass_cost(self, wave: CompiledWave) -> Callable[[], PassCost]:
        """The engine's pass cost, measured on this request's state (before its pending tokens) on first use."""
        token = wave.tree.tokens[0]
        return lambda: self.engine.pass_cost(self.state, token=token)
