"""Experiment configuration: one YAML file per experiment holding every hyperparameter.

The file is validated strictly (unknown keys are errors naming the file and the key path), paths
are resolved relative to the YAML file's directory, and a ``quick:`` section, deep-merged over
the rest when ``--quick`` is given, makes a cheaper profile that still runs every stage.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from treerank.config import ConfigError, build, check_keys, expected_text, load_yaml
from treerank.encoders.batching import DEFAULT_TOKEN_BUDGET
from treerank.evaluation.settings import DEFAULT_BASELINE
from treerank.families import FAMILIES, family, trainable_families
from treerank.kernels.device import (
    DEFAULT_DEVICE,
    DEFAULT_DEVICE_TEXT,
    Device,
    DeviceError,
    parse_device,
)
from treerank.kernels.topk import RUN_DEPTH
from treerank.metrics.metrics import DEFAULT_METRICS
from treerank.models.cross_encoder import CE_PRECISIONS, DEFAULT_SCORE_BATCH
from treerank.names import file_name, name_problem, unknown_name
from treerank.readers import FORMATS
from treerank.training.finetune_config import CE_FAMILY, FinetuneConfig, parse_finetune_config

__all__ = [
    "BACKENDS",
    "ConfigError",
    "ExperimentConfig",
    "FinetuneSpec",
    "ModelSpec",
    "RerankSettings",
    "deep_merge",
    "load_experiment",
]

# ``encoder.backend``: how the encoder runs (the ONNX backends come with ``treerank.encoders``'
# ONNX Runtime support; the pipeline passes the value on where the encoder accepts it).
BACKENDS = ("torch", "onnx", "onnx-int8", "auto")
PRECISIONS = ("fp32", "bf16", "auto")  # ``encoder.precision`` (treerank.encoders.precision)


@dataclass
class EncoderConfig:
    """Which sentence-transformers model embeds the data (``None`` = bundled all-MiniLM-L6-v2)."""

    model: str | None = None
    query_prompt: str | None = None
    token_budget: int = DEFAULT_TOKEN_BUDGET
    backend: str = "torch"  # one of BACKENDS
    precision: str = "fp32"  # one of PRECISIONS


@dataclass
class DatasetConfig:
    """One dataset: where it is, how to read it, which split trains and which is evaluated.

    Either raw data (``path`` + ``format``: embedded by the run) or an existing store root
    (``store``: a directory holding ``<split>/`` store directories, used as is; ``dim`` for
    stores written by the Go ``cmd/embed`` tool, which have no ``meta.json``).
    """

    name: str
    eval_split: str
    path: Path | None = None
    format: str | None = None
    store: Path | None = None
    dim: int | None = None
    train_split: str | None = None
    limit: int | None = None
    max_passages: int | None = None
    systems: list[str] | None = None  # None = the experiment's systems + every trained model
    models: list[str] | None = None  # models trained on this dataset's train split (None: all)


@dataclass
class EvaluateConfig:
    """The YAML ``evaluate:`` section (``treerank.pipeline.experiment.evaluation_settings``
    makes it the :class:`~treerank.evaluation.settings.EvaluationSettings` of every evaluate
    stage).

    ``metrics_given``: the section names ``metrics``; when it does not, the defaults deeper than
    ``k`` are left out, as ``treerank evaluate`` leaves them out without ``--metric``.
    """

    k: int = RUN_DEPTH
    baselines: list[str] = field(default_factory=lambda: [DEFAULT_BASELINE, "bm25"])
    metrics: list[str] = field(default_factory=lambda: list(DEFAULT_METRICS))
    seed: int = 0
    metrics_given: bool = True


@dataclass
class DiagnoseConfig:
    """``model``: the name of a trained model (None: no diagnostics; an experiment file that
    does not say diagnoses its first model, and skips the stage when it trains none)."""

    model: str | None = None
    baseline: str = DEFAULT_BASELINE
    probe_seed: int = 42  # the probes' 70/30 split seed (run_diagnostics' probe_seed)


@dataclass
class ModelSpec:
    """One named model of an experiment: ``models: {<name>: {family: <family>, ...config}}``.

    Attributes:
        name: the experiment's name for it (stage names, output directories, system name).
        family: a registered trainable family (``treerank.families``).
        config: the family's training config (``seed`` + ``model / data / trainer /
            validation``), already validated by the family's parser.
        seeds: ``seeds: [0, 1, 2]`` in the section: train once per seed (each seed overrides
            ``seed``), evaluate every seed and report their spread and seed average
            (:mod:`treerank.evaluation.seeds`); ``None``: one model.
    """

    name: str
    family: str
    config: dict[str, Any]
    seeds: list[int] | None = None

    def runs(self) -> dict[str, dict[str, Any]]:
        """System / stage name -> training config: ``{name: config}`` for one model,
        ``{"name@seed<s>": config with seed s}`` for each seed of a seeded model."""
        from treerank.evaluation.seeds import seed_system_name

        if self.seeds is None:
            return {self.name: self.config}
        return {seed_system_name(self.name, s): {**self.config, "seed": s} for s in self.seeds}


@dataclass(frozen=True)
class RerankSettings:
    """The ``rerank:`` key of a ``family: cross-encoder`` entry of ``finetune:``: what the
    evaluate stage reranks with the trained cross-encoder.

    Attributes:
        first_stage: the system spec whose top ``depth`` is reranked (``bm25``; any spec of
            ``docs/systems.md``, checked when the experiment loads).
        depth: candidates reranked per query (>= 1).
        batch: pairs scored per forward pass (>= 1; the ``rescore:`` spec's ``batch=``).
        precision: the scoring precision, ``fp32`` | ``bf16`` | ``auto`` (bf16 only where the
            measured probe found it faster; the spec's ``precision=``).

    Raises:
        ValueError: ``depth < 1``, ``batch < 1``, an unknown precision, or a first stage that
            does not parse.
    """

    first_stage: str = "bm25"
    depth: int = 20
    batch: int = DEFAULT_SCORE_BATCH
    precision: str = "fp32"

    def __post_init__(self) -> None:
        from treerank.search.specs import parse_spec

        if self.depth < 1 or self.batch < 1:
            raise ValueError(f"depth and batch must be >= 1, got {self.depth} and {self.batch}")
        if self.precision not in CE_PRECISIONS:
            raise ValueError(f"precision {self.precision!r}: expected one of {CE_PRECISIONS}")
        parse_spec(self.first_stage)  # a SpecError (a ValueError) names the problem

    def system(self, model_dir: Path, fingerprint: str) -> Any:
        """The ``rescore:<first_stage>:depth=<depth>,scorer=ce:<model_dir>,batch=...,
        precision=...,fingerprint=...`` node (:class:`~treerank.search.specs.RescoreSpec`) that
        reranks with the cross-encoder in ``model_dir``, pinned to ``fingerprint``."""
        from treerank.search.specs import CrossEncoderSpec, RescoreSpec, parse_spec

        scorer = CrossEncoderSpec(Path(model_dir))
        first = parse_spec(self.first_stage)
        return RescoreSpec(
            first,
            depth=self.depth,
            scorer=scorer,
            batch=self.batch,
            precision=self.precision,
            fingerprint=fingerprint,
        )


@dataclass
class FinetuneSpec:
    """One ``finetune: {<name>: ...}`` entry: an encoder fine-tune (``treerank finetune``'s
    config shape, ``configs/finetune/*.yaml``: ``family`` biencoder / query-tower, ``seed``,
    ``model``, ``data``, ``trainer``, ``validation``) run on every dataset with a train split.

    Each becomes a ``finetune:<dataset>:<name>`` stage (the tuned encoder), one
    ``reembed:<dataset>:<name>:<split>`` stage per split (the split embedded again by it) and the
    system ``<name>`` of that dataset's evaluation (cosine over the re-embedded split).

    A ``family: cross-encoder`` entry trains a reranker instead: its ``finetune:`` stage
    (:mod:`treerank.pipeline.stages.cross_encoder`) writes a ``CrossEncoder`` folder, no split
    is embedded again, and the system ``<name>`` is ``rescore:<first stage>:depth=N,
    scorer=ce:<stage dir>/model`` (``rerank``, the entry's one key beside the config shape).

    Attributes:
        name: the entry's name (stage names, directories, the system name).
        config: the parsed config (``treerank.training.finetune_config.FinetuneConfig``).
        rerank: a cross-encoder's :class:`RerankSettings` (``None`` for the other families).
    """

    name: str
    config: FinetuneConfig
    rerank: RerankSettings | None = None


@dataclass
class ExperimentConfig:
    """A whole ``treerank run`` experiment (see ``configs/sample.yaml`` for a commented example).

    ``transfer: true`` evaluates every model trained on any dataset on every dataset of the
    experiment (system name ``<model>@<training dataset>`` on the other datasets) and adds the
    transfer table to the report (``treerank.pipeline.transfer``).
    """

    name: str
    source: Path
    output_dir: Path
    encoder: EncoderConfig
    datasets: list[DatasetConfig]
    models: dict[str, ModelSpec]
    systems: list[str]
    evaluate: EvaluateConfig
    diagnose: DiagnoseConfig
    raw: dict[str, Any]
    transfer: bool = False
    device: Device = DEFAULT_DEVICE  # where training, evaluation, diagnostics, embedding run
    finetunes: dict[str, FinetuneSpec] = field(default_factory=dict)


def deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """``base`` with ``over`` merged in recursively (dicts merge, everything else replaces)."""
    out = copy.deepcopy(base)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = deep_merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


_TOP_LEVEL: dict[str, type | tuple[type, ...]] = {
    "name": str,
    "output_dir": str,
    "encoder": dict,
    "datasets": list,
    "models": dict,
    "finetune": dict,
    "systems": list,
    "evaluate": dict,
    "diagnose": dict,
    "transfer": bool,
    "device": str,
    "quick": dict,
}
"""The top-level keys of an experiment file and their types."""


def _take(
    doc: Any, allowed: dict[str, type | tuple[type, ...]], where: str, src: Path
) -> dict[str, Any]:
    out = check_keys(doc, allowed, f"{src}: {where}")
    for key, typ in allowed.items():
        if key in out and out[key] is not None and not isinstance(out[key], typ):
            raise ConfigError(
                f"{src}: {where}.{key}: expected {expected_text(typ)}, got {out[key]!r}"
            )
    return out


def load_experiment(
    path: str | Path, *, quick: bool = False, output_dir: str | Path | None = None
) -> ExperimentConfig:
    """Read and validate an experiment YAML.

    Args:
        path: the YAML file.
        quick: deep-merge its ``quick:`` section over the rest (a file without one, or with an
            empty one, is refused: ``ConfigError``).
        output_dir: overrides ``output_dir`` (default: ``runs/<name>`` under the current
            directory; with ``quick``, ``runs/<name>-quick``).

    Raises:
        FileNotFoundError: ``path`` (or a dataset path in it) does not exist.
        ConfigError: malformed YAML, unknown keys, wrong types, unknown model or format names.
    """
    src = Path(path)
    raw = load_yaml(src, what="experiment")
    top = _take(raw, _TOP_LEVEL, "the top level", src)
    quick_section = top.pop("quick", None) or {}
    if quick and not quick_section:  # a flag that would do nothing says so
        raise ConfigError(
            f"{src}: --quick merges the file's quick: section, but it has none (the run would "
            "be the full experiment); add a quick: section (see configs/sample.yaml) or drop "
            "--quick"
        )
    if quick:
        top = deep_merge(top, quick_section)
    base = src.parent
    name = str(top.get("name") or src.stem)
    why = name_problem(name)
    if why is not None:
        raise ConfigError(f"{src}: name {name!r}: {why}")

    encoder = _encoder(top, src)
    device = _device(top, src)
    datasets = _datasets(top, base, src)

    models = _models(top.get("models"), src)
    for i, d in enumerate(datasets):
        unknown = [m for m in d.models or [] if m not in models]
        if unknown:
            raise ConfigError(
                f"{src}: datasets[{i}].models names {unknown}, not among models "
                f"({', '.join(models) or 'none'})"
            )
    ev = _take(
        top.get("evaluate") or {},
        {"k": int, "baselines": list, "metrics": list, "seed": int},
        "evaluate",
        src,
    )
    diagnose = _diagnose(top, models, src)
    out = _output_dir(top, name, quick, output_dir)
    return ExperimentConfig(
        name=name,
        source=src.resolve(),
        output_dir=out,
        encoder=encoder,
        datasets=datasets,
        models=models,
        systems=[str(s) for s in (top.get("systems") or ["bm25", "cosine"])],
        evaluate=EvaluateConfig(**ev, metrics_given="metrics" in ev),
        diagnose=diagnose,
        raw=top,
        transfer=bool(top.get("transfer", False)),
        device=device,
        finetunes=_finetunes(top.get("finetune"), models, src),
    )


def _encoder(top: dict[str, Any], src: Path) -> EncoderConfig:
    """``encoder:`` (model, prompt, batching, a known backend and precision)."""
    enc = _take(
        top.get("encoder") or {},
        {"model": str, "query_prompt": str, "token_budget": int, "backend": str, "precision": str},
        "encoder",
        src,
    )
    if enc.get("backend", "torch") not in BACKENDS:
        raise ConfigError(
            f"{src}: encoder.backend {enc['backend']!r} unknown; known: {', '.join(BACKENDS)}"
        )
    if enc.get("precision", "fp32") not in PRECISIONS:
        raise ConfigError(
            f"{src}: encoder.precision {enc['precision']!r} unknown; known: {', '.join(PRECISIONS)}"
        )
    return EncoderConfig(**enc)


def _device(top: dict[str, Any], src: Path) -> Device:
    """``device:`` parsed once here, in its canonical spelling only (``CPU`` or `` cpu`` are
    refused); whether this machine can use it is checked when a stage runs."""
    device_text = top.get("device", DEFAULT_DEVICE_TEXT)
    try:
        device = parse_device(str(device_text), check=False)
        if str(device) != device_text:
            raise DeviceError(str(device_text))
    except DeviceError:
        raise ConfigError(
            f"{src}: device {device_text!r} is not auto, cpu, cuda or cuda:<n> (e.g. cuda:0)"
        ) from None
    return device


_DATASET_KEYS: dict[str, type | tuple[type, ...]] = {
    "name": str,
    "path": str,
    "format": str,
    "store": str,
    "dim": int,
    "eval_split": str,
    "train_split": str,
    "limit": int,
    "max_passages": int,
    "systems": list,
    "models": list,
}


def _datasets(top: dict[str, Any], base: Path, src: Path) -> list[DatasetConfig]:
    """``datasets:``, at least one, with unique names; each a ``store`` or a ``path`` with its
    ``format`` (relative paths from the YAML's folder, which must exist)."""
    datasets: list[DatasetConfig] = []
    for i, d in enumerate(top.get("datasets") or []):
        d = _take(d, _DATASET_KEYS, f"datasets[{i}]", src)
        if d.get("store"):
            if d.get("path") or d.get("format"):
                raise ConfigError(
                    f"{src}: datasets[{i}] has 'store' and 'path'/'format'; give one of them"
                )
            required: tuple[str, ...] = ("name", "eval_split")
        else:
            required = ("name", "path", "format", "eval_split")
        for req in required:
            if not d.get(req):
                raise ConfigError(f"{src}: datasets[{i}] needs '{req}' (or 'store')")
        if d.get("format") is not None and d["format"] not in FORMATS:
            raise ConfigError(
                f"{src}: datasets[{i}].format {d['format']!r} unknown; known: {', '.join(FORMATS)}"
            )
        key = "store" if d.get("store") else "path"
        p = Path(d[key])
        p = p if p.is_absolute() else (base / p)
        if not p.exists():
            raise FileNotFoundError(f"{src}: datasets[{i}].{key} {p} does not exist")
        datasets.append(DatasetConfig(**{**d, key: p.resolve()}))
    if not datasets:
        raise ConfigError(f"{src}: 'datasets' must list at least one dataset")
    names = [d.name for d in datasets]
    if len(set(names)) != len(names):
        raise ConfigError(f"{src}: dataset names must be unique, got {names}")
    return datasets


def _diagnose(top: dict[str, Any], models: dict[str, ModelSpec], src: Path) -> DiagnoseConfig:
    """``diagnose:``; its model defaults to the first of ``models`` and must be one of them."""
    dg = _take(
        top.get("diagnose") or {},
        {"model": str, "baseline": str, "probe_seed": int},
        "diagnose",
        src,
    )
    if "model" not in dg:
        dg["model"] = next(iter(models), None)
    diagnose = DiagnoseConfig(**dg)
    if diagnose.model is not None and diagnose.model not in models:
        raise ConfigError(
            f"{src}: diagnose.model {diagnose.model!r} is not among models "
            f"({', '.join(models) or 'none'})"
        )
    return diagnose


def _output_dir(top: dict[str, Any], name: str, quick: bool, output_dir: str | Path | None) -> Path:
    """The run folder: ``output_dir`` given, else the YAML's, else ``runs/<name>``; a quick
    profile's default gains ``-quick`` (it never overwrites a full run's results)."""
    if output_dir is not None:
        return Path(output_dir)
    out = Path(top.get("output_dir") or Path("runs") / file_name(name))
    return out.with_name(out.name + "-quick") if quick else out


def _finetunes(doc: Any, models: dict[str, ModelSpec], src: Path) -> dict[str, FinetuneSpec]:
    """``finetune:``: each name maps to a fine-tune config, parsed strictly (key paths)."""
    out: dict[str, FinetuneSpec] = {}
    for name, body in check_keys(doc, list(doc or {}), f"{src}: finetune").items():
        where = f"{src}: finetune.{name}"
        why = name_problem(str(name))
        if why is not None:
            raise ConfigError(f"{where}: name {name!r}: {why}")
        if name in models:
            raise ConfigError(f"{where}: {name!r} is also a model's name; rename one")
        if not isinstance(body, dict):
            raise ConfigError(f"{where}: expected a mapping (configs/finetune/*.yaml's shape)")
        body = dict(body)
        rerank_doc = body.pop("rerank", None)
        parsed = parse_finetune_config(body, where)
        rerank = None
        if parsed.family == CE_FAMILY:
            rerank = build(RerankSettings, rerank_doc, f"{where}.rerank")
        elif rerank_doc is not None:
            raise ConfigError(
                f"{where}.rerank: applies to family {CE_FAMILY} only (a reranker), not "
                f"{parsed.family}"
            )
        out[str(name)] = FinetuneSpec(str(name), parsed, rerank)
    return out


def _models(doc: Any, src: Path) -> dict[str, ModelSpec]:
    """``models:``: each name maps to ``{family: <trainable family>, ...}``, validated by the
    family's own strict config parser."""
    out: dict[str, ModelSpec] = {}
    for name, cfg in check_keys(doc, list(doc or {}), f"{src}: models").items():
        where = f"{src}: models.{name}"
        if not isinstance(cfg, dict) or "family" not in cfg:
            raise ConfigError(
                f"{where}: must be a mapping with a 'family' key "
                f"(one of {', '.join(trainable_families())})"
            )
        body = dict(cfg)
        fam = body.pop("family")
        seeds = _seeds(body.pop("seeds", None), body, where)
        if fam not in FAMILIES or not FAMILIES[fam].trainable:
            raise ConfigError(
                f"{where}.family: "
                + unknown_name("trainable model family", str(fam), trainable_families())
            )
        family(fam).parse_config(body, where)
        out[str(name)] = ModelSpec(str(name), str(fam), body, seeds)
    return out


def _seeds(doc: Any, body: dict[str, Any], where: str) -> list[int] | None:
    """``models.<name>.seeds``: a non-empty list of distinct integers, not beside ``seed``."""
    if doc is None:
        return None
    if (
        not isinstance(doc, list)
        or not doc
        or not all(isinstance(x, int) and not isinstance(x, bool) for x in doc)
    ):
        raise ConfigError(f"{where}.seeds: expected a non-empty list of integers, got {doc!r}")
    if len(set(doc)) != len(doc):
        raise ConfigError(f"{where}.seeds: repeated seed in {doc}")
    if "seed" in body:
        raise ConfigError(f"{where}: give seed (one model) or seeds (one model per seed), not both")
    return [int(x) for x in doc]
