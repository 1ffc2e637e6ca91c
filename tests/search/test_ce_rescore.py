"""Cross-encoder reranking (``rescore:<A>:scorer=ce:<dir>``) on the 10-query MS MARCO sample."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.training.test_cross_encoder import LengthScorer, bm25_mined
from treerank.search.ce_rescore import (
    CrossEncoderRescoreSystem,
    ce_rerank,
    check_cross_encoders,
    recall_at_depth,
)
from treerank.search.specs import build_system, system_uses_trained_model
from treerank.training.cross_encoder import CrossEncoderConfig, train_cross_encoder

# rerank scores vs CrossEncoder.predict on the same pairs: batches pad differently, so the
# float32 sums differ in the last bits only
SCORE_ATOL = 1e-5


@pytest.fixture(scope="module")
def ms(msmarco_store: dict[str, Any]) -> Any:
    return msmarco_store["validation"]


@pytest.fixture(scope="module")
def ce_dir(ms: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    cfg = CrossEncoderConfig(negatives=2, batch_size=2, max_length=64, max_steps=3, lr=5e-5)
    out = train_cross_encoder(ms, cfg, tmp_path_factory.mktemp("ce") / "run", mined=bm25_mined(ms))
    return out.model_dir


def test_ce_rerank_hand_computed() -> None:
    passages = ["aaa", "a", "aa", "bbb"]
    ids, scores = ce_rerank(
        LengthScorer(), ["q0", "q1"], passages, np.array([[1, 0, 2], [3, 0, -1]])
    )
    # q0: lengths 1, 3, 2 -> 0, 2, 1; q1: 3 and 0 tie at 3 -> ascending id; padding last
    np.testing.assert_array_equal(ids, [[0, 2, 1], [0, 3, -1]])
    np.testing.assert_array_equal(scores, [[3, 2, 1], [3, 3, -np.inf]])
    with pytest.raises(ValueError, match="candidate ids"):
        ce_rerank(LengthScorer(), ["q0"], passages, np.array([[4]]))
    with pytest.raises(ValueError, match="expected ce:<dir>"):
        build_system("rescore:bm25:depth=5,scorer=ce:")


def test_reranked_run_keeps_the_first_stage_candidates(ms: Any, ce_dir: Path) -> None:
    system = build_system(f"rescore:bm25:depth=8,scorer=ce:{ce_dir}")
    assert isinstance(system, CrossEncoderRescoreSystem) and system_uses_trained_model(system)
    run = system.retrieve(ms, k=8)
    first = build_system("bm25").retrieve(ms, 8)
    assert run.ids.shape == first.ids.shape == (ms.n_queries, 8)
    for row, ref in zip(run.ids, first.ids, strict=True):
        assert sorted(row.tolist()) == sorted(ref.tolist())  # same set, only reordered
    for row, ids in zip(run.scores, run.ids, strict=True):
        real = row[ids >= 0]
        assert np.all(np.diff(real) <= 0) and np.all(np.isneginf(row[ids < 0]))
        assert (ids >= 0).sum() == len(real) and np.all(ids[len(real) :] == -1)  # padding last
    assert not np.array_equal(run.ids, first.ids)  # it does reorder
    # k below the depth keeps the top of the reranked depth, not of the first stage's top k
    top3 = system.retrieve(ms, k=3)
    np.testing.assert_array_equal(top3.ids, run.ids[:, :3])
    rec = system.first_stage_recall(ms)
    assert rec == {"recall@8": pytest.approx(recall_at_depth(ms, first.ids), abs=0)}


def test_rerank_scores_equal_direct_predict(ms: Any, ce_dir: Path) -> None:
    import torch
    from sentence_transformers import CrossEncoder

    run = build_system(f"rescore:bm25:depth=5,scorer=ce:{ce_dir}").retrieve(ms, k=5)
    model = CrossEncoder(str(ce_dir), device="cpu")
    q, p = ms.query_texts(), ms.passage_texts()
    pairs = [(q[i], p[int(pid)]) for i in range(ms.n_queries) for pid in run.ids[i] if pid >= 0]
    direct = model.predict(pairs, batch_size=1, activation_fn=torch.nn.Identity())
    np.testing.assert_allclose(run.scores[run.ids >= 0], direct, rtol=0, atol=SCORE_ATOL)


def test_recall_at_depth_hand_computed(ms: Any) -> None:
    rel = [
        set(c[(c >= 0) & (lab >= ms.relevance_threshold)].tolist())
        for c, lab in zip(np.asarray(ms.candidates), np.asarray(ms.labels), strict=True)
    ]
    cand = np.array([sorted(r)[:1] + [-1] if r else [-1, -1] for r in rel])
    want = np.mean([1 / len(r) for r in rel if r])
    assert recall_at_depth(ms, cand) == pytest.approx(want, abs=1e-12)


def test_spec_options_reach_the_scorer(ms: Any, ce_dir: Path) -> None:
    system = build_system(f"rescore:bm25:depth=8,scorer=ce:{ce_dir},batch=4,precision=bf16")
    assert isinstance(system, CrossEncoderRescoreSystem)
    scorer = system.scorer_for()
    assert (scorer.batch_size, scorer.precision) == (4, "bf16")
    fp32 = build_system(f"rescore:bm25:depth=8,scorer=ce:{ce_dir}").retrieve(ms, k=8)
    bf16 = system.retrieve(ms, k=8)
    for a, b in zip(fp32.ids, bf16.ids, strict=True):  # the same candidates, reordered at most
        assert sorted(a.tolist()) == sorted(b.tolist())


def test_auto_precision_is_the_measured_probe_choice(
    ce_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from treerank.encoders.precision import TORCH_BF16, TORCH_FP32, cosines, resolve_path
    from treerank.models.cross_encoder import CrossEncoderScorer

    monkeypatch.setenv("TREERANK_CACHE", str(tmp_path))
    scorer = CrossEncoderScorer(ce_dir)
    ref, low = scorer.probe_forward(TORCH_FP32)(), scorer.probe_forward(TORCH_BF16)()
    assert ref.shape == (1, 32) and abs(float(ref.mean())) < 1e-5  # centred scores
    assert float(cosines(low, ref).min()) >= 0.999  # bf16 within its bound (Pearson r)

    def clock(bf16_seconds: float):  # type: ignore[no-untyped-def]
        return lambda path, fn: bf16_seconds if path.precision == "bf16" else 1.0

    slower = resolve_path(scorer, "torch", "auto", timer=clock(2.0), refresh=True)
    assert slower.path == TORCH_FP32  # a slower bf16 is never chosen
    faster = resolve_path(scorer, "torch", "auto", timer=clock(0.5), refresh=True)
    assert faster.path == TORCH_BF16 and faster.ratio == pytest.approx(2.0)
    auto = CrossEncoderScorer(ce_dir, precision="auto")  # reads the cached choice
    assert auto.precision == "bf16" and auto.choice is not None and auto.choice["cached"]
    with pytest.raises(ValueError, match="expected one of fp32, bf16, auto"):
        CrossEncoderScorer(ce_dir, precision="fp16")  # type: ignore[arg-type]


def test_a_pinned_cross_encoder_of_other_weights_is_refused_before_scoring(
    ms: Any, ce_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from treerank.models.cross_encoder import CrossEncoderScorer
    from treerank.search.ce_rescore import CrossEncoderMismatchError, cross_encoders
    from treerank.search.query import EncoderMismatchError

    have = CrossEncoderScorer(ce_dir).fingerprint
    scored: list[int] = []
    real = CrossEncoderScorer.score_pairs

    def counting(self: Any, q: list[str], p: list[str]) -> Any:
        scored.append(len(q))
        return real(self, q, p)

    monkeypatch.setattr(CrossEncoderScorer, "score_pairs", counting)
    other = "sha256:" + ("0" if have[7] != "0" else "1") * 12
    spec = f"rescore:bm25:depth=5,scorer=ce:{ce_dir},fingerprint={other}"
    with pytest.raises(CrossEncoderMismatchError) as err:
        build_system(spec).retrieve(ms, k=5)
    assert isinstance(err.value, EncoderMismatchError)  # serve refuses it like an encoder's
    msg = str(err.value)
    assert str(ce_dir) in msg and have in msg and other in msg
    assert scored == []  # refused before one pair was scored
    # inside a fusion too, before any retrieval: check_cross_encoders walks the tree
    fused = build_system(f"rrf:bm25+{spec}")
    assert [ce.name for ce in cross_encoders(fused)] == [spec]
    with pytest.raises(CrossEncoderMismatchError):
        check_cross_encoders([fused])
    # the whole fingerprint and a 8-hex-digit prefix both pin it
    for pin in (have, have[: len("sha256:") + 8]):
        system = build_system(f"rescore:bm25:depth=5,scorer=ce:{ce_dir},fingerprint={pin}")
        assert system.retrieve(ms, k=5).ids.shape == (ms.n_queries, 5)
        ident = system.identity()
        assert (ident.path, ident.fingerprint, ident.pinned) == (str(ce_dir.resolve()), have, pin)
    assert scored  # the matching pins scored


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        ("rescore:bm25:scorer=ce:/x,fingerprint=abc", "is not sha256:<8 to 64 lowercase hex"),
        ("rescore:bm25:scorer=ce:/x,fingerprint=sha256:0123", "is not sha256:<8 to 64"),
        ("rescore:bm25:scorer=ce:/x,fingerprint=sha256:ABCDEF01", "lowercase hex"),
        ("rescore:bm25:fingerprint=sha256:01234567", "fingerprint= apply to scorer=ce:<dir> only"),
    ],
)
def test_a_malformed_pin_is_refused_when_parsed(spec: str, match: str) -> None:
    from treerank.search.specs import SpecError, parse_spec

    with pytest.raises(SpecError, match=match):
        parse_spec(spec)


def test_a_pin_renders_and_parses_back() -> None:
    from treerank.search.specs import parse_spec

    text = "rescore:bm25:depth=20,scorer=ce:runs/ce/model,fingerprint=sha256:0123abcd"
    node = parse_spec(text)
    assert node.render() == text
    assert parse_spec(node.render()) == node
