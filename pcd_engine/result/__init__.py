"""What an extraction returns (:mod:`~pcd_engine.result.evidence`: values, per-field evidence, warnings and
statistics), how a field's result is built (:mod:`~pcd_engine.result.building`), then abstained or given a
prediction set (:mod:`~pcd_engine.result.trust`)."""

from __future__ import annotations

from pcd_engine.result.building import field_result, generated_result, multi_result, scored_result
from pcd_engine.result.evidence import Alternative, ExtractionResult, ExtractionStats, FieldResult, TokenUsage
from pcd_engine.result.trust import abstain, with_prediction_sets

__all__ = [
    "Alternative",
    "ExtractionResult",
    "ExtractionStats",
    "FieldResult",
    "TokenUsage",
    "abstain",
    "field_result",
    "generated_result",
    "multi_result",
    "scored_result",
    "with_prediction_sets",
]
