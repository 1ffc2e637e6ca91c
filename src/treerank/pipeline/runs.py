"""The trained runs and the evaluated systems of an experiment, read from its config alone.

:mod:`treerank.pipeline.experiment` plans its stages from them and
:mod:`treerank.pipeline.validate` checks them before anything runs; both import them from here.
"""

from __future__ import annotations

from treerank.pipeline.config import DatasetConfig, ExperimentConfig
from treerank.pipeline.identity import RunId, SystemId

__all__ = ["experiment_runs", "seed_groups", "systems_for"]


def experiment_runs(cfg: ExperimentConfig) -> list[RunId]:
    """Every trained run of ``cfg``, in execution order: per dataset with a train split, per
    model it trains (``datasets[].models``, default all), per seed (``None``: no ``seeds:``)."""
    out = []
    for ds in cfg.datasets:
        if not ds.train_split:
            continue
        for spec in cfg.models.values():
            if ds.models is not None and spec.name not in ds.models:
                continue
            for seed in spec.seeds if spec.seeds is not None else [None]:
                out.append(RunId(spec.name, ds.name, seed))
    return out


def systems_for(cfg: ExperimentConfig, ds: DatasetConfig, runs: list[RunId]) -> list[SystemId]:
    """The systems evaluated on ``ds``: the configured specs, every run trained on it, with
    ``transfer: true`` every run trained elsewhere, then the baselines not named yet.

    Raises:
        ValueError: two systems render to the same name (e.g. a spec named like a model).
    """
    specs = ds.systems if ds.systems is not None else cfg.systems
    out = [SystemId.of_spec(s, ds.name) for s in specs]
    out += [SystemId.of_run(r, ds.name) for r in runs if r.trained_on == ds.name]
    if cfg.transfer:  # every model trained elsewhere, zero-shot on this dataset
        out += [SystemId.of_run(r, ds.name) for r in runs if r.trained_on != ds.name]
    names = [s.name for s in out]
    names += list(cfg.finetunes) if ds.train_split else []  # a tuned encoder's system name
    dup = sorted({n for n in names if names.count(n) > 1})
    averages = {g for g in seed_groups(out)}
    clash = sorted(averages & set(names)) + dup
    if clash:
        raise ValueError(
            f"datasets {ds.name}: system name(s) {', '.join(clash)} given twice (a system spec "
            "named like a trained model or its seed average); rename the model"
        )
    for base in cfg.evaluate.baselines:
        if base not in names and base not in averages:
            out.append(SystemId.of_spec(base, ds.name))
            names.append(base)
    return out


def seed_groups(systems: list[SystemId]) -> dict[str, dict[str, int]]:
    """Seed-average system name -> {its seeds' system names: seed}, for the seeded runs among
    ``systems`` (grouped by model and training dataset)."""
    groups: dict[str, dict[str, int]] = {}
    for s in systems:
        if s.run is not None and s.run.seed is not None:
            avg = SystemId.seed_average(s.run.model, s.run.trained_on, s.evaluated_on)
            groups.setdefault(avg.name, {})[s.name] = s.run.seed
    return groups
