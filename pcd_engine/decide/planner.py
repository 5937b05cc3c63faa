"""Planning: which fields go in which wave, and which tree nodes go in which forward pass.

A *wave* is a set of closed fields decided together in one tree-packed pass; its decisions are then written
into the prompt for the waves after it. By default the first field is an *anchor*, decided alone, and every other field
follows in the next wave; ``depends_on`` adds waves. A *pass* is one forward call: a wave's tree is split into
several passes only when one would exceed the memory budget.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import replace

from pcd_engine.schema import FieldSpec, Schema
from pcd_engine.trees import TokenTree, TreeBatch

__all__ = ["TreeBatch", "one_wave", "plan_passes", "plan_waves"]


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


def plan_passes(
    tree: TokenTree, *, max_nodes: int, queries: Collection[int] | None = None, causal: bool = True
) -> list[TreeBatch]:
    """Split ``tree`` into forward passes of at most ``max_nodes`` fed nodes each.

    Each pass holds whole root-to-parent chains of the nodes it reads, taken in depth-first order, so a split
    duplicates only the few ancestors two passes share. Every queried node's log-probability is read exactly
    once; the root's children are read in the first pass, which carries the causal tokens.

    Args:
        tree: The compiled tree.
        max_nodes: The largest number of fed nodes per pass (at least the tree's depth).
        queries: The nodes whose log-probabilities to read; ``None`` reads every node. Only their ancestors are
            fed, so a staged walk (:mod:`pcd_engine.decide.staging`) reads part of a tree without feeding the rest.
        causal: Whether the first pass carries causal tokens. Without them the root's distribution is not
            available, so no child of the root may be queried.

    Returns:
        The passes, in order (none when nothing is queried).

    Raises:
        ValueError: If ``causal`` is False and a child of the root is queried.
    """
    wanted = set(range(len(tree.tokens))) if queries is None else set(queries)
    if not causal and any(tree.parents[q] < 0 for q in wanted):
        raise ValueError("plan_passes: a child of the root can only be read in a pass with causal tokens.")
    chains, children = _chains(tree, wanted)
    groups = _grouped(chains, limit=max(max_nodes, max((len(c) for c in chains), default=1)))
    batches = []
    done: set[int] = set()
    for index, fed in enumerate(groups):
        fed.sort()  # node ids are topological: parents before children
        row = {node: i for i, node in enumerate(fed)}
        query_rows, query_tokens, query_nodes = [], [], []
        sources = ([-1] if index == 0 else []) + fed
        for source in sources:
            for kid in children.get(source, []):
                if kid in wanted and kid not in done:
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


def _chains(tree: TokenTree, wanted: set[int]) -> tuple[list[list[int]], dict[int, list[int]]]:
    """The root-to-parent chains of the ``wanted`` nodes' fed ancestors, in depth-first order (``[[]]`` when only
    children of the root are wanted), and each fed or wanted node's fed or wanted children, by parent."""
    fed_set: set[int] = set()
    for node in wanted:
        parent = tree.parents[node]
        while parent >= 0 and parent not in fed_set:
            fed_set.add(parent)
            parent = tree.parents[parent]
    children: dict[int, list[int]] = {}
    for node, parent in enumerate(tree.parents):
        if node in fed_set or node in wanted:
            children.setdefault(parent, []).append(node)
    chains: list[list[int]] = []
    # Depth first without recursion: a label of a thousand tokens is a chain a thousand nodes deep.
    stack: list[tuple[int, list[int]]] = [(kid, []) for kid in reversed(children.get(-1, []))]
    while stack:
        node, chain = stack.pop()
        kids = [k for k in children.get(node, []) if k in fed_set or k in wanted] if node in fed_set else []
        if not kids:
            if chain:
                chains.append(chain)
            continue
        stack.extend((kid, [*chain, node]) for kid in reversed(kids))
    if not chains:
        chains = [[]] if any(tree.parents[q] < 0 for q in wanted) else []
    return chains, children


def _grouped(chains: list[list[int]], *, limit: int) -> list[list[int]]:
    """The chains packed, in order, into groups of at most ``limit`` distinct nodes (shared ancestors once)."""
    groups: list[list[int]] = []
    current: dict[int, None] = {}
    for chain in chains:
        merged = dict(current)
        merged.update(dict.fromkeys(chain))
        if len(merged) > limit and current:
            groups.append(list(current))
            merged = dict.fromkeys(chain)
        current = merged
    if chains:
        groups.append(list(current))
    return groups


def one_wave(schema: Schema) -> Schema:
    """The schema with ``depends_on`` dropped, so that with ``anchor=False`` every field is in ONE wave."""
    return replace(
        schema,
        fields=tuple(replace(f, depends_on=()) for f in schema.fields),
        fingerprint=schema.fingerprint + "-flat",
    )
