"""`export_sentence_transformers`: the exported directory reproduces treerank's head vectors on
real text (1e-5) and its metrics on a 400-passage SciFact slice (1e-4); the forest and DRT are
refused. The heads carry seeded random weights (far from their identity init), so every
parameter of every tower shows in the comparison."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from treerank.evaluation.settings import EvaluationSettings
from treerank.kernels.topk import exact_search
from treerank.models.checkpoint import save_checkpoint
from treerank.models.export_st import (
    EXPORT_INFO_FILE,
    NotExpressibleError,
    export_sentence_transformers,
)
from treerank.models.linear import LinearHead
from treerank.models.mlp import MLPHead
from treerank.search.run import Run

TOL_VECTORS = 1e-5
TOL_METRICS = 1e-4


def _perturbed(head: torch.nn.Module, seed: int) -> torch.nn.Module:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in head.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g))
    return head.eval()


def _save(head, encoder, path: Path) -> Path:
    save_checkpoint(path, head.to_checkpoint(encoder.name, encoder.fingerprint))
    return path


HEADS = {
    "linear-untied-bias": lambda: LinearHead(384, bias=True),
    "linear-shared-dot-128": lambda: LinearHead(384, out_dim=128, shared=True, scoring="dot"),
    "mlp-untied": lambda: MLPHead(384, hidden=256, dropout=0.1),
}


@pytest.mark.parametrize("name", sorted(HEADS))
def test_export_reproduces_head_vectors_on_real_text(name, encoder, msmarco_store, tmp_path):
    from sentence_transformers import SentenceTransformer

    st = msmarco_store["validation"]
    queries, passages = st.query_texts(), st.passage_texts()
    head = _perturbed(HEADS[name](), seed=sorted(HEADS).index(name))
    ckpt = _save(head, encoder, tmp_path / "ckpt")
    res = export_sentence_transformers(ckpt, tmp_path / "st")
    assert res.asymmetric == (not head.shared)
    info = json.loads((tmp_path / "st" / EXPORT_INFO_FILE).read_text())
    assert info["family"] == head.model_type

    model = SentenceTransformer(str(tmp_path / "st"), device="cpu")
    want_q = head.encode_queries(encoder.encode_queries(queries))
    want_p = head.encode_passages(encoder.encode_passages(passages))
    got_q = model.encode_query(queries, convert_to_numpy=True)
    got_p = model.encode_document(passages, convert_to_numpy=True)
    assert got_q.shape == want_q.shape and got_p.shape == want_p.shape
    assert np.abs(got_q - want_q).max() <= TOL_VECTORS
    assert np.abs(got_p - want_p).max() <= TOL_VECTORS
    # plain encode() is the passage (document) tower
    assert np.abs(model.encode(passages[:8]) - want_p[:8]).max() <= TOL_VECTORS
    if not head.shared:  # the towers differ, so routing matters
        assert np.abs(model.encode_query(passages[:8]) - want_p[:8]).max() > 1e-3


class _SentenceTransformerSystem:
    """Exact search with the exported model's own text encoders (what a user of OUT runs)."""

    def __init__(self, path: Path, name: str = "exported") -> None:
        from sentence_transformers import SentenceTransformer

        self.model = SentenceTransformer(str(path), device="cpu")
        self.name = name

    def retrieve(self, store, k: int = 1000) -> Run:
        q = self.model.encode_query(store.query_texts(), convert_to_numpy=True)
        p = self.model.encode_document(store.passage_texts(), convert_to_numpy=True)
        ids, scores = exact_search(q.astype(np.float32), p.astype(np.float32), k=k)
        return Run(self.name, ids, scores)


@pytest.fixture(scope="module")
def scifact_400(encoder, scifact_zip):
    from tests.conftest import cached_store
    from treerank.readers import read_split

    return cached_store(
        "scifact400",
        lambda: [read_split(scifact_zip, "scifact", "test", max_passages=400)],
        encoder,
    )["test"]


def test_exported_metrics_equal_checkpoint_metrics(encoder, scifact_400, tmp_path):
    from treerank.evaluation.compare import compare_systems

    store = scifact_400
    assert store.n_passages == 400
    ckpt = _save(_perturbed(MLPHead(384, hidden=256), seed=7), encoder, tmp_path / "mlp")
    export_sentence_transformers(ckpt, tmp_path / "st")
    comp = compare_systems(
        store,
        {"ckpt": f"ckpt:{ckpt}", "exported": _SentenceTransformerSystem(tmp_path / "st")},
        settings=EvaluationSettings(
            baseline="ckpt", k=100, metrics=("mrr@10", "ndcg@10", "recall@100"), n_permutations=200
        ),
    )
    a, b = comp.results["ckpt"].mean, comp.results["exported"].mean
    for m in ("mrr@10", "ndcg@10", "recall@100"):
        assert abs(a[m] - b[m]) <= TOL_METRICS, (m, a[m], b[m])
    assert a["ndcg@10"] > 0.1  # a real ranking, not an empty one


def test_refuses_forest_drt_and_other_encoders(encoder, tmp_path):
    from treerank.families import model_class
    from treerank.models.checkpoint import Checkpoint, EncoderMismatchError

    for family, why in (("forest", "own retrieval"), ("drt", "slot weights")):
        path = tmp_path / family
        save_checkpoint(
            path,
            Checkpoint(family, {"dim": 384}, {"x": torch.zeros(1)}, encoder.name, "sha", 384),
        )
        with pytest.raises(NotExpressibleError, match=why):  # every family: the table's lookup
            export_sentence_transformers(path, tmp_path / f"out-{family}", classes=model_class)
        assert not (tmp_path / f"out-{family}").exists()
    head = LinearHead(384)
    save_checkpoint(tmp_path / "other", head.to_checkpoint("other", "sha256:0000"))
    with pytest.raises(EncoderMismatchError, match="fingerprint"):
        export_sentence_transformers(tmp_path / "other", tmp_path / "out-other")
    ok = _save(head, encoder, tmp_path / "ok")
    export_sentence_transformers(ok, tmp_path / "out-ok")
    with pytest.raises(FileExistsError, match="overwrite"):
        export_sentence_transformers(ok, tmp_path / "out-ok")
