"""k-fold CV over topics (`treerank.evaluation.folds`) and the cross-validated forest of
`bench/bench_forest_rescore.py`, on the cached DL19 fixture store (10 topics, 2,000 passages)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.bench_module import load_bench
from treerank.evaluation.folds import relevant_rows, topic_folds
from treerank.kernels.vectors import l2_normalize
from treerank.metrics.metrics import evaluate_run
from treerank.metrics.qrels import Qrels

REPO = Path(__file__).resolve().parents[2]


class _Labels:
    """A store-like with only the judged candidates (what the fold rule reads)."""

    relevance_threshold = 2

    def __init__(self, labels: list[list[int]]) -> None:
        self.labels = np.array(labels)
        self.candidates = np.where(self.labels >= 0, np.arange(self.labels.shape[1]), -1)


def test_topic_folds_partition_the_queries_with_a_relevant_candidate() -> None:
    # row 2 has only grades 0-1, row 4 only a padded slot: neither is evaluated
    store = _Labels([[3, 0], [2, 1], [1, 0], [0, 2], [-1, -1], [3, 3], [2, 0]])
    store.candidates[4] = -1
    assert relevant_rows(store).tolist() == [0, 1, 3, 5, 6]
    folds = topic_folds(store, 2, seed=0)
    # by hand: the fold rule of forest_experiment.py before it moved here
    perm = np.random.default_rng(0).permutation(np.array([0, 1, 3, 5, 6]))
    assert [f.tolist() for f in folds] == [
        sorted(perm[:3].tolist()),
        sorted(perm[3:].tolist()),
    ]
    assert sorted(np.concatenate(folds).tolist()) == [0, 1, 3, 5, 6]
    assert [f.tolist() for f in topic_folds(store, 2, seed=0)] == [f.tolist() for f in folds]
    assert [f.tolist() for f in topic_folds(store, 5, seed=0)] == [[r] for r in perm.tolist()]
    with pytest.raises(ValueError, match="n_folds=1: need 2 <= n_folds <= 5"):
        topic_folds(store, 1)
    with pytest.raises(ValueError, match="n_folds=6"):
        topic_folds(store, 6)


def _bench() -> Any:
    return load_bench("bench_forest_rescore")


def test_cv_forest_ranks_each_topic_with_the_fold_that_did_not_train_on_it(
    dl19_store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import treerank.forest.trainer as training

    st = dl19_store["test"]
    bench = _bench()
    seen_rows: list[np.ndarray] = []
    real_train = training.train_forest

    def spy(store: Any, cfg: Any, *, train_rows: np.ndarray, **kw: Any) -> Any:
        seen_rows.append(np.asarray(train_rows))
        return real_train(store, cfg, train_rows=train_rows, **kw)

    monkeypatch.setattr(training, "train_forest", spy)
    argv = [
        "bench_forest_rescore.py",
        "--store",
        str(st.path),
        "--cv-config",
        str(REPO / "configs" / "forest" / "dl19_cv.yaml"),
        "--cv-folds",
        "2",
        "--set",
        "model.n_models=3",
        "model.n_classes=8",
        "trainer.steps_query=2",
        "trainer.steps_passage=4",
        "trainer.steps_joint=2",
        "--work",
        str(tmp_path / "work"),
        "--settings",
        "1,1",
        "2,1",
        "--depths",
        "40",
        "--twin-seeds",
        "0",
        "--nprobe",
        "2",
        "--ef",
        "16",
        "--label",
        "fixture",
        "--out",
        str(tmp_path / "out"),
    ]
    monkeypatch.setattr(sys, "argv", argv)
    bench.main()
    doc = json.loads((tmp_path / "out" / "results.json").read_text())
    folds = topic_folds(st, 2, seed=0)
    qids = st.query_ids()
    assert doc["cv"]["held_out_query_ids"] == [[qids[i] for i in f] for f in folds]
    assert sorted(sum(doc["cv"]["held_out_query_ids"], [])) == sorted(qids)
    # each fold trained on exactly the other fold's topics
    assert [r.tolist() for r in seen_rows] == [folds[1].tolist(), folds[0].tolist()]
    assert [f["train_queries"] for f in doc["cv"]["folds"]] == [len(folds[1]), len(folds[0])]
    assert all(0.0 <= f["not_retrievable_fraction"] <= 1.0 for f in doc["cv"]["folds"])
    assert "2-fold cross-validation" in (tmp_path / "out" / "table.md").read_text()

    # reference: the cached fold forests searched by hand, runs put back in query order,
    # candidates re-ranked by a dense numpy cosine
    cached = sorted((tmp_path / "work").glob("fold*of2-*.pt"))
    assert [c.name[:8] for c in cached] == ["fold0of2", "fold1of2"]
    forests = [bench.load_forest(str(c)) for c in cached]
    q = l2_normalize(np.asarray(st.queries, dtype=np.float32))
    p = l2_normalize(np.asarray(st.passages, dtype=np.float32))
    assert [f["not_retrievable_fraction"] for f in doc["cv"]["folds"]] == [
        float((f.passage_classes(p)[0] < 0).mean()) for f in forests
    ]
    ids = np.full((len(q), 100), -1, dtype=np.int64)
    scored = np.zeros(len(q))
    from treerank.forest.index import ForestIndex

    for forest, held in zip(forests, folds, strict=True):
        index = ForestIndex.build(*forest.passage_classes(p), n_classes=forest.n_classes)
        hits = index.search(*forest.query_classes(q[held]), 40)
        for row, cand in zip(held, hits.ids, strict=True):
            cand = cand[cand >= 0]
            scored[row] = len(cand)
            sims = p[cand].astype(np.float64) @ q[row].astype(np.float64)
            ids[row, : len(cand)] = cand[np.lexsort((cand, -sims))][:100]
    row = next(
        r for r in doc["rows"] if r["system"] == "forest" and r["setting"].startswith("M=3 C=8 t=1")
    )
    assert row["setting"] == "M=3 C=8 t=1 K=1 N=40 (2-fold CV)"
    assert row["scored_per_query"] == pytest.approx(scored.mean(), abs=1e-9)
    want = evaluate_run(ids, Qrels.from_store(st), ["ndcg@10", "recall@100"]).mean
    assert row["parts"]["all"]["ndcg@10"] == pytest.approx(want["ndcg@10"], abs=1e-6)
    assert row["parts"]["all"]["recall@100"] == pytest.approx(want["recall@100"], abs=1e-6)
    assert 0.0 < row["recall100_vs_cosine"] <= 1.0

    # --render-only rewrites the same table from results.json
    table = (tmp_path / "out" / "table.md").read_text()
    (tmp_path / "out" / "table.md").unlink()
    bench.main(["--render-only", "--out", str(tmp_path / "out")])
    assert (tmp_path / "out" / "table.md").read_text() == table

    # a rerun reads the folds' forests from the cache and gives the same rows
    seen_rows.clear()
    bench.main()
    again = json.loads((tmp_path / "out" / "results.json").read_text())
    assert seen_rows == []
    assert [f["cached"] for f in again["cv"]["folds"]] == [True, True]
    pick = ("system", "setting", "scored_per_query", "postings_per_query", "parts")
    assert [{k: r[k] for k in pick} for r in again["rows"] if r["system"] == "forest"] == [
        {k: r[k] for k in pick} for r in doc["rows"] if r["system"] == "forest"
    ]


def test_budget_summary_picks_the_best_point_within_each_budget() -> None:
    bench = _bench()

    def row(system: str, setting: str, scored: float, rec: float, ndcg: float) -> dict[str, Any]:
        return {
            "system": system,
            "setting": setting,
            "scored_per_query": scored,
            "fraction_scored": scored / 1000,
            "postings_per_query": 10 * scored,
            "recall100_vs_cosine": rec,
            "parts": {"all": {"ndcg@10": ndcg}},
        }

    doc = {
        "rows": [
            row("exact cosine", "all", 1000, 1.0, 0.6),
            row("ivf", "a", 10, 0.5, 0.4),
            row("ivf", "b", 20.4, 0.9, 0.55),  # 2.04 % shows as 2.0 %: within the 2 % budget
            row("ivf", "c", 21, 0.95, 0.58),  # 2.1 %: outside it
            row("ivf", "d", 50, 0.95, 0.59),  # ties c on recall, scores more: c wins at 5 %
            row("twin", "e", 60, 1.0, 0.6),  # 6 %: in no budget
        ]
    }
    lines = bench.budget_summary(doc).splitlines()
    assert lines[4] == (
        "| ivf | 0.900 (b; 204 postings) | -0.0500 | 0.950 (c; 210 postings) | -0.0200 |"
    )
    assert lines[5] == "| twin | - | - | - | - |"
