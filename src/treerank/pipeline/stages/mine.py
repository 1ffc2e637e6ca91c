"""``mine:<dataset>:<part>``: BM25 hard negatives of a training split, in the stage's own dir;
``denoise:<dataset>:<part>``: those negatives with the ones a cross-encoder scores as positives
dropped (RocketQA, ``data.denoise``), in its own dir.

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
from treerank.pipeline.stages.base import folder_identity
from treerank.pipeline.stages.graph import Deps, RunContext, RunStage
from treerank.pipeline.stages.outputs import DenoiseOutput, EmbedOutput, MineOutput
from treerank.tasks.train import ensure_denoised_negatives, ensure_mined_negatives
from treerank.training.denoise import DenoiseJob

__all__ = ["DenoiseStage", "MineSettings", "MineStage"]


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


@dataclass(kw_only=True)
class DenoiseStage(RunStage):
    """Denoise the ``mine`` stage's negatives of ``store`` with ``data``'s cross-encoder into
    ``<dir>/arrays/`` (:func:`~treerank.tasks.train.ensure_denoised_negatives`). Keyed on the
    settings, the query sample and the cross-encoder folder's bytes."""

    produces = DenoiseOutput
    store: StageId
    mine: StageId
    job: DenoiseJob  # a data section's denoise_job(): settings, mined array, query sample

    @classmethod
    def make(cls, ctx: RunContext, store: StageId, mine: StageId, job: DenoiseJob) -> DenoiseStage:
        sid = StageId.derived("denoise", store.dataset, f"{mine.part}-{job.array}")
        inputs = {**job.key(), "scorer_folder": folder_identity(str(job.settings.path))}
        return cls.of(ctx, sid, (store, mine), inputs, store=store, mine=mine, job=job)

    def run(self, d: Path, deps: Deps) -> DenoiseOutput:
        view = (
            deps.get(self.store, EmbedOutput)
            .open()
            .with_derived(
                arrays_write=d / "arrays", arrays_read=(deps.get(self.mine, MineOutput).arrays,)
            )
        )
        meta = ensure_denoised_negatives(view, self.job, progress=self.ctx.progress)
        assert meta is not None
        return DenoiseOutput(d / "arrays", str(meta["array"]), meta)
