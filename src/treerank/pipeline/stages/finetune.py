"""``finetune:<dataset>:<name>`` and ``reembed:<dataset>:<name>:<split>``: the encoder itself.

A ``finetune: {<name>: ...}`` entry of the experiment (``treerank finetune``'s config shape,
``configs/finetune/*.yaml``) is fine-tuned on each dataset's train split
(:func:`treerank.training.finetune.finetune`, on sentence-transformers' trainer; BM25 negatives
from a ``mine:`` stage with ``data.hard_negatives: mined``), then every split the dataset
evaluates on is embedded again by the tuned encoder into the re-embed stage's own directory
(:func:`treerank.pipeline.finetune.reembed_split`: ``meta.json`` names the parent store, the
checkpoint and the tuned weights' fingerprint). The evaluate stage scores the system ``<name>``
(cosine over the re-embedded split, :class:`~treerank.pipeline.finetune.TunedStoreSystem`)
beside the frozen-vector systems. Keys: the fine-tune's holds its parsed config (every default),
the starting weights (the train split's key covers the store's encoder; a ``model.base`` path
its bytes), the device and its edges; a re-embed's holds the fine-tune's and the parent split's
keys, so changing only an evaluate option re-runs only the evaluate stage.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Self

import numpy as np

from treerank.pipeline.finetune import finetune_rows, reembed_split
from treerank.pipeline.identity import StageId
from treerank.pipeline.stages.base import folder_identity
from treerank.pipeline.stages.graph import Deps, RunContext, RunStage
from treerank.pipeline.stages.outputs import (
    DenoiseOutput,
    EmbedOutput,
    FinetuneOutput,
    MineOutput,
    Output,
    ReembedOutput,
    TeacherOutput,
)
from treerank.store import EmbeddingStore
from treerank.training.finetune import finetune
from treerank.training.finetune_config import FinetuneConfig

__all__ = ["FinetuneStage", "ReembedStage"]


def _base_weights(cfg: FinetuneConfig) -> str | None:
    """The starting weights' identity: None for the store's own encoder (its key covers it),
    else the bytes of a local ``model.base`` folder (its name when not a local path)."""
    return folder_identity(cfg.train.model.get("base"))  # either family's section


@dataclass(kw_only=True)
class FinetuneStage(RunStage):
    """Fine-tune the train split's encoder with ``config`` into the stage's directory."""

    produces: ClassVar[type[Output]] = FinetuneOutput
    store: StageId
    mine: StageId | None
    config: FinetuneConfig
    denoise: StageId | None = None
    teachers: tuple[StageId, ...] = ()

    @classmethod
    def make(
        cls,
        ctx: RunContext,
        name: str,
        store: StageId,
        config: FinetuneConfig,
        mine: StageId | None = None,
        denoise: StageId | None = None,
        teachers: tuple[StageId, ...] = (),
    ) -> Self:
        """``mine``: the stage whose BM25 negatives ``data.hard_negatives: mined`` trains on;
        ``denoise``: the stage whose denoised pool of them ``data.denoise`` trains on;
        ``teachers``: the teacher stages whose runs ``data.sources`` distils."""
        sid = StageId.finetune(store.dataset, name)
        inputs = {
            "config": config.to_dict(),
            "base_weights": _base_weights(config),
            "device": ctx.device_key,
            **cls.more_inputs(config),
        }
        deps = tuple(d for d in (store, mine, denoise) if d is not None) + teachers
        return cls.of(
            ctx,
            sid,
            deps,
            inputs,
            store=store,
            mine=mine,
            config=config,
            denoise=denoise,
            teachers=teachers,
        )

    @classmethod
    def more_inputs(cls, config: FinetuneConfig) -> dict[str, object]:
        """A subclass's own key inputs (none here)."""
        return {}

    def training_data(self, deps: Deps) -> tuple[EmbeddingStore, np.ndarray | None]:
        """The train split as a view reading the mine, denoise and teacher stages' arrays
        (nothing is written into the split) and the negatives it trains on: the denoised pool
        with a denoise stage, else the mined negatives (None: not mined, or not found)."""
        made = [deps.get(s, MineOutput) for s in (self.mine, self.denoise) if s is not None]
        taught = [deps.get(s, TeacherOutput).arrays for s in self.teachers]
        train = (
            deps.get(self.store, EmbedOutput)
            .open()
            .with_derived(arrays_read=tuple(m.arrays for m in made) + tuple(taught))
        )
        mined = None
        if made:
            found = train.load_array(made[-1].array)
            mined = None if found is None else np.asarray(found)
        return train, mined

    def run(self, d: Path, deps: Deps) -> FinetuneOutput:
        train, mined = self.training_data(deps)
        rows, _held = finetune_rows(train, self.config)
        denoised = None if self.denoise is None else deps.get(self.denoise, DenoiseOutput).meta
        ft = finetune(
            train,
            self.config,
            d,
            train_rows=rows,
            mined=mined,
            denoised=denoised,
            device=self.ctx.device,
            progress=self.ctx.progress,
            log=self.ctx.log if self.ctx.progress else None,
        )
        summary = {k: v for k, v in ft.summary.items() if k != "log"}
        return FinetuneOutput(
            d,
            self.config.family,
            ft.fingerprint,
            ft.base_fingerprint,
            ft.checkpoint,
            summary,
        )


@dataclass(kw_only=True)
class ReembedStage(RunStage):
    """Embed the parent split ``store`` again with the tuned encoder of ``tuned``."""

    produces = ReembedOutput
    store: StageId
    tuned: StageId

    @classmethod
    def make(cls, ctx: RunContext, tuned: StageId, store: StageId) -> ReembedStage:
        assert tuned.part is not None and store.split is not None
        sid = StageId.reembed(store.dataset, tuned.part, store.split)
        return cls.of(ctx, sid, (tuned, store), {}, store=store, tuned=tuned)

    def run(self, d: Path, deps: Deps) -> ReembedOutput:
        parent = deps.get(self.store, EmbedOutput)
        tuned = deps.get(self.tuned, FinetuneOutput)
        new = reembed_split(
            tuned.run,
            parent.open(),
            d,
            overwrite=True,
            progress=self.ctx.progress,
        )
        return ReembedOutput(
            d, str(new.encoder_fingerprint), int(new.n_queries), int(new.n_passages)
        )
