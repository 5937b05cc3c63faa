"""LlamaIndex adapter: a Pydantic program, an LLM whose structured predictions use it, and a batched extractor.

* :class:`PCDPydanticProgram` fills a Pydantic model of closed fields from a formatted prompt with pcd's engine.
* :class:`PCDLLM` is a ``CustomLLM``: free-text ``complete`` / ``stream_complete`` on the same local model, and
  every ``structured_predict`` variant routed to the program (so ``as_structured_llm(Model)`` works too).
* :class:`PCDMetadataExtractor` tags a batch of nodes (RAG ingestion) with one engine call per ``batch_size``
  nodes; values are JSON-safe, and per-field probabilities can be stored under a key prefix.

One module each: :mod:`.program`, :mod:`.llm`, :mod:`.extractor`. Install with ``pip install "pcd-llm[llamaindex]"``.
"""

from pcd_engine.adapters import pip_install, require

require("llama_index.core", what="pcd_integrations.llamaindex", install=pip_install("llamaindex"))

from pcd_integrations.llamaindex.extractor import PCDMetadataExtractor  # noqa: E402
from pcd_integrations.llamaindex.llm import PCDLLM  # noqa: E402
from pcd_integrations.llamaindex.program import PCDPydanticProgram  # noqa: E402

__all__ = ["PCDLLM", "PCDMetadataExtractor", "PCDPydanticProgram"]
