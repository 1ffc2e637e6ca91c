"""``treerank search``, ``treerank serve`` and ``treerank evaluate`` reranking with a
cross-encoder pinned by its weights fingerprint (``rescore:bm25:...,scorer=ce:<dir>,
fingerprint=sha256:<hex>``), on the 10-query MS MARCO sample (real texts; a cross-encoder
trained for 3 steps, as ``tests/search/test_ce_rescore.py`` trains one)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

from tests.training.test_cross_encoder import bm25_mined
from treerank.cli.main import app
from treerank.evaluation.compare import compare_systems
from treerank.evaluation.settings import EvaluationSettings
from treerank.search.ce_rescore import CrossEncoderMismatchError
from treerank.serve.service import SearchService, ServiceConfig
from treerank.training.cross_encoder import CrossEncoderConfig, train_cross_encoder

runner = CliRunner()
DEPTH = 8
SCORE_ATOL = 1e-5  # one query's pairs batched alone vs with every query's (padding differs)


@pytest.fixture(scope="module")
def ms(msmarco_store: dict[str, Any]) -> Any:
    return msmarco_store["validation"]


@pytest.fixture(scope="module")
def ce(ms: Any, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """A trained cross-encoder folder and its weights fingerprint (from ``cross_encoder.json``,
    what a user pins)."""
    cfg = CrossEncoderConfig(negatives=2, batch_size=2, max_length=64, max_steps=3, lr=5e-5)
    out = train_cross_encoder(ms, cfg, tmp_path_factory.mktemp("ce") / "run", mined=bm25_mined(ms))
    doc = json.loads((out.model_dir.parent / "cross_encoder.json").read_text(encoding="utf-8"))
    return out.model_dir, str(doc["fingerprint"])


def _spec(ce_dir: Path, pin: str | None = None) -> str:
    tail = f",fingerprint={pin}" if pin else ""
    return f"rescore:bm25:depth={DEPTH},scorer=ce:{ce_dir}{tail}"


def _other(fp: str) -> str:
    """A pin of 12 hex digits that ``fp`` does not start with."""
    return "sha256:" + ("0" if fp[7] != "0" else "1") * 12


def test_search_refuses_a_mismatched_pin_with_exit_2(ms: Any, ce: tuple[Path, str]) -> None:
    ce_dir, fp = ce
    bad = _spec(ce_dir, _other(fp))
    res = runner.invoke(app, ["search", "--store", str(ms.path), "--system", bad, "-q", "x"])
    assert res.exit_code == 2, res.output
    msg = " ".join(res.output.split())
    assert f"error: cross-encoder {ce_dir} has weights fingerprint {fp}" in msg
    assert f"pins fingerprint={_other(fp)}" in msg


def test_search_reranks_like_evaluate_and_records_the_cross_encoder(
    ms: Any, ce: tuple[Path, str], tmp_path: Path
) -> None:
    ce_dir, fp = ce
    pin = fp[: len("sha256:") + 10]
    spec = _spec(ce_dir, pin)
    queries = tmp_path / "queries.tsv"
    queries.write_text(
        "".join(f"{q}\t{t}\n" for q, t in zip(ms.query_ids(), ms.query_texts(), strict=True)),
        encoding="utf-8",
    )
    args = ["search", "--store", str(ms.path), "--system", spec, "--queries", str(queries)]
    res = runner.invoke(app, [*args, "-k", str(DEPTH), "-f", "json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    want = {"system": spec, "path": str(ce_dir.resolve()), "fingerprint": fp, "pinned": pin}
    assert all(q["cross_encoders"] == [want] for q in doc)
    # evaluate's run of the same system: the same passages in the same order, the same scores
    settings = EvaluationSettings(baseline="bm25", k=DEPTH, metrics=("ndcg@5",))
    comp = compare_systems(ms, ["bm25", spec], settings=settings)
    run = comp.runs[spec]
    assert comp.to_dict()["cross_encoders"] == {spec: [want]}
    for row, q in enumerate(doc):
        assert q["query_id"] == ms.query_ids()[row]
        ids = [h["passage_id"] for h in q["hits"]]
        np.testing.assert_array_equal(ids, run.ids[row][run.ids[row] >= 0])
        scores = np.array([h["score"] for h in q["hits"]])
        np.testing.assert_allclose(scores, run.scores[row][: len(ids)], rtol=0, atol=SCORE_ATOL)
    # the table names the cross-encoder under the system line
    table = runner.invoke(app, [*args, "-k", "2"], env={"COLUMNS": "200"})
    assert table.exit_code == 0, table.output
    assert f"cross-encoder: {ce_dir.resolve()} {fp} (pinned {pin})" in table.output


def test_evaluate_refuses_a_mismatched_pin_and_records_a_matching_one(
    ms: Any, ce: tuple[Path, str], tmp_path: Path
) -> None:
    ce_dir, fp = ce
    base = ["evaluate", "--store", str(ms.path), "--system", "bm25", "--k", str(DEPTH)]
    base += ["--metric", "ndcg@5"]
    bad = runner.invoke(
        app, [*base, "--system", _spec(ce_dir, _other(fp)), "-o", str(tmp_path / "a")]
    )
    assert bad.exit_code == 2, bad.output
    assert fp in " ".join(bad.output.split()) and not (tmp_path / "a" / "results.json").exists()
    good = runner.invoke(app, [*base, "--system", _spec(ce_dir), "-o", str(tmp_path / "b")])
    assert good.exit_code == 0, good.output
    doc = json.loads((tmp_path / "b" / "results.json").read_text(encoding="utf-8"))
    [rec] = doc["cross_encoders"][_spec(ce_dir)]
    assert (rec["path"], rec["fingerprint"], rec["pinned"]) == (str(ce_dir.resolve()), fp, None)


def test_serve_refuses_a_mismatched_pin_and_records_a_matching_one(
    ms: Any, ce: tuple[Path, str], encoder: Any
) -> None:
    ce_dir, fp = ce
    with pytest.raises(CrossEncoderMismatchError, match="has weights fingerprint"):
        SearchService(
            ServiceConfig(store=ms.path, systems=("bm25", _spec(ce_dir, _other(fp)))),
            encoder=encoder,
        )
    # `treerank serve` refuses to start (exit 2, before serving), like a mismatched encoder
    args = ["serve", "--store", str(ms.path), "--system", _spec(ce_dir, _other(fp))]
    res = runner.invoke(app, [*args, "--port", "0"])
    assert res.exit_code == 2, res.output
    assert "has weights fingerprint" in res.output and "serving" not in res.output
    spec = _spec(ce_dir, fp)
    service = SearchService(ServiceConfig(store=ms.path, systems=("bm25", spec)), encoder=encoder)
    info = service.info()
    want = {"system": spec, "path": str(ce_dir.resolve()), "fingerprint": fp, "pinned": fp}
    assert info["cross_encoders"] == {spec: [want]}
    hits = service.search([ms.query_texts()[0]], k=DEPTH, system=spec)[0]
    first = [h.passage_id for h in service.search([ms.query_texts()[0]], k=DEPTH, system="bm25")[0]]
    assert sorted(h.passage_id for h in hits) == sorted(first)  # the same candidates, reranked
