"""Planning: which fields go in which wave, and which tree nodes go in which forward pass.

A *wave* is a set of closed fields decided together in one tree-packed pass; its decisions are then written
into the prompt for the waves after it. By default the first field is an *anchor*, decided alone, and every other field
follows in the next wave; ``depends_on`` adds waves. A *pass* is one forward call: a wave's tree is split into
several passes only when one would exceed the memory budget.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from pcd_engine.compiler import TokenTree
from pcd_engine.schema import FieldSpec, Schema

__all__ = ["TreeBatch", "plan_passes", "plan_waves"]


def plan_waves(schema: Schema, *, anchor: bool) -> list[list[FieldSpec]]:
    """Group the schema's closed fields into waves, in schema order within each wave.

    Open fields are in no wave: the engine generates them after the last wave, in parallel rows.

    Args:
        schema: The compiled schema (dependencies are known to be acyclic and to name closed fields).
        anchor: Decide the first closed field without dependencies alone, before every other field.

    Returns:
        The waves, first to last; none is empty, and there are none when no field is closed.
    """
    fields = [f for f in schema.fields if f.scored]
    if not fields:
        return []
    first = next((f.name for f in fields if not f.depends_on), None) if anchor and len(fields) > 1 else None
    base = 1 if first is not None else 0
    level: dict[str, int] = {}

    def resolve(spec: FieldSpec) -> int:
        if spec.name not in level:
            if spec.name == first:
                level[spec.name] = 0
            else:
                deps = [resolve(schema.field(d)) + 1 for d in spec.depends_on]
                level[spec.name] = max([base, *deps])
        return level[spec.name]

    for spec in fields:
        resolve(spec)
    waves: list[list[FieldSpec]] = [[] for _ in range(max(level.values()) + 1)]
    for spec in fields:
        waves[level[spec.name]].append(spec)
    return [w for w in waves if w]


@dataclass(frozen=True)
class TreeBatch:
    """The part of a tree fed to one forward pass.

    Attributes:
        tokens: Token of each fed node, parents before children.
        parents: Index into this batch of each fed node's parent, or -1 for a child of the root.
        depths: Depth of each fed node below the root (0 for children of the root).
        query_rows: For each query, the batch row whose output distribution it reads; -1 is the last causal
            token of the pass.
        query_tokens: For each query, the token whose log-probability is read.
        query_nodes: For each query, the tree node it gives the log-probability of.
    """

    tokens: tuple[int, ...]
    parents: tuple[int, ...]
    depths: tuple[int, ...]
    query_rows: tuple[int, ...]
    query_tokens: tuple[int, ...]
    query_nodes: tuple[int, ...]

    def visibility(self, past: int, causal: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Who sees whom in a packed pass of ``causal`` tokens and this batch's nodes after ``past`` cached ones.

        Every backend's packed scorer builds its attention mask and positions from this one function::

                         keys:  past ... | causal c0 c1 c2 | nodes a  b  c      (b, c children of a)
            causal c2            1 ... 1 |  1  1  1        |  0  0  0
            node   a             1 ... 1 |  1  1  1        |  1  0  0
            node   b             1 ... 1 |  1  1  1        |  1  1  0
            node   c             1 ... 1 |  1  1  1        |  1  0  1

        Args:
            past: Tokens already in the cache.
            causal: Tokens appended causally in front of the tree.

        Returns:
            ``(visible, qpos, kpos)``: a bool matrix ``[causal + nodes, past + causal + nodes]`` (query row sees
            key column), the position of each query token (a node sits at the position after the causal block
            plus its depth), and the position of each key.
        """
        n = len(self.tokens)
        t = causal + n
        qpos = np.concatenate([past + np.arange(causal), past + causal + np.asarray(self.depths, dtype=np.int64)])
        kpos = np.concatenate([np.arange(past), qpos])
        visible = np.zeros((t, past + t), dtype=bool)
        visible[:, :past] = True
        visible[:causal, past : past + causal] = np.tril(np.ones((causal, causal), dtype=bool))
        visible[causal:, past : past + causal] = True
        ancestors = np.zeros((n, n), dtype=bool)
        for i, parent in enumerate(self.parents):
            if parent >= 0:
                ancestors[i] = ancestors[parent]
            ancestors[i, i] = True
        visible[causal:, past + causal :] = ancestors
        return visible, qpos, kpos

    def visibility_of(self, past: int, nodes: Sequence[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The rows of ``visibility(past, 0)`` for ``nodes`` only, without building the whole matrix.

        A growing tree (open rows) feeds only its newest nodes each pass; their rows cost
        ``len(nodes) x (past + tree)`` booleans and a walk up each node's ancestors, where the whole matrix would
        cost ``tree x (past + tree)``.

        Args:
            past: Tokens in the cache before the tree (the causal block included).
            nodes: The fed nodes, in feeding order.

        Returns:
            ``(visible, qpos, kpos)`` as in :meth:`visibility`, with one query row per node of ``nodes``.
        """
        depths = np.asarray(self.depths, dtype=np.int64)
        visible = np.zeros((len(nodes), past + len(self.tokens)), dtype=bool)
        visible[:, :past] = True
        for row, node in enumerate(nodes):
            while node >= 0:
                visible[row, past + node] = True
                node = self.parents[node]
        kpos = np.concatenate([np.arange(past), past + depths])
        return visible, past + depths[list(nodes)], kpos

    def chains(self) -> tuple[list[list[int]], dict[int, tuple[int, int]]]:
        """The batch as root-to-leaf chains of rows, for scorers that feed one chain per batch row.

        Returns:
            ``(chains, row_of)``: each chain lists batch rows from a child of the root down to a leaf; ``row_of``
            maps every row to the first ``(chain index, offset in chain)`` that holds it.
        """
        is_parent = {p for p in self.parents if p >= 0}
        chains: list[list[int]] = []
        row_of: dict[int, tuple[int, int]] = {}
        for end in (i for i in range(len(self.tokens)) if i not in is_parent):
            chain: list[int] = []
            node = end
            while node >= 0:
                chain.append(node)
                node = self.parents[node]
            chain.reverse()
            for offset, node in enumerate(chain):
                row_of.setdefault(node, (len(chains), offset))
            chains.append(chain)
        return chains, row_of


def plan_passes(tree: TokenTree, *, max_nodes: int) -> list[TreeBatch]:
    """Split ``tree`` into forward passes of at most ``max_nodes`` fed nodes each.

    Leaves are taken in depth-first order and each pass holds whole root-to-leaf chains, so a split duplicates
    only the few ancestors two passes share. Every node's log-probability is queried exactly once; the root's
    children are queried in the first pass, which carries the causal tokens.

    Args:
        tree: The compiled tree.
        max_nodes: The largest number of fed nodes per pass (at least the tree's depth).

    Returns:
        The passes, in order.
    """
    children: dict[int, list[int]] = {}
    for node, parent in enumerate(tree.parents):
        children.setdefault(parent, []).append(node)
    chains: list[list[int]] = []
    # Depth first without recursion: a label of a thousand tokens is a chain a thousand nodes deep.
    stack: list[tuple[int, list[int]]] = [(kid, []) for kid in reversed(children.get(-1, []))]
    while stack:
        node, chain = stack.pop()
        kids = children.get(node, [])
        if not kids:
            chains.append(chain)
            continue
        stack.extend((kid, [*chain, node]) for kid in reversed(kids))
    limit = max(max_nodes, max((len(c) for c in chains), default=1))
    groups: list[list[int]] = []
    current: dict[int, None] = {}
    for chain in chains:
        merged = dict(current)
        merged.update(dict.fromkeys(chain))
        if len(merged) > limit and current:
            groups.append(list(current))
            merged = dict.fromkeys(chain)
        current = merged
    groups.append(list(current))

    batches = []
    done: set[int] = set()
    for index, fed in enumerate(groups):
        fed.sort()  # node ids are topological: parents before children
        row = {node: i for i, node in enumerate(fed)}
        query_rows, query_tokens, query_nodes = [], [], []
        sources = ([-1] if index == 0 else []) + fed
        for source in sources:
            for kid in children.get(source, []):
                if kid not in done:
                    done.add(kid)
                    query_rows.append(row.get(source, -1))
                    query_tokens.append(tree.tokens[kid])
                    query_nodes.append(kid)
        batches.append(
            TreeBatch(
                tokens=tuple(tree.tokens[n] for n in fed),
                parents=tuple(row.get(tree.parents[n], -1) for n in fed),
                depths=tuple(tree.depths[n] for n in fed),
                query_rows=tuple(query_rows),
                query_tokens=tuple(query_tokens),
                query_nodes=tuple(query_nodes),
            )
        )
    return batches
