"""Large label sets: pcd's cost-planned reading against one pass over the whole tree, the first pcd's staged greedy
walk and the model writing the full answer, side by side in one run on the same model and prompt.

Presets: ``catalogue_255`` (255 short labels), ``customs_255`` (255 long labels such as
``CAT_002_Fish_&_Crustaceans``, 8-12 tokens each) and ``benchmarks/presets/parts_1000.json`` (one field of 1,000
``system/part/grade`` labels; too many to list in SmolLM2's 8k window, so every method runs it with
``list_choices`` off). For each preset, with the head warm:

* **pcd**: ``extract`` with default settings (``staging="auto"``: the cost model measured at load decides);
* **one pass**: ``staging="one_pass"``, every label's tokens read in one pass per wave;
* **staged exact**: ``strategy="exact", staging="auto"`` against ``strategy="exact", staging="one_pass"``;
* **walk**: the first pcd's staged greedy walk (:mod:`pcd_engine.tools.greedy_walk`), one pass per label token;
* **full-answer AR**: the model writing exactly as many tokens as pcd's answer as pretty JSON (EOS ignored), from
  the whole prompt (it has no preamble cache; as in every AR column of ``benchmarks/RESULTS.md``).

``agree`` counts the fields whose value equals pcd's. Timings are medians of ``--repeats`` runs.

Usage::

    python benchmarks/bench_staging.py --repeats 3 --threads 1
    python benchmarks/bench_staging.py --presets customs_255 --repeats 5
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pcd_engine import Engine  # noqa: E402
from pcd_engine.schema import load_preset  # noqa: E402
from pcd_engine.tools.comparators import median_ms  # noqa: E402
from pcd_engine.tools.examples import EXAMPLE_PRESETS, example_preset  # noqa: E402
from pcd_engine.tools.greedy_walk import generate_greedy_walk  # noqa: E402
from pcd_engine.tools.terminal import table  # noqa: E402

PRESETS = ["catalogue_255", "customs_255", str(ROOT / "benchmarks/presets/parts_1000.json")]


def bench(engine: Engine, ref: str, repeats: int) -> dict[str, Any]:
    preset = example_preset(ref) if ref in EXAMPLE_PRESETS else load_preset(Path(ref))
    name = Path(ref).stem
    knobs = {"list_choices": False} if name == "parts_1000" else {}
    text, schema = preset.context or "", preset.schema

    def run(**more: Any) -> Any:
        return engine.extract(text, schema, **knobs, **more)

    for setting in ({}, {"staging": "one_pass"}, {"strategy": "exact"}, {"strategy": "exact", "staging": "one_pass"}):
        run(**setting)  # warm: the preamble prefill and the pass-cost measurement are not timed
    out, whole = run(), run(staging="one_pass")
    exact, exact_whole = run(strategy="exact"), run(strategy="exact", staging="one_pass")
    walk = generate_greedy_walk(engine, text, schema, **knobs)
    answer = json.dumps(out.values, indent=2, ensure_ascii=False)[1:]
    tokens = len(engine.tokenizer.encode(answer))
    ids = engine.prompt_for(text, schema, **knobs)
    row = {
        "preset": name,
        "labels": max(len(f.labels) for f in schema.fields),
        "pcd_ms": median_ms(run, repeats),
        "one_pass_ms": median_ms(lambda: run(staging="one_pass"), repeats),
        "exact_ms": median_ms(lambda: run(strategy="exact"), repeats),
        "exact_one_pass_ms": median_ms(lambda: run(strategy="exact", staging="one_pass"), repeats),
        "walk_ms": median_ms(lambda: generate_greedy_walk(engine, text, schema, **knobs), repeats),
        "ar_ms": median_ms(
            lambda: engine.backend.generate_greedy(ids, max_new_tokens=tokens, stop=lambda _: False), repeats
        ),
        "ar_tokens": tokens,
        "nodes": out.stats.nodes_scored,
        "one_pass_nodes": whole.stats.nodes_scored,
        "passes": len(out.stats.documents_per_pass),
        "one_pass_passes": len(whole.stats.documents_per_pass),
        "exact_passes": len(exact.stats.documents_per_pass),
        "walk_passes": walk.forward_passes,
        "same_as_one_pass": out.values == whole.values and exact.values == exact_whole.values,
        "walk_agree": sum(walk.values is not None and walk.values.get(k) == v for k, v in exact.values.items()),
        "fields": len(schema.fields),
    }
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--presets", nargs="*", default=PRESETS)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    parser.add_argument("--model", default=None)
    parser.add_argument("--device", default=None)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    engine = Engine.load(args.model, device=args.device)
    rows = []
    for ref in args.presets:
        print(f"... {Path(ref).stem}", file=sys.stderr, flush=True)
        rows.append(bench(engine, ref, args.repeats))
    cost = engine._pass_cost
    print(f"pass cost: {cost}")
    head = ["preset", "labels", "pcd ms (passes, nodes)", "one pass ms (passes, nodes)", "vs one pass"]
    head += ["exact ms (passes)", "exact one pass ms", "walk ms (passes)", "vs walk", "full-answer AR ms", "vs AR"]
    head += ["same as one pass", "walk agrees with exact"]
    out = []
    for r in rows:
        out.append(
            [
                r["preset"],
                r["labels"],
                f"{r['pcd_ms']:.0f} ({r['passes']}, {r['nodes']})",
                f"{r['one_pass_ms']:.0f} ({r['one_pass_passes']}, {r['one_pass_nodes']})",
                f"{r['one_pass_ms'] / r['pcd_ms']:.1f}x",
                f"{r['exact_ms']:.0f} ({r['exact_passes']})",
                f"{r['exact_one_pass_ms']:.0f}",
                f"{r['walk_ms']:.0f} ({r['walk_passes']})",
                f"{r['walk_ms'] / r['pcd_ms']:.1f}x",
                f"{r['ar_ms']:.0f} ({r['ar_tokens']} tok)",
                f"{r['ar_ms'] / r['pcd_ms']:.1f}x",
                "yes" if r["same_as_one_pass"] else "NO",
                f"{r['walk_agree']}/{r['fields']}",
            ]
        )
    print(table(head, out))
    if args.json:
        Path(args.json).write_text(json.dumps({"pass_cost": str(cost), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
