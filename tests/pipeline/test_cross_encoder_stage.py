"""``treerank run`` with a ``family: cross-encoder`` entry of ``finetune:`` on the bundled
30-passage BEIR sample (``data/samples/mybeir``, embedded once): the cross-encoder trains in its
own stage directory (BM25 negatives from the mine stage), no split is embedded again, the
evaluation scores the pinned reranker ``<name>``, a second run re-uses every stage, and the
user's store (read-only) is left as it was."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import SAMPLES, cached_store
from tests.pipeline.test_read_only_store import _read_only, _snapshot, _writable
from treerank.config import ConfigError
from treerank.pipeline.config import load_experiment
from treerank.pipeline.experiment import plan_experiment, run_experiment

CE_CONFIG: dict[str, Any] = {
    "family": "cross-encoder",
    "seed": 0,
    "model": {"max_length": 64},
    "data": {"batch_size": 2, "n_hard": 2, "mine_depth": 10},
    "trainer": {"loss": "listwise", "lr": 5.0e-5, "max_steps": 2, "save_steps": 0},
    "validation": {"fraction": 0.0},
}
CE, MINE = "finetune:my:ce", "mine:my:bm25_negatives-10-always"


@pytest.fixture(scope="module")
def mybeir(encoder: Any) -> Path:
    """Store root of ``data/samples/mybeir`` (``train`` and ``test``), embedded once with the
    default encoder and cached under ``.cache/test-stores``."""
    from treerank.readers import read_split

    def load() -> list[Any]:
        return [read_split(SAMPLES / "mybeir", "beir", s) for s in ("train", "test")]

    stores = cached_store("mybeir", load, encoder)
    return Path(stores["train"].path).parent  # type: ignore[attr-defined]


def _write(tmp: Path, store: Path, rerank: dict[str, Any] | None = None, **extra: Any) -> Path:
    entry = {**CE_CONFIG, **extra, **({"rerank": rerank} if rerank is not None else {})}
    raw = {
        "name": "ce",
        "datasets": [{"name": "my", "store": str(store), "train_split": "train",
                      "eval_split": "test"}],
        "systems": ["bm25"],
        "evaluate": {"k": 10, "baselines": ["bm25"], "metrics": ["ndcg@10"], "seed": 0},
        "diagnose": {"model": None},
        "models": {},
        "finetune": {"ce": entry},
    }  # fmt: skip
    p = tmp / "exp.yaml"
    p.write_text(yaml.safe_dump(raw, sort_keys=False), encoding="utf-8")
    return p


def test_a_cross_encoder_entry_trains_reranks_and_reuses_every_stage(
    mybeir: Path, tmp_path: Path
) -> None:
    store = tmp_path / "store"
    shutil.copytree(mybeir, store, ignore=shutil.ignore_patterns("arrays", "pseudo*", ".lock"))
    _read_only(store)
    before = _snapshot(store)
    out = tmp_path / "out"
    rerank = {"first_stage": "bm25", "depth": 8, "batch": 4}
    try:
        cfg = load_experiment(_write(tmp_path, store, rerank), output_dir=out)
        graph = plan_experiment(cfg)
        edges = graph.edges()
        assert edges[CE] == ["embed:my:train", MINE]
        assert CE in edges["evaluate:my"]
        assert not [n for n in edges if n.startswith("reembed:")]  # a cross-encoder embeds nothing
        res = run_experiment(cfg, progress=False, log=lambda s: None)
        status = {r.name: r.status for r in res.stages}
        assert status[CE] == status[MINE] == status["evaluate:my"] == "ran"
        ce_dir = out / "finetune" / "my" / "ce"
        summary = json.loads((ce_dir / "stage.json").read_text(encoding="utf-8"))["summary"]
        assert (ce_dir / "model" / "config.json").is_file()
        comp = res.datasets["my"].comparison
        assert set(comp["systems"]) == {"bm25", "ce"}
        [rec] = comp["cross_encoders"]["ce"]
        assert rec["path"] == str((ce_dir / "model").resolve())
        assert rec["fingerprint"] == rec["pinned"] == summary["fingerprint"]
        model = ce_dir / "model"
        want = f"rescore:bm25:depth=8,scorer=ce:{model},batch=4,fingerprint={rec['pinned']}"
        assert rec["system"] == want
        # the reranked run: BM25's top 8 per query, reordered (the run file of system ce)
        assert comp["systems"]["ce"]["n_evaluated"] == comp["systems"]["bm25"]["n_evaluated"]
        assert _snapshot(store) == before  # mining and training wrote nothing into the store
        # a second run re-uses every stage: nothing is trained again
        again = run_experiment(
            load_experiment(_write(tmp_path, store, rerank), output_dir=out),
            progress=False,
            log=lambda s: None,
        )
        assert {r.status for r in again.stages if r.skipped is None} == {"reused"}
        # another depth re-keys the evaluation only, never the training
        keys = plan_experiment(cfg).names()
        deeper = load_experiment(_write(tmp_path, store, {"depth": 5}), output_dir=out)
        changed = plan_experiment(deeper).names()
        assert {n for n in keys if keys[n] != changed[n]} == {"evaluate:my"}
        for other in ({**rerank, "batch": 8}, {**rerank, "precision": "bf16"}):  # and so do these
            moved = plan_experiment(load_experiment(_write(tmp_path, store, other), output_dir=out))
            assert {n for n in keys if keys[n] != moved.names()[n]} == {"evaluate:my"}
        assert _snapshot(store) == before
    finally:
        _writable(store)


@pytest.mark.parametrize(
    ("rerank", "extra", "match"),
    [
        ({"first": "bm25"}, {}, r"finetune\.ce\.rerank: unknown key\(s\) first"),
        ({"depth": 0}, {}, r"finetune\.ce\.rerank: depth and batch must be >= 1"),
        ({"first_stage": "bm52"}, {}, r"finetune\.ce\.rerank: .*unknown system kind 'bm52'"),
        ({"depth": "ten"}, {}, r"finetune\.ce\.rerank\.depth: expected an integer"),
        ({"batch": 0}, {}, r"finetune\.ce\.rerank: depth and batch must be >= 1"),
        ({"precision": "fp16"}, {}, r"finetune\.ce\.rerank: precision 'fp16': expected one of"),
    ],
)
def test_bad_rerank_keys_are_refused_naming_the_key(
    tmp_path: Path, rerank: dict[str, Any], extra: dict[str, Any], match: str
) -> None:
    (tmp_path / "store").mkdir()  # refused while the config loads: the store is never read
    with pytest.raises(ConfigError, match=match):
        load_experiment(_write(tmp_path, tmp_path / "store", rerank, **extra))


def test_rerank_is_refused_on_an_encoder_fine_tune(tmp_path: Path) -> None:
    (tmp_path / "store").mkdir()
    raw = yaml.safe_load(_write(tmp_path, tmp_path / "store").read_text(encoding="utf-8"))
    raw["finetune"]["ce"] = {
        "family": "query-tower",
        "data": {"batch_size": 8},
        "rerank": {"depth": 10},
    }
    (tmp_path / "exp.yaml").write_text(yaml.safe_dump(raw), encoding="utf-8")
    with pytest.raises(ConfigError, match=r"finetune\.ce\.rerank: applies to family cross-encoder"):
        load_experiment(tmp_path / "exp.yaml")
