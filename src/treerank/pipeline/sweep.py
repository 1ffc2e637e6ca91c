"""``treerank sweep``: one experiment run over a grid of settings, one table, one plot per key.

A sweep takes an experiment YAML and a grid of dotted key paths into it
(``models.drt.loss.lambda_dec=0,0.1``; list items by index, ``datasets.0.limit=50,100``). Every
setting of the Cartesian product is a full ``treerank run`` (:func:`run_experiment`) in
``<out>/settings/<slug>/`` whose stages live in one content-addressed cache,
``<out>/cache/<stage>-<key>/``: a stage whose inputs did not change between settings (the
embedding of every setting, the baselines' evaluation inputs, a model a key does not touch) runs
once and is linked into every setting that needs it, and a re-run of the sweep reuses
everything. A setting's directory is exactly what ``treerank run`` on its YAML
(``settings/<slug>/experiment.yaml``, written there) would produce.

The result (:func:`sweep_table`) is one row per (setting, dataset, system) and metric: the mean
with its 95% bootstrap confidence interval over queries, and the paired difference against the
**reference setting** (default the first; ``sweep.reference`` or ``--reference``) with its
paired randomization p-value (:mod:`treerank.evaluation.significance`, 10,000 draws, seed 0).
Written as ``sweep.md``, ``sweep.json`` and ``plots/<key>.png`` (the metric against each swept
key's values, one line per combination of the other keys, per system).

The YAML may carry its own grid in a ``sweep:`` section (removed before the experiment is
validated)::

    sweep:
      grid: {models.drt.loss.lambda_dec: [0, 0.1], models.drt.model.k: [4, 6, 8]}
      design: full            # or half: the 2^(k-1) half fraction of a two-level grid
      reference: {models.drt.loss.lambda_dec: 0.1, models.drt.model.k: 6}
      systems: [drt]          # rows of the table (default: every system)
      metric: ndcg@10         # plotted metric (default: the first of evaluate.metrics)

``--grid`` options add to (or replace keys of) that grid.
"""

from __future__ import annotations

import copy
import itertools
import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from treerank.config import parse_yaml
from treerank.metrics.metrics import headline_metric
from treerank.pipeline.config import ConfigError

SWEEP_KEYS = ("grid", "design", "reference", "systems", "metric")
DESIGNS = ("full", "half")
N_DRAWS = 10_000


@dataclass
class Setting:
    """One point of the grid: key path -> value, and its directory name."""

    values: dict[str, Any]
    slug: str


@dataclass
class SweepResult:
    """What :func:`run_sweep` produced."""

    settings: list[Setting]
    reference: Setting
    per_query: dict[str, dict[str, dict[str, dict[str, np.ndarray]]]]
    rows: list[dict[str, Any]]
    stages: dict[str, list[Any]] = field(default_factory=dict)
    files: dict[str, Path] = field(default_factory=dict)
    design: str = "full"


def parse_value(text: str) -> Any:
    """A grid value as YAML reads it (``0.1`` and ``1e-2`` floats, ``4`` int, ``null``, ``true``,
    strings), by treerank's one YAML rule (:func:`treerank.config.parse_yaml`, YAML 1.2 floats)."""
    return parse_yaml(text) if text.strip() else ""


def parse_grid(items: Sequence[str]) -> dict[str, list[Any]]:
    """``["a.b=1,2", "c=x,y"]`` -> ``{"a.b": [1, 2], "c": ["x", "y"]}``.

    Raises:
        ValueError: an item without ``=`` or without values, or a key given twice.
    """
    grid: dict[str, list[Any]] = {}
    for item in items:
        key, sep, vals = item.partition("=")
        key = key.strip()
        if not sep or not key or not vals.strip():
            raise ValueError(f"bad --grid {item!r}: expected key.path=value1,value2,...")
        if key in grid:
            raise ValueError(f"--grid {key!r} given twice")
        grid[key] = [parse_value(v) for v in vals.split(",")]
    return grid


def _step(node: Any, part: str, where: str) -> Any:
    if isinstance(node, list):
        if not part.isdigit() or int(part) >= len(node):
            raise ConfigError(f"{where}: {part!r} is not an index of a {len(node)}-item list")
        return node[int(part)]
    if not isinstance(node, dict) or part not in node:
        known = ", ".join(map(str, node)) if isinstance(node, dict) else type(node).__name__
        raise ConfigError(f"{where}: no key {part!r} (there: {known})")
    return node[part]


def set_path(raw: dict[str, Any], path: str, value: Any, where: str = "sweep") -> None:
    """Set ``raw[a][b][c] = value`` for ``path = "a.b.c"`` (digits index lists).

    Every parent must exist (the leaf may be new: the experiment's strict validation then
    accepts or rejects it with the file and key path).

    Raises:
        ConfigError: a missing parent key or a bad list index (naming the path).
    """
    parts = path.split(".")
    node: Any = raw
    for i, part in enumerate(parts[:-1]):
        node = _step(node, part, f"{where}: {'.'.join(parts[: i + 1])}")
    leaf = parts[-1]
    if isinstance(node, list):
        if not leaf.isdigit() or int(leaf) >= len(node):
            raise ConfigError(f"{where}: {path}: {leaf!r} is not an index of the list")
        node[int(leaf)] = value
    elif isinstance(node, dict):
        node[leaf] = value
    else:
        raise ConfigError(f"{where}: {path}: the parent is a {type(node).__name__}, not a mapping")


def settings_of(grid: Mapping[str, Sequence[Any]], design: str = "full") -> list[Setting]:
    """The settings of the grid, in order (the last key varies fastest).

    Args:
        grid: key path -> its values.
        design: ``"full"``, the Cartesian product; ``"half"``, the half fraction ``2^(k-1)`` of a
            two-level factorial with defining relation ``I = AB...K`` (Box, Hunter & Hunter,
            *Statistics for Experimenters*, 2nd ed., ch. 6): the settings with an even number
            of keys at their second value. With ``k >= 4`` keys every main effect is estimable
            free of two-factor interactions (resolution ``k``); the first setting (every key at
            its first value) is kept. Setting names keep their index in the full product.

    Raises:
        ValueError: an unknown design, or ``half`` with fewer than 3 keys or a key that does
            not have exactly two values.
    """
    if design not in DESIGNS:
        raise ValueError(f"unknown sweep design {design!r}; known: {', '.join(DESIGNS)}")
    keys = list(grid)
    if design == "half":
        if len(keys) < 3:
            raise ValueError(
                f"design half needs at least 3 keys (with {len(keys)} the half fraction "
                "confounds main effects with each other); use design full"
            )
        bad = [k for k in keys if len(grid[k]) != 2]
        if bad:
            raise ValueError(
                f"design half needs exactly two values per key; {', '.join(bad)} "
                f"{'has' if len(bad) == 1 else 'have'} {', '.join(str(len(grid[k])) for k in bad)}"
            )
    out = []
    levels = itertools.product(*(range(len(grid[k])) for k in keys))
    for i, idx in enumerate(levels):
        if design == "half" and sum(idx) % 2:
            continue
        values = {k: grid[k][j] for k, j in zip(keys, idx, strict=True)}
        name = "-".join(f"{k.split('.')[-1]}={v}" for k, v in values.items())
        out.append(Setting(values, f"s{i:02d}-" + re.sub(r"[^A-Za-z0-9_.=-]+", "_", name)))
    return out


def split_sweep_section(raw: dict[str, Any], src: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(experiment without its sweep: section, the section)``.

    Raises:
        ConfigError: unknown keys in ``sweep:``.
    """
    raw = copy.deepcopy(raw)
    sec = raw.pop("sweep", None) or {}
    if not isinstance(sec, dict):
        raise ConfigError(f"{src}: sweep must be a mapping")
    unknown = sorted(set(sec) - set(SWEEP_KEYS))
    if unknown:
        raise ConfigError(
            f"{src}: unknown key(s) {', '.join(unknown)} in sweep; allowed: {', '.join(SWEEP_KEYS)}"
        )
    return raw, sec


def _absolute_paths(raw: dict[str, Any], base: Path) -> None:
    """Dataset paths and store roots (and a local encoder) relative to the source YAML, made
    absolute (each setting's YAML is written elsewhere)."""
    for ds in raw.get("datasets") or []:
        for key in ("path", "store"):
            if isinstance(ds, dict) and ds.get(key) and not Path(ds[key]).is_absolute():
                ds[key] = str((base / ds[key]).resolve())
    enc = raw.get("encoder") or {}
    model = enc.get("model") if isinstance(enc, dict) else None
    if isinstance(model, str) and not Path(model).is_absolute() and (base / model).exists():
        enc["model"] = str((base / model).resolve())


def read_per_query(eval_dir: Path, metrics: Sequence[str]) -> dict[str, dict[str, np.ndarray]]:
    """system -> metric -> ``float64 (n_queries,)`` from an evaluation's ``per_query.jsonl``
    (NaN = left out), in query order."""
    rows: dict[str, dict[str, list[float]]] = {}
    with open(eval_dir / "per_query.jsonl", encoding="utf-8") as fh:
        for line in fh:
            r = json.loads(line)
            d = rows.setdefault(r["system"], {m: [] for m in metrics})
            for m in metrics:
                v = r.get(m)
                d[m].append(np.nan if v is None else float(v))
    return {s: {m: np.asarray(v, np.float64) for m, v in d.items()} for s, d in rows.items()}


def sweep_table(
    settings: Sequence[Setting],
    reference: Setting,
    per_query: Mapping[str, Mapping[str, Mapping[str, Mapping[str, np.ndarray]]]],
    metrics: Sequence[str],
    systems: Sequence[str] | None = None,
    seed: int = 0,
) -> list[dict[str, Any]]:
    """The sweep's table as rows (a pure function of per-query values).

    Args:
        settings: the grid's settings; ``reference``: the one others are tested against.
        per_query: slug -> dataset -> system -> metric -> ``float64 (n_queries,)``.
        metrics: table metrics.
        systems: rows to keep (default: every system).
        seed: bootstrap / randomization seed.

    Returns:
        One dict per (setting, dataset, system): ``setting`` (slug), ``values``, ``dataset``,
        ``system`` and per metric ``{mean, ci_low, ci_high, delta, p}`` (``delta``/``p`` None for
        the reference setting or where the reference lacks the system).
    """
    from treerank.evaluation.significance import bootstrap_ci, randomization_test

    rows = []
    ref = per_query[reference.slug]
    for s in settings:
        for ds, by_sys in per_query[s.slug].items():
            for system, vals in by_sys.items():
                if systems and system not in systems:
                    continue
                row: dict[str, Any] = {
                    "setting": s.slug,
                    "values": s.values,
                    "dataset": ds,
                    "system": system,
                    "reference": s.slug == reference.slug,
                }
                for m in metrics:
                    v = vals[m]
                    ok = v[~np.isnan(v)]
                    lo, hi = bootstrap_ci(v, np.zeros_like(v), N_DRAWS, seed)
                    cell: dict[str, Any] = {
                        "mean": float(ok.mean()) if ok.size else None,
                        "ci_low": lo,
                        "ci_high": hi,
                        "n": int(ok.size),
                        "delta": None,
                        "p": None,
                    }
                    base = ref.get(ds, {}).get(system, {}).get(m)
                    if s.slug != reference.slug and base is not None and base.shape == v.shape:
                        keep = ~(np.isnan(v) | np.isnan(base))
                        cell["delta"] = float((v[keep] - base[keep]).mean()) if keep.any() else None
                        cell["p"] = randomization_test(v, base, N_DRAWS, seed)
                    row[m] = cell
                rows.append(row)
    return rows


def table_markdown(
    rows: Sequence[Mapping[str, Any]], keys: Sequence[str], metrics: Sequence[str]
) -> str:
    """The sweep table in markdown: swept values, dataset, system, per metric
    ``mean [95% CI]`` and ``delta (p)`` against the reference setting (``ref``)."""
    short = [k.split(".")[-1] for k in keys]
    head = short + ["dataset", "system"]
    for m in metrics:
        head += [f"{m} [95% CI]", f"Δ {m} (p)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    for r in rows:
        cells = [str(r["values"][k]) for k in keys] + [r["dataset"], r["system"]]
        for m in metrics:
            c = r[m]
            mean = "-" if c["mean"] is None else f"{c['mean']:.4f}"
            ci = "" if np.isnan(c["ci_low"]) else f" [{c['ci_low']:.4f}, {c['ci_high']:.4f}]"
            cells.append(mean + ci)
            if r["reference"]:
                cells.append("ref")
            elif c["delta"] is None:
                cells.append("-")
            else:
                star = "*" if c["p"] is not None and c["p"] < 0.05 else ""
                cells.append(f"{c['delta']:+.4f} ({c['p']:.3g}{star})")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def plot_key(
    rows: Sequence[Mapping[str, Any]], keys: Sequence[str], key: str, metric: str, path: Path
) -> Path:
    """PNG: ``metric`` (95% CI bars) against ``key``'s values; one line per (dataset, system,
    values of the other keys)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from treerank.atomic import atomic_savefig

    others = [k for k in keys if k != key]
    xs_all = list(dict.fromkeys(r["values"][key] for r in rows))
    pos = {v: i for i, v in enumerate(xs_all)}
    lines: dict[tuple[Any, ...], list[Mapping[str, Any]]] = {}
    for r in rows:
        label = (r["dataset"], r["system"], *(r["values"][k] for k in others))
        lines.setdefault(label, []).append(r)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for label, rs in lines.items():
        x = [pos[r["values"][key]] for r in rs]
        y = [r[metric]["mean"] for r in rs]
        err = [
            [r[metric]["mean"] - r[metric]["ci_low"] for r in rs],
            [r[metric]["ci_high"] - r[metric]["mean"] for r in rs],
        ]
        name = f"{label[0]}/{label[1]}" + "".join(
            f", {k.split('.')[-1]}={v}" for k, v in zip(others, label[2:], strict=True)
        )
        ax.errorbar(x, y, yerr=err, marker="o", capsize=3, label=name)
    ax.set_xticks(range(len(xs_all)), [str(v) for v in xs_all])
    ax.set_xlabel(key)
    ax.set_ylabel(f"mean {metric} (95% CI)")
    ax.set_title(f"sweep over {key.split('.')[-1]}")
    ax.legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.grid(alpha=0.3)
    try:
        return atomic_savefig(fig, path, bbox_inches="tight")
    finally:
        plt.close(fig)


def run_sweep(
    path: str | Path,
    grid: Sequence[str] = (),
    *,
    out: str | Path | None = None,
    reference: Mapping[str, Any] | None = None,
    systems: Sequence[str] | None = None,
    quick: bool = False,
    force: bool = False,
    progress: bool = True,
    log: Callable[[str], None] = print,
) -> SweepResult:
    """Run every setting of the grid incrementally and write the sweep table and plots.

    Args:
        path: the experiment YAML (optionally with a ``sweep:`` section, see module doc).
        grid: ``key.path=v1,v2`` items (added to the section's grid, replacing equal keys).
        out: output directory (default: the experiment's ``output_dir`` + ``-sweep``).
        reference: key path -> value of the reference setting (default: the section's, else the
            first setting); every key of the grid must be given.
        systems: table rows (default: the section's, else every system).
        quick, force, progress, log: as for :func:`run_experiment`.

    Raises:
        FileNotFoundError: ``path`` does not exist.
        ConfigError: malformed sweep section or grid key path, an empty grid, a reference that
            is not a setting of the grid, or a setting the experiment validation rejects.
    """
    from treerank.pipeline.config import load_experiment
    from treerank.pipeline.experiment import run_experiment

    src = Path(path)
    if not src.is_file():
        raise FileNotFoundError(f"{src}: experiment file not found")
    try:
        raw_all = parse_yaml(src.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"{src}: not valid YAML ({exc})") from exc
    raw, sec = split_sweep_section(raw_all, src)
    full_grid: dict[str, list[Any]] = {k: list(v) for k, v in (sec.get("grid") or {}).items()}
    try:
        full_grid.update(parse_grid(grid))
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc
    if not full_grid or any(not v for v in full_grid.values()):
        raise ConfigError(f"{src}: the sweep grid is empty (give --grid key.path=v1,v2)")
    design = str(sec.get("design") or "full")
    try:
        settings = settings_of(full_grid, design)
    except ValueError as exc:
        raise ConfigError(f"{src}: sweep: {exc}") from exc
    ref_values = dict(reference or sec.get("reference") or settings[0].values)
    matches = [s for s in settings if s.values == ref_values]
    if not matches:
        where = "the grid" if design == "full" else f"the {design} fraction of the grid"
        raise ConfigError(f"{src}: reference {ref_values} is not a setting of {where} {full_grid}")
    systems = list(systems or sec.get("systems") or [])
    _absolute_paths(raw, src.parent.resolve())
    _check_settings(raw, settings, src, quick)
    name = str(raw.get("name") or src.stem)
    root = (
        Path(out) if out is not None else Path(f"{raw.get('output_dir') or 'runs/' + name}-sweep")
    )
    cache = root / "cache"
    per_query: dict[str, dict[str, dict[str, dict[str, np.ndarray]]]] = {}
    stages: dict[str, list[Any]] = {}
    metrics: list[str] = []
    for i, s in enumerate(settings):
        log(f"[sweep] setting {i + 1}/{len(settings)}: {s.values}")
        cfg_raw = copy.deepcopy(raw)
        for k, v in s.values.items():
            set_path(cfg_raw, k, v, where=str(src))
        sdir = root / "settings" / s.slug
        sdir.mkdir(parents=True, exist_ok=True)
        yml = sdir / "experiment.yaml"
        yml.write_text(yaml.safe_dump(cfg_raw, sort_keys=False), encoding="utf-8")
        cfg = load_experiment(yml, quick=quick, output_dir=sdir)
        metrics = list(cfg.evaluate.metrics)
        res = run_experiment(
            cfg, quick=quick, force=force, progress=progress, log=log, stage_cache=cache
        )
        stages[s.slug] = res.stages
        per_query[s.slug] = {
            ds: read_per_query(Path(o.eval_dir), metrics)
            for ds, o in res.datasets.items()
            if o.eval_dir is not None
        }
    ref = matches[0]
    rows = sweep_table(settings, ref, per_query, metrics, systems or None)
    result = SweepResult(settings, ref, per_query, rows, stages, design=design)
    result.files = write_sweep(root, result, list(full_grid), metrics, sec.get("metric"))
    log(f"[sweep] {result.files['table']}")
    return result


def _check_settings(
    raw: dict[str, Any], settings: Sequence[Setting], src: Path, quick: bool
) -> None:
    """Load and validate every setting's experiment (types, ranges, specs) before any setting
    runs, in a temporary directory (nothing is left behind when one fails).

    Raises:
        ConfigError: the first setting that fails, named by its values and the key path.
    """
    import tempfile

    from treerank.pipeline.config import load_experiment
    from treerank.pipeline.validate import validate_experiment

    with tempfile.TemporaryDirectory(prefix="treerank-sweep-check-") as tmp:
        for s in settings:
            cfg_raw = copy.deepcopy(raw)
            for k, v in s.values.items():
                set_path(cfg_raw, k, v, where=str(src))
            yml = Path(tmp) / f"{s.slug}.yaml"
            yml.write_text(yaml.safe_dump(cfg_raw, sort_keys=False), encoding="utf-8")
            try:
                validate_experiment(load_experiment(yml, quick=quick, output_dir=Path(tmp) / "o"))
            except ConfigError as exc:
                text = str(exc).replace(str(yml.resolve()), str(src)).replace(str(yml), str(src))
                raise ConfigError(f"sweep setting {s.values}: {text}") from None


def _design_note(design: str, keys: Sequence[str]) -> str:
    if design != "half":
        return ""
    letters = "".join(chr(ord("A") + i) for i in range(len(keys)))
    return (
        f" (half fraction 2^({len(keys)}-1), defining relation I = {letters}: every main effect "
        f"is aliased with a {len(keys) - 1}-factor interaction; setting names keep their index in "
        "the full grid)"
    )


def write_sweep(
    root: Path,
    result: SweepResult,
    keys: Sequence[str],
    metrics: Sequence[str],
    plot_metric: str | None = None,
) -> dict[str, Path]:
    """``sweep.md``, ``sweep.json`` and ``plots/<key>.png`` under ``root``."""
    from treerank.evaluation.report import atomic_write_text, write_json

    metric = plot_metric or headline_metric(metrics)
    files: dict[str, Path] = {}
    ref = ", ".join(f"{k} = {v}" for k, v in result.reference.values.items())
    md = [
        "# treerank sweep",
        "",
        f"{len(result.settings)} settings over {', '.join(f'`{k}`' for k in keys)}"
        f"{_design_note(result.design, keys)}; reference setting: {ref}. Mean with its 95% "
        "bootstrap CI over queries; Δ = paired "
        "mean difference against the reference setting (same dataset and system), p = paired "
        f"randomization test ({N_DRAWS:,} draws, seed 0; * p < 0.05). Each setting's full "
        "report: `settings/<slug>/report.md`.",
        "",
        table_markdown(result.rows, keys, metrics),
    ]
    for k in keys:
        p = plot_key(result.rows, keys, k, metric, root / "plots" / f"{_safe(k)}.png")
        files[f"plot:{k}"] = p
        md.append(f"![{metric} vs {k}](plots/{p.name})")
    files["table"] = atomic_write_text(root / "sweep.md", "\n".join(md) + "\n")
    files["json"] = write_json(
        root / "sweep.json",
        {
            "keys": list(keys),
            "design": result.design,
            "metrics": list(metrics),
            "reference": result.reference.values,
            "settings": [{"slug": s.slug, "values": s.values} for s in result.settings],
            "rows": result.rows,
            "stages": {
                slug: [{"stage": r.name, "reused": r.reused, "key": r.key} for r in recs]
                for slug, recs in result.stages.items()
            },
        },
    )
    return files


def _safe(key: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.=-]+", "_", key)
