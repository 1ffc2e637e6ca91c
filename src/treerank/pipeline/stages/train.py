"""``train:<dataset>:<run>``: one model run trained on a training split (its own directory).

It reads the training split (``embed:``) and the derived training data its family's config
asks for: mined negatives (``mine:``), a pseudo split (``pseudo:``), teacher runs
(``teacher:``), each from that stage's directory through a read-only store view
(:meth:`treerank.store.EmbeddingStore.with_derived`), so a missing edge fails loudly instead of
computing (or writing) anything outside this stage's directory.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import yaml

from treerank.faults import crash_point
from treerank.pipeline.identity import RunId, StageId
from treerank.pipeline.stages.graph import Deps, RunContext, RunStage
from treerank.pipeline.stages.outputs import (
    EmbedOutput,
    MineOutput,
    PseudoOutput,
    TeacherOutput,
    TrainOutput,
)
from treerank.store import EmbeddingStore
from treerank.tasks.train import train_model

__all__ = ["TrainStage"]


@dataclass(kw_only=True)
class TrainStage(RunStage):
    """Train ``family`` with ``config`` (one seed's, for a seeded model) as run ``run``."""

    produces = TrainOutput
    store: StageId
    family: str
    config: Mapping[str, object]
    where: str

    @classmethod
    def make(
        cls,
        ctx: RunContext,
        run: RunId,
        family: str,
        config: Mapping[str, object],
        resolved: Mapping[str, object],
        store: StageId,
        derived: tuple[StageId, ...] = (),
        where: str = "config",
    ) -> TrainStage:
        """``derived``: the mine / pseudo / teacher stages whose outputs the run trains on."""
        sid = StageId.train(run)
        inputs = {
            "family": family,
            "config": dict(config),
            "resolved_config": dict(resolved),
            "device": ctx.device_key,
        }
        own = {"store": store, "family": family, "config": dict(config), "where": where}
        return cls.of(ctx, sid, (store, *derived), inputs, **own)

    def open_store(self, deps: Deps) -> EmbeddingStore:
        """The training split as a read-only view over the derived stages' directories."""
        teachers = deps.of_kind(TeacherOutput)
        pseudo = deps.of_kind(PseudoOutput)
        return (
            deps.get(self.store, EmbedOutput)
            .open()
            .with_derived(
                arrays_read=tuple(m.arrays for m in deps.of_kind(MineOutput))
                + tuple(t.arrays for t in teachers if t.queries != "pseudo"),
                pseudo_roots=tuple(p.root for p in pseudo),
                pseudo_arrays=tuple(t.arrays for t in teachers if t.queries == "pseudo"),
            )
        )

    def run(self, d: Path, deps: Deps) -> TrainOutput:
        (d / "config.yaml").write_text(
            yaml.safe_dump({"family": self.family, **self.config}, sort_keys=True)
        )
        res = train_model(
            self.family,
            self.open_store(deps),
            dict(self.config),
            d / "checkpoint",
            progress=self.ctx.progress,
            where=self.where,
            device=self.ctx.device,
        )
        crash_point("train", "after-weights")
        return TrainOutput(d / "checkpoint", self.family, res.summary)
