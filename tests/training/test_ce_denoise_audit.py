"""Denoising in the false-negative audit (``treerank audit --scorer ce:<dir>``) on the 10-query
MS MARCO sample (real texts): hand-computed flags with stub scorers, a labelled positive never
flagged, and the CLI with a real (two-step) cross-encoder."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

from treerank.cli.main import app
from treerank.diagnostics.false_negatives import audit_miners, denoise_audit
from treerank.search.negatives import drop_labelled
from treerank.search.specs import build_system
from treerank.store import EmbeddingStore


class _Table:
    """Scores by (query text, passage text): ``table`` entries, ``default`` elsewhere."""

    def __init__(self, table: dict[tuple[str, str], float], default: float) -> None:
        self.table, self.default, self.calls = table, default, 0

    def score_pairs(self, queries: list[str], passages: list[str]) -> np.ndarray:
        self.calls += len(queries)
        return np.array(
            [self.table.get((q, p), self.default) for q, p in zip(queries, passages, strict=True)],
            np.float32,
        )


@pytest.fixture(scope="module")
def ms(msmarco_store: dict[str, Any]) -> Any:
    return msmarco_store["validation"]


def _labelled_rows(st: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    cand, lab = np.asarray(st.candidates), np.asarray(st.labels)
    rows = np.flatnonzero(((cand >= 0) & (lab >= int(st.relevance_threshold))).any(axis=1))
    return rows, cand, lab


def test_denoise_flags_by_hand_and_counts_every_scored_pair(ms: Any) -> None:
    rows, cand, lab = _labelled_rows(ms)
    run = build_system("bm25").retrieve(ms, k=20)
    ranked = run.ids[rows]
    mined = drop_labelled(ranked, cand[rows], lab[rows])
    first = [row[row >= 0][:3] for row in mined]  # the 3 negatives scored per query
    qt, pt = ms.query_texts(), ms.passage_texts()
    # positives score 10; query rows[0]'s second negative 9.6 (within 5 % of 10: flagged),
    # query rows[1]'s first negative 9.4 (outside: kept), everything else -5
    table = {
        (qt[r], pt[p]): 10.0
        for r in rows
        for p, g in zip(cand[r], lab[r], strict=True)
        if p >= 0 and g >= 1
    }
    table[(qt[rows[0]], pt[first[0][1]])] = 9.6
    table[(qt[rows[1]], pt[first[1][0]])] = 9.4
    scorer = _Table(table, -5.0)
    rec = denoise_audit(ms, rows, ranked, scorer, depth=3, relative_margin=0.05)
    n_neg = sum(len(f) for f in first)
    n_pos = int(((cand[rows] >= 0) & (lab[rows] >= 1)).sum())
    assert rec["negatives"] == n_neg and scorer.calls == rec["scorer_pairs"] == n_neg + n_pos
    assert (rec["flagged"], rec["queries_with_flag"], rec["labelled_flagged"]) == (1, 1, 0)
    assert rec["share"] == pytest.approx(1 / n_neg, abs=1e-6)
    (ex,) = rec["examples"]
    assert ex["query_id"] == ms.query_ids()[rows[0]]
    assert ex["passage_id"] == ms.passage_ids()[first[0][1]]
    assert (ex["score"], ex["positive_score"]) == (pytest.approx(9.6, abs=1e-5), 10.0)
    assert ex["passage"] == pt[first[0][1]][:300] and ex["query"] == qt[rows[0]]
    # an absolute threshold instead: 9.4 and 9.6 both pass 9.0
    rec = denoise_audit(ms, rows, ranked, scorer, depth=3, threshold=9.0, relative_margin=None)
    assert rec["flagged"] == 2 and "score >= 9.0" in rec["rule"]


def test_denoising_never_flags_a_labelled_positive(ms: Any) -> None:
    rows, cand, lab = _labelled_rows(ms)
    # every pair scores far above any threshold, and the raw ranking holds the positives
    run = build_system("bm25").retrieve(ms, k=20)
    labelled = {(int(r), int(p)) for r in rows for p in cand[r][lab[r] > 0]}
    assert any((int(r), int(p)) in labelled for r in rows for p in run.ids[r])
    res = audit_miners(
        ms, ["bm25"], depth=20, scorer=_Table({}, 100.0), denoise_depth=20, threshold=0.0
    )
    (rec,) = res.denoise
    assert rec["flagged"] == rec["negatives"] > 0  # every negative flagged ...
    assert rec["labelled_flagged"] == 0  # ... and no labelled passage among them
    qids, pids = ms.query_ids(), ms.passage_ids()
    for e in audit_miners(
        ms, ["bm25"], depth=20, scorer=_Table({}, 100.0), threshold=0.0, n_examples=1000
    ).denoise[0]["examples"]:
        r, p = qids.index(e["query_id"]), pids.index(e["passage_id"])
        assert (r, p) not in labelled
    with pytest.raises(ValueError, match="threshold, a relative margin"):
        audit_miners(ms, ["bm25"], scorer=_Table({}, 0.0), relative_margin=None)
    with pytest.raises(ValueError, match="expected ce:<cross-encoder dir>"):
        audit_miners(ms, ["bm25"], scorer="bm25")


@pytest.fixture(scope="module")
def ce_dir(ms: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from treerank.search.negatives import mine_bm25_negatives
    from treerank.training.cross_encoder import CrossEncoderConfig, train_cross_encoder

    copy = tmp_path_factory.mktemp("den") / "validation"
    shutil.copytree(Path(ms.path), copy)
    st = EmbeddingStore.open(copy)
    cfg = CrossEncoderConfig(negatives=2, batch_size=2, max_length=64, max_steps=2, lr=5e-5)
    out = tmp_path_factory.mktemp("den-run") / "run"
    return train_cross_encoder(st, cfg, out, mined=mine_bm25_negatives(st, 10)).model_dir


def test_audit_cli_reports_denoising_with_a_cross_encoder(
    ms: Any, ce_dir: Path, tmp_path: Path
) -> None:
    args = ["audit", "--store", str(ms.path), "--miner", "bm25", "--depth", "10"]
    res = CliRunner().invoke(
        app,
        [*args, "--scorer", f"ce:{ce_dir}", "--denoise-depth", "3", "-o", str(tmp_path / "a")],
    )
    assert res.exit_code == 0, res.output
    doc = json.loads((tmp_path / "a" / "results.json").read_text(encoding="utf-8"))
    (rec,) = doc["denoise"]
    assert rec["miner"] == "bm25" and rec["scorer"] == f"ce:{ce_dir}"
    assert rec["negatives"] == 15 and rec["labelled_flagged"] == 0  # 5 labelled queries x 3
    assert rec["relative_margin"] == 0.05 and 0 <= rec["flagged"] <= rec["negatives"]
    assert "Denoising" in (tmp_path / "a" / "table.md").read_text(encoding="utf-8")
    assert "negatives scored" in res.output
    # a threshold below every logit flags them all; still no labelled passage
    low = CliRunner().invoke(
        app,
        [*args, "--scorer", f"ce:{ce_dir}", "--denoise-depth", "3", "--denoise-threshold",
         "-1000", "--denoise-margin", "-1", "-o", str(tmp_path / "b")],
    )  # fmt: skip
    assert low.exit_code == 0, low.output
    rec = json.loads((tmp_path / "b" / "results.json").read_text(encoding="utf-8"))["denoise"][0]
    assert rec["flagged"] == rec["negatives"] == 15 and rec["relative_margin"] is None


def test_audit_cli_bad_scorer_exits_2_before_ranking(ms: Any, tmp_path: Path) -> None:
    for scorer, match in ((f"ce:{tmp_path / 'none'}", "no cross-encoder folder"), ("bm25", "ce:")):
        res = CliRunner().invoke(
            app,
            ["audit", "--store", str(ms.path), "--scorer", scorer, "-o", str(tmp_path / "o")],
        )
        assert res.exit_code == 2 and match in res.output
        assert not (tmp_path / "o").exists()
