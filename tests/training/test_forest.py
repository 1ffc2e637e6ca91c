"""Forest training: uniformity/sharpness losses, the boosting formula, the training loop."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from treerank.families import load_model
from treerank.forest.model import Forest
from treerank.forest.trainer import (
    FOREST_SECTIONS,
    ForestTrainConfig,
    plot_forest_curves,
    train_forest,
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
        curves_hook=plot_forest_curves,  # the forest family's curves (the pipeline passes them)
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
    from treerank.forest.trainer import parse_forest_config

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
    from treerank.tasks.train import train_model

    cfg = sectioned({**SMALL, "n_models": 2, "validation": {"fraction": 0.25}})
    res = train_model("forest", toy_store, cfg, tmp_path / "ck", progress=False)
    assert isinstance(res.model, Forest) and res.model.n_models == 2
    assert res.summary["n_train_queries"] == toy_store.n_queries - res.heldout_rows.size
    curve = res.summary["curve"]
    assert [p["n_models"] for p in curve] == [1, 2] and 0.0 <= curve[-1]["mrr@10"] <= 1.0
    assert isinstance(load_model(tmp_path / "ck"), Forest)


def test_group_of_pairs_trains_like_separate_runs_with_dropout(toy_store) -> None:
    """Per-pair seeds, bags, random negatives and dropout streams: a group of G = 3 pairs gives
    the parameters of training the 3 pairs one by one (boosting off, so the order is free)."""
    cfg = {**SMALL, "n_models": 3, "boosting": False, "dropout": 0.3, "hidden": [6]}
    grouped = train_forest(toy_store, sectioned({**cfg, "group_size": 3}), progress=False).model
    alone = train_forest(toy_store, sectioned({**cfg, "group_size": 1}), progress=False).model
    for a, b in zip(
        grouped.query_weights + grouped.passage_weights + grouped.passage_biases,
        alone.query_weights + alone.passage_weights + alone.passage_biases,
        strict=True,
    ):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)
    # the pairs really differ from each other (own init, bag and masks)
    assert not torch.allclose(grouped.query_weights[0][0], grouped.query_weights[0][1])


def _distractor_store(seed: int = 0):
    """Queries around 12 topics, each with its gold passage near it. Every topic also has 4
    distractor passages: close to the topic (off along a topic-specific direction), judged
    non-relevant for every query of the topic, relevant to nothing."""
    from tests.training.conftest import ToyStore

    rng = np.random.default_rng(seed)
    d, topics, per, n_dis = 16, 12, 10, 4

    def unit(x):
        return (x / np.linalg.norm(x, axis=-1, keepdims=True)).astype(np.float32)

    centres = unit(rng.standard_normal((topics, d)))
    offsets = unit(rng.standard_normal((topics, d)))

    def near(c, n, s):
        return unit(c + s * rng.standard_normal((n, d)) / np.sqrt(d))

    gold = np.concatenate([near(centres[t], per, 0.5) for t in range(topics)])
    distract = np.concatenate(
        [near(centres[t] + 0.8 * offsets[t], n_dis, 0.2) for t in range(topics)]
    )
    queries = np.concatenate([near(centres[t], per, 0.3) for t in range(topics)])
    passages = np.concatenate([gold, distract])
    n_gold = len(gold)
    topic = np.repeat(np.arange(topics), per)
    cand = np.full((len(queries), 1 + n_dis), -1, dtype=np.int32)
    cand[:, 0] = np.arange(n_gold)  # query i -> gold passage i
    cand[:, 1:] = n_gold + topic[:, None] * n_dis + np.arange(n_dis)[None, :]
    labels = np.zeros(cand.shape, dtype=np.uint8)
    labels[:, 0] = 1
    return ToyStore(queries, passages, cand, labels), n_gold


def test_learned_not_retrievable_fires_for_never_relevant_passages() -> None:
    store, n_gold = _distractor_store()
    cfg = {
        **SMALL,
        "n_models": 4,
        "n_classes": 4,
        "group_size": 1,
        "hidden": [16],  # a linear NR column cannot cut distractors from golds of one topic
        "bag_queries": 1.0,
        "hard_negatives": 0,
        "random_negatives": 2,
        "steps_passage": 60,
        "steps_joint": 20,
        "nr_weight": 1.0,
        "nr_penalty": 0.0,
    }
    forest = train_forest(store, sectioned(cfg), progress=False).model
    pc, _ = forest.passage_classes(store.passages)
    nr = pc < 0
    gold_nr, distract_nr = nr[:n_gold].mean(), nr[n_gold:].mean()
    assert distract_nr > 0.8, distract_nr  # never-relevant passages leave the index (0.95)
    assert gold_nr < 0.06, gold_nr  # relevant ones stay (0.03 of (gold, model) cells leave)
    # without the term (the default) the outcome hardly fires, distractors included (0.02)
    plain = train_forest(
        store, sectioned({**cfg, "nr_weight": 0.0, "nr_penalty": 1.0}), progress=False
    )
    assert (plain.model.passage_classes(store.passages)[0][n_gold:] < 0).mean() < 0.1


def test_blocked_full_batch_gradient_equals_one_block(toy_store) -> None:
    """chunk_size only bounds memory: 7-row blocks train the same forest as one block (no
    dropout, whose masks are drawn per block)."""
    cfg = {**SMALL, "n_models": 2, "dropout": 0.0, "hidden": [6], "group_size": 2}
    one = train_forest(toy_store, sectioned({**cfg, "chunk_size": 100000}), progress=False).model
    blocked = train_forest(toy_store, sectioned({**cfg, "chunk_size": 7}), progress=False).model
    for a, b in zip(
        one.query_weights + one.passage_weights,
        blocked.query_weights + blocked.passage_weights,
        strict=True,
    ):
        torch.testing.assert_close(a, b, rtol=0, atol=2e-5)
