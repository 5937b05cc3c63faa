"""Token trees: the only data the backends consume.

A *token tree* is a set of token sequences that share their prefixes, stored as flat arrays (each node one token,
with its parent and depth). The compiler builds one per wave of closed fields (every label of every field); the
open-row generator grows one per request (one branch per open field). A :class:`TreeBatch` is the part of a tree
fed to one forward pass, with the log-probabilities to read; :meth:`TreeBatch.visibility` is the one definition of
who sees whom that every backend's packed scorer builds its mask and positions from.

This module imports nothing but numpy, so the backends below it never import the schema, the prompt or the
planner.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

__all__ = ["TokenTree", "TreeBatch", "TrieBuilder"]


@dataclass
class TrieBuilder:
    """Grows a token trie from sequences: a node per distinct prefix, shared by every sequence that has it.

    Attributes:
        tokens: Token of each node.
        parents: Parent of each node, or -1 for a child of the root.
        depths: Depth of each node (0 for children of the root).
    """

    tokens: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)
    depths: list[int] = field(default_factory=list)
    _node_of: dict[tuple[int, ...], int] = field(default_factory=dict, repr=False)

    def add(self, sequence: Sequence[int]) -> list[int]:
        """Add ``sequence`` (shared prefixes reuse existing nodes); returns its node ids, root side first."""
        nodes: list[int] = []
        parent = -1
        for depth in range(len(sequence)):
            key = tuple(sequence[: depth + 1])
            node = self._node_of.get(key)
            if node is None:
                node = self._node_of[key] = self.append(parent, int(sequence[depth]))
            nodes.append(node)
            parent = node
        return nodes

    def append(self, parent: int, token: int) -> int:
        """Add one node under ``parent`` (-1: the root) without looking for a shared one; returns its id."""
        self.tokens.append(token)
        self.parents.append(parent)
        self.depths.append(0 if parent < 0 else self.depths[parent] + 1)
        return len(self.tokens) - 1

    def batch(self) -> TreeBatch:
        """The whole trie as a :class:`TreeBatch` with no queries."""
        return TreeBatch(tuple(self.tokens), tuple(self.parents), tuple(self.depths), (), (), ())


@dataclass(frozen=True)
class TokenTree:
    """The token trie of a wave, as flat arrays.

    Attributes:
        tokens: Token id of each node.
        parents: Parent node id of each node, or -1 for children of the root (the last causal token).
        depths: Depth of each node; children of the root have depth 0.
        packed: Ids of the nodes with children, parents before children. These are fed to the model.
    """

    tokens: tuple[int, ...]
    parents: tuple[int, ...]
    depths: tuple[int, ...]
    packed: tuple[int, ...]

    def __len__(self) -> int:
        return len(self.tokens)


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
