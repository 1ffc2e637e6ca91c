"""``treerank run`` with a ``finetune:`` entry on a real SciFact slice (issue 35 item 5, issue 31
item 7 of the closing checklist): the fine-tune and the re-embedded splits are stages with their
own directories and keys, the evaluation scores the tuned encoder beside frozen cosine, and a
re-run after changing only an evaluate option re-runs only the evaluate stage."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from treerank.pipeline.config import load_experiment
from treerank.pipeline.experiment import plan_experiment, run_experiment
from treerank.pipeline.finetune import finetune_rows
from treerank.store import EmbeddingStore


def _write(tmp: Path, store: Path, seed: int = 0, lr: float = 1e-4) -> Path:
    raw = {
        "name": "ft",
        "datasets": [{"name": "sci", "store": str(store), "train_split": "train",
                      "eval_split": "test"}],
        "systems": ["cosine"],
        "evaluate": {"k": 100, "baselines": ["cosine"], "metrics": ["ndcg@10"], "seed": seed},
        "models": {},
        "finetune": {
            "qt": {"family": "query-tower", "seed": 0, "data": {"batch_size": 8},
                   "trainer": {"max_steps": 2, "save_steps": 1, "lr": lr, "threads": 1},
                   "validation": {"fraction": 0}},
        },
    }  # fmt: skip
    p = tmp / "exp.yaml"
    p.write_text(yaml.safe_dump(raw, sort_keys=False))
    return p


FT, RE_TRAIN, RE_TEST = "finetune:sci:qt", "reembed:sci:qt:train", "reembed:sci:qt:test"


def test_finetune_entry_stages_keys_and_rerun_of_only_evaluate(
    scifact_slice: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    cfg = load_experiment(_write(tmp_path, scifact_slice), output_dir=out)
    graph = plan_experiment(cfg)
    edges = graph.edges()
    assert edges[FT] == ["embed:sci:train"]
    assert edges[RE_TEST] == [FT, "embed:sci:test"]
    assert RE_TEST in edges["evaluate:sci"]
    res = run_experiment(cfg, progress=False, log=lambda s: None)
    status = {r.name: r.status for r in res.stages}
    assert status[FT] == status[RE_TRAIN] == status[RE_TEST] == status["evaluate:sci"] == "ran"
    comp = res.datasets["sci"].comparison
    assert set(comp["systems"]) == {"cosine", "qt"}
    # the re-embedded split lives in its stage's directory and names its parent and checkpoint
    tuned_dir = out / "reembed" / "sci" / "qt" / "test"
    meta = json.loads((tuned_dir / "meta.json").read_text())["finetune"]
    assert meta["parent"]["store"] == str((scifact_slice / "test").resolve())
    assert meta["checkpoint"] == "checkpoint-2"
    tuned, parent = EmbeddingStore.open(tuned_dir), EmbeddingStore.open(scifact_slice / "test")
    assert tuned.encoder_fingerprint == meta["fingerprint"] != parent.encoder_fingerprint
    ft_json = json.loads((out / "finetune" / "sci" / "qt" / "stage.json").read_text())
    assert ft_json["summary"]["fingerprint"] == meta["fingerprint"]
    # the report's training table has the fine-tune's row: its training queries and cost
    row = json.loads((out / "report.json").read_text())["datasets"]["sci"]["training"]["qt"]
    assert row["encoder_finetune"] and row["family"] == "query-tower"
    train = EmbeddingStore.open(scifact_slice / "train")
    rows, _ = finetune_rows(train, cfg.finetunes["qt"].config)
    assert row["summary"]["training_queries"] == ft_json["summary"]["summary"]["training_queries"]
    assert 0 < row["summary"]["training_queries"] <= rows.size
    assert row["summary"]["steps"] == 2 and row["summary"]["cpu_seconds"] > 0
    # only an evaluate option changed: only the evaluate stage runs again
    again = load_experiment(_write(tmp_path, scifact_slice, seed=1), output_dir=out)
    res2 = run_experiment(again, progress=False, log=lambda s: None)
    ran = {r.name for r in res2.stages if r.status == "ran"}
    assert ran == {"evaluate:sci"}
    # a changed fine-tune setting re-keys the fine-tune, both re-embeds and the evaluation
    keys = plan_experiment(again).names()
    lr = plan_experiment(
        load_experiment(_write(tmp_path, scifact_slice, seed=1, lr=2e-4), output_dir=out)
    ).names()
    assert {n for n in keys if keys[n] != lr[n]} == {FT, RE_TRAIN, RE_TEST, "evaluate:sci"}


def test_a_distilled_query_tower_depends_on_its_teacher_stage(
    scifact_slice: Path, tmp_path: Path
) -> None:
    raw = yaml.safe_load(_write(tmp_path, scifact_slice).read_text())
    teacher = {"kind": "teacher", "system": "bm25", "mode": "margin-mse", "k": 10}
    raw["finetune"]["qt"]["data"]["sources"] = [{"kind": "labels"}, teacher]
    (tmp_path / "exp.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    graph = plan_experiment(load_experiment(tmp_path / "exp.yaml", output_dir=tmp_path / "o"))
    edges = graph.edges()
    taught = [d for d in edges[FT] if d.startswith("teacher:sci:")]
    assert len(taught) == 1 and edges[taught[0]] == ["embed:sci:train"]
    # the teacher's settings are in the fine-tune's key: another depth is another stage
    raw["finetune"]["qt"]["data"]["sources"][1]["k"] = 20
    (tmp_path / "exp.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    again = plan_experiment(load_experiment(tmp_path / "exp.yaml", output_dir=tmp_path / "o"))
    assert [d for d in again.edges()[FT] if d.startswith("teacher:")] != taught
    ft = {g: next(st for sid, st in g.stages.items() if sid.name == FT) for g in (graph, again)}
    assert ft[graph].inputs != ft[again].inputs


def test_a_model_teachers_stage_key_holds_its_folders_bytes(
    scifact_slice: Path, tmp_path: Path
) -> None:
    """A ``ce:<dir>`` (or ``ckpt:<dir>``) teacher retrained in place is ranked again: the
    teacher stage's key digests the folder, not only its path."""
    ce = tmp_path / "ce"
    ce.mkdir()
    (ce / "model.safetensors").write_bytes(b"weights v1")
    raw = yaml.safe_load(_write(tmp_path, scifact_slice).read_text())
    system = f"rescore:bm25:depth=5,scorer=ce:{ce}"
    teacher = {"kind": "teacher", "system": system, "mode": "margin-mse", "k": 5}
    raw["finetune"]["qt"]["data"]["sources"] = [{"kind": "labels"}, teacher]
    (tmp_path / "exp.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))

    def teacher_inputs() -> object:
        cfg = load_experiment(tmp_path / "exp.yaml", output_dir=tmp_path / "o")
        graph = plan_experiment(cfg)
        return next(st.inputs for sid, st in graph.stages.items() if sid.kind == "teacher")

    before = teacher_inputs()
    assert str(ce) in before["model_folders"]  # type: ignore[index]
    (ce / "model.safetensors").write_bytes(b"weights v2")
    assert teacher_inputs() != before


def test_an_evaluated_model_folders_bytes_are_in_the_evaluate_key(
    scifact_slice: Path, tmp_path: Path
) -> None:
    """A ``ce:<dir>`` system of ``systems:`` retrained in place is scored again: the evaluate
    stage's key digests the folder; a run whose systems read no folder keeps its key shape."""
    ce = tmp_path / "ce"
    ce.mkdir()
    (ce / "model.safetensors").write_bytes(b"weights v1")
    raw = yaml.safe_load(_write(tmp_path, scifact_slice).read_text())
    del raw["finetune"]

    def evaluate_inputs() -> dict[str, object]:
        (tmp_path / "exp.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
        graph = plan_experiment(load_experiment(tmp_path / "exp.yaml", output_dir=tmp_path / "o"))
        return next(st.inputs for sid, st in graph.stages.items() if sid.kind == "evaluate")

    assert "model_folders" not in evaluate_inputs()
    raw["systems"] = ["cosine", f"rescore:bm25:depth=5,scorer=ce:{ce}"]
    before = evaluate_inputs()
    assert list(before["model_folders"]) == [str(ce)]  # type: ignore[call-overload]
    (ce / "model.safetensors").write_bytes(b"weights v2")
    assert evaluate_inputs() != before
