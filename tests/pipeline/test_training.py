"""train_model / treerank train end to end on a small on-disk store in the real format."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml
from typer.testing import CliRunner

from treerank.families import trainable_families
from treerank.kernels.topk import exact_search
from treerank.metrics.metrics import evaluate_run
from treerank.metrics.qrels import Qrels
from treerank.models.checkpoint import EncoderMismatchError
from treerank.models.linear import LinearHead
from treerank.models.registry import load_model
from treerank.store import EmbeddingStore
from treerank.tasks.train import (
    _subsample_passages,
    make_validator,
    train_model,
)
from treerank.training.holdout import ValidationConfig

ROOT = Path(__file__).resolve().parents[2]


def write_store(root: Path, nq: int = 80, npas: int = 300, dim: int = 16, seed: int = 0):
    """Queries are noisy rotated copies of their gold passage (a head can learn the rotation);
    texts share words with the gold passage so BM25 mining finds lexical near-misses."""
    rng = np.random.default_rng(seed)
    p = rng.standard_normal((npas, dim)).astype(np.float32)
    p /= np.linalg.norm(p, axis=1, keepdims=True)
    rot, _ = np.linalg.qr(rng.standard_normal((dim, dim)))
    gold = rng.choice(npas, size=nq, replace=False)
    q = 0.7 * p[gold] @ rot.T.astype(np.float32) + 0.3 * p[gold]
    q += 0.2 * rng.standard_normal(q.shape).astype(np.float32)
    q = (q / np.linalg.norm(q, axis=1, keepdims=True)).astype("<f4")
    vocab = [f"w{i}" for i in range(120)]
    ptext = [" ".join(rng.choice(vocab, 8)) for _ in range(npas)]
    qtext = [" ".join(list(ptext[g].split()[:3]) + list(rng.choice(vocab, 2))) for g in gold]
    cand = np.stack([gold, np.full(nq, -1)], axis=1).astype("<i4")
    lab = np.stack([np.ones(nq), np.zeros(nq)], axis=1).astype(np.uint8)
    root.mkdir(parents=True)
    q.tofile(root / "queries.bin")
    p.astype("<f4").tofile(root / "passages.bin")
    cand.tofile(root / "query_indices.bin")
    lab.tofile(root / "query_is_selected.bin")
    for name, texts, pre in (("queries", qtext, "q"), ("passages", ptext, "p")):
        (root / f"{name}.jsonl").write_text(
            "".join(json.dumps({"id": f"{pre}{i}", "text": t}) + "\n" for i, t in enumerate(texts))
        )
    meta = {
        "format": "treerank-store",
        "version": 1,
        "complete": True,
        "dim": dim,
        "k": 2,
        "n_queries": nq,
        "n_passages": npas,
        "normalized": True,
        "split": "train",
        "relevance_threshold": 1,
        "encoder": {"name": "toy", "fingerprint": "sha256:toy"},
    }
    (root / "meta.json").write_text(json.dumps(meta))
    return EmbeddingStore.open(root)


CFG = {
    "seed": 0,
    "data": {"batch_size": 16, "n_hard": 1, "mine_depth": 50},
    "trainer": {"epochs": 12, "lr": 5e-3, "log_every": 2, "patience": 4, "threads": 1},
    "validation": {"fraction": 0.25, "k": 50, "metrics": ["mrr@10", "ndcg@10"]},
}


@pytest.fixture
def store(tmp_path):
    return write_store(tmp_path / "stores" / "toy" / "train")


def test_train_model_writes_checkpoint_log_curves_and_mines(store, tmp_path):
    res = train_model("linear", store, CFG, tmp_path / "ck", progress=False)
    assert (tmp_path / "ck" / "config.json").is_file()
    assert res.log_path is not None and res.log_path.is_file()
    assert res.curves_path is not None and res.curves_path.read_bytes()[:4] == b"\x89PNG"
    assert res.heldout_rows.size == 20
    # the held-out queries were never trained on
    s = res.summary
    assert s["sampler"]["train_queries"] == 60
    assert s["sampler"]["resolved_source"] == "mined" and store.has_array("bm25_negatives")
    assert s["mined_negatives"]["depth"] == 50
    # the head learned something over its cosine start (held-out metric at step 0)
    evals = [json.loads(x) for x in res.log_path.read_text().splitlines()]
    evals = [r for r in evals if r["kind"] == "eval"]
    assert s["best_metrics"]["ndcg@10"] > evals[0]["ndcg@10"]
    # the checkpoint is bound to the store's encoder
    model = load_model(tmp_path / "ck", expected_fingerprint=store.encoder_fingerprint)
    assert isinstance(model, LinearHead)
    assert model.extra["training"]["best_step"] == s["best_step"]
    with pytest.raises(EncoderMismatchError):
        load_model(tmp_path / "ck", expected_fingerprint="sha256:other-encoder")


def test_validator_at_identity_equals_cosine_evaluation(store):
    rows = np.arange(0, 80, 4)
    vcfg = ValidationConfig(k=50, metrics=["mrr@10", "ndcg@10"])
    got = make_validator(store, rows, vcfg)(LinearHead(store.dim))
    ids, _ = exact_search(np.asarray(store.queries[rows]), store.passages, k=50)
    qrels = Qrels(np.asarray(store.candidates[rows]), np.asarray(store.labels[rows]))
    want = evaluate_run(ids, qrels, ["mrr@10", "ndcg@10"]).mean
    assert got == pytest.approx(want)


def test_forest_validator_searches_inverted_lists_never_one_hot(store, monkeypatch):
    """The held-out validator ranks a forest through its own search (sparse inverted lists),
    with the same metrics as the evaluation-time ForestSystem, and never builds the dense
    one-hot view (``encode_queries`` would be ``(n, 2 M C)`` floats)."""
    from treerank.forest.index import ForestSystem
    from treerank.forest.model import Forest, ForestConfig

    forest = Forest.random(ForestConfig(n_models=8, n_classes=4, dim=store.dim), seed=0)

    def no_dense(self, x):
        raise AssertionError("validator densified the forest")

    monkeypatch.setattr(Forest, "encode_queries", no_dense)
    monkeypatch.setattr(Forest, "encode_passages", no_dense)
    rows = np.arange(0, 60, 3)
    vcfg = ValidationConfig(k=20, metrics=["mrr@10", "recall@20"])
    got = make_validator(store, rows, vcfg)(forest)

    class View:
        queries = np.asarray(store.queries[rows])
        passages = store.passages

        def iter_passage_chunks(self, n):
            return store.iter_passage_chunks(n)

    run = ForestSystem(forest).retrieve(View(), 20)
    qrels = Qrels(np.asarray(store.candidates[rows]), np.asarray(store.labels[rows]))
    assert got == pytest.approx(evaluate_run(run.ids, qrels, ["mrr@10", "recall@20"]).mean)


def test_validator_subsample_keeps_gold_and_maps_ids(store):
    rows = np.arange(10)
    sub = _subsample_passages(store, rows, 40, seed=0)
    gold = np.asarray(store.candidates[rows, 0])
    assert sub.size == 40 and set(gold) <= set(sub.tolist())
    vcfg = ValidationConfig(k=10, max_passages=40, metrics=["mrr@10"])
    m_sub = make_validator(store, rows, vcfg)(LinearHead(store.dim))["mrr@10"]
    m_full = make_validator(store, rows, ValidationConfig(k=10, metrics=["mrr@10"]))(
        LinearHead(store.dim)
    )["mrr@10"]
    assert m_sub >= m_full  # fewer distractors can only help the gold passages


def test_unknown_model_and_registry():
    assert {"linear", "mlp", "drt", "forest"} <= set(trainable_families())
    with pytest.raises(KeyError, match="known"):
        train_model("svm", object(), {}, "unused")


def test_cli_train_with_shipped_config(store, tmp_path):
    from treerank.cli.main import app

    cfg = yaml.safe_load((ROOT / "configs" / "heads" / "mlp.yaml").read_text())
    cfg["trainer"].update(epochs=2, log_every=1)
    cfg["data"].update(batch_size=16, mine_depth=20)
    cfg["validation"].update(k=20)
    path = tmp_path / "mlp.yaml"
    path.write_text(yaml.safe_dump(cfg))
    root = store.path.parent  # a store root holding train/
    out = tmp_path / "ck-mlp"
    r = CliRunner().invoke(
        app,
        [
            "train",
            "--model",
            "mlp",
            "--store",
            str(root),
            "--config",
            str(path),
            "--out",
            str(out),
            "--no-progress",
        ],
    )
    assert r.exit_code == 0, r.output
    assert load_model(out, "sha256:toy").config()["dropout"] == cfg["model"]["dropout"]
    bad = tmp_path / "bad.yaml"
    bad.write_text("data: {batchsize: 3}\n")
    r = CliRunner().invoke(
        app,
        [
            "train",
            "--model",
            "linear",
            "--store",
            str(root),
            "--config",
            str(bad),
            "--out",
            str(tmp_path / "x"),
            "--no-progress",
        ],
    )
    assert r.exit_code == 2 and "batchsize" in r.output and "bad.yaml" in r.output


def test_grouped_holdout_config_runs(store, tmp_path):
    cfg = {
        **CFG,
        "trainer": {**CFG["trainer"], "epochs": 1},
        "validation": {**CFG["validation"], "group_by_passage": True},
    }
    res = train_model("linear", store, cfg, tmp_path / "ck", progress=False)
    held = set(res.heldout_rows.tolist())
    assert len(held) >= 20
    assert res.summary["validation"]["group_by_passage"] is True
