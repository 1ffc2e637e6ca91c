"""Training on denoised hard negatives (RocketQA; ``data.denoise`` of a head) on the 10-query MS
MARCO sample (real texts, BM25-mined negatives): hand-computed flags with a stub scorer, the
sampler's pool without them, a labelled passage never dropped, the query sample, reuse and
re-scoring, and the config's refusals."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from treerank.config import ConfigError
from treerank.search.negatives import mine_bm25_negatives
from treerank.store import EmbeddingStore
from treerank.tasks.train import ensure_denoised_negatives, ensure_mined_negatives
from treerank.training.data import sample_rows
from treerank.training.denoise import denoised_array, parse_denoise
from treerank.training.heads import build_sampler, parse_linear_config


class _Table:
    """Scores by (query text, passage text): ``table`` entries, ``default`` elsewhere."""

    def __init__(self, table: dict[tuple[str, str], float], default: float, name: str) -> None:
        self.table, self.default, self.calls, self.fingerprint = table, default, 0, name

    def score_pairs(self, queries: list[str], passages: list[str]) -> np.ndarray:
        self.calls += len(queries)
        return np.array(
            [self.table.get((q, p), self.default) for q, p in zip(queries, passages, strict=True)],
            np.float32,
        )


def _data(**extra: Any) -> Any:
    data = {
        "batch_size": 2,
        "n_hard": 1,
        "hard_negatives": "mined",
        "mine_depth": 10,
        "guard_skip_top": 0,
        "denoise": {"scorer": "ce:/nowhere", "depth": 3, "relative_margin": 0.05},
        **extra,
    }
    return parse_linear_config({"data": data}).data


@pytest.fixture
def store(msmarco_store: dict[str, Any], tmp_path: Path) -> EmbeddingStore:
    copy = tmp_path / "validation"
    shutil.copytree(Path(msmarco_store["validation"].path), copy)
    return EmbeddingStore.open(copy)


def _labelled(st: EmbeddingStore) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    cand, lab = np.asarray(st.candidates), np.asarray(st.labels)
    rows = np.flatnonzero(((cand >= 0) & (lab >= int(st.relevance_threshold))).any(axis=1))
    return rows, cand, lab


def test_flagged_negatives_leave_the_pool_and_positives_never_do(store: EmbeddingStore) -> None:
    data = _data()
    ensure_mined_negatives(store, data)
    mined = np.asarray(store.load_array(data.mined_array))
    rows, cand, lab = _labelled(store)
    qt, pt = store.query_texts(), store.passage_texts()
    first = [mined[r][mined[r] >= 0][:3] for r in rows]  # the 3 negatives scored per query
    # positives score 10; query rows[0]'s second negative 9.6 (within 5 % of 10: flagged),
    # query rows[1]'s first 9.4 (outside: kept), every other pair -5
    table = {
        (qt[r], pt[p]): 10.0
        for r in rows
        for p, g in zip(cand[r], lab[r], strict=True)
        if p >= 0 and g >= 1
    }
    table[(qt[rows[0]], pt[first[0][1]])] = 9.6
    table[(qt[rows[1]], pt[first[1][0]])] = 9.4
    scorer = _Table(table, -5.0, "w1")
    meta = ensure_denoised_negatives(store, data.denoise_job(), scorer=scorer, progress=False)
    assert meta is not None
    name = data.denoise_job().array
    assert meta["array"] == name and store.has_array(name)
    n_neg = sum(len(f) for f in first)
    n_pos = int(((cand[rows] >= 0) & (lab[rows] >= 1)).sum())
    assert scorer.calls == meta["scorer_pairs"] == n_neg + n_pos
    assert (meta["negatives"], meta["flagged"], meta["kept"]) == (n_neg, 1, n_neg - 1)
    assert meta["queries"] == rows.size and meta["scorer_fingerprint"] == "w1"
    (ex,) = meta["examples"]
    assert ex["passage_id"] == store.passage_ids()[first[0][1]] and ex["score"] == 9.6
    arr = np.asarray(store.load_array(name))
    assert arr.shape == (store.n_queries, 3) and arr.dtype == np.int32
    want = np.full((store.n_queries, 3), -1)
    for r, f in zip(rows, first, strict=True):
        want[r, : f.size] = f
    want[rows[0], 1] = -1  # the flagged one is dropped, the rest stay in BM25 order
    np.testing.assert_array_equal(arr, want)
    # the sampler's pool is the denoised one: the flagged passage is gone from rows[0]'s pool
    _, info = build_sampler(store, data, seed=0)
    assert info["denoised_array"] == name
    assert info["mean_pool_size"] == pytest.approx((arr >= 0).sum() / store.n_queries)
    # every pair scoring 100 with threshold 0 flags every negative; no labelled passage moves
    all_pos = _Table({}, 100.0, "w2")
    data0 = _data(denoise={"scorer": "ce:/nowhere", "depth": 3, "threshold": 0.0})
    meta0 = ensure_denoised_negatives(store, data0.denoise_job(), scorer=all_pos, progress=False)
    assert meta0 is not None and meta0["flagged"] == meta0["negatives"] == n_neg
    assert meta0["kept"] == 0


def test_an_array_is_reused_for_the_same_weights_and_rescored_for_others(
    store: EmbeddingStore,
) -> None:
    data = _data()
    mine_bm25_negatives(store, 10, name=data.mined_array)
    first = _Table({}, -5.0, "w1")
    a = ensure_denoised_negatives(store, data.denoise_job(), scorer=first, progress=False)
    calls = first.calls
    assert calls > 0
    b = ensure_denoised_negatives(store, data.denoise_job(), scorer=first, progress=False)
    assert first.calls == calls and a == b  # reused: nothing scored again
    other = _Table({}, -5.0, "w2")  # other weights: scored again
    ensure_denoised_negatives(store, data.denoise_job(), scorer=other, progress=False)
    assert other.calls == calls


def test_a_query_sample_scores_and_trains_only_its_rows(store: EmbeddingStore) -> None:
    rule = {"scorer": "ce:/nowhere", "depth": 3, "threshold": 100.0, "relative_margin": None}
    data = _data(max_queries=4, sample_seed=3, denoise=rule)  # nothing scores 100: all kept
    mine_bm25_negatives(store, 10, name=data.mined_array)
    meta = ensure_denoised_negatives(
        store, data.denoise_job(), scorer=_Table({}, -5.0, "w"), progress=False
    )
    sample = sample_rows(store.n_queries, 4, 3)
    assert sample is not None and sample.size == 4
    rows, _, _ = _labelled(store)
    kept_rows = np.intersect1d(rows, sample)
    assert meta is not None and meta["queries"] == kept_rows.size
    arr = np.asarray(store.load_array(str(meta["array"])))
    outside = np.setdiff1d(np.arange(store.n_queries), kept_rows)
    assert (arr[outside] == -1).all() and (arr[kept_rows] >= 0).any()
    sampler, info = build_sampler(store, data, seed=0)
    assert info["sampled_queries"] == 4
    assert set(sampler.query_rows.tolist()) <= set(kept_rows.tolist())
    # the name changes with the sample, so two samples never share an array
    spec = parse_denoise(data.denoise)
    assert spec is not None and meta["array"] != denoised_array(data.mined_array, spec, None, 0)


def test_no_denoise_section_is_a_no_op_and_a_missing_array_is_named(
    store: EmbeddingStore,
) -> None:
    assert (
        ensure_denoised_negatives(store, _data(denoise=None).denoise_job(), progress=False) is None
    )
    with pytest.raises(ValueError, match="no mined array 'bm25_negatives' to denoise"):
        ensure_denoised_negatives(
            store, _data().denoise_job(), scorer=_Table({}, 0.0, "w"), progress=False
        )
    mine_bm25_negatives(store, 10, name="bm25_negatives")
    with pytest.raises(ValueError, match="-denoised-.*ensure_denoised_negatives"):
        build_sampler(store, _data(), seed=0)


@pytest.mark.parametrize(
    ("data", "match"),
    [
        ({"denoise": {"scorer": "bm25"}}, r"data: denoise: scorer 'bm25': expected ce:"),
        ({"denoise": {"scorer": "ce:x", "deep": 3}}, r"denoise: unknown key\(s\) deep"),
        ({"denoise": {"scorer": "ce:x", "depth": 0}}, "depth must be >= 1"),
        ({"denoise": {"scorer": "ce:x", "relative_margin": None}}, "a threshold, a relative"),
        ({"denoise": {"scorer": "ce:x"}, "hard_negatives": "auto"}, "needs hard_negatives: mined"),
        ({"denoise": {"scorer": "ce:x"}, "n_hard": 0}, "n_hard >= 1"),
        ({"max_queries": 0}, "max_queries must be >= 1"),
        ({"max_queries": 5, "sources": [{"kind": "labels"}]}, "each entry its own max_queries"),
    ],
)
def test_bad_denoise_settings_are_refused_naming_the_key(data: dict[str, Any], match: str) -> None:
    raw = {"hard_negatives": "mined", "n_hard": 1, **data}
    with pytest.raises(ConfigError, match=match):
        parse_linear_config({"data": raw})


def test_a_sampled_head_counts_only_its_sample_as_training_queries(
    store: EmbeddingStore, tmp_path: Path
) -> None:
    from treerank.tasks.train import train_model

    cfg = {
        "seed": 0,
        "data": {"batch_size": 2, "n_hard": 0, "max_queries": 4, "sample_seed": 3},
        "trainer": {"max_steps": 1, "epochs": 1, "threads": 1},
        "validation": {"fraction": 0.0},
    }
    res = train_model("linear", store, cfg, tmp_path / "m", progress=False)
    rows, _, _ = _labelled(store)
    sample = sample_rows(store.n_queries, 4, 3)
    assert sample is not None
    assert res.summary["training_queries"] == np.intersect1d(rows, sample).size
    assert res.summary["sampler"]["sampled_queries"] == 4


def test_an_encoder_finetune_batches_only_the_denoised_pool(store: EmbeddingStore) -> None:
    """A fine-tune's ``data.denoise`` (issue 32 item 3 for encoders): the job names the split's
    mined array, and the batch plan draws hard negatives only from what the cross-encoder kept
    (a flagged negative never appears, over 30 epochs of draws)."""
    from treerank.training.finetune import plan_batches
    from treerank.training.finetune_config import parse_finetune_config

    dn = {"scorer": "ce:/nowhere", "depth": 3, "relative_margin": 0.05}
    cfg = parse_finetune_config(
        {"family": "query-tower", "seed": 0,
         "data": {"batch_size": 2, "epochs": 30, "hard_negatives": "mined", "n_hard": 1,
                  "mine_depth": 10, "guard_skip_top": 0, "negatives": "in-batch",
                  "denoise": dn}}
    )  # fmt: skip
    job = cfg.data.denoise_job()
    assert job is not None and job.mined_array == "bm25_negatives" and job.max_queries is None
    mine_bm25_negatives(store, 10, name=job.mined_array)
    mined = np.asarray(store.load_array(job.mined_array))
    rows, cand, lab = _labelled(store)
    qt, pt = store.query_texts(), store.passage_texts()
    first = mined[rows[0]][mined[rows[0]] >= 0][:3]
    pos = {
        (qt[r], pt[p]): 10.0
        for r in rows
        for p, g in zip(cand[r], lab[r], strict=True)
        if p >= 0 and g >= 1
    }
    scorer = _Table({**pos, (qt[rows[0]], pt[first[0]]): 9.9}, -5.0, "w")
    meta = ensure_denoised_negatives(store, job, scorer=scorer, progress=False)
    assert meta is not None and meta["flagged"] == 1
    pool = np.asarray(store.load_array(job.array))
    plan = plan_batches(store, cfg, mined=pool)
    assert plan.hard.shape[1] == 1
    for q, h in zip(plan.query_rows, plan.hard[:, 0], strict=True):
        assert h == -1 or h in set(pool[q][pool[q] >= 0].tolist())
    drawn = plan.hard[plan.query_rows == rows[0], 0]
    assert first[0] not in drawn and (drawn >= 0).all()
    # without the denoising the raw pool's first negative is drawn for that query
    raw = plan_batches(store, cfg, mined=mined[:, :3])
    assert first[0] in raw.hard[raw.query_rows == rows[0], 0]


@pytest.mark.parametrize(
    ("data", "match"),
    [
        ({"denoise": {"scorer": "ce:/x"}}, "denoise needs hard_negatives: mined"),
        (
            {"hard_negatives": "mined", "n_hard": 0, "denoise": {"scorer": "ce:/x"}},
            "denoise needs hard_negatives: mined and n_hard >= 1",
        ),
        ({"hard_negatives": "mined", "denoise": {"scorer": "x"}}, "expected ce:<cross-encoder"),
        ({"hard_negatives": "mined", "denoise": {"scorer": "ce:/x", "top": 3}}, "top"),
    ],
)
def test_a_finetune_refuses_a_bad_denoise_section(data: dict[str, Any], match: str) -> None:
    from treerank.training.finetune_config import parse_finetune_config

    with pytest.raises(ConfigError, match=match) as err:
        parse_finetune_config({"family": "biencoder", "data": data}, "ft.yaml")
    assert "ft.yaml.data" in str(err.value)
