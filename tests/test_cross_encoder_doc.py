"""docs/cross_encoder.md reports the numbers of every docs/results/cross_encoder_*.json (a rerun
that changes a JSON must change the page)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
RESULTS = sorted((REPO / "docs" / "results").glob("cross_encoder_*.json"))


@pytest.mark.parametrize("path", RESULTS, ids=[p.stem for p in RESULTS])
def test_cross_encoder_page_quotes_the_result_json(path: Path) -> None:
    doc = json.loads(path.read_text(encoding="utf-8"))
    text = (REPO / "docs" / "cross_encoder.md").read_text(encoding="utf-8")
    quoted = [f"{doc['first_stage_recall@20']:.4f}", f"{doc['training']['steps']:,}"]
    for means in doc["systems"].values():
        quoted.append(f"{means['ndcg@10']:.4f}")
    for metric, test in doc["paired_vs_bm25"].items():
        quoted += [f"{test['delta']:+.4f}", f"{test['p_randomization']:.4f}"]
        assert metric in text
    missing = [q for q in quoted if q not in text]
    assert not missing, f"docs/cross_encoder.md lacks {missing} from {path.name}"
