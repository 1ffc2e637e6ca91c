"""``treerank run``: one experiment from raw data to a comparison report.

The run is a graph of stages (:class:`StageGraph`), each identified by a typed
:class:`~treerank.pipeline.identity.StageId` and incremental: its key is a fingerprint of its own
inputs and of the keys of the stages whose outputs it reads (its declared edges), and a stage
whose key matches a finished one is reused (see :mod:`treerank.pipeline.stages`). Every stage is
a thin call of the same library function its own command uses, so the report's numbers are
exactly what ``treerank embed / train / evaluate / diagnose`` print:

1. ``embed:<dataset>:<split>`` -> ``<out>/stores/<dataset>/<split>/`` (:func:`embed_split`,
   resumable; the test split reuses the train split's passage vectors when texts match)
2. ``train:<dataset>:<run>`` -> ``<out>/models/<dataset>/<run>/checkpoint``
   (:func:`train_model` with the model's family; one run per seed of a seeded model); reads the
   train split's embed stage
3. ``evaluate:<dataset>`` -> ``<out>/eval/<dataset>/`` (:func:`compare_systems`: every system on
   every passage of the evaluation split, paired tests against the baselines); reads the
   dataset's embed stages and the train stage of every run it evaluates (transfer included)
4. ``diagnose:<dataset>`` -> ``<out>/diagnose/<dataset>/`` (:func:`run_diagnostics`); reads
   the evaluation split's embed stage and the diagnosed run's train stage
5. the report -> ``<out>/report.md`` + ``<out>/report.json`` (always rewritten; cheap)

``docs/DESIGN.md`` ("The stage graph") lists every stage's edges and key inputs;
:func:`plan_experiment` builds the graph without running anything.
"""

from __future__ import annotations

import importlib.metadata
import inspect
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from treerank.evaluation.metrics import headline_metric
from treerank.faults import crash_point
from treerank.kernels.device import Device
from treerank.lock import writes_dir
from treerank.pipeline.config import (
    DatasetConfig,
    ExperimentConfig,
    ModelSpec,
)
from treerank.pipeline.identity import (
    RunId,
    StageId,
    SystemId,
    UnknownDependencyError,
    dataset_dir,
)
from treerank.pipeline.stages import (
    DIGESTS_FILE,
    StageRecord,
    content_digests,
    file_sha256,
    fingerprint,
    run_stage,
    skip_stage,
)
from treerank.store.format import FORMAT_VERSION as STORE_FORMAT_VERSION
from treerank.storelike import StoreLike

# What the evaluate stage writes besides the comparison (part of its key: a new output re-runs it).
EVALUATE_OUTPUTS = ("overlap", "lexical_gap:v1", "fusion_tuning:v1")


@dataclass
class DatasetOutcome:
    """Everything the run produced for one dataset.

    ``checkpoints`` / ``training`` / ``seeds`` are keyed by the run's name
    (:attr:`RunId.name`); ``runs`` holds the typed identities of the runs trained here.
    """

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
    runs: list[RunId] = field(default_factory=list)
    seeds: dict[str, int | None] = field(default_factory=dict)


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


# ----------------------------------------------------------------------------- library seam

# MERGE POINT (seam-pipeline): the one place where the experiment's ``device`` and
# ``encoder.backend`` reach library calls. A keyword is passed only where the called function
# declares it (``device=`` on trainers / compare_systems / run_diagnostics, ``backend=`` on
# SentenceEncoder, as other branches add them), so today's calls are unchanged; a value other
# than today's behaviour that the library cannot take yet is refused before any stage runs
# (:func:`check_library_support`, from ``validate_experiment``).
_TODAYS_BEHAVIOUR: dict[str, tuple[Any, ...]] = {
    "device": ("auto", "cpu"),
    "backend": ("torch",),
    "precision": ("fp32",),
}


def _library_kwargs(fn: Callable[..., Any], **wanted: Any) -> dict[str, Any]:
    """The items of ``wanted`` that ``fn`` declares as parameters.

    Raises:
        ValueError: a value that changes behaviour (``device: cuda``, ``backend: onnx``) for a
            function that does not take that parameter yet.
    """
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):  # builtins without a signature: pass nothing
        params = {}  # type: ignore[assignment]
    out: dict[str, Any] = {}
    for name, value in wanted.items():
        if name in params:
            out[name] = value
        elif value not in _TODAYS_BEHAVIOUR.get(name, (value,)):
            qual = getattr(fn, "__qualname__", repr(fn))
            raise ValueError(
                f"{name} {value!r} is not supported by {fn.__module__}.{qual} in this version "
                f"(it has no {name}= parameter); use {' or '.join(_TODAYS_BEHAVIOUR[name])}"
            )
    return out


def _library_functions() -> dict[str, Callable[..., Any]]:
    from treerank.diagnostics.procedure import run_diagnostics
    from treerank.encoders import SentenceEncoder
    from treerank.evaluation.compare import compare_systems
    from treerank.pipeline.training import train_model

    return {
        "encoder": SentenceEncoder,
        "train": train_model,
        "evaluate": compare_systems,
        "diagnose": run_diagnostics,
    }


def check_library_support(cfg: ExperimentConfig) -> list[str]:
    """Problems (``"<key>: <why>"``) with ``device`` / ``encoder.backend`` values that this
    version's library calls cannot take yet; empty when every stage can run as configured."""
    fns = _library_functions()
    problems = []
    wanted: dict[str, dict[str, Device | str]] = {
        "encoder": {
            "device": cfg.device,
            "backend": cfg.encoder.backend,
            "precision": cfg.encoder.precision,
        },
        "train": {"device": cfg.device},
        "evaluate": {"device": cfg.device},
        "diagnose": {"device": cfg.device},
    }
    for what, kw in wanted.items():
        for name, value in kw.items():
            if what == "encoder" and name == "device":
                continue  # SentenceEncoder has always taken device=
            try:
                _library_kwargs(fns[what], **{name: value})
            except ValueError as exc:
                key = f"encoder.{name}" if name in ("backend", "precision") else "device"
                problems.append(f"{key}: {exc}")
    return list(dict.fromkeys(problems))


class _Encoder:
    """Loads the sentence-transformers model only when a stage really has to encode."""

    def __init__(self, cfg: ExperimentConfig, progress: bool = True) -> None:
        self.cfg = cfg
        self.progress = progress  # False also hides transformers' "Loading weights" bar
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
            "backend": self.cfg.encoder.backend,
            # fp32 keeps the key of configs written before precisions existed
            **(
                {"precision": self.cfg.encoder.precision}
                if self.cfg.encoder.precision != "fp32"
                else {}
            ),
        }

    def get(self) -> Any:
        if self._enc is None:
            from treerank.encoders import SentenceEncoder

            self._enc = SentenceEncoder(
                self.cfg.encoder.model,
                query_prompt=self.cfg.encoder.query_prompt,
                token_budget=self.cfg.encoder.token_budget,
                device=self.cfg.device,
                progress=self.progress,
                **_library_kwargs(
                    SentenceEncoder,
                    backend=self.cfg.encoder.backend,
                    precision=self.cfg.encoder.precision,
                ),
            )
        return self._enc


# ----------------------------------------------------------------------------- the graph


@dataclass
class Stage:
    """One node of the graph: identity, directory, declared edges, own inputs and work.

    Attributes:
        id: the stage's identity (its name and default path are rendered from it).
        path: its directory in the run's output.
        deps: the stages whose outputs it reads; their keys are part of its key.
        inputs: its own configuration (JSON-able; part of its key).
        work: ``work(dir) -> summary``; ``None`` for a dataset's given store (nothing to run;
            its key is ``given_key``, from the store's files).
        in_place: the work resumes in place (embedding).
    """

    id: StageId
    path: Path
    deps: tuple[StageId, ...]
    inputs: dict[str, Any]
    work: Callable[[Path], dict[str, Any] | None] | None = None
    in_place: bool = False
    given_key: str | None = None


@dataclass
class _Skip:
    """A stage that does nothing in this experiment, with the reason (shown in the report)."""

    name: str
    reason: str
    path: Path


class StageGraph:
    """The stages of one run in execution order, each key computed when the stage is added.

    A stage may only read (declare as ``deps``) stages added before it; asking for anything
    else raises :class:`~treerank.pipeline.identity.UnknownDependencyError`.
    """

    def __init__(self) -> None:
        self.stages: dict[StageId, Stage] = {}
        self.keys: dict[StageId, str] = {}
        self.order: list[Stage | _Skip] = []

    def add(self, stage: Stage) -> str:
        """Add ``stage`` and return its key.

        Raises:
            UnknownDependencyError: a dependency that is not a stage of the graph (yet).
            ValueError: a stage added twice.
        """
        if stage.id in self.stages:
            raise ValueError(f"stage {stage.id.name} added twice")
        for dep in stage.deps:
            if dep not in self.keys:
                raise UnknownDependencyError(
                    f"stage {stage.id.name} reads {dep.name}, which is not a stage of this run "
                    "(or is added after it)"
                )
        key = stage.given_key or fingerprint(
            "stage",
            stage.id.key_part(),
            _version("treerank"),
            stage.inputs,
            [[dep.name, self.keys[dep]] for dep in stage.deps],
        )
        self.stages[stage.id] = stage
        self.keys[stage.id] = key
        self.order.append(stage)
        return key

    def skip(self, name: str, reason: str, path: Path) -> None:
        self.order.append(_Skip(name, reason, path))

    def key_of(self, stage: StageId, reader: StageId) -> str:
        """The key of ``stage`` as read by ``reader``, which must have declared it.

        Raises:
            UnknownDependencyError: ``reader`` did not declare ``stage``, or it is unknown.
        """
        if reader in self.stages and stage not in self.stages[reader].deps:
            raise UnknownDependencyError(f"stage {reader.name} did not declare {stage.name}")
        if stage not in self.keys:
            raise UnknownDependencyError(f"{stage.name} is not a stage of this run")
        return self.keys[stage]

    def names(self) -> dict[str, str]:
        """Stage name -> key, for every stage (given stores included)."""
        return {sid.name: key for sid, key in self.keys.items()}

    def edges(self) -> dict[str, list[str]]:
        """Stage name -> the names of the stages it reads."""
        return {sid.name: [d.name for d in st.deps] for sid, st in self.stages.items()}


@dataclass
class _Run:
    """What every stage of one ``run_experiment`` call shares."""

    cfg: ExperimentConfig
    force: bool
    progress: bool
    log: Callable[[str], None]
    records: list[StageRecord] = field(default_factory=list)
    stage_cache: Path | None = None

    def stage(self, st: Stage, key: str) -> StageRecord:
        """:func:`run_stage` with this run's settings; the record is kept in ``records``.

        With a ``stage_cache`` (sweeps) the stage lives in ``<cache>/<name>-<key>`` (rendered by
        :meth:`StageId.cache_dir_name`) and its path becomes a relative symlink to it, so equal
        stages of several runs are computed once.
        """
        assert st.work is not None
        name = st.id.name
        kw: dict[str, Any] = {
            "force": self.force,
            "in_place": st.in_place,
            "log": self.log,
            "kind": st.id.kind,
        }
        if self.stage_cache is None:
            rec = run_stage(name, key, st.path, st.work, **kw)
        else:
            phys = self.stage_cache / st.id.cache_dir_name(key)
            rec = run_stage(name, key, phys, st.work, **kw)
            _link(st.path, phys)
            rec.path = st.path
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
    cfg.output_dir.mkdir(parents=True, exist_ok=True)
    run = _Run(cfg, force, progress, log, stage_cache=stage_cache)
    graph, outcomes = _plan(cfg, run)

    for item in graph.order:
        if isinstance(item, _Skip):
            run.skip(item.name, item.reason, item.path)
            continue
        if item.work is None:  # a given store: nothing to run
            continue
        rec = run.stage(item, graph.keys[item.id])
        _collect(item.id, rec, outcomes[item.id.dataset])

    from treerank.pipeline.report import write_report

    seconds = time.perf_counter() - t0
    enc_meta = _encoder_meta(outcomes)
    md, js = write_report(cfg, quick, outcomes, run.records, enc_meta, seconds)
    log(f"[report] {md}")
    return ExperimentResult(cfg, quick, outcomes, run.records, enc_meta, seconds, md, js)


def plan_experiment(cfg: ExperimentConfig) -> StageGraph:
    """The stage graph of ``cfg`` with every key, without running or writing anything.

    What a run would reuse or re-run: a stage whose key equals the one in its directory's
    ``stage.json`` is reused. Reads the data files (their digest), a given store's file list
    and the encoder's weights (their digest).
    """
    run = _Run(cfg, force=False, progress=False, log=lambda s: None)
    return _plan(cfg, run)[0]


def _collect(sid: StageId, rec: StageRecord, o: DatasetOutcome) -> None:
    """Copy what a finished stage produced into its dataset's outcome."""
    if sid.kind == "embed":
        assert sid.split is not None
        o.store_stats[sid.split] = rec.summary
    elif sid.kind == "train":
        assert sid.run is not None
        o.checkpoints[sid.run.name] = rec.path / "checkpoint"
        o.training[sid.run.name] = rec.summary
    elif sid.kind == "evaluate":
        o.eval_dir = rec.path
        o.comparison = rec.summary.get("comparison", {})
        o.comparison_markdown = rec.summary.get("markdown", "")
        o.overlap = rec.summary.get("overlap")
        o.family_reports = rec.summary.get("family_reports") or {}
        o.overlap_markdown = rec.summary.get("overlap_markdown", "")
        o.lexical_gap = rec.summary.get("lexical_gap")
        o.lexical_gap_markdown = rec.summary.get("lexical_gap_markdown", "")
    elif sid.kind == "diagnose":
        o.diagnose_dir = rec.path
        o.diagnostics = rec.summary


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


def _run_config(spec: ModelSpec, run: RunId) -> dict[str, Any]:
    """The training config of ``run``: the model's, with the run's seed for a seeded model."""
    return dict(spec.config) if run.seed is None else {**spec.config, "seed": run.seed}


def _plan(cfg: ExperimentConfig, run: _Run) -> tuple[StageGraph, dict[str, DatasetOutcome]]:
    """Build the graph (keys included) and the empty outcome of every dataset."""
    out = cfg.output_dir
    graph = StageGraph()
    outcomes: dict[str, DatasetOutcome] = {}
    encoder = _Encoder(cfg, progress=run.progress)
    enc_key: dict[str, Any] | None = None
    device_key = cfg.device.resolved_text()  # the stage keys' text: `auto` keys as what it is
    runs = experiment_runs(cfg)

    for ds in cfg.datasets:
        splits = list(dict.fromkeys(s for s in (ds.train_split, ds.eval_split) if s))
        stats: dict[str, dict[str, Any]] = {}
        if ds.store is not None:  # an existing store root, used as is
            root = ds.store
            for split in splits:
                sid = StageId.embed(ds.name, split)
                key, stats[split] = _existing_store(ds, split)
                graph.add(Stage(sid, sid.path(out, root), (), {"store": str(root)}, given_key=key))
        else:
            root = dataset_dir(out, "stores", ds.name)
            assert ds.path is not None  # load_experiment: a dataset has `store` or `path`
            data_sha = file_sha256(ds.path)
            if enc_key is None:
                enc_key = encoder.key()
            for split in splits:
                graph.add(_embed_stage(run, ds, split, data_sha, enc_key, encoder, device_key))
        o = DatasetOutcome(
            name=ds.name,
            eval_split=ds.eval_split,
            store=root / ds.eval_split,
            train_store=(root / ds.train_split) if ds.train_split else None,
            dim=ds.dim,
            store_stats=stats,
        )
        outcomes[ds.name] = o
        if cfg.models and not ds.train_split:
            graph.skip(
                f"train:{ds.name}",
                f"no train_split: {', '.join(cfg.models)} not trained here; baselines only",
                dataset_dir(out, "models", ds.name),
            )
        for r in runs:
            if r.trained_on == ds.name:
                spec = cfg.models[r.model]
                config = _run_config(spec, r)
                resolved = _resolved_config(spec, config, cfg.source)
                o.runs.append(r)
                o.seeds[r.name] = resolved.get("seed", config.get("seed"))
                graph.add(_train_stage(run, ds, spec, r, config, resolved, device_key))

    for ds in cfg.datasets:
        o = outcomes[ds.name]
        systems = _systems_for(cfg, ds, runs)
        graph.add(_evaluate_stage(run, ds, o, systems, device_key))
        drun = _diagnosed_run(cfg, ds, runs)
        if drun is not None:
            graph.add(_diagnose_stage(run, ds, o, drun, device_key))
        else:
            wanted = cfg.diagnose.model
            why = (
                "no diagnose.model given"
                if not wanted
                else f"{wanted!r} is not trained on this dataset (no train_split)"
            )
            graph.skip(f"diagnose:{ds.name}", why, dataset_dir(out, "diagnose", ds.name))
    return graph, outcomes


def _diagnosed_run(cfg: ExperimentConfig, ds: DatasetConfig, runs: list[RunId]) -> RunId | None:
    """The run ``diagnose.model`` names on ``ds`` (a seeded model's first seed), if trained here."""
    model = cfg.diagnose.model
    if not model or model not in cfg.models:
        return None
    spec = cfg.models[model]
    run = RunId(model, ds.name, spec.seeds[0] if spec.seeds else None)
    return run if run in runs else None


# ----------------------------------------------------------------------------- stages


def _embed_stage(
    run: _Run,
    ds: DatasetConfig,
    split: str,
    data_sha: str,
    enc_key: dict[str, Any],
    encoder: _Encoder,
    device_key: str,
) -> Stage:
    sid = StageId.embed(ds.name, split)
    inputs = {
        "store_format": STORE_FORMAT_VERSION,
        "data_sha256": data_sha,
        "format": ds.format,
        "limit": ds.limit,
        "max_passages": ds.max_passages,
        "encoder": enc_key,
        "device": device_key,  # the resolved text (Device.resolved_text)
    }

    def work(d: Path) -> dict[str, Any]:
        from treerank.store.dataset import embed_dataset

        assert ds.path is not None and ds.format is not None

        def on_read(name: str, data: Any, main: bool) -> None:
            for w in data.warnings() if data is not None else []:
                run.log(f"[warn]  {StageId.embed(ds.name, name).name}: {w}")

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

    return Stage(sid, sid.path(run.cfg.output_dir), (), inputs, work, in_place=True)


def _existing_store(ds: DatasetConfig, split: str) -> tuple[str, dict[str, Any]]:
    """Key and statistics of a split of a dataset's existing store (``datasets[].store``).

    The key covers every file's name and content digest (SHA-256, computed once and kept in
    the sidecar :data:`~treerank.pipeline.stages.DIGESTS_FILE` beside the files, recomputed
    when a file's size, mtime, ctime or inode changes:
    :func:`~treerank.pipeline.stages.content_digests`), so a changed store re-runs the stages
    that read it, even a same-size file with swapped rows and a restored mtime. Derived caches
    the stages themselves write beside the split (mined negatives and teacher rankings under
    ``arrays/``, FAISS indexes under ``indexes/``) and the sidecar are left out: a training
    stage that mines negatives must not change the key of every later run.
    """
    from treerank.search.faiss_index import INDEXES_DIR
    from treerank.store import EmbeddingStore
    from treerank.store.format import ARRAYS_DIR

    assert ds.store is not None
    path = ds.store / split
    st = EmbeddingStore.open(path, dim=ds.dim)
    rels = sorted(
        p.relative_to(path).as_posix()
        for p in path.rglob("*")
        if p.is_file()
        and p.name not in ("stage.json", DIGESTS_FILE)
        and p.relative_to(path).parts[0] not in (ARRAYS_DIR, INDEXES_DIR)
    )
    digests = content_digests(path, rels)
    key = fingerprint("store", str(path), ds.dim, [[r, digests[r]] for r in rels])
    return key, {
        "n_queries": st.n_queries,
        "n_passages": st.n_passages,
        "k": st.k,
        "store": str(path),
    }


def _resolved_config(spec: ModelSpec, config: dict[str, Any], source: Any) -> dict[str, Any]:
    """The training config with every default filled in (part of the train stage's key).

    The YAML alone is not enough: a changed default (e.g. ``validation.group_by_passage``)
    must re-run the stages it affects instead of silently reusing a model trained under the
    old one.
    """
    from treerank.models.families import family

    return family(spec.family).resolved_config(config, f"{source}: models.{spec.name}")


def _train_stage(
    run: _Run,
    ds: DatasetConfig,
    spec: ModelSpec,
    rid: RunId,
    config: dict[str, Any],
    resolved: dict[str, Any],
    device_key: str,
) -> Stage:
    """Train ``spec`` with ``config`` (one seed's, for a seeded model) as run ``rid``."""
    assert ds.train_split is not None
    sid = StageId.train(rid)
    store = StageId.embed(ds.name, ds.train_split)
    store_dir = _store_dir(run, ds, ds.train_split)
    inputs = {
        "family": spec.family,
        "config": config,
        "resolved_config": resolved,
        "device": device_key,  # the resolved text (Device.resolved_text)
    }

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
            device=run.cfg.device,
        )
        crash_point("train", "after-weights")
        return {"family": spec.family, "summary": _jsonable(res.summary)}

    return Stage(sid, sid.path(run.cfg.output_dir), (store,), inputs, work)


def _store_dir(run: _Run, ds: DatasetConfig, split: str) -> Path:
    root = ds.store if ds.store is not None else dataset_dir(run.cfg.output_dir, "stores", ds.name)
    return root / split


def _systems_for(cfg: ExperimentConfig, ds: DatasetConfig, runs: list[RunId]) -> list[SystemId]:
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
    dup = sorted({n for n in names if names.count(n) > 1})
    averages = {g for g in _seed_groups(out)}
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


def _seed_groups(systems: list[SystemId]) -> dict[str, dict[str, int]]:
    """Seed-average system name -> {its seeds' system names: seed}, for the seeded runs among
    ``systems`` (grouped by model and training dataset)."""
    groups: dict[str, dict[str, int]] = {}
    for s in systems:
        if s.run is not None and s.run.seed is not None:
            avg = SystemId.seed_average(s.run.model, s.run.trained_on, s.evaluated_on)
            groups.setdefault(avg.name, {})[s.name] = s.run.seed
    return groups


def _evaluate_stage(
    run: _Run,
    ds: DatasetConfig,
    o: DatasetOutcome,
    systems: list[SystemId],
    device_key: str,
) -> Stage:
    sid = StageId.evaluate(ds.name)
    out = run.cfg.output_dir
    stores = [StageId.embed(ds.name, ds.eval_split)]
    if ds.train_split and ds.train_split != ds.eval_split:  # the seen / unseen split reads it
        stores.append(StageId.embed(ds.name, ds.train_split))
    trained = [StageId.train(s.run) for s in systems if s.run is not None]
    ev = run.cfg.evaluate
    groups = _seed_groups(systems)
    inputs = {
        # a trained run's identity here; its checkpoint's key comes in through the edge
        "systems": [
            [s.name, s.spec if s.run is None else {"run": s.run.key_part()}] for s in systems
        ],
        "seed_groups": groups,
        "k": ev.k,
        "baselines": ev.baselines,
        "metrics": ev.metrics,
        "seed": ev.seed,
        "outputs": EVALUATE_OUTPUTS,
        "device": device_key,  # the resolved text (Device.resolved_text)
    }

    def work(d: Path) -> dict[str, Any]:
        from treerank.evaluation.compare import compare_systems
        from treerank.evaluation.settings import EvaluationSettings
        from treerank.search.specs import BuildContext, build_system
        from treerank.store import EmbeddingStore

        store = EmbeddingStore.open(o.store, dim=o.dim)
        # Built here (not from the spec strings inside compare_systems) so that the trained
        # models' systems can be asked for their family's report afterwards. ``device``
        # reaches the dense systems' exact search and a family's own search (the forest's
        # classification and counting).
        ctx = BuildContext(progress=run.progress, device=run.cfg.device, cache={})
        built = {s.name: build_system(s.build_node(out), ctx) for s in systems}
        settings = EvaluationSettings(
            baseline=ev.baselines[0],
            second_baseline=ev.baselines[1] if len(ev.baselines) > 1 else None,
            k=ev.k,
            metrics=tuple(ev.metrics),
            seed=ev.seed,
        )
        comp = compare_systems(
            store,
            built,
            settings=settings,
            out_dir=d,
            progress=run.progress,
            train_store=(EmbeddingStore.open(o.train_store, dim=o.dim) if o.train_store else None),
            seed_groups=groups,
            device=run.cfg.device,
        )
        crash_point("evaluate", "after-runs")
        summary: dict[str, Any] = {
            "comparison": _jsonable(comp.to_dict()),
            "markdown": comp.markdown(),
        }
        reports = family_reports(built, store)
        if reports:
            summary["family_reports"] = _jsonable(reports)
        if comp.overlap is not None:  # written to overlap.json by compare_systems
            from treerank.evaluation.overlap import overlap_markdown

            metric = headline_metric(ev.metrics)
            summary["overlap"] = _jsonable(comp.overlap)
            summary["overlap_markdown"] = overlap_markdown(comp.overlap, metric, ev.baselines[0])
        summary.update(_lexical_gap(store, comp, ev.metrics, d))
        return summary

    return Stage(sid, sid.path(out), (*stores, *trained), inputs, work)


def _lexical_gap(store: StoreLike, comp: Any, metrics: list[str], d: Path) -> dict[str, Any]:
    """The lexical-gap breakdown of every system (:mod:`treerank.diagnostics.lexical_gap`)."""
    from treerank.diagnostics.lexical_gap import (
        lexical_gap,
        lexical_gap_markdown,
        plot_lexical_gap,
        store_coverage,
    )
    from treerank.store import StoreFormatError

    metric = headline_metric(metrics)
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
    rid: RunId,
    device_key: str,
) -> Stage:
    sid = StageId.diagnose(ds.name)
    out = run.cfg.output_dir
    deps = (StageId.embed(ds.name, ds.eval_split), StageId.train(rid))
    dg = run.cfg.diagnose
    inputs = {
        "run": rid.key_part(),
        "baseline": dg.baseline,
        "probe_seed": dg.probe_seed,
        "k": run.cfg.evaluate.k,
        "device": device_key,  # the resolved text (Device.resolved_text)
    }

    def work(d: Path) -> dict[str, Any]:
        from treerank.diagnostics.procedure import run_diagnostics
        from treerank.store import EmbeddingStore

        doc = run_diagnostics(
            rid.checkpoint(out),
            EmbeddingStore.open(o.store, dim=o.dim),
            d,
            baseline=dg.baseline,
            k=run.cfg.evaluate.k,
            probe_seed=dg.probe_seed,
            progress=run.progress,
            device=run.cfg.device,
        )
        crash_point("diagnose", "after-diagnostics")
        return _jsonable(doc)

    return Stage(sid, sid.path(out), deps, inputs, work)


# ----------------------------------------------------------------------------- helpers


def family_reports(systems: dict[str, Any], store: StoreLike) -> dict[str, dict[str, Any]]:
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
