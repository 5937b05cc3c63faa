"""``python -m pcd_engine [TEXT]``: one real extraction on the embedded default model, printed as a table.

The backend is ``auto`` unless ``PCD_BACKEND`` names one (``torch`` or ``mlx``).
"""

from __future__ import annotations

import os
import sys
from typing import Literal

from pydantic import BaseModel, Field

from pcd_engine import Engine, PCDError
from pcd_engine.tools.terminal import RESULT_COLUMNS, result_rows, shorten, show_table


class Ticket(BaseModel):
    """A customer support ticket."""

    sentiment: Literal["POSITIVE", "NEUTRAL", "NEGATIVE"]
    wants_refund: bool = Field(description="Whether the customer asks for money back")
    deadline: Literal["1_HOUR", "12_HOURS", "1_WEEK", "NONE"]
    topics: list[Literal["billing", "shipping", "account"]]
    summary: str = Field(max_length=80, description="One short sentence on what happened")


EXAMPLE = (
    "I was charged twice for order #5521 and nobody answers my emails. Refund the second charge today or I "
    "will dispute it with my bank."
)


def main(argv: list[str]) -> int:
    text = " ".join(argv) or EXAMPLE
    try:
        engine = Engine.load(backend=os.environ.get("PCD_BACKEND", "auto"))
        out = engine.extract(text, Ticket)
    except PCDError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"text: {shorten(text)}\n")
    show_table(RESULT_COLUMNS, result_rows(out))
    if any(f.raw_probability is not None for f in out.fields.values()):
        print(
            "\n(raw P) is the model's own probability; the other is after dividing out its label lean "
            "(correction='auto', pcd's default; correction='none' turns it off)."
        )
    print(f"\nmodel: {out.model!r}")
    s = out.stats
    print(
        f"forward passes: {s.forward_passes}, waves: {s.waves}, prompt tokens: {s.prompt_tokens} "
        f"({s.cached_tokens} cached), tree nodes: {s.nodes_scored}, total: {s.phases_ms['total']:.0f} ms "
        f"(backend {engine.backend.name}, {engine.backend.scorer} scorer)"
    )
    for w in out.warnings:
        print(f"warning: {w}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
