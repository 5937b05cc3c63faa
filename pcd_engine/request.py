"""One extraction's mutable state, kept apart from what the engine compiles once.

The engine's caches (schema heads, compiled waves, pass plans, row plans) are shared by every call and guarded
by its lock; everything below belongs to one call only, so concurrent calls never see each other's tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from pcd_engine.backends.base import RequestState
from pcd_engine.errors import PromptAlignmentError
from pcd_engine.limits import Watch

__all__ = ["Request"]


@dataclass
class Request:
    """What one extraction has done so far.

    Attributes:
        state: The backend's view of the model for this call: the schema head plus the causal tokens fed.
        pending: Causal tokens not fed yet (the document, then the written answers); the next pass feeds them.
        tail_text: The prompt's tail as the next wave or the open rows see it (written answers included).
        watch: Stops the call at a pass boundary when its time is up or it was cancelled.
        budget: The memory budget of one pass, in bytes.
        committed: Tail tokens already fed or pending; a later tail must extend them.
        written: Names of the fields whose answers are written into the tail.
        nodes_scored: Tree nodes fed to the model so far.
    """

    state: RequestState
    pending: list[int]
    tail_text: str
    watch: Watch
    budget: int
    committed: tuple[int, ...] = ()
    written: set[str] = field(default_factory=set)
    nodes_scored: int = 0

    def extend(self, tail_ids: Sequence[int], causal_len: int, *, where: str, need_new: bool) -> None:
        """Queue the tail tokens a compiled wave or row plan needs after what the state already holds.

        Args:
            tail_ids: The plan's tail tokens.
            causal_len: How many of them come before the tree or the rows.
            where: The plan, for messages.
            need_new: A scored tree reads its root distribution from the last new token, so it needs one; open
                rows start from their own prefix tokens and do not.

        Raises:
            PromptAlignmentError: If the written answers re-tokenized the tail before them, or a tree would get
                no new token to read its root from.
        """
        if tuple(tail_ids[: len(self.committed)]) != self.committed or causal_len < len(self.committed):
            raise PromptAlignmentError(
                f"{where}: expected the written answers to extend the tail's tokens, but they re-tokenized the text "
                "before them."
            )
        self.pending = [*self.pending, *tail_ids[len(self.committed) : causal_len]]
        if not self.pending and need_new:
            raise PromptAlignmentError(
                f"{where}: expected new prompt tokens before the tree (the root distribution is read from the last "
                "one), but the written answers added none."
            )
        self.committed = tuple(tail_ids[:causal_len])
