"""Forest training: uniformity/sharpness losses, the boosting formula, the training loop."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from treerank.models.forest import Forest
from treerank.models.registry import load_model
from treerank.training.forest import (
    FOREST_SECTIONS,
    ForestTrainConfig,
    boosting_weights,
    sharpness_loss,
    train_forest,
    uniformity_loss,
)


def sectioned(flat: dict) -> dict:
    """A flat dict of ForestTrainConfig fields in the forest family's sectioned config shape."""
    out: dict = {}
    for key, value in flat.items():
        if key in ("seed", "validation"):
            out[key] = value
            continue
        sec = next(s for s, keys in FOREST_SECTIONS.items() if key in keys)
        out.setdefault(sec, {})[key] = value
    return out


SMALL = {
    "n_models": 4,
    "n_classes": 4,
    "group_size": 2,
    "steps_query": 15,
    "steps_passage": 20,
    "steps_joint": 10,
    "random_negatives": 4,
    "hard_negatives": 4,
}


@pytest.mark.parametrize("kind", ["entropy", "gini"])
def test_uniformity_loss_uniform_is_zero_collapsed_is_one(kind) -> None:
    c = 8
    uniform = torch.full((c,), 1.0 / c)
    collapsed = torch.zeros(c)
    collapsed[3] = 1.0
    assert float(uniformity_loss(uniform, kind)) == pytest.approx(0.0, abs=1e-6)
    assert float(uniformity_loss(collapsed, kind)) == pytest.approx(1.0, abs=1e-5)
    # batched rows
    out = uniformity_loss(torch.stack([uniform, collapsed]), kind)
    np.testing.assert_allclose(out.numpy(), [0.0, 1.0], atol=1e-5)


def test_uniformity_loss_hand_values() -> None:
    half = torch.tensor([0.5, 0.5, 0.0, 0.0])  # two of four classes used
    # entropy: (log 4 - log 2) / log 4 = 0.5; gini: (4 * 0.5 - 1) / 3 = 1/3
    assert float(uniformity_loss(half, "entropy")) == pytest.approx(0.5, abs=1e-6)
    assert float(uniformity_loss(half, "gini")) == pytest.approx(1 / 3, abs=1e-6)
    with pytest.raises(ValueError, match="unknown uniformity"):
        uniformity_loss(half, "kl")


def test_sharpness_loss_separates_soft_from_decisive_queries() -> None:
    # Soft queries (each uniform) have a perfectly uniform mean too: uniformity alone is 0 for
    # both sets; only the sharpness term tells them apart.
    soft = torch.full((4, 4), 0.25)
    sharp = torch.eye(4)
    assert float(uniformity_loss(soft.mean(0))) == pytest.approx(0.0, abs=1e-6)
    assert float(uniformity_loss(sharp.mean(0))) == pytest.approx(0.0, abs=1e-6)
    assert float(sharpness_loss(soft)) == pytest.approx(1.0, abs=1e-6)
    assert float(sharpness_loss(sharp)) == pytest.approx(0.0, abs=1e-6)
    w = torch.tensor([1.0, 0.0, 0.0, 0.0])
    assert float(sharpness_loss(torch.cat([sharp[:1], soft[:3]]), w)) == pytest.approx(
        0.0, abs=1e-6
    )


def test_boosting_weight_formula() -> None:
    # (1 + e) / (1 + n)
    np.testing.assert_allclose(boosting_weights(np.array([0, 1, 2]), 2), [1 / 3, 2 / 3, 1.0])
    np.testing.assert_allclose(boosting_weights(np.array([0, 0]), 0), [1.0, 1.0])
    np.testing.assert_allclose(boosting_weights(np.array([3]), 9), [0.4])
    with pytest.raises(ValueError):
        boosting_weights(np.array([3]), 2)


def test_training_balances_classes_learns_and_logs(toy_store, tmp_path) -> None:
    seen = []

    def validate(forest: Forest) -> dict[str, float]:
        seen.append(forest.n_models)
        return {"mrr@10": 0.1 * forest.n_models}

    from treerank.training.output import save_trained_model

    out = train_forest(toy_store, sectioned(SMALL), validate=validate, progress=False)
    save_trained_model(
        tmp_path / "out" / "checkpoint",
        out.model,
        encoder_name=toy_store.encoder_name,
        encoder_fingerprint=toy_store.encoder_fingerprint,
        summary=out.summary,
        records=out.records,
    )
    forest = out.model
    assert isinstance(forest, Forest) and forest.n_models == 4 and forest.n_classes == 4
    assert seen == [1, 2, 4]  # powers of two and M
    assert [p["n_models"] for p in out.summary["curve"]] == [1, 2, 4]
    s = out.summary
    assert s["query_class_entropy_mean"] > 0.85 * math.log(4)  # balanced classes
    assert s["final_train_match_rate_mean"] > 0.5  # chance for 4 classes is 0.25
    # the saved checkpoint reloads to the same forest
    loaded = load_model(tmp_path / "out" / "checkpoint", expected_fingerprint="toy-fingerprint")
    x = np.asarray(toy_store.passages)
    np.testing.assert_array_equal(loaded.passage_classes(x)[0], forest.passage_classes(x)[0])
    ck = tmp_path / "out" / "checkpoint"
    assert (ck / "training_curves.png").stat().st_size > 1000
    recs = [json.loads(line) for line in (ck / "training_log.jsonl").open()]
    assert [r["kind"] for r in recs].count("pair") == 2
    assert recs[-1]["kind"] == "summary"


def test_boosting_bookkeeping_matches_formula(toy_store, tmp_path) -> None:
    cfg = {**SMALL, "n_models": 2, "group_size": 1}
    out = train_forest(toy_store, sectioned(cfg), progress=False)
    pairs = [r for r in out.records if r["kind"] == "pair"]
    assert pairs[0]["mean_boost_weight"] == pytest.approx(1.0)
    # weight for the second model: (1 + e) / 2, e = miss of model 0 on each (query, selected) pair
    f0 = out.model.subset(1)
    rows, cols = np.nonzero(toy_store.labels >= 1)
    qc, _ = f0.query_classes(toy_store.queries[rows])
    pc, _ = f0.passage_classes(toy_store.passages[toy_store.candidates[rows, cols]])
    e = (qc[:, 0] != pc[:, 0]).astype(np.int64)
    assert pairs[1]["mean_boost_weight"] == pytest.approx(float(np.mean((1 + e) / 2)), rel=1e-6)
    assert pairs[0]["train_match_rate"] == pytest.approx(1 - e.mean())


def test_same_seed_same_forest_and_seed_matters(toy_store) -> None:
    a = train_forest(toy_store, sectioned({**SMALL, "n_models": 2}), progress=False).model
    b = train_forest(toy_store, sectioned({**SMALL, "n_models": 2}), progress=False).model
    c = train_forest(
        toy_store, sectioned({**SMALL, "n_models": 2, "seed": 1}), progress=False
    ).model
    torch.testing.assert_close(a.passage_weights[0], b.passage_weights[0], rtol=0, atol=0)
    assert not torch.equal(a.query_weights[0], c.query_weights[0])


@pytest.mark.parametrize("mode", ["alternate"])
def test_alternate_joint_mode_and_hidden_layer_train(toy_store, mode) -> None:
    cfg = {**SMALL, "n_models": 2, "joint_mode": mode, "hidden": [8], "uniformity": "gini"}
    cfg["passage_uniformity_weight"] = 1.0
    forest = train_forest(toy_store, sectioned(cfg), progress=False).model
    assert forest.config.hidden == (8,)
    assert forest.query_classes(toy_store.queries)[0].shape == (toy_store.n_queries, 2)


def test_bad_config_names_the_key() -> None:
    from treerank.training.forest import parse_forest_config

    with pytest.raises(
        ValueError, match=r"f.yaml.model: unknown key\(s\) n_trees; allowed: n_models"
    ):
        parse_forest_config({"model": {"n_trees": 3}}, "f.yaml")
    with pytest.raises(ValueError, match="f.yaml: unknown key.*lr; allowed: seed, model"):
        parse_forest_config({"lr": 3}, "f.yaml")
    with pytest.raises(ValueError, match="unknown key.*n_trees"):
        ForestTrainConfig.from_dict({"n_trees": 3})
    with pytest.raises(ValueError, match="uniformity"):
        ForestTrainConfig.from_dict({"uniformity": "kl"})
    with pytest.raises(ValueError, match="bag_queries"):
        ForestTrainConfig.from_dict({"bag_queries": 0.0})


def test_train_rows_restrict_training_and_pipeline_entry_point(toy_store, tmp_path) -> None:
    rows = np.arange(0, 40)
    out = train_forest(
        toy_store, sectioned({**SMALL, "n_models": 1}), train_rows=rows, progress=False
    )
    assert out.summary["n_train_queries"] == 40
    # through the pipeline (held-out validation via the forest's dense match-count view)
    from treerank.pipeline.training import train_model

    cfg = sectioned({**SMALL, "n_models": 2, "validation": {"fraction": 0.25}})
    res = train_model("forest", toy_store, cfg, tmp_path / "ck", progress=False)
    assert isinstance(res.model, Forest) and res.model.n_models == 2
    assert res.summary["n_train_queries"] == toy_store.n_queries - res.heldout_rows.size
    curve = res.summary["curve"]
    assert [p["n_models"] for p in curve] == [1, 2] and 0.0 <= curve[-1]["mrr@10"] <= 1.0
    assert isinstance(load_model(tmp_path / "ck"), Forest)
