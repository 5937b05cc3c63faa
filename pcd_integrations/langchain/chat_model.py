"""The LangChain chat model on pcd's engine: :class:`ChatPCD` (see :mod:`pcd_integrations.langchain`)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Literal, cast

from langchain_core.callbacks import CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel, LanguageModelInput
from langchain_core.language_models.base import LangSmithParams
from langchain_core.language_models.chat_models import generate_from_stream
from langchain_core.language_models.model_profile import ModelProfile
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage
from langchain_core.messages.ai import UsageMetadata
from langchain_core.messages.tool import tool_call
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
from langchain_core.runnables import Runnable, RunnableConfig, RunnableLambda, RunnablePassthrough
from langchain_core.tools import BaseTool
from langchain_core.utils.function_calling import convert_to_openai_tool
from pydantic import ConfigDict, Field, ValidationError, model_validator

from pcd_engine import (
    DEFAULT_MODEL,
    ContextError,
    Engine,
    ExtractionResult,
    ExtractOptions,
    SchemaError,
    TokenUsage,
    Tool,
    decide_tools,
    stream_chat,
    surface_options,
)
from pcd_engine.adapters import check_count, check_text, choice_of
from pcd_integrations._shared import own_error, read_settings, refuse_sampling, reply_time_limit, shared_engine
from pcd_integrations.langchain.messages import (
    METHODS,
    SharedBatch,
    Target,
    Tools,
    conversation,
    last_chunk,
)

__all__ = ["ChatPCD"]


def _usage_metadata(prompt_tokens: int, completion_tokens: int) -> UsageMetadata:
    """:class:`~pcd_engine.result.TokenUsage` in LangChain's ``usage_metadata`` shape."""
    return cast("UsageMetadata", TokenUsage(prompt_tokens, completion_tokens).input_output())


class ChatPCD(BaseChatModel):
    """A local chat model whose structured output is decided by pcd, never written token by token.

    Build it from a model name (an alias, a local folder or a repo id; the embedded SmolLM2-135M-Instruct when
    none is given) or from a loaded :class:`~pcd_engine.Engine`.

    Example:
        >>> from typing import Literal
        >>> from pydantic import BaseModel
        >>> class Ticket(BaseModel):
        ...     urgency: Literal["low", "high"]
        ...     wants_refund: bool
        >>> llm = ChatPCD()
        >>> llm.with_structured_output(Ticket).invoke("Refund me now!")  # doctest: +SKIP
        Ticket(urgency='high', wants_refund=True)
    """

    model: str | None = None
    """Alias, folder or repo id; ``None`` for the embedded default model."""
    backend: str = "auto"
    """``"auto"``, ``"torch"`` or ``"mlx"``."""
    max_tokens: int = 256
    """Upper bound on tokens for free-text replies. Set explicitly, it also bounds each open field's value in
    structured output (unset, those follow the engine's default of 64 tokens per field)."""
    engine: Any = Field(default=None, exclude=True)
    """A loaded engine to use instead of loading ``model``."""
    temperature: float | None = None
    """``0`` or ``None``: greedy free text, the only kind pcd writes. Above 0, structured output reports its
    probabilities at this temperature (the decisions never change); free text refuses it, since pcd does not
    sample."""
    stop: list[str] | None = None
    """Stop sequences for free text; a call's own ``stop`` wins."""
    timeout: float | None = None
    """Seconds one call may take: a structured call stops at the next pass boundary, free text between two
    tokens, each with :class:`~pcd_engine.RequestTimeout`."""
    max_retries: int = 0
    """Accepted for compatibility with hosted chat models: a local call has nothing to retry."""
    streaming: bool = False
    """``invoke`` streams free text (callbacks see every token), as LangChain's ``streaming=True`` does."""
    calibration: dict[str, Any] | None = None
    """A calibration for every structured call: a :class:`~pcd_engine.calibrate.calibrator.Calibrator`, its JSON data or
    the path of the file ``pcd calibrate`` wrote (kept as its JSON, so the model serializes). Each closed field's
    label prior is corrected; a schema or model other than the one it was fitted on is refused."""
    head: dict[str, Any] | None = None
    """Decision heads for every structured call: a :class:`~pcd_engine.Head`, its JSON data or the path of the file
    ``pcd fit`` wrote (kept as its JSON). Each field it has a head for is decided by it, from the same passes; a
    schema or model other than the one it was fitted on is refused."""
    options: dict[str, Any] | None = None
    """Extraction options for every structured call (:class:`~pcd_engine.ExtractOptions` names: ``anchor``,
    ``temperature``, ``strategy``, ``instructions``, ...); ``with_structured_output(..., **options)`` overrides
    them per runnable. An unknown name is an :class:`~pcd_engine.OptionError`."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    @classmethod
    def is_lc_serializable(cls) -> bool:
        """A ChatPCD built from a model name round-trips through ``dumps`` / ``loads`` (a loaded ``engine`` is not
        serialized; the loaded copy loads its model by name)."""
        return True

    @classmethod
    def get_lc_namespace(cls) -> list[str]:
        """``["pcd_integrations", "langchain"]``: pass ``valid_namespaces=["pcd_integrations"]`` to ``loads``."""
        return ["pcd_integrations", "langchain"]

    @property
    def _llm_type(self) -> str:
        return "pcd"

    @property
    def _identifying_params(self) -> dict[str, Any]:
        return {"model": self.model_name, "backend": self.backend, "max_tokens": self.max_tokens}

    @property
    def model_name(self) -> str:
        """The model's name as given, or the default model's alias."""
        return self.model or DEFAULT_MODEL

    def _get_ls_params(self, stop: list[str] | None = None, **kwargs: Any) -> LangSmithParams:
        params = LangSmithParams(
            ls_provider="pcd",
            ls_model_name=kwargs.get("model", self.model_name),
            ls_model_type="chat",
            ls_temperature=self.temperature or 0.0,
        )
        params["ls_max_tokens"] = kwargs.get("max_tokens", self.max_tokens)
        if stop or self.stop:
            params["ls_stop"] = stop or self.stop
        return params

    def _resolve_model_profile(self) -> ModelProfile | None:
        # Structured output is native (the engine answers it); free-form tool choice is not.
        return ModelProfile(
            open_weights=True,
            text_inputs=True,
            text_outputs=True,
            structured_output=True,
            tool_calling=True,
            tool_choice=True,
            max_output_tokens=self.max_tokens,
        )

    @model_validator(mode="before")
    @classmethod
    def _settings(cls, data: Any) -> Any:
        """``model_name`` is another name for ``model`` (as in ChatOpenAI). An unknown argument close to a known
        one is a typo and refused; any other is dropped with a warning (LangChain's convention, as ChatOpenAI
        does; it moves them into ``model_kwargs`` for its server, and pcd has no server to send them to)."""
        if not isinstance(data, dict):
            return data
        data = read_settings("ChatPCD", data, cls.model_fields, others="warn")
        check_count(data.get("max_retries", 0), "ChatPCD: max_retries", minimum=0)
        return data

    def _setting_values(self) -> dict[str, Any]:
        """``temperature``, ``timeout``, ``calibration``, ``head`` and an explicitly set ``max_tokens``, as
        :func:`~pcd_engine.options.surface_options` takes them."""
        max_tokens = self.max_tokens if "max_tokens" in self.model_fields_set else None
        return {"temperature": self.temperature, "timeout": self.timeout, "max_tokens": max_tokens,
                "calibration": self.calibration, "head": self.head}  # fmt: skip

    def _setting_options(self) -> ExtractOptions:
        """The model's settings alone as extraction options (the ``options`` of the model and call win over them)."""
        return surface_options(**self._setting_values())

    def _call_options(self, *layers: tuple[str, ExtractOptions | Mapping[str, Any] | None]) -> ExtractOptions:
        """A structured call's options: ``layers`` (the call's own) over the model's ``options`` over its settings."""
        return surface_options(*layers, ("ChatPCD options", self.options), **self._setting_values())

    def __init__(self, **kwargs: Any) -> None:
        try:
            super().__init__(**kwargs)
        except ValidationError as exc:  # a setting pcd refused: its own typed error, not pydantic's wrapper
            raise own_error(exc) from None
        self._call_options()  # a bad option or setting fails here, as an OptionError

    def get_token_ids(self, text: str) -> list[int]:
        """The model's own token ids for ``text`` (no network: the tokenizer is the loaded model's)."""
        if self.custom_get_token_ids is not None:
            return self.custom_get_token_ids(text)
        return self.get_engine().tokenizer.encode(text)

    def get_engine(self) -> Engine:
        """The engine, loaded on first use (shared between chat models of the same model and backend)."""
        if self.engine is None:
            self.engine = shared_engine(self.model, self.backend)
        return self.engine

    def _override(self, kwargs: dict[str, Any]) -> ChatPCD | None:
        """A call's own ``model=`` (LangChain's per-call override): this chat model on that model, loaded by name
        like the constructor's (shared per process); ``None`` when the call names no other model. A structured
        batch under an override decides its inputs one by one."""
        name = kwargs.pop("model", None)
        if name is None or name == self.model_name:
            return None
        kwargs.pop("pcd_batch", None)
        return self.model_copy(update={"model": str(name), "engine": None})

    # ------------------------------------------------------------------------------------------ free text

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        """The reply, gathered from :meth:`_stream` (as LangChain's own chat models do), except in a structured
        :meth:`batch`, whose answers were decided together in one engine call."""
        shared: SharedBatch | None = kwargs.pop("pcd_batch", None)
        if shared is not None and "pcd_tools" not in kwargs and self._override(dict(kwargs)) is None:
            answer = shared.answer(messages)
            if isinstance(answer, Exception):
                raise answer
            return answer
        return generate_from_stream(self._stream(messages, stop=stop, run_manager=run_manager, **kwargs))

    def _stream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> Iterator[ChatGenerationChunk]:
        """The reply as chunks: free text token by token; tool calls and structured answers, decided whole, as one
        last chunk."""
        other = self._override(kwargs)
        if other is not None:
            yield from other._stream(messages, stop=stop, run_manager=run_manager, **kwargs)
            return
        tools: Tools | None = kwargs.pop("pcd_tools", None)
        if tools is not None:
            decided = self._tool_reply(messages, tools)
            if decided is not None:
                yield last_chunk(decided)
                return
            if tools.response is not None:
                kwargs["pcd_schema"] = tools.response
        target = kwargs.pop("pcd_schema", None)
        if target is not None:
            answer = self._structured([messages], target)[0]
            if isinstance(answer, Exception):
                raise answer
            yield last_chunk(answer)
            return
        refuse_sampling("ChatPCD", kwargs.get("temperature", self.temperature))  # a call's own is refused too
        turns = conversation(messages).chat()
        limit = int(kwargs.get("max_tokens", self.max_tokens))
        engine = self.get_engine()
        seconds = reply_time_limit(engine, kwargs.get("timeout", self.timeout))
        chunks = stream_chat(engine, turns, max_new_tokens=limit, stop=stop or self.stop or (), time_limit_s=seconds)
        for piece in chunks:
            if piece.finish_reason is None:
                chunk = ChatGenerationChunk(message=AIMessageChunk(content=piece.text))
                if run_manager:
                    run_manager.on_llm_new_token(piece.text, chunk=chunk)
                yield chunk
            else:
                usage = _usage_metadata(piece.prompt_tokens, piece.completion_tokens)
                meta = {"finish_reason": piece.finish_reason, "model_name": self.model_name, "model_provider": "pcd"}
                yield ChatGenerationChunk(
                    message=AIMessageChunk(
                        content="", usage_metadata=usage, response_metadata=meta, chunk_position="last"
                    )
                )

    # ------------------------------------------------------------------------------------------ structured

    def _tool_reply(self, messages: Sequence[BaseMessage], tools: Tools) -> ChatResult | None:
        """The model's tool calls, decided by the engine; ``None`` when it decides to answer instead."""
        options = self._call_options()
        talk = conversation(messages)
        decision = decide_tools(
            self.get_engine(), talk.document, tools.tools, choice=tools.choice, parallel=tools.parallel,
            options=options, done=talk.answered_calls(),
        )  # fmt: skip
        if decision.answer:
            return None
        calls = [tool_call(name=c.name, args=c.arguments, id=c.id) for c in decision.calls]
        evidence = decision.evidence()
        message = AIMessage(
            content="",
            tool_calls=calls,
            response_metadata={"model_name": self.model_name, "model_provider": "pcd", "pcd": evidence},
        )
        return ChatResult(generations=[ChatGeneration(message=message)])

    def _structured(
        self, conversations: Sequence[Sequence[BaseMessage]], target: Target
    ) -> list[ChatResult | Exception]:
        """Decide ``target`` for every conversation with ONE engine call (:meth:`Engine.extract_many`: one pass per
        wave for a whole batch); a conversation the engine cannot read (no text, too long) gets its own error and
        never fails the others."""
        engine = self.get_engine()
        documents = [conversation(c).document for c in conversations]
        options = self._call_options(("with_structured_output", target.options))
        errors: dict[int, Exception] = {}
        for i, document in enumerate(documents):
            try:
                check_text(document, where=f"input {i}")
            except ContextError as exc:
                errors[i] = exc
        readable = [i for i in range(len(documents)) if i not in errors]
        try:
            results = engine.extract_many(
                [documents[i] for i in readable], target.engine_schema, options=options, return_exceptions=True
            )
        except SchemaError as exc:
            failed = AIMessage(content="", response_metadata={"pcd_error": str(exc), "model_name": self.model_name})
            return [ChatResult(generations=[ChatGeneration(message=failed)]) for _ in documents]
        decided = iter([r if isinstance(r, Exception) else self._message(r, target) for r in results])
        return [errors[i] if i in errors else next(decided) for i in range(len(documents))]

    def _message(self, result: ExtractionResult, target: Target) -> ChatResult:
        """One decided conversation as a chat result: the values as the JSON content."""
        values = {k: getattr(v, "value", v) for k, v in result.values.items()}
        message = AIMessage(
            content=json.dumps(values, ensure_ascii=False),
            response_metadata={"model_name": self.model_name, "model_provider": "pcd", "pcd": result.evidence()},
            usage_metadata=_usage_metadata(result.stats.prompt_tokens, result.stats.generated_tokens),
        )
        return ChatResult(generations=[ChatGeneration(message=message)])

    def batch(
        self,
        inputs: list[LanguageModelInput],
        config: RunnableConfig | list[RunnableConfig] | None = None,
        *,
        return_exceptions: bool = False,
        **kwargs: Any,
    ) -> list[AIMessage]:
        """A structured batch is decided in ONE engine call, with the Runnable semantics of any batch: each input
        runs with its own config (callbacks, tags, metadata), the engine call happens inside the runs (so traced
        durations are real), and an input the engine cannot read fails alone (``return_exceptions`` returns its
        error in its place). Free-text batches run one input at a time like any chat model."""
        target = kwargs.get("pcd_schema")
        if target is None or not inputs:
            return super().batch(inputs, config, return_exceptions=return_exceptions, **kwargs)
        conversations = [self._convert_input(i).to_messages() for i in inputs]
        shared = SharedBatch(self._structured, conversations, target)
        return super().batch(inputs, config, return_exceptions=return_exceptions, pcd_batch=shared, **kwargs)

    async def abatch(
        self,
        inputs: list[LanguageModelInput],
        config: RunnableConfig | list[RunnableConfig] | None = None,
        *,
        return_exceptions: bool = False,
        **kwargs: Any,
    ) -> list[AIMessage]:
        """As :meth:`batch`, in a worker thread so the event loop stays free."""
        from langchain_core.runnables.config import run_in_executor

        return await run_in_executor(
            None, lambda: self.batch(inputs, config, return_exceptions=return_exceptions, **kwargs)
        )

    def bind_tools(
        self,
        tools: Sequence[dict[str, Any] | type | Callable[..., Any] | BaseTool],
        *,
        tool_choice: str | dict[str, Any] | bool | None = None,
        response_format: dict[str, Any] | type | None = None,
        strict: bool | None = None,
        parallel_tool_calls: bool | None = None,
        **kwargs: Any,
    ) -> Runnable[LanguageModelInput, AIMessage]:
        """Bind tools: which one to call is a decision the engine scores, then its arguments are filled.

        Args:
            tools: LangChain tools, functions, Pydantic models or OpenAI tool dicts.
            tool_choice: ``None`` / ``"auto"`` (a tool, or answer), ``"any"`` / ``"required"`` / ``True`` (some
                tool), ``"none"`` / ``False`` (answer), or one tool's name (or ``{"function": {"name": ...}}``).
            response_format: The answer's schema when the model answers (an OpenAI ``json_schema`` dict or a
                schema); without it the answer is free text.
            strict: Accepted for compatibility: arguments always validate against their schema.
            parallel_tool_calls: Let the model call several tools at once (each tool called or not).
            **kwargs: Bound to the model as usual.

        Returns:
            The model with the tools bound. Its reply carries ``tool_calls`` (with ids) and the choice's
            probabilities in ``response_metadata["pcd"]``, or the answer.

        Raises:
            OptionError: If ``tool_choice`` names no given tool (a ``ValueError``).
        """
        specs = [convert_to_openai_tool(t, strict=strict)["function"] for t in tools]
        bound: dict[str, Any] = dict(kwargs)
        response = None
        if response_format is not None:
            schema = response_format
            if isinstance(schema, dict) and schema.get("type") == "json_schema":
                schema = dict(schema["json_schema"]["schema"], title=schema["json_schema"].get("name", "Response"))
            response = Target(schema)
            bound["pcd_schema"] = response
        if not specs:
            return self.bind(**bound)
        choice = choice_of(tool_choice, [spec["name"] for spec in specs])
        given = [Tool(s["name"], s.get("description"), s.get("parameters") or {}) for s in specs]
        bound.pop("pcd_schema", None)
        bound["pcd_tools"] = Tools(given, choice, bool(parallel_tool_calls), response)
        return self.bind(**bound)

    def with_structured_output(  # type: ignore[override]
        self,
        schema: dict[str, Any] | type,
        *,
        include_raw: bool = False,
        method: Literal["json_schema", "function_calling", "json_mode"] = "json_schema",
        strict: bool | None = None,
        **kwargs: Any,
    ) -> Runnable[LanguageModelInput, Any]:
        """A runnable that fills ``schema`` from its input with pcd's engine.

        Args:
            schema: A Pydantic (v2 or v1) model class, a TypedDict, a JSON Schema dict or an OpenAI function/tool
                dict. Field types are checked when the runnable runs, not here.
            include_raw: Return ``{"raw", "parsed", "parsing_error"}`` instead of the parsed object.
            method: Accepted for compatibility; every method is answered by the engine.
            strict: Accepted for compatibility; the output always matches the schema.
            **kwargs: Extraction options (:class:`~pcd_engine.ExtractOptions` names) for this runnable; they win
                over the chat model's ``options``.

        Returns:
            A runnable giving a model instance for Pydantic schemas and a dict otherwise.

        Raises:
            OptionError: On an unknown or bad option (a ``ValueError``).
            ValueError: On an unknown method, or a schema of no supported kind.
        """
        options = surface_options(("with_structured_output", kwargs))
        if method not in METHODS:
            raise ValueError(f"with_structured_output: expected method in {list(METHODS)}, but got {method!r}.")
        target = Target(schema, options=options)
        llm = self.bind(
            pcd_schema=target,
            ls_structured_output_format={"kwargs": {"method": method, "strict": strict}, "schema": schema},
        )
        parser = RunnableLambda(target.parse, name="PCDOutputParser")
        if not include_raw:
            return llm | parser
        parsed = RunnablePassthrough.assign(parsed=lambda x: target.parse(x["raw"]), parsing_error=lambda _: None)
        fallback = RunnablePassthrough.assign(parsed=lambda _: None)
        # ``llm | wrap`` rather than ``RunnableMap(raw=llm)``: a sequence batches step by step, so a batch still
        # reaches the chat model as one batch (one engine call); a map would invoke it once per input.
        raw: Runnable[Any, dict[str, Any]] = RunnableLambda(lambda message: {"raw": message}, name="PCDRaw")
        return llm | raw | parsed.with_fallbacks([fallback], exception_key="parsing_error")
