"""Training-seed variance: per-query averages over seeds, spread, and the paired test on them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.search.tiny_store import write_tiny_store
from treerank.evaluation.compare import compare_systems
from treerank.evaluation.seeds import seed_average, seed_spread, seed_system_name
from treerank.evaluation.settings import EvaluationSettings
from treerank.metrics.metrics import EvalResult
from treerank.names import file_name

NAN = float("nan")


def _res(vals: list[float]) -> EvalResult:
    v = np.array(vals)
    ev = ~np.isnan(v)
    return EvalResult({"ndcg@10": v}, {"ndcg@10": float(v[ev].mean())}, int(ev.sum()), 1, ev)


def test_seed_average_by_hand() -> None:
    a, b = _res([1.0, 0.5, NAN, 0.0]), _res([0.5, 0.5, NAN, 1.0])
    avg = seed_average([a, b])
    assert np.allclose(avg.per_query["ndcg@10"], [0.75, 0.5, NAN, 0.5], equal_nan=True)
    assert avg.mean["ndcg@10"] == pytest.approx((0.5 + 2 / 3) / 2)  # = mean of the seed means
    with pytest.raises(ValueError, match="leave out different queries"):
        seed_average([a, _res([1.0, NAN, 0.5, 0.0])])


def test_seed_spread_by_hand() -> None:
    res = {"m@seed0": _res([0.6, 0.8]), "m@seed1": _res([0.7, 0.9]), "m@seed2": _res([1.0, 1.0])}
    doc = seed_spread(res, {"m@seed0": 0, "m@seed1": 1, "m@seed2": 2}, ["ndcg@10"])
    assert doc["seeds"] == [0, 1, 2]
    assert doc["per_seed"]["ndcg@10"] == pytest.approx([0.7, 0.8, 1.0])
    assert doc["mean"]["ndcg@10"] == pytest.approx(2.5 / 3)
    assert doc["std"]["ndcg@10"] == pytest.approx(np.std([0.7, 0.8, 1.0], ddof=1))
    assert seed_system_name("linear", 2) == "linear@seed2"


def test_compare_systems_adds_the_seed_averaged_model(tmp_path: Path) -> None:
    store = write_tiny_store(tmp_path / "test")
    group = {"bm25": 0, "rrf:bm25+cosine": 1}  # two "seeds" of one model, as stand-ins
    comp = compare_systems(
        store,
        ["cosine", "bm25", "rrf:bm25+cosine"],
        settings=EvaluationSettings(
            baseline="cosine", k=8, metrics=["ndcg@10", "mrr@10"], n_permutations=200
        ),
        seed_groups={"fused": group},
        out_dir=tmp_path / "out",
    )
    a, b = comp.results["bm25"], comp.results["rrf:bm25+cosine"]
    avg = comp.results["fused"]
    assert np.allclose(
        avg.per_query["ndcg@10"], (a.per_query["ndcg@10"] + b.per_query["ndcg@10"]) / 2
    )
    t = comp.tests["cosine"]["fused"]["ndcg@10"]
    ta, tb = (
        comp.tests["cosine"]["bm25"]["ndcg@10"],
        comp.tests["cosine"]["rrf:bm25+cosine"]["ndcg@10"],
    )
    assert t.delta == pytest.approx((ta.delta + tb.delta) / 2)
    assert "fused" not in comp.mcnemar["cosine"] and "fused" not in comp.runs
    spread = comp.to_dict()["seed_spread"]["fused"]
    assert spread["per_seed"]["ndcg@10"] == pytest.approx([a.mean["ndcg@10"], b.mean["ndcg@10"]])
    assert sorted(p.name for p in (tmp_path / "out" / "runs").iterdir()) == [
        "bm25.trec",
        "cosine.trec",
        f"{file_name('rrf:bm25+cosine')}.trec",
    ]
