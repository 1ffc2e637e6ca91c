"""IRLI re-partitioning: the objective decreases, capacity holds, the index follows the table."""

from __future__ import annotations

import numpy as np
import pytest

from treerank.forest.index import ForestIndex
from treerank.forest.model import Forest, ForestConfig
from treerank.forest.repartition import repartition


def _fixture(seed=0, n=300, nq=200, d=12):
    rng = np.random.default_rng(seed)
    p = rng.standard_normal((n, d)).astype(np.float32)
    p /= np.linalg.norm(p, axis=1, keepdims=True)
    pos_p = rng.integers(0, n // 2, size=nq)  # half the passages are cited
    q = p[pos_p] + 0.4 * rng.standard_normal((nq, d)).astype(np.float32)
    q /= np.linalg.norm(q, axis=1, keepdims=True)
    return q, np.arange(nq), pos_p, p


def test_repartition_decreases_its_objective_and_respects_capacity() -> None:
    q, pos_q, pos_p, p = _fixture()
    forest = Forest.random(ForestConfig(4, 8, 12), seed=0)
    out = repartition(forest, q, pos_q, pos_p, p, rounds=3, steps=15, assign=2, group_size=2)
    hist = np.asarray(out.objective)
    assert hist[-1, 1] < hist[0, 0] < out.objective_initial + 1.0
    assert hist[-1, 1] < out.objective_initial
    assert np.all(hist[:, 1] <= hist[:, 0] + 1e-6)  # each training step lowers J
    cap = int(np.ceil(1.2 * 2 * 300 / 8))
    assert ForestIndex.build(out.classes, out.probs, 8).list_sizes().max() <= cap
    assert (out.classes >= 0).all()
    # a passage no training query cites is assigned by its own vector through the query model
    uncited = np.setdiff1d(np.arange(300), pos_p)
    own, _ = out.forest.passage_classes(p[uncited])
    agree = (out.classes[uncited, :, 0] == own).mean()
    assert agree > 0.5  # capacity may move some


def test_repartition_bad_pairs_raise() -> None:
    q, pos_q, pos_p, p = _fixture()
    forest = Forest.random(ForestConfig(2, 4, 12), seed=0)
    with pytest.raises(ValueError, match="rounds >= 1"):
        repartition(forest, q, pos_q[:0], pos_p[:0], p)
    with pytest.raises(ValueError, match="out of range"):
        repartition(forest, q, pos_q, pos_p + 1000, p)


def test_objective_equals_a_dense_reference() -> None:
    """``J`` through the gathered log-softmax equals ``-sum w log sum_{c in A} softmax(z)_c /
    sum w`` computed densely in float64 (unassigned classes skipped; a pair with none is floored
    at log 1e-12)."""
    import torch

    from treerank.forest.repartition import _objective

    rng = np.random.default_rng(1)
    g, nq, c, k, e = 3, 7, 5, 2, 11
    z = rng.standard_normal((nq, g, c))
    cls = rng.integers(-1, c, size=(g, e, k))
    cls[..., 1] = np.where(cls[..., 1] == cls[..., 0], -1, cls[..., 1])  # distinct per pair
    cls[0, 0] = -1  # a pair with no class at all
    pos_q = rng.integers(0, nq, size=e)
    w = rng.uniform(0.5, 1.5, size=e)
    prob = np.exp(z) / np.exp(z).sum(-1, keepdims=True)
    ref = np.zeros(g)
    for gi in range(g):
        for j in range(e):
            like = sum(prob[pos_q[j], gi, cc] for cc in cls[gi, j] if cc >= 0)
            ref[gi] -= w[j] * np.log(max(like, 1e-12))
    ref /= w.sum()
    got = _objective(
        torch.log_softmax(torch.tensor(z, dtype=torch.float32), -1),
        torch.from_numpy(cls),
        torch.from_numpy(pos_q),
        torch.tensor(w, dtype=torch.float32),
    )
    np.testing.assert_allclose(got.numpy(), ref, rtol=1e-5, atol=1e-5)


def test_sampled_rounds_and_the_passage_term() -> None:
    """``sample < 1`` trains each round on a subset and still lowers ``J``; the passage term
    puts more cited passages' own vectors into their assigned class (the rule that indexes new
    passages) than IRLI alone; bad values raise before any work."""
    q, pos_q, pos_p, p = _fixture(seed=2)
    forest = Forest.random(ForestConfig(4, 8, 12), seed=0)
    kw = {"rounds": 3, "steps": 30, "group_size": 2}
    plain = repartition(forest, q, pos_q, pos_p, p, **kw)
    sampled = repartition(forest, q, pos_q, pos_p, p, sample=0.5, seed=3, **kw)
    hist = np.asarray(sampled.objective)
    assert hist[-1, 1] < sampled.objective_initial
    assert not np.allclose(hist, np.asarray(plain.objective))  # the subset changes the steps
    with_p = repartition(forest, q, pos_q, pos_p, p, passage_weight=2.0, **kw)
    cited = np.unique(pos_p)

    def agreement(out) -> float:
        own, _ = out.forest.passage_classes(p[cited])
        return float((out.classes[cited, :, 0] == own).mean())

    assert agreement(with_p) > agreement(plain)
    with pytest.raises(ValueError, match="sample must be in"):
        repartition(forest, q, pos_q, pos_p, p, sample=0.0)
    with pytest.raises(ValueError, match="passage_weight must be"):
        repartition(forest, q, pos_q, pos_p, p, passage_weight=-1.0)


def test_trainer_option_equals_the_post_hoc_function(toy_store) -> None:
    """``trainer.repartition`` re-partitions the trained forest exactly as :func:`repartition`
    does after training (same pairs, K, capacity, boosting, group size; one code path computes
    both, so float equality up to 1e-6), its objective decreases, and the key is part of the
    resolved config (so of the train stage key); without it the config and forest are as
    before."""
    import torch

    from treerank.forest.data import pair_data
    from treerank.forest.trainer import train_forest

    base = {
        "seed": 3,
        "model": {"n_models": 3, "n_classes": 4, "assign": 2, "capacity_epsilon": 0.3},
        "data": {"hard_negatives": 0, "random_negatives": 2},
        "trainer": {"group_size": 2, "steps_query": 3, "steps_passage": 3, "steps_joint": 2},
    }
    rp = {"rounds": 2, "steps": 4, "lr": 0.05}
    with_rp = {**base, "trainer": {**base["trainer"], "repartition": rp}}
    plain = train_forest(toy_store, base, progress=False)
    trained = train_forest(toy_store, with_rp, progress=False)
    assert "repartition" not in plain.summary["config"]["trainer"]
    assert plain.summary["repartition"] is None
    assert trained.summary["config"]["trainer"]["repartition"] == rp
    data = pair_data(toy_store, 0, None)
    ref = repartition(
        plain.model,
        toy_store.queries[data.queries],
        data.pos_q,
        data.pos_p,
        toy_store.passages,
        rounds=2,
        steps=4,
        lr=0.05,
        assign=2,
        capacity_epsilon=0.3,
        boosting=True,
        group_size=2,
    )
    got = trained.model
    for a, b in zip(
        got.query_weights + got.query_biases + got.passage_weights + got.passage_biases,
        ref.forest.query_weights
        + ref.forest.query_biases
        + ref.forest.passage_weights
        + ref.forest.passage_biases,
        strict=True,
    ):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)
    info = trained.summary["repartition"]
    np.testing.assert_allclose(info["objective"], ref.objective, rtol=0, atol=1e-6)
    assert info["objective"][-1][1] < info["objective_initial"]
    assert got.name == "forest" and got.search.assign == 2


def test_trainer_option_is_checked() -> None:
    from treerank.config import ConfigError
    from treerank.forest.trainer import parse_forest_config

    def cfg(rp, **trainer):
        return {"model": {"n_models": 2}, "trainer": {"repartition": rp, **trainer}}

    with pytest.raises(ConfigError, match=r"trainer\.repartition: unknown key\(s\) round"):
        parse_forest_config(cfg({"round": 2}))
    with pytest.raises(ConfigError, match=r"trainer\.repartition\.rounds: must be >= 1"):
        parse_forest_config(cfg({"rounds": 0}))
    with pytest.raises(ConfigError, match=r"trainer\.repartition\.steps: expected an integer"):
        parse_forest_config(cfg({"steps": "many"}))
    with pytest.raises(ConfigError, match="untrained twin is not re-partitioned"):
        parse_forest_config(
            {"model": {"n_models": 2, "untrained": True}, "trainer": {"repartition": {}}}
        )


def test_bundled_irli_config_parses_and_runs(toy_store) -> None:
    """``configs/forest/scifact_irli.yaml`` is a valid forest config (IRLI from the random twin)
    and trains on a fixture (scaled down: M = 2, C = 4, one round)."""
    from dataclasses import asdict
    from pathlib import Path

    import yaml

    from treerank.forest.trainer import forest_train_config, parse_forest_config, train_forest

    path = Path(__file__).resolve().parents[2] / "configs" / "forest" / "scifact_irli.yaml"
    raw = yaml.safe_load(path.read_text())
    cfg = forest_train_config(parse_forest_config(raw))
    rp = cfg.trainer.repartition
    assert rp is not None and asdict(rp) == {"rounds": 3, "steps": 20, "lr": 0.05}
    assert cfg.trainer.init == "twin"
    raw["model"].update(n_models=2, n_classes=4)
    raw["trainer"]["repartition"] = {"rounds": 1, "steps": 2}
    out = train_forest(toy_store, raw, progress=False)
    assert out.model.n_models == 2 and out.summary["repartition"]["rounds"] == 1


def test_repartition_is_in_the_train_stage_config_only_when_set() -> None:
    """The family's resolved config (part of the train-stage key) holds ``repartition`` when
    the config sets it, and is exactly the field list of before without it."""
    from treerank.families import family
    from treerank.forest.config import ForestTrainConfig

    fam = family("forest")
    plain = fam.resolved_config({"model": {"n_models": 2}})
    assert set(plain["resolved"]) == set(ForestTrainConfig().flat()) - {"repartition"}
    rp = fam.resolved_config({"model": {"n_models": 2}, "trainer": {"repartition": {"rounds": 1}}})
    assert rp["resolved"]["repartition"] == {"rounds": 1, "steps": 20, "lr": 0.05}
    assert rp["trainer"]["repartition"] == {"rounds": 1}
