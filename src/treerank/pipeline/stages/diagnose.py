"""``diagnose:<dataset>``: the diagnostics of one trained run on the evaluation split.

The YAML ``diagnose:`` section (``probe_seed``) and ``evaluate.k`` reach
:func:`~treerank.diagnostics.procedure.run_diagnostics` as its ``DiagnosticsSettings``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from treerank.diagnostics.procedure import DiagnosticsSettings, run_diagnostics
from treerank.faults import crash_point
from treerank.pipeline.config import DiagnoseConfig
from treerank.pipeline.identity import RunId, StageId
from treerank.pipeline.stages.graph import Deps, RunContext, Stage
from treerank.pipeline.stages.outputs import DiagnoseOutput, EmbedOutput, TrainOutput
from treerank.store import EmbeddingStore

__all__ = ["DiagnoseStage"]


@dataclass
class DiagnoseStage(Stage):
    """:func:`~treerank.diagnostics.procedure.run_diagnostics` of ``run`` on ``store``."""

    ctx: RunContext = field(kw_only=True)
    store: StageId = field(kw_only=True)
    trained: StageId = field(kw_only=True)
    settings: DiagnoseConfig = field(kw_only=True)
    k: int = field(kw_only=True)

    @classmethod
    def make(
        cls,
        ctx: RunContext,
        dataset: str,
        store: StageId,
        run: RunId,
        settings: DiagnoseConfig,
        k: int,
    ) -> DiagnoseStage:
        """``k``: the run depth (``evaluate.k``)."""
        sid = StageId.diagnose(dataset)
        trained = StageId.train(run)
        inputs = {
            "run": run.key_part(),
            "baseline": settings.baseline,
            "probe_seed": settings.probe_seed,
            "k": k,
            "device": ctx.device_key,
        }
        return cls(
            sid,
            sid.path(ctx.output_dir),
            (store, trained),
            inputs,
            output=DiagnoseOutput,
            ctx=ctx,
            store=store,
            trained=trained,
            settings=settings,
            k=k,
        )

    def run(self, d: Path, deps: Deps) -> DiagnoseOutput:
        split = deps.get(self.store, EmbedOutput)
        doc = run_diagnostics(
            deps.get(self.trained, TrainOutput).checkpoint,
            EmbeddingStore.open(split.store, dim=split.dim),
            d,
            settings=DiagnosticsSettings(
                baseline=self.settings.baseline, k=self.k, probe_seed=self.settings.probe_seed
            ),
            progress=self.ctx.progress,
            device=self.ctx.device,
        )
        crash_point("diagnose", "after-diagnostics")
        return DiagnoseOutput(d, doc)
