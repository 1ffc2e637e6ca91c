"""Listwise KL distillation by hand; the chunked full-corpus softmax vs an unchunked reference."""

from __future__ import annotations

import math

import pytest
import torch

from treerank.training.losses import (
    full_corpus_softmax,
    info_nce,
    listwise_kl,
    teacher_distribution,
)


def test_listwise_kl_by_hand():
    # logits (1, 0, -1), teacher (1/2, 1/2, 0):
    # KL = sum_j t_j log t_j - sum_j t_j z_j + lse(z) = log(1/2) - 1/2 + log(e + 1 + 1/e)
    s = torch.tensor([[1.0, 0.0, -1.0]])
    t = torch.tensor([[0.5, 0.5, 0.0]])
    want = math.log(0.5) - 0.5 + math.log(math.e + 1 + math.exp(-1))
    assert want == pytest.approx(0.2144588, abs=1e-6)
    assert float(listwise_kl(s, t)) == pytest.approx(want, abs=1e-6)
    # masking the third cell: lse over (1, 0) only
    m = torch.tensor([[False, False, True]])
    want_m = math.log(0.5) - 0.5 + math.log(math.e + 1)
    assert float(listwise_kl(s, t, m)) == pytest.approx(want_m, abs=1e-6)
    # temperature divides the student scores: scores (2, 0, -2) at T = 2 are the same logits
    assert float(listwise_kl(2 * s, t, temperature=2.0)) == pytest.approx(want, abs=1e-6)
    # a one-hot teacher is InfoNCE
    one = torch.tensor([[0.0, 1.0, 0.0]])
    assert float(listwise_kl(s, one)) == pytest.approx(float(info_nce(s, one.bool())), abs=1e-6)
    # student == teacher -> 0
    assert float(listwise_kl(s, torch.softmax(s, 1))) == pytest.approx(0.0, abs=1e-6)


def test_listwise_kl_rejects_bad_targets():
    s = torch.zeros(1, 3)
    with pytest.raises(ValueError, match="distributions"):
        listwise_kl(s, torch.tensor([[0.5, 0.2, 0.0]]))
    with pytest.raises(ValueError, match="masked"):
        listwise_kl(s, torch.tensor([[0.5, 0.5, 0.0]]), torch.tensor([[True, False, False]]))


def test_teacher_distribution_by_hand():
    # BM25-like scores (10, 8, 5, pad) at T = 2 -> softmax(5, 4, 2.5)
    got = teacher_distribution(
        torch.tensor([[10.0, 8.0, 5.0, 0.0]]), torch.tensor([[True, True, True, False]]), 2.0
    )
    e = [math.exp(5), math.exp(4), math.exp(2.5)]
    want = [x / sum(e) for x in e] + [0.0]
    torch.testing.assert_close(got, torch.tensor([want]), atol=1e-6, rtol=0)
    assert abs(want[0] - 0.6896721) < 1e-6
    with pytest.raises(ValueError):
        teacher_distribution(torch.ones(1, 2), torch.ones(1, 2, dtype=torch.bool), 0.0)


def _setup(n: int = 1000, d: int = 16, b: int = 4):
    torch.manual_seed(0)
    passages = torch.randn(n, d)
    tower = torch.nn.Linear(d, d)
    q = torch.randn(b, d, requires_grad=True)
    return passages, tower, q


def _score(a, p):
    return a @ p.T / 0.5


@pytest.mark.parametrize("chunk", [1, 64, 333, 5000])
def test_full_corpus_equals_unchunked_reference(chunk):
    passages, tower, q = _setup()
    target_ids = torch.tensor([[3, 7], [10, -1], [999, 0], [500, -1]])
    weights = torch.tensor([[0.7, 0.3], [1.0, 0.0], [0.4, 0.6], [1.0, 0.0]])
    exclude = torch.tensor([[4, -1], [-1, -1], [1, 2], [-1, -1]])
    loss = full_corpus_softmax(
        q, passages, tower, _score, target_ids, weights, exclude, chunk_size=chunk
    )
    loss.backward()
    grads = [q.grad.clone(), tower.weight.grad.clone(), tower.bias.grad.clone()]
    q.grad = None
    tower.zero_grad()
    # reference: the whole (B, N) score matrix, listwise KL against the dense target + entropy
    z = _score(q, tower(passages))  # (B, N)
    t = torch.zeros_like(z)
    t.scatter_add_(1, target_ids.clamp_min(0), torch.where(target_ids >= 0, weights, 0.0))
    mask = torch.zeros_like(z, dtype=torch.bool)
    mask.scatter_(1, exclude.clamp_min(0), exclude >= 0)
    ent = torch.where(t > 0, t * torch.log(t.clamp_min(1e-30)), 0.0).sum(1)
    ref = (listwise_kl(z, t, mask, reduction="none") - ent).mean()
    ref.backward()
    torch.testing.assert_close(loss, ref, atol=1e-5, rtol=1e-6)
    for g, r in zip(grads, [q.grad, tower.weight.grad, tower.bias.grad], strict=True):
        torch.testing.assert_close(g, r, atol=1e-5, rtol=1e-5)


def test_full_corpus_one_hot_is_info_nce_over_all_passages():
    passages, tower, q = _setup(n=300)
    pos = torch.tensor([[5], [6], [7], [8]])
    loss = full_corpus_softmax(q, passages, tower, _score, pos, torch.ones(4, 1), chunk_size=70)
    z = _score(q, tower(passages))
    positive = torch.zeros_like(z, dtype=torch.bool)
    positive[torch.arange(4), pos[:, 0]] = True
    torch.testing.assert_close(loss, info_nce(z, positive), atol=1e-5, rtol=1e-6)


def _saved_bytes(n: int, chunk: int) -> int:
    """Bytes autograd keeps for the backward pass (distinct storages, stored vectors excluded)."""
    passages, tower, q = _setup(n=n)
    seen: dict[int, int] = {}
    base = passages.untyped_storage().data_ptr()

    def pack(t: torch.Tensor) -> torch.Tensor:
        s = t.untyped_storage()
        if s.data_ptr() != base:
            seen[s.data_ptr()] = s.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        full_corpus_softmax(
            q,
            passages,
            tower,
            _score,
            torch.tensor([[1], [2], [3], [4]]),
            torch.ones(4, 1),
            chunk_size=chunk,
        )
    return sum(seen.values())


def test_full_corpus_memory_is_bounded_by_the_chunk():
    # 4x the passages: autograd keeps only a (B,) log-sum-exp per extra chunk, never a (B, N)
    # score matrix or the (N, d) passage representations
    small, large = _saved_bytes(1000, 100), _saved_bytes(4000, 100)
    whole = _saved_bytes(4000, 4000)  # one chunk: computed plainly, the (B, N) matrix is kept
    assert whole > 4 * 4000 * 4
    per_chunk = (large - small) / 30
    assert per_chunk <= 4 * 8 + 64  # (B,) float32 + a scalar offset, per chunk
    assert large < 4 * 4000 * 4  # far less than one (B, N) float32 score matrix
