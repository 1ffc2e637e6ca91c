"""Determinism, a tested promise for every trainable family: same config + same seed + same
thread count -> identical checkpoint tensors (byte for byte), identical config and identical
held-out metrics; a different seed gives different tensors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.pipeline.test_training import write_store
from treerank.families import trainable_families
from treerank.tasks.train import train_model

VALIDATION = {"fraction": 0.25, "k": 20, "metrics": ["mrr@10", "ndcg@10"]}
HEAD = {
    "data": {"batch_size": 16, "n_hard": 0},
    "trainer": {"epochs": 4, "lr": 1e-2, "log_every": 1, "threads": 1},
    "validation": VALIDATION,
}
SMALL = {
    "linear": HEAD,
    "mlp": HEAD,
    "drt": {**HEAD, "model": {"k": 2, "slot_dim": 4, "hidden": 16, "attn_hidden": 8}},
    "forest": {
        "model": {"n_models": 2, "n_classes": 4},
        "data": {"random_negatives": 2, "hard_negatives": 2},
        "trainer": {
            "group_size": 2,
            "steps_query": 3,
            "steps_passage": 3,
            "steps_joint": 3,
            "num_threads": 1,
        },
        "validation": VALIDATION,
    },
}


def _strip_timings(doc):
    if isinstance(doc, dict):
        return {k: _strip_timings(v) for k, v in doc.items() if k != "seconds"}
    if isinstance(doc, list):
        return [_strip_timings(v) for v in doc]
    return doc


def test_every_trainable_family_has_a_determinism_config() -> None:
    # fails for any registered trainable family (built-in or added later) missing from SMALL
    missing = sorted(set(trainable_families()) - set(SMALL))
    assert not missing, f"add a determinism config to SMALL for: {', '.join(missing)}"
    assert {"linear", "mlp", "drt", "forest"} <= set(SMALL)


def _held_out(model_dir: Path) -> list[dict]:
    """The held-out evaluations of a training log, timings stripped; never empty."""
    lines = (model_dir / "training_log.jsonl").read_text().splitlines()
    evals = [_strip_timings(r) for r in map(json.loads, lines) if r["kind"] == "eval"]
    assert evals, f"{model_dir}: no held-out evaluation in the training log"
    for rec in evals:
        assert all(isinstance(rec.get(m), float) for m in VALIDATION["metrics"]), rec
    return evals


@pytest.mark.parametrize("family", sorted(SMALL))
def test_same_seed_same_checkpoint_bytes_and_metrics(family: str, tmp_path: Path) -> None:
    store = write_store(tmp_path / "store" / "train")
    runs = []
    for name, seed in (("a", 0), ("b", 0), ("c", 1)):
        res = train_model(
            family, store, {"seed": seed, **SMALL[family]}, tmp_path / name, progress=False
        )
        runs.append(res)
    a, b, c = (tmp_path / n for n in "abc")
    weights = [(p / "weights.safetensors").read_bytes() for p in (a, b, c)]
    assert weights[0] == weights[1]
    assert weights[0] != weights[2]  # the seed matters
    docs = [_strip_timings(json.loads((p / "config.json").read_text())) for p in (a, b)]
    assert docs[0] == docs[1]
    # the held-out metrics are real numbers (not two missing keys) and identical
    assert _held_out(a) == _held_out(b)
    assert _strip_timings(runs[0].summary) == _strip_timings(runs[1].summary)
