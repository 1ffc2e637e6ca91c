"""``treerank run`` with a head whose ``data.denoise`` names a cross-encoder, on the bundled
30-passage BEIR sample (``data/samples/mybeir``): a ``denoise:`` stage between the mine stage
and the training, its array in its own directory, the training reading it, a second run
re-using every stage, other cross-encoder bytes re-keying it, and the user's store left as it
was."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import yaml

from tests.pipeline.test_cross_encoder_stage import mybeir  # noqa: F401 (fixture)
from tests.pipeline.test_read_only_store import _read_only, _snapshot, _writable
from treerank.pipeline.config import load_experiment
from treerank.pipeline.experiment import plan_experiment, run_experiment
from treerank.store import EmbeddingStore

MINE = "mine:my:bm25_negatives-10-always"


@pytest.fixture(scope="module")
def ce_dir(mybeir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:  # noqa: F811
    """A two-step cross-encoder trained on a copy of the sample's train split."""
    from treerank.search.negatives import mine_bm25_negatives
    from treerank.training.cross_encoder import CrossEncoderConfig, train_cross_encoder

    copy = tmp_path_factory.mktemp("dn") / "train"
    shutil.copytree(mybeir / "train", copy, ignore=shutil.ignore_patterns("arrays", ".lock"))
    st = EmbeddingStore.open(copy)
    cfg = CrossEncoderConfig(negatives=2, batch_size=2, max_length=64, max_steps=2, lr=5e-5)
    out = tmp_path_factory.mktemp("dn-run") / "run"
    return train_cross_encoder(st, cfg, out, mined=mine_bm25_negatives(st, 10)).model_dir


def _data(ce: Path) -> dict[str, object]:
    """A linear head's data section: one BM25 negative of the first 3, denoised by ``ce``."""
    return {"batch_size": 4, "n_hard": 1, "hard_negatives": "mined", "mine_depth": 10,
            "guard_skip_top": 0, "denoise": {"scorer": f"ce:{ce}", "depth": 3}}  # fmt: skip


def _copy_store(sample: Path, tmp: Path) -> Path:
    """A fresh copy of the sample's store root (no sidecars, pseudo splits or locks)."""
    store = tmp / "store"
    shutil.copytree(sample, store, ignore=shutil.ignore_patterns("arrays", "pseudo*", ".lock"))
    return store


def _write(tmp: Path, store: Path, ce: Path) -> Path:
    data = _data(ce)
    raw = {
        "name": "dn",
        "datasets": [{"name": "my", "store": str(store), "train_split": "train",
                      "eval_split": "test"}],
        "systems": ["cosine"],
        "evaluate": {"k": 10, "baselines": ["cosine"], "metrics": ["ndcg@10"], "seed": 0},
        "diagnose": {"model": None},
        "models": {"lin": {"family": "linear", "seed": 0, "data": data,
                           "trainer": {"epochs": 1, "max_steps": 2, "threads": 1},
                           "validation": {"fraction": 0.0}}},
    }  # fmt: skip
    p = tmp / "exp.yaml"
    p.write_text(yaml.safe_dump(raw, sort_keys=False), encoding="utf-8")
    return p


def test_a_denoise_stage_sits_between_mining_and_training(
    mybeir: Path,  # noqa: F811
    ce_dir: Path,
    tmp_path: Path,
) -> None:
    store = _copy_store(mybeir, tmp_path)
    _read_only(store)
    before = _snapshot(store)
    out = tmp_path / "out"
    try:
        cfg = load_experiment(_write(tmp_path, store, ce_dir), output_dir=out)
        edges = plan_experiment(cfg).edges()
        (dn,) = [n for n in edges if n.startswith("denoise:")]
        assert dn.startswith("denoise:my:bm25_negatives-10-always-bm25_negatives-denoised-")
        assert edges[dn] == ["embed:my:train", MINE]
        (train,) = [n for n in edges if n.startswith("train:")]
        assert edges[train] == ["embed:my:train", MINE, dn]
        res = run_experiment(cfg, progress=False, log=lambda s: None)
        status = {r.name: r.status for r in res.stages}
        assert status[dn] == status[MINE] == status[train] == "ran"
        stage = json.loads(next(out.glob("**/denoise*/**/stage.json")).read_text(encoding="utf-8"))[
            "summary"
        ]
        meta = stage["meta"]
        assert meta["queries"] > 0 and meta["negatives"] == meta["kept"] + meta["flagged"]
        assert meta["cost"]["cpu_seconds"] > 0
        arrays = next(out.glob("**/denoise*/**/arrays"))
        arr = np.load(arrays / f"{stage['array']}.npy")
        assert arr.shape[1] == 3
        # the training read the denoised array: its summary names it and holds its counts
        tstage = json.loads(
            (out / "models" / "my" / "lin" / "stage.json").read_text(encoding="utf-8")
        )["summary"]
        summary = tstage["summary"]
        assert summary["sampler"]["denoised_array"] == stage["array"]
        assert summary["denoised_negatives"]["flagged"] == meta["flagged"]
        assert _snapshot(store) == before  # nothing written into the user's store
        again = run_experiment(
            load_experiment(_write(tmp_path, store, ce_dir), output_dir=out),
            progress=False,
            log=lambda s: None,
        )
        assert {r.status for r in again.stages if r.skipped is None} == {"reused"}
        # other cross-encoder bytes at the same path re-key the denoise stage and the
        # training, never the mining
        other = tmp_path / "ce2"
        shutil.copytree(ce_dir, other)
        exp = _write(tmp_path, store, other)
        keys = plan_experiment(load_experiment(exp, output_dir=out)).names()
        (other / "extra.txt").write_text("other bytes", encoding="utf-8")
        moved = plan_experiment(load_experiment(exp, output_dir=out)).names()
        changed = {n for n in keys if keys[n] != moved[n]}
        (dn2,) = [n for n in keys if n.startswith("denoise:")]
        assert {dn2, train} <= changed
        assert not {n for n in changed if n.startswith(("embed:", "mine:"))}
    finally:
        _writable(store)


def test_treerank_train_denoises_into_the_store_and_reports_it(
    mybeir: Path,  # noqa: F811
    ce_dir: Path,
    tmp_path: Path,
) -> None:
    """Standalone ``treerank train``: the mined and the denoised arrays are store sidecars (as
    mining always was), and the summary table has a ``denoised negatives`` row."""
    from typer.testing import CliRunner

    from treerank.cli.main import app

    store = tmp_path / "train"
    shutil.copytree(mybeir / "train", store, ignore=shutil.ignore_patterns("arrays", ".lock"))
    cfg = tmp_path / "lin.yaml"
    data = _data(ce_dir)
    doc = {"seed": 0, "data": data, "trainer": {"max_steps": 2, "epochs": 1, "threads": 1},
           "validation": {"fraction": 0.0}}  # fmt: skip
    cfg.write_text(yaml.safe_dump(doc), encoding="utf-8")
    args = ["train", "-m", "linear", "-c", str(cfg), "-s", str(store), "-o", str(tmp_path / "o")]
    res = CliRunner().invoke(app, [*args, "--no-progress"])
    assert res.exit_code == 0, res.output
    assert "denoised negatives" in res.output and "queries scored" in res.output
    names = sorted(p.name for p in (store / "arrays").glob("*.npy"))
    assert names[0] == "bm25_negatives-denoised-" + names[0].split("-denoised-")[1]
    assert names[1] == "bm25_negatives.npy"
    arr = np.load(store / "arrays" / names[0])
    assert arr.shape == (EmbeddingStore.open(store).n_queries, 3)


def _finetune_entry(ce: Path) -> dict[str, object]:
    """A query-tower fine-tune on in-batch + one BM25 negative of the first 3, denoised by
    ``ce`` with the head's settings (so the two share one denoise stage)."""
    data = {**_data(ce), "negatives": "in-batch"}
    return {"family": "query-tower", "seed": 0, "data": data,
            "trainer": {"max_steps": 2, "save_steps": 1, "threads": 1},
            "validation": {"fraction": 0}}  # fmt: skip


def test_an_encoder_finetune_trains_on_the_same_denoised_pool_as_a_head(
    mybeir: Path,  # noqa: F811
    ce_dir: Path,
    tmp_path: Path,
) -> None:
    """Issue 32 item 3 for encoders: a ``finetune:`` entry's ``data.denoise`` adds the same
    ``denoise:`` stage a head's does (one stage for both when the settings agree); the fine-tune
    depends on it, trains on its array and reports its counts; the store is only read."""
    store = _copy_store(mybeir, tmp_path)
    _read_only(store)
    before = _snapshot(store)
    out = tmp_path / "out"
    try:
        exp = _write(tmp_path, store, ce_dir)
        raw = yaml.safe_load(exp.read_text(encoding="utf-8"))
        raw["finetune"] = {"qt": _finetune_entry(ce_dir)}
        exp.write_text(yaml.safe_dump(raw, sort_keys=False), encoding="utf-8")
        cfg = load_experiment(exp, output_dir=out)
        edges = plan_experiment(cfg).edges()
        (dn,) = [n for n in edges if n.startswith("denoise:")]  # shared by the head and qt
        assert edges["finetune:my:qt"] == ["embed:my:train", MINE, dn]
        assert edges["train:my:lin"] == ["embed:my:train", MINE, dn]
        res = run_experiment(cfg, progress=False, log=lambda s: None)
        status = {r.name: r.status for r in res.stages}
        assert status[dn] == status["finetune:my:qt"] == "ran"
        meta = json.loads(next(out.glob("**/denoise*/**/stage.json")).read_text(encoding="utf-8"))[
            "summary"
        ]["meta"]
        ft = json.loads((out / "finetune" / "my" / "qt" / "stage.json").read_text("utf-8"))
        got = ft["summary"]["summary"]["denoised_negatives"]
        assert got["array"] == meta["array"] and got["flagged"] == meta["flagged"]
        assert got["scorer_fingerprint"] == meta["scorer_fingerprint"]
        assert _snapshot(store) == before
    finally:
        _writable(store)


def test_treerank_finetune_denoises_into_its_output_folder(
    mybeir: Path,  # noqa: F811
    ce_dir: Path,
    tmp_path: Path,
) -> None:
    """Standalone ``treerank finetune``: the mined and the denoised arrays go into
    ``OUT/arrays`` (the store is only read), and results.json's training summary holds the
    denoising's counts and cost."""
    from typer.testing import CliRunner

    from treerank.cli.main import app

    store = _copy_store(mybeir, tmp_path)
    before = _snapshot(store)
    cfg = tmp_path / "qt.yaml"
    cfg.write_text(yaml.safe_dump(_finetune_entry(ce_dir)), encoding="utf-8")
    out = tmp_path / "o"
    res = CliRunner().invoke(app, ["finetune", str(cfg), "--store", str(store), "--out", str(out)])
    assert res.exit_code == 0, res.output
    names = sorted(p.name for p in (out / "arrays").glob("*.npy"))
    assert len(names) == 2 and names[1] == "bm25_negatives.npy"
    assert names[0].startswith("bm25_negatives-denoised-")
    doc = json.loads((out / "results.json").read_text(encoding="utf-8"))
    dn = doc["training"]["denoised_negatives"]
    assert dn["array"] == names[0].removesuffix(".npy")
    assert dn["negatives"] == dn["kept"] + dn["flagged"] and dn["cost"]["cpu_seconds"] > 0
    arr = np.load(out / "arrays" / names[0])
    assert arr.shape == (EmbeddingStore.open(store / "train").n_queries, 3)
    assert _snapshot(store) == before
