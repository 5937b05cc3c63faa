"""The engine's API for framework adapters, beside the names of :mod:`pcd_engine`.

pcd's own integrations (:mod:`pcd_integrations`: LangChain, LlamaIndex, Ray) import from :mod:`pcd_engine` and
from this module only (a test holds them to it), and an adapter for another framework may rely on these names in
the same way:

* dependency checks: :func:`require` (import a framework, or raise
  :class:`~pcd_engine.BackendUnavailableError` naming the extra to install) and :func:`pip_install`;
* argument checks: :func:`check_count` (a non-negative integer setting) and :func:`check_text` (a document with
  text in it);
* a conversation, read in the same words on every surface (:mod:`pcd_engine.prompt.transcript`): a framework's
  messages become :class:`Turn` s (an assistant's tool calls as :class:`PastCall` s) in a :class:`Conversation`,
  whose ``document`` a decision is made on and whose ``chat()`` a chat template renders
  (:func:`openai_conversation` reads OpenAI-style messages into one); :func:`choice_of` reads a framework's
  ``tool_choice``;
* the ``pcd tag`` job's parts, for a distributed runner: :class:`CorpusDocument`, :class:`Runner`,
  :func:`tag_outcomes`, :func:`tag_columns` and :func:`tag_table` (imported on first use from
  :mod:`pcd_engine.tagging`, to keep importing the engine light).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pcd_engine.errors import check_count, pip_install, require
from pcd_engine.prompt.transcript import Conversation, PastCall, Turn, openai_conversation
from pcd_engine.run.admission import check_text
from pcd_engine.tool_calls import choice_of

if TYPE_CHECKING:  # imported on first use (see __getattr__), to keep importing the engine light
    from pcd_engine.tagging.corpus import CorpusDocument
    from pcd_engine.tagging.job import Runner, tag_outcomes
    from pcd_engine.tagging.table import tag_columns, tag_table

__all__ = [
    "Conversation",
    "CorpusDocument",
    "PastCall",
    "Runner",
    "Turn",
    "check_count",
    "check_text",
    "choice_of",
    "openai_conversation",
    "pip_install",
    "require",
    "tag_columns",
    "tag_outcomes",
    "tag_table",
]

_TAGGING = {
    "CorpusDocument": "pcd_engine.tagging.corpus",
    "Runner": "pcd_engine.tagging.job",
    "tag_outcomes": "pcd_engine.tagging.job",
    "tag_columns": "pcd_engine.tagging.table",
    "tag_table": "pcd_engine.tagging.table",
}


def __getattr__(name: str) -> Any:
    """The tag job's parts, imported on first use (PEP 562)."""
    if name in _TAGGING:
        import importlib

        return getattr(importlib.import_module(_TAGGING[name]), name)
    raise AttributeError(f"module 'pcd_engine.adapters' has no attribute {name!r}")
