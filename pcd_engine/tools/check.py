"""``pcd check``: does this model work with pcd? Conformance checks run on the real model, not a test double.

Each check returns a :class:`Check`; none raises for a failed comparison, so the caller can print a table and exit
non-zero when any failed:

* ``packed = one at a time``: every label path of a field set with shared prefixes and integer labels, scored
  tree-packed in one pass, equals the backend's plain reference (:meth:`PlainReference.sequence_logprobs`: one causal
  pass over prompt + path, no cache, no tree mask, default positions);
* ``cached preamble untouched``: scoring the same wave twice from one cached preamble gives the same log-probs, and the
  request state holds only its causal tokens afterwards;
* ``split passes = one pass``: the same tree split into passes of 5 nodes gives the same log-probs;
* ``example presets compile``: each example preset's prompt renders with the model's chat template and every
  field's trie compiles and aligns with the prompt tail;
* ``one extraction``: a real extract on an example preset returns every key with an allowed value, with the
  expected number of forward passes.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from pcd_engine.backends.capabilities import plain_reference
from pcd_engine.decide.compiler import compile_wave, questions
from pcd_engine.decide.planner import plan_passes
from pcd_engine.errors import OptionError, PCDError, PromptAlignmentError
from pcd_engine.generate.open_rows import compile_rows
from pcd_engine.prompt.alignment import tail_tokens
from pcd_engine.prompt.chat_prompt import ChatPrompt, TokenizerView
from pcd_engine.schema import compile_schema
from pcd_engine.tools.examples import EXAMPLE_PRESETS, example_preset

if TYPE_CHECKING:
    from pcd_engine.backends.contract import Backend
    from pcd_engine.engine import Engine

__all__ = [
    "CHECKS",
    "PROBE",
    "PROBE_TEXT",
    "BackendReport",
    "Check",
    "check_backend",
    "compile_preset",
    "default_tolerance",
    "run_checks",
]

PROBE_TEXT = "The parcel arrived two weeks late and the box was crushed. I would like a refund within 12 hours, please."
# The probe (also the test suite's conformance probe): labels that share token prefixes ("12_HOURS" / "1_HOUR",
# 1 / 12 / 123, "angry" / "angr"), so a wrong ancestor mask or a wrong depth position shows up as a different
# log-prob; and an optional field's null.
PROBE = {
    "deadline": {"type": "enum", "choices": ["1_HOUR", "12_HOURS", "1_WEEK", "NONE"]},
    "refund": {"type": "boolean", "description": "Asks for money back"},
    "level": {"type": "enum", "choices": [1, 12, 123, 2]},
    "tone": {"type": "enum", "choices": ["angry", "angr", "calm"]},
    "carrier": {"type": "enum", "choices": ["dhl", "ups", None]},
}


@dataclass(frozen=True)
class Check:
    """The outcome of one check.

    Attributes:
        name: What was checked.
        passed: Whether it passed.
        detail: The measured figure or the reason for a failure, in words.
        ms: Wall time of the check.
    """

    name: str
    passed: bool
    detail: str
    ms: float


def default_tolerance(backend: Backend) -> float:
    """The allowed log-prob difference when none is given: 2e-3 for fp32 weights, 0.15 for half precision and
    quantized weights (their reference pass rounds differently from a cached, packed one)."""
    return 2e-3 if plain_reference(backend, "to check against").weights_dtype == "float32" else 0.15


def _probe(engine: Engine) -> dict[str, Any]:
    """Score the probe's single wave tree-packed, pass by pass, the way the engine does."""
    backend, tv = engine.backend, engine.tokenizer
    schema = compile_schema(PROBE)
    prompt = ChatPrompt.build(tv, schema)
    ids = prompt.request_ids(tv, PROBE_TEXT)
    wave = compile_wave(tv, schema.fields, boundary_text=prompt.boundary_text, tail_text=prompt.tail_text)
    causal_end = len(ids) - len(wave.tail_ids) + wave.causal_len
    prefix = backend.prefill(prompt.preamble_ids)

    def score(max_nodes: int) -> tuple[np.ndarray, Any, int]:
        state = backend.start(prefix)
        pending = list(ids[len(prompt.preamble_ids) : causal_end])
        logprobs = np.full(len(wave.tree), np.nan)
        passes = plan_passes(wave.tree, max_nodes=max_nodes)
        for batch in passes:
            logprobs[list(batch.query_nodes)] = backend.score_tree(state, causal=pending, batch=batch)
            pending = []
        return logprobs, state, len(passes)

    return {"context": ids[:causal_end], "wave": wave, "score": score}


def _packed_vs_reference(engine: Engine, probe: dict[str, Any]) -> tuple[bool, str]:
    logprobs, _, passes = probe["score"](100_000)
    wave, context = probe["wave"], probe["context"]
    worst, paths = 0.0, 0
    for trie in wave.fields:
        for path in trie.paths:
            tokens = [wave.tree.tokens[n] for n in path.nodes]
            reference = plain_reference(engine.backend, "to check against").sequence_logprobs(list(context) + tokens)[
                -len(tokens) :
            ]
            worst = max(worst, float(np.abs(logprobs[list(path.nodes)] - reference).max()))
            paths += 1
    tol = probe["tol"]
    ok = passes == 1 and worst <= tol
    return ok, f"{paths} paths in {passes} pass(es), largest difference {worst:.1e} (tolerance {tol:.0e})"


def _preamble_untouched(engine: Engine, probe: dict[str, Any]) -> tuple[bool, str]:
    first, _, _ = probe["score"](100_000)
    again, state, _ = probe["score"](100_000)
    diff = float(np.abs(first - again).max())
    length_ok = state.length == len(probe["context"])
    ok = diff <= 1e-5 and length_ok
    detail = f"second request from the same cached preamble: largest difference {diff:.1e}; state length {state.length}"
    return ok, detail + ("" if length_ok else f" (expected {len(probe['context'])})")


def _split_passes(engine: Engine, probe: dict[str, Any]) -> tuple[bool, str]:
    one, _, _ = probe["score"](100_000)
    split, _, passes = probe["score"](5)
    diff = float(np.abs(one - split).max())
    tol = probe["tol"]
    return passes > 1 and diff <= tol, f"{passes} passes of <= 5 nodes: largest difference {diff:.1e}"


def compile_preset(tokenizer: TokenizerView, name: str) -> int:
    """Render example preset ``name`` with the tokenizer's chat template, check that its document leaves the tail's
    tokens as compiled, and compile every closed field's trie and every open field's rows.

    Args:
        tokenizer: The model's tokenizer.
        name: One of :data:`~pcd_engine.tools.examples.EXAMPLE_PRESETS`.

    Returns:
        The number of trie nodes of the preset's closed fields.

    Raises:
        PromptAlignmentError: If the template, the document or a label does not tokenize as compiled.
        SchemaError: If a field cannot be compiled.
    """
    preset = example_preset(name)
    prompt = ChatPrompt.build(tokenizer, preset.schema)
    tail0, skip = tail_tokens(tokenizer, prompt.boundary_text, prompt.tail_text)
    ids = prompt.request_ids(tokenizer, preset.context or PROBE_TEXT)
    if tuple(ids[len(ids) - len(tail0) + skip :]) != tuple(tail0[skip:]):
        raise PromptAlignmentError(
            f"Preset {name!r}: expected the tail's tokens after the document, but it changed them."
        )
    closed = [q for f in preset.schema.fields if f.scored for q in questions(f) if len(q.labels) > 1]
    wave = compile_wave(tokenizer, closed, boundary_text=prompt.boundary_text, tail_text=prompt.tail_text)
    opened = [f for f in preset.schema.fields if not f.scored]
    if opened:
        compile_rows(tokenizer, opened, boundary_text=prompt.boundary_text, tail_text=prompt.tail_text)
    return len(wave.tree)


def _presets_compile(engine: Engine, probe: dict[str, Any]) -> tuple[bool, str]:
    tv = engine.tokenizer
    nodes = 0
    for name in EXAMPLE_PRESETS:
        try:
            nodes += compile_preset(tv, name)
        except PromptAlignmentError as exc:
            return False, str(exc)
    folded = ChatPrompt.build(tv, compile_schema(PROBE)).system_folded  # the template's, whatever the schema
    note = " (no system role: instructions in the user turn)" if folded else ""
    return True, f"{len(EXAMPLE_PRESETS)} presets, {nodes} trie nodes{note}"


def _one_extraction(engine: Engine, probe: dict[str, Any]) -> tuple[bool, str]:
    preset = example_preset("support_triage")
    out = engine.extract(preset.context or PROBE_TEXT, preset.schema)
    fields = preset.schema.fields
    grade = preset.schema.grade(out.values)
    if not grade.valid:
        return False, f"missing {grade.having('missing')}, invalid {grade.having('invalid')}, extra {list(grade.extra)}"
    return True, (
        f"{len(fields)} fields, {out.stats.forward_passes} forward passes, {out.stats.phases_ms['total']:.0f} ms, "
        f"{len(out.low_confidence())} low-confidence"
    )


CHECKS: tuple[tuple[str, Callable[[Any, dict[str, Any]], tuple[bool, str]]], ...] = (
    ("packed = one at a time", _packed_vs_reference),
    ("cached preamble untouched", _preamble_untouched),
    ("split passes = one pass", _split_passes),
    ("example presets compile", _presets_compile),
    ("one extraction", _one_extraction),
)


def run_checks(engine: Engine, *, tol: float | None = None) -> Iterator[Check]:
    """Run every check of :data:`CHECKS` on ``engine``'s model, yielding each result as soon as it is known.

    A check that raises a :class:`~pcd_engine.errors.PCDError` fails with the error's message; the probe that
    the first three checks share is built once, and if it cannot be built they all fail with that reason.

    Args:
        engine: A loaded :class:`~pcd_engine.engine.Engine`.
        tol: The largest log-prob difference the comparisons allow; ``None`` for :func:`default_tolerance`.

    Yields:
        One :class:`Check` per entry of :data:`CHECKS`, in order.

    Raises:
        OptionError: If ``tol`` is not a positive number.
    """
    tolerance = _checked_tolerance(engine, tol)
    probe: dict[str, Any] | None = None
    problem = ""
    try:
        probe = {**_probe(engine), "tol": tolerance}
    except PCDError as exc:
        problem = str(exc)
    for name, run in CHECKS:
        started = time.perf_counter()
        if probe is None and run in (_packed_vs_reference, _preamble_untouched, _split_passes):
            yield Check(name, False, problem, 0.0)
            continue
        try:
            passed, detail = run(engine, probe or {})
        except PCDError as exc:
            passed, detail = False, str(exc)
        yield Check(name, passed, detail, (time.perf_counter() - started) * 1000)


def _checked_tolerance(engine: Engine, tol: float | None) -> float:
    if tol is None:
        return default_tolerance(engine.backend)
    if isinstance(tol, bool) or not isinstance(tol, int | float) or not tol > 0:
        raise OptionError(f"tol: expected a positive number, but got {tol!r}.")
    return float(tol)


@dataclass(frozen=True)
class BackendReport:
    """What :func:`check_backend` found.

    Attributes:
        backend: The backend's name (``"torch"``, ``"mlx"``, or a custom one).
        scorer: ``"packed"`` or ``"rows"``.
        weights_dtype: The weights' dtype, which sets the default tolerance.
        tolerance: The log-prob tolerance the comparisons used.
        checks: Every check's outcome, in the order of :data:`CHECKS`.
    """

    backend: str
    scorer: str
    weights_dtype: str
    tolerance: float
    checks: tuple[Check, ...]

    @property
    def passed(self) -> bool:
        """Whether every check passed."""
        return all(c.passed for c in self.checks)

    @property
    def failures(self) -> tuple[Check, ...]:
        """The checks that failed."""
        return tuple(c for c in self.checks if not c.passed)

    def to_json(self) -> dict[str, Any]:
        """The report as plain JSON data (``pcd check --json``)."""
        return {
            "backend": self.backend,
            "scorer": self.scorer,
            "weights_dtype": self.weights_dtype,
            "tolerance": self.tolerance,
            "passed": self.passed,
            "checks": [asdict(c) for c in self.checks],
        }

    def __str__(self) -> str:
        lines = [f"{self.backend} backend ({self.scorer} scorer, {self.weights_dtype}, tolerance {self.tolerance:.0e})"]
        lines += [f"  {'pass' if c.passed else 'FAIL'}  {c.name}: {c.detail}" for c in self.checks]
        lines.append(f"{len(self.checks) - len(self.failures)}/{len(self.checks)} checks passed")
        return "\n".join(lines)


def check_backend(
    engine: Engine, *, tol: float | None = None, on_check: Callable[[Check], None] | None = None
) -> BackendReport:
    """Check that a model and backend work with pcd: the conformance checks of ``pcd check``, as an API.

    Use it on your own model, or on your own :class:`~pcd_engine.backends.contract.Backend` subclass: packed scoring
    must equal the backend's plain one-sequence reference within ``tol``, the cached preamble must stay untouched,
    split passes must equal one pass, the example presets must compile with the model's chat template, and a real
    extraction must return every key with a valid value. A failed comparison is reported, never raised.

    Args:
        engine: An engine on the model and backend to check.
        tol: The largest log-prob difference the comparisons allow; ``None`` for :func:`default_tolerance`.
        on_check: Called with each :class:`Check` as soon as it finishes (progress for long checks).

    Returns:
        A :class:`BackendReport`; ``report.passed`` says whether everything passed.

    Raises:
        OptionError: If ``tol`` is not a positive number.
    """
    tolerance = _checked_tolerance(engine, tol)
    checks = []
    for check in run_checks(engine, tol=tolerance):
        checks.append(check)
        if on_check is not None:
            on_check(check)
    backend = engine.backend
    return BackendReport(
        backend=backend.name,
        scorer=str(getattr(backend, "scorer", "packed")),
        weights_dtype=plain_reference(backend, "to check against").weights_dtype,
        tolerance=tolerance,
        checks=tuple(checks),
    )
