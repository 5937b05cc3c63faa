"""The deciders a user fits: a calibration (:class:`Calibrated`) and a decision head (:class:`Headed`).

Each wraps the fitted value the options carry (a :class:`~pcd_engine.calibrate.calibrator.Calibrator`, a
:class:`~pcd_engine.heads.head.Head`), checks it against the call's schema and model before any model work,
and decides with it. A head decides the fields it has a head for and leaves the others to the decider it falls back
to (the call's calibration, else its correction).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from pcd_engine.deciders.base import Decided, Decider, Lean, LeanReader, Reading, full_distribution, own_distribution
from pcd_engine.schema import FieldSpec, Schema

if TYPE_CHECKING:
    from pcd_engine.calibrate.calibrator import Calibrator, FieldPrior
    from pcd_engine.heads.head import Head

__all__ = ["Calibrated", "Headed"]


class Calibrated(Decider):
    """A fitted calibration: its lean divided out of every closed field, each read whole.

    Args:
        calibrator: The calibration.
    """

    source = "calibration"
    reads_whole = True
    fitted_on_order = True

    def __init__(self, calibrator: Calibrator) -> None:
        self.calibrator = calibrator

    @property
    def name(self) -> str:
        return "calibration"

    def check(self, schema: Schema, model: str) -> None:
        self.calibrator.check(schema, model)

    def corrects(self, spec: FieldSpec, *, strategy: str | None, marginal_max_labels: int) -> bool:
        return True

    def correctable(
        self, spec: FieldSpec, decisions: Sequence[Decided], *, strategy: str | None, marginal_max_labels: int
    ) -> bool:
        return full_distribution(decisions)

    def open_lean(self, schema: Schema, *, strategy: str | None, marginal_max_labels: int, read: LeanReader) -> Lean:
        return Lean(self.source, self.calibrator)

    def threshold(self, spec: FieldSpec) -> float | None:
        prior = self.calibrator.field(spec.name)
        return None if prior is None else prior.min_probability

    def set_cutoff(self, spec: FieldSpec, level: float) -> float | None:
        prior = self.calibrator.field(spec.name)
        return self.calibrator.set_cutoff(spec.name, level) if prior is not None and prior.held_out else None


class Headed(Decider):
    """A decision head: each field it has a head for is decided by the head from the pass's hidden states; the
    others by ``fallback``. The model's own distribution is kept beside the head's.

    Args:
        head: The head.
        fallback: What decides the fields the head has no head for (and what the call reads its lean with).
    """

    source = "head"
    reads_whole = True
    reads_features = True
    fitted_on_order = True

    def __init__(self, head: Head, fallback: Decider) -> None:
        self.head = head
        self.fallback = fallback

    @property
    def name(self) -> str:
        return f"head over {self.fallback.name}"

    @property
    def estimates_on_batch(self) -> bool:  # type: ignore[override]
        return self.fallback.estimates_on_batch

    def check(self, schema: Schema, model: str) -> None:
        self.fallback.check(schema, model)
        self.head.check(schema, model)

    def corrects(self, spec: FieldSpec, *, strategy: str | None, marginal_max_labels: int) -> bool:
        return self.fallback.corrects(spec, strategy=strategy, marginal_max_labels=marginal_max_labels)

    def correctable(
        self, spec: FieldSpec, decisions: Sequence[Decided], *, strategy: str | None, marginal_max_labels: int
    ) -> bool:
        return self.fallback.correctable(spec, decisions, strategy=strategy, marginal_max_labels=marginal_max_labels)

    def open_lean(self, schema: Schema, *, strategy: str | None, marginal_max_labels: int, read: LeanReader) -> Lean:
        return self.fallback.open_lean(schema, strategy=strategy, marginal_max_labels=marginal_max_labels, read=read)

    def small_batch_warning(self, documents: int) -> str | None:
        return self.fallback.small_batch_warning(documents)

    def threshold(self, spec: FieldSpec) -> float | None:
        field_head = self.head.field(spec.name)
        return self.fallback.threshold(spec) if field_head is None else field_head.min_probability

    def set_cutoff(self, spec: FieldSpec, level: float) -> float | None:
        field_head = self.head.field(spec.name)
        if field_head is None:
            return self.fallback.set_cutoff(spec, level)
        return self.head.set_cutoff(spec.name, level) if field_head.held_out else None

    def decide(
        self,
        spec: FieldSpec,
        decisions: Sequence[Decided],
        *,
        lean: FieldPrior | None,
        features: Any,
        strategy: str | None,
        marginal_max_labels: int,
    ) -> Reading:
        """The head's distribution where it has a head for ``spec`` and the features were kept (a single-label
        field of more than one label); else the fallback's reading."""
        field_head = self.head.field(spec.name)
        if field_head is not None and features is not None:
            raw = own_distribution(spec, decisions)  # the fallback reads its own: worked out only where used here
            if spec.kind == "multi":
                return Reading(tuple(field_head.yes(features)), raw, by=self.source, method=self.source)
            if len(raw) > 1:
                return Reading(tuple(field_head.probabilities(features)), raw, by=self.source, method=self.source)
        return self.fallback.decide(
            spec, decisions, lean=lean, features=features, strategy=strategy, marginal_max_labels=marginal_max_labels
        )
