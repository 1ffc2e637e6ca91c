"""A cross-encoder as a ``data.sources`` teacher with graded scores: MarginMSE (and listwise
KL) distillation into a head, on the 10-query MS MARCO sample (real texts, a cross-encoder
trained for two steps at ``max_length=64``).

Checked with exact values: the teacher's scores reach the student's batch bit for bit (sidecar
-> pair set -> batch), the MarginMSE loss on hand-computed margins, and a head trained on the
source moves.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from treerank.models.cross_encoder import CrossEncoderScorer
from treerank.store import EmbeddingStore
from treerank.tasks.train import ensure_training_sources
from treerank.training.cross_encoder import CrossEncoderConfig, train_cross_encoder
from treerank.training.data import build_training_table, parse_sources, teacher_array
from treerank.training.losses import margin_mse
from treerank.training.sources import PairSampler, teacher_pairs


@pytest.fixture(scope="module")
def store(msmarco_store: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A copy of the MS MARCO sample (the teacher's sidecar arrays are written into it)."""
    out = tmp_path_factory.mktemp("ce-teacher") / "validation"
    shutil.copytree(Path(msmarco_store["validation"].path), out)
    return EmbeddingStore.open(out)


@pytest.fixture(scope="module")
def ce_dir(store: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from treerank.search.negatives import mine_bm25_negatives

    cfg = CrossEncoderConfig(negatives=2, batch_size=2, max_length=64, max_steps=2, lr=5e-5)
    out = tmp_path_factory.mktemp("ce-model") / "run"
    return train_cross_encoder(store, cfg, out, mined=mine_bm25_negatives(store, 10)).model_dir


def test_margin_mse_hand_computed() -> None:
    scores = torch.tensor([[3.0, 1.0, 2.0], [0.0, 1.0, 4.0]])
    teacher = torch.tensor([[5.0, 2.0, float("nan")], [float("nan"), 1.5, 3.0]])
    positive = torch.tensor([[True, False, False], [False, False, True]])
    # row 0: anchor 0, pair j=1: (3 - 1) - (5 - 2) = -1 -> 1 (j=2 unscored)
    # row 1: anchor 2, pair j=1: (4 - 1) - (3 - 1.5) = 1.5 -> 2.25 (j=0 unscored)
    per_row = margin_mse(scores, teacher, positive, reduction="none")
    torch.testing.assert_close(per_row, torch.tensor([1.0, 2.25]), rtol=0, atol=1e-7)
    assert float(margin_mse(scores, teacher, positive)) == pytest.approx(1.625, abs=1e-7)
    # equal margins: zero loss, whatever the offset between student and teacher
    same = margin_mse(teacher.nan_to_num() + 7.0, teacher, positive, reduction="none")
    torch.testing.assert_close(same, torch.zeros(2), rtol=0, atol=1e-6)
    with pytest.raises(ValueError, match="one True per row"):
        margin_mse(scores, teacher, torch.zeros(2, 3, dtype=torch.bool))


def test_teacher_pairs_margin_mode_keeps_the_scores() -> None:
    ids = np.array([[4, 2, 7], [1, -1, -1]])
    scores = np.array([[3.25, -0.5, -2.0], [0.75, 0.0, 0.0]], np.float32)
    ps = teacher_pairs(ids, scores, [f"q{i}" for i in range(2)], mode="margin-mse", k=3)
    assert ps.mode == "margin-mse" and ps.teacher_scores is not None
    np.testing.assert_array_equal(ps.teacher_scores[0], scores[0])  # bit for bit
    assert ps.teacher_scores[1, 0] == np.float32(0.75) and np.isnan(ps.teacher_scores[1, 1:]).all()
    np.testing.assert_array_equal(ps.target_weights, [[1, 0, 0], [1, 0, 0]])  # the best
    halved = teacher_pairs(
        ids, scores, ["a", "b"], mode="margin-mse", k=3, temperature=2.0
    ).teacher_scores
    np.testing.assert_array_equal(halved[0], scores[0] / 2)


def test_cross_encoder_teacher_scores_reach_the_student_unchanged(store: Any, ce_dir: Path) -> None:
    system = f"rescore:bm25:depth=5,scorer=ce:{ce_dir}"
    raw = [{"kind": "teacher", "system": system, "mode": "margin-mse", "k": 5}]
    done = ensure_training_sources(store, {"sources": raw}, progress=False)
    assert done is not None and f"teacher:{system}" in done
    spec = parse_sources(raw)[0]
    ids = np.asarray(store.load_array(f"{teacher_array(spec)}-ids"))
    sidecar = np.asarray(store.load_array(f"{teacher_array(spec)}-scores"))
    # the sidecar holds the cross-encoder's own scores (direct predict, 1e-5: batch padding)
    qt, pt = store.query_texts(), store.passage_texts()
    qi, ji = np.nonzero(ids >= 0)
    direct = CrossEncoderScorer(ce_dir).score_pairs(
        [qt[i] for i in qi], [pt[ids[i, j]] for i, j in zip(qi, ji, strict=True)]
    )
    np.testing.assert_allclose(sidecar[qi, ji], direct, rtol=0, atol=1e-5)
    assert np.unique(np.round(sidecar[qi, ji], 4)).size > 10  # graded, not binary

    table = build_training_table(store, [spec])
    (ps,) = table.sources
    assert ps.mode == "margin-mse" and table.info[f"0:teacher:{system}"]["mode"] == "margin-mse"
    for r, q in enumerate(ps.query_rows):  # sidecar -> pair set: bit for bit
        np.testing.assert_array_equal(ps.target_ids[r], ids[q])
        np.testing.assert_array_equal(ps.teacher_scores[r], sidecar[q].astype(np.float32))
    sampler = PairSampler([ps], batch_size=4, seed=0, collisions=False)
    batch = next(iter(sampler.epoch(0)))
    assert batch.teacher_scores is not None
    for i, q in enumerate(batch.query_rows):  # pair set -> batch: bit for bit, NaN elsewhere
        cols = np.searchsorted(batch.passage_rows, ids[q])
        np.testing.assert_array_equal(batch.teacher_scores[i, cols], sidecar[q])
        other = np.setdiff1d(np.arange(batch.passage_rows.size), cols)
        assert np.isnan(batch.teacher_scores[i, other]).all()
        assert batch.passage_rows[batch.positive[i]][0] == ids[q, 0]  # the teacher's best


def test_a_head_distils_from_the_cross_encoder(store: Any, ce_dir: Path) -> None:
    from treerank.models.linear import LinearHead
    from treerank.training.sources import train_on_pairs
    from treerank.training.trainer import TrainerConfig, loss_from_representations

    system = f"rescore:bm25:depth=5,scorer=ce:{ce_dir}"
    for mode in ("margin-mse", "soft"):  # MarginMSE, and listwise KL on the same teacher
        raw = [{"kind": "labels"}, {"kind": "teacher", "system": system, "mode": mode, "k": 5}]
        ensure_training_sources(store, {"sources": raw}, progress=False)
        table = build_training_table(store, parse_sources(raw))
        q = np.asarray(store.queries, np.float32)
        p = np.asarray(store.passages, np.float32)
        torch.manual_seed(0)
        head = LinearHead(q.shape[1])
        before = [t.detach().clone() for t in head.parameters()]
        cfg = TrainerConfig(max_steps=3, lr=1e-2, patience=None, warmup_ratio=0.0)
        fit = train_on_pairs(head, q, p, table.sources, cfg, batch_size=4, progress=False)
        assert fit.steps == 3
        losses = [r["loss"] for r in fit.records if "loss" in r]
        assert losses and np.isfinite(losses).all()
        assert any(
            not torch.equal(a, b.detach()) for a, b in zip(before, head.parameters(), strict=True)
        )
    # a batch of margin rows: the loss is margin_mse of the head's own scores
    raw = [{"kind": "teacher", "system": system, "mode": "margin-mse", "k": 5}]
    (ps,) = build_training_table(store, parse_sources(raw)).sources
    batch = next(iter(PairSampler([ps], batch_size=3, seed=1, collisions=False).epoch(0)))
    qv = torch.from_numpy(np.asarray(store.queries, np.float32)[batch.query_rows])
    pv = torch.from_numpy(np.asarray(store.passages, np.float32)[batch.passage_rows])
    with torch.no_grad():
        loss, parts = loss_from_representations(
            head, batch, head.encode_queries_t(qv), head.encode_passages_t(pv)
        )
        want = margin_mse(
            parts["logits"], torch.from_numpy(batch.teacher_scores), parts["positive"]
        )
    assert float(loss) == pytest.approx(float(want), rel=1e-6)
    with pytest.raises(ValueError, match="negatives: batch"):
        loss_from_representations(
            head,
            batch,
            head.encode_queries_t(qv),
            head.encode_passages_t(pv),
            all_passages=torch.from_numpy(np.array(store.passages, np.float32)),
        )
