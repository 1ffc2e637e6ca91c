"""Training-data sources: label and teacher pairs by hand, same-text exclusion, collision-free
mixed batches, and a training step over the full corpus against a dense reference."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from treerank.training.losses import info_nce
from treerank.training.sources import (
    PairSampler,
    exclude_same_text_targets,
    label_pairs,
    teacher_pairs,
    text_keys,
)

CAND = np.array([[0, 1, -1], [2, -1, -1], [3, 4, 5], [-1, -1, -1]], dtype=np.int32)
LAB = np.array([[2, 1, 0], [2, 0, 0], [2, 2, 1], [0, 0, 0]], dtype=np.uint8)
TEXTS = ["what is a cell", "define mitosis", "what is a cell", "no labels"]


def test_label_pairs_by_hand():
    p = label_pairs(CAND, LAB, TEXTS, relevance_threshold=2)
    np.testing.assert_array_equal(p.query_rows, [0, 1, 2])  # query 3 has no positive
    np.testing.assert_array_equal(p.target_ids, [[0, -1, -1], [2, -1, -1], [3, 4, -1]])
    np.testing.assert_allclose(p.target_weights, [[1, 0, 0], [1, 0, 0], [0.5, 0.5, 0]])
    np.testing.assert_array_equal(p.exclude_ids, [[-1, 1, -1], [-1, -1, -1], [-1, -1, 5]])
    assert p.query_keys[0] == p.query_keys[2] != p.query_keys[1]
    # same text -> each excludes the other's targets
    q = exclude_same_text_targets(p)
    assert set(q.exclude_ids[0][q.exclude_ids[0] >= 0]) == {1, 3, 4}
    assert set(q.exclude_ids[2][q.exclude_ids[2] >= 0]) == {0, 5}
    assert set(q.exclude_ids[1][q.exclude_ids[1] >= 0]) == set()


def test_teacher_pairs_by_hand():
    ids = np.array([[7, 3, 9, -1], [1, 2, 3, 4]])
    scores = np.array([[10.0, 8.0, 5.0, -np.inf], [4.0, 4.0, 0.0, 0.0]])
    soft = teacher_pairs(
        ids, scores, ["a", "b"], mode="soft", k=3, temperature=2.0, labelled=np.array([[3, 8]] * 2)
    )
    e = [math.exp(5), math.exp(4), math.exp(2.5)]
    np.testing.assert_allclose(soft.target_weights[0], [x / sum(e) for x in e], atol=1e-6)
    e2 = [1.0, 1.0, math.exp(-2)]
    np.testing.assert_allclose(soft.target_weights[1], [x / sum(e2) for x in e2], atol=1e-6)
    np.testing.assert_array_equal(soft.target_ids, [[7, 3, 9], [1, 2, 3]])
    # a labelled passage that is a target stays a target; others are excluded
    np.testing.assert_array_equal(soft.exclude_ids, [[-1, 8], [-1, 8]])
    hard = teacher_pairs(ids, scores, ["a", "b"], mode="sample", n_positives=2)
    np.testing.assert_array_equal(hard.target_ids, [[7, 3], [1, 2]])
    np.testing.assert_allclose(hard.target_weights, [[0.5, 0.5], [0.5, 0.5]])
    with pytest.raises(ValueError, match="temperature"):
        teacher_pairs(ids, scores, ["a", "b"], temperature=0.0)


def _repeated(n_passages: int = 12, per_passage: int = 4):
    """Queries that share passages (SQuAD-like) and texts (MedQuAD-like)."""
    nq = n_passages * per_passage
    cand = np.repeat(np.arange(n_passages, dtype=np.int32), per_passage)[:, None]
    lab = np.full((nq, 1), 1, dtype=np.uint8)
    texts = [f"question {i % (nq // 2)}" for i in range(nq)]  # every text twice
    return cand, lab, texts


def _collisions(batch, pairs_by_row):
    rows = batch.query_rows.tolist()
    keys = [pairs_by_row[r] for r in rows]
    tgt = batch.target.argmax(1) if batch.target is not None else batch.positive.argmax(1)
    return len(set(tgt.tolist())) < len(rows) or len(set(keys)) < len(rows)


def test_batches_have_no_same_passage_or_same_text_collisions():
    cand, lab, texts = _repeated()
    pairs = label_pairs(cand, lab, texts)
    key_of = dict(zip(pairs.query_rows.tolist(), text_keys(texts).tolist(), strict=True))
    sampler = PairSampler([pairs], batch_size=8, seed=0)
    seen = 0
    for e in range(3):
        for b in sampler.epoch(e):
            assert b.size[0] == 8 and not _collisions(b, key_of)
            seen += 1
    assert seen == 3 * len(sampler)
    # the same draws without the rule collide (so the test above can fail)
    plain = PairSampler([pairs], batch_size=8, seed=0, collisions=False)
    assert any(_collisions(b, key_of) for b in plain.epoch(0))


def test_mixture_weights_and_soft_targets():
    cand, lab, texts = _repeated(n_passages=40, per_passage=1)
    a = label_pairs(cand, lab, texts, name="labels")
    ids = np.stack([np.arange(40), (np.arange(40) + 1) % 40], axis=1)
    t = teacher_pairs(ids, np.ones((40, 2)), texts, mode="soft", k=2)
    sampler = PairSampler([a, t], weights=[1, 3], batch_size=8, epoch_size=4000, seed=1)
    n_soft = n_rows = 0
    for b in sampler.epoch(0):
        assert b.target is not None
        np.testing.assert_allclose(b.target.sum(1), 1.0, atol=1e-6)
        halves = (b.target == 0.5).sum(1)
        n_soft += int((halves == 2).sum())
        n_rows += b.size[0]
        assert not (b.mask_out & (b.target > 0)).any()
    assert 0.70 < n_soft / n_rows < 0.80  # weight 3 of 4


def test_full_corpus_training_step_equals_reference(scifact_store):
    from treerank.models.linear import LinearHead
    from treerank.training.sampler import ContrastiveSampler
    from treerank.training.trainer import compute_loss

    st = scifact_store["train"]
    sampler = ContrastiveSampler(np.asarray(st.candidates), np.asarray(st.labels), batch_size=16)
    batch = next(sampler.epoch(0))
    torch.manual_seed(0)
    head = LinearHead(st.dim)
    passages = torch.from_numpy(np.array(st.passages, dtype=np.float32))
    q = torch.from_numpy(np.asarray(st.queries[batch.query_rows], dtype=np.float32))
    p = passages[torch.from_numpy(batch.passage_rows)]
    loss, _ = compute_loss(head, batch, q, p, all_passages=passages, chunk_size=1000)
    z = head.score_matrix(head.encode_queries_t(q), head.encode_passages_t(passages))  # (B, N)
    pos = torch.zeros_like(z, dtype=torch.bool)
    pos[torch.arange(16), torch.from_numpy(batch.target_ids[:, 0])] = True
    mask = torch.zeros_like(z, dtype=torch.bool)
    for i, row in enumerate(batch.exclude_ids):
        mask[i, torch.from_numpy(row[row >= 0])] = True
    torch.testing.assert_close(loss, info_nce(z, pos, mask), atol=1e-4, rtol=1e-5)
    assert float(loss.detach()) > math.log(16)  # harder than the in-batch task at init
