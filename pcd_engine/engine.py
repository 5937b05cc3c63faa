"""The Engine: load a model, then fill in schemas from text with tree-packed decisions.

One request runs, per wave of fields, ONE forward pass on top of the schema preamble's cached KV: the document (or
the answers written by the previous wave) as a causal block, followed by the packed trie of every label of
every field in the wave. A wave's tree is split over several passes only when it would exceed the memory budget.
Open fields come last: every closed answer is written into the prompt, and one row per open field is generated
under its JSON Schema, all rows advancing together one forward pass per token (:mod:`pcd_engine.generate.open_rows`).

Every request is bounded before any model work: its labels and generated tokens against its
:class:`~pcd_engine.limits.RequestLimits`, its prompt and answers against the model's window, its passes against
the memory budget. Nothing is cached for a request that fails. Time limits and cancellation are checked before
every forward pass.

A call runs as a :class:`~pcd_engine.run.request.Request` (its own tokens, answers, results and statistics) in four
steps: open (checks, tokenization, the preamble prefill when it is not cached), one ``decide_wave`` per wave,
``generate`` for the open rows, and ``result``. What is compiled once (schema preambles with their KV, compiled waves,
pass plans, row plans) lives in the engine's :class:`~pcd_engine.run.compile_cache.CompileCache`.

Concurrency: an :class:`Engine` may be called from many threads. The compile cache is a set of thread-safe LRUs,
and the model runs one pass at a time (the backend's lock), so concurrent calls interleave at pass boundaries and
get exactly the answers they would get one by one.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np

from pcd_engine.backends.contract import Backend, Prefix, RequestState
from pcd_engine.decide.staging import PassCost, measure_pass_cost
from pcd_engine.deciders.corrections import CORRECTION_WINDOW
from pcd_engine.errors import ContextError, OptionError
from pcd_engine.generate.open_rows import Grammars
from pcd_engine.heads.head import HEADED_KINDS
from pcd_engine.lru import LRU
from pcd_engine.models.loading import ModelToLoad, model_to_load
from pcd_engine.options import EngineOptions, ExtractOptions, PromptFormat, check_batch_size
from pcd_engine.prompt.chat_prompt import ChatPrompt, TokenizerView
from pcd_engine.result import ExtractionResult, FieldResult
from pcd_engine.run.admission import check_text
from pcd_engine.run.batch import Document, open_lean, read_batch, read_features, run_batch
from pcd_engine.run.budget import PassBudget
from pcd_engine.run.collector import Collector
from pcd_engine.run.compile_cache import CompileCache, SchemaPrompt
from pcd_engine.run.opening import prefill
from pcd_engine.run.orders import averaged, orders_of
from pcd_engine.run.request import Request
from pcd_engine.schema import Schema, compile_schema

__all__ = ["SHARED_ENGINES", "Engine", "EngineOptions"]

SHARED_ENGINES = 4
"""How many engines :meth:`Engine.shared` keeps loaded in a process."""
_SHARED: LRU[tuple[str, str, str | None, str | None, str], Engine] = LRU(SHARED_ENGINES)
_SHARED_LOCK = threading.Lock()  # around the LRU too: it builds outside its own lock, and a model must load once


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
        self.cache = CompileCache(self.tokenizer, prompts=self.options.prompt_cache_size)
        self.grammars = Grammars(backend.tokenizer)
        self._collector: Collector | None = None
        self._collector_lock = threading.Lock()
        given = self.options.pass_cost
        self._pass_cost: PassCost | None = None if given is None else PassCost(float(given[0]), float(given[1]))
        config = getattr(getattr(backend, "model", None), "config", None)
        named = getattr(config, "_name_or_path", None) or getattr(config, "name_or_path", None)
        self.model_id: str = str(named or type(getattr(backend, "model", backend)).__name__)
        """Which model this is, for what must not be mixed across models (a calibration): the name it was loaded
        by (an alias, folder, file or repo id), or the model's own name where the engine was built around a
        backend. The backend and dtype are not part of it (they agree to 1e-4 on the same weights)."""

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
                :data:`pcd_engine.models.resolve.ALIASES`, a local folder, a ``.gguf`` file (or a folder holding one), a
                model in the local Ollama store, or a Hugging Face repo id (see
                :func:`~pcd_engine.models.resolve.resolve_model`).
            backend: ``"auto"`` (MLX on Apple silicon when mlx and mlx-lm are installed, else PyTorch),
                ``"torch"`` or ``"mlx"`` (any machine where mlx imports, Linux CPU included).
            device: Torch device (defaults to CUDA when available, else CPU); for MLX ``"cpu"`` or ``"gpu"``.
            dtype: ``"float32"``, ``"bfloat16"`` or ``"float16"``; MLX keeps stored (e.g. 4-bit) weights by default.
                A GGUF file is converted in this precision (fp32 when ``None``).
            scorer: ``"auto"``, ``"packed"`` or ``"rows"`` (see :class:`~pcd_engine.backends.torch.TorchBackend`
                and :class:`~pcd_engine.backends.mlx.MLXBackend`).
            **options: Fields of :class:`EngineOptions`.

        Returns:
            The engine.

        Raises:
            ModelLoadError: If the model cannot be found or loaded.
            BackendUnavailableError: If the backend is unknown or its libraries are missing.
        """
        found = model_to_load(name_or_path, backend=backend, device=device, dtype=dtype, scorer=scorer)
        return cls._loaded(found, **options)

    @classmethod
    def shared(
        cls,
        name_or_path: str | os.PathLike[str] | None = None,
        *,
        backend: str = "auto",
        device: str | None = None,
        dtype: str | None = None,
        scorer: str = "auto",
    ) -> Engine:
        """The process's one engine for a model: loaded on first use, then returned to every later caller that names
        the same weights, under whatever name (``None``, ``"smollm2-135m"`` and the converted folder's path are one
        model, and its :attr:`model_id` is the name it was first loaded by). What the adapters (LangChain,
        LlamaIndex) use, so that building them is cheap.

        Engines are keyed by what they load: the resolved model (a real path for a local folder), the backend
        actually chosen, the device, the dtype and the scorer. At most :data:`SHARED_ENGINES` are kept; the least
        recently used is dropped first. An engine is safe to share between threads (see the module docstring).

        Args:
            name_or_path: As for :meth:`load`.
            backend: As for :meth:`load`.
            device: As for :meth:`load`.
            dtype: As for :meth:`load`.
            scorer: As for :meth:`load`.

        Returns:
            The shared engine, with default :class:`EngineOptions`.

        Raises:
            ModelLoadError: If the model cannot be found or loaded.
            BackendUnavailableError: If the backend is unknown or its libraries are missing.
        """
        found = model_to_load(name_or_path, backend=backend, device=device, dtype=dtype, scorer=scorer)
        with _SHARED_LOCK:
            engine = _SHARED.get(found.key)
            if engine is None:
                engine = cls._loaded(found)
                _SHARED.put(found.key, engine)
        return engine

    @classmethod
    def _loaded(cls, found: ModelToLoad, **options: Any) -> Engine:
        """An engine on the model ``found`` names, loaded now (what :meth:`load` and :meth:`shared` share)."""
        engine = cls(found.load(), **options)
        engine.model_id = found.model_id
        return engine

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
        started, passes_before = time.perf_counter(), self.backend.thread_passes
        compiled = compile_schema(schema)
        call = self.resolve(options, **knobs)
        if (call.label_orders or 1) > 1:  # every order in one batch: extract_many's path
            return self.extract_many([check_text(text)], compiled, call, cancelled=cancelled)[0]
        request = Request.open(self, compiled, call, check_text(text), cancelled=cancelled,
                               lean=lambda: open_lean(self, compiled, call))  # fmt: skip
        for index in range(len(request.waves)):
            request.decide_wave(index)
        request.generate()
        return request.result(started=started, passes_before=passes_before)

    def extract_many(
        self,
        texts: Iterable[str],
        schema: Any,
        options: ExtractOptions | Mapping[str, Any] | None = None,
        *,
        batch_size: int | None = None,
        return_exceptions: bool = False,
        cancelled: Callable[[], bool] | None = None,
        **knobs: Any,
    ) -> list[Any]:
        """Fill in ``schema`` from many texts, deciding each wave for a batch of documents in one forward pass.

        Documents are taken in windows of four batches, sorted by length within a window (so that padding stays
        small), and decided together: one pass per wave for a whole batch where the backend batches documents
        (the packed PyTorch scorer), one pass per document otherwise (MLX, the rows fallback). The schema preamble
        is prefilled once and shared. Open fields are generated per document. Each result equals what
        :meth:`extract` gives for that text alone (decisions identical, log-probs within float rounding);
        ``stats.documents_per_pass`` says how many documents shared each of its passes.

        Args:
            texts: The documents.
            schema: As for :meth:`extract`.
            options: As for :meth:`extract`.
            batch_size: The most documents in one pass; ``None`` takes :attr:`EngineOptions.batch_size`, or the
                engine's choice (:meth:`batch_size`). The memory budget and very
                different lengths may split a batch further.
            return_exceptions: Put a failing document's exception in its place instead of raising it; the other
                documents are decided either way.
            cancelled: As for :meth:`extract`; checked before every pass.
            **knobs: As for :meth:`extract`.

        Returns:
            One result per text, in order (or the exception of a failed document, with ``return_exceptions``).

        Raises:
            ContextError: If ``texts`` is a single string, or a text is empty or not valid Unicode (all are checked
                before any model work, unless ``return_exceptions``).
            OptionError: If an option or ``batch_size`` is out of range.
            SchemaError: If the schema has a field pcd cannot decide.
            PCDError: The first failing document's error, unless ``return_exceptions``.
        """
        started = time.perf_counter()
        if isinstance(texts, (str, bytes)):  # iterating it would decide one document per character
            raise ContextError(
                f"extract_many texts: expected a list (or other iterable) of texts, but got a single "
                f"{type(texts).__name__} of length {len(texts)}; pass [text], or call extract(text, ...)."
            )
        compiled = compile_schema(schema)
        call = self.resolve(options, **knobs)
        size = self.batch_size(batch_size)
        texts = list(texts)
        if not return_exceptions:
            for i, text in enumerate(texts):
                check_text(text, where=f"texts[{i}]")

        orders, each = orders_of(compiled, call)
        documents = [Document(t, s, each, cancelled, f"texts[{i}]") for i, t in enumerate(texts) for s in orders]
        size *= len(orders)  # a document's orders are decided together
        out: list[Any] = []
        window = 4 * size
        if call.decider.estimates_on_batch:
            # Each window is one batch for the lean: as large as allowed, and cut evenly (65 documents are two
            # batches of 33 and 32, not 64 and 1).
            widest = max(window, CORRECTION_WINDOW)
            window = -(-len(documents) // max(1, -(-len(documents) // widest)))
        for first in range(0, len(documents), max(1, window)):
            done = run_batch(self, documents[first : first + window], max_documents=size,
                             started=started if first == 0 else None)  # fmt: skip
            if not return_exceptions:
                failure = next((r for r in done if isinstance(r, Exception)), None)
                if failure is not None:
                    raise failure
            out.extend(done)
        if len(orders) == 1:
            return out
        grouped = [out[i : i + len(orders)] for i in range(0, len(out), len(orders))]
        top_k = self.options.top_k
        return [next((r for r in g if isinstance(r, Exception)), None) or averaged(compiled, call, g, orders,
                top_k=top_k) for g in grouped]  # fmt: skip

    def read_closed(
        self,
        texts: Iterable[str],
        schema: Any,
        options: ExtractOptions | Mapping[str, Any] | None = None,
        *,
        batch_size: int | None = None,
        **knobs: Any,
    ) -> list[dict[str, FieldResult]]:
        """Decide only the closed fields of many texts, as :meth:`extract_many` decides them, without generating
        the open ones: each document's closed fields' results by name, in order. What a calibration or a
        content-free lean is read from.

        Args:
            texts: The documents.
            schema: As for :meth:`extract`.
            options: As for :meth:`extract`.
            batch_size: As for :meth:`extract_many`.
            **knobs: As for :meth:`extract`.

        Raises:
            ContextError: If a text is empty or not valid Unicode (all are checked before any model work).
            OptionError: If an option or ``batch_size`` is out of range.
            SchemaError: If the schema has a field pcd cannot decide.
            PCDError: The first failing document's error.
        """
        return self._read(texts, compile_schema(schema), self.resolve(options, **knobs), batch_size, frozenset())

    def read_features(
        self,
        texts: Iterable[str],
        schema: Any,
        options: ExtractOptions | Mapping[str, Any] | None = None,
        *,
        fields: Iterable[str] | None = None,
        batch_size: int | None = None,
    ) -> list[tuple[dict[str, FieldResult], dict[str, np.ndarray]]]:
        """:meth:`read_closed`, keeping the features a decision head reads (:mod:`pcd_engine.heads.head`) from
        the same passes: per document, its closed fields' results and, per closed field, the last layer's state
        where the field's decision is read followed by the middle layer's mean over the document (a multi-label
        field: one such row per label, where its flag is decided). What :meth:`~pcd_engine.heads.head.Head.fit`
        reads. ``texts``, ``schema``, ``options`` and ``batch_size`` as for :meth:`read_closed`; ``fields``: the
        fields to keep features of (``None``: every closed field with two labels or more).

        Raises:
            OptionError: If ``fields`` names a field that is not such a closed field of the schema.
            PCDError: As :meth:`read_closed`.
        """
        compiled = compile_schema(schema)
        headed = [s.name for s in compiled.fields if s.kind in HEADED_KINDS and len(s.labels) > 1]
        names = headed if fields is None else list(fields)
        for name in names:
            if name not in headed:
                raise OptionError(f"Features: expected a closed field of {headed}, but got {name!r}.")
        return self._read(texts, compiled, self.resolve(options), batch_size, frozenset(names))

    def _read(
        self, texts: Iterable[str], compiled: Schema, call: ExtractOptions, size: int | None, names: frozenset[str]
    ) -> list[Any]:
        """The closed fields of ``texts`` decided in batches (with the features of ``names`` when there are any)."""
        size = self.batch_size(size)
        texts = list(texts)
        for i, text in enumerate(texts):
            check_text(text, where=f"texts[{i}]")
        documents = [Document(t, compiled, call, None, f"texts[{i}]", features=names) for i, t in enumerate(texts)]
        read = read_features if names else read_batch
        out: list[Any] = []
        for first in range(0, len(documents), 4 * size):
            for done in read(self, documents[first : first + 4 * size], max_documents=size):
                if isinstance(done, Exception):
                    raise done
                out.append(done)
        return out

    def collector(self) -> Collector:
        """The engine's shared :class:`~pcd_engine.run.collector.Collector` (a 5 ms window, the engine's batch size),
        created on first use: extractions submitted to it from many threads or tasks at once are decided in
        shared batches. The async surfaces of the integrations submit through it."""
        with self._collector_lock:
            if self._collector is None:
                self._collector = Collector(self)
            return self._collector

    @property
    def known_pass_cost(self) -> PassCost | None:
        """The pass cost if it was given or measured already, else ``None`` (nothing is timed)."""
        return self._pass_cost

    def pass_cost(self, state: RequestState, *, token: int) -> PassCost:
        """What one forward pass costs on this backend, for the staging cost model (:mod:`pcd_engine.decide.staging`):
        :attr:`EngineOptions.pass_cost` when given, else measured once on ``state`` (a few timed passes of
        ``token`` nodes that add nothing to it) and kept."""
        if self._pass_cost is None:
            self._pass_cost = measure_pass_cost(self.backend, state, token=token)
        return self._pass_cost

    def batch_size(self, given: int | None = None) -> int:
        """The most documents one pass holds: ``given``, else :attr:`EngineOptions.batch_size`, else the backend's
        :attr:`~pcd_engine.backends.contract.Backend.default_batch_size` (PyTorch: 4 on CPU; MLX: 1 on CPU; 32 on a GPU
        or Metal; 1 where documents are not batched).

        Raises:
            OptionError: If ``given`` is not an integer >= 1.
        """
        chosen = check_batch_size(given) or self.options.batch_size
        return chosen or self.backend.default_batch_size

    def prompt_for(
        self, text: str, schema: Any, options: ExtractOptions | Mapping[str, Any] | None = None, **knobs: Any
    ) -> list[int]:
        """Token ids of the full prompt the model sees for ``text`` (preamble, document and tail up to ``{``), with
        this call's prompt format (``options`` and ``knobs`` as for :meth:`extract`)."""
        compiled = compile_schema(schema)
        prompt = ChatPrompt.build(self.tokenizer, compiled, self.resolve(options, **knobs).prompt_format)
        return prompt.request_ids(self.tokenizer, check_text(text), special_tokens=self.options.special_tokens)

    def resolve(self, options: ExtractOptions | Mapping[str, Any] | None = None, **knobs: Any) -> ExtractOptions:
        """The options a call runs with: ``knobs`` over ``options`` over the engine's defaults, field by field.

        Raises:
            OptionError: If an option is unknown or out of range.
        """
        given = ExtractOptions.parse(options)
        single = ExtractOptions.parse(knobs, where="extract")
        merged = single.over(given.over(self.options.defaults()))
        return merged.read_whole() if merged.reads_whole else merged

    # ------------------------------------------------------------------------------------ schema prompts

    def schema_prompt(
        self, schema: Any, options: ExtractOptions | Mapping[str, Any] | None = None, **knobs: Any
    ) -> tuple[SchemaPrompt, Prefix]:
        """The schema's preamble in this call's prompt format with its prefilled KV, prefilled and cached now if it
        was not (for tools that run their own passes on top of it, such as the benchmarks' floor).

        Args:
            schema: As for :meth:`extract`.
            options: As for :meth:`extract` (only the prompt format and memory budget matter).
            **knobs: As for :meth:`extract`.

        Returns:
            The schema prompt (chat prompt and tail tokens) and its preamble's prefix.
        """
        compiled = compile_schema(schema)
        call = self.resolve(options, **knobs)
        prompt, prefix = self.cache.prompt(compiled, call.prompt_format)
        if prefix is None:
            prefix = self.prefill_prompt(
                compiled, call.prompt_format, prompt, PassBudget.of(self.backend, call.memory_budget_mb)
            )
        return prompt, prefix

    def prefill_prompt(self, schema: Schema, fmt: PromptFormat, prompt: SchemaPrompt, budget: PassBudget) -> Prefix:
        """Prefill the preamble in causal chunks that fit ``budget``, then cache it (only once it has succeeded).

        Raises:
            LimitError: If not even one token of the instructions fits the budget.
        """
        prefix = prefill(self.backend, prompt, budget)
        self.cache.prompts.put(CompileCache.prompt_key(schema, fmt), (prompt, prefix))
        return prefix
