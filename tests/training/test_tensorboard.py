"""TensorBoard event files beside ``training_log.jsonl``: a real (toy-store) linear-head training
saved by ``save_trained_model``; the events, read back with TensorBoard's own
``EventAccumulator``, hold every numeric value of the log at its step (float32 rounding)."""

from __future__ import annotations

import math

import pytest

from treerank.training.history import read_log
from treerank.training.output import LOG_FILE, save_trained_model
from treerank.training.tensorboard import EVENTS_GLOB, scalars_of

pytest.importorskip("tensorboard")  # in the tensorboard and dev extras: CI installs it


def _read_events(model_dir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    (path,) = model_dir.glob(EVENTS_GLOB)
    acc = EventAccumulator(str(path), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def test_event_files_equal_the_training_log(toy_store, tmp_path):
    from treerank.training.heads import train_linear

    cfg = {
        "seed": 0,
        "data": {"batch_size": 32, "n_hard": 0},
        "trainer": {"epochs": 3, "lr": 3e-3, "log_every": 1, "patience": None, "threads": 1},
    }
    out = train_linear(toy_store, cfg, progress=False)
    model_dir, log_path, _ = save_trained_model(
        tmp_path / "linear",
        out.model,
        encoder_name=toy_store.encoder_name,
        encoder_fingerprint=toy_store.encoder_fingerprint,
        summary=out.summary,
        records=out.records,
    )
    assert log_path == model_dir / LOG_FILE
    records = read_log(log_path)
    want: dict[str, list[tuple[int, float]]] = {}
    for tag, step, value in scalars_of(records):
        want.setdefault(tag, []).append((step, value))
    assert "train/loss" in want and len(want["train/loss"]) >= 3
    got = _read_events(model_dir)
    assert set(got) == set(want)
    for tag, pairs in want.items():
        assert [s for s, _ in got[tag]] == [s for s, _ in pairs], tag
        for (_, a), (_, b) in zip(got[tag], pairs, strict=True):
            assert math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-7), (tag, a, b)
    # saving the model again replaces the event file, never adds a second one
    save_trained_model(
        model_dir,
        out.model,
        encoder_name=toy_store.encoder_name,
        encoder_fingerprint=toy_store.encoder_fingerprint,
        records=out.records,
    )
    assert len(list(model_dir.glob(EVENTS_GLOB))) == 1


def test_scalars_of_skips_flags_steps_and_non_finite():
    recs = [
        {"kind": "train", "step": 1, "loss": 2.5, "best": True, "epoch": 0, "note": "x"},
        {"kind": "eval", "step": 1, "mrr@10": 0.25, "ndcg@10": None, "bad": math.nan},
        {"kind": "summary", "loss": 1.0},
    ]
    assert scalars_of(recs) == [("train/loss", 1, 2.5), ("eval/mrr@10", 1, 0.25)]
