"""Validate a whole experiment before its first stage writes anything.

A typo in a model section, a misspelt system or a metric that the run depth cannot serve must
fail in the first second, not after embedding and four trainings. :func:`validate_experiment`
checks every part of a loaded :class:`~treerank.pipeline.config.ExperimentConfig` and raises
one :class:`~treerank.pipeline.config.ConfigError` listing every problem, each with the YAML key
path (``models.linear.trainer.learning_rate``, ``systems[2]``, ``evaluate.metrics[1]``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from treerank.names import check_name
from treerank.pipeline.config import ConfigError, ExperimentConfig
from treerank.pipeline.runs import experiment_runs, systems_for


def _collect(problems: list[str], where: str, check: Callable[..., Any], *args: Any) -> None:
    try:
        check(*args)
    except (ValueError, KeyError, TypeError) as exc:
        text = str(exc.args[0]) if isinstance(exc, KeyError) and exc.args else str(exc)
        problems.append(f"{where}: {text}")


def validate_experiment(cfg: ExperimentConfig) -> None:
    """Check every system spec, metric and baseline of ``cfg``, that models can train, and that
    every dataset and model name can be represented (:func:`treerank.names.check_name`; each
    becomes a file name through the injective :func:`treerank.names.file_name`).

    Model sections were already parsed when ``cfg`` was loaded, by each family's strict config
    helper (the one ``treerank train`` uses: unknown keys and wrong types fail there, with the
    key path); here their metric names are checked too.

    Args:
        cfg: a loaded experiment.

    Raises:
        ConfigError: every problem found, one per line, each naming the file and key path.
    """
    from treerank.evaluation.checks import check_depth
    from treerank.kernels.topk import check_run_depth
    from treerank.metrics.metrics import parse_metric
    from treerank.search.specs import parse_spec

    problems: list[str] = []
    for d, ds in enumerate(cfg.datasets):
        _collect(problems, f"datasets[{d}].name", check_name, ds.name, "dataset name")
    for name in cfg.models:
        _collect(problems, f"models[{name!r}]", check_name, name, "model name")
    ev = cfg.evaluate
    for i, m in enumerate(ev.metrics):
        _collect(problems, f"evaluate.metrics[{i}]", parse_metric, m)
    if not problems and ev.metrics_given:  # default metrics too deep are left out, as the CLI does
        _collect(problems, "evaluate.k", check_depth, ev.k, ev.metrics)
    elif not problems:
        _collect(problems, "evaluate.k", check_run_depth, ev.k)
    for i, spec in enumerate(cfg.systems):
        _collect(problems, f"systems[{i}]", parse_spec, spec)
    for d, ds in enumerate(cfg.datasets):
        for i, spec in enumerate(ds.systems or []):
            _collect(problems, f"datasets[{d}].systems[{i}]", parse_spec, spec)
    if not ev.baselines:
        problems.append("evaluate.baselines: give at least one baseline system")
    for i, base in enumerate(ev.baselines):
        if base not in cfg.models:
            _collect(problems, f"evaluate.baselines[{i}]", parse_spec, base)
    if cfg.models and not any(ds.train_split for ds in cfg.datasets):
        problems.append(
            f"models: {', '.join(cfg.models)} would train on nothing: no dataset has a "
            "train_split (add train_split to a dataset, or remove the models section)"
        )
    for name, model in cfg.models.items():
        # the metrics a trainer validates on (common config shape: trainer / validation)
        val = model.config.get("validation") or {}
        for i, m in enumerate(val.get("metrics") or [] if isinstance(val, dict) else []):
            _collect(problems, f"models.{name}.validation.metrics[{i}]", parse_metric, m)
        trainer = model.config.get("trainer") or {}
        stop = trainer.get("early_stopping_metric") if isinstance(trainer, dict) else None
        if isinstance(stop, str):
            _collect(problems, f"models.{name}.trainer.early_stopping_metric", parse_metric, stop)
    runs = experiment_runs(cfg)
    for d, ds in enumerate(cfg.datasets):
        _collect(problems, f"datasets[{d}]", systems_for, cfg, ds, runs)
    if problems:
        n = len(problems)
        raise ConfigError(
            f"{cfg.source}: {n} problem{'s' if n > 1 else ''} found before running anything:\n"
            + "\n".join(f"  - {p}" for p in problems)
        )
