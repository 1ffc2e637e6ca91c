"""docs/cross_encoder.md reports the numbers of every docs/results/cross_encoder_*.json (a rerun
that changes a JSON must change the page)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
RESULTS = sorted((REPO / "docs" / "results").glob("cross_encoder_*.json"))


def _quoted(doc: dict[str, Any]) -> list[str]:
    """The numbers the page must show for one results file."""
    paired = doc.get("paired_vs_bm25") or doc["paired_vs_first_stage"]
    out = [f"{means['ndcg@10']:.4f}" for means in doc["systems"].values()]
    t = paired["ndcg@10"]
    out += [f"{t[k]:+.4f}" for k in ("delta", "ci_low", "ci_high")]
    out += [f"{t['p_randomization']:.4f}"]
    if "training" in doc:  # the SQuAD run: what training and reranking cost
        out += [f"{doc['training']['steps']:,}"]
        out += [f"{doc['training']['cost_command']['cpu_seconds']:,.0f}"]
        out += [f"{doc['rerank']['cost_command']['cpu_seconds']:,.0f}"]
    else:
        out += [f"{doc['cost_command']['cpu_seconds']:,.0f}", f"{doc['n_queries']:,}"]
    return out


@pytest.mark.parametrize("path", RESULTS, ids=[p.stem for p in RESULTS])
def test_cross_encoder_page_quotes_the_result_json(path: Path) -> None:
    doc = json.loads(path.read_text(encoding="utf-8"))
    text = (REPO / "docs" / "cross_encoder.md").read_text(encoding="utf-8")
    missing = [q for q in _quoted(doc) if q not in text]
    assert not missing, f"docs/cross_encoder.md lacks {missing} from {path.name}"


AUDITS = sorted((REPO / "docs" / "results").glob("denoise_audit_*.json"))


@pytest.mark.parametrize("path", AUDITS, ids=[p.stem for p in AUDITS])
def test_cross_encoder_page_quotes_the_denoise_audit(path: Path) -> None:
    doc = json.loads(path.read_text(encoding="utf-8"))["denoise"][0]
    text = (REPO / "docs" / "cross_encoder.md").read_text(encoding="utf-8")
    quoted = [f"{doc['negatives']:,}", f"| {doc['flagged']} |", f"{doc['share']:.4f}"]
    quoted += [f"| {doc['queries_with_flag']} |", f"| {doc['labelled_flagged']} |"]
    missing = [q for q in quoted if q not in text]
    assert not missing, f"docs/cross_encoder.md lacks {missing} from {path.name}"


DISTILL = REPO / "docs" / "results" / "distill_squad.json"


@pytest.mark.skipif(not DISTILL.is_file(), reason="no distillation result yet")
def test_cross_encoder_page_quotes_the_distillation_tables() -> None:
    """The page holds the tables ``scripts/experiments/distill_squad_report.py`` renders from
    docs/results/distill_squad.json, line for line."""
    from tests.bench_module import missing_table_lines

    missing = missing_table_lines(
        "distill_squad_report", DISTILL, REPO / "docs" / "cross_encoder.md"
    )
    assert not missing, f"docs/cross_encoder.md lacks {missing} from {DISTILL.name}"
