from pathlib import Path
from typing import Any

import pytest

from treerank.pipeline.config import ConfigError, deep_merge, load_experiment

SAMPLES = Path(__file__).resolve().parents[2] / "data" / "samples"


def _write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "exp.yaml"
    p.write_text(text)
    return p


def _base(tmp_path: Path, extra: str = "") -> Path:
    return _write(
        tmp_path,
        f"""
name: t
datasets:
  - name: scifact
    path: {SAMPLES / "scifact" / "scifact.zip"}
    format: scifact
    train_split: train
    eval_split: test
models:
  linear: {{family: linear, trainer: {{epochs: 5}}}}
  forest: {{family: forest, model: {{n_models: 64}}}}
diagnose: {{model: linear}}
quick:
  models:
    forest: {{model: {{n_models: 4}}}}
{extra}
""",
    )


def test_quick_profile_merges_over_full(tmp_path: Path) -> None:
    full = load_experiment(_base(tmp_path))
    quick = load_experiment(_base(tmp_path), quick=True)
    assert {n: (m.family, m.config) for n, m in full.models.items()} == {
        "linear": ("linear", {"trainer": {"epochs": 5}}),
        "forest": ("forest", {"model": {"n_models": 64}}),
    }
    assert quick.models["forest"].config == {"model": {"n_models": 4}}
    assert full.output_dir == Path("runs/t")
    assert full.datasets[0].path == (SAMPLES / "scifact" / "scifact.zip").resolve()


def test_unknown_key_is_named_with_file(tmp_path: Path) -> None:
    p = _base(tmp_path, "evaluate: {k: 100, topk: 5}")
    with pytest.raises(
        ConfigError, match=r"exp\.yaml: evaluate: unknown key\(s\) topk; allowed: k, baselines"
    ):
        load_experiment(p)


def test_unknown_model_and_missing_path(tmp_path: Path) -> None:
    p = _write(
        tmp_path,
        f"datasets: [{{name: a, path: {SAMPLES}, format: scifact, eval_split: test}}]\n"
        "models: {colbert: {family: colbert}}\n",
    )
    with pytest.raises(
        ConfigError,
        match="models.colbert.family: unknown trainable model family 'colbert'; known: linear",
    ):
        load_experiment(p)
    p = _write(
        tmp_path,
        f"datasets: [{{name: a, path: {SAMPLES}, format: scifact, eval_split: test}}]\n"
        "models: {m: {trainer: {}}}\n",
    )
    with pytest.raises(ConfigError, match="models.m: must be a mapping with a 'family' key"):
        load_experiment(p)
    p = _write(
        tmp_path, "datasets: [{name: a, path: nowhere.zip, format: scifact, eval_split: t}]\n"
    )
    with pytest.raises(FileNotFoundError, match=r"datasets\[0\]\.path .*nowhere\.zip"):
        load_experiment(p)


def test_deep_merge_does_not_mutate() -> None:
    a = {"x": {"y": 1, "z": 2}, "w": [1]}
    b = {"x": {"y": 5}, "w": [2]}
    assert deep_merge(a, b) == {"x": {"y": 5, "z": 2}, "w": [2]}
    assert a == {"x": {"y": 1, "z": 2}, "w": [1]}


def test_quick_profile_gets_its_own_output_dir(tmp_path: Path) -> None:
    assert load_experiment(_base(tmp_path), quick=True).output_dir == Path("runs/t-quick")
    assert load_experiment(_base(tmp_path), quick=True, output_dir="x").output_dir == Path("x")


def test_model_sections_are_checked_at_load_with_the_key_path(tmp_path: Path) -> None:
    p = _base(tmp_path, "")
    text = p.read_text().replace("trainer: {epochs: 5}", "trainer: {epochs: 5, lrr: 1}")
    p.write_text(text)
    with pytest.raises(
        ConfigError,
        match=r"exp\.yaml: models\.linear\.trainer: unknown key\(s\) lrr; allowed: epochs",
    ):
        load_experiment(p)
    p.write_text(text.replace("lrr: 1", "lr: oops"))
    with pytest.raises(ConfigError, match=r"models\.linear\.trainer"):
        load_experiment(p)


def test_two_models_of_one_family_and_diagnose_defaults(tmp_path: Path) -> None:
    p = _write(
        tmp_path,
        f"""
datasets:
  - {{name: a, path: {SAMPLES / "scifact" / "scifact.zip"}, format: scifact, eval_split: test}}
models:
  lin-a: {{family: linear, seed: 1}}
  lin-b: {{family: linear, seed: 2, model: {{bias: true}}}}
""",
    )
    cfg = load_experiment(p)
    assert [(m.name, m.family) for m in cfg.models.values()] == [
        ("lin-a", "linear"),
        ("lin-b", "linear"),
    ]
    assert cfg.diagnose.model == "lin-a"  # unset: the first model
    p = _write(
        tmp_path,
        f"datasets: [{{name: a, path: {SAMPLES}, format: scifact, eval_split: test}}]\n"
        "models: {}\n",
    )
    assert load_experiment(p).diagnose.model is None  # baselines only: no diagnostics


def test_device_and_encoder_backend_are_parsed_and_checked(tmp_path: Path) -> None:
    cfg = load_experiment(_base(tmp_path))
    from treerank.kernels.device import DEFAULT_DEVICE, Device

    # the one default (the CLI's and the library's): the CPU; `auto` is opt-in
    assert cfg.device == DEFAULT_DEVICE == Device("cpu") and cfg.encoder.backend == "torch"
    for good, dev in (
        ("cpu", Device("cpu")),
        ("cuda", Device("cuda")),
        ("cuda:1", Device("cuda", 1)),
    ):
        assert load_experiment(_base(tmp_path, f"device: {good}")).device == dev
    ok = load_experiment(_base(tmp_path, "encoder: {backend: onnx-int8}"))
    assert ok.encoder.backend == "onnx-int8"
    for bad in ("gpu", "cuda:x", "CPU"):
        with pytest.raises(ConfigError, match=rf"device '{bad}' is not auto, cpu, cuda"):
            load_experiment(_base(tmp_path, f"device: '{bad}'"))
    with pytest.raises(ConfigError, match=r"encoder.backend 'tensorrt' unknown; known: torch"):
        load_experiment(_base(tmp_path, "encoder: {backend: tensorrt}"))
    assert cfg.encoder.precision == "fp32"
    bf16 = load_experiment(_base(tmp_path, "encoder: {precision: bf16, backend: auto}"))
    assert bf16.encoder.precision == "bf16" and bf16.encoder.backend == "auto"
    with pytest.raises(ConfigError, match=r"encoder.precision 'fp16' unknown; known: fp32"):
        load_experiment(_base(tmp_path, "encoder: {precision: fp16}"))
    with pytest.raises(ConfigError, match="diagnose.probe_seed: expected an integer, got .x."):
        load_experiment(_base(tmp_path, "diagnose: {model: linear, probe_seed: x}"))


def test_encoder_gets_backend_precision_and_device(tmp_path: Path, monkeypatch) -> None:
    """The merge scaffolding (``_library_kwargs``) is gone: the embed stages' encoder is built
    with the configured backend and precision and the resolved device, passed directly."""
    from treerank.pipeline.stages import embed
    from treerank.tasks import embed as embed_task

    seen: dict[str, Any] = {}
    monkeypatch.setattr(embed_task, "SentenceEncoder", lambda *a, **kw: seen.update(kw) or "enc")
    cfg = load_experiment(_base(tmp_path, "device: cpu\nencoder: {precision: bf16, backend: onnx}"))
    assert embed.Encoder(cfg.encoder, "cpu", progress=False).get() == "enc"
    assert (seen["backend"], seen["precision"], seen["device"]) == ("onnx", "bf16", "cpu")


def test_evaluate_section_is_evaluation_settings_decided_as_the_cli(tmp_path: Path) -> None:
    """The YAML ``evaluate:`` section becomes the ``EvaluationSettings`` that
    ``resolve_evaluation`` decides on, as ``treerank evaluate`` does: without ``metrics`` the
    defaults deeper than ``k`` are left out (the pipeline used to refuse them), while a named
    metric deeper than ``k`` is still refused before any stage runs."""
    from treerank.evaluation.settings import resolve_evaluation
    from treerank.metrics.metrics import DEFAULT_METRICS
    from treerank.pipeline.experiment import evaluation_settings
    from treerank.pipeline.validate import validate_experiment

    cfg = load_experiment(_base(tmp_path, "evaluate: {k: 100, baselines: [cosine, bm25]}"))
    assert not cfg.evaluate.metrics_given
    validate_experiment(cfg)  # recall@1000 is a default: left out, not refused
    st = evaluation_settings(cfg)
    assert (st.baseline, st.second_baseline, st.k, st.metrics) == (
        "cosine", "bm25", 100, tuple(DEFAULT_METRICS),
    )  # fmt: skip
    plan = resolve_evaluation(tmp_path, ["cosine", "bm25"], st, n_passages=5000,
                              metrics_given=False, overlap=False)  # fmt: skip
    assert "recall@1000" in plan.dropped_metrics
    assert "recall@1000" not in plan.settings.metrics and "ndcg@10" in plan.settings.metrics
    named = load_experiment(_base(tmp_path, "evaluate: {k: 100, metrics: [recall@1000]}"))
    assert named.evaluate.metrics_given
    with pytest.raises(ConfigError, match="evaluate.k: recall@1000 cannot be measured"):
        validate_experiment(named)


def test_scifact_linear_sources_config_trains_the_main_jobs_head() -> None:
    """configs/scifact_linear_sources.yaml (docs/finetune.md, the bi-encoder at four epochs)
    trains exactly the main job's ``linear-sources`` entry, so its 0.7263 is the main job's
    number. The YAML is compared as read (its store, ``stores/scifact``, exists only after
    ``treerank embed``); the main job's entry is also checked to parse."""
    from treerank.config import load_yaml

    configs = Path(__file__).resolve().parents[2] / "configs"
    alone = load_yaml(configs / "scifact_linear_sources.yaml")
    main_job = load_yaml(configs / "sample.yaml")
    assert list(alone["models"]) == ["linear-sources"]
    assert alone["models"]["linear-sources"] == main_job["models"]["linear-sources"]
    assert [d["name"] for d in alone["datasets"]] == ["scifact"]
    assert alone["datasets"][0]["store"] == "../stores/scifact"
    assert "linear-sources" in load_experiment(configs / "sample.yaml").models
