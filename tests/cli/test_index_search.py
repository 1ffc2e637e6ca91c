"""`treerank index build | info` and `treerank search` on the real SciFact test store."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from treerank.cli.main import app
from treerank.search.systems import build_system

runner = CliRunner()


def test_index_build_then_info(scifact_store, tmp_path) -> None:
    store = scifact_store["test"]
    args = ["index", "build", "--store", str(store.path), "--index", "faiss:ivfflat:nlist=16"]
    res = runner.invoke(app, [*args, "--index-dir", str(tmp_path), "--no-progress", "--json"])
    assert res.exit_code == 0, res.output
    meta = json.loads(res.stdout)
    assert meta["kind"] == "ivfflat" and meta["build"]["nlist"] == 16
    assert meta["n_passages"] == 5183 and meta["index_bytes"] > 5183 * 384 * 4
    res = runner.invoke(app, ["index", "info", meta["path"]])
    assert res.exit_code == 0, res.output
    assert "ivfflat" in res.output and "5183" in res.output
    bad = runner.invoke(app, [*args[:-1], "faiss:annoy", "--index-dir", str(tmp_path)])
    assert bad.exit_code == 2 and "unknown index kind 'annoy'" in bad.output
    missing = runner.invoke(app, ["index", "info", str(tmp_path / "nowhere")])
    assert missing.exit_code == 2 and "nowhere" in missing.output


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
    res = runner.invoke(app, ["search", "--store", str(store.path), "--format", "xml", "-q", "a"])
    assert res.exit_code == 2 and "table, json or trec" in res.output
    res = runner.invoke(app, ["search", "--store", str(store.path)])
    assert res.exit_code == 2 and "--query" in res.output
