"""LlamaIndex adapter: a Pydantic program, an LLM whose structured predictions use it, and a batched extractor.

* :class:`PCDPydanticProgram` fills a Pydantic model of closed fields from a formatted prompt with pcd's engine.
* :class:`PCDLLM` is a ``CustomLLM``: free-text ``complete`` / ``stream_complete`` on the same local model, and
  every ``structured_predict`` variant routed to the program (so ``as_structured_llm(Model)`` works too).
* :class:`PCDMetadataExtractor` tags a batch of nodes (RAG ingestion) with one engine call per ``batch_size``
  nodes; values are JSON-safe, and per-field probabilities can be stored under a key prefix.

Install with ``pip install "pcd[llamaindex]"``.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Generator, Mapping, Sequence
from typing import Any

from pcd_engine.errors import require

require("llama_index.core", what="pcd_integrations.llamaindex", install="pip install 'pcd[llamaindex]'")

from llama_index.core.base.llms.types import CompletionResponse, CompletionResponseGen, LLMMetadata
from llama_index.core.bridge.pydantic import Field, PrivateAttr
from llama_index.core.extractors import BaseExtractor
from llama_index.core.llms.callbacks import llm_completion_callback
from llama_index.core.llms.custom import CustomLLM
from llama_index.core.prompts import BasePromptTemplate, PromptTemplate
from llama_index.core.schema import BaseNode, MetadataMode
from llama_index.core.types import BasePydanticProgram
from pydantic import BaseModel

from pcd_engine import ChatMessage, Engine, ExtractionResult, ExtractOptions, stream_chat
from pcd_engine.models import DEFAULT_MODEL
from pcd_integrations._shared import shared_engine

__all__ = ["PCDLLM", "PCDMetadataExtractor", "PCDPydanticProgram"]

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
    ) -> None:
        self._output_cls = output_cls
        self._prompt = prompt
        self._engine = engine
        self.options = ExtractOptions.parse(options, where="PCDPydanticProgram options")
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
        **kwargs: Any,
    ) -> PCDPydanticProgram:
        """Build a program from exactly one prompt form, and an engine (or a :class:`PCDLLM`, or the default).

        Extraction options come from ``options`` and, by name, from ``kwargs``; a :class:`PCDLLM`'s own options
        are the base they override.

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
        return cls(output_cls, prompt or PromptTemplate(str(prompt_template_str)), chosen, options=given)

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
            is_chat_model=False,
            model_name=self.model or DEFAULT_MODEL,
        )

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
    (generated fields have none). A node with no text gets an empty dict (it is skipped, not sent to the
    engine).
    """

    output_cls: Any = Field(description="The Pydantic model whose fields are the tags.")
    batch_size: int = Field(default=16, gt=0, description="Nodes per engine call.")
    store_probabilities: bool = Field(default=False, description="Also store each field's probability.")
    options: dict[str, Any] | None = Field(default=None, description="Extraction options (ExtractOptions names).")
    _engine: Engine | None = PrivateAttr(default=None)

    def __init__(self, output_cls: type[BaseModel], *, engine: Engine | None = None, **kwargs: Any) -> None:
        super().__init__(output_cls=output_cls, **kwargs)
        self._engine = engine
        ExtractOptions.parse(self.options, where="PCDMetadataExtractor options")  # fails here, as an OptionError

    @classmethod
    def class_name(cls) -> str:
        return "PCDMetadataExtractor"

    def _get_engine(self) -> Engine:
        if self._engine is None:
            self._engine = shared_engine(None, "auto")
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
        options = ExtractOptions.parse(self.options, where="PCDMetadataExtractor options")
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

    async def aextract(self, nodes: Sequence[BaseNode]) -> list[dict]:
        import asyncio

        return await asyncio.to_thread(self.extract_batches, nodes)
