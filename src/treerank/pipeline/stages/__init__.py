"""The stages of ``treerank run``: small typed classes, one module per kind, and their runner.

* :mod:`.base`: one stage directory's life cycle (``run_stage``: reuse on an equal key, build in
  a temporary directory and swap in, Ctrl-C and crash handling), keys (``fingerprint``) and
  content digests;
* :mod:`.outputs`: each stage's frozen output record, written to and read from its
  ``stage.json``;
* :mod:`.graph`: :class:`Stage` (and :class:`RunStage`, the one base of the stage classes), the
  :class:`StageGraph` and its runner, which hands each stage only its declared dependencies'
  outputs;
* one module per stage kind: :mod:`.embed`, :mod:`.mine`, :mod:`.pseudo`, :mod:`.teacher`,
  :mod:`.train`, :mod:`.finetune` (an encoder fine-tune and its re-embedded splits),
  :mod:`.cross_encoder` (a cross-encoder entry of ``finetune:``), :mod:`.evaluate`,
  :mod:`.diagnose` (the report: :mod:`treerank.pipeline.report`).

The names of the old ``treerank.pipeline.stages`` module are importable from here unchanged.
"""

from treerank.pipeline.stages.base import (
    CACHE_DIR,
    DIGESTS_FILE,
    STAGE_FILE,
    StageError,
    StageInterrupted,
    StageRecord,
    content_digests,
    digest_sidecar,
    file_sha256,
    fingerprint,
    read_stage,
    run_stage,
    skip_stage,
)

__all__ = [
    "CACHE_DIR",
    "DIGESTS_FILE",
    "STAGE_FILE",
    "StageError",
    "StageInterrupted",
    "StageRecord",
    "content_digests",
    "digest_sidecar",
    "file_sha256",
    "fingerprint",
    "read_stage",
    "run_stage",
    "skip_stage",
]
