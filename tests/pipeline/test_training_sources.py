"""train_model with data.sources: a BM25 teacher (soft) + labels with negatives: all on a toy
store; pseudo-queries on a copy of the real SciFact store (built once, reused); the ANCE refresh;
config errors name the source entry."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from treerank.config import ConfigError
from treerank.store import EmbeddingStore
from treerank.tasks.train import train_model
from treerank.training.data import pseudo_dir, teacher_array
from treerank.training.heads import parse_linear_config

from .test_training import CFG, write_store


def _cfg(data: dict, trainer: dict | None = None) -> dict:
    return {
        **CFG,
        "data": {**CFG["data"], **data},
        "trainer": {**CFG["trainer"], "epochs": 3, **(trainer or {})},
    }


def test_teacher_and_labels_with_all_negatives(tmp_path):
    store = write_store(tmp_path / "stores" / "toy" / "train")
    sources = [
        {"kind": "labels", "weight": 1.0},
        {
            "kind": "teacher",
            "system": "bm25",
            "k": 10,
            "mode": "soft",
            "temperature": 2.0,
            "weight": 0.5,
        },
    ]
    cfg = _cfg({"sources": sources}, {"negatives": "all", "chunk_size": 64})
    res = train_model("linear", store, cfg, tmp_path / "ck", progress=False)
    stem = teacher_array(_spec(sources[1]))
    ids = store.load_array(f"{stem}-ids")
    assert ids is not None and ids.shape == (80, 10)  # every query ranked once, kept on disk
    info = res.summary["sampler"]["sources"]
    # held-out queries never become pairs, for either source
    assert info["0:labels"]["pairs"] == 60 and info["1:teacher:bm25"]["pairs"] == 60
    assert info["1:teacher:bm25"]["mode"] == "soft"
    assert res.summary["training_sources"]["teacher:bm25"].endswith(f"{stem}-ids.npy")
    logged = [json.loads(x) for x in res.log_path.read_text().splitlines()] if res.log_path else []
    losses = [r["loss"] for r in logged if r["kind"] == "train"]
    assert losses and all(np.isfinite(losses))
    assert res.summary["best_metrics"]["ndcg@10"] > 0


def _spec(d):
    from treerank.training.data import SourceSpec

    return SourceSpec(**d)


def test_source_config_errors_name_the_entry():
    with pytest.raises(ConfigError, match=r"data.*sources\[1\].*systm"):
        parse_linear_config(
            _cfg({"sources": [{"kind": "labels"}, {"kind": "teacher", "systm": "bm25"}]})
        )
    with pytest.raises(ConfigError, match="needs system"):
        parse_linear_config(_cfg({"sources": [{"kind": "teacher"}]}))
    with pytest.raises(ConfigError, match="negatives"):
        parse_linear_config(_cfg({}, {"negatives": "some"}))


def test_pseudo_source_on_real_scifact_copy(scifact_store, tmp_path):
    src = scifact_store["train"]
    shutil.copytree(src.path, tmp_path / "scifact" / "train")
    store = EmbeddingStore.open(tmp_path / "scifact" / "train")
    sources = [
        {"kind": "pseudo", "methods": ["ict"], "cap": 40, "positive": "source"},
        {"kind": "labels"},
    ]
    cfg = _cfg({"sources": sources, "batch_size": 32}, {"max_steps": 6, "eval_every": 3})
    res = train_model("linear", store, cfg, tmp_path / "ck", progress=False)
    path = pseudo_dir(store, _spec(sources[0]))
    pseudo = EmbeddingStore.open(path)
    assert pseudo.n_queries == 40 and pseudo.n_passages == store.n_passages
    assert res.summary["sampler"]["sources"]["0:pseudo"]["pairs"] == 40
    before = (path / "queries.bin").stat().st_mtime_ns
    train_model("linear", store, cfg, tmp_path / "ck2", progress=False)
    assert (path / "queries.bin").stat().st_mtime_ns == before  # built once, reused


def test_refresh_every_logs_the_audit(tmp_path):
    store = write_store(tmp_path / "stores" / "toy" / "train")
    cfg = _cfg({"refresh_depth": 20}, {"refresh_every": 4, "max_steps": 9})
    res = train_model("linear", store, cfg, tmp_path / "ck", progress=False)
    recs = [
        r
        for r in (res.log_path.read_text().splitlines() if res.log_path else [])
        if '"refresh"' in r
    ]
    assert len(recs) == 2 and '"guard_depth"' in recs[0]


def test_drt_reads_the_same_sources(tmp_path):
    store = write_store(tmp_path / "stores" / "toy" / "train")
    cfg = {
        "seed": 0,
        "model": {"k": 2, "slot_dim": 8, "hidden": 16, "attn_hidden": 8},
        "data": {
            "batch_size": 16,
            "sources": [
                {"kind": "teacher", "system": "bm25", "k": 5, "mode": "sample", "n_positives": 2}
            ],
        },
        "trainer": {
            "max_steps": 4,
            "epochs": 2,
            "negatives": "all",
            "chunk_size": 100,
            "threads": 1,
        },
        "validation": {"fraction": 0.25, "k": 50, "metrics": ["mrr@10", "ndcg@10"]},
    }
    res = train_model("drt", store, cfg, tmp_path / "ck", progress=False)
    info = res.summary["sampler"]["sources"]["0:teacher:bm25"]
    assert info["pairs"] == 60 and info["mode"] == "sample"
    assert res.summary["steps"] == 4


def test_forest_reads_the_same_sources(tmp_path):
    """The forest family prepares and reads data.sources like the heads: the BM25 teacher run is
    made once by the pipeline, its top-2 become positives beside the labels."""
    store = write_store(tmp_path / "stores" / "toy" / "train")
    teacher = {"kind": "teacher", "system": "bm25", "k": 5, "mode": "sample", "n_positives": 2}
    cfg = {
        "seed": 0,
        "model": {"n_models": 2, "n_classes": 4},
        "data": {"hard_negatives": 2, "sources": [{"kind": "labels"}, teacher]},
        "trainer": {"steps_query": 2, "steps_passage": 3, "steps_joint": 2},
        "validation": {"fraction": 0.25, "k": 50, "metrics": ["ndcg@10"]},
    }
    res = train_model("forest", store, cfg, tmp_path / "ck", progress=False)
    ids = store.load_array(f"{teacher_array(_spec(teacher))}-ids")
    assert ids is not None and ids.shape == (80, 5)
    info = res.summary["sources"]
    assert info["0:labels"]["pairs"] == 60 and info["1:teacher:bm25"]["pairs"] == 60
    # positives: the label pairs and the teacher's top 2 of the 60 training queries, each once
    gold = np.asarray(store.candidates)[:, 0]
    train = np.setdiff1d(np.arange(80), res.heldout_rows)
    want = {(q, int(gold[q])) for q in train} | {(q, int(p)) for q in train for p in ids[q, :2]}
    assert res.summary["n_positive_pairs"] == len(want) > 60
    with pytest.raises(ConfigError, match=r"sources"):
        train_model(
            "forest",
            store,
            {**cfg, "data": {"sources": [{"kind": "teacher"}]}},
            tmp_path / "bad",
            progress=False,
        )
