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

import yaml

TRAINABLE_MODELS = ("linear", "mlp", "forest", "drt")
READER_FORMATS = ("msmarco", "beir", "scifact", "trec-dl", "tsv", "cranfield")


class ConfigError(ValueError):
    """The experiment file is malformed; the message names the file and the key path."""


@dataclass
class EncoderConfig:
    """Which sentence-transformers model embeds the data (``None`` = bundled all-MiniLM-L6-v2)."""

    model: str | None = None
    query_prompt: str | None = None
    token_budget: int = 16384


@dataclass
class DatasetConfig:
    """One dataset: where it is, how to read it, which split trains and which is evaluated."""

    name: str
    path: Path
    format: str
    eval_split: str
    train_split: str | None = None
    limit: int | None = None
    max_passages: int | None = None
    systems: list[str] | None = None  # None = the experiment's systems + every trained model


@dataclass
class EvaluateConfig:
    k: int = 1000
    baselines: list[str] = field(default_factory=lambda: ["cosine", "bm25"])
    metrics: list[str] = field(
        default_factory=lambda: ["mrr@10", "ndcg@10", "recall@100", "recall@1000"]
    )
    seed: int = 0


@dataclass
class DiagnoseConfig:
    model: str | None = "drt"  # None disables the stage
    baseline: str = "cosine"


@dataclass
class ExperimentConfig:
    """A whole ``treerank run`` experiment (see ``configs/sample.yaml`` for a commented example)."""

    name: str
    source: Path
    output_dir: Path
    encoder: EncoderConfig
    datasets: list[DatasetConfig]
    models: dict[str, dict[str, Any]]
    systems: list[str]
    evaluate: EvaluateConfig
    diagnose: DiagnoseConfig
    raw: dict[str, Any]


def deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """``base`` with ``over`` merged in recursively (dicts merge, everything else replaces)."""
    out = copy.deepcopy(base)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = deep_merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def _take(
    doc: dict[str, Any], allowed: dict[str, type | tuple[type, ...]], where: str, src: Path
) -> dict[str, Any]:
    if not isinstance(doc, dict):
        raise ConfigError(f"{src}: {where} must be a mapping, got {type(doc).__name__}")
    unknown = sorted(set(doc) - set(allowed))
    if unknown:
        raise ConfigError(
            f"{src}: unknown key(s) {', '.join(unknown)} in {where}; allowed: {', '.join(allowed)}"
        )
    for key, typ in allowed.items():
        if key in doc and doc[key] is not None and not isinstance(doc[key], typ):
            raise ConfigError(
                f"{src}: {where}.{key} has the wrong type ({type(doc[key]).__name__})"
            )
    return doc


def load_experiment(
    path: str | Path, *, quick: bool = False, output_dir: str | Path | None = None
) -> ExperimentConfig:
    """Read and validate an experiment YAML.

    Args:
        path: the YAML file.
        quick: deep-merge its ``quick:`` section over the rest.
        output_dir: overrides ``output_dir`` (default: ``runs/<name>`` under the current
            directory; with ``quick``, ``runs/<name>-quick``).

    Raises:
        FileNotFoundError: ``path`` (or a dataset path in it) does not exist.
        ConfigError: malformed YAML, unknown keys, wrong types, unknown model or format names.
    """
    src = Path(path)
    if not src.is_file():
        raise FileNotFoundError(f"{src}: experiment file not found")
    try:
        raw = yaml.safe_load(src.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise ConfigError(f"{src}: not valid YAML ({exc})") from exc
    top = _take(
        raw or {},
        {
            "name": str,
            "output_dir": str,
            "encoder": dict,
            "datasets": list,
            "models": dict,
            "systems": list,
            "evaluate": dict,
            "diagnose": dict,
            "quick": dict,
        },
        "the top level",
        src,
    )
    quick_section = top.pop("quick", None) or {}
    if quick:
        top = deep_merge(top, quick_section)
    base = src.parent
    name = str(top.get("name") or src.stem)

    enc = _take(
        top.get("encoder") or {},
        {"model": str, "query_prompt": str, "token_budget": int},
        "encoder",
        src,
    )
    encoder = EncoderConfig(**enc)

    datasets: list[DatasetConfig] = []
    for i, d in enumerate(top.get("datasets") or []):
        d = _take(
            d,
            {
                "name": str,
                "path": str,
                "format": str,
                "eval_split": str,
                "train_split": str,
                "limit": int,
                "max_passages": int,
                "systems": list,
            },
            f"datasets[{i}]",
            src,
        )
        for req in ("name", "path", "format", "eval_split"):
            if not d.get(req):
                raise ConfigError(f"{src}: datasets[{i}] needs '{req}'")
        if d["format"] not in READER_FORMATS:
            raise ConfigError(
                f"{src}: datasets[{i}].format {d['format']!r} unknown; "
                f"known: {', '.join(READER_FORMATS)}"
            )
        p = Path(d["path"])
        p = p if p.is_absolute() else (base / p)
        if not p.exists():
            raise FileNotFoundError(f"{src}: datasets[{i}].path {p} does not exist")
        datasets.append(DatasetConfig(**{**d, "path": p.resolve()}))
    if not datasets:
        raise ConfigError(f"{src}: 'datasets' must list at least one dataset")
    names = [d.name for d in datasets]
    if len(set(names)) != len(names):
        raise ConfigError(f"{src}: dataset names must be unique, got {names}")

    models = top.get("models") or {}
    for m, cfg in models.items():
        if m not in TRAINABLE_MODELS:
            raise ConfigError(
                f"{src}: models.{m} is not a trainable model; known: {', '.join(TRAINABLE_MODELS)}"
            )
        if cfg is not None and not isinstance(cfg, dict):
            raise ConfigError(f"{src}: models.{m} must be a mapping of hyperparameters")
    models = {m: dict(cfg or {}) for m, cfg in models.items()}

    ev = _take(
        top.get("evaluate") or {},
        {"k": int, "baselines": list, "metrics": list, "seed": int},
        "evaluate",
        src,
    )
    dg = _take(top.get("diagnose") or {}, {"model": str, "baseline": str}, "diagnose", src)
    diagnose = DiagnoseConfig(**dg)
    if diagnose.model is not None and diagnose.model not in models:
        raise ConfigError(
            f"{src}: diagnose.model {diagnose.model!r} is not among models ({', '.join(models)})"
        )

    if output_dir is not None:
        out = Path(output_dir)
    else:
        out = Path(top.get("output_dir") or f"runs/{name}")
        if quick:  # the quick profile never overwrites a full run's results
            out = out.with_name(out.name + "-quick")
    return ExperimentConfig(
        name=name,
        source=src.resolve(),
        output_dir=out,
        encoder=encoder,
        datasets=datasets,
        models=models,
        systems=[str(s) for s in (top.get("systems") or ["bm25", "cosine"])],
        evaluate=EvaluateConfig(**ev),
        diagnose=diagnose,
        raw=top,
    )
