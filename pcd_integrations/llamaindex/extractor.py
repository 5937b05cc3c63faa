"""The batched metadata extractor for RAG ingestion (:class:`PCDMetadataExtractor`): nodes tagged with a Pydantic
model's fields, one engine call per ``batch_size`` nodes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from llama_index.core.bridge.pydantic import Field, PrivateAttr
from llama_index.core.extractors import BaseExtractor
from llama_index.core.schema import BaseNode, MetadataMode
from pydantic import BaseModel

from pcd_engine import Engine, ExtractionResult, ExtractOptions, OptionError, surface_options
from pcd_integrations._shared import fitted_json, shared_engine
from pcd_integrations.llamaindex.program import pcd_llm

__all__ = ["PROBABILITY_PREFIX", "PCDMetadataExtractor"]

PROBABILITY_PREFIX = "pcd_probability_"
"""Metadata key prefix of per-field probabilities stored by :class:`PCDMetadataExtractor`."""


def _json_safe(value: Any) -> Any:
    return getattr(value, "value", value)


class PCDMetadataExtractor(BaseExtractor):
    """Tag nodes with the fields of ``output_cls`` (RAG metadata), ``batch_size`` nodes per engine call.

    Each node gets one metadata dict in node order, with enum values (not Enum members). With
    ``store_probabilities`` each scored field's probability is stored too, under ``"pcd_probability_<field>"``
    (generated fields have none); those keys are kept out of the text the embedding model and the LLM see. A
    node with no text gets an empty dict (it is skipped, not sent to the engine).

    The engine is, in order: ``engine=``, the shared engine of ``model`` on ``backend``, the engine of ``llm=``
    (a :class:`~.llm.PCDLLM`, whose options are the base of ``options``), the engine of ``Settings.llm`` when one is set
    (LlamaIndex's own default), or the embedded model's. An ``llm`` (or ``Settings.llm``) that is not a
    :class:`~.llm.PCDLLM` is refused with an :class:`~pcd_engine.OptionError`, never silently replaced.
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
    head: dict[str, Any] | None = Field(
        default=None,
        description="Decision heads (a Head, its JSON or the path of a pcd fit file; kept as JSON): each field with a "
        "head is decided by it; it wins over the llm's.",
    )
    model: str | None = Field(default=None, description="Alias, folder or repo id; None for the embedded model.")
    backend: str = Field(default="auto", description="'auto', 'torch' or 'mlx'.")
    _engine: Engine | None = PrivateAttr(default=None)
    _base_options: ExtractOptions = PrivateAttr(default_factory=ExtractOptions)

    def __init__(
        self, output_cls: type[BaseModel], *, engine: Engine | None = None, llm: Any = None, **kwargs: Any
    ) -> None:
        for kind in ("calibration", "head"):
            if kind in kwargs:
                kwargs[kind] = fitted_json(kwargs[kind], owner="PCDMetadataExtractor", kind=kind)
        super().__init__(output_cls=output_cls, **kwargs)  # type: ignore[call-arg]  # a pydantic field
        if llm is not None and (engine is not None or self.model is not None):
            raise OptionError("PCDMetadataExtractor: expected one of engine, llm or model, but got several.")
        source = None if engine is not None or self.model is not None else pcd_llm("PCDMetadataExtractor", llm)
        self._engine = engine or (source.get_engine() if source is not None else None)
        base = source.extract_options if source is not None else None
        self._base_options = surface_options(
            ("PCDMetadataExtractor calibration and head", {"calibration": self.calibration, "head": self.head}),
            ("llm", base),
        )
        self._call_options()  # a bad option fails here, as an OptionError

    @classmethod
    def class_name(cls) -> str:
        return "PCDMetadataExtractor"

    def _call_options(self) -> ExtractOptions:
        """The extractor's ``options`` over its calibration and head over its LLM's options."""
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
