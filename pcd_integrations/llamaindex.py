"""LlamaIndex adapter: a Pydantic program, an LLM whose structured predictions use it, and a batched extractor.

* :class:`PCDPydanticProgram` fills a Pydantic model of closed fields from a formatted prompt with pcd's engine.
* :class:`PCDLLM` is a ``CustomLLM``: free-text ``complete`` / ``stream_complete`` on the same local model, and
  every ``structured_predict`` variant routed to the program (so ``as_structured_llm(Model)`` works too).
* :class:`PCDMetadataExtractor` tags a batch of nodes (RAG ingestion) with one engine call per ``batch_size``
  nodes; values are JSON-safe, and per-field probabilities can be stored under a key prefix.

Install with ``pip install "pcd[llamaindex]"``.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Generator, Iterator, Mapping, Sequence
from typing import Any

from pcd_engine.errors import require

require("llama_index.core", what="pcd_integrations.llamaindex", install="pip install 'pcd[llamaindex]'")

from llama_index.core.base.llms.types import ChatMessage as LIChatMessage
from llama_index.core.base.llms.types import (
    ChatResponse,
    ChatResponseGen,
    CompletionResponse,
    CompletionResponseGen,
    LLMMetadata,
    MessageRole,
)
from llama_index.core.bridge.pydantic import Field, PrivateAttr
from llama_index.core.extractors import BaseExtractor
from llama_index.core.llms.callbacks import llm_chat_callback, llm_completion_callback
from llama_index.core.llms.custom import CustomLLM
from llama_index.core.prompts import BasePromptTemplate, PromptTemplate
from llama_index.core.schema import BaseNode, MetadataMode
from llama_index.core.types import BasePydanticProgram
from pydantic import BaseModel

from pcd_engine import ChatMessage, Engine, ExtractionResult, ExtractOptions, OptionError, stream_chat
from pcd_engine.models import DEFAULT_MODEL
from pcd_integrations._shared import shared_engine

__all__ = ["PCDLLM", "PCDMetadataExtractor", "PCDPydanticProgram"]

# LlamaIndex roles as pcd chat turns: tool results and function outputs are read as user turns.
_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant", "chatbot": "assistant"}

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
        self.options = ExtractOptions.parse(options, where="PCDPydanticProgram options")
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

        Raises:
            OptionError: If an option is unknown or out of range (a ``ValueError``).
            ValueError: If both or neither of ``prompt_template_str`` and ``prompt`` are given, both ``llm`` and
                ``engine`` are given, or ``llm`` is not a :class:`PCDLLM`.
        """
        given = ExtractOptions.parse(kwargs, where="PCDPydanticProgram.from_defaults").over(
            ExtractOptions.parse(options, where="PCDPydanticProgram.from_defaults options")
        )
        if (prompt_template_str is None) == (prompt is None):
            raise ValueError(
                "PCDPydanticProgram.from_defaults: expected exactly one of prompt_template_str or prompt, but got "
                f"{'both' if prompt is not None else 'neither'}."
            )
        if llm is not None and engine is not None:
            raise ValueError("PCDPydanticProgram.from_defaults: expected llm or engine, but got both.")
        if llm is not None and not isinstance(llm, PCDLLM):
            raise ValueError(f"PCDPydanticProgram.from_defaults: expected a PCDLLM, but got {type(llm).__name__}.")
        chosen = engine or (llm.get_engine() if llm is not None else shared_engine(None, "auto"))
        if llm is not None:
            given = given.over(llm.extract_options)
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
        options = ExtractOptions.parse(llm_kwargs, where="llm_kwargs").over(self.options)
        result = self._engine.extract(_prompt_text(self._prompt, **kwargs), self._output_cls, options)
        self.last_result = result
        if self.verbose:
            shown = ", ".join(
                f"{n}={f.value!r}" + (f" ({f.probability:.2f})" if f.probability is not None else "")
                for n, f in result.fields.items()
            )
            print(f"> {self._output_cls.__name__}: {shown}")  # noqa: T201 - what verbose asks for
        return result.model

    async def acall(self, *args: Any, llm_kwargs: dict[str, Any] | None = None, **kwargs: Any) -> BaseModel:
        import asyncio

        return await asyncio.to_thread(self.__call__, *args, llm_kwargs=llm_kwargs, **kwargs)

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


class PCDLLM(CustomLLM):
    """A local LLM on pcd's engine: free text by greedy decoding, structured predictions by the engine."""

    model: str | None = Field(default=None, description="Alias, folder or repo id; None for the embedded model.")
    backend: str = Field(default="auto", description="'auto', 'torch' or 'mlx'.")
    max_tokens: int = Field(default=256, description="Upper bound on tokens for free-text replies.")
    options: dict[str, Any] | None = Field(
        default=None, description="Extraction options (ExtractOptions names) for structured predictions."
    )
    _engine: Engine | None = PrivateAttr(default=None)

    def __init__(self, *, engine: Engine | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._engine = engine
        _ = self.extract_options  # a bad option fails here, as an OptionError

    @property
    def extract_options(self) -> ExtractOptions:
        """``options`` as an :class:`~pcd_engine.ExtractOptions`."""
        return ExtractOptions.parse(self.options, where="PCDLLM options")

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
            model_name=self.model or DEFAULT_MODEL,
        )

    def _chat_pieces(self, messages: Sequence[LIChatMessage], **kwargs: Any) -> Iterator[tuple[str, str]]:
        """``(text so far, delta)`` of the reply to ``messages``, written with the model's own chat template."""
        turns = [ChatMessage(_ROLES.get(str(m.role.value), "user"), m.content or "") for m in messages]
        limit = int(kwargs.get("max_tokens", self.max_tokens))
        text = ""
        for piece in stream_chat(self.get_engine(), turns, max_new_tokens=limit, stop=kwargs.get("stop") or ()):
            if piece.text:
                text += piece.text
                yield text, piece.text

    @llm_chat_callback()
    def chat(self, messages: Sequence[LIChatMessage], **kwargs: Any) -> ChatResponse:
        """Reply to ``messages``: roles reach the model through its chat template (system, user, assistant)."""
        text = "".join(delta for _text, delta in self._chat_pieces(messages, **kwargs))
        return ChatResponse(message=LIChatMessage(role=MessageRole.ASSISTANT, content=text))

    @llm_chat_callback()
    def stream_chat(self, messages: Sequence[LIChatMessage], **kwargs: Any) -> ChatResponseGen:
        """:meth:`chat`, one token at a time."""

        def gen() -> ChatResponseGen:
            for text, delta in self._chat_pieces(messages, **kwargs):
                yield ChatResponse(message=LIChatMessage(role=MessageRole.ASSISTANT, content=text), delta=delta)

        return gen()

    @llm_completion_callback()
    def complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        text = ""
        for response in self.stream_complete(prompt, formatted=formatted, **kwargs):
            text = response.text
        return CompletionResponse(text=text)

    @llm_completion_callback()
    def stream_complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponseGen:
        limit = int(kwargs.get("max_tokens", self.max_tokens))
        stop = kwargs.get("stop") or ()
        turns = [ChatMessage("user", prompt)]

        def gen() -> CompletionResponseGen:
            text = ""
            for piece in stream_chat(self.get_engine(), turns, max_new_tokens=limit, stop=stop):
                if piece.text:
                    text += piece.text
                    yield CompletionResponse(text=text, delta=piece.text)

        return gen()

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


def _json_safe(value: Any) -> Any:
    return getattr(value, "value", value)


class PCDMetadataExtractor(BaseExtractor):
    """Tag nodes with the fields of ``output_cls`` (RAG metadata), ``batch_size`` nodes per engine call.

    Each node gets one metadata dict in node order, with enum values (not Enum members). With
    ``store_probabilities`` each scored field's probability is stored too, under ``"pcd_probability_<field>"``
    (generated fields have none); those keys are kept out of the text the embedding model and the LLM see. A
    node with no text gets an empty dict (it is skipped, not sent to the engine).

    The engine is, in order: ``engine=``, the engine of ``llm=`` (a :class:`PCDLLM`, whose options are the base
    of ``options``), or the shared engine of ``model`` on ``backend``.
    """

    output_cls: Any = Field(description="The Pydantic model whose fields are the tags.")
    batch_size: int = Field(default=16, gt=0, description="Nodes per engine call.")
    store_probabilities: bool = Field(default=False, description="Also store each field's probability.")
    options: dict[str, Any] | None = Field(default=None, description="Extraction options (ExtractOptions names).")
    model: str | None = Field(default=None, description="Alias, folder or repo id; None for the embedded model.")
    backend: str = Field(default="auto", description="'auto', 'torch' or 'mlx'.")
    _engine: Engine | None = PrivateAttr(default=None)
    _base_options: ExtractOptions = PrivateAttr(default_factory=ExtractOptions)

    def __init__(
        self, output_cls: type[BaseModel], *, engine: Engine | None = None, llm: Any = None, **kwargs: Any
    ) -> None:
        super().__init__(output_cls=output_cls, **kwargs)
        if llm is not None and not isinstance(llm, PCDLLM):
            raise OptionError(
                f"PCDMetadataExtractor: expected llm to be a PCDLLM (pcd decides with its own engine), but got "
                f"{type(llm).__name__}. Pass PCDLLM(model=...) or model=..."
            )
        if llm is not None and (engine is not None or self.model is not None):
            raise OptionError("PCDMetadataExtractor: expected one of engine, llm or model, but got several.")
        self._engine = engine or (llm.get_engine() if llm is not None else None)
        self._base_options = llm.extract_options if llm is not None else ExtractOptions()
        ExtractOptions.parse(self.options, where="PCDMetadataExtractor options")  # fails here, as an OptionError

    @classmethod
    def class_name(cls) -> str:
        return "PCDMetadataExtractor"

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
        """One metadata dict per node, in order, from one engine call per ``batch_size`` nodes."""
        engine = self._get_engine()
        options = ExtractOptions.parse(self.options, where="PCDMetadataExtractor options").over(self._base_options)
        texts = [n.get_content(metadata_mode=MetadataMode.NONE) for n in nodes]
        # Nodes with no text are skipped (an empty dict), so one blank chunk never stops a whole ingestion.
        todo = [i for i, t in enumerate(texts) if t.strip()]
        out: list[dict[str, Any]] = [{} for _ in nodes]
        for start in range(0, len(todo), self.batch_size):
            chunk = todo[start : start + self.batch_size]
            results = engine.extract_many([texts[i] for i in chunk], self.output_cls, options=options)
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
