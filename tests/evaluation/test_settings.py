"""EvaluationSettings and resolve_evaluation: the decisions behind `treerank evaluate`."""

from __future__ import annotations

import dataclasses

import pytest

from tests.search.tiny_store import write_tiny_store
from treerank.evaluation.compare import compare_systems
from treerank.evaluation.settings import EvaluationSettings, resolve_evaluation
from treerank.metrics.metrics import DEFAULT_METRICS, headline_metric
from treerank.storelike import StoreLike


def test_every_setting_carries_its_help() -> None:
    for f in dataclasses.fields(EvaluationSettings):
        assert f.metadata.get("help"), f.name


def test_with_applies_known_settings_and_names_unknown_ones() -> None:
    s = EvaluationSettings().with_(k=50, metrics=["mrr@10"])
    assert (s.k, s.metrics) == (50, ("mrr@10",))
    assert EvaluationSettings(second_baseline="bm25").baselines == ("cosine", "bm25")
    with pytest.raises(TypeError, match="unknown evaluation setting.*kk; known: .*k,"):
        EvaluationSettings().with_(kk=3)


def test_resolve_inserts_baselines_and_drops_deep_default_metrics(tmp_path) -> None:
    s = EvaluationSettings(baseline="cosine", second_baseline="bm25", k=200)
    plan = resolve_evaluation(
        tmp_path / "test", ["rrf:bm25+cosine"], s, n_passages=5000, metrics_given=False
    )
    assert plan.systems == ("cosine", "bm25", "rrf:bm25+cosine")
    assert plan.dropped_metrics == ("recall@1000",)
    assert plan.settings.metrics == ("mrr@10", "ndcg@10", "recall@100")
    # a run that ranks every passage serves every cutoff
    all_ranked = resolve_evaluation(tmp_path / "t", [], s, n_passages=100, metrics_given=False)
    assert all_ranked.settings.metrics == DEFAULT_METRICS and all_ranked.dropped_metrics == ()
    # given metrics are kept (compare_systems refuses a cutoff deeper than k)
    kept = resolve_evaluation(
        tmp_path / "t", ["cosine"], s.with_(metrics=["recall@1000"]), n_passages=5000
    )
    assert kept.settings.metrics == ("recall@1000",) and kept.systems == ("bm25", "cosine")
    with pytest.raises(ValueError, match="below the cutoff of every default metric"):
        resolve_evaluation(tmp_path / "t", [], s.with_(k=5), n_passages=5000, metrics_given=False)


def test_resolve_finds_the_sibling_train_split(tmp_path) -> None:
    write_tiny_store(tmp_path / "root" / "test")
    s = EvaluationSettings()
    assert resolve_evaluation(tmp_path / "root" / "test", [], s, n_passages=8).train_dir is None
    write_tiny_store(tmp_path / "root" / "train")
    plan = resolve_evaluation(tmp_path / "root" / "test", [], s, n_passages=8)
    assert plan.train_dir == tmp_path / "root" / "train"
    off = resolve_evaluation(tmp_path / "root" / "test", [], s, n_passages=8, overlap=False)
    assert off.train_dir is None
    given = resolve_evaluation(tmp_path / "root" / "test", [], s, n_passages=8, train_store="x")
    assert str(given.train_dir) == "x"


def test_compare_takes_the_settings_record_and_derives_the_rest(tmp_path) -> None:
    store = write_tiny_store(tmp_path / "test")
    assert isinstance(store, StoreLike)
    s = EvaluationSettings(k=8, metrics=("mrr@10", "recall@5"), n_permutations=20)
    comp = compare_systems(store, ["cosine", "bm25"], settings=s)
    same = compare_systems(
        store,
        ["cosine", "bm25"],
        settings=EvaluationSettings(
            baseline="cosine", k=8, metrics=("mrr@10", "recall@5"), n_permutations=20
        ),
    )
    assert comp.to_dict()["systems"].keys() == same.to_dict()["systems"].keys()
    for name in ("cosine", "bm25"):
        assert comp.results[name].mean == same.results[name].mean
    assert comp.metrics == ("mrr@10", "recall@5") and comp.baseline == "cosine"
    assert comp.evaluation.k == 8
    # the recall curve is read off the results, at the cutoffs up to k
    assert comp.recall_curves["bm25"] == {
        c: comp.results["bm25"].mean[f"recall@{c}"] for c in (1, 2, 5)
    }
    with pytest.raises(TypeError, match="unknown evaluation setting"):
        s.with_(n_permutation=3)
    with pytest.raises(TypeError, match="baseline"):  # the baseline is given one way only
        compare_systems(store, ["cosine"], baseline="cosine")  # type: ignore[call-arg]
    with pytest.raises(TypeError):  # no single settings by name: no **overrides
        compare_systems(store, ["cosine"], "cosine")  # type: ignore[misc]


def test_headline_metric_is_ndcg_at_10_when_evaluated() -> None:
    assert headline_metric(["mrr@10", "ndcg@10"]) == "ndcg@10"
    assert headline_metric(("recall@100", "mrr@10")) == "recall@100"
    with pytest.raises(ValueError):
        headline_metric([])
