"""``diagnose:<dataset>``: the diagnostics of one trained run on the evaluation split.

The YAML ``diagnose:`` section (``probe_seed``) and ``evaluate.k`` reach
:func:`treerank.tasks.diagnose.diagnose` (``run_diagnostics``) as its ``DiagnosticsSettings``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from treerank.faults import crash_point
from treerank.pipeline.config import DiagnoseConfig
from treerank.pipeline.identity import RunId, StageId
from treerank.pipeline.stages.graph import Deps, RunContext, RunStage
from treerank.pipeline.stages.outputs import DiagnoseOutput, EmbedOutput, TrainOutput
from treerank.tasks.diagnose import DiagnosticsSettings, diagnose

__all__ = ["DiagnoseStage"]


@dataclass(kw_only=True)
class DiagnoseStage(RunStage):
    """:func:`~treerank.diagnostics.procedure.run_diagnostics` of ``run`` on ``store``."""

    produces = DiagnoseOutput
    store: StageId
    trained: StageId
    settings: DiagnoseConfig
    k: int

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
        return cls.of(
            ctx, sid, (store, trained), inputs, store=store, trained=trained, settings=settings, k=k
        )

    def run(self, d: Path, deps: Deps) -> DiagnoseOutput:
        doc = diagnose(
            deps.get(self.trained, TrainOutput).checkpoint,
            deps.get(self.store, EmbedOutput).open(),
            d,
            DiagnosticsSettings(
                baseline=self.settings.baseline, k=self.k, probe_seed=self.settings.probe_seed
            ),
            progress=self.ctx.progress,
            device=self.ctx.device,
        )
        crash_point("diagnose", "after-diagnostics")
        return DiagnoseOutput(d, doc)
