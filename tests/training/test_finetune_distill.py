"""Distillation into the query tower (issue 32 item 4, the encoders' half): a fine-tune's
``data.sources`` teacher entries reach the batch plan and the loss unchanged, the loss equals
its hand-computed formula, and the label-only plan and loss are the ones they were.

The slice: the first 24 training claims of BEIR SciFact and 80 abstracts, embedded once per
module with the real all-MiniLM-L6-v2; the teacher is BM25 over the slice's own texts.
"""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from treerank.config import ConfigError
from treerank.tasks.train import ensure_teacher_run
from treerank.training.data import teacher_array
from treerank.training.finetune import finetune, plan_batches
from treerank.training.finetune_config import parse_finetune_config
from treerank.training.finetune_losses import StoredPassageLoss

BM25_SOFT = {"kind": "teacher", "system": "bm25", "mode": "soft", "k": 5, "temperature": 2.0}
BM25_MARGIN = {"kind": "teacher", "system": "bm25", "mode": "margin-mse", "k": 5,
               "temperature": 4.0}  # fmt: skip


@pytest.fixture(scope="module")
def slice_store(tmp_path_factory: pytest.TempPathFactory, scifact_zip: Path):
    from treerank.encoders import SentenceEncoder
    from treerank.readers import read_split
    from treerank.store import EmbeddingStore, embed_split

    root = tmp_path_factory.mktemp("ft-distill")
    split = read_split(scifact_zip, "scifact", "train", 24, 80)
    embed_split(split, SentenceEncoder(progress=False), root / "train", progress=False)
    return EmbeddingStore.open(root / "train").with_derived(root / "arrays")


def _cfg(sources: list[dict] | None, family: str = "query-tower", **data: object):
    return parse_finetune_config(
        {
            "family": family,
            "seed": 3,
            "data": {"batch_size": 4, "sources": sources, **data},
            "trainer": {"max_steps": 2, "save_steps": 0, "logging_steps": 1},
            "validation": {"fraction": 0},
        }
    )


def _teacher(store, raw: dict):
    cfg = _cfg([raw])
    spec = cfg.data.source_specs()[0]
    ensure_teacher_run(store, None, spec, progress=False)
    stem = teacher_array(spec)
    return spec, np.asarray(store.load_array(f"{stem}-ids")), store.load_array(f"{stem}-scores")


def test_config_takes_teachers_for_the_query_tower_and_refuses_what_is_not_built() -> None:
    cfg = _cfg([{"kind": "labels"}, BM25_MARGIN])
    assert [s.kind for s in cfg.data.source_specs()] == ["labels", "teacher"]
    assert _cfg(None).data.source_specs() is None
    assert _cfg([BM25_MARGIN], family="biencoder").data.n_hard == 1
    with pytest.raises(ConfigError, match=r"data\.sources.*n_hard >= 1"):
        _cfg([BM25_MARGIN], family="biencoder", n_hard=0)
    with pytest.raises(ConfigError, match=r"data\.sources.*margin-mse.*drt-e2e"):
        _cfg([BM25_MARGIN], family="drt-e2e")
    assert _cfg([{**BM25_SOFT, "mode": "sample"}], family="drt-e2e")  # positives from it
    with pytest.raises(ConfigError, match=r"sources\[0\].*queries: train"):
        _cfg([{"kind": "pseudo"}])
    with pytest.raises(ConfigError, match=r"sources\[0\]"):
        _cfg([{"kind": "teacher", "system": "bm25", "mode": "hard"}])


def test_a_margin_mse_teachers_scores_reach_the_student_unchanged(slice_store) -> None:
    spec, ids, scores = _teacher(slice_store, BM25_MARGIN)
    cfg = _cfg([BM25_MARGIN])
    plan = plan_batches(slice_store, cfg)
    assert plan.teacher is not None and plan.targets is not None and plan.weights is not None
    assert plan.sources is not None and next(iter(plan.sources.values()))["mode"] == "margin-mse"
    for i, q in enumerate(plan.query_rows):
        tid, g = plan.targets[i], plan.teacher[i]
        ok = tid >= 0
        assert ok.sum() == int((ids[q, :5] >= 0).sum()) >= 1
        assert np.isfinite(g[ok]).all() and np.isnan(g[~ok]).all()
        for pid, val in zip(tid[ok], g[ok], strict=True):  # the teacher's score / temperature
            at = int(np.flatnonzero(ids[q] == pid)[0])
            assert val == np.float32(np.float64(scores[q, at]) / 4.0)  # teacher_pairs' rule
        assert plan.positive[i] == ids[q, 0]  # the anchor is the teacher's best
        assert plan.weights[i, ok].tolist() == [1.0] + [0.0] * (int(ok.sum()) - 1)
    loss = StoredPassageLoss(
        None,
        np.asarray(slice_store.passages),
        plan.positive,
        plan.masked,
        targets=plan.targets,
        weights=plan.weights,
        teacher=plan.teacher,
    )
    assert loss.teacher is not None
    fin = np.isfinite(plan.teacher)  # NaN elsewhere, on both sides
    assert np.array_equal(np.isfinite(loss.teacher.numpy()), fin)
    assert np.array_equal(loss.teacher.numpy()[fin], plan.teacher[fin])


def test_soft_teacher_rows_carry_the_teachers_distribution(slice_store) -> None:
    _, ids, scores = _teacher(slice_store, BM25_SOFT)
    plan = plan_batches(slice_store, _cfg([{"kind": "labels"}, BM25_SOFT]))
    assert plan.targets is not None and plan.weights is not None and plan.teacher is None
    soft = (plan.targets >= 0).sum(axis=1) > 1  # (each claim has one cited abstract here)
    assert soft.any() and (~soft).any()  # both sources are in the mixture
    for i in np.flatnonzero(soft)[:6]:
        q = plan.query_rows[i]
        z = scores[q, :5].astype(np.float64) / 2.0
        want = np.exp(z - z.max()) / np.exp(z - z.max()).sum()
        got = dict(zip(plan.targets[i].tolist(), plan.weights[i].tolist(), strict=True))
        for pid, w in zip(ids[q, :5], want, strict=True):
            assert got[int(pid)] == pytest.approx(w, abs=1e-6)


class _Fixed(torch.nn.Module):
    """A stand-in query encoder: row ``label`` of a fixed table of query vectors."""

    def __init__(self, q: np.ndarray) -> None:
        super().__init__()
        self.q = torch.nn.Parameter(torch.from_numpy(q))

    def forward(self, features: dict) -> dict:
        return {"sentence_embedding": self.q[features["rows"]]}


def test_the_distilled_loss_equals_its_formula() -> None:
    rng = np.random.default_rng(0)
    p = rng.standard_normal((6, 4)).astype(np.float32)
    q = rng.standard_normal((2, 4)).astype(np.float32)
    pn = p / np.linalg.norm(p, axis=1, keepdims=True)
    qn = q / np.linalg.norm(q, axis=1, keepdims=True)
    s = 20.0 * (qn @ pn.T).astype(np.float64)  # (2, 6)
    # row 0: soft over passages {1, 2}, passage 4 masked; row 1: margin-mse over {3, 0, 5}
    targets = np.array([[1, 2, -1], [3, 0, 5]])
    weights = np.array([[0.75, 0.25, 0], [1, 0, 0]], dtype=np.float32)
    teacher = np.array([[np.nan] * 3, [2.0, 0.5, -1.0]], dtype=np.float32)
    masked = np.array([[1, 2, 4], [3, 0, 5]])
    loss = StoredPassageLoss(
        _Fixed(q), p, np.array([1, 3]), masked, targets=targets, weights=weights, teacher=teacher
    )
    got = loss([{"rows": torch.tensor([0, 1])}], torch.tensor([0, 1])).item()
    keep = [0, 1, 2, 3, 5]
    lse = math.log(sum(math.exp(s[0, j]) for j in keep))
    kl = sum(w * (math.log(w) - (s[0, j] - lse)) for j, w in ((1, 0.75), (2, 0.25)))
    mm = np.mean([((s[1, 3] - s[1, j]) - (2.0 - t)) ** 2 for j, t in ((0, 0.5), (5, -1.0))])
    assert got == pytest.approx((kl + mm) / 2, rel=1e-5)
    # one-hot targets give the plain InfoNCE of the label-only path (tolerance: two kernels)
    onehot = StoredPassageLoss(
        _Fixed(q), p, np.array([1, 3]), masked, targets=targets[:, :1],
        weights=np.ones((2, 1), np.float32),
    )  # fmt: skip
    plain = StoredPassageLoss(_Fixed(q), p, np.array([1, 3]), masked)
    args = ([{"rows": torch.tensor([0, 1])}], torch.tensor([0, 1]))
    assert onehot(*args).item() == pytest.approx(plain(*args).item(), rel=1e-6)


def test_the_label_only_plan_is_unchanged_by_a_labels_source(slice_store) -> None:
    plain = plan_batches(slice_store, _cfg(None))
    labels = plan_batches(slice_store, _cfg([{"kind": "labels"}]))
    assert plain.targets is None and labels.targets is not None
    assert np.array_equal(plain.query_rows, labels.query_rows)
    assert np.array_equal(plain.positive, labels.positive)
    assert np.array_equal(plain.masked, labels.masked)
    assert np.array_equal(labels.targets[:, 0], labels.positive)


def test_a_distilled_query_tower_trains_and_records_its_sources(
    slice_store, tmp_path: Path
) -> None:
    _teacher(slice_store, BM25_MARGIN)
    ft = finetune(slice_store, _cfg([{"kind": "labels"}, BM25_MARGIN]), tmp_path / "run")
    assert ft.summary["steps"] == 2 and math.isfinite(ft.summary["train_loss"])
    src = ft.summary["sources"]
    assert [v["mode"] for v in src.values()] == ["sample", "margin-mse"]
    assert ft.fingerprint != ft.base_fingerprint
    assert SimpleNamespace(**ft.summary["cost"]).cpu_seconds > 0


def test_a_distilled_biencoder_draws_its_negatives_from_the_teacher(slice_store) -> None:
    from treerank.training.sampler import relevant_lists

    _, ids, scores = _teacher(slice_store, BM25_MARGIN)
    plan = plan_batches(slice_store, _cfg([{"kind": "labels"}, BM25_MARGIN], family="biencoder"))
    assert plan.pair_teacher is not None and plan.pair_mode is not None
    assert plan.hard.shape[1] == 1 and set(plan.pair_mode.tolist()) == {0, 2}
    rel, _ = relevant_lists(slice_store.candidates, slice_store.labels, 1)
    for i in np.flatnonzero(plan.pair_mode == 2):
        q, neg = plan.query_rows[i], int(plan.hard[i, 0])
        top = ids[q, :5].tolist()
        assert neg in top and neg != plan.positive[i] and neg not in rel[q].tolist()
        t = {p: np.float32(np.float64(v) / 4.0) for p, v in zip(top, scores[q, :5], strict=True)}
        assert plan.pair_teacher[i].tolist() == [t[int(plan.positive[i])], t[neg]]
    assert np.isnan(plan.pair_teacher[plan.pair_mode == 0]).all()


def test_the_distilled_biencoder_loss_is_mnrl_plus_the_teachers_term() -> None:
    from sentence_transformers.sentence_transformer import losses

    from treerank.training.finetune_losses import DistilledMNRLLoss

    rng = np.random.default_rng(1)
    emb = [torch.from_numpy(rng.standard_normal((3, 4)).astype(np.float32)) for _ in range(3)]
    feats = [{"rows": torch.arange(3), "col": c} for c in range(3)]

    class _Cols(torch.nn.Module):
        def forward(self, f: dict) -> dict:
            return {"sentence_embedding": emb[f["col"]][f["rows"]]}

    teacher = np.array([[3.0, 1.0], [np.nan, np.nan], [0.5, 2.0]], dtype=np.float32)
    loss = DistilledMNRLLoss(_Cols(), teacher, np.array([2, 0, 1], np.int8), scale=20.0)
    got = loss(feats, torch.arange(3)).item()
    mnrl = losses.MultipleNegativesRankingLoss(_Cols(), scale=20.0)
    base = mnrl.compute_loss_from_embeddings(emb, torch.arange(3)).item()
    n = [e.numpy() / np.linalg.norm(e.numpy(), axis=1, keepdims=True) for e in emb]
    s = 20.0 * np.stack([(n[0] * n[c]).sum(axis=1) for c in (1, 2)], axis=1).astype(np.float64)
    margin = ((s[0, 0] - s[0, 1]) - (3.0 - 1.0)) ** 2  # row 0: MarginMSE
    p_t = np.exp([0.5, 2.0]) / np.exp([0.5, 2.0]).sum()  # row 2: listwise KL
    log_p = s[2] - np.log(np.exp(s[2]).sum())
    kl = float((p_t * (np.log(p_t) - log_p)).sum())
    assert got == pytest.approx(base + (margin + kl) / 3, rel=1e-5)
    plain = DistilledMNRLLoss(_Cols(), teacher, np.zeros(3, np.int8), scale=20.0)
    assert plain(feats, torch.arange(3)).item() == base  # no teacher row: MNRL itself


def test_a_distilled_biencoder_trains(slice_store, tmp_path: Path) -> None:
    _teacher(slice_store, BM25_MARGIN)
    cfg = _cfg([{"kind": "labels"}, BM25_MARGIN], family="biencoder")
    ft = finetune(slice_store, cfg, tmp_path / "bi")
    assert ft.summary["steps"] == 2 and math.isfinite(ft.summary["train_loss"])
    assert [v["mode"] for v in ft.summary["sources"].values()] == ["sample", "margin-mse"]


def test_sample_teachers_leave_the_text_columns_as_they_were(slice_store) -> None:
    """A bi-encoder or drt-e2e with only ``sample`` teachers gets no teacher columns: the same
    negative columns (none without mining) and no distillation table."""
    _teacher(slice_store, BM25_MARGIN)  # the same run (system and depth) as the sample entry's
    sample = {**BM25_MARGIN, "mode": "sample"}
    for family in ("biencoder", "drt-e2e"):
        plan = plan_batches(slice_store, _cfg([{"kind": "labels"}, sample], family=family))
        assert plan.pair_teacher is None and plan.pair_mode is None
        assert plan.hard.shape[1] == 0
