"""Decision models (issue 47): a request of 1, 8 and 32 typed questions over a support ticket, asked three ways on
the embedded model, and a batch of 64 states against a loop.

* ``PCDDecisionModel.invoke``: every question one closed field of one schema, decided in one pass per wave;
* ``ChatPCD.with_structured_output`` of the same fields as a JSON Schema: the same engine path, through the chat
  model (the conversation read as the document);
* AR: the model writing the answers as a JSON object, token by token, after the same prompt
  (:func:`pcd_engine.tools.baseline.generate_baseline`), whose validity is reported.

Each cell is the median of ``--repeats`` runs, the three ways alternating so that the machine's noise falls on all
alike; passes are the forward passes each way ran (the schema's cached preamble is prefilled once, before the
timed runs). The batch rows decide ``--states`` tickets with the same questions in one ``batch`` and one by one.

    .venv/bin/python benchmarks/bench_decisions.py --repeats 3 --states 64
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from langchain_core.decisions import Choice, Noul, Score  # noqa: E402

from pcd_engine import Engine, questions_schema  # noqa: E402
from pcd_engine.tools.baseline import generate_baseline  # noqa: E402
from pcd_integrations.langchain import ChatPCD, PCDDecisionModel  # noqa: E402
from pcd_integrations.langchain.decision_model import engine_questions  # noqa: E402

TICKET = (
    "Hi, Stripe has failed to connect to my account for three days and I was charged twice for the pro plan. "
    "I need this fixed today, my shop is losing orders. Order 5521."
)
TEAMS = {"billing and payments": "Charges, invoices, refunds.", "technical support": "Bugs and integrations.",
         "sales": "Plans and pricing.", "account security": "Logins and access."}  # fmt: skip
TOPICS = ["the payment provider", "a duplicate charge", "a login problem", "shipping", "the mobile app", "pricing",
          "a refund", "data export"]  # fmt: skip
STATES = [
    "My invoice shows the wrong VAT number.", "The app crashes when I open settings.", "Can I get a discount for a "
    "yearly plan?", "Someone logged into my account from abroad.", "I was charged twice this month.",
    "Export to CSV gives an empty file.", "How do I add a second user?", "Please cancel my subscription today.",
]  # fmt: skip


def questions(n: int) -> dict[str, Any]:
    """``n`` questions about a ticket: yes/no, a choice of multi-token labels and a score, in turn."""
    out: dict[str, Any] = {}
    for i in range(n):
        topic = TOPICS[i % len(TOPICS)]
        if i % 3 == 0:
            out[f"q{i}"] = Noul(instructions=f"Does the customer mention {topic}?")
        elif i % 3 == 1:
            out[f"q{i}"] = Choice(instructions=f"Which team should handle what the customer says about {topic}?",
                                  criteria=TEAMS)  # fmt: skip
        else:
            out[f"q{i}"] = Score(instructions=f"How urgent is what the customer says about {topic}?",
                                 criteria=["Can wait a week.", "Within a day.", "Right now."])  # fmt: skip
    return out


def json_schema(asked: dict[str, Any]) -> dict[str, Any]:
    """The questions' fields as a JSON Schema, for with_structured_output and the AR baseline."""
    props = {name: q.field_schema() for name, q in engine_questions(asked).items()}
    return {"title": "Decisions", "type": "object", "properties": props, "required": list(props)}


def timed(fn: Any) -> tuple[float, Any]:
    started = time.perf_counter()
    out = fn()
    return (time.perf_counter() - started) * 1000, out


def request_rows(engine: Engine, repeats: int) -> list[str]:
    decider = PCDDecisionModel(engine=engine)
    chat = ChatPCD(engine=engine)
    rows = []
    for n in (1, 8, 32):
        asked = questions(n)
        schema = json_schema(asked)
        structured = chat.with_structured_output(schema, include_raw=True)
        request = {"state": TICKET, "questions": asked}
        decider.decide([TICKET], asked)  # warm: the schema's preamble prefilled and its lean read
        structured.invoke(TICKET)
        ms: dict[str, list[float]] = {"decision": [], "structured": [], "ar": []}
        passes: dict[str, int] = {}
        valid = 0
        for _ in range(repeats):
            t, _response = timed(lambda: decider.invoke(request))  # noqa: B023
            ms["decision"].append(t)
            passes["decision"] = decider.decide([TICKET], asked)[0].result.stats.forward_passes
            t, out = timed(lambda: structured.invoke(TICKET))  # noqa: B023
            ms["structured"].append(t)
            passes["structured"] = out["raw"].response_metadata["pcd"]["forward_passes"]
            t, ar = timed(lambda: generate_baseline(engine, TICKET, questions_schema(engine_questions(asked))))  # noqa: B023
            ms["ar"].append(t)
            passes["ar"] = ar.forward_passes
            valid += ar.valid
        med = {k: statistics.median(v) for k, v in ms.items()}
        rows.append(
            f"| {n} | {med['decision']:.0f} ms, {passes['decision']} | {med['structured']:.0f} ms, "
            f"{passes['structured']} | {med['ar']:.0f} ms, {passes['ar']} ({valid}/{repeats} valid) | "
            f"{med['ar'] / med['decision']:.1f}x |"
        )
        print(rows[-1], flush=True)
    return rows


def batch_rows(engine: Engine, states: int, repeats: int) -> list[str]:
    decider = PCDDecisionModel(engine=engine)
    asked = questions(8)
    inputs = [{"state": STATES[i % len(STATES)] + f" (ticket {i})", "questions": asked} for i in range(states)]
    decider.invoke(inputs[0])
    together, alone = [], []
    for _ in range(repeats):
        together.append(timed(lambda: decider.batch(inputs))[0])
        alone.append(timed(lambda: [decider.invoke(x) for x in inputs])[0])
    a, b = statistics.median(together), statistics.median(alone)
    rows = [
        f"| one `batch` | {a:.0f} ms | {a / states:.0f} ms |",
        f"| a loop of `invoke` | {b:.0f} ms | {b / states:.0f} ms |",
        f"| batch speed-up | {b / a:.2f}x | |",
    ]
    for row in rows:
        print(row, flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--states", type=int, default=64)
    args = parser.parse_args()
    engine = Engine.shared(None)
    ways = "PCDDecisionModel: ms, passes | with_structured_output: ms, passes | AR JSON: ms, passes"
    print(f"| questions | {ways} | AR / decision |")
    print("|---|---|---|---|---|")
    request_rows(engine, args.repeats)
    print()
    print(f"{args.states} tickets, 8 questions each:")
    print()
    print("| how | total | per ticket |")
    print("|---|---|---|")
    batch_rows(engine, args.states, max(1, args.repeats - 1))


if __name__ == "__main__":
    main()
