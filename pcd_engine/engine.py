"""The Engine: load a model, then fill in schemas from text with tree-packed decisions.

One request runs, per wave of fields, ONE forward pass on top of the schema head's cached KV: the document (or
the answers written by the previous wave) as a causal block, followed by the packed trie of every label of
every field in the wave. A wave's tree is split over several passes only when it would exceed the memory budget.
Open fields come last: every closed answer is written into the prompt, and one row per open field is generated
under its JSON Schema, all rows advancing together one forward pass per token (:mod:`pcd_engine.generation`).
"""

from __future__ import annotations

import os
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

from pcd_engine.backends import select_backend
from pcd_engine.backends.base import Backend, Prefix
from pcd_engine.compiler import CompiledWave, compile_wave, questions, written_value
from pcd_engine.decoding import Decision, Fixed, choose_strategy
from pcd_engine.errors import ContextError, OptionError, PromptAlignmentError
from pcd_engine.generation import Generated, Grammars, RowPlan, compile_rows, generate_open
from pcd_engine.planner import TreeBatch, plan_passes, plan_waves
from pcd_engine.prompt import ChatPrompt, TokenizerView, field_line, tail_tokens
from pcd_engine.result import Alternative, ExtractionResult, ExtractionStats, FieldResult
from pcd_engine.schema import FieldSpec, Schema, compile_schema

__all__ = ["Engine", "EngineOptions"]

_T = TypeVar("_T")


@dataclass(frozen=True)
class EngineOptions:
    """Engine-wide settings.

    Attributes:
        anchor: Decide the first field alone and write it into the prompt before the others (one extra pass,
            usually better answers). ``depends_on`` adds waves either way; a later wave's prompt holds the
            anchor's answer and the answers its fields depend on, not every earlier answer.
        head_cache_size: How many schema heads keep their KV cache (least recently used are dropped).
        memory_budget_mb: Estimated peak memory of one pass above which a wave's tree is split into passes;
            ``None`` takes the backend's default (1 GiB on CPU, a quarter of the GPU's memory up to 16 GiB).
        marginal_max_labels: Fields with up to this many labels use the marginal strategy by default; larger
            ones use the trie walk.
        top_k: How many alternatives each field reports.
        low_mass_warning: Warn when a field's candidate mass is below this.
        max_tokens: The most tokens generated for one open field's value (a field's own ``max_tokens`` wins);
            a value cut there is flagged ``truncated``.
    """

    anchor: bool = True
    head_cache_size: int = 8
    memory_budget_mb: float | None = None
    marginal_max_labels: int = 32
    top_k: int = 5
    low_mass_warning: float = 0.1
    max_tokens: int = 64

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise OptionError(f"max_tokens: expected an integer >= 1, but got {self.max_tokens}.")
        if self.head_cache_size < 1:
            raise OptionError(f"head_cache_size: expected an integer >= 1, but got {self.head_cache_size}.")
        if self.memory_budget_mb is not None and self.memory_budget_mb <= 0:
            raise OptionError(f"memory_budget_mb: expected a positive number, but got {self.memory_budget_mb}.")
        if self.top_k < 1:
            raise OptionError(f"top_k: expected an integer >= 1, but got {self.top_k}.")


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
        *,
        temperature: float = 1.0,
        anchor: bool | None = None,
        strategy: str | None = None,
        max_tokens: int | None = None,
    ) -> ExtractionResult:
        """Fill in ``schema`` from ``text``.

        Args:
            text: The document to classify; surrounding whitespace is stripped.
            schema: A Pydantic model class, JSON Schema dict, preset dict, preset file dict or compiled
                :class:`~pcd_engine.schema.Schema`.
            temperature: Reshapes the reported probabilities (> 0); never changes the decisions.
            anchor: Override :attr:`EngineOptions.anchor` for this call.
            strategy: Force ``"marginal"``, ``"exact"`` or ``"trie_walk"`` for every field with several labels.
            max_tokens: Override :attr:`EngineOptions.max_tokens` (the token limit of each open field's value) for
                this call; a field's own ``max_tokens`` still wins.

        Returns:
            The values, per-field evidence, warnings and statistics.

        Raises:
            SchemaError: If the schema has a field pcd cannot decide (before any model work).
            ContextError: If the text is empty or too long for the model.
            PromptAlignmentError: If the prompt does not tokenize the way the compiler assumed.
        """
        started = time.perf_counter()
        compiled = compile_schema(schema)
        if not isinstance(temperature, (int, float)) or not temperature > 0:
            raise OptionError(f"temperature: expected a number > 0, but got {temperature!r}.")
        if strategy is not None:
            choose_strategy(2, name=strategy)  # validate before any model work
        bad_limit = isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1
        if max_tokens is not None and bad_limit:
            raise OptionError(f"max_tokens: expected an integer >= 1, but got {max_tokens!r}.")
        limit = self.options.max_tokens if max_tokens is None else max_tokens
        document = self._check_text(text)
        use_anchor = self.options.anchor if anchor is None else anchor
        open_fields = [f for f in compiled.fields if not f.scored]
        for spec in open_fields:
            self._grammars.grammar(spec)  # llguidance must accept the value schema before any model work
        phases = dict.fromkeys(("tokenize", "prefill", "compile", "forward", "decode", "generate"), 0.0)
        passes_before = self.backend.forward_passes

        plan, prefix = self._head(compiled, phases)
        tick = time.perf_counter()
        ids = plan.prompt.request_ids(self.tokenizer, document)
        if tuple(ids[len(ids) - len(plan.tail0_ids) :]) != plan.tail0_ids:
            raise PromptAlignmentError(
                "Prompt tail: expected the request to end with the template's tail tokens, but the document changed "
                "their tokenization. Strip unusual trailing characters from the text."
            )
        waves = plan_waves(compiled, anchor=use_anchor)
        deepest = 2 + max(
            [len(l.surfaces[0]) for f in compiled.fields for q in questions(f) for l in q.labels]
            + [8 + (f.max_tokens or limit) for f in open_fields]
        )
        if open_fields:  # the rows' prompt also holds every closed answer
            deepest += sum(
                12 + max(len(l.surfaces[0]) for l in q.labels)
                for f in compiled.fields
                if f.scored
                for q in questions(f)
            )
        if len(ids) + deepest > self.backend.max_context:
            raise ContextError(
                f"Context: expected the prompt to fit the model's window of {self.backend.max_context} tokens, but "
                f"it needs {len(ids)} tokens (plus up to {deepest} for the answers). Shorten the text."
            )
        phases["tokenize"] += (time.perf_counter() - tick) * 1000

        state = self.backend.start(prefix)
        pending = list(ids[len(plan.prompt.head_ids) : len(ids) - len(plan.tail0_ids)])
        committed: tuple[int, ...] = ()
        tail_text = plan.prompt.tail_text
        results: dict[str, FieldResult] = {}
        warnings: list[str] = []
        written: set[str] = set()
        nodes_scored = 0
        for index, wave in enumerate(waves):
            asked = [(spec, q) for spec in wave for q in questions(spec) if len(q.labels) > 1]
            decided: dict[str, list[Decision]] = {}
            if asked:
                tick = time.perf_counter()
                cw = self._compile(compiled, [q for _, q in asked], tail_text)
                pending, committed = self._extend(
                    pending, committed, cw.tail_ids, cw.causal_len, where=f"Wave {index}", need_new=True
                )
                budget_mb = self.options.memory_budget_mb or self.backend.default_memory_budget_mb
                budget = int(budget_mb * 2**20)
                passes = self._passes(cw, self._max_nodes(state.length, len(pending), budget))
                phases["compile"] += (time.perf_counter() - tick) * 1000

                tick = time.perf_counter()
                logprobs = np.zeros(len(cw.tree))
                for batch in passes:
                    logprobs[list(batch.query_nodes)] = self.backend.score_tree(state, causal=pending, batch=batch)
                    pending = []
                    nodes_scored += len(batch.tokens)
                phases["forward"] += (time.perf_counter() - tick) * 1000

                tick = time.perf_counter()
                for (spec, _q), trie in zip(asked, cw.fields, strict=True):
                    n = len(trie.spec.labels)
                    decision = choose_strategy(
                        n, name=strategy, marginal_max_labels=self.options.marginal_max_labels
                    ).decide(trie, logprobs, temperature=float(temperature))
                    decided.setdefault(spec.name, []).append(decision)
                phases["decode"] += (time.perf_counter() - tick) * 1000
            for spec in wave:
                if spec.kind == "multi":
                    results[spec.name] = self._multi_result(spec, decided[spec.name], index, warnings)
                else:
                    fixed = Decision(label=0, probabilities=(1.0,), candidate_mass=None, method=Fixed.name)
                    decision = decided[spec.name][0] if spec.name in decided else fixed
                    results[spec.name] = self._field_result(spec, decision, index, warnings)
            # Later waves read the anchor and the answers they depend on; writing every answer would only add
            # prompt tokens to process (a 28-field schema writes ~9 tokens per field).
            needed = {dep for later in waves[index + 1 :] for spec in later for dep in spec.depends_on}
            for spec in wave:
                if spec.name in needed or (use_anchor and index == 0):
                    tail_text += field_line(spec.name, written_value(spec, results[spec.name].value))
                    written.add(spec.name)

        generation_passes = generated_tokens = 0
        if open_fields:
            tick = time.perf_counter()
            # The open rows see every closed answer.
            for spec in compiled.fields:
                if spec.scored and spec.name not in written:
                    tail_text += field_line(spec.name, written_value(spec, results[spec.name].value))
            rows = self._rows(compiled, open_fields, tail_text)
            pending, committed = self._extend(
                pending, committed, rows.tail_ids, rows.causal_len, where="Open rows", need_new=False
            )
            before = self.backend.forward_passes
            values = generate_open(
                self.backend,
                state,
                causal=pending,
                plan=rows,
                fields=open_fields,
                grammars=self._grammars,
                tokenizer=self.tokenizer,
                max_tokens=limit,
            )
            generation_passes = self.backend.forward_passes - before
            for spec, generated in zip(open_fields, values, strict=True):
                results[spec.name] = self._generated_result(spec, generated, len(waves), limit, warnings)
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
            forward_passes=self.backend.forward_passes - passes_before,
            nodes_scored=nodes_scored,
            waves=len(waves),
            generation_passes=generation_passes,
            generated_tokens=generated_tokens,
        )
        values_out = {name: r.value for name, r in ordered.items()}
        return ExtractionResult(values_out, ordered, tuple(warnings), stats, compiled)

    def extract_many(self, texts: Iterable[str], schema: Any, **kwargs: Any) -> list[ExtractionResult]:
        """Run :meth:`extract` on each text with the same schema (the head cache is shared).

        Args:
            texts: The documents.
            schema: As for :meth:`extract`.
            **kwargs: Passed to :meth:`extract`.

        Returns:
            One result per text, in order.
        """
        compiled = compile_schema(schema)
        texts = list(texts)
        for i, text in enumerate(texts):
            self._check_text(text, where=f"texts[{i}]")
        return [self.extract(text, compiled, **kwargs) for text in texts]

    def prompt_for(self, text: str, schema: Any) -> list[int]:
        """Token ids of the full prompt the model sees for ``text`` (head, document and tail up to ``{``)."""
        compiled = compile_schema(schema)
        prompt = ChatPrompt.build(self.tokenizer, compiled)
        return prompt.request_ids(self.tokenizer, self._check_text(text))

    # ------------------------------------------------------------------------------------------ internals

    @staticmethod
    def _check_text(text: Any, *, where: str = "text") -> str:
        if not isinstance(text, str):
            raise ContextError(f"Context: expected {where} to be a str, but got {type(text).__name__}.")
        stripped = text.strip()
        if not stripped:
            raise ContextError(f"Context: expected {where} to contain some text, but got only whitespace or nothing.")
        return stripped

    def _head(self, schema: Schema, phases: dict[str, float]) -> tuple[_Plan, Prefix]:
        key = schema.fingerprint
        hit = self._heads.get(key)
        if hit is not None:
            self._heads.move_to_end(key)
            return hit
        prompt = ChatPrompt.build(self.tokenizer, schema)
        tail0, skip = tail_tokens(self.tokenizer, prompt.boundary_text, prompt.tail_text)
        plan = _Plan(prompt, tuple(tail0[skip:]))
        tick = time.perf_counter()
        prefix = self.backend.prefill(prompt.head_ids)
        phases["prefill"] += (time.perf_counter() - tick) * 1000
        self._heads[key] = (plan, prefix)
        while len(self._heads) > self.options.head_cache_size:
            self._heads.popitem(last=False)
        return plan, prefix

    def _compile(self, schema: Schema, fields: Sequence[Any], tail_text: str) -> CompiledWave:
        prompt = self._heads[schema.fingerprint][0].prompt
        return self._cached(
            self._waves,
            (schema.fingerprint, tail_text, tuple(f.name for f in fields)),
            lambda: compile_wave(self.tokenizer, fields, boundary_text=prompt.boundary_text, tail_text=tail_text),
        )

    def _rows(self, schema: Schema, fields: Sequence[FieldSpec], tail_text: str) -> RowPlan:
        prompt = self._heads[schema.fingerprint][0].prompt
        return self._cached(
            self._row_plans,
            (schema.fingerprint, tail_text, tuple(f.name for f in fields)),
            lambda: compile_rows(self.tokenizer, fields, boundary_text=prompt.boundary_text, tail_text=tail_text),
        )

    def _cached(self, store: OrderedDict[Any, _T], key: Any, build: Callable[[], _T]) -> _T:
        """A bounded LRU lookup: ``store[key]``, built by ``build`` on a miss."""
        hit = store.get(key)
        if hit is not None:
            store.move_to_end(key)
            return hit
        value = store[key] = build()
        while len(store) > 64 * self.options.head_cache_size:
            store.popitem(last=False)
        return value

    @staticmethod
    def _extend(
        pending: list[int],
        committed: tuple[int, ...],
        tail_ids: Sequence[int],
        causal_len: int,
        *,
        where: str,
        need_new: bool,
    ) -> tuple[list[int], tuple[int, ...]]:
        """Append the tail tokens a compiled wave or row plan needs after what the state already holds.

        ``need_new``: a scored tree reads its root distribution from the last new token, so it needs one; open
        rows start from their own prefix tokens and do not."""
        if tuple(tail_ids[: len(committed)]) != committed or causal_len < len(committed):
            raise PromptAlignmentError(
                f"{where}: expected the written answers to extend the tail's tokens, but they re-tokenized the text "
                "before them."
            )
        pending = [*pending, *tail_ids[len(committed) : causal_len]]
        if not pending and need_new:
            raise PromptAlignmentError(
                f"{where}: expected new prompt tokens before the tree (the root distribution is read from the last "
                "one), but the written answers added none."
            )
        return pending, tuple(tail_ids[:causal_len])

    def _passes(self, wave: CompiledWave, max_nodes: int) -> list[TreeBatch]:
        key = (id(wave), max_nodes)
        hit = self._pass_plans.get(key)
        if hit is None or hit[0] is not wave:
            hit = (wave, plan_passes(wave.tree, max_nodes=max_nodes))
            self._pass_plans[key] = hit
            while len(self._pass_plans) > 64 * self.options.head_cache_size:
                self._pass_plans.popitem(last=False)
        return hit[1]

    def _max_nodes(self, past: int, causal: int, budget: int) -> int:
        lo, hi = 1, 1 << 16
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self.backend.pass_bytes(past=past, new=causal + mid, rows=mid + 1) <= budget:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def _multi_result(
        self, spec: FieldSpec, decisions: Sequence[Decision], wave: int, warnings: list[str]
    ) -> FieldResult:
        """One yes/no decision per label, then ``min_items`` / ``max_items``: the most probable labels are added
        or kept, and the list is in label order."""
        yes = [d.probabilities[0] for d in decisions]
        by_yes = sorted(range(len(yes)), key=lambda i: (-yes[i], i))
        chosen = {i for i in by_yes if yes[i] >= 0.5}
        chosen |= set(by_yes[: spec.min_items])
        if spec.max_items is not None and len(chosen) > spec.max_items:
            chosen = set([i for i in by_yes if i in chosen][: spec.max_items])
        masses = [d.candidate_mass for d in decisions if d.candidate_mass is not None]
        mass = min(masses) if masses else None
        if mass is not None and mass < self.options.low_mass_warning:
            warnings.append(
                f"Field {spec.name!r}: the model put only {mass:.1%} of its probability on true or false for some "
                "of the labels; it wanted to write something else."
            )
        sure = [yes[i] if i in chosen else 1.0 - yes[i] for i in range(len(yes))]
        return FieldResult(
            name=spec.name,
            value=[spec.labels[i].value for i in sorted(chosen)],
            probability=min(sure),
            candidate_mass=mass,
            method=decisions[0].method,
            alternatives=tuple(Alternative(spec.labels[i].value, yes[i]) for i in by_yes[: self.options.top_k]),
            wave=wave,
            label_probabilities={label.value: p for label, p in zip(spec.labels, yes, strict=True)},
        )

    def _generated_result(
        self, spec: FieldSpec, generated: Generated, wave: int, default_limit: int, warnings: list[str]
    ) -> FieldResult:
        if generated.truncated:
            limit = spec.max_tokens or default_limit
            what = "closed where it was cut" if generated.valid else "could not be completed and is null"
            warnings.append(f"Field {spec.name!r}: the value reached its limit of {limit} tokens; it was {what}.")
        elif not generated.valid:
            warnings.append(f"Field {spec.name!r}: the generated value {generated.text!r} is not valid; it is null.")
        return FieldResult(
            name=spec.name,
            value=generated.value,
            probability=None,
            candidate_mass=None,
            method="generated",
            alternatives=(),
            wave=wave,
            source="generated",
            mean_logprob=generated.mean_logprob,
            tokens=generated.tokens,
            truncated=generated.truncated,
        )

    def _field_result(self, spec: Any, decision: Any, wave: int, warnings: list[str]) -> FieldResult:
        probs = decision.probabilities
        order = sorted(range(len(probs)), key=lambda i: (-probs[i], i))[: self.options.top_k]
        alternatives = tuple(Alternative(spec.labels[i].value, probs[i]) for i in order)
        mass = decision.candidate_mass
        if mass is not None and mass < self.options.low_mass_warning:
            warnings.append(
                f"Field {spec.name!r}: the model put only {mass:.1%} of its probability on the allowed labels; "
                "it wanted to write something else."
            )
        if len(order) > 1 and probs[order[0]] - probs[order[1]] < 0.02:
            warnings.append(
                f"Field {spec.name!r}: {spec.labels[order[0]].value!r} and {spec.labels[order[1]].value!r} are "
                f"nearly tied ({probs[order[0]]:.2f} vs {probs[order[1]]:.2f})."
            )
        return FieldResult(
            name=spec.name,
            value=spec.labels[decision.label].value,
            probability=probs[decision.label],
            candidate_mass=mass,
            method=decision.method,
            alternatives=alternatives,
            wave=wave,
        )
