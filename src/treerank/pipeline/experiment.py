"""``treerank run``: one experiment from raw data to a comparison report.

Stages, each incremental (reused when its inputs' fingerprints match, see
:mod:`treerank.pipeline.stages`) and each a thin call of the same library function that its own
command uses, so the report's numbers are exactly what ``treerank embed / train / evaluate /
diagnose`` print:

1. ``embed:<dataset>:<split>`` -> ``<out>/stores/<dataset>/<split>/`` (:func:`embed_split`,
   resumable; the test split reuses the train split's passage vectors when texts match)
2. ``train:<dataset>:<model name>`` -> ``<out>/models/<dataset>/<model name>/checkpoint``
   (:func:`train_model` with the model's family; several models of one family can coexist)
3. ``evaluate:<dataset>`` -> ``<out>/eval/<dataset>/`` (:func:`compare_systems`: every system on
   every passage of the evaluation split, paired tests against the baselines)
4. ``diagnose:<dataset>`` -> ``<out>/diagnose/<dataset>/`` (:func:`run_diagnostics`)
5. the report -> ``<out>/report.md`` + ``<out>/report.json`` (always rewritten; cheap)
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from treerank.lock import writes_dir
from treerank.pipeline.config import DatasetConfig, ExperimentConfig, ModelSpec
from treerank.pipeline.stages import (
    StageRecord,
    file_sha256,
    fingerprint,
    run_stage,
    skip_stage,
)
from treerank.store.format import FORMAT_VERSION as STORE_FORMAT_VERSION

# What the evaluate stage writes besides the comparison (part of its key: a new output re-runs it).
EVALUATE_OUTPUTS = ("overlap", "lexical_gap:v1", "fusion_tuning:v1")


@dataclass
class DatasetOutcome:
    """Everything the run produced for one dataset."""

    name: str
    eval_split: str
    store: Path
    train_store: Path | None = None
    dim: int | None = None
    checkpoints: dict[str, Path] = field(default_factory=dict)
    training: dict[str, dict[str, Any]] = field(default_factory=dict)
    comparison: dict[str, Any] = field(default_factory=dict)
    comparison_markdown: str = ""
    eval_dir: Path | None = None
    overlap: dict[str, Any] | None = None
    family_reports: dict[str, dict[str, Any]] = field(default_factory=dict)
    overlap_markdown: str = ""
    lexical_gap: dict[str, Any] | None = None
    lexical_gap_markdown: str = ""
    diagnostics: dict[str, Any] | None = None
    diagnose_dir: Path | None = None
    store_stats: dict[str, dict[str, Any]] = field(default_factory=dict)


@dataclass
class ExperimentResult:
    """The outcome of :func:`run_experiment`: per-dataset results, stage records, report paths."""

    config: ExperimentConfig
    quick: bool
    datasets: dict[str, DatasetOutcome]
    stages: list[StageRecord]
    encoder: dict[str, Any]
    seconds: float
    report_md: Path
    report_json: Path


class _Encoder:
    """Loads the sentence-transformers model only when a stage really has to encode."""

    def __init__(self, cfg: ExperimentConfig) -> None:
        self.cfg = cfg
        self._enc: Any = None

    def key(self) -> dict[str, Any]:
        """What identifies the encoder without loading it: its weights' bytes where local."""
        from treerank.encoders.sentence import default_model_path

        model = self.cfg.encoder.model
        path = Path(default_model_path() if model is None else model)
        ident = file_sha256(path) if path.exists() else str(model)
        return {
            "model": model or "default",
            "weights": ident,
            "query_prompt": self.cfg.encoder.query_prompt,
            "token_budget": self.cfg.encoder.token_budget,
        }

    def get(self) -> Any:
        if self._enc is None:
            from treerank.encoders import SentenceEncoder

            self._enc = SentenceEncoder(
                self.cfg.encoder.model,
                query_prompt=self.cfg.encoder.query_prompt,
                token_budget=self.cfg.encoder.token_budget,
            )
        return self._enc


@dataclass
class _Run:
    """What every stage of one ``run_experiment`` call shares."""

    cfg: ExperimentConfig
    force: bool
    progress: bool
    log: Callable[[str], None]
    stage_keys: dict[str, str] = field(default_factory=dict)
    records: list[StageRecord] = field(default_factory=list)
    stage_cache: Path | None = None

    def stage(
        self,
        name: str,
        key: str,
        path: Path,
        work: Callable[[Path], dict[str, Any] | None],
        *,
        in_place: bool = False,
    ) -> StageRecord:
        """:func:`run_stage` with this run's settings; the record is kept in ``records``.

        With a ``stage_cache`` (sweeps) the stage lives in ``<cache>/<name>-<key>`` and ``path``
        becomes a relative symlink to it, so equal stages of several runs are computed once.
        """
        if self.stage_cache is None:
            rec = run_stage(
                name, key, path, work, force=self.force, in_place=in_place, log=self.log
            )
        else:
            phys = self.stage_cache / f"{re.sub(r'[^A-Za-z0-9_.-]+', '_', name)}-{key[:24]}"
            rec = run_stage(
                name, key, phys, work, force=self.force, in_place=in_place, log=self.log
            )
            _link(path, phys)
            rec.path = path
        self.records.append(rec)
        return rec

    def skip(self, name: str, reason: str, path: Path) -> StageRecord:
        """Record (and log) a stage that does nothing here, with the reason."""
        rec = skip_stage(name, reason, path, log=self.log)
        self.records.append(rec)
        return rec


def _link(path: Path, target: Path) -> None:
    """Make ``path`` a relative symlink to ``target`` (replacing an older link there).

    Raises:
        FileExistsError: ``path`` is a real file or directory (never overwritten).
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    rel = os.path.relpath(target.resolve(), path.parent.resolve())
    if path.is_symlink():
        if os.readlink(path) == rel:
            return
        path.unlink()
    elif path.exists():
        raise FileExistsError(f"{path}: exists and is not a stage-cache link; not overwritten")
    tmp = path.with_name(f".{path.name}.link-{os.getpid()}")
    tmp.unlink(missing_ok=True)
    os.symlink(rel, tmp)
    os.replace(tmp, path)


@writes_dir("cfg", "run", attr="output_dir")
def run_experiment(
    cfg: ExperimentConfig,
    *,
    quick: bool = False,
    force: bool = False,
    progress: bool = True,
    log: Callable[[str], None] = print,
    stage_cache: Path | None = None,
) -> ExperimentResult:
    """Run every stage of ``cfg`` (skipping those whose inputs are unchanged) and write the report.

    Args:
        cfg: a loaded experiment (:func:`treerank.pipeline.config.load_experiment`).
        quick: recorded in the report (the profile itself was merged when loading ``cfg``).
        force: re-run every stage even when it could be reused.
        progress: progress bars inside stages.
        log: where stage lines go.
        stage_cache: keep every stage in this content-addressed directory and link it into
            ``cfg.output_dir`` (:mod:`treerank.pipeline.sweep` shares stages across settings).

    Raises:
        ConfigError: the experiment is invalid (every problem listed with its key path);
            raised before anything is written.
        StageError: a stage failed; it names the stage and the cause. Every stage finished
            before it (and that stage's own earlier result) stays intact on disk.
    """
    from treerank.pipeline.validate import validate_experiment

    validate_experiment(cfg)  # every problem, before any stage writes anything
    t0 = time.perf_counter()
    out = cfg.output_dir
    out.mkdir(parents=True, exist_ok=True)
    encoder = _Encoder(cfg)
    enc_key = encoder.key()
    run = _Run(cfg, force, progress, log, stage_cache=stage_cache)
    outcomes: dict[str, DatasetOutcome] = {}

    for ds in cfg.datasets:
        splits = list(dict.fromkeys(s for s in (ds.train_split, ds.eval_split) if s))
        if ds.store is not None:  # an existing store root, used as is
            root = ds.store
            stats = {split: _existing_store(run, ds, split) for split in splits}
        else:
            root = out / "stores" / ds.name
            assert ds.path is not None  # load_experiment: a dataset has `store` or `path`
            data_sha = file_sha256(ds.path)
            for split in splits:
                rec = _embed_stage(run, ds, split, data_sha, enc_key, encoder)
                run.stage_keys[f"store:{ds.name}:{split}"] = rec.key
            stats = {
                r.name.split(":")[-1]: r.summary
                for r in run.records
                if r.name.startswith(f"embed:{ds.name}:")
            }
        outcomes[ds.name] = DatasetOutcome(
            name=ds.name,
            eval_split=ds.eval_split,
            store=root / ds.eval_split,
            train_store=(root / ds.train_split) if ds.train_split else None,
            dim=ds.dim,
            store_stats=stats,
        )
        if cfg.models and not ds.train_split:
            run.skip(
                f"train:{ds.name}",
                f"no train_split: {', '.join(cfg.models)} not trained here; baselines only",
                out / "models" / ds.name,
            )
        if ds.train_split:
            for spec in cfg.models.values():
                if ds.models is not None and spec.name not in ds.models:
                    continue
                for run_name, config in spec.runs().items():
                    rec = _train_stage(run, ds, spec, run_name, config)
                    run.stage_keys[f"model:{ds.name}:{run_name}"] = rec.key
                    outcomes[ds.name].checkpoints[run_name] = rec.path / "checkpoint"
                    outcomes[ds.name].training[run_name] = rec.summary

    for ds in cfg.datasets:
        o = outcomes[ds.name]
        systems = _systems_for(cfg, ds, outcomes)
        rec = _evaluate_stage(run, ds, o, systems)
        o.eval_dir = rec.path
        o.comparison = rec.summary.get("comparison", {})
        o.comparison_markdown = rec.summary.get("markdown", "")
        o.overlap = rec.summary.get("overlap")
        o.family_reports = rec.summary.get("family_reports") or {}
        o.overlap_markdown = rec.summary.get("overlap_markdown", "")
        wanted = dmodel = cfg.diagnose.model
        if dmodel in cfg.models and cfg.models[dmodel].seeds:  # the first seed's checkpoint
            dmodel = next(iter(cfg.models[dmodel].runs()))
        o.lexical_gap = rec.summary.get("lexical_gap")
        o.lexical_gap_markdown = rec.summary.get("lexical_gap_markdown", "")
        if dmodel and dmodel in o.checkpoints:
            rec = _diagnose_stage(run, ds, o, dmodel)
            o.diagnose_dir = rec.path
            o.diagnostics = rec.summary
        else:
            why = (
                "no diagnose.model given"
                if not dmodel
                else f"{wanted!r} is not trained on this dataset (no train_split)"
            )
            run.skip(f"diagnose:{ds.name}", why, out / "diagnose" / ds.name)

    from treerank.pipeline.report import write_report

    seconds = time.perf_counter() - t0
    enc_meta = _encoder_meta(outcomes)
    md, js = write_report(cfg, quick, outcomes, run.records, enc_meta, seconds)
    log(f"[report] {md}")
    return ExperimentResult(cfg, quick, outcomes, run.records, enc_meta, seconds, md, js)


# ----------------------------------------------------------------------------- stages


def _embed_stage(
    run: _Run,
    ds: DatasetConfig,
    split: str,
    data_sha: str,
    enc_key: dict[str, Any],
    encoder: _Encoder,
) -> StageRecord:
    path = run.cfg.output_dir / "stores" / ds.name / split
    key = fingerprint(
        "embed",
        STORE_FORMAT_VERSION,
        _version("treerank"),
        data_sha,
        ds.format,
        split,
        ds.limit,
        ds.max_passages,
        enc_key,
    )

    def work(d: Path) -> dict[str, Any]:
        from treerank.store.dataset import embed_dataset

        assert ds.path is not None and ds.format is not None

        def on_read(name: str, data: Any, main: bool) -> None:
            for w in data.warnings() if data is not None else []:
                run.log(f"[warn]  embed:{ds.name}:{name}: {w}")

        # resume continues an interrupted run of the same inputs (byte-identical result); a
        # finished store of other inputs is replaced; passages already encoded by the same
        # encoder in a sibling split are reused, as `treerank embed` does
        (done,) = embed_dataset(
            ds.path,
            d.parent,
            lambda _device: encoder.get(),
            fmt=ds.format,
            splits=[split],
            limit=ds.limit,
            max_passages=ds.max_passages,
            resume=not run.force,
            overwrite=run.force,
            replace_stale=True,
            progress=run.progress,
            split_dir=lambda _split: d,
            on_read=on_read,
        )
        return done.summary()

    return run.stage(f"embed:{ds.name}:{split}", key, path, work, in_place=True)


def _existing_store(run: _Run, ds: DatasetConfig, split: str) -> dict[str, Any]:
    """Key and statistics of a split of a dataset's existing store (``datasets[].store``).

    The key covers every file's name, size and modification time, so a changed store re-runs
    the stages that read it. Derived caches the stages themselves write beside the split (mined
    negatives and teacher rankings under ``arrays/``, FAISS indexes under ``indexes/``) are left
    out: a training stage that mines negatives must not change the key of every later run.
    """
    from treerank.search.faiss_index import INDEXES_DIR
    from treerank.store import EmbeddingStore
    from treerank.store.format import ARRAYS_DIR

    assert ds.store is not None
    path = ds.store / split
    st = EmbeddingStore.open(path, dim=ds.dim)
    files = sorted(
        (str(p.relative_to(path)), p.stat().st_size, p.stat().st_mtime_ns)
        for p in path.rglob("*")
        if p.is_file()
        and p.name != "stage.json"
        and p.relative_to(path).parts[0] not in (ARRAYS_DIR, INDEXES_DIR)
    )
    run.stage_keys[f"store:{ds.name}:{split}"] = fingerprint("store", str(path), ds.dim, files)
    return {"n_queries": st.n_queries, "n_passages": st.n_passages, "k": st.k, "store": str(path)}


def _store_dir(run: _Run, ds: DatasetConfig, split: str) -> Path:
    root = ds.store if ds.store is not None else run.cfg.output_dir / "stores" / ds.name
    return root / split


def _resolved_config(spec: ModelSpec, config: dict[str, Any], source: Any) -> dict[str, Any]:
    """The training config with every default filled in (part of the train stage's key).

    The YAML alone is not enough: a changed default (e.g. ``validation.group_by_passage``)
    must re-run the stages it affects instead of silently reusing a model trained under the
    old one.
    """
    from treerank.models.families import family

    return family(spec.family).resolved_config(config, f"{source}: models.{spec.name}")


def _train_stage(
    run: _Run, ds: DatasetConfig, spec: ModelSpec, run_name: str, config: dict[str, Any]
) -> StageRecord:
    """Train ``spec`` with ``config`` (one seed's, for a seeded model) as ``run_name``."""
    assert ds.train_split is not None
    store_dir = _store_dir(run, ds, ds.train_split)
    path = run.cfg.output_dir / "models" / ds.name / run_name
    key = fingerprint(
        "train",
        _version("treerank"),
        run.stage_keys[f"store:{ds.name}:{ds.train_split}"],
        spec.family,
        config,
        _resolved_config(spec, config, run.cfg.source),
    )

    def work(d: Path) -> dict[str, Any]:
        from treerank.pipeline.training import train_model
        from treerank.store import EmbeddingStore

        (d / "config.yaml").write_text(
            yaml.safe_dump({"family": spec.family, **config}, sort_keys=True)
        )
        res = train_model(
            spec.family,
            EmbeddingStore.open(store_dir, dim=ds.dim),
            config,
            d / "checkpoint",
            progress=run.progress,
            where=f"{run.cfg.source}: models.{spec.name}",
        )
        return {"family": spec.family, "summary": _jsonable(res.summary)}

    return run.stage(f"train:{ds.name}:{run_name}", key, path, work)


def _systems_for(
    cfg: ExperimentConfig, ds: DatasetConfig, outcomes: dict[str, DatasetOutcome]
) -> dict[str, str]:
    """System name -> spec for one dataset: the configured specs + every model trained on it."""
    specs = ds.systems if ds.systems is not None else cfg.systems
    systems = {s: s for s in specs}
    for model_name, ckpt in outcomes[ds.name].checkpoints.items():
        systems[model_name] = f"ckpt:{ckpt}"
    if cfg.transfer:  # every model trained elsewhere, zero-shot on this dataset
        for other, o in outcomes.items():
            if other != ds.name:
                for model_name, ckpt in o.checkpoints.items():
                    systems[f"{model_name}@{other}"] = f"ckpt:{ckpt}"
    for base in cfg.evaluate.baselines:
        systems.setdefault(base, base)
    return systems


def _seed_groups(cfg: ExperimentConfig, systems: dict[str, str]) -> dict[str, dict[str, int]]:
    """Seeded model -> {its seeds' system names: seed}, for those evaluated here."""
    groups = {}
    # "" on the training dataset; "@<dataset>" for models trained elsewhere (transfer: true)
    suffixes = ["", *(f"@{ds.name}" for ds in cfg.datasets)]
    for spec in cfg.models.values():
        if not spec.seeds:
            continue
        for suffix in suffixes:
            runs = {f"{r}{suffix}": s for r, s in zip(spec.runs(), spec.seeds, strict=True)}
            if all(r in systems for r in runs):
                groups[f"{spec.name}{suffix}"] = runs
    return groups


def _evaluate_stage(
    run: _Run,
    ds: DatasetConfig,
    o: DatasetOutcome,
    systems: dict[str, str],
) -> StageRecord:
    path = run.cfg.output_dir / "eval" / ds.name
    deps = {
        name: run.stage_keys.get(
            f"model:{name.split('@')[1]}:{name.split('@')[0]}"
            if "@" in name
            else f"model:{ds.name}:{name}",
            spec,
        )
        for name, spec in systems.items()
    }
    ev = run.cfg.evaluate
    key = fingerprint(
        "evaluate",
        _version("treerank"),
        run.stage_keys[f"store:{ds.name}:{ds.eval_split}"],
        deps,
        ev.k,
        ev.baselines,
        ev.metrics,
        ev.seed,
        EVALUATE_OUTPUTS,
    )

    def work(d: Path) -> dict[str, Any]:
        from treerank.evaluation.compare import compare_systems
        from treerank.search.systems import build_system
        from treerank.store import EmbeddingStore

        store = EmbeddingStore.open(o.store, dim=o.dim)
        # Built here (not from the spec strings inside compare_systems) so that the trained
        # models' systems can be asked for their family's report afterwards.
        cache: dict[str, Any] = {}
        built = {n: build_system(spec, cache, progress=run.progress) for n, spec in systems.items()}
        comp = compare_systems(
            store,
            built,
            baseline=ev.baselines[0],
            second_baseline=ev.baselines[1] if len(ev.baselines) > 1 else None,
            k=ev.k,
            out_dir=d,
            metrics=tuple(ev.metrics),
            seed=ev.seed,
            progress=run.progress,
            train_store=(EmbeddingStore.open(o.train_store, dim=o.dim) if o.train_store else None),
            seed_groups=_seed_groups(run.cfg, systems),
        )
        summary: dict[str, Any] = {
            "comparison": _jsonable(comp.to_dict()),
            "markdown": comp.markdown(),
        }
        reports = family_reports(built, store)
        if reports:
            summary["family_reports"] = _jsonable(reports)
        if comp.overlap is not None:  # written to overlap.json by compare_systems
            from treerank.evaluation.overlap import overlap_markdown

            metric = "ndcg@10" if "ndcg@10" in ev.metrics else ev.metrics[0]
            summary["overlap"] = _jsonable(comp.overlap)
            summary["overlap_markdown"] = overlap_markdown(comp.overlap, metric, ev.baselines[0])
        summary.update(_lexical_gap(store, comp, ev.metrics, d))
        return summary

    return run.stage(f"evaluate:{ds.name}", key, path, work)


def _lexical_gap(store: Any, comp: Any, metrics: list[str], d: Path) -> dict[str, Any]:
    """The lexical-gap breakdown of every system (:mod:`treerank.diagnostics.lexical_gap`)."""
    from treerank.diagnostics.lexical_gap import (
        lexical_gap,
        lexical_gap_markdown,
        plot_lexical_gap,
        store_coverage,
    )
    from treerank.store import StoreFormatError

    metric = "ndcg@10" if "ndcg@10" in metrics else metrics[0]
    per_query = {s: r.per_query for s, r in comp.results.items()}
    try:
        coverage = store_coverage(store)
    except StoreFormatError:  # a store without text tables (Go-tool layout): no lexical gap
        return {}
    doc = lexical_gap(coverage, per_query, metric)
    (d / "lexical_gap.json").write_text(json.dumps(_jsonable(doc), indent=2))
    plot_lexical_gap(doc, d / "plots" / "lexical_gap.png")
    return {"lexical_gap": _jsonable(doc), "lexical_gap_markdown": lexical_gap_markdown(doc)}


def _diagnose_stage(
    run: _Run,
    ds: DatasetConfig,
    o: DatasetOutcome,
    model_name: str,
) -> StageRecord:
    path = run.cfg.output_dir / "diagnose" / ds.name
    key = fingerprint(
        "diagnose",
        _version("treerank"),
        run.stage_keys[f"store:{ds.name}:{ds.eval_split}"],
        run.stage_keys[f"model:{ds.name}:{model_name}"],
        run.cfg.diagnose.baseline,
        run.cfg.evaluate.k,
    )

    def work(d: Path) -> dict[str, Any]:
        from treerank.diagnostics.procedure import run_diagnostics
        from treerank.store import EmbeddingStore

        doc = run_diagnostics(
            o.checkpoints[model_name],
            EmbeddingStore.open(o.store, dim=o.dim),
            d,
            baseline=run.cfg.diagnose.baseline,
            k=run.cfg.evaluate.k,
            progress=run.progress,
        )
        return _jsonable(doc)

    return run.stage(f"diagnose:{ds.name}", key, path, work)


# ----------------------------------------------------------------------------- helpers


def family_reports(systems: dict[str, Any], store: Any) -> dict[str, dict[str, Any]]:
    """Each model family's part of the report, for the checkpoint systems that ran on ``store``.

    Returns:
        family name -> the family's ``report`` hook output (``{"stats", "markdown"}``), for the
        families that have a hook.
    """
    from treerank.models.families import family, resolve
    from treerank.search.systems import CheckpointSystem

    groups: dict[str, dict[str, Any]] = {}
    for name, system in systems.items():
        if isinstance(system, CheckpointSystem):
            fam = system.family_for(store)
            if fam.report is not None:
                groups.setdefault(fam.name, {})[name] = system.system_for(store)
    return {f: resolve(family(f).report)(group) for f, group in groups.items()}


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def _jsonable(doc: Any) -> Any:
    return json.loads(json.dumps(doc, default=str))


def _encoder_meta(outcomes: dict[str, DatasetOutcome]) -> dict[str, Any]:
    """Encoder name and fingerprint as recorded by the stores (all must agree)."""
    from treerank.store import EmbeddingStore

    seen: dict[str, Any] = {}
    for o in outcomes.values():
        s = EmbeddingStore.open(o.store, dim=o.dim)
        seen[str(s.encoder_fingerprint)] = {
            "name": s.encoder_name,
            "fingerprint": s.encoder_fingerprint,
            "query_prompt": s.meta.get("query_prompt"),
            "dim": s.dim,
        }
    if len(seen) != 1:
        raise RuntimeError(
            f"stores were embedded with {len(seen)} different encoders: {list(seen)}"
        )
    return next(iter(seen.values()))
