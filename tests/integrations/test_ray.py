"""Ray Data: :func:`pcd_integrations.ray.tag_dataset` and ``pcd tag --ray`` on a real local Ray cluster.

One cluster (``ray.init(num_cpus=2)``) serves the module. On a tiny random Llama saved to disk: the tagged rows
equal :meth:`Engine.extract` one document at a time, with one actor and with two; an actor killed mid-job is
restarted by Ray and the job completes with every row once; the command line on Ray writes what it writes
in-process. On the embedded SmolLM2: 32 BBC News articles, tagged in-process and on Ray with two actors, equal
``extract`` row for row.
"""

from __future__ import annotations

import json
import os
import signal

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import ray
import ray.data

from pcd_engine.errors import InputError, OptionError, SchemaError
from pcd_engine.schema import compile_schema
from pcd_engine.tagging.table import row_values
from pcd_engine.tools.cli import main
from pcd_integrations.ray import tag_dataset
from tests.support import BBC_SCHEMA
from tests.tools.test_tag import OPTIONS, SCHEMA, assert_rows_match, texts, write_jsonl

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    ray.data.DataContext.get_current().enable_progress_bars = False
    yield
    ray.shutdown()


def blocks(table: pa.Table, size: int) -> ray.data.Dataset:
    return ray.data.from_arrow([table.slice(i, size) for i in range(0, table.num_rows, size)])


def by_id(rows: list[dict], column: str = "doc") -> list[dict]:
    return sorted(rows, key=lambda r: int(r[column][1:]))


def test_tag_dataset_equals_extract_one_document_at_a_time(cluster, tiny_folder, tiny_folder_engine):
    """Two actors (one is the fault test's case below)."""
    docs = texts(24)
    table = pa.table({"doc": [f"n{i}" for i in range(24)], "text": docs, "source": ["feed"] * 24})
    out = tag_dataset(
        blocks(table, 6), SCHEMA, model=tiny_folder, backend="torch", options=OPTIONS, batch_size=6, concurrency=2
    )
    rows = by_id(out.take_all())
    assert list(rows[0])[:2] == ["doc", "source"] and "text" not in rows[0]  # other columns pass through
    expected = {f"n{i}": tiny_folder_engine.extract(t, SCHEMA, **OPTIONS) for i, t in enumerate(docs)}
    assert_rows_match([{**r, "id": r["doc"]} for r in rows], expected)


def test_tag_dataset_refuses_bad_input_before_running(cluster):
    ds = ray.data.from_arrow(pa.table({"body": ["x"], "error": ["y"]}))
    with pytest.raises(InputError, match="column 'text'"):
        tag_dataset(ds, SCHEMA)
    with pytest.raises(SchemaError, match="'error'"):
        tag_dataset(ds, {"type": "object", "properties": {"error": {"type": "boolean"}}}, text_column="body")
    with pytest.raises(OptionError, match="concurrency"):
        tag_dataset(ds, SCHEMA, text_column="body", concurrency=0)


def _tagger_processes() -> list[int]:
    import psutil

    found = []
    for process in psutil.process_iter(["pid", "cmdline"]):
        if "PCDTagger" in " ".join(process.info["cmdline"] or ()):
            found.append(process.info["pid"])
    return found


def test_an_actor_killed_mid_job_is_restarted_and_nothing_is_lost_or_duplicated(
    cluster, tiny_folder, tiny_folder_engine
):
    docs = texts(40)
    table = pa.table({"doc": [f"n{i}" for i in range(40)], "text": docs})
    out = tag_dataset(blocks(table, 4), SCHEMA, model=tiny_folder, backend="torch", options=OPTIONS, batch_size=4)
    rows: list[dict] = []
    killed: list[int] = []
    for batch in out.iter_batches(batch_size=None, batch_format="pyarrow"):
        rows.extend(batch.to_pylist())
        if not killed:
            pids = _tagger_processes()
            assert pids, "no actor process found"
            os.kill(pids[0], signal.SIGKILL)
            killed.append(pids[0])
    assert killed and len(rows) > 4  # rows kept coming after the kill
    assert sorted(r["doc"] for r in rows) == sorted(f"n{i}" for i in range(40))  # each once
    expected = {f"n{i}": tiny_folder_engine.extract(t, SCHEMA, **OPTIONS) for i, t in enumerate(docs)}
    assert_rows_match([{**r, "id": r["doc"]} for r in by_id(rows)], expected)


def test_pcd_tag_on_ray_writes_what_it_writes_in_process(cluster, tiny_folder, tmp_path, capsys):
    source = write_jsonl(tmp_path / "in.jsonl", [{"text": t} for t in texts(20)] + [{"text": ""}])
    (tmp_path / "s.json").write_text(json.dumps(SCHEMA), encoding="utf-8")
    common = [
        "tag",
        tiny_folder,
        "-q",
        "--backend",
        "torch",
        "--schema",
        str(tmp_path / "s.json"),
        "--input",
        str(source),
    ]
    common += ["--part-size", "5", "--max-tokens", "6"]
    assert main([*common, "--output", str(tmp_path / "local.parquet")]) == 0
    assert main([*common, "--output", str(tmp_path / "ray.parquet"), "--ray", "--concurrency", "2"]) == 0
    out = capsys.readouterr().out
    assert "21 documents (21 tagged now" in out and "1 error rows" in out
    local, on_ray = (pq.read_table(tmp_path / f"{n}.parquet").to_pylist() for n in ("local", "ray"))
    schema = compile_schema(SCHEMA)
    assert [r["id"] for r in on_ray] == [r["id"] for r in local]
    assert [row_values(schema, r) for r in on_ray] == [row_values(schema, r) for r in local]
    for a, b in zip(local[:-1], on_ray[:-1]):
        assert a["topic__probability"] == pytest.approx(b["topic__probability"], abs=1e-5)
    assert on_ray[-1]["error"] == local[-1]["error"] and "document '20'" in on_ray[-1]["error"]
    assert pq.read_schema(tmp_path / "ray.parquet").metadata == pq.read_schema(tmp_path / "local.parquet").metadata


# ------------------------------------------------------------------------------------------------ real model


@pytest.mark.real_model
def test_bbc_articles_on_ray_equal_in_process_row_for_row_and_extract_one_at_a_time(
    cluster, default_engine, smol_alone, bbc_leads, tmp_path
):
    """32 articles on two actors (two blocks of 16) equal the in-process tagging row for row, and the in-process
    rows equal ``extract`` one document at a time, whose results test_batch has already computed for the same
    articles (a session memo). It was 200 articles, then 64: the Ray path (blocks, actors, one engine per actor,
    the tagging runner) is the same for any count, and each cut gave CI time back (tests/conftest.py's bbc_leads)."""
    from pcd_engine.tagging.job import tag_corpus

    leads = bbc_leads
    ids = [f"n{i}" for i in range(len(leads))]
    source = write_jsonl(tmp_path / "bbc.jsonl", [{"text": t, "doc": d} for d, t in zip(ids, leads)])
    out = tmp_path / "bbc.parquet"
    raw = {"correction": "none"}  # as smol_alone reads them
    summary = tag_corpus(source, BBC_SCHEMA, out, engine=default_engine, id_column="doc", options=raw)
    assert (summary.documents, summary.errors) == (len(leads), 0)
    local = pq.read_table(out).to_pylist()
    alone = {d: smol_alone(t, BBC_SCHEMA) for d, t in zip(ids, leads)}
    assert_rows_match(local, alone, schema=BBC_SCHEMA)

    table = pa.table({"doc": ids, "text": leads})
    tagged = tag_dataset(blocks(table, 16), BBC_SCHEMA, batch_size=16, concurrency=2, id_column="doc", options=raw)
    on_ray = by_id(tagged.take_all())
    assert [r["doc"] for r in on_ray] == [r["id"] for r in local] == ids
    compiled = compile_schema(BBC_SCHEMA)
    for mine, theirs in zip(local, on_ray, strict=True):
        assert theirs["error"] is None and theirs["warnings"] == mine["warnings"]
        assert row_values(compiled, theirs) == row_values(compiled, mine)
        probabilities = [k for k in mine if k.endswith("__probability") and mine[k] is not None]
        assert probabilities
        assert [theirs[k] for k in probabilities] == pytest.approx([mine[k] for k in probabilities], abs=1e-5)
