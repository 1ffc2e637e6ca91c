"""``pseudo:<dataset>:<part>``: a pseudo split of a training split's corpus (its own dir).

One stage per distinct ``pseudo`` source setting (``part`` is the split's directory name,
``pseudo-<digest of the settings>``). The split is embedded into the stage's directory in place
(resumable, like an embed stage); training and teacher stages find it through a store view whose
pseudo roots hold this directory.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

from treerank.pipeline.identity import StageId
from treerank.pipeline.stages.graph import Deps, RunContext, RunStage
from treerank.pipeline.stages.outputs import EmbedOutput, PseudoOutput
from treerank.training.data import SourceSpec, pseudo_dir, pseudo_dir_name
from treerank.training.pseudo import build_pseudo_store

__all__ = ["PseudoStage"]


@dataclass(kw_only=True)
class PseudoStage(RunStage):
    """Build the pseudo split of ``spec`` for the training split ``store``."""

    produces = PseudoOutput
    resumes = True
    store: StageId
    spec: SourceSpec

    @classmethod
    def make(cls, ctx: RunContext, store: StageId, spec: SourceSpec) -> PseudoStage:
        sid = StageId.derived("pseudo", store.dataset, pseudo_dir_name(spec))
        inputs = {"pseudo": asdict(spec.pseudo_config())}
        return cls.of(ctx, sid, (store,), inputs, store=store, spec=spec)

    def run(self, d: Path, deps: Deps) -> PseudoOutput:
        view = deps.get(self.store, EmbedOutput).open().with_derived(pseudo_roots=(d,))
        path = pseudo_dir(view, self.spec)
        if not (path / "meta.json").is_file():
            build_pseudo_store(
                view, self.spec.pseudo_config(), out_dir=path, progress=self.ctx.progress
            )
        return PseudoOutput(d, path)
