"""``teacher:<dataset>:<part>``: a teacher system's run over training or pseudo queries.

One stage per distinct ``teacher`` source (system, depth, whose queries; ``part`` is the
sidecar stem ``teacher-<digest>``, with the pseudo split's name for pseudo queries); the key
also holds the bytes of every model folder the system reads (a checkpoint, a cross-encoder),
so a teacher retrained in place is run again. The run's
``-ids`` / ``-scores`` arrays are written into the stage's own ``arrays/`` through a store view;
the training split (and the pseudo stage's split) are only read.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from treerank.pipeline.identity import StageId
from treerank.pipeline.stages.base import folder_identity
from treerank.pipeline.stages.graph import Deps, RunContext, RunStage
from treerank.pipeline.stages.outputs import EmbedOutput, PseudoOutput, TeacherOutput
from treerank.search.specs import model_folders
from treerank.store import EmbeddingStore
from treerank.tasks.train import ensure_teacher_run
from treerank.training.data import SourceSpec, teacher_array

__all__ = ["TeacherStage"]


@dataclass(kw_only=True)
class TeacherStage(RunStage):
    """Rank the queries ``spec`` names with its teacher system into ``<dir>/arrays/``."""

    produces = TeacherOutput
    store: StageId
    pseudo: StageId | None
    spec: SourceSpec

    @classmethod
    def make(
        cls, ctx: RunContext, store: StageId, spec: SourceSpec, pseudo: StageId | None
    ) -> TeacherStage:
        """``pseudo``: the pseudo stage whose queries a ``queries: pseudo`` teacher ranks."""
        on_pseudo = spec.queries == "pseudo"
        if on_pseudo and pseudo is None:
            raise ValueError(f"teacher {spec.system}: queries: pseudo needs a pseudo source")
        part = teacher_array(spec) + (f"-{pseudo.part}" if on_pseudo and pseudo else "")
        sid = StageId.derived("teacher", store.dataset, part)
        deps = (store, pseudo) if on_pseudo and pseudo is not None else (store,)
        inputs: dict[str, object] = {**spec.teacher_key(), "queries": spec.queries}
        folders = model_folders(str(spec.system))
        if folders:  # a checkpoint or cross-encoder teacher: its bytes, not only its path
            inputs["model_folders"] = {f: folder_identity(f) for f in folders}
        return cls.of(
            ctx, sid, deps, inputs, store=store, pseudo=pseudo if on_pseudo else None, spec=spec
        )

    def run(self, d: Path, deps: Deps) -> TeacherOutput:
        base = deps.get(self.store, EmbedOutput).open()
        arrays = d / "arrays"
        pseudo = None
        if self.pseudo is not None:
            ps = deps.get(self.pseudo, PseudoOutput)
            pseudo = EmbeddingStore.open(ps.split).with_derived(arrays_write=arrays)
            view = base.with_derived(pseudo_roots=(ps.root,))
        else:
            view = base.with_derived(arrays_write=arrays)
        ensure_teacher_run(view, pseudo, self.spec, progress=self.ctx.progress)
        return TeacherOutput(arrays, self.spec.queries, str(self.spec.system), int(self.spec.k))
