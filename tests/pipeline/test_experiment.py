"""End to end: `treerank run` on a small real SciFact slice, every stage, then a no-op re-run."""

import json
from pathlib import Path

import pytest
import yaml

from treerank.pipeline.config import ConfigError, load_experiment
from treerank.pipeline.experiment import run_experiment
from treerank.pipeline.stages import StageError

REPO = Path(__file__).resolve().parents[2]
SAMPLE = REPO / "configs" / "sample.yaml"


def _small_config(tmp_path: Path, **model_over: dict) -> Path:
    """configs/sample.yaml's quick profile on 60 SciFact queries and 400 passages per split."""
    raw = yaml.safe_load(SAMPLE.read_text())
    quick = raw.pop("quick", {})
    for key, sect in quick.items():
        if isinstance(sect, dict) and isinstance(raw.get(key), dict):
            for k2, v2 in sect.items():
                if isinstance(v2, dict) and isinstance(raw[key].get(k2), dict):
                    raw[key][k2].update(v2)
                else:
                    raw[key][k2] = v2
        else:
            raw[key] = sect
    for ds in raw["datasets"]:
        ds["path"] = str((SAMPLE.parent / ds["path"]).resolve())
        ds["limit"] = 60
        ds["max_passages"] = 400
    for m, over in model_over.items():
        raw["models"][m].update(over)
    for section in raw["models"].values():  # two seeds keep the test short; the sample has three
        if "seeds" in section:
            section["seeds"] = [0, 1]
    p = tmp_path / "exp.yaml"
    p.write_text(yaml.safe_dump(raw))
    return p


@pytest.mark.slow
def test_run_end_to_end_then_reuse_then_failure_keeps_results(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg_path = _small_config(tmp_path)
    out = tmp_path / "out"
    lines: list[str] = []
    res = run_experiment(
        load_experiment(cfg_path, output_dir=out),
        log=lambda s: lines.append(str(s)),
        progress=False,
    )

    # every stage ran once; every trained model was evaluated beside the baselines
    names = [r.name for r in res.stages]
    assert not any(r.reused for r in res.stages)
    assert "embed:scifact:train" in names and "evaluate:scifact" in names
    for m in ("linear@seed0", "linear@seed1", "mlp@seed0", "mlp@seed1", "forest", "drt@seed1"):
        assert f"train:scifact:{m}" in names
    assert "diagnose:scifact" in names

    report = json.loads(res.report_json.read_text())
    sci = report["datasets"]["scifact"]["comparison"]["systems"]
    assert {"bm25", "cosine", "linear", "mlp", "forest", "forest-random", "drt"} <= set(sci)
    assert "linear@seed1" in sci
    spread = report["datasets"]["scifact"]["comparison"]["seed_spread"]
    # the forest's untrained twin is a seeded model too (the main job reports it beside it)
    assert set(spread) == {"linear", "mlp", "drt", "forest-random"}
    assert spread["linear"]["seeds"] == [0, 1]
    # the report's numbers are the evaluation stage's own results.json, exactly
    results = json.loads((out / "eval" / "scifact" / "results.json").read_text())
    for system, vals in results["systems"].items():
        assert sci[system]["mean"] == vals["mean"]
    assert 0.0 < sci["cosine"]["mean"]["ndcg@10"] <= 1.0
    fst = report["datasets"]["scifact"]["family_reports"]["forest"]["forest"]
    assert 0.0 < fst["query_class_entropy_mean"] <= fst["max_entropy_log_c"] + 1e-9
    assert 0.0 <= fst["not_retrievable_fraction"] <= 1.0
    assert (out / "models" / "scifact" / "forest" / "checkpoint" / "training_curves.png").exists()
    ov = report["datasets"]["scifact"]["overlap"]
    assert ov["n_seen"] + ov["n_unseen"] == 60
    assert set(ov["parts"]["unseen"]) == set(sci)
    md = res.report_md.read_text()
    assert "Seen vs unseen positives" in md
    assert "## Summary" in md and "never training positives" in md
    assert "## Stages" in md
    # the dataset without a train split says what it skipped, in the log and the report
    skipped = {r.name: r.skipped for r in res.stages if r.skipped}
    assert skipped["train:msmarco-sample"].startswith("no train_split")
    assert "not trained on this dataset" in skipped["diagnose:msmarco-sample"]
    assert "| `train:msmarco-sample` | — | skipped: no train_split" in md
    assert any(line.startswith("[skip]  train:msmarco-sample") for line in lines)

    # a second run with nothing changed reuses every stage
    res2 = run_experiment(
        load_experiment(cfg_path, output_dir=out), log=lambda s: None, progress=False
    )
    assert all(r.reused for r in res2.stages if r.skipped is None)
    assert (
        json.loads(res2.report_json.read_text())["datasets"]["scifact"]["comparison"]
        == report["datasets"]["scifact"]["comparison"]
    )

    # a metric no trainer can compute is refused before any stage runs, with its key path
    bogus = _small_config(
        tmp_path,
        mlp={
            "trainer": {"early_stopping_metric": "bogus@10"},
            "validation": {"metrics": ["bogus@10"]},
        },
    )
    with pytest.raises(ConfigError, match=r"models.mlp.validation.metrics\[0\]: bad metric"):
        run_experiment(load_experiment(bogus, output_dir=out), log=lambda s: None, progress=False)

    # a failing stage names itself and leaves earlier results intact
    import treerank.pipeline.stages.train as training  # the train stage's library call

    def boom(*args: object, **kwargs: object) -> None:
        raise ValueError("loss is NaN")

    monkeypatch.setattr(training, "train_model", boom)
    changed = _small_config(tmp_path, mlp={"trainer": {"epochs": 2}})
    before = (out / "models" / "scifact" / "mlp@seed0" / "stage.json").read_text()
    with pytest.raises(StageError, match="train:scifact:mlp@seed0.*loss is NaN"):
        run_experiment(load_experiment(changed, output_dir=out), log=lambda s: None, progress=False)
    assert (out / "models" / "scifact" / "mlp@seed0" / "stage.json").read_text() == before
    assert (out / "eval" / "scifact" / "results.json").exists()


def test_baselines_only_experiment_skips_diagnostics(tmp_path: Path) -> None:
    from tests.pipeline.test_training import write_store

    write_store(tmp_path / "stores" / "test", seed=1)
    (tmp_path / "exp.yaml").write_text(
        yaml.safe_dump(
            {
                "datasets": [{"name": "toy", "store": "stores", "eval_split": "test"}],
                "systems": ["cosine", "bm25"],
                "evaluate": {"k": 20, "metrics": ["mrr@10", "ndcg@10"]},
                "models": {},
            }
        )
    )
    cfg = load_experiment(tmp_path / "exp.yaml", output_dir=tmp_path / "out")
    assert cfg.diagnose.model is None
    res = run_experiment(cfg, log=lambda s: None, progress=False)
    assert [(r.name, r.status) for r in res.stages] == [
        ("evaluate:toy", "ran"),
        ("diagnose:toy", "skipped: no diagnose.model given"),
    ]
    report = json.loads(res.report_json.read_text())
    assert set(report["datasets"]["toy"]["comparison"]["systems"]) == {"cosine", "bm25"}


def _cosine_on_given_store(tmp_path: Path) -> Path:
    """``exp.yaml``: cosine on a written store's test split given as ``store:``; its path."""
    from tests.pipeline.test_training import write_store

    write_store(tmp_path / "stores" / "test", seed=1)
    (tmp_path / "exp.yaml").write_text(
        yaml.safe_dump(
            {
                "datasets": [{"name": "toy", "store": "stores", "eval_split": "test"}],
                "systems": ["cosine"],
                "evaluate": {"k": 20, "metrics": ["ndcg@10"], "baselines": ["cosine"]},
                "models": {},
            }
        )
    )
    return tmp_path / "stores" / "test"


def test_sidecar_arrays_written_into_a_store_root_keep_its_stages(tmp_path: Path) -> None:
    """Mined negatives (arrays/) and FAISS indexes (indexes/) are derived caches: writing them
    beside a split used through `store:` must not re-run the stages that read it, while a
    changed store file does."""
    import os

    _cosine_on_given_store(tmp_path)

    def run() -> str:
        cfg = load_experiment(tmp_path / "exp.yaml", output_dir=tmp_path / "out")
        return run_experiment(cfg, log=lambda s: None, progress=False).stages[0].status

    assert run() == "ran"
    for sub in ("arrays", "indexes"):
        (tmp_path / "stores" / "test" / sub).mkdir()
        (tmp_path / "stores" / "test" / sub / "x.npy").write_bytes(b"derived")
    assert run() == "reused"
    meta = tmp_path / "stores" / "test" / "meta.json"
    # a touched file with the same bytes keeps the key (the key is the content digest) ...
    os.utime(meta, ns=(meta.stat().st_atime_ns, meta.stat().st_mtime_ns + 10**9))
    assert run() == "reused"
    # ... a changed one re-runs
    meta.write_text(meta.read_text() + "\n")
    assert run() == "ran"


def test_given_store_keyed_by_content_not_mtime(tmp_path: Path, monkeypatch) -> None:
    """Issue 36: a `passages.bin` replaced by a same-size file with two rows swapped and its
    mtime restored (as `cp -p`, `rsync -a` or `tar` do) reused stale evaluation results. The key
    now holds content digests, cached in a sidecar keyed by size, mtime, ctime and inode (the
    ctime changes on every write and cannot be restored), so each file is hashed once."""
    import os

    import numpy as np

    from treerank.pipeline.stages import DIGESTS_FILE, digest_sidecar
    from treerank.pipeline.stages import base as stages

    split = _cosine_on_given_store(tmp_path)
    hashed: list[str] = []
    real = stages.file_sha256
    monkeypatch.setattr(
        stages, "file_sha256", lambda p, *a: hashed.append(Path(p).name) or real(p, *a)
    )

    def run() -> tuple[str, str]:
        cfg = load_experiment(tmp_path / "exp.yaml", output_dir=tmp_path / "out")
        res = run_experiment(cfg, log=lambda s: None, progress=False)
        return res.stages[0].status, res.stages[0].key

    status, key = run()
    assert status == "ran" and "passages.bin" in hashed
    # the sidecar lives in the run's cache directory, never in the user's store
    assert digest_sidecar(tmp_path / "out", split).is_file()
    assert not (split / DIGESTS_FILE).exists()
    hashed.clear()
    assert run()[0] == "reused" and hashed == []  # digests read from the sidecar, not recomputed
    p = split / "passages.bin"
    st = p.stat()
    rows = np.fromfile(p, dtype="<f4").reshape(300, 16)
    rows[[0, 1]] = rows[[1, 0]]
    rows.tofile(p)  # same size ...
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))  # ... mtime restored
    assert p.stat().st_size == st.st_size and p.stat().st_mtime_ns == st.st_mtime_ns
    status, key2 = run()
    assert status == "ran" and hashed == ["passages.bin"] and key2 != key
