"""run_diagnostics end to end on the real SciFact test store (cached fixture)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from treerank.diagnostics.procedure import decision_rules, paired_bootstrap, run_diagnostics
from treerank.diagnostics.settings import DiagnosticsSettings
from treerank.kernels.topk import exact_search
from treerank.metrics.metrics import evaluate_run
from treerank.metrics.qrels import Qrels
from treerank.models.checkpoint import save_checkpoint
from treerank.models.drt import DRTConfig, DRTHead


@pytest.fixture(scope="module")
def scifact_test(scifact_store):
    return scifact_store["test"]


def _drt_ckpt(store, path, k: int = 3):
    torch.manual_seed(0)
    head = DRTHead(DRTConfig(dim=store.dim, k=k, slot_dim=16, hidden=64, attn_hidden=16))
    save_checkpoint(path, head.to_checkpoint(store.encoder_name, store.encoder_fingerprint))
    return head


def test_drt_diagnostics_end_to_end(scifact_test, tmp_path) -> None:
    store = scifact_test
    head = _drt_ckpt(store, tmp_path / "ckpt")
    res = run_diagnostics(
        tmp_path / "ckpt",
        store,
        tmp_path / "diag",
        settings=DiagnosticsSettings(
            baseline="cosine", k=100, metrics=("mrr@10", "ndcg@10", "recall@100")
        ),
    )

    # every step wrote its JSON (strict JSON: no NaN tokens) and the report links the plots
    for f in ("variants.json", "probes.json", "failures.json", "cka.json", "diagnostics.json"):
        json.loads((tmp_path / "diag" / f).read_text(), parse_constant=lambda c: pytest.fail(c))
    report = (tmp_path / "diag" / "report.md").read_text()
    for png in ("variants.png", "probes.png", "failures.png", "cka.png"):
        assert (tmp_path / "diag" / png).is_file() and png in report
    assert "Decision rules" in report and "concat-cosine == full DRT" in report

    # the learned variant is the model searched as a plain DenseScorer
    qrels = Qrels.from_store(store)
    q = head.encode_queries(np.asarray(store.queries))
    ids, _ = exact_search(q, store.passages, k=100, passage_transform=head.encode_passages)
    direct = evaluate_run(ids, qrels, metrics=("ndcg@10",)).mean["ndcg@10"]
    var = res["variants"]["variants"]
    assert var["learned"]["mean"]["ndcg@10"] == pytest.approx(direct, abs=1e-9)
    # uniform alpha and concat-cosine are the same scorer
    assert var["uniform"]["mean"]["ndcg@10"] == pytest.approx(
        var["concat-cosine"]["mean"]["ndcg@10"], abs=1e-9
    )
    assert set(var) == {
        "learned",
        "uniform",
        "concat-cosine",
        "concat-raw-cosine",
        "top2",
        "slot-0",
        "slot-1",
        "slot-2",
    }

    # the baseline is cosine of the frozen vectors
    cos_ids, _ = exact_search(store.queries, store.passages, k=100)
    cos = evaluate_run(cos_ids, qrels, metrics=("ndcg@10",)).mean["ndcg@10"]
    assert res["baseline"]["mean"]["ndcg@10"] == pytest.approx(cos, abs=1e-12)

    # probes cover every slot, the concatenation and the frozen vectors, for three tasks
    reps = {r["representation"] for r in res["probes"]["results"]}
    assert {"slot-0", "slot-1", "slot-2", "concat", "alpha", "drt", "frozen"} <= reps
    assert set(res["probes"]["labels"]) == {"query_type", "entity", "length"}
    assert res["cka"]["vs_frozen"]["drt"] == pytest.approx(res["cka"]["model_vs_frozen"])
    s = res["failures"]["summary"]
    assert s["wins"] + s["losses"] + s["ties"] == s["n_evaluated"] == 300
    assert len(res["rules"]) == 4


def test_generic_dense_checkpoint_identity_head_equals_cosine(
    scifact_store, scifact_test, tmp_path
) -> None:
    """Steps 2-4 on a non-DRT model: a linear head at identity init IS cosine, so every query
    ties, the paired delta is exactly 0 and its CKA against the frozen embeddings is 1 (on the
    test queries plus the train split's, given as a probe store)."""
    from treerank.models.linear import LinearHead

    store = scifact_test
    head = LinearHead(store.dim)
    save_checkpoint(
        tmp_path / "lin", head.to_checkpoint(store.encoder_name, store.encoder_fingerprint)
    )
    res = run_diagnostics(
        tmp_path / "lin",
        store,
        tmp_path / "d",
        settings=DiagnosticsSettings(
            baseline="cosine",
            k=100,
            metric="ndcg@10",
            metrics=("ndcg@10",),
            plots=False,
            probe_seed=7,
        ),
        probe_stores=[scifact_store["train"]],
    )
    # the report names the probe seed actually used, not the default's 42
    assert res["meta"]["probe_seed"] == 7
    assert "70/30 stratified split, seed 7)" in (tmp_path / "d" / "report.md").read_text()
    assert res["variants"] is None
    assert sum(res["probes"]["queries"].values()) == 300 + 809
    assert sum(res["probes"]["labels"]["length"].values()) == 1109
    assert res["probes"]["results"][0]["n_test"] == 333  # ceil(0.3 * 1109)
    assert res["failures"]["summary"]["ties"] == 300 and res["model"]["vs_baseline"]["delta"] == 0.0
    assert res["cka"]["model_vs_frozen"] == pytest.approx(1.0, abs=1e-6)
    assert [r["rule"].startswith("high CKA") for r in res["rules"]] == [True]


def test_paired_bootstrap_and_rules() -> None:
    a = np.array([1.0, 0.0, 0.5, np.nan])
    p = paired_bootstrap(a, a)
    assert p["delta"] == 0.0 and p["ci_low"] == 0.0 == p["ci_high"] and p["n"] == 3
    b = np.zeros(200)
    p = paired_bootstrap(b + 0.1, b)
    assert p["delta"] == pytest.approx(0.1) and p["ci_low"] == pytest.approx(0.1)
    pair = {"mean_a": 0.5, "n": 10}
    results = {
        "variants": {
            "paired": {
                "concat-cosine": {
                    **pair,
                    "mean_b": 0.4,
                    "delta": 0.1,
                    "ci_low": 0.05,
                    "ci_high": 0.15,
                },
                "uniform": {
                    **pair,
                    "mean_b": 0.49,
                    "delta": 0.01,
                    "ci_low": -0.02,
                    "ci_high": 0.03,
                },
            }
        },
        "probes": {
            "specialisation": {
                "t": {
                    "min": 0.5,
                    "max": 0.505,
                    "spread": 0.005,
                    "best_slot": "slot-0",
                    "majority": 0.5,
                    "noise_band": 0.1,
                    "n_test": 90,
                    "verdict": "none",
                    "specialised": False,
                }
            }
        },
        "cka": {"model_vs_frozen": 0.3},
    }
    rules = decision_rules(results, metric="ndcg@10")
    assert [r["holds"] for r in rules] == [False, True, True, False]
    assert "carries signal" in rules[0]["conclusion"]
    assert "learned nothing" in rules[1]["conclusion"]
    assert "no slot specialises" in rules[2]["conclusion"]
    assert "re-shaped" in rules[3]["conclusion"]
    # a tiny but "significant" difference is practically equal (within the 0.01 margin)
    results["variants"]["paired"]["uniform"].update(delta=-0.004, ci_low=-0.007, ci_high=-0.001)
    results["probes"]["specialisation"]["t"].update(spread=0.05, verdict="inconclusive")
    rules = decision_rules(results, metric="ndcg@10")
    assert rules[1]["holds"] and "practically equal" in rules[1]["conclusion"]
    assert not rules[2]["holds"] and "inconclusive" in rules[2]["conclusion"]
    results["probes"]["specialisation"]["t"].update(verdict="undetectable")
    assert "noise band on t" in decision_rules(results, metric="ndcg@10")[2]["conclusion"]
    assert not decision_rules(results, metric="ndcg@10", equal_margin=0.001)[1]["holds"]


def test_plot_titles_name_the_dataset_and_split() -> None:
    from treerank.diagnostics.report import _where

    assert _where({"meta": {"store": "runs/sample/stores/scifact/test", "split": "test"}}) == (
        "scifact/test: "
    )
    assert _where({"meta": {}}) == ""
