"""The LlamaIndex LLM on pcd's engine (:class:`PCDLLM`): free text by greedy decoding on the same local model, tool
calls decided by the engine, structured predictions through the Pydantic program
(:class:`~pcd_integrations.llamaindex.program.PCDPydanticProgram`).
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, Generator, Iterator, Sequence
from typing import Any

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
from llama_index.core.llms.callbacks import llm_chat_callback, llm_completion_callback
from llama_index.core.llms.custom import CustomLLM
from llama_index.core.llms.function_calling import FunctionCallingLLM
from llama_index.core.llms.llm import ToolSelection
from llama_index.core.prompts import BasePromptTemplate, PromptTemplate
from llama_index.core.tools.types import BaseTool
from pydantic import BaseModel

from pcd_engine import (
    DEFAULT_MODEL,
    ChatMessage,
    Engine,
    ExtractOptions,
    OptionError,
    Tool,
    decide_tools,
    stream_chat,
    surface_options,
)
from pcd_engine.adapters import Conversation, PastCall, Turn, check_count, choice_of
from pcd_integrations._shared import read_settings, refuse_sampling, reply_time_limit, shared_engine
from pcd_integrations.llamaindex.program import PCDPydanticProgram

__all__ = ["PCDLLM"]

# LlamaIndex roles as pcd's turn roles: any other is a user's.
_ROLES = {
    "system": "system",
    "developer": "system",
    "user": "user",
    "assistant": "assistant",
    "chatbot": "assistant",
    "tool": "tool",
    "function": "tool",
}


class _ToolRequest:
    """The tools of one ``chat_with_tools`` turn, and how the model may choose among them."""

    def __init__(self, tools: list[Tool], choice: str, parallel: bool) -> None:
        self.tools, self.choice, self.parallel = tools, choice, parallel


def _conversation(messages: Sequence[LIChatMessage]) -> Conversation:
    """The conversation pcd reads, as every surface reads one: an assistant's tool call blocks are its calls, a
    tool message's result is named by the call it answers (``additional_kwargs``' ``tool_call_id``) or its own
    ``name``."""
    turns = []
    for m in messages:
        role = _ROLES.get(str(m.role.value), "user")
        text = m.content or ""
        if role == "tool":
            answers = m.additional_kwargs.get("tool_call_id")
            name = m.additional_kwargs.get("name")
            turns.append(Turn("tool", text, answers=answers and str(answers), tool=name and str(name)))
            continue
        calls = tuple(
            PastCall(b.tool_name, _arguments(b.tool_kwargs), b.tool_call_id)
            for b in m.blocks
            if isinstance(b, ToolCallBlock)
        )
        turns.append(Turn(role, text, calls))
    return Conversation(tuple(turns))


def _arguments(kwargs: dict[str, Any] | str) -> dict[str, Any]:
    """A tool call block's arguments as a dict (a block may carry them as their JSON text)."""
    if isinstance(kwargs, dict):
        return kwargs
    parsed = json.loads(kwargs or "{}")
    return parsed if isinstance(parsed, dict) else {}


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
    context_window: int | None = Field(
        default=None,
        description="The window LlamaIndex plans prompts with (LLMMetadata.context_window); None: the model's own. "
        "Larger than the model's own is an OptionError when the model loads.",
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
    head: dict[str, Any] | None = Field(
        default=None,
        description="Decision heads (a Head, its JSON or the path of a pcd fit file; kept as JSON) for structured "
        "predictions: each field with a head is decided by it, from the same passes.",
    )
    _engine: Engine | None = PrivateAttr(default=None)

    def __init__(self, *, engine: Engine | None = None, **kwargs: Any) -> None:
        check_count(kwargs.get("context_window"), "PCDLLM: context_window")
        super().__init__(**read_settings("PCDLLM", kwargs, type(self).model_fields, others="refuse"))
        self._engine = engine
        _ = self.extract_options  # a bad option fails here, as an OptionError
        if engine is not None:
            self._check_window(engine)

    def _check_window(self, engine: Engine) -> None:
        """``context_window`` against the model's own window.

        Raises:
            OptionError: If it is larger.
        """
        if self.context_window is not None and self.context_window > engine.backend.max_context:
            raise OptionError(
                f"PCDLLM: context_window: expected at most the model's window ({engine.backend.max_context} "
                f"tokens), but got {self.context_window}."
            )

    @property
    def extract_options(self) -> ExtractOptions:
        """``options`` over ``temperature``, ``timeout``, ``calibration``, ``head`` and an explicitly set
        ``max_tokens``, as an :class:`~pcd_engine.ExtractOptions`."""
        max_tokens = self.max_tokens if "max_tokens" in self.model_fields_set else None
        return surface_options(
            ("PCDLLM options", self.options), temperature=self.temperature, timeout=self.timeout,
            max_tokens=max_tokens, calibration=self.calibration, head=self.head,
        )  # fmt: skip

    @classmethod
    def class_name(cls) -> str:
        return "PCDLLM"

    def get_engine(self) -> Engine:
        """The engine, loaded on first use."""
        if self._engine is None:
            engine = shared_engine(self.model, self.backend)
            self._check_window(engine)
            self._engine = engine
        return self._engine

    @property
    def metadata(self) -> LLMMetadata:
        engine = self._engine
        window = self.context_window or (engine.backend.max_context if engine is not None else 8192)
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
        refuse_sampling("PCDLLM", kwargs.get("temperature", self.temperature))  # a call's own is refused too
        limit = int(kwargs.get("max_tokens") or self.max_tokens)
        stop = kwargs.get("stop") or self.stop or ()
        engine = self.get_engine()
        seconds = reply_time_limit(engine, kwargs.get("timeout", self.timeout))
        text = ""
        for piece in stream_chat(engine, turns, max_new_tokens=limit, stop=stop, time_limit_s=seconds):
            if piece.text:
                text += piece.text
                yield text, piece.text

    def _reply(self, messages: Sequence[LIChatMessage], **kwargs: Any) -> ChatResponse | ChatResponseGen:
        """The tool calls decided for ``messages`` (one response) when tools are bound and the model calls one;
        otherwise the free-text reply, one response per token."""
        tools: _ToolRequest | None = kwargs.pop("pcd_tools", None)
        extra: dict[str, Any] = {}
        if tools is not None:
            decided, evidence = self._tool_reply(messages, tools)
            if decided is not None:
                return decided
            extra = {"pcd": evidence}  # the decision to answer, with its probabilities, rides on the answer
        turns = _conversation(messages).chat()

        def gen() -> ChatResponseGen:
            for text, delta in self._free_text(turns, **kwargs):
                message = LIChatMessage(role=MessageRole.ASSISTANT, content=text)
                yield ChatResponse(message=message, delta=delta, raw=dict(extra), additional_kwargs=dict(extra))

        return gen()

    @llm_chat_callback()
    def chat(self, messages: Sequence[LIChatMessage], **kwargs: Any) -> ChatResponse:
        """Reply to ``messages``: roles reach the model through its chat template (system, user, assistant); with
        tools bound (``chat_with_tools``) the reply may be tool calls instead."""
        reply = self._reply(messages, **kwargs)
        if isinstance(reply, ChatResponse):
            return reply
        last = ChatResponse(message=LIChatMessage(role=MessageRole.ASSISTANT, content=""))
        for response in reply:
            last = response
        return ChatResponse(message=last.message, raw=last.raw, additional_kwargs=last.additional_kwargs)

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

    def _tool_reply(
        self, messages: Sequence[LIChatMessage], tools: _ToolRequest
    ) -> tuple[ChatResponse | None, dict[str, Any]]:
        """The model's tool calls, decided by the engine (``None`` when it decides to answer instead), and the
        decision's evidence either way."""
        talk = _conversation(messages)
        decision = decide_tools(
            self.get_engine(), talk.document, tools.tools, choice=tools.choice, parallel=tools.parallel,
            options=self.extract_options, done=talk.answered_calls(),
        )  # fmt: skip
        evidence = decision.evidence()
        if decision.answer:
            return None, evidence
        blocks = [ToolCallBlock(tool_call_id=c.id, tool_name=c.name, tool_kwargs=c.arguments) for c in decision.calls]
        message = LIChatMessage(role=MessageRole.ASSISTANT, blocks=blocks)
        return ChatResponse(message=message, raw={"pcd": evidence}, additional_kwargs={"pcd": evidence}), evidence

    def get_tool_calls_from_response(
        self, response: ChatResponse, error_on_no_tool_call: bool = True, **kwargs: Any
    ) -> list[ToolSelection]:
        """The tool calls of a :meth:`chat_with_tools` reply.

        Raises:
            ValueError: If there are none and ``error_on_no_tool_call`` is set.
        """
        calls = [
            ToolSelection(tool_id=b.tool_call_id or "", tool_name=b.tool_name, tool_kwargs=_arguments(b.tool_kwargs))
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
