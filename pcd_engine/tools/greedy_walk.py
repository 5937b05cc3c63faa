"""The first pcd's staged greedy walk, as a baseline for large label sets (``pcd bench --against walk``).

Each closed question walks down its token trie one level per forward pass, and at each level expands only the
subtree of its most probable token: pass 1 reads every question's first distinguishing tokens, pass 2 the children
of each question's best one, and so on until every question stands on a label's last token. All questions walk
together (one tree-packed pass per level, on pcd's own prompt and cached preamble), so the walk feeds few nodes but
needs as many passes as the deepest label is long, and, being greedy, its winner can differ from the best full
label. Open fields are then generated as pcd generates them.
"""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any

import numpy as np

from pcd_engine.decide.decoding import Decision
from pcd_engine.decide.planner import one_wave, plan_passes
from pcd_engine.run.request import Request
from pcd_engine.schema import compile_schema
from pcd_engine.tools.baseline import BaselineResult

if TYPE_CHECKING:
    from pcd_engine.engine import Engine

__all__ = ["generate_greedy_walk"]


def generate_greedy_walk(
    engine: Engine, text: str, schema: Any, *, max_new_tokens: int | None = None, **knobs: Any
) -> BaselineResult:
    """Decide ``schema`` on ``text`` by the staged greedy walk (every field in one wave, no anchor).

    Args:
        engine: A loaded engine.
        text: The document.
        schema: Anything :func:`~pcd_engine.schema.compile_schema` accepts.
        max_new_tokens: The most tokens per open field (the engine's default when ``None``).
        **knobs: Further options of the call (:class:`~pcd_engine.options.ExtractOptions` fields, such as the
            prompt format); ``anchor`` is always off.

    Returns:
        The values (always valid: the walk ends on a label), the passes run and the wall time.
    """
    tick = time.perf_counter()
    flat = one_wave(compile_schema(schema))
    call = engine.resolve(None, **{**knobs, "anchor": False, "max_tokens": max_new_tokens})
    before = engine.backend.thread_passes
    request = Request.open(engine, flat, call, text)
    if request.waves:
        asked = request.asked(0)
        request.record_wave(0, asked, _walk(request, asked) if asked else [])
    request.generate()
    values = {spec.name: request.results[spec.name].value for spec in flat.fields}
    return BaselineResult(
        text=json.dumps(values, ensure_ascii=False),
        values=values,
        valid=True,
        errors=(),
        tokens=request.generated_tokens,
        forward_passes=engine.backend.thread_passes - before,
        ms=(time.perf_counter() - tick) * 1000,
    )


def _walk(request: Request, asked: list[Any]) -> list[Decision]:
    """Walk every question's trie greedily, one level per pass; one decision (the reached label) per question."""
    engine = request.engine
    wave = engine.cache.wave(request.schema, request.prompt.chat, [q for _, q in asked], request.tail_text)
    request.extend(wave.tail_ids, wave.causal_len, where="Greedy walk", need_new=True)
    tree = wave.tree
    children: dict[int, list[int]] = {}
    for node, parent in enumerate(tree.parents):
        children.setdefault(parent, []).append(node)
    logprobs = np.full(len(tree), np.nan)
    at: list[int] = []  # the node each question stands on
    own: list[set[int]] = []  # each question's nodes
    ends: list[dict[int, int]] = []  # each question's last nodes, to their labels
    for trie in wave.fields:
        first = trie.paths[0].nodes
        at.append(first[trie.decision_depth - 1] if trie.decision_depth else -1)
        own.append({n for p in trie.paths for n in p.nodes})
        ends.append({p.nodes[-1]: p.label for p in trie.paths})
    chosen: list[int | None] = [None] * len(wave.fields)
    causal = True
    while any(c is None for c in chosen):
        step = {i: [k for k in children.get(at[i], []) if k in own[i]] for i, c in enumerate(chosen) if c is None}
        queries = {k for kids in step.values() for k in kids}
        max_nodes = request.budget.max_nodes(request.state.length, len(request.pending))
        request.score(plan_passes(tree, max_nodes=max_nodes, queries=queries, causal=causal), logprobs, 0)
        causal = False
        for i, kids in step.items():
            best = max(kids, key=lambda k: logprobs[k])
            if best in ends[i]:
                chosen[i] = ends[i][best]
            else:
                at[i] = best
    out = []
    for trie, label in zip(wave.fields, chosen, strict=True):
        assert label is not None
        probs = tuple(1.0 if li == label else 0.0 for li in range(len(trie.spec.labels)))
        out.append(Decision(label=label, probabilities=probs, candidate_mass=None, method="greedy_walk"))
    return out
