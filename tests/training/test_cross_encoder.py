"""The cross-encoder trainer and denoising, on the 10-query MS MARCO sample (real texts).

Training runs a few steps at ``max_length=64`` on CPU; what is checked is plumbing with exact
values (groups, teacher labels, resume fingerprints, denoising counts), not quality.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from treerank.search.bm25 import BM25Index
from treerank.search.negatives import drop_labelled
from treerank.training.cross_encoder import (
    CrossEncoderConfig,
    build_groups,
    denoise_negatives,
    score_groups,
    train_cross_encoder,
)
from treerank.training.sampler import relevant_lists


def bm25_mined(store: Any, depth: int = 20) -> np.ndarray:
    """BM25 negatives as ``mine_bm25_negatives`` stores them, without writing a sidecar."""
    ids, scores = BM25Index(store.passage_texts()).search(store.query_texts(), k=depth)
    return drop_labelled(ids, np.asarray(store.candidates), np.asarray(store.labels), scores)


@pytest.fixture(scope="module")
def ms(msmarco_store: dict[str, Any]) -> Any:
    return msmarco_store["validation"]


def small(**kw: Any) -> CrossEncoderConfig:
    base = {"negatives": 2, "batch_size": 2, "max_length": 64, "max_steps": 4, "lr": 5e-5}
    base.update(kw)
    return CrossEncoderConfig(**base)


def test_groups_use_only_unlabelled_negatives(ms: Any) -> None:
    mined = bm25_mined(ms)
    g = build_groups(ms, mined, 3, seed=0)
    relevant, labelled = relevant_lists(np.asarray(ms.candidates), np.asarray(ms.labels))
    assert g.n == int((relevant >= 0).sum())  # one group per (query, relevant passage)
    for q, p, negs, was_mined in zip(g.query_rows, g.positive, g.negatives, g.mined, strict=True):
        assert p in relevant[q]
        assert not set(negs.tolist()) & set(labelled[q][labelled[q] >= 0].tolist())
        assert len(set(negs.tolist())) == 3
        # mined negatives are BM25's first unlabelled ranks, in rank order
        m = [int(x) for x in mined[q] if x >= 0][:3]
        assert negs[was_mined].tolist() == m[: int(was_mined.sum())]
    again = build_groups(ms, mined, 3, seed=0)
    np.testing.assert_array_equal(again.negatives, g.negatives)
    with pytest.raises(ValueError, match="mined negatives"):
        build_groups(ms, mined[:3], 3)


def test_config_refuses_bad_values() -> None:
    with pytest.raises(ValueError, match="loss='hinge'"):
        CrossEncoderConfig(loss="hinge")
    with pytest.raises(ValueError, match="precision='fp16'"):
        CrossEncoderConfig(precision="fp16")
    from treerank.config import ConfigError

    with pytest.raises(ConfigError, match="negativs"):
        CrossEncoderConfig.from_mapping({"negativs": 3})
    assert CrossEncoderConfig.from_mapping({"loss": "listwise"}).loss == "listwise"
    from treerank.models.cross_encoder import CrossEncoderScorer

    with pytest.raises(ValueError, match="precision 'fp16'"):
        CrossEncoderScorer("anywhere", precision="fp16")
    with pytest.raises(FileNotFoundError, match="no cross-encoder folder"):
        CrossEncoderScorer("/nonexistent/ce")


def test_denoise_hand_computed_never_drops_a_labelled_positive() -> None:
    # query 0 labels passages 5 (grade 2) and 7 (grade 1); query 1 labels passage 2
    candidates = np.array([[5, 7], [2, -1]], np.int32)
    labels = np.array([[2, 1], [1, 0]], np.uint8)
    # passage 7 sits among query 0's negatives with the top score: labelled, never flagged
    negatives = np.array([[7, 3, 4, -1], [1, 0, 6, 9]])
    scores = np.array([[9.0, 4.5, 1.0, 99.0], [2.0, 3.9, -1.0, 0.5]])
    positive = np.array([5.0, 4.0])
    r = denoise_negatives(
        negatives, scores, positive, candidates, labels, relative_margin=0.1, n_examples=5
    )
    # margin cut: q0 5 - 0.5 = 4.5 -> passage 3 (4.5); q1 4 - 0.4 = 3.6 -> passage 0 (3.9)
    np.testing.assert_array_equal(r.flagged, [[0, 1, 0, 0], [0, 1, 0, 0]])
    np.testing.assert_array_equal(r.negatives, [[7, -1, 4, -1], [1, -1, 6, 9]])
    assert r.counts == {
        "negatives": 6,
        "flagged": 2,
        "share": round(2 / 6, 6),
        "queries_with_flag": 2,
        "action": "drop",
    }
    assert [(e["query"], e["passage"], e["score"]) for e in r.examples] == [
        (0, 3, 4.5),
        (1, 0, 3.9),
    ]
    t = denoise_negatives(negatives, scores, positive, candidates, labels, threshold=1.5)
    np.testing.assert_array_equal(t.flagged, [[0, 1, 0, 0], [1, 1, 0, 0]])
    assert t.negatives[0, 0] == 7  # the labelled passage stays whatever its score
    rel = denoise_negatives(
        negatives, scores, positive, candidates, labels, threshold=1.5, action="relabel"
    )
    np.testing.assert_array_equal(rel.negatives, negatives)
    np.testing.assert_array_equal(rel.relabelled, [[-1, 3, -1, -1], [1, 0, -1, -1]])
    with pytest.raises(ValueError, match="threshold"):
        denoise_negatives(negatives, scores, positive, candidates, labels)


def test_denoise_real_mined_negatives_keeps_every_labelled_positive(ms: Any) -> None:
    mined = bm25_mined(ms).astype(np.int64)
    # put each query's labelled passages back among its negatives, scored highest of all
    _, labelled = relevant_lists(np.asarray(ms.candidates), np.asarray(ms.labels))
    negs = np.concatenate([labelled, mined], axis=1)
    scores = np.where(negs >= 0, 0.0, np.nan)
    scores[:, : labelled.shape[1]] = 100.0
    scores[:, labelled.shape[1] :: 2] = 10.0  # every other mined one scores as a positive
    r = denoise_negatives(
        negs, scores, np.full(ms.n_queries, 10.0), ms.candidates, ms.labels, threshold=5.0
    )
    kept_labelled = r.negatives[:, : labelled.shape[1]]
    np.testing.assert_array_equal(kept_labelled, labelled)  # no labelled positive dropped
    expected = int((mined[:, ::2] >= 0).sum())
    assert r.counts["flagged"] == expected and r.counts["negatives"] == int((mined >= 0).sum())


def test_margin_mse_teacher_scores_reach_the_loss_unchanged(
    ms: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from sentence_transformers.cross_encoder.losses import MarginMSELoss

    cfg = small(loss="margin-mse", max_steps=3)
    mined = bm25_mined(ms)
    g = build_groups(ms, mined, cfg.negatives, seed=cfg.seed)
    rng = np.random.default_rng(3)
    teacher = rng.normal(0, 4, (g.n, 1 + cfg.negatives)).astype(np.float32)
    seen: list[np.ndarray] = []
    original = MarginMSELoss.forward

    def spy(self: Any, inputs: Any, labels: Any, *a: Any, **kw: Any) -> Any:
        lab = labels if not isinstance(labels, list) else __import__("torch").stack(labels)
        seen.append(lab.detach().cpu().numpy().copy())
        return original(self, inputs, labels, *a, **kw)

    monkeypatch.setattr(MarginMSELoss, "forward", spy)
    out = train_cross_encoder(ms, cfg, tmp_path / "ce", mined=mined, teacher_scores=teacher)
    got = np.concatenate(seen)
    # batches run in group order: the first 3 * batch_size groups, bit for bit
    np.testing.assert_array_equal(got.astype(np.float32), teacher[: len(got)])
    assert len(got) == 3 * cfg.batch_size and out.summary["steps"] == 3
    with pytest.raises(ValueError, match="teacher_scores"):
        train_cross_encoder(ms, cfg, tmp_path / "other", mined=mined, teacher_scores=teacher[:2])


def test_resume_is_bit_identical(ms: Any, tmp_path: Path) -> None:
    cfg = small(loss="listwise", save_steps=2)
    mined = bm25_mined(ms)
    straight = train_cross_encoder(ms, cfg, tmp_path / "a", mined=mined)
    with pytest.raises(KeyboardInterrupt):
        train_cross_encoder(ms, cfg, tmp_path / "b", mined=mined, stop_after_steps=2)
    with pytest.raises(FileExistsError, match="resume"):
        train_cross_encoder(ms, cfg, tmp_path / "b", mined=mined)
    resumed = train_cross_encoder(ms, cfg, tmp_path / "b", mined=mined, resume=True)
    assert resumed.summary["resumed_from"] == "checkpoint-2"
    assert resumed.summary["steps"] == straight.summary["steps"] == 4
    assert resumed.fingerprint == straight.fingerprint
    assert [r["loss"] for r in resumed.summary["log"]] == [
        r["loss"] for r in straight.summary["log"][2:]
    ]


def test_a_save_killed_midway_leaves_no_partial_checkpoint(
    ms: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A crash after the weights of checkpoint-4 are written but before its optimiser state:
    checkpoint-2 stays whole, no checkpoint-4 and no staging folder remain, and --resume
    continues from checkpoint-2 to the uninterrupted run's weights."""
    from transformers import Trainer

    from treerank.training.model_folder import latest_checkpoint

    cfg = small(loss="listwise", save_steps=2)
    mined = bm25_mined(ms)
    real = Trainer._save_optimizer_and_scheduler

    def dies_at_step_4(self: Any, output_dir: str) -> None:
        if self.state.global_step == 4:
            raise OSError("disk full (test)")
        real(self, output_dir)

    monkeypatch.setattr(Trainer, "_save_optimizer_and_scheduler", dies_at_step_4)
    with pytest.raises(OSError, match="disk full"):
        train_cross_encoder(ms, cfg, tmp_path / "cut", mined=mined)
    ckpts = tmp_path / "cut" / "checkpoints"
    assert sorted(p.name for p in ckpts.iterdir()) == ["checkpoint-2"]
    assert (ckpts / "checkpoint-2" / "optimizer.pt").is_file()
    assert latest_checkpoint(ckpts) == ckpts / "checkpoint-2"
    monkeypatch.setattr(Trainer, "_save_optimizer_and_scheduler", real)
    resumed = train_cross_encoder(ms, cfg, tmp_path / "cut", mined=mined, resume=True)
    straight = train_cross_encoder(ms, cfg, tmp_path / "straight", mined=mined)
    assert resumed.summary["resumed_from"] == "checkpoint-2"
    assert resumed.fingerprint == straight.fingerprint


def test_bce_bf16_trains_and_scores(ms: Any, tmp_path: Path) -> None:
    from treerank.models.cross_encoder import CrossEncoderScorer

    mined = bm25_mined(ms)
    out = train_cross_encoder(
        ms, small(loss="bce", precision="bf16", max_steps=2), tmp_path / "c", mined=mined
    )
    assert np.isfinite(out.summary["train_loss"]) and out.summary["steps"] == 2
    cost = out.summary["cost"]
    assert cost["cpu_seconds"] > 0 and cost["peak_rss_mib"] > 0
    s = CrossEncoderScorer(out.model_dir, precision="bf16")
    assert s.fingerprint == out.fingerprint  # the saved folder loads the trained weights
    v = s.score_pairs(ms.query_texts()[:2], ms.passage_texts()[:2])
    assert v.dtype == np.float32 and v.shape == (2,) and np.isfinite(v).all()


def test_auto_precision_takes_the_probes_choice(
    ms: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``precision: auto`` trains at what ``resolve_precision`` measured, and records it."""
    import treerank.training.precision as precision

    seen: list[str] = []

    def fake(setting: str, encoder: Any, device: Any = None, **_: Any) -> tuple[str, dict]:
        seen.append(setting)
        return "bf16", {"setting": setting, "chosen": "bf16", "ratio": 2.5}

    monkeypatch.setattr(precision, "resolve_precision", fake)
    out = train_cross_encoder(
        ms, small(loss="bce", precision="auto", max_steps=1), tmp_path / "a", mined=bm25_mined(ms)
    )
    assert seen == ["auto"]
    assert out.summary["precision"] == "bf16"
    assert out.summary["precision_choice"] == {"setting": "auto", "chosen": "bf16", "ratio": 2.5}
    assert CrossEncoderConfig(precision="auto").precision == "auto"


class LengthScorer:
    """A stand-in teacher: a pair's score is its passage's length in characters."""

    def score_pairs(self, queries: list[str], passages: list[str]) -> np.ndarray:
        assert len(queries) == len(passages)
        return np.array([float(len(p)) for p in passages], np.float32)


def test_score_groups_puts_the_positive_first(ms: Any) -> None:
    g = build_groups(ms, bm25_mined(ms), 2, seed=0)
    t = score_groups(LengthScorer(), ms, g)
    texts = ms.passage_texts()
    assert t.shape == (g.n, 3) and t.dtype == np.float32
    for row, p, negs in zip(t, g.positive, g.negatives, strict=True):
        assert row.tolist() == [float(len(texts[int(x)])) for x in [p, *negs]]
