"""``mine:<dataset>:<part>``: BM25 hard negatives of a training split, in the stage's own dir.

One stage per distinct mining setting (sidecar array name, depth, and whether a model wants
mined negatives always or only when the split has no graded negatives, ``auto``): models whose
settings agree share it. The training stages read the array from this stage's directory through
a store view (:meth:`treerank.store.EmbeddingStore.with_derived`); the training store itself is
never written.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from treerank.pipeline.identity import StageId
from treerank.pipeline.stages.graph import Deps, RunContext, RunStage
from treerank.pipeline.stages.outputs import EmbedOutput, MineOutput
from treerank.tasks.train import ensure_mined_negatives

__all__ = ["MineSettings", "MineStage"]


@dataclass(frozen=True)
class MineSettings:
    """The mining part of a dense family's ``data`` section (``SamplerConfig``'s fields).

    Attributes:
        hard_negatives: ``mined`` (always) or ``auto`` (only when no candidate has grade 0).
        n_hard: hard negatives per query (> 0 here). mined_array: the sidecar array's name.
        mine_depth: BM25 ranks mined per query.
    """

    hard_negatives: str
    n_hard: int
    mined_array: str
    mine_depth: int

    @property
    def part(self) -> str:
        """The stage name's last part: ``<array>-<depth>`` (``-always`` for ``mined``)."""
        tail = "-always" if self.hard_negatives == "mined" else ""
        return f"{self.mined_array}-{self.mine_depth}{tail}"


@dataclass(kw_only=True)
class MineStage(RunStage):
    """Mine BM25 negatives of the training split ``store`` into ``<dir>/arrays/``."""

    produces = MineOutput
    store: StageId
    settings: MineSettings

    @classmethod
    def make(cls, ctx: RunContext, store: StageId, settings: MineSettings) -> MineStage:
        sid = StageId.derived("mine", store.dataset, settings.part)
        inputs = {
            "hard_negatives": settings.hard_negatives,
            "mined_array": settings.mined_array,
            "mine_depth": settings.mine_depth,
        }
        return cls.of(ctx, sid, (store,), inputs, store=store, settings=settings)

    def run(self, d: Path, deps: Deps) -> MineOutput:
        view = deps.get(self.store, EmbedOutput).open().with_derived(d / "arrays")
        meta = ensure_mined_negatives(view, self.settings)
        return MineOutput(d / "arrays", self.settings.mined_array, meta)
