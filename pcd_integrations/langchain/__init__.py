"""LangChain adapter: :class:`ChatPCD`, a local chat model whose ``with_structured_output`` runs pcd's engine.

Free text (``invoke``, ``stream``) is greedy generation on the same local model (:func:`pcd_engine.stream_chat`).
Structured output compiles the schema's closed fields into token tries and decides them in one tree-packed pass
per wave; the reply's content is the JSON object, and each field's probability, candidate mass and alternatives
are in the message's ``response_metadata["pcd"]``. A ``batch`` of structured calls is ONE engine call.

The chat model is :mod:`.chat_model`; :mod:`.messages` reads LangChain messages and schemas for it. Install with
``pip install "pcd-llm[langchain]"``.
"""

from pcd_engine.adapters import pip_install, require

require("langchain_core", what="pcd_integrations.langchain", install=pip_install("langchain"))

from pcd_integrations.langchain.chat_model import ChatPCD  # noqa: E402
from pcd_integrations.langchain.decision_model import PCDDecisionModel  # noqa: E402

__all__ = ["ChatPCD", "PCDDecisionModel"]
