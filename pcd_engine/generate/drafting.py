"""Drafts for open rows: continuations proposed from the document, checked by the model in the rows' own pass.

Extraction values (names, amounts, order ids, dates, quotes) are mostly spans of the document. While the open
rows grow (:meth:`~pcd_engine.backends.contract.Backend.generate_rows`), each row may propose a continuation: a
chain of draft tokens that rides in the same packed pass as the row's next token, each draft token seeing the
row and the draft tokens before it. The model's greedy choice under the grammar is then read at every draft
position in turn, and the row advances by as many tokens as agree (and one more: the choice after the last
accepted draft token). Nothing is sampled from the draft: every token kept is the model's own choice given the
tokens before it, so a drafted row is token for token the greedy row, only in fewer passes.

:class:`PromptLookup` proposes by prompt lookup: the latest earlier occurrence, in the context (the prompt
with the document), of the row's last ``n`` tokens (``n`` from ``max_ngram`` down to 1), and the tokens that
followed it. A backend takes any :data:`~pcd_engine.backends.contract.Drafter`.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["PromptLookup"]


class PromptLookup:
    """Proposes continuations copied from a context.

    Args:
        context: The token ids to copy from (the prompt, with the document).
        max_ngram: The longest run of the row's last tokens looked up.
        max_draft: The most tokens one proposal holds.

    Raises:
        ValueError: If ``max_ngram`` or ``max_draft`` is below 1.
    """

    def __init__(self, context: Sequence[int], *, max_ngram: int = 3, max_draft: int = 8) -> None:
        if max_ngram < 1 or max_draft < 1:
            raise ValueError(f"PromptLookup: expected max_ngram and max_draft >= 1, but got {max_ngram}, {max_draft}.")
        self.context = [int(t) for t in context]
        self.max_ngram = max_ngram
        self.max_draft = max_draft
        # n-gram -> the position just after its latest occurrence that has at least one token after it
        self._after: dict[tuple[int, ...], int] = {}
        ids = self.context
        for n in range(1, max_ngram + 1):
            for end in range(n, len(ids)):
                self._after[tuple(ids[end - n : end])] = end

    def __call__(self, tokens: Sequence[int], *, limit: int | None = None) -> list[int]:
        """The continuation proposed after ``tokens``: at most ``limit`` (else ``max_draft``) tokens.

        Args:
            tokens: The row so far.
            limit: The most tokens wanted.

        Returns:
            The proposal; empty when no run of the row's last tokens occurs in the context.
        """
        size = self.max_draft if limit is None else min(limit, self.max_draft)
        if size < 1:
            return []
        for n in range(min(self.max_ngram, len(tokens)), 0, -1):
            start = self._after.get(tuple(int(t) for t in tokens[len(tokens) - n :]))
            if start is not None:
                return self.context[start : start + size]
        return []
