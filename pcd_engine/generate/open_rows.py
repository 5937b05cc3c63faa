"""Open fields: generated, not scored, in parallel rows under a JSON Schema constraint.

After the closed fields are decided and written into the prompt, every open field gets a row that starts with
its key and is generated greedily under its value's JSON Schema. All rows advance together, one forward pass
per step for all of them, so a schema with k open fields takes as many steps as its longest value, not the
sum::

    ... {"priority": "HIGH",\\n  "refund": true,   (causal: the closed answers, written)
          |                      |                      |
     \\n  "setup":            \\n  "punchline":      \\n  "rating":       (row prefixes, one trie)
          |                      |                      |
        ' "Why'                ' "Because'            ' 4'            step 1: one pass, three rows
        ' did'                 ' it'                  ','  (done)     step 2
         ...                    ...

The constraint comes from llguidance: each row's value schema is compiled into a Lark grammar
``" " %json{...} ","`` (the value between the key's colon and the comma that ends the line), and the token mask
of each step comes from its matcher. Tokens the grammar forces (a nested object's keys, the quote that closes a
string at its ``maxLength``) are appended with the chosen token, as a chain, without a pass of their own.
llguidance was chosen over outlines-core and xgrammar because it builds
masks lazily from the grammar (no up-front automaton over the whole vocabulary per schema, which for long
``maxLength`` strings or nested objects costs seconds), it covers most of JSON Schema, and it rejects the
keywords it cannot honour instead of ignoring them.
"""

from __future__ import annotations

import json
import math
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pcd_engine.backends.contract import Backend, RequestState
from pcd_engine.errors import SchemaError, require
from pcd_engine.generate.drafting import PromptLookup
from pcd_engine.generate.values import complete_value
from pcd_engine.lru import LRU
from pcd_engine.prompt.alignment import align_lines
from pcd_engine.prompt.chat_prompt import TokenizerView
from pcd_engine.schema import FieldSpec

__all__ = [
    "REPLY_TOKENS",
    "Generated",
    "Grammars",
    "OpenRows",
    "RowPlan",
    "compile_rows",
    "generate_open",
    "generate_reply",
]

REPLY_TOKENS = 256
"""The most tokens a JSON reply (:func:`generate_reply`) takes when its schema sets no ``max_tokens``."""
_JSON_STYLE = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


@dataclass(frozen=True)
class RowPlan:
    """The open rows of a request, aligned with the prompt tail.

    Attributes:
        tail_ids: Token ids of the tail text after the boundary token, as the prompt ends before the rows.
        causal_len: How many of ``tail_ids`` are fed causally; the rest is replaced by each row's prefix.
        prefixes: Per row, the tokens from the end of the causal block through the key's colon.
        leads: Per row, text the grammar must still write before the value (empty unless the tokenizer merged
            the colon with what follows).
    """

    tail_ids: tuple[int, ...]
    causal_len: int
    prefixes: tuple[tuple[int, ...], ...]
    leads: tuple[str, ...]


@dataclass(frozen=True)
class Generated:
    """One open field's generated value.

    Attributes:
        value: The parsed value (``None`` when a cut value could not be completed into a valid one).
        text: The value's JSON text as generated (closed by pcd when it was cut).
        tokens: Tokens written for the row (leading space and the closing comma included).
        mean_logprob: Mean log-probability of the tokens the model chose, under its unconstrained distribution:
            how much the model itself wanted to write them. Tokens the grammar forced (keys of a nested object, a
            closing quote) are left out. Not a calibrated confidence.
        truncated: True when the row hit its token limit before the value was complete.
        valid: True when ``value`` satisfies the field's JSON Schema.
        how: How the value was made: ``"written"`` (complete, as the model wrote it), ``"closed"`` (cut, and closed
            where it was cut), ``"cut back"`` (cut, back to its last complete item), ``"default"`` (nothing written
            could be completed: the field's default), ``"smallest"`` (the same, no default: the smallest value the
            schema accepts, :func:`~pcd_engine.schema.smallest.smallest_value`) or ``"none"`` (no valid value:
            null; a schema whose smallest value cannot be built, such as a ``pattern`` the empty string fails).
    """

    value: Any
    text: str
    tokens: int
    mean_logprob: float
    truncated: bool
    valid: bool
    how: str = "written"


def compile_rows(
    tokenizer: TokenizerView, fields: Sequence[FieldSpec], *, boundary_text: str, tail_text: str
) -> RowPlan:
    """Tokenize each open field's key line after ``boundary_text + tail_text`` and cut it after the colon.

    Args:
        tokenizer: The model's tokenizer.
        fields: The open fields, one row each.
        boundary_text: The special token that starts the tail, or ``""``.
        tail_text: The tail up to where the rows start (closed answers included).

    Returns:
        The row plan.

    Raises:
        PromptAlignmentError: If the rows cannot be aligned with the tail at a token boundary.
    """
    lines = [f"\n  {json.dumps(f.name, ensure_ascii=False)}:" for f in fields]
    # A sample value after the colon makes the tokenizer split the colon the way it will when the value follows.
    aligned = align_lines(
        tokenizer,
        boundary_text=boundary_text,
        tail_text=tail_text,
        lines=lines,
        ends=[len(line) for line in lines],  # just after the colon; a token that crosses it is the model's
        follow=' "",\n',
        through=False,
        names=[f.name for f in fields],
        what="key",
    )
    prefix = boundary_text + tail_text
    leads = tuple((prefix + line)[covered:] for line, covered in zip(lines, aligned.covered, strict=True))
    return RowPlan(aligned.tail_ids, aligned.causal_len, aligned.paths, leads)


class Grammars:
    """llguidance grammars and matchers for a tokenizer, compiled once per (value schema, lead); thread-safe.

    Args:
        tokenizer: The model's Hugging Face fast tokenizer. Masks cover its vocabulary; a wider model output
            is masked beyond it (see :func:`_allowed`).
        capacity: How many grammars to keep; the least recently used are dropped.
    """

    def __init__(self, tokenizer: Any, *, capacity: int = 256) -> None:
        self._hf = tokenizer
        self._tok: Any = None
        self._grammars: LRU[tuple[str, str], str] = LRU(capacity)
        self._lock = threading.Lock()

    @staticmethod
    def _llg() -> Any:
        return require("llguidance", "llguidance.hf", what="Open fields", install="pip install llguidance")[0]

    @property
    def tokenizer(self) -> Any:
        """The llguidance tokenizer (built on first use, about half a second)."""
        with self._lock:
            if self._tok is None:
                llg = self._llg()
                self._tok = llg.hf.from_tokenizer(self._hf)
            return self._tok

    def grammar(self, spec: FieldSpec, lead: str = "", *, whole: bool = False) -> str:
        """The Lark grammar of one row: ``lead``, a space, the value under its JSON Schema, then a comma; or, with
        ``whole``, the value alone (a whole reply that is one JSON value).

        Raises:
            SchemaError: If llguidance cannot compile the field's JSON Schema.
        """
        key = (spec.schema_json or "", "\0whole" if whole else lead)
        hit = self._grammars.get(key)
        if hit is not None:
            return hit
        llg = self._llg()
        value = {**spec.value_schema, "x-guidance": _JSON_STYLE}
        opener = f"{json.dumps(lead)} " if lead else ""
        start = "value" if whole else f'{opener}" " value ","'
        text = f"start: {start}\nvalue: %json {json.dumps(value, ensure_ascii=False)}\n"
        error = llg.LLMatcher.validate_grammar(text, self.tokenizer)
        if error:
            raise SchemaError(
                f"Field {spec.name!r}: expected a JSON Schema the constrained generator (llguidance) can honour, but "
                f"{_refusal(error, spec.value_schema)}."
            )
        self._grammars.put(key, text)  # least recently used grammars go first: a server sees new schemas all day
        return text

    def __len__(self) -> int:
        return len(self._grammars)

    def matcher(self, spec: FieldSpec, lead: str = "", *, whole: bool = False) -> Any:
        """A fresh matcher for one row (see :meth:`grammar`)."""
        llg = self._llg()
        return llg.LLMatcher(self.tokenizer, self.grammar(spec, lead, whole=whole), log_level=0)


@dataclass
class _Row:
    spec: FieldSpec
    matcher: Any
    limit: int
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    truncated: bool = False
    drafted: int = 0  # draft tokens proposed so far (at most ``limit``: rejected ones stay in the cache)
    proposal: list[int] = field(default_factory=list)  # the part of the last proposal not yet checked


def _allowed(matcher: Any, width: int) -> np.ndarray:
    """The matcher's next-token mask as booleans over ``width`` tokens."""
    words = np.frombuffer(matcher.compute_bitmask(), dtype=np.uint8)
    bits = np.unpackbits(words, bitorder="little").astype(bool)
    if len(bits) >= width:
        return bits[:width]
    return np.concatenate([bits, np.zeros(width - len(bits), dtype=bool)])


def _choose(row: _Row, logprobs: np.ndarray) -> tuple[list[int], bool]:
    """Greedy choice under the row's constraint, then the tokens the grammar forces after it (they cost no pass of
    their own); returns the tokens and whether the row ends with them."""
    allowed = _allowed(row.matcher, len(logprobs))
    if not allowed.any():  # the grammar has no way on: end the row and let the caller repair the value
        row.truncated = True
        return [], True
    token = int(np.argmax(np.where(allowed, logprobs, -np.inf)))
    row.matcher.consume_token(token)
    row.tokens.append(token)
    row.logprobs.append(float(logprobs[token]))
    chosen = [token]
    if not row.matcher.is_stopped() and len(row.tokens) < row.limit:
        forced = list(row.matcher.compute_ff_tokens())[: row.limit - len(row.tokens)]
        if forced and row.matcher.consume_tokens(forced):
            row.tokens.extend(forced)
            chosen.extend(forced)
    if row.matcher.is_stopped():
        return chosen, True
    if len(row.tokens) >= row.limit:
        row.truncated = True
        return chosen, True
    return chosen, False


_BOUNDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf")


def _refusal(error: str, schema: Mapping[str, Any]) -> str:
    """What llguidance refused in ``schema``, in words: the pattern it cannot compile and why, number bounds it
    cannot write as a pattern, or its own first line (never its echo of the grammar or a generated regex)."""
    body = error.split("failed to compile JSON schema:", 1)[-1]
    lines = [line.strip() for line in body.splitlines()]
    why = next((line[len("error:") :].strip() for line in lines if line.startswith("error:")), "")
    nodes = [n for n in _nodes(schema) if isinstance(n, Mapping)]
    patterns = [str(n["pattern"]) for n in nodes if "pattern" in n]
    if "regex parse error" in body:
        echoed = lines[1] if len(lines) > 1 else ""
        pattern = next((p for p in patterns if p == echoed), None)
        if pattern is not None:
            return f"it cannot compile the pattern {pattern!r}: {why or 'a regex parse error'}"
    if "regex parse error" in body or "float range" in body:
        bounds = ", ".join(f"{k} {n[k]!r}" for n in nodes for k in _BOUNDS if k in n)
        return (
            f"it cannot write the number bounds ({bounds or 'none given'}) as a pattern to follow"
            f"{f' ({why})' if why else ''}; give bounds with fewer digits, or none"
        )
    return f"it refused the schema: {lines[0] if lines else error.strip()}"


def _nodes(node: Any) -> Iterator[Any]:
    """Every dict and list in a JSON value, itself first."""
    yield node
    children = node.values() if isinstance(node, Mapping) else node if isinstance(node, list) else ()
    for child in children:
        if isinstance(child, (Mapping, list)):
            yield from _nodes(child)


def _finish(row: _Row, tokenizer: TokenizerView, lead: str, *, fill: bool = True) -> Generated:
    """The row's value, by :func:`~pcd_engine.generate.values.complete_value` (``fill``: an open field's; a whole
    reply is only ever closed where it was cut)."""
    raw = tokenizer.decode(row.tokens) if row.tokens else ""
    text = raw[len(lead) :] if raw.startswith(lead) else raw
    text = text.strip()
    if not row.truncated and text.endswith(","):
        text = text[:-1]
    mean = float(np.mean(row.logprobs)) if row.logprobs else -math.inf
    value, shown, valid, how = complete_value(row.spec, text, truncated=row.truncated, fill=fill)
    return Generated(value, shown, len(row.tokens), mean, row.truncated, valid, how)


def generate_open(
    backend: Backend,
    state: RequestState,
    *,
    causal: Sequence[int],
    plan: RowPlan,
    fields: Sequence[FieldSpec],
    grammars: Grammars,
    tokenizer: TokenizerView,
    max_tokens: int,
    check: Callable[[], None] | None = None,
) -> list[Generated]:
    """Generate every open field's value in parallel rows on top of ``state``.

    Args:
        backend: The model backend (see :meth:`~pcd_engine.backends.contract.Backend.generate_rows`).
        state: The request state after the closed fields; it is consumed.
        causal: Tokens to append before the rows (the written closed answers and the tail).
        plan: The row prefixes from :func:`compile_rows`.
        fields: The open fields, in row order.
        grammars: The grammar cache.
        tokenizer: The model's tokenizer, to decode the values.
        max_tokens: Default token limit per value; a field's own ``max_tokens`` wins.
        check: Called before every pass after the first (it raises to stop the rows: a time limit, a
            cancelled request).

    Returns:
        One generated value per field, in order.
    """
    rows = OpenRows.start(plan, fields, grammars, max_tokens)
    backend.generate_rows(state, causal=list(causal), prefixes=plan.prefixes, choose=rows.choose, before_pass=check)
    return rows.values(tokenizer)


class OpenRows:
    """A request's open rows while they grow: each row's grammar matcher, tokens and log-probs, and the drafts
    proposed for them.

    Attributes:
        plan: The row plan (prefixes and leads).
        lookup: The drafter's source (``None``: the rows are not drafted).
        drafted: Draft tokens proposed so far, over all rows.
        accepted: Draft tokens the model chose as they were proposed.
    """

    def __init__(self, plan: RowPlan, rows: list[_Row], lookup: PromptLookup | None = None) -> None:
        self.plan = plan
        self._rows = rows
        self.lookup = lookup
        self.drafted = 0
        self.accepted = 0

    @classmethod
    def start(
        cls,
        plan: RowPlan,
        fields: Sequence[FieldSpec],
        grammars: Grammars,
        max_tokens: int,
        *,
        context: Sequence[int] = (),
        draft_tokens: int = 0,
    ) -> OpenRows:
        """One row per open field, each under its grammar, with its token limit (a field's own ``max_tokens``
        wins over ``max_tokens``).

        Args:
            plan: The row plan.
            fields: The open fields, in row order.
            grammars: The grammar cache.
            max_tokens: Default token limit per value.
            context: The prompt's token ids, which drafts are copied from.
            draft_tokens: The most draft tokens proposed per row and pass (0: no drafts).
        """
        rows = [
            _Row(spec, grammars.matcher(spec, lead), spec.token_limit(max_tokens))
            for spec, lead in zip(fields, plan.leads, strict=True)
        ]
        lookup = PromptLookup(context, max_draft=draft_tokens) if draft_tokens > 0 and context else None
        return cls(plan, rows, lookup)

    @property
    def fields(self) -> list[FieldSpec]:
        """The open fields, in row order."""
        return [row.spec for row in self._rows]

    @property
    def grown(self) -> int:
        """The most tokens the rows can add to the cache: every prefix and every row's token limit (twice when
        drafted: a row's draft tokens are at most its limit)."""
        per_row = 2 if self.lookup is not None else 1
        return sum(len(p) for p in self.plan.prefixes) + per_row * sum(row.limit for row in self._rows)

    def choose(self, row: int, logprobs: np.ndarray) -> tuple[list[int], bool]:
        """The :data:`~pcd_engine.backends.contract.Chooser` of these rows (it also counts the draft tokens it
        agrees with: the backend reads a draft's next position only while every choice equals the draft)."""
        mine = self._rows[row]
        chosen, done = _choose(mine, logprobs)
        if mine.proposal:
            agreed = 0
            while agreed < min(len(chosen), len(mine.proposal)) and chosen[agreed] == mine.proposal[agreed]:
                agreed += 1
            self.accepted += agreed
            mine.proposal = mine.proposal[agreed:] if agreed == len(chosen) else []
        return chosen, done

    def draft(self, row: int, tokens: Sequence[int]) -> list[int]:
        """The :data:`~pcd_engine.generate.drafting.Drafter` of these rows: the continuation of ``tokens`` found in the
        context, cut where the row's grammar would refuse it, at the row's token limit, and once the row has been
        proposed as many tokens as its limit."""
        mine = self._rows[row]
        room = min(mine.limit - len(mine.tokens), mine.limit - mine.drafted)
        if self.lookup is None or room < 1 or mine.matcher.is_stopped():
            return []
        proposal = self.lookup(tokens, limit=room)
        proposal = proposal[: mine.matcher.validate_tokens(proposal)] if proposal else []
        mine.drafted += len(proposal)
        self.drafted += len(proposal)
        mine.proposal = list(proposal)
        return proposal

    def values(self, tokenizer: TokenizerView) -> list[Generated]:
        """Each row's value, in field order."""
        return [_finish(row, tokenizer, lead) for row, lead in zip(self._rows, self.plan.leads, strict=True)]


def generate_reply(
    backend: Backend,
    ids: Sequence[int],
    *,
    spec: FieldSpec,
    grammars: Grammars,
    tokenizer: TokenizerView,
    check: Callable[[], None] | None = None,
) -> Generated:
    """Generate a whole reply that is one JSON value under ``spec``'s schema, greedily, after the prompt ``ids``
    (a chat prompt ending with the assistant turn's opening): one row, one token per pass, forced tokens free.

    Args:
        backend: The model backend.
        ids: The prompt's token ids (at least two).
        spec: An open field whose schema the reply follows; its ``max_tokens`` bounds the reply.
        grammars: The grammar cache.
        tokenizer: The model's tokenizer, to decode the reply.
        check: Called before every pass after the first (it raises to stop: a time limit, a cancelled request).

    Returns:
        The reply's value, text, tokens and whether it was cut.
    """
    row = _Row(spec, grammars.matcher(spec, whole=True), spec.token_limit(REPLY_TOKENS))
    state = backend.start(backend.prefill(list(ids[:-1])))

    def choose(_r: int, logprobs: np.ndarray) -> tuple[list[int], bool]:
        return _choose(row, logprobs)

    backend.generate_rows(state, causal=[], prefixes=[[ids[-1]]], choose=choose, before_pass=check)
    return _finish(row, tokenizer, "", fill=False)  # a reply cut short says so (finish reason "length"), unfilled
