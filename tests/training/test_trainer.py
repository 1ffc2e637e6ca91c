import json

import numpy as np
import pytest
import torch

from treerank.models.linear import LinearHead
from treerank.models.mlp import MLPHead
from treerank.training.heads import build_sampler, parse_linear_config, train_head, train_linear
from treerank.training.history import TrainingLog, best_step, plot_curves, read_log
from treerank.training.holdout import holdout_split
from treerank.training.trainer import TrainerConfig, fit


def mrr_validator(store, rows):
    gold = store.candidates[rows, 0]

    def validate(model):
        q = model.encode_queries(store.queries[rows])
        p = model.encode_passages(store.passages)
        s = q @ p.T
        rank = (s > s[np.arange(len(rows)), gold][:, None]).sum(axis=1) + 1
        rr = np.where(rank <= 10, 1.0 / rank, 0.0)
        return {"mrr@10": float(rr.mean()), "ndcg@10": float(rr.mean())}

    return validate


CFG = {
    "seed": 1,
    "data": {"batch_size": 16, "n_hard": 0},
    "trainer": {"epochs": 15, "lr": 5e-3, "log_every": 2, "patience": None},
}


def test_training_improves_held_out_metric_and_logs(toy_store, tmp_path):
    tr, va = holdout_split(np.ones(toy_store.n_queries, bool), 0.25, seed=0)
    log = TrainingLog(tmp_path / "log.jsonl")
    out = train_linear(
        toy_store,
        CFG,
        train_rows=tr,
        validate=mrr_validator(toy_store, va),
        log=log,
        progress=False,
    )
    log.close()
    recs = read_log(tmp_path / "log.jsonl")
    assert recs == out.records  # the streamed log and the returned records agree
    evals = [r for r in recs if r["kind"] == "eval"]
    assert evals[0]["step"] == 0
    assert out.summary["best_metrics"]["mrr@10"] > evals[0]["mrr@10"] + 0.05
    train = [r for r in recs if r["kind"] == "train"]
    for key in (
        "loss",
        "chance_loss",
        "accuracy",
        "max_neg_prob",
        "query_norm",
        "neg_participation",
        "lr",
        "temperature",
    ):
        assert key in train[0]
    assert train[-1]["loss"] < train[0]["loss"]
    assert train[0]["chance_loss"] == pytest.approx(np.log(16), abs=1e-5)
    png = plot_curves(recs, tmp_path / "curves.png")
    assert png.read_bytes()[:4] == b"\x89PNG"
    # the marked best step is the last improving evaluation, the one the summary reports
    assert best_step(recs) == out.summary["best_step"]
    # the restored model is the best one
    assert mrr_validator(toy_store, va)(out.model)["mrr@10"] == pytest.approx(
        out.summary["best_metrics"]["mrr@10"]
    )
    assert out.model.extra["training"]["best_step"] == out.summary["best_step"]


def test_same_seed_same_weights(toy_store):
    a = train_head(
        MLPHead, toy_store, {**CFG, "trainer": {**CFG["trainer"], "epochs": 2}}, progress=False
    )
    b = train_head(
        MLPHead, toy_store, {**CFG, "trainer": {**CFG["trainer"], "epochs": 2}}, progress=False
    )
    for k, v in a.model.state_dict().items():
        assert torch.equal(v, b.model.state_dict()[k]), k
    assert not torch.equal(
        a.model.query_tower.fc2.weight, torch.zeros_like(a.model.query_tower.fc2.weight)
    )


def test_early_stopping_restores_best_state(toy_store):
    calls = []

    def worse_and_worse(model):
        calls.append(1)
        return {"ndcg@10": 1.0 - 0.1 * len(calls)}

    cfg = parse_linear_config(
        {
            "data": {"batch_size": 16},
            "trainer": {"epochs": 50, "eval_every": 2, "patience": 3, "log_every": 1},
        }
    )
    head = LinearHead(toy_store.dim)
    sampler, _ = build_sampler(toy_store, cfg.data)
    res = fit(
        head,
        sampler,
        toy_store.queries,
        toy_store.passages,
        cfg.trainer,
        validate=worse_and_worse,
        progress=False,
    )
    assert res.stopped_early and res.best_step == 0 and len(calls) == 4
    assert res.steps == 6
    # step 0 = identity init is restored
    assert torch.equal(head.query_tower.weight, torch.zeros_like(head.query_tower.weight))


class WithExtra(LinearHead):
    def extra_loss(self, q_repr, p_repr):
        return q_repr.sum() * 0 + 5.0


def test_extra_loss_hook_is_added(toy_store):
    head = WithExtra(toy_store.dim)
    sampler, _ = build_sampler(toy_store, parse_linear_config({}).data)
    log = TrainingLog()
    fit(
        head,
        sampler,
        toy_store.queries,
        toy_store.passages,
        TrainerConfig(epochs=1, log_every=1, patience=None),
        log=log,
        progress=False,
    )
    rec = [r for r in log.records if r["kind"] == "train"][0]
    assert rec["extra_loss"] == pytest.approx(5.0)
    assert rec["loss"] == pytest.approx(rec["q2p_loss"] + 5.0, abs=1e-5)


def test_symmetric_term_logged(toy_store):
    head = LinearHead(toy_store.dim)
    sampler, _ = build_sampler(toy_store, parse_linear_config({}).data)
    log = TrainingLog()
    fit(
        head,
        sampler,
        toy_store.queries,
        toy_store.passages,
        TrainerConfig(epochs=1, log_every=1, symmetric_weight=0.5, patience=None),
        log=log,
        progress=False,
    )
    rec = [r for r in log.records if r["kind"] == "train"][0]
    assert rec["loss"] == pytest.approx(rec["q2p_loss"] + 0.5 * rec["p2q_loss"], abs=1e-5)


def test_non_module_rejected(toy_store):
    sampler, _ = build_sampler(toy_store, parse_linear_config({}).data)
    with pytest.raises(TypeError, match="encode_queries_t"):
        fit(torch.nn.Linear(2, 2), sampler, toy_store.queries, toy_store.passages, progress=False)


def test_config_errors_name_the_key():
    with pytest.raises(
        ValueError, match=r"c.yaml.data: unknown key\(s\) batchsize; allowed: batch_size"
    ):
        parse_linear_config({"data": {"batchsize": 3}}, "c.yaml")
    with pytest.raises(ValueError, match=r"unknown key\(s\) optim; allowed: seed, model, data"):
        parse_linear_config({"optim": {}})
    with pytest.raises(ValueError, match=r"config.trainer: unknown key\(s\) lrr"):
        TrainerConfig.from_dict({"lrr": 1.0}, where="config.trainer")  # no longer dropped
    with pytest.raises(ValueError, match="early_stopping_metric"):
        parse_linear_config({"trainer": {"early_stopping_metric": "map"}})
    cfg = parse_linear_config({"seed": 4})
    assert cfg.trainer.seed == 4
    assert json.loads(json.dumps(cfg.to_dict()))["data"]["batch_size"] == 64


def test_mined_negatives_used_when_candidates_have_none(toy_store):
    rng = np.random.default_rng(0)
    mined = rng.integers(0, toy_store.n_passages, size=(toy_store.n_queries, 20)).astype(np.int32)
    toy_store.save_array("bm25_negatives", mined)
    cfg = parse_linear_config({"data": {"n_hard": 2, "guard_skip_top": 3, "guard_margin": None}})
    sampler, info = build_sampler(toy_store, cfg.data)
    assert info["resolved_source"] == "mined"
    assert info["guard_dropped_fraction"] == pytest.approx(3 / 20)
    batch = next(sampler.epoch(0))
    assert batch.size[1] > cfg.data.batch_size  # hard negatives added columns
    with pytest.raises(ValueError, match="no sidecar array"):
        build_sampler(
            toy_store,
            parse_linear_config({"data": {"hard_negatives": "mined", "mined_array": "nope"}}).data,
        )


class DivergesAtStep3(LinearHead):
    """The loss becomes NaN at the third step (an extra loss term that blows up)."""

    calls = 0

    def extra_loss(self, q_repr, p_repr):
        type(self).calls += 1
        bad = float("nan") if type(self).calls == 3 else 0.0
        return q_repr.sum() * 0 + bad


@pytest.mark.parametrize("with_validation", [False, True])
def test_non_finite_loss_stops_at_the_first_bad_step(toy_store, with_validation):
    from treerank.training.trainer import NonFiniteLossError

    DivergesAtStep3.calls = 0
    head = DivergesAtStep3(toy_store.dim)
    sampler, _ = build_sampler(toy_store, parse_linear_config({}).data)
    snapshots = []

    def validate(model):
        snapshots.append(1)
        return {"ndcg@10": 0.5}

    log = TrainingLog()
    with pytest.raises(
        NonFiniteLossError,
        match=r"training loss is nan at step 3 \(epoch \d+, learning rate .*\): the model "
        r"diverged; lower trainer.lr \(now 0.001\).*nothing was saved",
    ):
        fit(  # progress=True: the bar must never format a None loss
            head,
            sampler,
            toy_store.queries,
            toy_store.passages,
            TrainerConfig(epochs=5, log_every=1, patience=None, eval_every=100),
            validate=validate if with_validation else None,
            log=log,
            progress=True,
        )
    steps = [r["step"] for r in log.records if r["kind"] == "train"]
    assert steps == [1, 2]  # step 3 was never applied nor logged, no summary was written
    assert not [r for r in log.records if r["kind"] == "summary"]
    assert torch.isfinite(head.query_tower.weight).all()
