"""The Engine: load a model, then fill in schemas from text with tree-packed decisions.

One request runs, per wave of fields, ONE forward pass on top of the schema head's cached KV: the document (or
the answers written by the previous wave) as a causal block, followed by the packed trie of every label of
every field in the wave. A wave's tree is split over several passes only when it would exceed the memory budget.
Open fields come last: every closed answer is written into the prompt, and one row per open field is generated
under its JSON Schema, all rows advancing together one forward pass per token (:mod:`pcd_engine.generation`).

Every request is bounded before any model work: its labels and generated tokens against its
:class:`~pcd_engine.limits.RequestLimits`, its prompt and answers against the model's window, its passes against
the memory budget. Nothing is cached for a request that fails. Time limits and cancellation are checked before
every forward pass.

Concurrency: an :class:`Engine` may be called from many threads. Each call keeps its own state
(:class:`~pcd_engine.request.Request`) and statistics; the shared caches sit behind one lock, and the model runs
one pass at a time (the backend's lock), so concurrent calls interleave at pass boundaries and get exactly the
answers they would get one by one.
"""

from __future__ import annotations

import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np

from pcd_engine.backends import select_backend
from pcd_engine.backends.base import Backend, Prefix
from pcd_engine.compiler import CompiledWave, compile_wave, questions, written_value
from pcd_engine.decoding import Decision, Fixed, choose_strategy
from pcd_engine.errors import ContextError, LimitError, OptionError, PromptAlignmentError
from pcd_engine.generation import Generated, Grammars, RowPlan, compile_rows, generate_open
from pcd_engine.limits import RequestLimits, Watch
from pcd_engine.options import ExtractOptions, PromptFormat
from pcd_engine.planner import TreeBatch, plan_passes, plan_waves
from pcd_engine.prompt import ChatPrompt, TokenizerView, field_line, tail_tokens
from pcd_engine.request import Request as _Request
from pcd_engine.result import (
    ExtractionResult,
    ExtractionStats,
    FieldResult,
    generated_result,
    multi_result,
    scored_result,
)
from pcd_engine.schema import FieldSpec, Schema, compile_schema

__all__ = ["Engine", "EngineOptions"]

_T = TypeVar("_T")
_EMPTY = TreeBatch((), (), (), (), (), ())


@dataclass(frozen=True)
class EngineOptions:
    """Engine-wide settings.

    Attributes:
        anchor: Decide the first field alone and write it into the prompt before the others (one extra pass,
            usually better answers). ``depends_on`` adds waves either way; a later wave's prompt holds the
            anchor's answer and the answers its fields depend on, not every earlier answer.
        head_cache_size: How many schema heads keep their KV cache (least recently used are dropped).
        memory_budget_mb: Estimated peak memory of one pass, which every pass keeps within: the head prefill and
            the document are fed in causal chunks, a wave's tree is split into passes, and open rows that cannot
            fit are refused before any work with :class:`~pcd_engine.errors.LimitError`. ``None`` takes the
            backend's default (1 GiB on CPU, a quarter of the GPU's memory up to 16 GiB).
        marginal_max_labels: Fields with up to this many labels use the marginal strategy by default; larger
            ones use the trie walk.
        top_k: How many alternatives each field reports.
        low_mass_warning: Warn when a field's candidate mass is below this.
        max_tokens: The most tokens generated for one open field's value (a field's own ``max_tokens`` wins);
            a value cut there is flagged ``truncated``.
        limits: Per-request limits (labels, generated tokens, time); a call's ``limits`` replaces them.
        special_tokens: Read control strings in documents (``<|im_end|>``, ``<|im_start|>system``) as the
            template's control tokens. Off by default: a document is plain text and cannot open a turn.
        strategy: The default strategy (see :class:`~pcd_engine.options.ExtractOptions`); ``None`` lets the
            engine choose per field.
        temperature: The default temperature of the reported probabilities.
        prompt: The default prompt format (custom instructions, listing the choices, quoted booleans, chat
            template arguments).
    """

    anchor: bool = True
    head_cache_size: int = 8
    memory_budget_mb: float | None = None
    marginal_max_labels: int = 32
    top_k: int = 5
    low_mass_warning: float = 0.1
    max_tokens: int = 64
    limits: RequestLimits = field(default_factory=RequestLimits)
    special_tokens: bool = False
    strategy: str | None = None
    temperature: float = 1.0
    prompt: PromptFormat = field(default_factory=PromptFormat)

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise OptionError(f"max_tokens: expected an integer >= 1, but got {self.max_tokens}.")
        if self.head_cache_size < 1:
            raise OptionError(f"head_cache_size: expected an integer >= 1, but got {self.head_cache_size}.")
        if self.memory_budget_mb is not None and self.memory_budget_mb <= 0:
            raise OptionError(f"memory_budget_mb: expected a positive number, but got {self.memory_budget_mb}.")
        if self.top_k < 1:
            raise OptionError(f"top_k: expected an integer >= 1, but got {self.top_k}.")
        if not isinstance(self.limits, RequestLimits):
            raise OptionError(f"limits: expected a RequestLimits, but got {type(self.limits).__name__}.")
        if not isinstance(self.prompt, PromptFormat):
            raise OptionError(f"prompt: expected a PromptFormat, but got {type(self.prompt).__name__}.")
        self.defaults()  # the defaults must themselves be valid options

    def defaults(self) -> ExtractOptions:
        """Every per-call option at this engine's default; a call's :class:`ExtractOptions` is laid over it."""
        return ExtractOptions(
            strategy=self.strategy,
            temperature=self.temperature,
            anchor=self.anchor,
            max_tokens=self.max_tokens,
            memory_budget_mb=self.memory_budget_mb,
            instructions=self.prompt.instructions,
            list_choices=self.prompt.list_choices,
            quoted_booleans=self.prompt.quoted_booleans,
            chat_template_kwargs=self.prompt.chat_template_kwargs,
            limits=self.limits,
        )


def _largest(fits: Callable[[int], bool], *, top: int = 1 << 17) -> int:
    """The largest ``n`` in ``[0, top]`` with ``fits(n)`` (``fits`` is monotone, and ``fits(0)`` is assumed)."""
    lo, hi = 0, top
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


@dataclass(frozen=True)
class _Plan:
    prompt: ChatPrompt
    tail0_ids: tuple[int, ...]


class Engine:
    """Fills in schemas from text with a local model: closed fields scored, open fields generated.

    Args:
        backend: A loaded backend.
        options: Engine settings; keyword arguments override single fields.
        **overrides: Fields of :class:`EngineOptions`.

    Example:
        >>> engine = Engine.load()                       # doctest: +SKIP
        >>> out = engine.extract("My card was charged twice, refund me today!", Ticket)  # doctest: +SKIP
        >>> out.values                                   # doctest: +SKIP
        {'sentiment': 'NEGATIVE', 'wants_refund': True, 'deadline': '12_HOURS'}
    """

    def __init__(self, backend: Backend, *, options: EngineOptions | None = None, **overrides: Any) -> None:
        base = options or EngineOptions()
        try:
            self.options = EngineOptions(**{**base.__dict__, **overrides})
        except TypeError as exc:
            raise OptionError(f"Engine options: {exc}. Known options: {sorted(base.__dict__)}.") from None
        self.backend = backend
        self.tokenizer = TokenizerView(backend.tokenizer)
        self._lock = threading.RLock()  # guards the caches below; model passes take the backend's own lock
        self._heads: OrderedDict[str, tuple[_Plan, Prefix]] = OrderedDict()
        self._waves: OrderedDict[tuple[str, str, tuple[str, ...]], CompiledWave] = OrderedDict()
        self._pass_plans: OrderedDict[tuple[int, int], tuple[CompiledWave, list[TreeBatch]]] = OrderedDict()
        self._row_plans: OrderedDict[tuple[str, str, tuple[str, ...]], RowPlan] = OrderedDict()
        self._grammars = Grammars(backend.tokenizer)

    @classmethod
    def load(
        cls,
        name_or_path: str | os.PathLike[str] | None = None,
        *,
        backend: str = "auto",
        device: str | None = None,
        dtype: str | None = None,
        scorer: str = "auto",
        **options: Any,
    ) -> Engine:
        """Load a model and wrap it in an engine.

        Args:
            name_or_path: ``None`` for the embedded SmolLM2-135M-Instruct (offline), an alias from
                :data:`pcd_engine.models.ALIASES`, a local folder, or a Hugging Face repo id.
            backend: ``"auto"`` (MLX on Apple silicon when mlx and mlx-lm are installed, else PyTorch),
                ``"torch"`` or ``"mlx"`` (any machine where mlx imports, Linux CPU included).
            device: Torch device (defaults to CUDA when available, else CPU); for MLX ``"cpu"`` or ``"gpu"``.
            dtype: ``"float32"``, ``"bfloat16"`` or ``"float16"``; MLX keeps stored (e.g. 4-bit) weights by default.
            scorer: ``"auto"``, ``"packed"`` or ``"rows"`` (see :class:`~pcd_engine.backends.torch.TorchBackend`
                and :class:`~pcd_engine.backends.mlx.MLXBackend`).
            **options: Fields of :class:`EngineOptions`.

        Returns:
            The engine.

        Raises:
            ModelLoadError: If the model cannot be found or loaded.
            BackendUnavailableError: If the backend is unknown or its libraries are missing.
        """
        from pcd_engine.models import resolve_model

        chosen = select_backend(backend)
        path = resolve_model(name_or_path, backend=chosen)
        if chosen == "mlx":
            from pcd_engine.backends.mlx import MLXBackend

            return cls(MLXBackend.load(path, device=device, dtype=dtype, scorer=scorer), **options)
        from pcd_engine.backends.torch import TorchBackend

        return cls(TorchBackend.load(path, device=device, dtype=dtype, scorer=scorer), **options)

    # ------------------------------------------------------------------------------------------ public

    def extract(
        self,
        text: str,
        schema: Any,
        options: ExtractOptions | Mapping[str, Any] | None = None,
        *,
        cancelled: Callable[[], bool] | None = None,
        **knobs: Any,
    ) -> ExtractionResult:
        """Fill in ``schema`` from ``text``.

        Safe to call from many threads at once (see the module docstring); the statistics are this call's own.

        Args:
            text: The document to classify; surrounding whitespace is stripped. Control strings in it (for
                example ``<|im_end|>``) are read as plain text unless :attr:`EngineOptions.special_tokens`.
            schema: A Pydantic model class, JSON Schema dict, preset dict, preset file dict or compiled
                :class:`~pcd_engine.schema.Schema`.
            options: This call's :class:`~pcd_engine.options.ExtractOptions` (or a mapping of them), laid over
                the engine's defaults field by field.
            cancelled: Called before every forward pass; once it returns True the call stops with
                :class:`~pcd_engine.errors.RequestCancelled`.
            **knobs: Single options by name (``temperature=``, ``anchor=``, ``strategy=``, ``max_tokens=``,
                ``limits=``, ``instructions=``, ...); they win over ``options``.

        Returns:
            The values, per-field evidence, warnings and statistics.

        Raises:
            SchemaError: If the schema has a field pcd cannot decide (before any model work).
            ContextError: If the text is empty, not valid Unicode, or too long for the model.
            LimitError: If the request needs more labels, generated tokens or memory than allowed (before any
                model work).
            OptionError: If an option is unknown or out of range.
            RequestCancelled: If ``cancelled`` said so, or (as :class:`~pcd_engine.errors.RequestTimeout`) the
                time limit passed.
            PromptAlignmentError: If the prompt does not tokenize the way the compiler assumed.
        """
        started = time.perf_counter()
        compiled = compile_schema(schema)
        call = self.resolve(options, **knobs)
        document = self._check_text(text)
        limit = call.max_tokens or self.options.max_tokens  # resolved options have every field set
        watch = Watch((call.limits or self.options.limits).time_limit_s, cancelled)
        use_anchor = bool(call.anchor)
        fmt = call.prompt_format
        open_fields = [f for f in compiled.fields if not f.scored]
        self._check_sizes(compiled, open_fields, call)
        for spec in open_fields:
            self._grammars.grammar(spec)  # llguidance must accept the value schema before any model work
        phases = dict.fromkeys(("tokenize", "prefill", "compile", "forward", "decode", "generate"), 0.0)
        passes_before = self.backend.thread_passes

        tick = time.perf_counter()
        plan, prefix = self._lookup_head(compiled, fmt)
        ids = plan.prompt.request_ids(self.tokenizer, document, special_tokens=self.options.special_tokens)
        if tuple(ids[len(ids) - len(plan.tail0_ids) :]) != plan.tail0_ids:
            raise PromptAlignmentError(
                "Prompt tail: expected the request to end with the template's tail tokens, but the document changed "
                "their tokenization. Strip unusual trailing characters from the text."
            )
        deepest = self._check_window(compiled, open_fields, plan, len(ids), limit)
        budget = self._budget_bytes(call)
        self._check_budget(len(ids), deepest, budget)
        phases["tokenize"] += (time.perf_counter() - tick) * 1000
        prefill_passes = 0
        if prefix is None:
            watch.check("the head prefill")
            before = self.backend.thread_passes
            prefix = self._prefill(compiled, fmt, plan, budget, phases)
            prefill_passes = self.backend.thread_passes - before

        request = _Request(
            state=self.backend.start(prefix),
            pending=list(ids[len(plan.prompt.head_ids) : len(ids) - len(plan.tail0_ids)]),
            tail_text=plan.prompt.tail_text,
            watch=watch,
            budget=budget,
        )
        waves = plan_waves(compiled, anchor=use_anchor)
        results: dict[str, FieldResult] = {}
        warnings: list[str] = []
        for index, wave in enumerate(waves):
            self._decide_wave(compiled, plan, request, wave, index, call, phases, results, warnings)
            # Later waves read the anchor and the answers they depend on; writing every answer would only add
            # prompt tokens to process (a 28-field schema writes ~9 tokens per field).
            needed = {dep for later in waves[index + 1 :] for spec in later for dep in spec.depends_on}
            for spec in wave:
                if spec.name in needed or (use_anchor and index == 0):
                    written = written_value(spec, results[spec.name].value, quoted_booleans=fmt.quoted_booleans)
                    request.tail_text += field_line(spec.name, written)
                    request.written.add(spec.name)

        generation_passes = generated_tokens = 0
        if open_fields:
            tick = time.perf_counter()
            before = self.backend.thread_passes
            values = self._generate(compiled, plan, request, open_fields, results, call)
            generation_passes = self.backend.thread_passes - before
            for spec, generated in zip(open_fields, values, strict=True):
                results[spec.name] = generated_result(spec, generated, len(waves), limit, warnings)
                generated_tokens += generated.tokens
            phases["generate"] += (time.perf_counter() - tick) * 1000

        if plan.prompt.system_folded:
            warnings.insert(0, "The chat template has no system role; the instructions were put in the user turn.")
        if self.backend.scorer == "rows":
            warnings.insert(0, "This model's cache cannot branch by masking; labels were scored one row each (slower).")
        ordered = {f.name: results[f.name] for f in compiled.fields}
        phases["total"] = (time.perf_counter() - started) * 1000
        stats = ExtractionStats(
            phases_ms=phases,
            prompt_tokens=len(ids),
            cached_tokens=len(plan.prompt.head_ids),
            forward_passes=self.backend.thread_passes - passes_before,
            nodes_scored=request.nodes_scored,
            waves=len(waves),
            generation_passes=generation_passes,
            generated_tokens=generated_tokens,
            prefill_passes=prefill_passes,
        )
        values_out = {name: r.value for name, r in ordered.items()}
        return ExtractionResult(values_out, ordered, tuple(warnings), stats, compiled)

    def _decide_wave(
        self,
        compiled: Schema,
        plan: _Plan,
        request: _Request,
        wave: Sequence[FieldSpec],
        index: int,
        call: ExtractOptions,
        phases: dict[str, float],
        results: dict[str, FieldResult],
        warnings: list[str],
    ) -> None:
        """Score one wave's tree (one pass unless the budget splits it) and record each field's result."""
        asked = [(spec, q) for spec in wave for q in questions(spec) if len(q.labels) > 1]
        decided: dict[str, list[Decision]] = {}
        if asked:
            tick = time.perf_counter()
            cw = self._compile(compiled, plan.prompt, [q for _, q in asked], request.tail_text)
            request.extend(cw.tail_ids, cw.causal_len, where=f"Wave {index}", need_new=True)
            passes = self._tree_passes(request, cw)
            phases["compile"] += (time.perf_counter() - tick) * 1000

            tick = time.perf_counter()
            logprobs = np.zeros(len(cw.tree))
            for batch in passes:
                request.watch.check(f"a scoring pass of wave {index}")
                scored = self.backend.score_tree(request.state, causal=request.pending, batch=batch)
                logprobs[list(batch.query_nodes)] = scored
                request.pending = []
                request.nodes_scored += len(batch.tokens)
            phases["forward"] += (time.perf_counter() - tick) * 1000

            tick = time.perf_counter()
            for (spec, _q), trie in zip(asked, cw.fields, strict=True):
                n = len(trie.spec.labels)
                decision = choose_strategy(
                    n, name=call.strategy, marginal_max_labels=self.options.marginal_max_labels
                ).decide(trie, logprobs, temperature=float(call.temperature or 1.0))
                decided.setdefault(spec.name, []).append(decision)
            phases["decode"] += (time.perf_counter() - tick) * 1000
        for spec in wave:
            if spec.kind == "multi":
                results[spec.name] = multi_result(
                    spec,
                    decided[spec.name],
                    index,
                    warnings,
                    top_k=self.options.top_k,
                    low_mass_warning=self.options.low_mass_warning,
                )
            else:
                fixed = Decision(label=0, probabilities=(1.0,), candidate_mass=None, method=Fixed.name)
                decision = decided[spec.name][0] if spec.name in decided else fixed
                results[spec.name] = scored_result(
                    spec,
                    decision,
                    index,
                    warnings,
                    top_k=self.options.top_k,
                    low_mass_warning=self.options.low_mass_warning,
                )

    def _generate(
        self,
        compiled: Schema,
        plan: _Plan,
        request: _Request,
        open_fields: Sequence[FieldSpec],
        results: dict[str, FieldResult],
        call: ExtractOptions,
    ) -> list[Generated]:
        """Write every closed answer into the prompt, then generate the open rows together."""
        limit = int(call.max_tokens or self.options.max_tokens)
        for spec in compiled.fields:  # the open rows see every closed answer
            if spec.scored and spec.name not in request.written:
                value = results[spec.name].value
                written = written_value(spec, value, quoted_booleans=bool(call.quoted_booleans))
                request.tail_text += field_line(spec.name, written)
        rows = self._rows(compiled, plan.prompt, open_fields, request.tail_text)
        request.extend(rows.tail_ids, rows.causal_len, where="Open rows", need_new=False)
        prefix_tokens = sum(len(p) for p in rows.prefixes)
        self._fit_causal(request, extra=prefix_tokens, keep=0)
        grown = prefix_tokens + sum(spec.max_tokens or limit for spec in open_fields)
        need = self.backend.pass_bytes(
            past=request.state.length + len(request.pending) + grown, new=len(open_fields), rows=len(open_fields)
        )
        if need > request.budget:
            raise LimitError(
                f"Memory budget: expected the open rows to fit the budget of {request.budget / 2**20:.0f} MiB, but "
                f"their last pass needs about {need / 2**20:.0f} MiB. Raise memory_budget_mb, lower the fields' "
                "token limits, or shorten the text."
            )
        return generate_open(
            self.backend,
            request.state,
            causal=request.pending,
            plan=rows,
            fields=open_fields,
            grammars=self._grammars,
            tokenizer=self.tokenizer,
            max_tokens=limit,
            check=lambda: request.watch.check("a generation pass"),
        )

    def extract_many(
        self,
        texts: Iterable[str],
        schema: Any,
        options: ExtractOptions | Mapping[str, Any] | None = None,
        **kwargs: Any,
    ) -> list[ExtractionResult]:
        """Run :meth:`extract` on each text with the same schema (the head cache is shared).

        Args:
            texts: The documents.
            schema: As for :meth:`extract`.
            options: As for :meth:`extract`.
            **kwargs: Passed to :meth:`extract`.

        Returns:
            One result per text, in order.
        """
        compiled = compile_schema(schema)
        call = self.resolve(options, **{k: v for k, v in kwargs.items() if k != "cancelled"})
        texts = list(texts)
        for i, text in enumerate(texts):
            self._check_text(text, where=f"texts[{i}]")
        cancelled = kwargs.get("cancelled")
        return [self.extract(text, compiled, call, cancelled=cancelled) for text in texts]

    def prompt_for(
        self, text: str, schema: Any, options: ExtractOptions | Mapping[str, Any] | None = None, **knobs: Any
    ) -> list[int]:
        """Token ids of the full prompt the model sees for ``text`` (head, document and tail up to ``{``), with
        this call's prompt format (``options`` and ``knobs`` as for :meth:`extract`)."""
        compiled = compile_schema(schema)
        prompt = ChatPrompt.build(self.tokenizer, compiled, self.resolve(options, **knobs).prompt_format)
        return prompt.request_ids(self.tokenizer, self._check_text(text), special_tokens=self.options.special_tokens)

    def resolve(self, options: ExtractOptions | Mapping[str, Any] | None = None, **knobs: Any) -> ExtractOptions:
        """The options a call runs with: ``knobs`` over ``options`` over the engine's defaults, field by field.

        Raises:
            OptionError: If an option is unknown or out of range.
        """
        given = ExtractOptions.parse(options)
        single = ExtractOptions.parse(knobs, where="extract")
        return single.over(given.over(self.options.defaults()))

    # ------------------------------------------------------------------------------------------ checks

    @staticmethod
    def _check_text(text: Any, *, where: str = "text") -> str:
        if not isinstance(text, str):
            raise ContextError(f"Context: expected {where} to be a str, but got {type(text).__name__}.")
        stripped = text.strip()
        if not stripped:
            raise ContextError(f"Context: expected {where} to contain some text, but got only whitespace or nothing.")
        try:
            stripped.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise ContextError(
                f"Context: expected {where} to be valid Unicode, but it has a lone surrogate "
                f"{stripped[exc.start]!r} at character {exc.start}. Decode the text with errors='replace'."
            ) from None
        return stripped

    def _check_sizes(self, schema: Schema, open_fields: Sequence[FieldSpec], call: ExtractOptions) -> None:
        """The request's labels and generated tokens against its limits, by counting only (no model work)."""
        limits = call.limits or self.options.limits
        labels = sum(len(q.labels) for spec in schema.fields if spec.scored for q in questions(spec))
        if limits.max_labels is not None and labels > limits.max_labels:
            raise LimitError(
                f"Labels: expected at most {limits.max_labels} allowed values in one request, but the schema has "
                f"{labels}. Split the schema or raise max_labels."
            )
        if limits.max_generated_tokens is None:
            return
        total = 0
        for spec in open_fields:
            own = spec.max_tokens or call.max_tokens or self.options.max_tokens
            if own > limits.max_generated_tokens:
                source = "its x-max-tokens" if spec.max_tokens else "max_tokens"
                raise LimitError(
                    f"Field {spec.name!r}: expected a token limit of at most {limits.max_generated_tokens}, but "
                    f"{source} asks for {own}. Lower it."
                )
            total += own
        if total > limits.max_generated_tokens:
            raise LimitError(
                f"Generated tokens: expected the open fields to ask for at most {limits.max_generated_tokens} tokens "
                f"in all, but their limits add up to {total}. Lower the fields' x-max-tokens or max_tokens."
            )

    def _check_window(
        self, schema: Schema, open_fields: Sequence[FieldSpec], plan: _Plan, prompt_tokens: int, limit: int
    ) -> int:
        """The whole request against the model's window, before any model work; the message blames what is
        too long: a field's token limit, the schema, or the text. Returns the most tokens the answers may add."""
        window = self.backend.max_context
        labels = [len(l.surfaces[0]) for f in schema.fields if f.scored for q in questions(f) for l in q.labels]
        answers = 0
        if open_fields:  # the rows' prompt also holds every closed answer
            answers = sum(
                12 + max(len(l.surfaces[0]) for l in q.labels) for f in schema.fields if f.scored for q in questions(f)
            )
        fixed = len(plan.prompt.head_ids) + len(plan.tail0_ids) + 2
        for spec in open_fields:
            own = spec.max_tokens or limit
            if fixed + answers + own + 8 > window:
                source = "its x-max-tokens" if spec.max_tokens else "max_tokens"
                raise ContextError(
                    f"Field {spec.name!r}: expected its token limit to fit the model's window of {window} tokens, "
                    f"but {source} asks for {own} after a prompt of {fixed + answers}. Lower it."
                )
        deepest = 2 + max([*labels, *[8 + (f.max_tokens or limit) for f in open_fields]]) + answers
        if fixed + deepest > window:
            raise ContextError(
                f"Schema {schema.title!r}: expected its prompt to fit the model's window of {window} tokens, but the "
                f"instructions take {len(plan.prompt.head_ids)} tokens and the answers up to {deepest}. Use fewer "
                "labels or fields."
            )
        if prompt_tokens + deepest > window:
            raise ContextError(
                f"Context: expected the prompt to fit the model's window of {window} tokens, but it needs "
                f"{prompt_tokens} tokens (plus up to {deepest} for the answers). Shorten the text."
            )
        return deepest

    def _check_budget(self, prompt_tokens: int, deepest: int, budget: int) -> None:
        """Whether the request can run within the memory budget at all: its longest root-to-leaf chain (or a
        pass of one token per open row) after the whole prompt and answers. Checked before any model work."""
        need = self.backend.pass_bytes(past=prompt_tokens + deepest, new=1, rows=2)
        if need > budget:
            raise LimitError(
                f"Memory budget: expected a pass after this prompt to fit the budget of {budget / 2**20:.0f} MiB, "
                f"but even one token needs about {need / 2**20:.1f} MiB. Raise memory_budget_mb or shorten the text."
            )

    def _budget_bytes(self, call: ExtractOptions) -> int:
        budget_mb = call.memory_budget_mb or self.backend.default_memory_budget_mb
        return int(budget_mb * 2**20)

    def _fit(self, past: int, budget: int, *, extra: int = 0) -> int:
        """The most new tokens one pass after ``past`` can feed within ``budget`` (0 when none fits)."""
        return _largest(lambda n: self.backend.pass_bytes(past=past, new=n + extra, rows=extra + 1) <= budget)

    def _over_budget(self, budget: int, what: str) -> LimitError:
        return LimitError(
            f"Memory budget: expected {what} to fit the budget of {budget / 2**20:.0f} MiB per pass, but not even "
            "one token does. Raise memory_budget_mb or shorten the text."
        )

    # ------------------------------------------------------------------------------------------ caches and passes

    def _lookup_head(self, schema: Schema, fmt: PromptFormat) -> tuple[_Plan, Prefix | None]:
        """The schema's cached head in this prompt format, or its plan and ``None`` when it must be prefilled
        (nothing is cached yet)."""
        key = schema.fingerprint + fmt.key
        with self._lock:
            hit = self._heads.get(key)
            if hit is not None:
                self._heads.move_to_end(key)
                return hit
        prompt = ChatPrompt.build(self.tokenizer, schema, fmt)
        tail0, skip = tail_tokens(self.tokenizer, prompt.boundary_text, prompt.tail_text)
        return _Plan(prompt, tuple(tail0[skip:])), None

    def _prefill(self, schema: Schema, fmt: PromptFormat, plan: _Plan, budget: int, phases: dict[str, float]) -> Prefix:
        """Prefill the head in causal chunks that fit the budget, then cache it (only once it has succeeded)."""
        head = plan.prompt.head_ids
        chunk = self._fit(len(head), budget)
        if chunk < 1 and head:
            raise self._over_budget(budget, "the schema's instructions")
        tick = time.perf_counter()
        prefix = self.backend.prefill(head, chunk=chunk if chunk < len(head) else None)
        phases["prefill"] += (time.perf_counter() - tick) * 1000
        with self._lock:
            self._heads[schema.fingerprint + fmt.key] = (plan, prefix)
            while len(self._heads) > self.options.head_cache_size:
                self._heads.popitem(last=False)
        return prefix

    def _fit_causal(self, request: _Request, *, extra: int, keep: int) -> None:
        """Feed the pending causal tokens ahead, in chunks that fit the budget, when they would not fit in one pass
        with ``extra`` tree tokens; ``keep`` tokens stay pending (a tree reads its root from the last one)."""
        state, budget = request.state, request.budget
        if self.backend.pass_bytes(past=state.length, new=len(request.pending) + extra, rows=extra + 1) > budget:
            self._feed_ahead(request, keep=keep)
            if self.backend.pass_bytes(past=state.length, new=len(request.pending) + extra, rows=extra + 1) > budget:
                raise self._over_budget(budget, "one root-to-leaf chain of the answers")

    def _feed_ahead(self, request: _Request, *, keep: int) -> None:
        """Feed all pending causal tokens but the last ``keep`` into the state, in chunks that fit the budget."""
        while len(request.pending) > keep:
            chunk = min(self._fit(request.state.length, request.budget), len(request.pending) - keep)
            if chunk < 1:
                raise self._over_budget(request.budget, "the text")
            request.watch.check("a document pass")
            self.backend.score_tree(request.state, causal=request.pending[:chunk], batch=_EMPTY)
            request.pending = request.pending[chunk:]

    def _compile(self, schema: Schema, prompt: ChatPrompt, fields: Sequence[Any], tail_text: str) -> CompiledWave:
        return self._cached(
            self._waves,
            (schema.fingerprint, prompt.boundary_text, tail_text, tuple(f.name for f in fields)),
            lambda: compile_wave(self.tokenizer, fields, boundary_text=prompt.boundary_text, tail_text=tail_text),
        )

    def _rows(self, schema: Schema, prompt: ChatPrompt, fields: Sequence[FieldSpec], tail_text: str) -> RowPlan:
        return self._cached(
            self._row_plans,
            (schema.fingerprint, prompt.boundary_text, tail_text, tuple(f.name for f in fields)),
            lambda: compile_rows(self.tokenizer, fields, boundary_text=prompt.boundary_text, tail_text=tail_text),
        )

    def _cached(self, store: OrderedDict[Any, _T], key: Any, build: Callable[[], _T]) -> _T:
        """A bounded LRU lookup: ``store[key]``, built by ``build`` on a miss (outside the lock)."""
        with self._lock:
            hit = store.get(key)
            if hit is not None:
                store.move_to_end(key)
                return hit
        value = build()
        with self._lock:
            store[key] = value
            while len(store) > 64 * self.options.head_cache_size:
                store.popitem(last=False)
        return value

    def _passes(self, wave: CompiledWave, max_nodes: int) -> list[TreeBatch]:
        plan = self._cached(
            self._pass_plans, (id(wave), max_nodes), lambda: (wave, plan_passes(wave.tree, max_nodes=max_nodes))
        )
        if plan[0] is not wave:  # an id reused after its wave was evicted
            plan = (wave, plan_passes(wave.tree, max_nodes=max_nodes))
            with self._lock:
                self._pass_plans[(id(wave), max_nodes)] = plan
        return plan[1]

    def _max_nodes(self, past: int, causal: int, budget: int) -> int:
        """The most tree nodes a pass with ``causal`` tokens after ``past`` can feed within ``budget`` (>= 1)."""
        fits = _largest(lambda n: self.backend.pass_bytes(past=past, new=causal + n, rows=n + 1) <= budget)
        return max(1, fits)

    def _tree_passes(self, request: _Request, wave: CompiledWave) -> list[TreeBatch]:
        """The wave's passes within the budget. The document block rides in the first pass unless feeding it
        ahead (in causal chunks) saves passes, or is the only way one root-to-leaf chain fits beside it."""
        packed = wave.tree.packed
        longest = 1 + max((wave.tree.depths[n] for n in packed), default=0)
        self._fit_causal(request, extra=longest, keep=1)
        past, pending = request.state.length, len(request.pending)
        passes = self._passes(wave, self._max_nodes(past, pending, request.budget))
        if len(passes) > 1 and pending > 1:
            ahead = self._passes(wave, self._max_nodes(past + pending - 1, 1, request.budget))
            chunks = -(-(pending - 1) // max(1, self._fit(past, request.budget)))
            if chunks + len(ahead) < len(passes):
                self._feed_ahead(request, keep=1)
                passes = ahead
        return passes
