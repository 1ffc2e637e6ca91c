"""``evaluate:<dataset>``: every system on every passage of the evaluation split.

The stage calls :func:`treerank.tasks.evaluate.evaluate`, the call ``treerank evaluate`` makes:
its decisions before the comparison are :func:`~treerank.evaluation.settings.resolve_evaluation`'s,
on the YAML ``evaluate:`` section parsed into
:class:`~treerank.evaluation.settings.EvaluationSettings`: default metrics (none named in the
YAML) deeper than ``evaluate.k`` are left out, as the command leaves them out when no
``--metric`` is given, while a named metric deeper than ``k`` is refused before any stage runs
(``validate_experiment``, as ``compare_systems`` refuses it). Under ``torchrun`` every rank
searches a contiguous passage shard (``compare_systems(shard=...)``) and rank 0 writes, as the
command does.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from treerank.diagnostics.lexical_gap import (
    lexical_gap,
    lexical_gap_markdown,
    plot_lexical_gap,
    store_coverage,
)
from treerank.evaluation.compare import Comparison
from treerank.evaluation.overlap import overlap_markdown
from treerank.evaluation.settings import EvaluationSettings
from treerank.families import CHECKPOINTS, family
from treerank.faults import crash_point
from treerank.metrics.metrics import headline_metric
from treerank.pipeline.finetune import TunedStoreSystem
from treerank.pipeline.identity import StageId, SystemId
from treerank.pipeline.stages.base import folder_identity
from treerank.pipeline.stages.cross_encoder import CrossEncoderRerank
from treerank.pipeline.stages.graph import Deps, RunContext, RunStage
from treerank.pipeline.stages.outputs import (
    CrossEncoderOutput,
    EmbedOutput,
    EvaluateOutput,
    ReembedOutput,
    TrainOutput,
)
from treerank.search.specs import (
    BuildContext,
    CheckpointSpec,
    SystemSpec,
    build_system,
    model_folders,
)
from treerank.search.systems import CheckpointSystem, System
from treerank.store import EmbeddingStore, StoreFormatError
from treerank.storelike import StoreLike
from treerank.tasks.evaluate import evaluate

__all__ = ["EVALUATE_OUTPUTS", "EvaluateStage", "family_reports"]

# What the evaluate stage writes besides the comparison (part of its key: a new output re-runs it).
EVALUATE_OUTPUTS = ("overlap", "lexical_gap:v1", "fusion_tuning:v1")


@dataclass(kw_only=True)
class EvaluateStage(RunStage):
    """Compare ``systems`` on the evaluation split (and seen / unseen against the train split)."""

    produces = EvaluateOutput
    store: StageId
    train_store: StageId | None
    systems: tuple[SystemId, ...]
    settings: EvaluationSettings
    metrics_given: bool
    seed_groups: Mapping[str, Mapping[str, int]]
    tuned: tuple[tuple[str, StageId], ...] = ()
    reranked: tuple[CrossEncoderRerank, ...] = ()

    @classmethod
    def make(
        cls,
        ctx: RunContext,
        dataset: str,
        store: StageId,
        train_store: StageId | None,
        systems: list[SystemId],
        settings: EvaluationSettings,
        metrics_given: bool,
        seed_groups: Mapping[str, Mapping[str, int]],
        tuned: tuple[tuple[str, StageId], ...] = (),
        reranked: tuple[CrossEncoderRerank, ...] = (),
    ) -> EvaluateStage:
        """``train_store``: the training split of the seen / unseen breakdown (None: none).
        ``tuned``: ``(system name, reembed stage of the evaluation split)`` of each fine-tune
        (cosine over its re-embedded vectors). ``reranked``: each cross-encoder entry's
        reranking system (its first stage and depth are part of this stage's key)."""
        sid = StageId.evaluate(dataset)
        trained = [StageId.train(s.run) for s in systems if s.run is not None]
        trained += [stage for _, stage in tuned]
        trained += [r.stage for r in reranked]
        inputs: dict[str, object] = {
            # a trained run's identity here; its checkpoint's key comes in through the edge
            "systems": [
                [s.name, s.spec if s.run is None else {"run": s.run.key_part()}] for s in systems
            ],
            "seed_groups": {k: dict(v) for k, v in seed_groups.items()},
            "k": settings.k,
            "baselines": list(settings.baselines),
            "metrics": list(settings.metrics),
            "seed": settings.seed,
            "outputs": EVALUATE_OUTPUTS,
            "device": ctx.device_key,
            # the keys of runs configured before the YAML section became EvaluationSettings stay
            # equal: the defaults-were-used flag enters the key only when it matters
            **({} if metrics_given else {"metrics_given": False}),
            **({"tuned": [[n, st.name] for n, st in tuned]} if tuned else {}),
            **({"reranked": [r.key_part() for r in reranked]} if reranked else {}),
        }
        # a configured ckpt:/ce: folder retrained in place is scored again: its bytes, not only
        # its path (the keys of runs whose systems read no folder stay as they were)
        folders = sorted({f for s in systems if s.spec is not None for f in model_folders(s.spec)})
        if folders:
            inputs["model_folders"] = {f: folder_identity(f) for f in folders}
        stores = (store,) if train_store in (None, store) else (store, train_store)
        return cls.of(
            ctx,
            sid,
            (*stores, *trained),
            inputs,
            store=store,
            train_store=train_store,
            systems=tuple(systems),
            settings=settings,
            metrics_given=metrics_given,
            seed_groups=seed_groups,
            tuned=tuned,
            reranked=reranked,
        )

    def _built(self, deps: Deps) -> dict[str, System]:
        """Each system built from its spec, a trained run's from its train stage's checkpoint."""
        ctx = BuildContext(
            progress=self.ctx.progress, device=self.ctx.device, cache={}, checkpoints=CHECKPOINTS
        )
        out: dict[str, System] = {}
        for s in self.systems:
            node: SystemSpec
            if s.run is None:
                node = s.build_node(self.ctx.output_dir)
            else:  # the checkpoint of the declared edge, never a path rendered on the side
                node = CheckpointSpec(Path(deps.get(StageId.train(s.run), TrainOutput).checkpoint))
            out[s.name] = build_system(node, ctx)
        for name, stage in self.tuned:  # cosine over the split re-embedded by a tuned encoder
            tuned = EmbeddingStore.open(deps.get(stage, ReembedOutput).store)
            out[name] = TunedStoreSystem(tuned, name)
        for r in self.reranked:  # the cross-encoder of the declared edge, pinned to its weights
            out[r.name] = build_system(r.system(deps.get(r.stage, CrossEncoderOutput)), ctx)
        return out

    def run(self, d: Path, deps: Deps) -> EvaluateOutput:
        store = deps.get(self.store, EmbedOutput).open()
        train = None if self.train_store is None else deps.get(self.train_store, EmbedOutput)
        # Built here (not from the spec strings inside compare_systems) so that the trained
        # models' systems can be asked for their family's report afterwards.
        built = self._built(deps)
        done = evaluate(
            store,
            built,
            self.settings,
            metrics_given=self.metrics_given,
            train_store=None if train is None else train.store,
            train_dim=None if train is None else train.dim,
            overlap=train is not None,
            out_dir=d,
            progress=self.ctx.progress,
            seed_groups=self.seed_groups,
            device=self.ctx.device,
        )
        crash_point("evaluate", "after-runs")
        return self._output(d, store, built, done.comparison, done.plan.settings)

    def _output(
        self,
        d: Path,
        store: EmbeddingStore,
        built: Mapping[str, System],
        comp: Comparison,
        settings: EvaluationSettings,
    ) -> EvaluateOutput:
        metric = headline_metric(list(settings.metrics))
        overlap = None if comp.overlap is None else dict(comp.overlap)
        gap, gap_md = _lexical_gap(store, comp, metric, d)
        return EvaluateOutput(
            d,
            comp.to_dict(),
            comp.markdown(),
            family_reports(built, store),
            overlap,  # written to overlap.json by compare_systems
            ""
            if comp.overlap is None
            else overlap_markdown(comp.overlap, metric, settings.baseline),
            gap,
            gap_md,
        )


def _lexical_gap(
    store: StoreLike, comp: Comparison, metric: str, d: Path
) -> tuple[dict[str, object] | None, str]:
    """The lexical-gap breakdown of every system (:mod:`treerank.diagnostics.lexical_gap`)."""
    per_query = {s: r.per_query for s, r in comp.results.items()}
    try:
        coverage = store_coverage(store)
    except StoreFormatError:  # a store without text tables (Go-tool layout): no lexical gap
        return None, ""
    doc = json.loads(json.dumps(lexical_gap(coverage, per_query, metric), default=str))
    (d / "lexical_gap.json").write_text(json.dumps(doc, indent=2))
    plot_lexical_gap(doc, d / "plots" / "lexical_gap.png")
    return doc, lexical_gap_markdown(doc)


def family_reports(systems: Mapping[str, System], store: StoreLike) -> dict[str, dict[str, object]]:
    """Each model family's part of the report, for the checkpoint systems that ran on ``store``.

    Returns:
        family name -> the family's ``report`` hook output (``{"stats", "markdown"}``), for the
        families that have a hook.
    """
    groups: dict[str, dict[str, System]] = {}
    hooks = {}
    for name, system in systems.items():
        if isinstance(system, CheckpointSystem):
            fam = family(system.model_type_for(store))
            if fam.report is not None:
                hooks[fam.name] = fam.report
                groups.setdefault(fam.name, {})[name] = system.system_for(store)
    return {f: hooks[f](group) for f, group in groups.items()}
