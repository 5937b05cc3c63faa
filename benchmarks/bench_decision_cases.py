"""Fitted decision models served by name (issue 57): decision cases -> ``pcd fit --decisions`` -> ``pcd serve --head``.

Three suites of decision cases, each split into calibration and evaluation cases:

* ``bbc-topic``: BBC News articles (first ``--max-chars`` characters), a choice of the five sections;
* ``rt-verdict``: Rotten Tomatoes reviews, a yes/no question (is the review positive?);
* ``tickets``: support tickets of this benchmark's own making (a team sentence, a refund ask or not, an urgency or
  not, a tone; each label known by construction), with a choice, two yes/no questions and a three-level score.

Each suite's calibration cases are written as a ``/v1/systemone`` cases file and fitted as ``pcd fit --decisions``
fits them (:func:`~pcd_engine.questions.read_decision_cases`, :meth:`~pcd_engine.Head.fit`); the heads are served by
name by one ``pcd serve`` app (uvicorn on loopback, the embedded model). Every evaluation case is then asked through
``/v1/systemone`` twice, one request after another: naming the base model (zero-shot: the model's own reading with
the default correction) and naming the suite's head. The table gives, per question, accuracy, ECE and Brier of both;
per question type the mean; ms per case p50/p95 through the server for each; and the request's bytes with the head
named against the same head sent in the request (whose answers are checked to be identical on ``--same`` cases).

    .venv/bin/python benchmarks/bench_decision_cases.py --eval 100 --per-label 10
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402

from benchmarks.bench_serve import _serve  # noqa: E402
from pcd_engine import Engine, Head  # noqa: E402
from pcd_engine.heads.gates import scores  # noqa: E402
from pcd_engine.questions import read_decision_cases  # noqa: E402
from pcd_engine.tools.datasets import load_dataset  # noqa: E402
from pcd_engine.tools.serve import create_app  # noqa: E402
from pcd_engine.tools.serve.served import served_heads  # noqa: E402

TEAMS = {
    "billing": ["I was charged twice for my subscription.", "My invoice shows a fee I never agreed to.",
                "The card payment went through but the order still says unpaid.", "Why did my monthly bill go up?"],
    "technical": ["The app crashes every time I open the settings.", "I cannot log in; the page just keeps loading.",
                  "Sync between my phone and my laptop stopped working.", "Every export fails with error 500."],
    "shipping": ["My parcel has not arrived after two weeks.", "The tracking number shows no movement since Monday.",
                 "The box arrived crushed and the lamp inside is broken.", "I received someone else's order."],
    "account": ["Please change the email address on my account.", "I want to close my account.",
                "How do I add a second user to my profile?", "I forgot which email address I signed up with."],
}  # fmt: skip
REFUND = ["I want my money back.", "Please refund me.", "Refund the charge, please.", "I expect a full refund."]
URGENT = ["I need this sorted today.", "This is urgent: I travel tomorrow.", "Please answer within the hour."]
CALM_UNHURRIED = ["No rush.", "Whenever you have a moment.", ""]
TONES = [["Thanks for your help.", "Have a nice day.", "Thank you in advance."],
         ["This is the second time I write about it.", "I am getting tired of this.", "Not impressed so far."],
         ["This is outrageous and I am furious!", "Worst service ever, I am done with you!",
          "Unacceptable! I am absolutely livid!"]]  # fmt: skip
TICKET_QUESTIONS = {
    "team": {"type": "choice", "instructions": "Which team should handle this ticket?",
             "criteria": {"billing": "Charges, invoices and payments.", "technical": "Bugs, crashes and log-in.",
                          "shipping": "Deliveries and parcels.", "account": "Profile and account details."}},
    "refund": {"type": "noul", "instructions": "Does the customer ask for money back?"},
    "urgent": {"type": "noul", "instructions": "Does the customer need an answer today?"},
    "frustration": {"type": "score", "instructions": "How frustrated is the customer?",
                    "criteria": ["Calm", "Annoyed", "Furious"]},
}  # fmt: skip


def tickets(n: int, seed: int) -> list[tuple[str, dict[str, Any]]]:
    """``n`` tickets with their labels, known by construction."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        team = rng.choice(list(TEAMS))
        refund, urgent, tone = rng.random() < 0.4, rng.random() < 0.4, rng.randrange(3)
        parts = [rng.choice(TEAMS[team]), rng.choice(REFUND) if refund else "",
                 rng.choice(URGENT) if urgent else rng.choice(CALM_UNHURRIED), rng.choice(TONES[tone])]  # fmt: skip
        head, rest = parts[0], [p for p in parts[1:] if p]
        rng.shuffle(rest)
        out.append((" ".join([head, *rest]), {"team": team, "refund": refund, "urgent": urgent, "frustration": tone}))
    return out


def labelled_suite(name: str, per_label: int, n_eval: int, max_chars: int, seed: int) -> tuple[dict, list, list]:
    """A suite's questions, calibration cases and evaluation cases (``(state, expected)`` pairs)."""
    if name == "tickets":
        return TICKET_QUESTIONS, tickets(per_label * 4, seed), tickets(n_eval, seed + 1)
    data = list(load_dataset("bbc-news" if name == "bbc-topic" else "rotten-tomatoes"))
    random.Random(seed).shuffle(data)
    if name == "bbc-topic":
        labels = sorted({d.label for d in data})
        questions = {"section": {"type": "choice", "instructions": "Which section of the news site is this "
                                 "article from?", "criteria": {label: None for label in labels}}}  # fmt: skip
        cases = [(d.text[:max_chars], {"section": d.label}) for d in data]
    else:
        questions = {
            "positive": {
                "type": "noul",
                "instructions": "Is this review positive about the film?",
                "criteria": {"true": "The critic recommends it.", "false": "The critic does not."},
            }
        }
        cases = [(d.text[:max_chars], {"positive": d.label == "fresh"}) for d in data]
    key = next(iter(questions))
    calibration: list = []
    for label in sorted({json.dumps(e[key]) for _, e in cases}):
        calibration += [c for c in cases if json.dumps(c[1][key]) == label][:per_label]
    rest = [c for c in cases if c not in calibration]
    return questions, calibration, rest[:n_eval]


def ask(base: str, model: str, state: str, questions: dict, head: dict | None = None) -> tuple[dict, float, int]:
    body: dict[str, Any] = {"model": model, "state": state, "questions": questions}
    if head is not None:
        body["pcd"] = {"head": head}
    data = json.dumps(body)
    tick = time.perf_counter()
    reply = httpx.post(f"{base}/v1/systemone", content=data, headers={"content-type": "application/json"},
                       timeout=120)  # fmt: skip
    ms = (time.perf_counter() - tick) * 1000
    reply.raise_for_status()
    return reply.json()["answers"], ms, len(data.encode())


def distribution(answer: dict, kind: str) -> list[float]:
    """An answer's probabilities in the question's value order (yes/no: yes, no)."""
    if kind == "noul":
        return [answer["noul"], 1 - answer["noul"]]
    return list(answer["probabilities"].values())


def gold_index(expected: Any, question: dict) -> int:
    if question["type"] == "noul":
        return 0 if expected else 1
    if question["type"] == "choice":
        return list(question["criteria"]).index(expected)
    return int(expected)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--per-label", type=int, default=10, help="calibration cases per label (tickets: per team)")
    parser.add_argument("--eval", type=int, default=100, help="evaluation cases per suite")
    parser.add_argument("--max-chars", type=int, default=600)
    parser.add_argument("--same", type=int, default=10, help="cases checked: head by name == head in the request")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    engine = Engine.load(args.model)
    suites = {name: labelled_suite(name, args.per_label, args.eval, args.max_chars, args.seed)
              for name in ("bbc-topic", "rt-verdict", "tickets")}  # fmt: skip
    folder = Path(tempfile.mkdtemp(prefix="pcd-cases-"))
    specs, fit_s = [], {}
    for name, (questions, calibration, _) in suites.items():
        path = folder / f"{name}.jsonl"
        path.write_text("".join(json.dumps({"state": s, "expected": e, **({"questions": questions} if i == 0 else {})})
                                + "\n" for i, (s, e) in enumerate(calibration)), encoding="utf-8")  # fmt: skip
        cases = read_decision_cases(path)
        tick = time.perf_counter()
        head = Head.fit(engine, cases.schema, cases.examples)
        fit_s[name] = time.perf_counter() - tick
        specs.append(f"{name}={head.save(folder / f'{name}.head.json')}")
        print(f"{name}: fitted on {len(calibration)} cases in {fit_s[name]:.1f} s; gates: "
              + ", ".join(f"{g.field} {g.head.accuracy:.0%} vs {g.zero_shot.accuracy:.0%}" for g in head.gates),
              file=sys.stderr)  # fmt: skip
    app = create_app(engine, model_name="smollm2-135m", heads=served_heads(specs, model_id=engine.model_id))
    base, server = _serve(app)
    rows, by_type, ms = [], {}, {"zero-shot": [], "head by name": []}
    sizes: dict[str, list[int]] = {"by name": [], "in request": []}
    identical = checked = 0
    for name, (questions, _, evaluation) in suites.items():
        head_json = json.loads((folder / f"{name}.head.json").read_text())
        got: dict[str, dict[str, list]] = {q: {"zero-shot": [], "head by name": [], "gold": []} for q in questions}
        ask(base, "smollm2-135m", evaluation[0][0], questions)  # warm the schema's prompt
        for i, (state, expected) in enumerate(evaluation):
            zero, zero_ms, _ = ask(base, "smollm2-135m", state, questions)
            named, named_ms, named_bytes = ask(base, name, state, questions)
            ms["zero-shot"].append(zero_ms)
            ms["head by name"].append(named_ms)
            sizes["by name"].append(named_bytes)
            if i < args.same:
                sent, _, sent_bytes = ask(base, "smollm2-135m", state, questions, head=head_json)
                sizes["in request"].append(sent_bytes)
                checked += 1
                identical += sent == named
            for q, question in questions.items():
                if q in expected:
                    got[q]["zero-shot"].append(distribution(zero[q], question["type"]))
                    got[q]["head by name"].append(distribution(named[q], question["type"]))
                    got[q]["gold"].append(gold_index(expected[q], question))
        for q, question in questions.items():
            zero_s = scores(got[q]["zero-shot"], got[q]["gold"])
            head_s = scores(got[q]["head by name"], got[q]["gold"])
            rows.append((name, q, question["type"], len(got[q]["gold"]), zero_s, head_s))
            by_type.setdefault(question["type"], []).append((zero_s, head_s))
    server.should_exit = True

    print(f"\nEmbedded SmolLM2-135M, CPU; calibration {args.per_label} per label (tickets: {args.per_label * 4} "
          f"cases), {args.eval} evaluation cases per suite, seed {args.seed}\n")  # fmt: skip
    print(
        "| suite | question | type | cases | zero-shot accuracy | head accuracy | zero-shot ECE | head ECE "
        "| zero-shot Brier | head Brier |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for suite, q, kind, n, z, h in rows:
        print(
            f"| {suite} | {q} | {kind} | {n} | {z.accuracy:.1%} | {h.accuracy:.1%} | {z.ece:.3f} | {h.ece:.3f} "
            f"| {z.brier:.3f} | {h.brier:.3f} |"
        )
    print(
        "\n| question type | questions | zero-shot accuracy (mean) | head accuracy (mean) | zero-shot ECE | head ECE |"
    )
    print("|---|---|---|---|---|---|")
    for kind, pairs in by_type.items():
        mean = lambda xs: statistics.mean(xs)  # noqa: E731
        print(
            f"| {kind} | {len(pairs)} | {mean([z.accuracy for z, _ in pairs]):.1%} | "
            f"{mean([h.accuracy for _, h in pairs]):.1%} | {mean([z.ece for z, _ in pairs]):.3f} | "
            f"{mean([h.ece for _, h in pairs]):.3f} |"
        )
    print("\n| through pcd serve (/v1/systemone, one request at a time) | ms per case p50 | p95 |")
    print("|---|---|---|")
    for label, values in ms.items():
        print(f"| {label} | {statistics.median(values):.0f} | {pct(values, 0.95):.0f} |")
    print("\n| request body | mean bytes |")
    print("|---|---|")
    for label, values in sizes.items():
        print(f"| head {label} | {statistics.mean(values):,.0f} |")
    print(f"\nhead by name == the same head in the request: {identical} of {checked} cases identical; "
          f"fitting: " + ", ".join(f"{k} {v:.1f} s" for k, v in fit_s.items()))  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
