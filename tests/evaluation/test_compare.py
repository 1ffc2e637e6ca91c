"""compare_systems on a tiny on-disk store: numbers, files, baseline checks."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.search.tiny_store import write_tiny_store
from treerank.evaluation.compare import compare_systems
from treerank.evaluation.settings import EvaluationSettings
from treerank.metrics.metrics import evaluate_run
from treerank.metrics.qrels import Qrels
from treerank.names import file_name
from treerank.search.specs import build_system


def test_compare_writes_everything(tmp_path) -> None:
    store = write_tiny_store(tmp_path / "test")
    comp = compare_systems(
        store,
        ["cosine", "bm25", "rrf:bm25+cosine"],
        settings=EvaluationSettings(
            baseline="cosine",
            k=8,
            metrics=("mrr@10", "ndcg@10", "recall@5"),
            n_permutations=200,
            second_baseline="bm25",
        ),
        out_dir=tmp_path / "out",
    )
    cos = evaluate_run(build_system("cosine").retrieve(store, 8), Qrels.from_store(store))
    assert comp.mean("cosine", "mrr@10") == pytest.approx(cos.mean["mrr@10"])
    assert comp.tests["cosine"]["bm25"]["mrr@10"].delta == pytest.approx(
        comp.mean("bm25", "mrr@10") - comp.mean("cosine", "mrr@10")
    )
    assert set(comp.tests) == {"cosine", "bm25"} and "cosine" not in comp.tests["cosine"]
    out = tmp_path / "out"
    res = json.loads((out / "results.json").read_text())
    assert res["systems"]["bm25"]["n_evaluated"] == 4
    assert set(res["mcnemar_hit@10"]["cosine"]) == {"bm25", "rrf:bm25+cosine"}
    lines = (out / "per_query.jsonl").read_text().splitlines()
    assert len(lines) == 3 * 4 and json.loads(lines[0])["query_id"] == "q0"
    assert (out / "runs" / f"{file_name('rrf:bm25+cosine')}.trec").read_text().startswith("q0 Q0 p")
    assert (out / "plots" / "deltas.png").read_bytes()[:4] == b"\x89PNG"
    assert (out / "plots" / "recall_at_k.png").stat().st_size > 1000
    table = (out / "table.md").read_text()
    assert "cosine (baseline)" in table and "Δ ndcg@10" in table
    header, rows = comp.table()
    assert header[:4] == ["system", "mrr@10", "Δ mrr@10", "p"] and len(rows) == 3


def test_baseline_must_be_a_system(tmp_path) -> None:
    store = write_tiny_store(tmp_path / "test")
    with pytest.raises(ValueError, match="baseline"):
        compare_systems(store, ["bm25"], settings=EvaluationSettings(baseline="cosine"))


def test_threshold_two_leaves_out_queries(tmp_path) -> None:
    store = write_tiny_store(tmp_path / "test", threshold=2)
    comp = compare_systems(
        store, ["cosine"], settings=EvaluationSettings(baseline="cosine", k=8, n_permutations=10)
    )
    r = comp.results["cosine"]
    assert (r.n_evaluated, r.n_left_out) == (1, 3)  # only query 0 has a grade-2 passage
    assert np.isnan(r.per_query["mrr@10"][1])


def _beir_store(root, encoder, corpus, queries, qrels):
    """Write a BEIR folder, read it and embed it with the real encoder; return the store."""
    from treerank.readers.beir import read_beir
    from treerank.store import EmbeddingStore, embed_split

    src = root / "beir"
    (src / "qrels").mkdir(parents=True)
    (src / "corpus.jsonl").write_text(
        "".join(json.dumps({"_id": d, "text": t}) + "\n" for d, t in corpus)
    )
    (src / "queries.jsonl").write_text(
        "".join(json.dumps({"_id": q, "text": t}) + "\n" for q, t in queries)
    )
    (src / "qrels" / "test.tsv").write_text(
        "query-id\tcorpus-id\tscore\n" + "".join(f"{q}\t{d}\t{g}\n" for q, d, g in qrels)
    )
    embed_split(read_beir(src, "test"), encoder, root / "store" / "test", progress=False)
    return EmbeddingStore.open(root / "store" / "test")


def test_stopword_only_corpus_evaluates_every_system(tmp_path, encoder) -> None:
    # issue 10, item 1: evaluate used to exit with "max() arg is an empty sequence" and lose
    # the cosine result too
    store = _beir_store(
        tmp_path,
        encoder,
        [("d1", "the"), ("d2", "and of"), ("d3", "is it")],
        [("q1", "what is it")],
        [("q1", "d3", 1)],
    )
    comp = compare_systems(
        store,
        ["cosine", "bm25", "rrf:bm25+cosine"],
        settings=EvaluationSettings(baseline="cosine", k=3, n_permutations=10),
        out_dir=tmp_path / "out",
    )
    assert comp.failed == {}
    assert comp.runs["bm25"].ids.tolist() == [[-1, -1, -1]]  # BM25 scores 0 everywhere
    assert comp.mean("bm25", "mrr@10") == 0.0  # retrieved nothing: 0, as trec_eval -c
    cos_ids = comp.runs["cosine"].ids[0].tolist()
    rank = cos_ids.index(2) + 1
    assert comp.mean("cosine", "mrr@10") == pytest.approx(1.0 / rank)
    assert comp.runs["rrf:bm25+cosine"].ids[0].tolist() == cos_ids  # BM25 adds no rank credit
    assert comp.mean("rrf:bm25+cosine", "mrr@10") == pytest.approx(1.0 / rank)
    assert (tmp_path / "out" / "runs" / "bm25.trec").read_text() == ""


class _Broken:
    name = "broken"

    def retrieve(self, store, k=1000):
        raise RuntimeError("index exploded")


def test_one_failing_system_never_takes_the_others_down(tmp_path) -> None:
    store = write_tiny_store(tmp_path / "test")
    comp = compare_systems(
        store,
        {"cosine": "cosine", "broken": _Broken(), "bm25": "bm25"},
        settings=EvaluationSettings(baseline="cosine", k=8, n_permutations=10),
        out_dir=tmp_path / "out",
    )
    assert comp.failed == {"broken": "RuntimeError: index exploded"}
    assert set(comp.results) == {"cosine", "bm25"} and set(comp.tests["cosine"]) == {"bm25"}
    res = json.loads((tmp_path / "out" / "results.json").read_text())
    assert res["failed"] == {"broken": "RuntimeError: index exploded"}
    assert (
        "**broken failed**: RuntimeError: index exploded"
        in (tmp_path / "out" / "table.md").read_text()
    )
    assert sorted(p.name for p in (tmp_path / "out" / "runs").iterdir()) == [
        "bm25.trec",
        "cosine.trec",
    ]
    # a failing baseline: the others are still evaluated, no test against it
    comp = compare_systems(
        store,
        {"broken": _Broken(), "cosine": "cosine"},
        settings=EvaluationSettings(baseline="broken", k=8, n_permutations=10),
    )
    assert set(comp.results) == {"cosine"} and comp.tests == {}


def test_ignore_identical_ids_drops_self_hits(tmp_path, encoder) -> None:
    # issue 10, item 10: ArguAna / Quora style, each query is also a corpus document (same id)
    corpus = [
        ("a1", "Cats should be allowed to roam outdoors freely."),
        ("a2", "Outdoor cats live shorter lives and kill wild birds."),
        ("a3", "Nuclear power is the safest source of low carbon energy."),
        ("a4", "Nuclear plants produce waste that stays dangerous for millennia."),
    ]
    queries = [("a1", corpus[0][1]), ("a3", corpus[2][1])]
    store = _beir_store(tmp_path, encoder, corpus, queries, [("a1", "a2", 1), ("a3", "a4", 1)])
    plain = compare_systems(
        store, ["cosine"], settings=EvaluationSettings(baseline="cosine", k=4, n_permutations=10)
    )
    ids = plain.runs["cosine"].ids
    assert ids[:, 0].tolist() == [0, 2]  # each query's own document ranks first (same text)
    kept = compare_systems(
        store,
        ["cosine"],
        settings=EvaluationSettings(
            baseline="cosine", k=4, n_permutations=10, ignore_identical_ids=True
        ),
        out_dir=tmp_path / "out",
    )
    for i, (own, rel) in enumerate([(0, 1), (2, 3)]):
        rank = ids[i].tolist().index(rel) + 1
        assert plain.results["cosine"].per_query["mrr@10"][i] == pytest.approx(1 / rank)
        assert kept.results["cosine"].per_query["mrr@10"][i] == pytest.approx(1 / (rank - 1))
        assert own not in kept.doc_runs["cosine"].ids[i].tolist()
    lines = (tmp_path / "out" / "runs" / "cosine.trec").read_text().splitlines()
    assert not [ln for ln in lines if ln.split()[0] == ln.split()[2]]
    assert len(lines) == 2 * 3  # k = 4 passages, the self-hit dropped
    assert kept.departures["self_hits_dropped"] == 2
