"""`treerank index build | info` and `treerank search` on the real SciFact test store."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from treerank.cli.main import app
from treerank.search.specs import build_system

runner = CliRunner()


def test_index_build_then_info(scifact_store, tmp_path) -> None:
    store = scifact_store["test"]
    args = ["index", "build", "--store", str(store.path), "--index", "faiss:ivfflat:nlist=16"]
    res = runner.invoke(app, [*args, "--index-dir", str(tmp_path), "--no-progress", "--json"])
    assert res.exit_code == 0, res.output
    meta = json.loads(res.stdout)
    assert meta["kind"] == "ivfflat" and meta["build"]["nlist"] == 16
    assert meta["n_passages"] == 5183 and meta["index_bytes"] > 5183 * 384 * 4
    assert meta["build"]["train_size"] == meta["train_rows"] == 5183  # the default: all rows
    res = runner.invoke(app, ["index", "info", meta["path"]], env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    assert "ivfflat" in res.output and "5183" in res.output
    assert "training sample" in res.output and "5,183 of 5,183 passages" in res.output
    assert "train_size" not in res.output and "train_rows" not in res.output
    bad = runner.invoke(app, [*args[:-1], "faiss:annoy", "--index-dir", str(tmp_path)])
    assert bad.exit_code == 2 and "unknown index kind 'annoy'" in bad.output
    missing = runner.invoke(app, ["index", "info", str(tmp_path / "nowhere")])
    assert missing.exit_code == 2 and "nowhere" in missing.output


def test_index_build_names_a_bad_index_spec(tmp_path) -> None:
    # the spec is checked before the store is opened: no store needed
    base = ["index", "build", "--store", str(tmp_path / "no-store"), "--index"]
    res = runner.invoke(app, [*base, "faiss:hnws:M=8"])
    assert res.exit_code == 2
    assert (
        "error: --index: bad index spec 'faiss:hnws:M=8': unknown index kind 'hnws'; "
        "did you mean 'hnsw'? known: flat, hnsw, ivfflat, ivfpq, ivfpqfs, int8, fp16, binary"
    ) in res.output
    res = runner.invoke(app, [*base, "ivfflat:nprobes=4"])
    assert res.exit_code == 2 and "bad index spec 'ivfflat:nprobes=4': 'nprobes=4'" in res.output
    assert "system spec" not in res.output


def test_index_build_help_lists_the_index_kinds() -> None:
    from treerank.search.faiss_index import INDEX_KINDS

    res = runner.invoke(app, ["index", "build", "--help"], env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    kinds = res.output.split("Index kinds (faiss:<kind>[:k=v,...]; defaults shown):", 1)[1]
    listed = [ln.split()[0] for ln in kinds.splitlines() if ln[:2] == "  " and ln[2:3].strip()]
    assert listed == list(INDEX_KINDS)
    assert INDEX_KINDS["ivfpq"].help in " ".join(kinds.split())


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("faiss:hnsw:efsearch=64", "'efsearch=64' is not one of M=..., ef_construction=..."),
        ("faiss:hnsw:ef_search=many", "ef_search='many' is not a int"),
        ("faiss:hnws", "did you mean 'hnsw'?"),
    ],
)
def test_search_checks_the_system_spec_before_loading_the_encoder(
    scifact_store, monkeypatch, spec: str, message: str
) -> None:
    import treerank.search.query

    def no_encoder(*args, **kwargs):
        raise AssertionError("the encoder was loaded before the spec was checked")

    monkeypatch.setattr(treerank.search.query, "load_store_encoder", no_encoder)
    store = scifact_store["test"]
    res = runner.invoke(app, ["search", "--store", str(store.path), "-q", "x", "--system", spec])
    assert res.exit_code == 2 and f"bad system spec {spec!r}" in res.output
    assert message in res.output


def test_search_formats(scifact_store, tmp_path) -> None:
    store = scifact_store["test"]
    texts = store.query_texts()[:2]
    qfile = tmp_path / "q.tsv"
    qfile.write_text(f"a1\t{texts[0]}\nb2\t{texts[1]}\n", encoding="utf-8")
    base = ["search", "--store", str(store.path), "--queries", str(qfile), "-k", "3"]
    res = runner.invoke(app, [*base, "--format", "json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)  # the model's loading bar goes to stderr
    exact = build_system("cosine").retrieve(store, 3)
    assert [d["query_id"] for d in doc] == ["a1", "b2"]
    assert [d["system"] for d in doc] == ["cosine", "cosine"]  # the default --system
    assert [h["passage_id"] for h in doc[0]["hits"]] == exact.ids[0].tolist()
    trec = tmp_path / "run.trec"
    res = runner.invoke(app, [*base, "--format", "trec", "--out", str(trec)])
    assert res.exit_code == 0, res.output
    lines = trec.read_text().splitlines()
    pids = store.passage_ids()
    assert len(lines) == 6
    assert lines[0].split()[:4] == ["a1", "Q0", pids[exact.ids[0, 0]], "1"]
    res = runner.invoke(app, ["search", "--store", str(store.path), "-q", texts[0], "-k", "2"])
    assert res.exit_code == 0 and pids[exact.ids[0, 0]] in res.output
    assert res.stdout.splitlines()[0] == "system: cosine"
    bm25 = ["search", "--store", str(store.path), "-q", texts[0], "--system", "bm25:k1=1.2"]
    res = runner.invoke(app, [*bm25, "-k", "1", "--format", "json"])
    assert res.exit_code == 0 and json.loads(res.stdout)[0]["system"] == "bm25:k1=1.2"
    res = runner.invoke(app, ["search", "--store", str(store.path), "--format", "xml", "-q", "a"])
    assert res.exit_code == 2 and "table, json or trec" in res.output
    res = runner.invoke(app, ["search", "--store", str(store.path)])
    assert res.exit_code == 2 and "--query" in res.output
