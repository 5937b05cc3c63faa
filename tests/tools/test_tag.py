"""``pcd tag`` and :func:`tag_corpus`: reading corpora, the tag table, resumable jobs, and the command line.

Everything here runs on a tiny random Llama saved to disk (so that the command line and its subprocesses load
the same weights as the tests). The fault tests kill a real ``pcd tag`` process half-way, with SIGINT and with
SIGKILL, and check that a rerun finishes with every id once and the values of an uninterrupted run.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pcd_engine import Engine
from pcd_engine.errors import InputError, OptionError, SchemaError
from pcd_engine.options import ExtractOptions
from pcd_engine.schema import compile_schema
from pcd_engine.tagging.corpus import CorpusDocument, read_corpus
from pcd_engine.tagging.job import engine_parts, run_tag_job, tag_corpus
from pcd_engine.tagging.output import check_output, job_identity, read_tag_table
from pcd_engine.tagging.table import row_values, tag_columns, tag_table
from pcd_engine.tools.cli import main

SCHEMA = {
    "title": "Note",
    "type": "object",
    "properties": {
        "topic": {"enum": ["sport", "tech", "politics"]},
        "urgent": {"type": "boolean"},
        "summary": {"type": "string", "maxLength": 24},
    },
    "required": ["topic", "urgent", "summary"],
}
OPTIONS = {"max_tokens": 6}


def texts(n: int) -> list[str]:
    words = ["match", "chip", "vote", "goal", "server", "minister", "final", "update"]
    return [" ".join(words[(i + k) % len(words)] for k in range(3 + i % 9)) + f" (note {i})" for i in range(n)]


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def tiny(tiny_folder) -> str:
    return tiny_folder


@pytest.fixture(scope="module")
def engine(tiny_folder_engine) -> Engine:
    return tiny_folder_engine


def assert_rows_match(rows: list[dict], expected: dict[str, dict], schema=SCHEMA) -> None:
    """Rows equal ``expected`` (id -> extract result): values exactly, probabilities within float rounding."""
    compiled = compile_schema(schema)
    assert [r["id"] for r in rows] == list(expected)
    for row in rows:
        result = expected[row["id"]]
        assert row["error"] is None, row
        assert row_values(compiled, row) == result.values
        for name, f in result.fields.items():
            if f.probability is not None:
                assert row[f"{name}__probability"] == pytest.approx(f.probability, abs=1e-5)
        assert row["warnings"] == list(result.warnings)


# ------------------------------------------------------------------------------------------------ corpus


def test_every_input_layout_reads_the_same_documents(tmp_path):
    docs = texts(5)
    write_jsonl(tmp_path / "in.jsonl", [{"text": t, "key": f"k{i}"} for i, t in enumerate(docs)])
    with (tmp_path / "in.csv").open("w", newline="", encoding="utf-8") as f:
        import csv

        writer = csv.writer(f)
        writer.writerow(["key", "text"])
        writer.writerows([f"k{i}", t] for i, t in enumerate(docs))
    pq.write_table(pa.table({"text": docs, "key": [f"k{i}" for i in range(5)]}), tmp_path / "in.parquet")
    for name in ("in.jsonl", "in.csv", "in.parquet"):
        read = read_corpus(tmp_path / name)
        assert [(d.id, d.text) for d in read] == [(str(i), t) for i, t in enumerate(docs)], name
        keyed = read_corpus(tmp_path / name, id_column="key")
        assert [d.id for d in keyed] == [f"k{i}" for i in range(5)], name
    folder = tmp_path / "docs"
    (folder / "a").mkdir(parents=True)
    (folder / "a" / "one.txt").write_text(docs[0], encoding="utf-8")
    (folder / "two.txt").write_text(docs[1], encoding="utf-8")
    (folder / ".hidden").write_text("not a document", encoding="utf-8")
    assert [(d.id, d.text) for d in read_corpus(folder)] == [("a/one.txt", docs[0]), ("two.txt", docs[1])]
    assert len(read_corpus(tmp_path / "in.jsonl", limit=2)) == 2


def test_corpus_errors_name_the_file_and_what_is_wrong(tmp_path):
    path = write_jsonl(tmp_path / "in.jsonl", [{"text": "a", "key": "x"}, {"text": "b", "key": "x"}])
    with pytest.raises(InputError, match=r"column 'body'|key 'body'"):
        read_corpus(path, text_column="body")
    with pytest.raises(InputError, match="unique document ids.*'x'"):
        read_corpus(path, id_column="key")
    with pytest.raises(InputError, match="does not exist"):
        read_corpus(tmp_path / "missing.jsonl")
    (tmp_path / "x.txt").write_text("hi", encoding="utf-8")
    with pytest.raises(InputError, match=r"\.txt file"):
        read_corpus(tmp_path / "x.txt")
    (tmp_path / "bad.jsonl").write_text('{"text": "a"}\n{oops\n', encoding="utf-8")
    with pytest.raises(InputError, match=r"bad\.jsonl:2.*bad JSON"):
        read_corpus(tmp_path / "bad.jsonl")
    (tmp_path / "latin.csv").write_bytes(b"text\ncaf\xe9\n")
    with pytest.raises(InputError, match="UTF-8"):
        read_corpus(tmp_path / "latin.csv")
    (tmp_path / "empty.jsonl").write_text("\n", encoding="utf-8")
    with pytest.raises(InputError, match="at least one document"):
        read_corpus(tmp_path / "empty.jsonl")
    (tmp_path / "junk.parquet").write_bytes(b"not parquet")
    with pytest.raises(InputError, match="Parquet"):
        read_corpus(tmp_path / "junk.parquet")
    # A document that cannot be read keeps its id and says why; the rest is read.
    folder = tmp_path / "docs"
    folder.mkdir()
    (folder / "good.txt").write_text("fine", encoding="utf-8")
    (folder / "latin.txt").write_bytes(b"caf\xe9")
    read = read_corpus(folder)
    assert [d.id for d in read] == ["good.txt", "latin.txt"]
    assert read[0].error is None and "UTF-8" in (read[1].error or "")
    nulls = write_jsonl(tmp_path / "nulls.jsonl", [{"text": None}, {"text": "ok"}])
    assert [d.error is not None for d in read_corpus(nulls)] == [True, False]


# ------------------------------------------------------------------------------------------------ tag table

RICH = {
    "title": "Rich",
    "type": "object",
    "properties": {
        "flag": {"type": "boolean"},
        "kind": {"enum": ["a", "b"]},
        "maybe": {"anyOf": [{"enum": ["x", "y"]}, {"type": "null"}]},
        "stars": {"enum": [1, 2, 3]},
        "mixed": {"enum": ["one", 2]},
        "labels": {"type": "array", "items": {"enum": ["p", "q", "r"]}, "uniqueItems": True},
        "note": {"type": "string", "maxLength": 12},
        "count": {"type": "integer"},
        "where": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
    "required": ["flag", "kind", "maybe", "stars", "mixed", "labels", "note", "count", "where"],
}


def test_columns_are_typed_from_the_schema_and_read_back_to_the_values(engine):
    schema = compile_schema(RICH)
    columns = {c.name: c for c in tag_columns(schema, reserved=["id"])}
    types = {name: str(c.arrow_type()) for name, c in columns.items() if c.part == "value"}
    assert types == {
        "flag": "bool",
        "kind": "string",
        "maybe": "string",
        "stars": "int64",
        "mixed": "string",  # JSON text: no one Arrow type holds "one" and 2
        "labels": "list<item: string>",
        "note": "string",
        "count": "int64",
        "where": "string",  # JSON text
    }
    assert columns["mixed"].json and columns["where"].json and not columns["kind"].json
    assert {c.name for c in columns.values() if c.part == "truncated"} == {
        "note__truncated",
        "count__truncated",
        "where__truncated",
    }
    docs = texts(3)
    results = [engine.extract(t, RICH, max_tokens=8) for t in docs]
    table = tag_table(schema, [*results, ValueError("broken")], leading={"id": ["a", "b", "c", "d"]})
    rows = table.to_pylist()
    for row, result in zip(rows, results):
        assert row_values(schema, row) == result.values
        assert row["stars__probability"] == result.fields["stars"].probability
    assert rows[-1]["error"] == "ValueError: broken" and row_values(schema, rows[-1]) is None
    assert rows[-1]["flag"] is None and rows[-1]["warnings"] == []


def test_column_name_clashes_are_schema_errors():
    clash = {"type": "object", "properties": {"error": {"type": "boolean"}}, "required": ["error"]}
    with pytest.raises(SchemaError, match="field 'error'.*the error column"):
        tag_columns(compile_schema(clash))
    with pytest.raises(SchemaError, match="'id'.*a column of the input"):
        tag_columns(compile_schema({"type": "object", "properties": {"id": {"type": "boolean"}}}), reserved=["id"])
    twin = {"type": "object", "properties": {"x": {"type": "boolean"}, "x__probability": {"type": "boolean"}}}
    with pytest.raises(SchemaError, match="x__probability"):
        tag_columns(compile_schema(twin))


# ------------------------------------------------------------------------------------------------ jobs


def test_tag_corpus_equals_extract_one_document_at_a_time(engine, tmp_path):
    docs = texts(23)
    rows = [{"text": t} for t in docs] + [{"text": "   "}, {"text": None}]
    source = write_jsonl(tmp_path / "in.jsonl", rows)
    out = tmp_path / "tags.parquet"
    summary = tag_corpus(source, SCHEMA, out, engine=engine, options=OPTIONS, part_size=6, model="tiny")
    assert (summary.documents, summary.tagged, summary.skipped, summary.errors) == (25, 25, 0, 2)
    assert not out.with_name("tags.parquet.parts").exists() and not out.with_name("tags.parquet.lock").exists()
    table, job = read_tag_table(out)
    assert job["model"] == "tiny (torch)" and job["options"] == OPTIONS and job["columns"]["text"] == "text"
    got = table.to_pylist()
    expected = {str(i): engine.extract(t, SCHEMA, **OPTIONS) for i, t in enumerate(docs)}
    assert_rows_match(got[:23], expected)
    assert got[23]["id"] == "23" and "document '23'" in got[23]["error"] and got[23]["topic"] is None
    assert got[24]["error"].startswith("InputError: expected text in column 'text'")
    assert_shares_count_the_rows(summary.shares, got)


def assert_shares_count_the_rows(shares, rows) -> None:
    """A summary's label shares are each closed field's share of the decided rows, with an interval around it."""
    decided = [r for r in rows if r["error"] is None]
    assert list(shares) == ["topic", "urgent"]
    for name, got in shares.items():
        assert got.documents == len(decided) and got.method == "count"
        for label, share, low, high in zip(got.labels, got.shares, got.low, got.high, strict=True):
            assert share == pytest.approx(sum(r[name] == label for r in decided) / len(decided))
            assert low <= share <= high


class Interrupt(Exception):
    pass


def interrupted_after(runner, parts: int):
    def run(docs):
        for index, table in enumerate(runner(docs)):
            if index == parts:
                raise Interrupt
            yield table

    return run


def test_an_interrupted_job_resumes_where_it_stopped_and_a_grown_input_adds_only_the_new(engine, tmp_path):
    schema = compile_schema(SCHEMA)
    docs = [CorpusDocument(f"d{i}", t) for i, t in enumerate(texts(30))]
    identity = job_identity(schema, model="tiny", columns={"text": "text", "id": None})
    runner = engine_parts(engine, schema, part_size=4)
    whole = tmp_path / "whole.parquet"
    run_tag_job(docs, schema, whole, identity=identity, runner=runner)
    out = tmp_path / "out.parquet"
    with pytest.raises(Interrupt):
        run_tag_job(docs, schema, out, identity=identity, runner=interrupted_after(runner, 3))
    parts = out.with_name("out.parquet.parts")
    assert len(list(parts.glob("part-*.parquet"))) == 3 and not out.exists()
    done = []
    summary = run_tag_job(docs, schema, out, identity=identity, runner=runner, on_part=done.append, quiet=True)
    assert (summary.skipped, summary.tagged, sum(done)) == (12, 18, 18)
    assert_shares_count_the_rows(summary.shares, pq.read_table(out).to_pylist())  # the earlier run's rows too
    assert pq.read_table(out).to_pylist() == pq.read_table(whole).to_pylist()
    # The input grows (and loses one document): only the new ones are tagged, in input order.
    grown = docs[1:] + [CorpusDocument(f"d{i}", t) for i, t in enumerate(texts(34)[30:], start=30)]
    summary = run_tag_job(grown, schema, out, identity=identity, runner=runner)
    assert (summary.tagged, summary.skipped, summary.dropped) == (4, 29, 1)
    assert pq.read_table(out).column("id").to_pylist() == [d.id for d in grown]


def test_a_finished_part_left_next_to_the_output_is_not_duplicated(engine, tmp_path):
    """A run killed between replacing the output and removing the parts leaves rows in both: one copy is kept."""
    schema = compile_schema(SCHEMA)
    docs = [CorpusDocument(str(i), t) for i, t in enumerate(texts(8))]
    identity = job_identity(schema, model="tiny", columns={})
    out = tmp_path / "out.parquet"
    run_tag_job(docs, schema, out, identity=identity, runner=engine_parts(engine, schema, part_size=4))
    parts = out.with_name("out.parquet.parts")
    parts.mkdir()
    (parts / "job.json").write_text(json.dumps(identity), encoding="utf-8")
    pq.write_table(pq.read_table(out).replace_schema_metadata(None).slice(0, 4), parts / "part-000000.parquet")
    (parts / "part-000001.parquet.tmp").write_bytes(b"half-written")
    summary = run_tag_job(docs, schema, out, identity=identity, runner=engine_parts(engine, schema))
    assert summary.tagged == 0 and pq.read_table(out).column("id").to_pylist() == [d.id for d in docs]
    assert not parts.exists()


def test_another_job_on_the_same_output_is_refused_until_overwrite(engine, tmp_path):
    schema = compile_schema(SCHEMA)
    docs = [CorpusDocument(str(i), t) for i, t in enumerate(texts(4))]
    identity = job_identity(schema, model="tiny", columns={"text": "text", "id": None})
    out = tmp_path / "out.parquet"
    run_tag_job(docs, schema, out, identity=identity, runner=engine_parts(engine, schema))
    other_schema = compile_schema({**SCHEMA, "title": "Other"})
    for changed, needle in (
        (job_identity(other_schema, model="tiny", columns={"text": "text", "id": None}), "schema"),
        (job_identity(schema, model="bigger", columns={"text": "text", "id": None}), "model"),
        (
            job_identity(
                schema, model="tiny", options=ExtractOptions(temperature=2.0), columns={"text": "text", "id": None}
            ),
            "options",
        ),
        (job_identity(schema, model="tiny", columns={"text": "body", "id": None}), "input columns"),
    ):
        with pytest.raises(InputError, match=f"the {needle} .*differ.*--overwrite"):
            check_output(out, changed)
    changed = job_identity(schema, model="bigger", columns={"text": "text", "id": None})
    summary = run_tag_job(docs, schema, out, identity=changed, runner=engine_parts(engine, schema), overwrite=True)
    assert summary.tagged == 4 and read_tag_table(out)[1]["model"] == "bigger"
    plain = tmp_path / "plain.parquet"
    pq.write_table(pa.table({"id": ["0"]}), plain)
    with pytest.raises(InputError, match="no pcd job description"):
        check_output(plain, identity)
    with pytest.raises(InputError, match=r"\.parquet file name"):
        check_output(tmp_path / "out.csv", identity)
    with pytest.raises(InputError, match="existing folder"):
        check_output(tmp_path / "no" / "out.parquet", identity)
    damaged = tmp_path / "damaged.parquet"
    (tmp_path / "damaged.parquet.parts").mkdir()
    for text, needle in (("[1, 2]", "expected job.json to hold a JSON object, but got list"), ("{", "readable")):
        (tmp_path / "damaged.parquet.parts" / "job.json").write_text(text)  # a job file is untrusted too (issue 45)
        with pytest.raises(InputError, match=needle):
            check_output(damaged, identity)
    from filelock import FileLock

    with FileLock(str(tmp_path / "out.parquet.lock")):
        with pytest.raises(InputError, match="another job|lock"):
            run_tag_job(docs, schema, out, identity=changed, runner=engine_parts(engine, schema))


def test_tag_corpus_checks_its_arguments_before_any_model_work(engine, tmp_path):
    source = write_jsonl(tmp_path / "in.jsonl", [{"text": "x"}])
    twins = [CorpusDocument("a", "one"), CorpusDocument("a", "two")]
    with pytest.raises(InputError, match="unique document ids.*'a'"):
        tag_corpus(twins, SCHEMA, tmp_path / "o.parquet", engine=engine)
    with pytest.raises(OptionError, match="part_size"):
        tag_corpus(source, SCHEMA, tmp_path / "o.parquet", engine=engine, part_size=0)
    with pytest.raises(SchemaError, match="error"):
        tag_corpus(source, {"type": "object", "properties": {"error": {"type": "boolean"}}}, tmp_path / "o.parquet")
    assert not (tmp_path / "o.parquet").exists()


# ------------------------------------------------------------------------------------------------ the command


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_pcd_tag_writes_the_table_and_a_rerun_has_nothing_left(capsys, tiny, engine, tmp_path):
    source = write_jsonl(tmp_path / "in.jsonl", [{"text": t, "doc": f"n{i}"} for i, t in enumerate(texts(10))])
    (tmp_path / "s.json").write_text(json.dumps(SCHEMA), encoding="utf-8")
    out = tmp_path / "t.parquet"
    argv = ["tag", tiny, "-q", "--schema", str(tmp_path / "s.json"), "--input", str(source), "--output", str(out)]
    argv += ["--id-column", "doc", "--part-size", "3", "--max-tokens", "6"]
    code, stdout, err = run_cli(capsys, *argv)
    assert code == 0, err
    assert "10 documents (10 tagged now" in stdout and "0 error rows" in stdout
    assert "label shares of 'topic' among 10 rows (95% interval): sport: " in stdout, stdout
    assert "label shares of 'urgent' among 10 rows" in stdout and "summary" not in stdout.split("rows")[-1]
    expected = {f"n{i}": engine.extract(t, SCHEMA, **OPTIONS) for i, t in enumerate(texts(10))}
    assert_rows_match(pq.read_table(out).to_pylist(), expected)
    code, stdout, _ = run_cli(capsys, *argv)
    assert code == 0 and "0 tagged now" in stdout and "10 already done" in stdout
    code, _, err = run_cli(capsys, *argv[:-1], "7")
    assert_one_line(code, err, "options", "--overwrite")


def assert_one_line(code: int, err: str, *needles: str) -> None:
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 1 and len(lines) == 1 and "Traceback" not in err, err
    for needle in needles:
        assert needle in lines[0], lines[0]


def test_pcd_tag_errors_are_one_line_before_the_model_loads(capsys, tmp_path, fake_hub):
    # Online (a stand-in Hub knows the repo): it passes name resolution, and any load would fail on the network, not
    # with these errors.
    source = write_jsonl(tmp_path / "in.jsonl", [{"text": "x"}])
    (tmp_path / "s.json").write_text(json.dumps(SCHEMA), encoding="utf-8")
    base = ["tag", "org/not-downloaded", "-q", "--input", str(source), "--output", str(tmp_path / "o.parquet")]
    schema = ["--schema", str(tmp_path / "s.json")]
    assert_one_line(*run_cli(capsys, *base, *schema, "--text-column", "body")[::2], "'body'")
    assert_one_line(*run_cli(capsys, *base)[::2], "--schema", "neither")
    assert_one_line(*run_cli(capsys, *base, *schema, "--preset", "ticket")[::2], "both")
    assert_one_line(*run_cli(capsys, *base, *schema, "--part-size", "0")[::2], "--part-size")
    bad = ["tag", "org/not-downloaded", "-q", *schema, "--input", str(source), "--output", str(tmp_path / "o.csv")]
    assert_one_line(*run_cli(capsys, *bad)[::2], ".parquet")
    assert_one_line(
        *run_cli(capsys, *base[:3], "--input", str(tmp_path / "nope.csv"), *base[-2:], *schema)[::2], "nope"
    )
    # issue 45: an output under a file or a pseudo-filesystem, refused by name before anything loads or is fitted
    (tmp_path / "plain.txt").write_text("x")
    (tmp_path / "taken.parquet").mkdir()
    for output, needle in (
        (tmp_path / "plain.txt" / "o.parquet", "to be a folder, but it is a file"),
        (Path("/proc/o.parquet"), "expected a folder pcd can write in"),
        (tmp_path / "taken.parquet", "to be pcd's own, but it is a folder"),
    ):
        argv = [*base[:-1], str(output), *schema, "--calibrate", "5"]
        assert_one_line(*run_cli(capsys, *argv)[::2], str(output), needle)


# ------------------------------------------------------------------------------------------------ faults


def _spawn(tiny: str, source: Path, out: Path) -> subprocess.Popen:
    command = [sys.executable, "-m", "pcd_engine.tools.cli", "tag", tiny, "-q", "--backend", "torch", "--schema"]
    command += [str(source.with_name("s.json")), "--input", str(source), "--output", str(out), "--part-size", "4"]
    command += ["--max-tokens", "6"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL], ids=["sigint", "sigkill"])
def test_a_killed_pcd_tag_rerun_finishes_with_every_id_once(tiny, engine, tmp_path, sig):
    docs = texts(48)
    source = write_jsonl(tmp_path / "in.jsonl", [{"text": t} for t in docs])
    (tmp_path / "s.json").write_text(json.dumps(SCHEMA), encoding="utf-8")
    out = tmp_path / "out.parquet"
    parts = tmp_path / "out.parquet.parts"
    process = _spawn(tiny, source, out)
    deadline = time.monotonic() + 300
    while len(list(parts.glob("part-*.parquet"))) < 6:  # about half-way: 6 of 12 parts
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline
        time.sleep(0.05)
    process.send_signal(sig)
    _, err = process.communicate(timeout=120)
    assert not out.exists()
    if sig == signal.SIGINT:
        assert process.returncode == 130 and "resumes" in err and "Traceback" not in err, err
    else:
        assert process.returncode == -signal.SIGKILL
    left = len(list(parts.glob("part-*.parquet")))
    assert 6 <= left < 12
    again = _spawn(tiny, source, out)
    stdout, err = again.communicate(timeout=300)
    assert again.returncode == 0, err
    assert f"{48 - 4 * left} tagged now" in stdout and f"{4 * left} already done" in stdout
    rows = pq.read_table(out).to_pylist()
    expected = {str(i): engine.extract(t, SCHEMA, **OPTIONS) for i, t in enumerate(docs)}
    assert_rows_match(rows, expected)


def test_pcd_tag_decides_with_a_head_and_a_new_head_is_a_new_job(capsys, tiny, engine, tmp_path):
    from tests.support import forcing_head

    docs = texts(4)
    source = write_jsonl(tmp_path / "in.jsonl", [{"text": t} for t in docs])
    (tmp_path / "s.json").write_text(json.dumps(SCHEMA), encoding="utf-8")
    forced = "politics"
    head = forcing_head(engine, SCHEMA, "topic", forced)
    head_file = head.save(tmp_path / "topic.head.json")
    out = tmp_path / "t.parquet"
    argv = ["tag", tiny, "-q", "--schema", str(tmp_path / "s.json"), "--input", str(source), "--output", str(out)]
    code, _, err = run_cli(capsys, *argv, "--max-tokens", "4", "--head", str(head_file))
    assert code == 0, err
    import pyarrow.parquet as pq

    rows = pq.read_table(out).to_pylist()
    assert [r["topic"] for r in rows] == [forced] * 4
    expected = [engine.extract(t, SCHEMA, head=head, max_tokens=4) for t in docs]
    assert [r["urgent"] for r in rows] == [e.values["urgent"] for e in expected]
    other = forcing_head(engine, SCHEMA, "topic", "sport").save(tmp_path / "other.head.json")
    code, _, err = run_cli(capsys, *argv, "--max-tokens", "4", "--head", str(other))
    assert code == 1 and "options" in err
