"""``pcd bench``: pcd measured against its baselines on presets, side by side in one run on the same model and
the same prompt.

pcd's ``extract`` (default settings, every field in one wave, and every label read in one pass) runs against each
baseline
(:data:`~pcd_engine.tools.comparators.BASELINES`), with tokens, validity, agreement of the fields and speed-ups.
Timings are medians of wall time. The first pcd call of a schema prefills its head and is not timed; outlines'
one-off index compilation is reported apart (``setup_ms``), so both are compared warm.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pcd_engine.decide.planner import one_wave
from pcd_engine.errors import OptionError, check_count
from pcd_engine.schema import Preset
from pcd_engine.tools.comparators import BASELINES, BaselineRun, Progress, median_ms, ready

if TYPE_CHECKING:
    from pcd_engine.engine import Engine

__all__ = ["BenchRow", "bench_presets"]


@dataclass(frozen=True)
class BenchRow:
    """pcd and its baselines on one preset.

    Attributes:
        preset: The preset's name.
        fields: Number of fields.
        labels: Number of labels over all fields.
        pcd_ms: Median ms of ``extract`` with default settings (warm preamble).
        passes: Forward passes of one default-settings extract.
        one_pass_ms: Median ms with ``anchor=False`` and ``depends_on`` dropped: every field in ONE pass.
        values: pcd's default-settings values.
        baselines: One entry per baseline, in the order asked.
        full_answer_ms: AR writing exactly as many tokens as pcd's answer as pretty JSON (EOS ignored), when AR
            was asked for; a weak model's AR run can stop early and invalid, which would flatter it.
        full_answer_tokens: The token count of that answer.
        no_draft_ms: Median ms of ``extract`` with drafts off (``draft_tokens=0``), when the preset has open
            fields.
        tokens_per_step: Generated tokens per generation pass of one default-settings extract (drafts on).
        accepted_tokens: Draft tokens the model kept in that extract.
        unstaged_ms: Median ms with ``staging="one_pass"``: every label's tokens read in one pass (see
            :mod:`pcd_engine.decide.staging`).
        nodes_scored: Tree nodes fed in one default-settings extract.
        nodes_saved: Tree nodes that extract did not feed, against one pass over every wave's whole tree.
        stage_passes: Later-stage passes of that extract.
    """

    preset: str
    fields: int
    labels: int
    pcd_ms: float
    passes: int
    one_pass_ms: float
    values: dict[str, Any]
    baselines: tuple[BaselineRun, ...]
    full_answer_ms: float | None = None
    full_answer_tokens: int | None = None
    no_draft_ms: float | None = None
    tokens_per_step: float = 0.0
    accepted_tokens: int = 0
    unstaged_ms: float = 0.0
    nodes_scored: int = 0
    nodes_saved: int = 0
    stage_passes: int = 0

    def to_json(self) -> dict[str, Any]:
        """The row as plain JSON-ready data."""
        return dataclasses.asdict(self)


def bench_presets(
    engine: Engine,
    presets: Sequence[tuple[str, Preset]],
    *,
    against: Sequence[str] = ("ar",),
    repeats: int = 3,
    progress: Progress | None = None,
    on_row: Callable[[BenchRow], None] | None = None,
) -> list[BenchRow]:
    """Time pcd and each baseline on each preset's own example text, in one run.

    Args:
        engine: A loaded engine (outlines needs the torch backend).
        presets: ``(name, preset)`` pairs; every preset needs a ``context``.
        against: Baseline names from :data:`BASELINES`.
        repeats: Timed runs per method (medians are reported).
        progress: Called with a short description before each timed step.
        on_row: Called with each preset's row as soon as it is measured (the command line prints it then, so a
            run cut short keeps what it measured).

    Returns:
        One row per preset.

    Every preset is extracted once before anything is timed (which also prefills its head), so one that cannot run
    fails at once rather than after the presets before it were timed.

    Raises:
        OptionError: If ``repeats`` < 1, a baseline is unknown, or a preset has no example text.
        PCDError: If a preset cannot be extracted (for example :class:`~pcd_engine.errors.ContextError` when its
            prompt does not fit the model's window), before any timing.
        BackendUnavailableError: If a baseline cannot run on this engine (outlines needs torch and outlines).
    """
    check_count(repeats, "repeats", optional=False)
    ready(engine, against)
    tick = progress or (lambda _: None)
    for name, preset in presets:
        if not preset.context:
            raise OptionError(f"Preset {name!r}: expected a 'context' example text to benchmark on, but it has none.")
    for _name, preset in presets:  # a preset that cannot run (too long for the window...) fails before any timing
        engine.extract(preset.context or "", preset.schema)
    rows = []
    for name, preset in presets:
        rows.append(_bench_one(engine, name, preset, against, repeats, tick))
        if on_row is not None:
            on_row(rows[-1])
    return rows


def _bench_one(
    engine: Engine, name: str, preset: Preset, against: Sequence[str], repeats: int, tick: Progress
) -> BenchRow:
    text, schema = preset.context or "", preset.schema
    flat = one_wave(schema)
    tick(f"{name}: pcd")
    engine.extract(text, schema)  # prefill the heads: later calls are the warm steady state
    engine.extract(text, flat, anchor=False)
    out = engine.extract(text, schema)
    pcd_ms = median_ms(lambda: engine.extract(text, schema), repeats)
    one_ms = median_ms(lambda: engine.extract(text, flat, anchor=False), repeats)
    unstaged_ms = median_ms(lambda: engine.extract(text, schema, staging="one_pass"), repeats)
    no_draft_ms = None
    if out.stats.generation_passes:
        no_draft_ms = median_ms(lambda: engine.extract(text, schema, draft_tokens=0), repeats)
    runs = []
    full_ms = full_tokens = None
    for method in against:
        tick(f"{name}: {method}")
        results = [BASELINES[method](engine, text, schema) for _ in range(repeats)]
        first, ms = results[0], statistics.median(r.ms for r in results)
        written = first.values or {}
        runs.append(
            BaselineRun(
                method=method,
                ms=ms,
                tokens=first.tokens,
                forward_passes=first.forward_passes,
                valid=first.valid,
                errors=first.errors,
                agree=sum(1 for k, v in out.values.items() if k in written and written[k] == v),
                setup_ms=max(r.setup_ms for r in results),
                speedup=ms / pcd_ms,
            )
        )
    if "ar" in against:
        tick(f"{name}: full-answer AR")
        answer = json.dumps(out.values, indent=2, ensure_ascii=False)[1:]
        full_tokens = len(engine.tokenizer.encode(answer))
        ids = engine.prompt_for(text, schema)
        full_ms = median_ms(
            lambda: engine.backend.generate_greedy(ids, max_new_tokens=full_tokens, stop=lambda _: False), repeats
        )
    return BenchRow(
        preset=name,
        fields=len(schema.fields),
        labels=sum(len(f.labels) for f in schema.fields),
        pcd_ms=pcd_ms,
        passes=out.stats.forward_passes,
        one_pass_ms=one_ms,
        values=dict(out.values),
        baselines=tuple(runs),
        full_answer_ms=full_ms,
        full_answer_tokens=full_tokens,
        no_draft_ms=no_draft_ms,
        tokens_per_step=out.stats.tokens_per_step,
        accepted_tokens=out.stats.accepted_tokens,
        unstaged_ms=unstaged_ms,
        nodes_scored=out.stats.nodes_scored,
        nodes_saved=out.stats.nodes_saved,
        stage_passes=out.stats.stage_passes,
    )
