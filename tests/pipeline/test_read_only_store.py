"""A user's store (``datasets[].store``) is only ever read by ``treerank run`` (issue 31).

Mined negatives, teacher runs and pseudo splits are stages of their own with their own
directories, and the content-digest sidecar lives in the run's cache directory: a run on a
read-only copy of a real SciFact slice passes and leaves every byte, name and mtime of the
store as it was. (As root, ``chmod a-w`` does not stop a write, so the snapshot comparison is
what fails on a stage that writes into the store.)
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
from pathlib import Path

import yaml

from treerank.pipeline.config import load_experiment
from treerank.pipeline.experiment import run_experiment


def _snapshot(root: Path) -> dict[str, tuple[int, int, str]]:
    """Every path under ``root`` -> (size, mtime_ns, SHA-256 of the bytes; "" for a dir)."""
    out = {}
    for p in sorted(root.rglob("*")):
        st = p.stat()
        digest = hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else ""
        out[p.relative_to(root).as_posix()] = (st.st_size if p.is_file() else 0,
                                               st.st_mtime_ns, digest)  # fmt: skip
    return out


def _read_only(root: Path) -> None:
    for p in [root, *root.rglob("*")]:
        mode = p.stat().st_mode
        p.chmod(mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))


def _writable(root: Path) -> None:
    for p in [root, *root.rglob("*")]:
        p.chmod(p.stat().st_mode | stat.S_IWUSR)


def test_run_on_a_read_only_store_leaves_it_unchanged(scifact_slice: Path, tmp_path: Path) -> None:
    store = tmp_path / "store"
    shutil.copytree(scifact_slice, store, ignore=shutil.ignore_patterns("arrays", "pseudo*"))
    _read_only(store)
    before = _snapshot(store)
    sources = [
        {"kind": "labels", "weight": 1.0},
        {"kind": "teacher", "system": "bm25", "queries": "train", "mode": "soft", "k": 10},
        {"kind": "pseudo", "methods": ["ict"], "cap": 12, "positive": "source", "weight": 0.5},
    ]
    steps = {"epochs": 1, "max_steps": 2, "lr": 0.001, "log_every": 1}
    raw = {
        "name": "ro",
        "datasets": [{"name": "sci", "store": str(store), "train_split": "train",
                      "eval_split": "test"}],
        "systems": ["bm25", "cosine"],
        "evaluate": {"k": 100, "baselines": ["cosine"], "metrics": ["ndcg@10"], "seed": 0},
        "diagnose": {"model": None},
        "models": {
            # BM25 negatives mined (SciFact has no graded negatives): the mine stage
            "linear": {"family": "linear", "seed": 0, "trainer": steps,
                       "data": {"batch_size": 16, "n_hard": 1, "mine_depth": 20},
                       "validation": {"fraction": 0.0}},
            # a teacher run and a pseudo split: the teacher and pseudo stages
            "sources": {"family": "linear", "seed": 0, "trainer": steps,
                        "data": {"batch_size": 16, "sources": sources},
                        "validation": {"fraction": 0.0}},
        },
    }  # fmt: skip
    (tmp_path / "exp.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    out = tmp_path / "out"
    try:
        cfg = load_experiment(tmp_path / "exp.yaml", output_dir=out)
        res = run_experiment(cfg, progress=False, log=lambda s: None)
        assert _snapshot(store) == before  # not one byte, name or mtime changed
        status = {r.name: r.status for r in res.stages}
        paths = {r.name: r.path for r in res.stages}
        mine = "mine:sci:bm25_negatives-20"
        assert status[mine] == "ran" and status["train:sci:linear"] == "ran"
        teacher = next(n for n in status if n.startswith("teacher:sci:teacher-"))
        pseudo = next(n for n in status if n.startswith("pseudo:sci:pseudo-"))
        # each derived stage's files are in its own directory
        mdir = paths[mine]
        assert mdir == out / "mine" / "sci" / "bm25_negatives-20"
        assert json.loads((mdir / "stage.json").read_text())["summary"]["array"] == "bm25_negatives"
        assert (mdir / "arrays" / "bm25_negatives.npy").is_file()
        assert paths[teacher].parent == out / "teacher" / "sci"
        assert len(list((paths[teacher] / "arrays").glob("teacher-*-ids.npy"))) == 1
        assert paths[pseudo].parent == out / "pseudo" / "sci"
        assert (paths[pseudo] / paths[pseudo].name / "meta.json").is_file()
        trained = res.datasets["sci"].training["sources"]["summary"]
        assert str(out) in trained["training_sources"]["pseudo"]
        assert trained["training_sources"]["pseudo"].startswith(str(out))
        # a second run reuses everything and still writes nothing into the store
        again = run_experiment(load_experiment(tmp_path / "exp.yaml", output_dir=out),
                               progress=False, log=lambda s: None)  # fmt: skip
        assert {r.status for r in again.stages if r.skipped is None} == {"reused"}
        assert _snapshot(store) == before
    finally:
        _writable(store)
    assert os.access(store, os.W_OK)


def test_store_view_reads_and_writes_derived_data_only_where_told(tmp_path: Path) -> None:
    """``EmbeddingStore.with_derived``: sidecar arrays are written only into the view's write
    directory (none: refused, naming the store), read from it then the read directories, never
    from the split's own ``arrays/``; pseudo splits are looked up under the view's roots."""
    import numpy as np
    import pytest

    from tests.pipeline.test_training import write_store
    from treerank.store import EmbeddingStore

    write_store(tmp_path / "s" / "train", seed=1)
    store = EmbeddingStore.open(tmp_path / "s" / "train")
    store.save_array("own", np.arange(3))  # the plain store keeps its own sidecars
    assert (tmp_path / "s" / "train" / "arrays" / "own.npy").is_file()
    ro = store.with_derived(arrays_read=(tmp_path / "a",))
    assert not ro.has_array("own")  # a view never reads the split's arrays/
    with pytest.raises(PermissionError, match="read-only view"):
        ro.save_array("x", np.arange(2))
    rw = store.with_derived(arrays_write=tmp_path / "w", arrays_read=(tmp_path / "a",))
    rw.save_array("x", np.arange(2), meta={"m": 1})
    assert (tmp_path / "w" / "x.npy").is_file() and rw.load_array_meta("x") == {"m": 1}
    assert store.with_derived(arrays_read=(tmp_path / "w",)).load_array("x").tolist() == [0, 1]
    assert not (tmp_path / "s" / "train" / "arrays" / "x.npy").exists()
    (tmp_path / "r2" / "pseudo-b").mkdir(parents=True)
    view = store.with_derived(pseudo_roots=(tmp_path / "r1", tmp_path / "r2"))
    assert view.pseudo_split_dir("pseudo-b") == tmp_path / "r2" / "pseudo-b"
    assert view.pseudo_split_dir("pseudo-new") == tmp_path / "r1" / "pseudo-new"
    assert store.pseudo_split_dir("pseudo-a") == tmp_path / "s" / "pseudo-a"
