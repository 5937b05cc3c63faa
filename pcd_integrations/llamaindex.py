"""LlamaIndex adapter: a Pydantic program, an LLM whose structured predictions use it, and a batched extractor.

* :class:`PCDPydanticProgram` fills a Pydantic model of closed fields from a formatted prompt with pcd's engine.
* :class:`PCDLLM` is a ``CustomLLM``: free-text ``complete`` / ``stream_complete`` on the same local model, and
  every ``structured_predict`` variant routed to the program (so ``as_structured_llm(Model)`` works too).
* :class:`PCDMetadataExtractor` tags a batch of nodes (RAG ingestion) with one engine call per ``batch_size``
  nodes; values are JSON-safe, and per-field probabilities can be stored under a key prefix.

Install with ``pip install "pcd-llm[llamaindex]"``.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Generator, Iterator, Mapping, Sequence
from typing import Any

from pcd_engine.errors import pip_install, require

require("llama_index.core", what="pcd_integrations.llamaindex", install=pip_install("llamaindex"))

from llama_index.core.base.llms.types import ChatMessage as LIChatMessage
from llama_index.core.base.llms.types import (
    ChatResponse,
    ChatResponseGen,
    CompletionResponse,
    CompletionResponseGen,
    LLMMetadata,
    MessageRole,
    ToolCallBlock,
)
from llama_index.core.bridge.pydantic import Field, PrivateAttr
from llama_index.core.extractors import BaseExtractor
from llama_index.core.llms.callbacks import llm_chat_callback, llm_completion_callback
from llama_index.core.llms.custom import CustomLLM
from llama_index.core.llms.function_calling import FunctionCallingLLM
from llama_index.core.llms.llm import ToolSelection
from llama_index.core.prompts import BasePromptTemplate, PromptTemplate
from llama_index.core.schema import BaseNode, MetadataMode
from llama_index.core.tools.types import BaseTool
from llama_index.core.types import BasePydanticProgram
from pydantic import BaseModel

from pcd_engine import (
    ChatMessage,
    Engine,
    ExtractionResult,
    ExtractOptions,
    OptionError,
    stream_chat,
)
from pcd_engine.generate.free_text import document_text
from pcd_engine.models.resolve import DEFAULT_MODEL
from pcd_engine.options import surface_options
from pcd_engine.tool_calls import Tool, called_text, choice_of, decide_tools, tool_result_text
from pcd_integrations._shared import (
    calibration_json,
    read_settings,
    refuse_sampling,
    shared_engine,
)

__all__ = ["PCDLLM", "PCDMetadataExtractor", "PCDPydanticProgram"]

# LlamaIndex roles as pcd chat turns: tool results and function outputs are read as user turns.
_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant", "chatbot": "assistant"}


class _ToolRequest:
    """The tools of one ``chat_with_tools`` turn, and how the model may choose among them."""

    def __init__(self, tools: list[Tool], choice: str, parallel: bool) -> None:
        self.tools, self.choice, self.parallel = tools, choice, parallel


def _turn_texts(messages: Sequence[LIChatMessage]) -> list[tuple[LIChatMessage, str]]:
    """Each message with its text as the model reads it: tool calls and tool results are labelled (a result by
    the name of the call it answers), so the model sees what was called and what came back."""
    names: dict[str, str] = {}
    out = []
    for m in messages:
        calls = [b for b in m.blocks if isinstance(b, ToolCallBlock)]
        names.update({c.tool_call_id: c.tool_name for c in calls if c.tool_call_id})
        text = m.content or ""
        if str(m.role.value) in ("tool", "function"):
            call_id = str(m.additional_kwargs.get("tool_call_id", ""))
            name = names.get(call_id) or str(m.additional_kwargs.get("name") or call_id or "tool")
            text = tool_result_text(name, text)
        made = called_text([(c.tool_name, c.tool_kwargs if isinstance(c.tool_kwargs, dict) else {}) for c in calls])
        out.append((m, "\n".join(t for t in (text, made) if t)))
    return out


PROBABILITY_PREFIX = "pcd_probability_"
"""Metadata key prefix of per-field probabilities stored by :class:`PCDMetadataExtractor`."""


def _prompt_text(prompt: BasePromptTemplate, **prompt_args: Any) -> str:
    """The text pcd classifies: a chat prompt's messages joined in order, or the formatted prompt."""
    if hasattr(prompt, "format_messages"):
        try:
            messages = prompt.format_messages(**prompt_args)
            return "\n\n".join(str(m.content or "") for m in messages if m.content)
        except (NotImplementedError, AttributeError):
            pass
    return prompt.format(**prompt_args)


class PCDPydanticProgram(BasePydanticProgram[BaseModel]):
    """Fill ``output_cls`` (bool / Literal / Enum fields) from a prompt with pcd's engine: every key present,
    every value allowed, one tree-packed pass per wave.

    Args:
        output_cls: The Pydantic model to fill.
        prompt: The prompt template whose formatted text is the document to classify.
        engine: A loaded engine.
        options: Extraction options for every call (:class:`~pcd_engine.ExtractOptions`, or a mapping of its
            names); ``llm_kwargs`` of a call override them.
        verbose: Print each call's values with their probabilities.

    Raises:
        OptionError: If an option is unknown or out of range.
    """

    def __init__(
        self,
        output_cls: type[BaseModel],
        prompt: BasePromptTemplate,
        engine: Engine,
        *,
        options: ExtractOptions | Mapping[str, Any] | None = None,
        verbose: bool = False,
    ) -> None:
        self._output_cls = output_cls
        self._prompt = prompt
        self._engine = engine
        self.options = surface_options(("PCDPydanticProgram options", options))
        self.verbose = verbose
        self.last_result: ExtractionResult | None = None

    @classmethod
    def from_defaults(
        cls,
        output_cls: type[BaseModel],
        prompt_template_str: str | None = None,
        prompt: BasePromptTemplate | None = None,
        llm: PCDLLM | None = None,
        engine: Engine | None = None,
        options: ExtractOptions | Mapping[str, Any] | None = None,
        verbose: bool = False,
        **kwargs: Any,
    ) -> PCDPydanticProgram:
        """Build a program from exactly one prompt form, and an engine (or a :class:`PCDLLM`, or the default).

        Extraction options come from ``options`` and, by name, from ``kwargs``; a :class:`PCDLLM`'s own options
        are the base they override. ``verbose`` prints each call's values with their probabilities, as LlamaIndex's
        own programs print what they produced.

        The engine is, in order: ``engine``, the engine of ``llm``, the engine of ``Settings.llm`` when one is set
        (LlamaIndex's own default), or the embedded model's.

        Raises:
            OptionError: If an option is unknown or out of range, or ``llm`` (or ``Settings.llm``) is not a
                :class:`PCDLLM` (a ``ValueError``).
            ValueError: If both or neither of ``prompt_template_str`` and ``prompt`` are given, or both ``llm`` and
                ``engine`` are given.
        """
        given = surface_options(
            ("PCDPydanticProgram.from_defaults", kwargs), ("PCDPydanticProgram.from_defaults options", options)
        )
        if (prompt_template_str is None) == (prompt is None):
            raise ValueError(
                "PCDPydanticProgram.from_defaults: expected exactly one of prompt_template_str or prompt, but got "
                f"{'both' if prompt is not None else 'neither'}."
            )
        if llm is not None and engine is not None:
            raise ValueError("PCDPydanticProgram.from_defaults: expected llm or engine, but got both.")
        source = None if engine is not None else _pcd_llm("PCDPydanticProgram.from_defaults", llm)
        chosen = engine or (source.get_engine() if source is not None else shared_engine(None, "auto"))
        if source is not None:
            given = given.over(source.extract_options)
        template = prompt or PromptTemplate(str(prompt_template_str))
        return cls(output_cls, template, chosen, options=given, verbose=verbose)

    @property
    def output_cls(self) -> type[BaseModel]:
        return self._output_cls

    @property
    def prompt(self) -> BasePromptTemplate:
        return self._prompt

    @prompt.setter
    def prompt(self, prompt: BasePromptTemplate) -> None:
        self._prompt = prompt

    def __call__(self, *args: Any, llm_kwargs: dict[str, Any] | None = None, **kwargs: Any) -> BaseModel:
        """Format the prompt with ``kwargs`` and fill the model from that text (``llm_kwargs``: extraction
        options for this call, over the program's)."""
        options = surface_options(("llm_kwargs", llm_kwargs), ("PCDPydanticProgram options", self.options))
        return self._finish(self._engine.extract(_prompt_text(self._prompt, **kwargs), self._output_cls, options))

    async def acall(self, *args: Any, llm_kwargs: dict[str, Any] | None = None, **kwargs: Any) -> BaseModel:
        """As a call, through the engine's shared collector: concurrent calls (``asyncio.gather``) are decided in
        shared batches, one pass per wave for all of them."""
        import asyncio

        options = surface_options(("llm_kwargs", llm_kwargs), ("PCDPydanticProgram options", self.options))
        text = _prompt_text(self._prompt, **kwargs)
        future = self._engine.collector().submit(text, self._output_cls, options)
        return self._finish(await asyncio.wrap_future(future))

    def batch(
        self,
        inputs: Sequence[Mapping[str, Any]],
        *,
        llm_kwargs: dict[str, Any] | None = None,
        return_exceptions: bool = False,
    ) -> list[Any]:
        """Fill the model for many prompt inputs with ONE engine call (:meth:`Engine.extract_many`: one pass per
        wave for a batch of documents).

        Args:
            inputs: One mapping of prompt variables per call.
            llm_kwargs: Extraction options for every call, over the program's.
            return_exceptions: Put a failing input's exception in its place instead of raising it.

        Returns:
            One model per input, in order (or the exception of a failed input, with ``return_exceptions``).
        """
        options = surface_options(("llm_kwargs", llm_kwargs), ("PCDPydanticProgram options", self.options))
        texts = [_prompt_text(self._prompt, **dict(i)) for i in inputs]
        results = self._engine.extract_many(
            texts, self._output_cls, options=options, return_exceptions=return_exceptions
        )
        return [r if isinstance(r, Exception) else self._finish(r) for r in results]

    async def abatch(
        self,
        inputs: Sequence[Mapping[str, Any]],
        *,
        llm_kwargs: dict[str, Any] | None = None,
        return_exceptions: bool = False,
    ) -> list[Any]:
        """:meth:`batch` in a worker thread, so the event loop stays free."""
        import asyncio

        return await asyncio.to_thread(self.batch, inputs, llm_kwargs=llm_kwargs, return_exceptions=return_exceptions)

    def _finish(self, result: ExtractionResult) -> BaseModel:
        self.last_result = result
        if self.verbose:
            shown = ", ".join(
                f"{n}={f.value!r}" + (f" ({f.probability:.2f})" if f.probability is not None else "")
                for n, f in result.fields.items()
            )
            print(f"> {self._output_cls.__name__}: {shown}")  # noqa: T201 - what verbose asks for
        model: BaseModel = result.model
        return model

    def stream_call(
        self, *args: Any, llm_kwargs: dict[str, Any] | None = None, **kwargs: Any
    ) -> Generator[BaseModel, None, None]:
        """Yields the final object (decisions are made in one pass, so there are no partial objects)."""
        yield self(*args, llm_kwargs=llm_kwargs, **kwargs)

    async def astream_call(  # type: ignore[override]
        self, *args: Any, llm_kwargs: dict[str, Any] | None = None, **kwargs: Any
    ) -> AsyncGenerator[BaseModel, None]:
        async def gen() -> AsyncGenerator[BaseModel, None]:
            yield await self.acall(*args, llm_kwargs=llm_kwargs, **kwargs)

        return gen()


class PCDLLM(CustomLLM, FunctionCallingLLM):
    """A local LLM on pcd's engine: free text by greedy decoding, structured predictions and tool calls decided by
    the engine.

    It is a function-calling model: ``chat_with_tools``, ``predict_and_call`` and ``FunctionAgent`` get tool calls
    from one scored decision over the tool names (plus answering directly when the choice is ``"auto"``), then the
    chosen tool's arguments filled as its schema, so every call names a real tool with valid arguments. The
    choice's probabilities are in the reply's ``additional_kwargs["pcd"]``.

    Every argument is honoured or refused: a misspelt or unknown one is an :class:`~pcd_engine.OptionError`
    (LlamaIndex LLMs otherwise drop unknown arguments silently); ``model_name`` is another name for ``model``.
    """

    model: str | None = Field(default=None, description="Alias, folder or repo id; None for the embedded model.")
    backend: str = Field(default="auto", description="'auto', 'torch' or 'mlx'.")
    max_tokens: int = Field(
        default=256,
        gt=0,
        description="Upper bound on tokens for free-text replies; set explicitly, it also bounds each open field of "
        "structured predictions (unset, those follow the engine's default of 64).",
    )
    temperature: float | None = Field(
        default=None,
        description="0 or None: greedy free text, the only kind pcd writes. Above 0, structured predictions and "
        "tool choices report their probabilities at this temperature (decisions never change); free text refuses it.",
    )
    stop: list[str] | None = Field(default=None, description="Stop sequences for free text; a call's own stop wins.")
    timeout: float | None = Field(
        default=None, description="Seconds one call may take (pcd_engine.RequestTimeout when exceeded)."
    )
    options: dict[str, Any] | None = Field(
        default=None, description="Extraction options (ExtractOptions names) for structured predictions and tools."
    )
    calibration: dict[str, Any] | None = Field(
        default=None,
        description="A calibration (a Calibrator, its JSON or the path of a pcd calibrate file; kept as JSON) for "
        "structured predictions: each closed field's label prior is corrected.",
    )
    _engine: Engine | None = PrivateAttr(default=None)

    def __init__(self, *, engine: Engine | None = None, **kwargs: Any) -> None:
        super().__init__(**read_settings("PCDLLM", kwargs, type(self).model_fields, others="refuse"))
        self._engine = engine
        _ = self.extract_options  # a bad option fails here, as an OptionError

    @property
    def extract_options(self) -> ExtractOptions:
        """``options`` over ``temperature``, ``timeout``, ``calibration`` and an explicitly set ``max_tokens``, as
        an :class:`~pcd_engine.ExtractOptions`."""
        max_tokens = self.max_tokens if "max_tokens" in self.model_fields_set else None
        return surface_options(
            ("PCDLLM options", self.options), temperature=self.temperature, timeout=self.timeout,
            max_tokens=max_tokens, calibration=self.calibration,
        )  # fmt: skip

    @classmethod
    def class_name(cls) -> str:
        return "PCDLLM"

    def get_engine(self) -> Engine:
        """The engine, loaded on first use."""
        if self._engine is None:
            self._engine = shared_engine(self.model, self.backend)
        return self._engine

    @property
    def metadata(self) -> LLMMetadata:
        engine = self._engine
        window = engine.backend.max_context if engine is not None else 8192
        return LLMMetadata(
            context_window=window,
            num_output=self.max_tokens,
            is_chat_model=True,
            is_function_calling_model=True,
            model_name=self.model or DEFAULT_MODEL,
        )

    # ------------------------------------------------------------------------------------------ free text

    def _free_text(self, turns: Sequence[ChatMessage], **kwargs: Any) -> Iterator[tuple[str, str]]:
        """``(text so far, delta)`` of the greedy reply to ``turns``, written with the model's own chat template;
        ``max_tokens`` and ``stop`` of the call win over the model's."""
        refuse_sampling("PCDLLM", self.temperature)
        limit = int(kwargs.get("max_tokens") or self.max_tokens)
        stop = kwargs.get("stop") or self.stop or ()
        text = ""
        for piece in stream_chat(self.get_engine(), turns, max_new_tokens=limit, stop=stop, time_limit_s=self.timeout):
            if piece.text:
                text += piece.text
                yield text, piece.text

    def _reply(self, messages: Sequence[LIChatMessage], **kwargs: Any) -> ChatResponse | Iterator[ChatResponse]:
        """The tool calls decided for ``messages`` (one response) when tools are bound and the model calls one;
        otherwise the free-text reply, one response per token."""
        tools: _ToolRequest | None = kwargs.pop("pcd_tools", None)
        if tools is not None:
            decided = self._tool_reply(messages, tools)
            if decided is not None:
                return decided
        turns = [ChatMessage(_ROLES.get(str(m.role.value), "user"), text) for m, text in _turn_texts(messages)]

        def gen() -> Iterator[ChatResponse]:
            for text, delta in self._free_text(turns, **kwargs):
                yield ChatResponse(message=LIChatMessage(role=MessageRole.ASSISTANT, content=text), delta=delta)

        return gen()

    @llm_chat_callback()
    def chat(self, messages: Sequence[LIChatMessage], **kwargs: Any) -> ChatResponse:
        """Reply to ``messages``: roles reach the model through its chat template (system, user, assistant); with
        tools bound (``chat_with_tools``) the reply may be tool calls instead."""
        reply = self._reply(messages, **kwargs)
        if isinstance(reply, ChatResponse):
            return reply
        text = ""
        for response in reply:
            text = response.message.content or ""
        return ChatResponse(message=LIChatMessage(role=MessageRole.ASSISTANT, content=text))

    @llm_chat_callback()
    def stream_chat(self, messages: Sequence[LIChatMessage], **kwargs: Any) -> ChatResponseGen:
        """:meth:`chat`, one token at a time (tool calls come whole, in one response)."""
        reply = self._reply(messages, **kwargs)
        if not isinstance(reply, ChatResponse):
            return reply

        def whole() -> ChatResponseGen:
            yield reply

        return whole()

    @llm_completion_callback()
    def complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        text = ""
        for so_far, _delta in self._free_text([ChatMessage("user", prompt)], **kwargs):
            text = so_far
        return CompletionResponse(text=text)

    @llm_completion_callback()
    def stream_complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponseGen:
        pieces = self._free_text([ChatMessage("user", prompt)], **kwargs)
        return (CompletionResponse(text=text, delta=delta) for text, delta in pieces)

    # ------------------------------------------------------------------------------------------ tools

    def _prepare_chat_with_tools(
        self,
        tools: Sequence[BaseTool],
        user_msg: str | LIChatMessage | None = None,
        chat_history: list[LIChatMessage] | None = None,
        verbose: bool = False,
        allow_parallel_tool_calls: bool = False,
        tool_required: bool = False,
        tool_choice: str | dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> dict[str, Any]:
        """The ``chat`` arguments of a tool-calling turn: the conversation, and the tools with the choice
        (``tool_choice`` as in OpenAI: ``"auto"``, ``"required"``, ``"none"`` or a tool's name; ``tool_required``
        means ``"required"``)."""
        messages = list(chat_history or [])
        if isinstance(user_msg, str):
            messages.append(LIChatMessage(role=MessageRole.USER, content=user_msg))
        elif user_msg is not None:
            messages.append(user_msg)
        given = [Tool(str(t.metadata.name), t.metadata.description, t.metadata.get_parameters_dict()) for t in tools]
        choice = choice_of(
            "required" if tool_required and tool_choice is None else tool_choice, [t.name for t in given]
        )
        return {"messages": messages, "pcd_tools": _ToolRequest(given, choice, allow_parallel_tool_calls), **kwargs}

    def _tool_reply(self, messages: Sequence[LIChatMessage], tools: _ToolRequest) -> ChatResponse | None:
        """The model's tool calls, decided by the engine; ``None`` when it decides to answer instead."""
        document = document_text([text for _m, text in _turn_texts(messages)])
        decision = decide_tools(
            self.get_engine(), document, tools.tools, choice=tools.choice, parallel=tools.parallel,
            options=self.extract_options,
        )  # fmt: skip
        if decision.answer:
            return None
        blocks = [ToolCallBlock(tool_call_id=c.id, tool_name=c.name, tool_kwargs=c.arguments) for c in decision.calls]
        evidence = decision.evidence()
        message = LIChatMessage(role=MessageRole.ASSISTANT, blocks=blocks)
        return ChatResponse(message=message, raw={"pcd": evidence}, additional_kwargs={"pcd": evidence})

    def get_tool_calls_from_response(
        self, response: ChatResponse, error_on_no_tool_call: bool = True, **kwargs: Any
    ) -> list[ToolSelection]:
        """The tool calls of a :meth:`chat_with_tools` reply.

        Raises:
            ValueError: If there are none and ``error_on_no_tool_call`` is set.
        """
        calls = [
            ToolSelection(tool_id=b.tool_call_id or "", tool_name=b.tool_name, tool_kwargs=b.tool_kwargs)
            for b in response.message.blocks
            if isinstance(b, ToolCallBlock)
        ]
        if not calls and error_on_no_tool_call:
            raise ValueError(f"PCDLLM: expected a tool call, but the model answered: {response.message.content!r}.")
        return calls

    # ------------------------------------------------------------------------------------------ structured

    def _program(self, output_cls: type[BaseModel], prompt: BasePromptTemplate) -> PCDPydanticProgram:
        return PCDPydanticProgram(output_cls, prompt, self.get_engine(), options=self.extract_options)

    def structured_predict(  # type: ignore[override]
        self, output_cls: type[BaseModel], prompt: PromptTemplate, llm_kwargs: dict[str, Any] | None = None, **args: Any
    ) -> BaseModel:
        return self._program(output_cls, prompt)(llm_kwargs=llm_kwargs, **args)

    async def astructured_predict(  # type: ignore[override]
        self, output_cls: type[BaseModel], prompt: PromptTemplate, llm_kwargs: dict[str, Any] | None = None, **args: Any
    ) -> BaseModel:
        return await self._program(output_cls, prompt).acall(llm_kwargs=llm_kwargs, **args)

    def stream_structured_predict(  # type: ignore[override]
        self, output_cls: type[BaseModel], prompt: PromptTemplate, llm_kwargs: dict[str, Any] | None = None, **args: Any
    ) -> Generator[BaseModel, None, None]:
        return self._program(output_cls, prompt).stream_call(llm_kwargs=llm_kwargs, **args)

    async def astream_structured_predict(  # type: ignore[override]
        self, output_cls: type[BaseModel], prompt: PromptTemplate, llm_kwargs: dict[str, Any] | None = None, **args: Any
    ) -> AsyncGenerator[BaseModel, None]:
        return await self._program(output_cls, prompt).astream_call(llm_kwargs=llm_kwargs, **args)


def _pcd_llm(owner: str, llm: Any) -> PCDLLM | None:
    """The :class:`PCDLLM` whose engine to use: ``llm``, else ``Settings.llm`` when one is set (a ``MockLLM``,
    what ``Settings.llm = None`` sets, counts as none).

    Raises:
        OptionError: If that LLM is not a :class:`PCDLLM`: pcd decides with its own engine, so another LLM cannot
            be honoured, and is not silently replaced.
    """
    where = "llm"
    if llm is None:
        from llama_index.core import Settings
        from llama_index.core.llms.mock import MockLLM

        llm, where = Settings._llm, "Settings.llm"
        if llm is None or type(llm) is MockLLM:
            return None
    if not isinstance(llm, PCDLLM):
        raise OptionError(
            f"{owner}: expected {where} to be a PCDLLM (pcd decides with its own engine), but got "
            f"{type(llm).__name__}. Pass llm=PCDLLM(model=...), engine=..., or set Settings.llm = PCDLLM(...)."
        )
    return llm


def _json_safe(value: Any) -> Any:
    return getattr(value, "value", value)


class PCDMetadataExtractor(BaseExtractor):
    """Tag nodes with the fields of ``output_cls`` (RAG metadata), ``batch_size`` nodes per engine call.

    Each node gets one metadata dict in node order, with enum values (not Enum members). With
    ``store_probabilities`` each scored field's probability is stored too, under ``"pcd_probability_<field>"``
    (generated fields have none); those keys are kept out of the text the embedding model and the LLM see. A
    node with no text gets an empty dict (it is skipped, not sent to the engine).

    The engine is, in order: ``engine=``, the shared engine of ``model`` on ``backend``, the engine of ``llm=``
    (a :class:`PCDLLM`, whose options are the base of ``options``), the engine of ``Settings.llm`` when one is set
    (LlamaIndex's own default), or the embedded model's. An ``llm`` (or ``Settings.llm``) that is not a
    :class:`PCDLLM` is refused with an :class:`~pcd_engine.OptionError`, never silently replaced.
    """

    output_cls: Any = Field(description="The Pydantic model whose fields are the tags.")
    batch_size: int = Field(default=16, gt=0, description="Nodes per engine call.")
    store_probabilities: bool = Field(default=False, description="Also store each field's probability.")
    options: dict[str, Any] | None = Field(default=None, description="Extraction options (ExtractOptions names).")
    calibration: dict[str, Any] | None = Field(
        default=None,
        description="A calibration (a Calibrator, its JSON or the path of a pcd calibrate file; kept as JSON): "
        "each closed field's label prior is corrected; it wins over the llm's.",
    )
    model: str | None = Field(default=None, description="Alias, folder or repo id; None for the embedded model.")
    backend: str = Field(default="auto", description="'auto', 'torch' or 'mlx'.")
    _engine: Engine | None = PrivateAttr(default=None)
    _base_options: ExtractOptions = PrivateAttr(default_factory=ExtractOptions)

    def __init__(
        self, output_cls: type[BaseModel], *, engine: Engine | None = None, llm: Any = None, **kwargs: Any
    ) -> None:
        if "calibration" in kwargs:
            kwargs["calibration"] = calibration_json(kwargs["calibration"], owner="PCDMetadataExtractor")
        super().__init__(output_cls=output_cls, **kwargs)
        if llm is not None and (engine is not None or self.model is not None):
            raise OptionError("PCDMetadataExtractor: expected one of engine, llm or model, but got several.")
        source = None if engine is not None or self.model is not None else _pcd_llm("PCDMetadataExtractor", llm)
        self._engine = engine or (source.get_engine() if source is not None else None)
        base = source.extract_options if source is not None else None
        self._base_options = surface_options(
            ("PCDMetadataExtractor calibration", {"calibration": self.calibration}), ("llm", base)
        )
        self._call_options()  # a bad option fails here, as an OptionError

    @classmethod
    def class_name(cls) -> str:
        return "PCDMetadataExtractor"

    def _call_options(self) -> ExtractOptions:
        """The extractor's ``options`` over its calibration over its LLM's options."""
        return surface_options(("PCDMetadataExtractor options", self.options), ("base", self._base_options))

    def _get_engine(self) -> Engine:
        if self._engine is None:
            self._engine = shared_engine(self.model, self.backend)
        return self._engine

    def _tags(self, result: ExtractionResult) -> dict[str, Any]:
        tags = {name: _json_safe(value) for name, value in result.values.items()}
        if self.store_probabilities:
            scored = {n: f.probability for n, f in result.fields.items() if f.probability is not None}
            tags.update({PROBABILITY_PREFIX + n: p for n, p in scored.items()})
        return tags

    def extract_batches(self, nodes: Sequence[BaseNode]) -> list[dict[str, Any]]:
        """One metadata dict per node, in order, from one engine call per ``batch_size`` nodes (decided together:
        one pass per wave for the batch, see :meth:`Engine.extract_many`)."""
        engine = self._get_engine()
        options = self._call_options()
        texts = [n.get_content(metadata_mode=MetadataMode.NONE) for n in nodes]
        # Nodes with no text are skipped (an empty dict), so one blank chunk never stops a whole ingestion.
        todo = [i for i, t in enumerate(texts) if t.strip()]
        out: list[dict[str, Any]] = [{} for _ in nodes]
        for start in range(0, len(todo), self.batch_size):
            chunk = todo[start : start + self.batch_size]
            results = engine.extract_many(
                [texts[i] for i in chunk], self.output_cls, options=options, batch_size=self.batch_size
            )
            for i, result in zip(chunk, results, strict=True):
                out[i] = self._tags(result)
        return out

    async def aprocess_nodes(
        self,
        nodes: Sequence[BaseNode],
        excluded_embed_metadata_keys: list[str] | None = None,
        excluded_llm_metadata_keys: list[str] | None = None,
        **kwargs: Any,
    ) -> list[BaseNode]:
        """Tag the nodes (see :class:`BaseExtractor`); stored probabilities stay out of embed and LLM text."""
        out = await super().aprocess_nodes(nodes, excluded_embed_metadata_keys, excluded_llm_metadata_keys, **kwargs)
        for node in out:
            hidden = [k for k in node.metadata if k.startswith(PROBABILITY_PREFIX)]
            for excluded in (node.excluded_embed_metadata_keys, node.excluded_llm_metadata_keys):
                excluded.extend(k for k in hidden if k not in excluded)
        return out

    async def aextract(self, nodes: Sequence[BaseNode]) -> list[dict]:
        import asyncio

        return await asyncio.to_thread(self.extract_batches, nodes)
