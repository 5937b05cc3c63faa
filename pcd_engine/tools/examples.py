"""The example presets shipped with pcd: three 28-field schemas, a 255-label catalogue, a customs schema whose 255
tariff categories are long multi-token labels (``CAT_002_Fish_&_Crustaceans``), a mixed ticket schema and an
extraction schema whose text fields are spans of the document."""

from __future__ import annotations

from pathlib import Path

from pcd_engine.errors import SchemaError
from pcd_engine.schema import Preset, load_preset

__all__ = ["EXAMPLE_PRESETS", "example_preset", "example_preset_path"]

_FOLDER = Path(__file__).resolve().parent.parent / "presets"

EXAMPLE_PRESETS: tuple[str, ...] = (
    "support_triage",
    "fintech_fraud",
    "code_security",
    "catalogue_255",
    "customs_255",
    "support_mixed",
    "order_extraction",
)


def example_preset_path(name: str) -> Path:
    """Path of the example preset ``name``.

    Raises:
        SchemaError: If there is no such example.
    """
    if name not in EXAMPLE_PRESETS:
        raise SchemaError(f"Example preset: expected one of {list(EXAMPLE_PRESETS)}, but got {name!r}.")
    return _FOLDER / f"{name}.json"


def example_preset(name: str) -> Preset:
    """Load the example preset ``name`` (see :data:`EXAMPLE_PRESETS`)."""
    return load_preset(example_preset_path(name))
