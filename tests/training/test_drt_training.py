"""DRT training: the decorrelation term by hand, the assembled loss, the trainer end to end."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from treerank.training.drt import DRTObjective, decorrelation_loss, parse_drt_config, train_drt
from treerank.training.history import read_log


def test_decorrelation_by_hand() -> None:
    # B = 2 items, k = 3 slots, d_s = 2.
    sub = torch.tensor(
        [
            [[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]],
            [[0.0, 2.0], [1.0, 0.0], [1.0, -1.0]],
        ]
    )
    # C_01 = (x0_0 x1_0^T + x0_1 x1_1^T) / 2 = ([[0,1],[0,0]] + [[0,0],[2,0]]) / 2
    #      = [[0, .5], [1, 0]]                                   -> ||.||^2 = 1.25
    # C_02 = ([[1,1],[0,0]] + [[0,0],[2,-2]]) / 2 = [[.5,.5],[1,-1]] -> 0.25+0.25+1+1 = 2.5
    # C_12 = ([[0,0],[1,1]] + [[1,-1],[0,0]]) / 2 = [[.5,-.5],[.5,.5]] -> 1.0
    assert decorrelation_loss(sub).item() == pytest.approx(1.25 + 2.5 + 1.0, abs=1e-6)


def test_decorrelation_matches_pair_loop_on_random_slots() -> None:
    g = torch.Generator().manual_seed(0)
    sub = torch.randn(17, 5, 3, generator=g)
    ref = sum(
        ((sub[:, i].T @ sub[:, j]) / 17).pow(2).sum()
        for i, j in itertools.combinations(range(5), 2)
    )
    assert decorrelation_loss(sub).item() == pytest.approx(float(ref), rel=1e-5)


def test_decorrelation_zero_cases_and_gradient() -> None:
    assert decorrelation_loss(torch.randn(8, 1, 4)).item() == 0.0  # one slot: no pair
    # slots living in orthogonal coordinates never correlate
    sub = torch.zeros(4, 2, 2)
    sub[:, 0, 0] = torch.tensor([1.0, -1.0, 2.0, 0.5])
    sub[:, 1, 1] = torch.tensor([0.0, 0.0, 0.0, 0.0])
    assert decorrelation_loss(sub).item() == 0.0
    x = torch.randn(6, 3, 4, requires_grad=True)
    decorrelation_loss(x).backward()
    assert x.grad is not None and x.grad.abs().sum() > 0
    with pytest.raises(ValueError):
        decorrelation_loss(torch.randn(3, 4))


# --------------------------------------------------------------------------- objective + trainer

SMALL = {"k": 3, "slot_dim": 4, "hidden": 16, "attn_hidden": 8}


def test_objective_loss_is_infonce_over_drt_scores_plus_decorrelation(toy_store) -> None:
    """The trainer's loss on one batch equals the hand-assembled DRT loss (dropout off)."""
    from treerank.models.drt import DRTConfig, DRTHead
    from treerank.training.losses import info_nce
    from treerank.training.sampler import ContrastiveSampler
    from treerank.training.trainer import compute_loss

    torch.manual_seed(0)
    head = DRTHead(DRTConfig(dim=toy_store.dim, slot_dropout=0.0, temperature=0.05, **SMALL))
    obj = DRTObjective(head, lambda_dec=0.1)
    sampler = ContrastiveSampler(toy_store.candidates, toy_store.labels, batch_size=16, n_hard=0)
    batch = next(sampler.epoch(0))
    q = torch.from_numpy(toy_store.queries[batch.query_rows])
    p = torch.from_numpy(toy_store.passages[batch.passage_rows])
    loss, parts = compute_loss(obj, batch, q, p)

    qs, ps, a = head.slots(q, "query"), head.slots(p, "passage"), head.alpha(q)
    scores = torch.einsum("bk,bkd,mkd->bm", a, qs, ps)  # sum_i alpha_i q_i . p_i
    want = (
        info_nce(
            scores,
            torch.from_numpy(batch.positive),
            torch.from_numpy(batch.mask_out),
            temperature=0.05,
        )
        + 0.1 * (decorrelation_loss(qs) + decorrelation_loss(ps)) / 2
    )
    assert loss.item() == pytest.approx(want.item(), rel=1e-5)
    assert parts["extra_loss"] == pytest.approx(
        0.1 * float((decorrelation_loss(qs) + decorrelation_loss(ps)).detach() / 2), rel=1e-5
    )


def test_train_drt_learns_saves_and_is_deterministic(toy_store, tmp_path) -> None:
    from treerank.models.registry import load_model

    cfg = {
        "seed": 3,
        "model": SMALL,
        "data": {"batch_size": 32, "n_hard": 0},
        "trainer": {"epochs": 6, "lr": 3e-3, "log_every": 1, "patience": None, "threads": 1},
    }
    from treerank.training.output import save_trained_model

    out = train_drt(toy_store, cfg, progress=False)
    save_trained_model(
        tmp_path / "drt",
        out.model,
        encoder_name=toy_store.encoder_name,
        encoder_fingerprint=toy_store.encoder_fingerprint,
        summary=out.summary,
        records=out.records,
    )
    assert {"config.json", "weights.safetensors", "training_log.jsonl", "training_curves.png"} <= {
        p.name for p in (tmp_path / "drt").iterdir()
    }
    recs = [r for r in read_log(tmp_path / "drt" / "training_log.jsonl") if r["kind"] == "train"]
    first, last = recs[0], recs[-1]
    assert last["q2p_loss"] < first["q2p_loss"] - 0.3  # it learns
    assert {"decorrelation", "alpha_entropy", "extra_loss"} <= set(last)
    m = load_model(tmp_path / "drt", toy_store.encoder_fingerprint)
    x = toy_store.queries[:5]
    np.testing.assert_array_equal(m.encode_queries(x), out.model.encode_queries(x))
    assert m.extra["training"]["steps"] == out.summary["steps"]
    again = train_drt(toy_store, cfg, progress=False)
    np.testing.assert_array_equal(
        again.model.encode_passages(toy_store.passages[:7]),
        out.model.encode_passages(toy_store.passages[:7]),
    )


def test_config_errors(tmp_path) -> None:
    with pytest.raises(
        ValueError, match=r"trainer: unknown key\(s\) lambda; allowed: .*lambda_dec"
    ):
        parse_drt_config({"trainer": {"lambda": 1.0}})
    with pytest.raises(ValueError, match=r"model: unknown key\(s\) dim"):
        parse_drt_config({"model": {"dim": 4}})
    with pytest.raises(ValueError, match=r"model: unknown key\(s\) slots; allowed: k, slot_dim"):
        parse_drt_config({"model": {"slots": 4}})
    with pytest.raises(ValueError, match=r"unknown key\(s\) optimizer; allowed: seed, model"):
        parse_drt_config({"optimizer": {}})
    with pytest.raises(ValueError, match="lambda_dec must be >= 0"):
        parse_drt_config({"trainer": {"lambda_dec": -1.0}})
    cfg = parse_drt_config({"trainer": {"lambda_dec": 0.0}, "model": {"k": 2}})
    assert cfg.trainer.lambda_dec == 0.0 and cfg.model == {"k": 2}
    assert parse_drt_config(cfg.to_dict()).to_dict() == cfg.to_dict()
