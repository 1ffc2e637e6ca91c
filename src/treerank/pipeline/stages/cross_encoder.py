"""``finetune:<dataset>:<name>`` of a ``family: cross-encoder`` entry: a reranker of its own.

A ``finetune: {<name>: {family: cross-encoder, ..., rerank: {first_stage, depth}}}`` entry of
the experiment (``treerank finetune``'s config shape, ``configs/finetune/*cross_encoder*.yaml``,
plus the ``rerank`` key) trains a cross-encoder on each dataset's train split into the stage's
own directory (:func:`treerank.pipeline.finetune.train_cross_encoder_run`, the call
``treerank finetune`` makes after mining): ``model/`` (the ``CrossEncoder`` folder),
``checkpoints/``, ``cross_encoder.json`` and ``results.json``. With
``data.hard_negatives: mined`` it reads the BM25 negatives of the ``mine:`` stage that dense
models and encoder fine-tunes with the same depth share; the train split (a user's store
included) is only read. No split is embedded again: a cross-encoder does not embed.

The evaluate stage then scores the system ``<name>`` =
``rescore:<first_stage>:depth=<depth>,scorer=ce:<stage dir>/model,fingerprint=<its weights>``
(:class:`CrossEncoderRerank`): pinned to the weights this stage trained, so a folder changed
under the run is refused instead of scored. Keys: the stage's holds the parsed config (every
default), the starting weights (a ``model.base`` folder's bytes), a teacher's bytes, the device
and its edges; the first stage and depth are the evaluate stage's (changing them re-runs only
the evaluation, never the training).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from treerank.pipeline.config import RerankSettings
from treerank.pipeline.finetune import train_cross_encoder_run
from treerank.pipeline.identity import StageId
from treerank.pipeline.stages.base import folder_identity
from treerank.pipeline.stages.finetune import FinetuneStage
from treerank.pipeline.stages.graph import Deps
from treerank.pipeline.stages.outputs import CrossEncoderOutput
from treerank.training.finetune_config import FinetuneConfig

__all__ = ["CrossEncoderRerank", "CrossEncoderStage"]


def _teacher_weights(cfg: FinetuneConfig) -> str | None:
    """A ``margin-mse`` teacher's identity: the bytes of its ``ce:<dir>`` folder (None: none)."""
    teacher = cfg.train.data.teacher
    return None if teacher is None else folder_identity(str(Path(teacher[len("ce:") :])))


@dataclass(kw_only=True)
class CrossEncoderStage(FinetuneStage):
    """Train a cross-encoder on the train split ``store`` with ``config`` into the stage's
    directory (BM25 negatives from ``mine`` with ``data.hard_negatives: mined``); made with
    :meth:`FinetuneStage.make` (``name``: the entry's), keyed also on a teacher's bytes."""

    produces = CrossEncoderOutput

    @classmethod
    def more_inputs(cls, config: FinetuneConfig) -> dict[str, object]:
        return {"teacher_weights": _teacher_weights(config)}

    def run(self, d: Path, deps: Deps) -> CrossEncoderOutput:  # type: ignore[override]
        train, mined = self.training_data(deps)
        if self.mine is not None and mined is None:
            raise FileNotFoundError(f"{self.mine.name}: its mined negatives are missing")
        results = train_cross_encoder_run(
            self.config,
            train,
            d,
            mined=mined,
            device=self.ctx.device,
            log=self.ctx.log if self.ctx.progress else None,
        )
        return CrossEncoderOutput(d / "model", str(results["fingerprint"]), results)


@dataclass(frozen=True)
class CrossEncoderRerank:
    """One reranking system of the evaluate stage: the ``finetune:`` entry ``name``'s
    cross-encoder (trained by ``stage``) over ``settings.first_stage``'s top ``settings.depth``.

    Attributes:
        name: the system name (the entry's name). stage: its :class:`CrossEncoderStage`.
        settings: the entry's :class:`~treerank.pipeline.config.RerankSettings`.
    """

    name: str
    stage: StageId
    settings: RerankSettings

    def key_part(self) -> list[object]:
        """What the evaluate stage's key holds of it (the stage's own key comes by the edge)."""
        s = self.settings
        return [self.name, self.stage.name, s.first_stage, s.depth, s.batch, s.precision]

    def system(self, out: CrossEncoderOutput) -> Any:
        """The pinned ``rescore:`` node over the stage's trained folder
        (:meth:`RerankSettings.system`)."""
        return self.settings.system(out.model, out.fingerprint)
