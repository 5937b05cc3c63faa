"""The Pydantic program: a prompt's text decided into a Pydantic model by pcd's engine (:class:`PCDPydanticProgram`),
and how an LLM setting names the engine to use (:func:`pcd_llm`).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Generator, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from llama_index.core.prompts import BasePromptTemplate, PromptTemplate
from llama_index.core.types import BasePydanticProgram
from pydantic import BaseModel

from pcd_engine import Engine, ExtractionResult, ExtractOptions, OptionError, surface_options
from pcd_integrations._shared import shared_engine

__all__ = ["EngineSource", "PCDPydanticProgram", "pcd_llm"]


@runtime_checkable
class EngineSource(Protocol):
    """An LLM that decides with a pcd engine (:class:`~pcd_integrations.llamaindex.llm.PCDLLM`): its engine and
    its extraction options."""

    def get_engine(self) -> Engine: ...

    @property
    def extract_options(self) -> ExtractOptions: ...


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
        llm: EngineSource | None = None,
        engine: Engine | None = None,
        options: ExtractOptions | Mapping[str, Any] | None = None,
        verbose: bool = False,
        **kwargs: Any,
    ) -> PCDPydanticProgram:
        """Build a program from exactly one prompt form, and an engine (or a :class:`~.llm.PCDLLM`, or the default).

        Extraction options come from ``options`` and, by name, from ``kwargs``; a :class:`~.llm.PCDLLM`'s own options
        are the base they override. ``verbose`` prints each call's values with their probabilities, as LlamaIndex's
        own programs print what they produced.

        The engine is, in order: ``engine``, the engine of ``llm``, the engine of ``Settings.llm`` when one is set
        (LlamaIndex's own default), or the embedded model's.

        Raises:
            OptionError: If an option is unknown or out of range, or ``llm`` (or ``Settings.llm``) is not a
                :class:`~.llm.PCDLLM` (a ``ValueError``).
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
        source = None if engine is not None else pcd_llm("PCDPydanticProgram.from_defaults", llm)
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


def pcd_llm(owner: str, llm: Any) -> EngineSource | None:
    """The :class:`~pcd_integrations.llamaindex.llm.PCDLLM` whose engine to use: ``llm``, else ``Settings.llm``
    when one is set (a ``MockLLM``, what ``Settings.llm = None`` sets, counts as none).

    Raises:
        OptionError: If that LLM is not a PCDLLM (an :class:`EngineSource`): pcd decides with its own engine, so
            another LLM cannot be honoured, and is not silently replaced.
    """
    where = "llm"
    if llm is None:
        from llama_index.core import Settings
        from llama_index.core.llms.mock import MockLLM

        llm, where = Settings._llm, "Settings.llm"
        if llm is None or type(llm) is MockLLM:
            return None
    if not isinstance(llm, EngineSource):
        raise OptionError(
            f"{owner}: expected {where} to be a PCDLLM (pcd decides with its own engine), but got "
            f"{type(llm).__name__}. Pass llm=PCDLLM(model=...), engine=..., or set Settings.llm = PCDLLM(...)."
        )
    return llm
