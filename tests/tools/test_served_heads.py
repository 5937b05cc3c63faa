"""Fitted decision models served by name, and the label loop on every route (issue 57), on a tiny random Llama
saved as a model folder (the command line loads it by path):

* ``pcd fit --decisions`` fits the head of a question set from decision cases; ``pcd serve --head NAME=FILE``
  serves it as model ``NAME``, which decides exactly as the same head sent in the request, through the routes and
  through the three real decision clients;
* ``--log`` logs every deciding route under an id (header and body), outcomes are checked at post time, ``pcd fit
  --log`` reads a log with a torn last line and a bad line, and a full disk never fails an answer;
* ``--shadow`` logs a candidate's decision beside the live one, and ``pcd promote`` writes the candidate over the
  live head only when the planted outcomes say it is better.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("fastapi", reason="pip install 'pcd-llm[serve]'")

from fastapi.testclient import TestClient  # noqa: E402

from pcd_engine import Head, Question, decide_questions  # noqa: E402
from pcd_engine.tools.cli import main  # noqa: E402
from pcd_engine.tools.serve import create_app  # noqa: E402
from pcd_engine.tools.serve.outcomes import DecisionLog  # noqa: E402
from pcd_engine.tools.serve.served import served_heads  # noqa: E402

MODEL = "tiny"
QUESTIONS = {
    "urgent": {"type": "noul", "instructions": "Is this urgent?"},
    "team": {"type": "choice", "instructions": "Which team should handle this?",
             "criteria": {"billing": "Charges and refunds.", "tech": None}},
    "anger": {"type": "score", "instructions": "How frustrated is the customer?",
              "criteria": ["Calm", "Annoyed", "Furious"]},
}  # fmt: skip
ASKED = {
    "urgent": Question.yes_no("Is this urgent?"),
    "team": Question.choice("Which team should handle this?", {"billing": "Charges and refunds.", "tech": None}),
    "anger": Question.score("How frustrated is the customer?", ["Calm", "Annoyed", "Furious"]),
}
TICKETS = [
    ("I was charged twice for order {n}. Refund it today!", True, "billing", 2),
    ("My invoice {n} shows a fee I never agreed to.", False, "billing", 1),
    ("The app crashes when I open order {n}; please fix it now.", True, "tech", 2),
    ("How do I change the language of the app? Ticket {n}.", False, "tech", 0),
]
STATE = "I was charged twice for order 77 and the app crashed when I tried to cancel it."


def cases_file(folder: Path) -> Path:
    lines = [{"state": text.format(n=n), **({"questions": QUESTIONS} if not lines_made else {}),
              "expected": {"urgent": urgent, "team": team, "anger": anger}}
             for lines_made, (n, (text, urgent, team, anger)) in enumerate(
                 (n, t) for n in range(4) for t in TICKETS)]  # fmt: skip
    path = folder / "cases.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def heads(tiny_folder, tiny_folder_engine, tmp_path_factory) -> dict[str, Path]:
    """A head fitted with ``pcd fit --decisions`` (live) and a candidate fitted in Python on the same cases with
    the teams swapped, so the two decide differently."""
    folder = tmp_path_factory.mktemp("heads")
    live = folder / "triage.head.json"
    code = main(["fit", tiny_folder, "--decisions", str(cases_file(folder)), "-o", str(live), "-q"])
    assert code == 0
    from pcd_engine.questions import read_decision_cases

    cases = read_decision_cases(cases_file(folder))
    swapped = {"billing": "tech", "tech": "billing"}
    examples = [(text, {**answers, "team": swapped[answers["team"]]}) for text, answers in cases.examples]
    candidate = Head.fit(tiny_folder_engine, cases.schema, examples)
    return {"live": live, "candidate": candidate.save(folder / "candidate.head.json")}


def app_for(engine: Any, heads: dict[str, Path], **kwargs: Any) -> TestClient:
    served = served_heads([f"triage={heads['live']}"], kwargs.pop("shadows", ()), model_id=engine.model_id,
                          taken=[MODEL])  # fmt: skip
    app = create_app(engine, model_name=MODEL, heads=served, batch_window_ms=None, **kwargs)
    return TestClient(app, base_url="http://localhost")


def decisions_body(model: str, **extra: Any) -> dict[str, Any]:
    questions = [{"type": "predicate", "name": "urgent", "instructions": "Is this urgent?"},
                 {"type": "choice", "name": "team", "instructions": "Which team should handle this?",
                  "choices": [{"value": "billing", "description": "Charges and refunds."}, {"value": "tech"}]},
                 {"type": "score", "name": "anger", "instructions": "How frustrated is the customer?",
                  "levels": [{"label": "Calm"}, {"label": "Annoyed"}, {"label": "Furious"}]}]  # fmt: skip
    return {"model": model, "input": STATE, "questions": questions, **extra}


def test_a_head_fitted_from_cases_decides_by_name_as_the_same_head_in_the_request(tiny_folder_engine, heads):
    """Requests naming ``triage`` on /v1/systemone and /v1/decisions get exactly the answers of the same head sent
    in the request (``pcd.head``), which are the engine's with that head, and not the model's own."""
    client = app_for(tiny_folder_engine, heads)
    head = json.loads(heads["live"].read_text())
    by_name = client.post("/v1/systemone", json={"model": "triage", "state": STATE, "questions": QUESTIONS})
    in_request = client.post("/v1/systemone", json={"model": MODEL, "state": STATE, "questions": QUESTIONS,
                                                    "pcd": {"head": head}})  # fmt: skip
    assert by_name.status_code == 200 and in_request.status_code == 200, by_name.text
    assert by_name.json()["model"] == "triage" and in_request.json()["model"] == MODEL
    assert by_name.json()["answers"] == in_request.json()["answers"]
    want = decide_questions(tiny_folder_engine, [STATE], ASKED, options={"head": Head.load(heads["live"])})[0]
    own = decide_questions(tiny_folder_engine, [STATE], ASKED)[0]
    got = by_name.json()["answers"]
    assert got["team"]["probabilities"] == pytest.approx(dict(want.answers["team"].probabilities), abs=1e-9)
    assert got["urgent"]["noul"] == pytest.approx(want.answers["urgent"].yes, abs=1e-9)
    assert got["urgent"]["noul"] != pytest.approx(own.answers["urgent"].yes, abs=1e-6)  # the head decided

    by_name = client.post("/v1/decisions", json=decisions_body("triage"))
    in_request = client.post("/v1/decisions", json=decisions_body(MODEL, pcd={"head": head}))
    assert by_name.status_code == 200, by_name.text
    assert by_name.json()["model"] == "triage"
    assert by_name.json()["answers"] == in_request.json()["answers"]
    assert by_name.json()["answers"][0]["probability"] == pytest.approx(want.answers["urgent"].yes, abs=1e-9)


def client_questions() -> dict[str, dict[str, Any]]:
    """The three questions as each real client writes them: ``OpenAIDecisions`` (``decisions``), ``OpenAIClassifier``
    and ``PCDDecisionModel`` (``core``: LangChain's), ``TypeSafeClassifier`` (``typesafe``)."""
    import langchain_typesafe as typesafe
    from langchain_core import decisions as core
    from langchain_openai import decisions as openai

    team = {"billing": "Charges and refunds.", "tech": None}
    levels = ["Calm", "Annoyed", "Furious"]
    urgent, which, anger = "Is this urgent?", "Which team should handle this?", "How frustrated is the customer?"
    return {
        "decisions": {"urgent": openai.Predicate(instructions=urgent),
                      "team": openai.Choice(instructions=which, choices=team),
                      "anger": openai.Score(instructions=anger, levels=levels)},
        "core": {"urgent": core.Noul(instructions=urgent), "team": core.Choice(instructions=which, criteria=team),
                 "anger": core.Score(instructions=anger, criteria=levels)},
        "typesafe": {"urgent": typesafe.Noul(instructions=urgent),
                     "team": typesafe.Choice(instructions=which, criteria=team),
                     "anger": typesafe.Score(instructions=anger, criteria=levels)},
    }  # fmt: skip


def test_the_three_decision_clients_reach_a_served_head_by_model_name(tiny_folder_engine, heads):
    from langchain_openai.decisions import OpenAIClassifier, OpenAIDecisions
    from langchain_typesafe import TypeSafeClassifier

    from tests.support import serve_on_loopback

    want = decide_questions(tiny_folder_engine, [STATE], ASKED, options={"head": Head.load(heads["live"])})[0]
    served = served_heads([f"triage={heads['live']}"], model_id=tiny_folder_engine.model_id)
    asked = client_questions()
    with serve_on_loopback(create_app(tiny_folder_engine, model_name=MODEL, heads=served)) as port:
        base = f"http://127.0.0.1:{port}"
        decisions = OpenAIDecisions(model="triage", base_url=f"{base}/v1", api_key="unused", max_retries=0)
        got = decisions.invoke({"input": STATE, "questions": asked["decisions"]})
        assert got.model == "triage"
        assert got.predicates["urgent"].probability == pytest.approx(want.answers["urgent"].yes, abs=1e-6)
        classifier = OpenAIClassifier(model="triage", base_url=f"{base}/v1", api_key="unused", max_retries=0)
        got = classifier.invoke({"state": STATE, "questions": asked["core"]})
        assert got.choices["team"].probabilities == pytest.approx(dict(want.answers["team"].probabilities), abs=1e-6)
        typesafe = TypeSafeClassifier(model="triage", base_url=base, api_key="unused")
        got = typesafe.invoke({"state": STATE, "questions": asked["typesafe"]})
        assert got.scores["anger"].score == pytest.approx(want.answers["anger"].score, abs=1e-6)


def test_an_abstained_question_reaches_every_decision_client(tiny_folder_engine, heads, tmp_path):
    """Issue 58: a served head whose threshold the ``team`` answer does not reach (kept with the head) abstains on
    it, and every client hears so in its own way: ``OpenAIDecisions`` gets the wire's refusal answer (the others
    stay answers), ``OpenAIClassifier`` and ``PCDDecisionModel`` raise ``ModelRefusalError`` naming it,
    ``TypeSafeClassifier`` keeps the answer and ``/v1/systemone`` marks it abstained in ``pcd``; a request's own
    ``min_probability`` reaches the Decisions route the same way."""
    import dataclasses

    from langchain_core.exceptions import ModelRefusalError
    from langchain_openai.decisions import OpenAIClassifier, OpenAIDecisions, RefusalAnswer
    from langchain_typesafe import TypeSafeClassifier

    from pcd_integrations.langchain import PCDDecisionModel
    from tests.support import serve_on_loopback

    head = Head.load(heads["live"])
    strict = dataclasses.replace(head, fields=tuple(
        dataclasses.replace(f, min_probability=1.0) if f.name == "team" else f for f in head.fields))  # fmt: skip
    path = strict.save(tmp_path / "strict.head.json")
    served = served_heads([f"strict={path}"], model_id=tiny_folder_engine.model_id)
    asked = client_questions()
    with serve_on_loopback(create_app(tiny_folder_engine, model_name=MODEL, heads=served)) as port:
        base = f"http://127.0.0.1:{port}"
        decisions = OpenAIDecisions(model="strict", base_url=f"{base}/v1", api_key="unused", max_retries=0)
        got = decisions.invoke({"input": STATE, "questions": asked["decisions"]})
        assert isinstance(got.answers["team"], RefusalAnswer) and list(got.refusals) == ["team"]
        assert "urgent" in got.predicates and "anger" in got.scores
        classifier = OpenAIClassifier(model="strict", base_url=f"{base}/v1", api_key="unused", max_retries=0)
        with pytest.raises(ModelRefusalError, match="team"):
            classifier.invoke({"state": STATE, "questions": asked["core"]})
        typesafe = TypeSafeClassifier(model="strict", base_url=base, api_key="unused")
        got = typesafe.invoke({"state": STATE, "questions": asked["typesafe"]})
        assert got.choices["team"].choice in ("billing", "tech")
    client = app_for(tiny_folder_engine, {"live": path})
    reply = client.post("/v1/systemone", json={"model": "triage", "state": STATE, "questions": QUESTIONS}).json()
    assert reply["pcd"]["fields"]["team"]["abstained"] is True and "abstained" not in reply["pcd"]["fields"]["urgent"]
    assert any("below the head's threshold 1.000" in w for w in reply["pcd"]["warnings"])
    own = client.post("/v1/decisions", json=decisions_body(MODEL, pcd={"min_probability": 1.0})).json()
    assert [a["type"] for a in own["answers"]] == ["refusal"] * 3
    assert own["answers"][1]["pcd"]["type"] == "choice" and "below the threshold" in own["answers"][1]["refusal"]

    model = PCDDecisionModel(engine=tiny_folder_engine, head=strict.to_json())
    with pytest.raises(ModelRefusalError, match="pcd abstained on: team"):
        model.invoke({"state": STATE, "questions": asked["core"]})
    (decided,) = model.decide([STATE], asked["core"])
    assert decided.answers["team"].abstained and not decided.answers["urgent"].abstained


@pytest.mark.parametrize(
    ("path", "body", "status", "param", "needle"),
    [
        ("/v1/systemone", {"model": "triage", "state": "x", "questions": {"urgent": QUESTIONS["urgent"]}}, 400,
         "model", "the head decides ['urgent', 'team', 'anger'], and the request has no ['team', 'anger']"),
        ("/v1/systemone", {"model": "triage", "state": "x", "questions": {**QUESTIONS, "mood": QUESTIONS["urgent"]}},
         400, "model", "fitted on ['urgent', 'team', 'anger'] only, and the request also asks ['mood']"),
        ("/v1/systemone", {"model": "triage", "state": "x",
                           "questions": {**QUESTIONS, "team": {**QUESTIONS["team"], "criteria": {"sales": None,
                                                                                                 "tech": None}}}},
         400, "model", "'team' has the labels ['billing', 'tech'] in the head, and ['sales', 'tech'] in the request"),
        ("/v1/systemone", {"model": "triage", "state": "x",
                           "questions": {**QUESTIONS, "urgent": {"type": "noul", "instructions": "Is it late?"}}},
         400, "model", "the same fields and labels with other instructions or descriptions"),
        ("/v1/systemone", {"model": "triage", "state": "x", "questions": {"mood": QUESTIONS["urgent"]}}, 400,
         "model", "the request has no ['urgent', 'team', 'anger']"),
        ("/v1/systemone", {"model": "triage", "state": "x", "questions": QUESTIONS, "pcd": {"head": {"a": 1}}}, 400,
         "pcd.head", "decides with its own head"),
        ("/v1/chat/completions", {"model": "triage", "messages": [{"role": "user", "content": "hi"}],
                                  "max_tokens": 2}, 400, "model", "free text and JSON objects come from the base"),
        ("/v1/completions", {"model": "triage", "prompt": "hi", "max_tokens": 2}, 400, "model", "text completions"),
        ("/v1/systemone", {"model": "nope", "state": "x", "questions": QUESTIONS}, 404, "model", "'triage'"),
    ],
)  # fmt: skip
def test_a_served_head_refuses_what_it_was_not_fitted_on(tiny_folder_engine, heads, path, body, status, param,
                                                         needle):  # fmt: skip
    reply = app_for(tiny_folder_engine, heads).post(path, json=body)
    assert reply.status_code == status, reply.text
    assert reply.json()["error"]["param"] == param and needle in reply.json()["error"]["message"], reply.text


def test_models_lists_each_served_head(tiny_folder_engine, heads):
    listed = app_for(tiny_folder_engine, heads).get("/v1/models").json()["data"]
    entry = next(m for m in listed if m["id"] == "triage")
    assert listed[0]["id"] == MODEL
    assert entry["pcd"]["head"] == {"base_model": MODEL, "schema": "Decisions", "examples": 16,
                                    "fields": ["urgent", "team", "anger"], "shadow": False}  # fmt: skip


def test_heads_are_refused_by_name_before_serving(tiny_folder_engine, heads, tmp_path):
    from pcd_engine.errors import InputError

    model = tiny_folder_engine.model_id
    for specs, shadows, needle in [
        ([f"tiny={heads['live']}"], [], "'tiny' is the base model's"),
        ([f"a={heads['live']}", f"a={heads['live']}"], [], "'a' is another head's"),
        (["a="], [], "expected NAME=FILE"),
        ([str(tmp_path)], [], "expected a folder holding NAME.head.json files"),
        ([f"a={heads['live']}"], [f"b={heads['candidate']}"], "expected the name of a --head"),
        ([f"a={tmp_path / 'none.json'}"], [], "none.json"),
    ]:
        with pytest.raises(InputError, match="--head|--shadow|Head") as caught:
            served_heads(specs, shadows, model_id=model, taken=[MODEL])
        assert needle in str(caught.value), str(caught.value)
    with pytest.raises(InputError, match="fitted with the served model 'other'"):
        served_heads([f"a={heads['live']}"], model_id="other")
    folder = tmp_path / "served"
    folder.mkdir()
    (folder / "triage.head.json").write_bytes(heads["live"].read_bytes())
    assert list(served_heads([str(folder)], model_id=model)) == ["triage"]


def test_every_route_logs_its_decisions_and_outcomes_are_checked_when_posted(tiny_folder_engine, heads, tmp_path):
    log = tmp_path / "log.jsonl"
    client = app_for(tiny_folder_engine, heads, log=log)
    schema = {"title": "T", "type": "object", "properties": {"mood": {"enum": ["happy", "sad"]},
                                                              "late": {"type": "boolean"}}}  # fmt: skip
    fmt = {"type": "json_schema", "json_schema": {"name": "T", "schema": schema}}
    replies = {
        "/api/extract": client.post("/api/extract", json={"schema": schema, "context": STATE}),
        "/v1/decisions": client.post("/v1/decisions", json=decisions_body("triage")),
        "/v1/systemone": client.post("/v1/systemone", json={"state": STATE, "questions": QUESTIONS}),
        "/v1/chat/completions": client.post("/v1/chat/completions", json={
            "messages": [{"role": "user", "content": STATE}], "response_format": fmt}),
        "/v1/responses": client.post("/v1/responses", json={
            "input": STATE, "text": {"format": {"type": "json_schema", "name": "T", "schema": schema}}}),
    }  # fmt: skip
    ids = {}
    for route, reply in replies.items():
        assert reply.status_code == 200, reply.text
        ident = reply.headers["x-pcd-decision-id"]
        body = reply.json()
        assert ident == (body["id"] if route == "/api/extract" else body["pcd"]["decision_id"]), route
        ids[route] = ident
    entries = [json.loads(line) for line in log.read_text().splitlines()]
    assert [(e["route"], e["id"], e["model"]) for e in entries] == [
        (route, ids[route], "triage" if route == "/v1/decisions" else MODEL) for route in replies
    ]
    assert entries[1]["probabilities"]["team"] == pytest.approx(
        [a["probability"] for a in replies["/v1/decisions"].json()["answers"][1]["probabilities"]], abs=1e-9
    )
    for ident, values, status, needle in [
        (ids["/v1/systemone"], {"team": "tech", "urgent": False, "anger": 2}, 200, None),
        (ids["/v1/chat/completions"], {"mood": "sad"}, 200, None),
        (ids["/v1/systemone"], {"team": "sales"}, 400, "values.team: expected one of the labels ['billing', 'tech']"),
        (ids["/v1/systemone"], {"urgent": "yes"}, 400, "values.urgent: expected one of the labels [True, False]"),
        (ids["/v1/responses"], {"colour": "red"}, 400, "values.colour: expected a field of 'T'"),
        ("dec-nope", {"mood": "sad"}, 404, "expected the id of a decision this server logged"),
    ]:
        reply = client.post("/api/outcomes", json={"id": ident, "values": values})
        assert reply.status_code == status, reply.text
        assert needle is None or needle in reply.text, reply.text
    assert sum(1 for line in log.read_text().splitlines() if '"outcome"' in line) == 2  # refused ones unlogged
    restarted = app_for(tiny_folder_engine, heads, log=log)  # knows the ids already in the file
    reply = restarted.post("/api/outcomes", json={"id": ids["/api/extract"], "values": {"late": True}})
    assert reply.status_code == 200, reply.text


def test_pcd_fit_reads_a_log_with_a_torn_last_line_and_a_bad_line(tiny_folder, tiny_folder_engine, heads, tmp_path,
                                                                   capsys):  # fmt: skip
    log = tmp_path / "log.jsonl"
    client = app_for(tiny_folder_engine, heads, log=log)
    for n, (text, urgent, team, anger) in enumerate(TICKETS * 2):
        body = {"model": "triage", "state": text.format(n=n), "questions": QUESTIONS}
        ident = client.post("/v1/systemone", json=body).headers["x-pcd-decision-id"]
        outcome = {"id": ident, "values": {"urgent": urgent, "team": team, "anger": anger}}
        assert client.post("/api/outcomes", json=outcome).status_code == 200
        if n == 3:
            with log.open("a", encoding="utf-8") as f:
                f.write("{this is not json\n")
    other = {"title": "Other", "type": "object", "properties": {"ok": {"type": "boolean"}}}
    stray = client.post("/api/extract", json={"schema": other, "context": "Fine."}).json()["id"]
    client.post("/api/outcomes", json={"id": stray, "values": {"ok": True}})
    bad_line = 1 + log.read_text().splitlines().index("{this is not json")
    with log.open("a", encoding="utf-8") as f:
        f.write('{"kind": "outcome", "id": "dec-')  # a crash mid-write
    out = tmp_path / "refit.head.json"
    code = main(["fit", tiny_folder, "--log", str(log), "--served", "triage", "-o", str(out), "-q"])
    printed, err = capsys.readouterr()
    assert code == 0, err
    assert f"log.jsonl:{bad_line}: expected a log entry, but got bad JSON" in err
    assert "the last line is cut short" in err
    assert "(8 labelled documents)" in printed
    assert Head.load(out).schema_fingerprint == Head.load(heads["live"]).schema_fingerprint
    code = main(["fit", tiny_folder, "--log", str(log), "-o", str(out), "-q"])  # two schemas have outcomes
    assert code == 1 and "to share one schema or question set, but found 'Decisions'" in capsys.readouterr().err


def test_a_full_disk_never_fails_an_answer(tiny_folder_engine, heads, capsys):
    if not Path("/dev/full").exists():
        pytest.skip("needs /dev/full")
    client = app_for(tiny_folder_engine, heads, log="/dev/full")
    for _ in range(2):
        reply = client.post("/v1/systemone", json={"model": "triage", "state": STATE, "questions": QUESTIONS})
        assert reply.status_code == 200 and "x-pcd-decision-id" not in reply.headers
        assert "decision_id" not in reply.json()["pcd"]
    warned = capsys.readouterr().err
    assert warned.count("could not be written (No space left on device); answers go on, unlogged") == 1
    log = DecisionLog("/dev/full", warn=lambda _: None)
    assert log.outcome("dec-x", {"a": 1}) is False and log.failed_writes == 1


def test_a_shadow_is_logged_beside_the_live_answer(tiny_folder_engine, heads, tmp_path):
    log = tmp_path / "log.jsonl"
    client = app_for(tiny_folder_engine, heads, log=log, shadows=[f"triage={heads['candidate']}"])
    reply = client.post("/v1/systemone", json={"model": "triage", "state": STATE, "questions": QUESTIONS})
    live, candidate = (Head.load(heads[k]) for k in ("live", "candidate"))
    want = decide_questions(tiny_folder_engine, [STATE], ASKED, options={"head": live})[0]
    shadow = decide_questions(tiny_folder_engine, [STATE], ASKED, options={"head": candidate})[0]
    assert reply.json()["answers"]["urgent"]["noul"] == pytest.approx(want.answers["urgent"].yes, abs=1e-9)
    (entry,) = [json.loads(line) for line in log.read_text().splitlines()]
    assert entry["shadow"]["head"] == str(heads["candidate"].resolve())
    assert entry["shadow"]["probabilities"]["urgent"] == pytest.approx(
        [shadow.answers["urgent"].yes, 1 - shadow.answers["urgent"].yes], abs=1e-9
    )
    live_p, shadow_p = entry["probabilities"], entry["shadow"]["probabilities"]
    assert any(shadow_p[q] != pytest.approx(live_p[q], abs=1e-6) for q in ASKED)  # two heads, two decisions


def planted_log(path: Path, head: Head, candidate: str, *, live_right: int, candidate_right: int, n: int = 40) -> None:
    """A log of ``n`` shadowed ``urgent`` decisions with outcomes: the live head right on the first ``live_right``,
    the candidate on the first ``candidate_right``."""
    lines = []
    for i in range(n):
        gold = i % 2 == 0

        def dist(right: bool) -> list[float]:
            return [0.8, 0.2] if right == gold else [0.2, 0.8]  # [P(true), P(false)]

        lines.append(
            {
                "kind": "request",
                "id": f"dec-{i}",
                "time": i,
                "route": "/v1/systemone",
                "model": "triage",
                "schema": {"title": head.schema_title, "fingerprint": head.schema_fingerprint, "json": {}},
                "text": f"case {i}",
                "values": {},
                "probabilities": {"urgent": dist(i < live_right)},
                "shadow": {"head": candidate, "probabilities": {"urgent": dist(i < candidate_right)}},
            }
        )
        lines.append({"kind": "outcome", "id": f"dec-{i}", "time": i, "values": {"urgent": gold}})
    path.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")


@pytest.mark.parametrize(
    ("live_right", "candidate_right", "promoted", "needle"),
    [(12, 38, True, "the candidate is better on 'urgent' (+65.0 points"),
     (38, 12, False, "the candidate is worse on 'urgent' (-65.0 points"),
     (30, 31, False, "not better beyond chance: 'urgent' (+2.5 points")],
)  # fmt: skip
def test_pcd_promote_writes_the_candidate_only_when_it_is_better(heads, tmp_path, capsys, live_right,
                                                                  candidate_right, promoted, needle):  # fmt: skip
    live = tmp_path / "live.head.json"
    live.write_bytes(heads["live"].read_bytes())
    log = tmp_path / "log.jsonl"
    planted_log(log, Head.load(live), str(heads["candidate"].resolve()), live_right=live_right,
                candidate_right=candidate_right)  # fmt: skip
    code = main(["promote", "--log", str(log), "--live", str(live), "--candidate", str(heads["candidate"])])
    out, err = capsys.readouterr()
    assert code == (0 if promoted else 1)
    assert needle in (out if promoted else err), out + err
    assert "| urgent" in " ".join(out.split()) and "40" in out
    assert live.read_bytes() == heads["candidate" if promoted else "live"].read_bytes()


def test_pcd_promote_refuses_a_log_without_the_candidate(heads, tmp_path, capsys):
    log = tmp_path / "log.jsonl"
    planted_log(log, Head.load(heads["live"]), "/elsewhere/other.head.json", live_right=1, candidate_right=40)
    code = main(["promote", "--log", str(log), "--live", str(heads["live"]), "--candidate", str(heads["candidate"])])
    assert code == 1 and "expected requests shadowed by" in capsys.readouterr().err
