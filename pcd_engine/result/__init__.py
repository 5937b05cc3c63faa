"""What an extraction returns (:mod:`~pcd_engine.result.evidence`: values, per-field evidence, warnings and
statistics) and how a field's result is built (:mod:`~pcd_engine.result.building`)."""

from __future__ import annotations

from pcd_engine.result.building import abstain, field_result, generated_result, multi_result, scored_result
from pcd_engine.result.evidence import Alternative, ExtractionResult, ExtractionStats, FieldResult, TokenUsage

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
]
