"""``treerank run``: one experiment from raw data to a comparison report.

The run is a graph of typed stages (:mod:`treerank.pipeline.stages`), each identified by a
:class:`~treerank.pipeline.identity.StageId` and incremental: its key is a fingerprint of its own
inputs and of the keys of the stages whose outputs it reads (its declared edges), and a stage
whose key matches a finished one is reused. The runner hands each stage only its declared
dependencies' outputs. Every stage is a thin call of the same library function its own command
uses, so the report's numbers are exactly what ``treerank embed / train / evaluate / diagnose``
print:

1. ``embed:<dataset>:<split>`` -> ``<out>/stores/<dataset>/<split>/`` (:func:`embed_split`,
   resumable; the test split reuses the train split's passage vectors when texts match); a
   dataset given as ``store:`` is used as is and never written
2. ``mine:<dataset>:<part>`` -> ``<out>/mine/<dataset>/<part>/`` (BM25 hard negatives),
   ``pseudo:<dataset>:<part>`` -> ``<out>/pseudo/<dataset>/<part>/`` (a pseudo split),
   ``teacher:<dataset>:<part>`` -> ``<out>/teacher/<dataset>/<part>/`` (a teacher's run): the
   training data a model's family config asks for, each shared by the models whose settings
   agree; they read the train split's embed stage (a teacher over pseudo queries also the
   pseudo stage)
3. ``train:<dataset>:<run>`` -> ``<out>/models/<dataset>/<run>/checkpoint``
   (:func:`train_model` with the model's family; one run per seed of a seeded model); reads the
   train split's embed stage and its mine / pseudo / teacher stages
4. ``evaluate:<dataset>`` -> ``<out>/eval/<dataset>/`` (:func:`compare_systems` after
   :func:`resolve_evaluation`: every system on every passage of the evaluation split, paired
   tests against the baselines); reads the dataset's embed stages and the train stage of every
   run it evaluates (transfer included)
5. ``diagnose:<dataset>`` -> ``<out>/diagnose/<dataset>/`` (:func:`run_diagnostics`); reads
   the evaluation split's embed stage and the diagnosed run's train stage
6. the report -> ``<out>/report.md`` + ``<out>/report.json`` (always rewritten; cheap)

``docs/DESIGN.md`` ("The stage graph") lists every stage's edges and key inputs;
:func:`plan_experiment` builds the graph without running anything.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from treerank.evaluation.settings import EvaluationSettings
from treerank.families import family
from treerank.lock import writes_dir
from treerank.pipeline.config import (
    DatasetConfig,
    ExperimentConfig,
    ModelSpec,
)
from treerank.pipeline.identity import RunId, StageId, dataset_dir
from treerank.pipeline.outcome import DatasetOutcome
from treerank.pipeline.report import write_report
from treerank.pipeline.runs import experiment_runs, seed_groups, systems_for
from treerank.pipeline.stages.base import StageRecord, file_sha256
from treerank.pipeline.stages.cross_encoder import CrossEncoderRerank, CrossEncoderStage
from treerank.pipeline.stages.diagnose import DiagnoseStage
from treerank.pipeline.stages.embed import EmbedStage, Encoder, GivenStoreStage
from treerank.pipeline.stages.evaluate import EVALUATE_OUTPUTS, EvaluateStage, family_reports
from treerank.pipeline.stages.finetune import FinetuneStage, ReembedStage
from treerank.pipeline.stages.graph import RunContext, Stage, StageGraph
from treerank.pipeline.stages.mine import DenoiseStage, MineSettings, MineStage
from treerank.pipeline.stages.outputs import (
    DiagnoseOutput,
    EmbedOutput,
    EvaluateOutput,
    FinetuneOutput,
    Output,
    TrainOutput,
)
from treerank.pipeline.stages.pseudo import PseudoStage
from treerank.pipeline.stages.teacher import TeacherStage
from treerank.pipeline.stages.train import TrainStage
from treerank.pipeline.validate import validate_experiment
from treerank.search.negatives import MINED_NEGATIVES_ARRAY
from treerank.store import EmbeddingStore
from treerank.tasks.train import training_sources
from treerank.training.heads import SamplerConfig

__all__ = [
    "EVALUATE_OUTPUTS",
    "DatasetOutcome",
    "ExperimentResult",
    "Stage",
    "StageGraph",
    "experiment_runs",
    "family_reports",
    "plan_experiment",
    "run_experiment",
]


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
    validate_experiment(cfg)  # every problem, before any stage writes anything
    t0 = time.perf_counter()
    cfg.output_dir.mkdir(parents=True, exist_ok=True)
    ctx = _context(cfg, progress=progress, force=force, log=log)
    graph, outcomes = _plan(cfg, ctx)
    records: list[StageRecord] = []
    for item, rec, out in graph.execute(ctx, stage_cache):
        records.append(rec)
        if isinstance(item, Stage) and out is not None:
            _collect(item.id, out, outcomes[item.id.dataset])

    seconds = time.perf_counter() - t0
    enc_meta = _encoder_meta(outcomes)
    md, js = write_report(cfg, quick, outcomes, records, enc_meta, seconds)
    log(f"[report] {md}")
    return ExperimentResult(cfg, quick, outcomes, records, enc_meta, seconds, md, js)


def plan_experiment(cfg: ExperimentConfig) -> StageGraph:
    """The stage graph of ``cfg`` with every key, without running anything.

    What a run would reuse or re-run: a stage whose key equals the one in its directory's
    ``stage.json`` is reused. Reads the data files (their digest), a given store's files and the
    encoder's weights (their digest); writes only the digest cache under ``<out>/.cache``.
    """
    return _plan(cfg, _context(cfg, progress=False, force=False, log=lambda s: None))[0]


def _context(
    cfg: ExperimentConfig, *, progress: bool, force: bool, log: Callable[[str], None]
) -> RunContext:
    return RunContext(cfg.output_dir, str(cfg.source), cfg.device, progress, force, log)


def _collect(sid: StageId, out: Output, o: DatasetOutcome) -> None:
    """Copy what a finished stage produced into its dataset's outcome."""
    if isinstance(out, EmbedOutput):
        assert sid.split is not None
        o.store_stats[sid.split] = dict(out.stats)
    elif isinstance(out, TrainOutput):
        assert sid.run is not None
        o.checkpoints[sid.run.name] = out.checkpoint
        o.training[sid.run.name] = out.to_json()
    elif isinstance(out, FinetuneOutput):  # the encoder itself: a row beside the heads'
        assert sid.part is not None
        s = out.summary
        cost = s.get("cost")
        cost = cost if isinstance(cost, Mapping) else {}
        prec = s.get("precision")
        o.training[sid.part] = {
            "family": out.family,
            "encoder_finetune": True,  # the system <name> is this tuned encoder's cosine
            "summary": {
                "training_queries": s.get("training_queries"),
                "steps": s.get("steps"),
                "train_loss": s.get("train_loss"),
                "seconds": cost.get("wall_seconds"),
                "cpu_seconds": cost.get("cpu_seconds"),
                "peak_rss_mib": cost.get("peak_rss_mib"),
                "tokens": cost.get("tokens"),
                "precision": prec.get("chosen") if isinstance(prec, Mapping) else None,
            },
        }
    elif isinstance(out, EvaluateOutput):
        o.eval_dir = out.dir
        o.comparison = dict(out.comparison)
        o.comparison_markdown = out.markdown
        o.overlap = None if out.overlap is None else dict(out.overlap)
        o.family_reports = {k: v for k, v in out.family_reports.items() if isinstance(v, dict)}
        o.overlap_markdown = out.overlap_markdown
        o.lexical_gap = None if out.lexical_gap is None else dict(out.lexical_gap)
        o.lexical_gap_markdown = out.lexical_gap_markdown
    elif isinstance(out, DiagnoseOutput):
        o.diagnose_dir = out.dir
        o.diagnostics = dict(out.doc)


def _run_config(spec: ModelSpec, run: RunId) -> dict[str, Any]:
    """The training config of ``run``: the model's, with the run's seed for a seeded model."""
    return dict(spec.config) if run.seed is None else {**spec.config, "seed": run.seed}


def _embed_stages(
    cfg: ExperimentConfig, ctx: RunContext, ds: DatasetConfig, graph: StageGraph, enc: Encoder
) -> DatasetOutcome:
    """Add the embed (or given-store) stage of each split of ``ds``; its empty outcome."""
    splits = list(dict.fromkeys(s for s in (ds.train_split, ds.eval_split) if s))
    stats: dict[str, dict[str, Any]] = {}
    if ds.store is not None:  # an existing store root, used as is
        root = ds.store
        for split in splits:
            given = GivenStoreStage.make(ctx, ds, split)
            stats[split] = dict(given.out.stats)
            graph.add(given)
    else:
        root = dataset_dir(cfg.output_dir, "stores", ds.name)
        assert ds.path is not None  # load_experiment: a dataset has `store` or `path`
        data_sha = file_sha256(ds.path)
        enc_key = enc.key()
        for split in splits:
            graph.add(EmbedStage.make(ctx, ds, split, data_sha, enc, enc_key))
    return DatasetOutcome(
        name=ds.name,
        eval_split=ds.eval_split,
        store=root / ds.eval_split,
        train_store=(root / ds.train_split) if ds.train_split else None,
        dim=ds.dim,
        store_stats=stats,
    )


def _add_shared(graph: StageGraph, stage: Stage) -> StageId:
    """Add a mine / pseudo / teacher stage unless an equal one (same id) is already there."""
    if stage.id not in graph.stages:
        graph.add(stage)
    elif graph.stages[stage.id].inputs != stage.inputs:  # the part names the settings
        raise ValueError(f"{stage.id.name}: two models ask for it with different settings")
    return stage.id


def _derived_stages(
    ctx: RunContext, graph: StageGraph, spec: ModelSpec, config: dict[str, Any], store: StageId
) -> tuple[StageId, ...]:
    """The mine / denoise / pseudo / teacher stages run ``config`` of ``spec`` trains on (added
    once)."""
    fam = family(spec.family)
    data = fam.parse_config(dict(config), f"{ctx.source}: models.{spec.name}").data
    out: list[StageId] = []
    if fam.mines_negatives and int(data.n_hard) > 0:
        if data.hard_negatives in ("auto", "mined"):
            ms = MineSettings(
                str(data.hard_negatives),
                int(data.n_hard),
                str(data.mined_array),
                int(data.mine_depth),
            )
            mine = _add_shared(graph, MineStage.make(ctx, store, ms))
            out.append(mine)
            job = data.denoise_job() if isinstance(data, SamplerConfig) else None
            if job is not None:  # RocketQA: after the mining
                out.append(_add_shared(graph, DenoiseStage.make(ctx, store, mine, job)))
    sources = training_sources(data) or []
    pseudo = None
    for src in sources:
        if src.kind == "pseudo":  # the last one is what a `queries: pseudo` teacher ranks
            pseudo = _add_shared(graph, PseudoStage.make(ctx, store, src))
            out.append(pseudo)
    for src in sources:
        if src.kind == "teacher":
            out.append(_add_shared(graph, TeacherStage.make(ctx, store, src, pseudo)))
    return tuple(out)


def _train_stages(
    cfg: ExperimentConfig, ctx: RunContext, ds: DatasetConfig, graph: StageGraph,
    o: DatasetOutcome, runs: list[RunId],
) -> None:  # fmt: skip
    """Add the train stage of every run on ``ds`` (after the stages it reads)."""
    if cfg.models and not ds.train_split:
        graph.skip(
            f"train:{ds.name}",
            f"no train_split: {', '.join(cfg.models)} not trained here; baselines only",
            dataset_dir(cfg.output_dir, "models", ds.name),
        )
    for r in runs:
        if r.trained_on != ds.name:
            continue
        assert ds.train_split is not None
        spec = cfg.models[r.model]
        config = _run_config(spec, r)
        resolved = _resolved_config(spec, config, cfg.source)
        o.runs.append(r)
        o.seeds[r.name] = resolved.get("seed", config.get("seed"))
        store = StageId.embed(ds.name, ds.train_split)
        derived = _derived_stages(ctx, graph, spec, config, store)
        where = f"{cfg.source}: models.{spec.name}"
        graph.add(TrainStage.make(ctx, r, spec.family, config, resolved, store, derived, where))


def _finetune_stages(
    cfg: ExperimentConfig, ctx: RunContext, ds: DatasetConfig, graph: StageGraph
) -> tuple[tuple[tuple[str, StageId], ...], tuple[CrossEncoderRerank, ...]]:
    """Add each ``finetune:`` entry's stages on ``ds`` (it needs a train split): the fine-tune
    (after the mine stage ``data.hard_negatives: mined`` reads, the denoise stage
    ``data.denoise`` reads and the teacher stages of ``data.sources``), then one re-embed stage per
    split; a cross-encoder entry's training stage alone. Returns ``(system name, reembed stage
    of the evaluation split)`` per encoder entry, and each cross-encoder's reranking system."""
    if not ds.train_split or not cfg.finetunes:
        return (), ()
    store = StageId.embed(ds.name, ds.train_split)
    out, reranked = [], []
    for name, spec in cfg.finetunes.items():
        data = spec.config.train.data
        mine = denoise = None
        if data.hard_negatives == "mined" and data.n_hard > 0:
            ms = MineSettings("mined", int(data.n_hard), MINED_NEGATIVES_ARRAY, data.mine_depth)
            mine = _add_shared(graph, MineStage.make(ctx, store, ms))
        if spec.rerank is not None:  # a cross-encoder: it reranks, it embeds nothing
            ce = CrossEncoderStage.make(ctx, name, store, spec.config, mine)
            graph.add(ce)
            reranked.append(CrossEncoderRerank(name, ce.id, spec.rerank))
            continue
        job = spec.config.data.denoise_job()
        if job is not None and mine is not None:  # RocketQA: after the mining
            denoise = _add_shared(graph, DenoiseStage.make(ctx, store, mine, job))
        teachers = tuple(
            _add_shared(graph, TeacherStage.make(ctx, store, src, None))
            for src in data.source_specs() or ()
            if src.kind == "teacher"
        )
        ft = FinetuneStage.make(ctx, name, store, spec.config, mine, denoise, teachers)
        graph.add(ft)
        for split in dict.fromkeys((ds.train_split, ds.eval_split)):
            re = ReembedStage.make(ctx, ft.id, StageId.embed(ds.name, split))
            graph.add(re)
            if split == ds.eval_split:
                out.append((name, re.id))
    return tuple(out), tuple(reranked)


def evaluation_settings(cfg: ExperimentConfig) -> EvaluationSettings:
    """The YAML ``evaluate:`` section as the :class:`EvaluationSettings` the evaluate stages
    (and ``treerank evaluate``) pass to :func:`resolve_evaluation` and ``compare_systems``."""
    ev = cfg.evaluate
    return EvaluationSettings(
        baseline=ev.baselines[0],
        second_baseline=ev.baselines[1] if len(ev.baselines) > 1 else None,
        k=ev.k,
        metrics=tuple(ev.metrics),
        seed=ev.seed,
    )


def _plan(cfg: ExperimentConfig, ctx: RunContext) -> tuple[StageGraph, dict[str, DatasetOutcome]]:
    """Build the graph (keys included) and the empty outcome of every dataset."""
    graph = StageGraph()
    outcomes: dict[str, DatasetOutcome] = {}
    encoder = Encoder(cfg.encoder, ctx.device, progress=ctx.progress)
    runs = experiment_runs(cfg)
    tuned: dict[str, tuple[tuple[tuple[str, StageId], ...], tuple[CrossEncoderRerank, ...]]] = {}
    for ds in cfg.datasets:
        o = outcomes[ds.name] = _embed_stages(cfg, ctx, ds, graph, encoder)
        _train_stages(cfg, ctx, ds, graph, o, runs)
        tuned[ds.name] = _finetune_stages(cfg, ctx, ds, graph)
    settings = evaluation_settings(cfg)
    for ds in cfg.datasets:
        systems = systems_for(cfg, ds, runs)
        train = StageId.embed(ds.name, ds.train_split) if ds.train_split else None
        store = StageId.embed(ds.name, ds.eval_split)
        graph.add(
            EvaluateStage.make(
                ctx, ds.name, store, train, systems, settings,
                cfg.evaluate.metrics_given, seed_groups(systems), *tuned[ds.name],
            )
        )  # fmt: skip
        drun = _diagnosed_run(cfg, ds, runs)
        if drun is not None:
            graph.add(DiagnoseStage.make(ctx, ds.name, store, drun, cfg.diagnose, cfg.evaluate.k))
        else:
            wanted = cfg.diagnose.model
            why = (
                "no diagnose.model given"
                if not wanted
                else f"{wanted!r} is not trained on this dataset (no train_split)"
            )
            graph.skip(f"diagnose:{ds.name}", why, dataset_dir(cfg.output_dir, "diagnose", ds.name))
    return graph, outcomes


def _diagnosed_run(cfg: ExperimentConfig, ds: DatasetConfig, runs: list[RunId]) -> RunId | None:
    """The run ``diagnose.model`` names on ``ds`` (a seeded model's first seed), if trained here."""
    model = cfg.diagnose.model
    if not model or model not in cfg.models:
        return None
    spec = cfg.models[model]
    run = RunId(model, ds.name, spec.seeds[0] if spec.seeds else None)
    return run if run in runs else None


def _resolved_config(spec: ModelSpec, config: dict[str, Any], source: Any) -> dict[str, Any]:
    """The training config with every default filled in (part of the train stage's key).

    The YAML alone is not enough: a changed default (e.g. ``validation.group_by_passage``)
    must re-run the stages it affects instead of silently reusing a model trained under the
    old one.
    """
    return family(spec.family).resolved_config(config, f"{source}: models.{spec.name}")


def _encoder_meta(outcomes: dict[str, DatasetOutcome]) -> dict[str, Any]:
    """Encoder name and fingerprint as recorded by the stores (all must agree)."""
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
