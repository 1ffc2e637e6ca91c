"""What each stage of ``treerank run`` hands to the stages that read it: small frozen records.

A stage's ``stage.json`` holds ``{"name", "key", "seconds", "finished_at", "summary"}``; the
``summary`` is its output's :meth:`Output.to_json`, and a reused stage's output is rebuilt with
:meth:`Output.from_json` from that file and the stage's directory. Paths are never stored: every
path an output names is derived from the directory the stage lives in, so a stage directory that
was renamed into place (or linked from a sweep's stage cache) still names its own files.
``from_json`` is strict: a missing or mistyped field raises :class:`OutputFormatError`, and the
runner then runs the stage again rather than guessing (there is no ``.get`` with a default).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from treerank.pipeline.stages.base import STAGE_FILE

__all__ = [
    "DiagnoseOutput",
    "EmbedOutput",
    "EvaluateOutput",
    "FinetuneOutput",
    "MineOutput",
    "Output",
    "OutputFormatError",
    "PseudoOutput",
    "ReembedOutput",
    "TeacherOutput",
    "TrainOutput",
]

JSONDoc = Mapping[str, object]


class OutputFormatError(ValueError):
    """A ``stage.json`` summary that is not the output its stage writes (an older layout)."""


def _get(doc: JSONDoc, key: str, kind: type, where: Path) -> object:
    if key not in doc:
        raise OutputFormatError(f"{where / STAGE_FILE}: summary has no {key!r}")
    value = doc[key]
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise OutputFormatError(
            f"{where / STAGE_FILE}: summary.{key} is {type(value).__name__}, not {kind.__name__}"
        )
    return value


def _str(doc: JSONDoc, key: str, where: Path) -> str:
    return str(_get(doc, key, str, where))


def _int(doc: JSONDoc, key: str, where: Path) -> int:
    value = _get(doc, key, int, where)
    assert isinstance(value, int)
    return value


def _dict(doc: JSONDoc, key: str, where: Path) -> dict[str, object]:
    value = _get(doc, key, dict, where)
    assert isinstance(value, dict)
    return dict(value)


def _opt_dict(doc: JSONDoc, key: str, where: Path) -> dict[str, object] | None:
    return None if doc.get(key) is None else _dict(doc, key, where)


@dataclass(frozen=True)
class Output:
    """Base of every stage output: a frozen record that renders to, and is read back from, the
    ``summary`` of its stage's ``stage.json``."""

    kind: ClassVar[str] = ""

    def to_json(self) -> dict[str, object]:
        """The ``summary`` written to ``stage.json`` (JSON types only)."""
        raise NotImplementedError

    @classmethod
    def from_json(cls, doc: JSONDoc, path: Path) -> Output:
        """The output of the finished stage in directory ``path`` whose summary is ``doc``.

        Raises:
            OutputFormatError: ``doc`` lacks a field or has one of another type.
        """
        raise NotImplementedError


@dataclass(frozen=True)
class EmbedOutput(Output):
    """One embedded (or given) split.

    Attributes:
        store: the split directory (the stage's own, or the user's given store).
        stats: the store statistics (``n_queries``, ``n_passages``, ``k``, ...; the report's).
        dim: the vector dimension of a Go-tool store (``datasets[].dim``), else None.
    """

    kind: ClassVar[str] = "embed"
    store: Path
    stats: Mapping[str, object]
    dim: int | None = None

    def to_json(self) -> dict[str, object]:
        return dict(self.stats)

    @classmethod
    def from_json(cls, doc: JSONDoc, path: Path) -> EmbedOutput:
        return cls(path, dict(doc))


@dataclass(frozen=True)
class MineOutput(Output):
    """BM25 hard negatives mined for a training split (``mine:<dataset>:<part>``).

    Attributes:
        arrays: the directory holding ``<array>.npy`` / ``<array>.json`` (the stage's own).
        array: the sidecar array's name.
        meta: the mining metadata (depth, BM25 parameters, counts); None when the split did
            not need mining (``hard_negatives: auto`` and the split has graded negatives).
    """

    kind: ClassVar[str] = "mine"
    arrays: Path
    array: str
    meta: Mapping[str, object] | None

    def to_json(self) -> dict[str, object]:
        return {"array": self.array, "meta": None if self.meta is None else dict(self.meta)}

    @classmethod
    def from_json(cls, doc: JSONDoc, path: Path) -> MineOutput:
        return cls(path / "arrays", _str(doc, "array", path), _opt_dict(doc, "meta", path))


@dataclass(frozen=True)
class PseudoOutput(Output):
    """A pseudo split of a training split's corpus (``pseudo:<dataset>:<part>``).

    Attributes:
        root: the stage's directory, a pseudo root of the store views that read the split.
        split: the pseudo split's directory (``root / pseudo-<digest>``).
    """

    kind: ClassVar[str] = "pseudo"
    root: Path
    split: Path

    def to_json(self) -> dict[str, object]:
        return {"split": self.split.name}

    @classmethod
    def from_json(cls, doc: JSONDoc, path: Path) -> PseudoOutput:
        return cls(path, path / _str(doc, "split", path))


@dataclass(frozen=True)
class TeacherOutput(Output):
    """A teacher system's run over training or pseudo queries (``teacher:<dataset>:<part>``).

    Attributes:
        arrays: the directory holding ``<stem>-ids.npy`` / ``<stem>-scores.npy``.
        queries: ``train`` (the training split's queries) or ``pseudo``.
        system: the teacher's system spec. k: its depth.
    """

    kind: ClassVar[str] = "teacher"
    arrays: Path
    queries: str
    system: str
    k: int

    def to_json(self) -> dict[str, object]:
        return {"queries": self.queries, "system": self.system, "k": self.k}

    @classmethod
    def from_json(cls, doc: JSONDoc, path: Path) -> TeacherOutput:
        return cls(
            path / "arrays",
            _str(doc, "queries", path),
            _str(doc, "system", path),
            _int(doc, "k", path),
        )


@dataclass(frozen=True)
class TrainOutput(Output):
    """One trained run (``train:<dataset>:<run>``).

    Attributes:
        checkpoint: the checkpoint directory (``<stage dir>/checkpoint``).
        family: the model family. summary: the trainer's JSON summary (the report's).
    """

    kind: ClassVar[str] = "train"
    checkpoint: Path
    family: str
    summary: Mapping[str, object]

    def to_json(self) -> dict[str, object]:
        return {"family": self.family, "summary": dict(self.summary)}

    @classmethod
    def from_json(cls, doc: JSONDoc, path: Path) -> TrainOutput:
        return cls(path / "checkpoint", _str(doc, "family", path), _dict(doc, "summary", path))


@dataclass(frozen=True)
class EvaluateOutput(Output):
    """One dataset's comparison (``evaluate:<dataset>``): the report's tables.

    Attributes:
        dir: the stage directory (runs, per-query metrics, plots).
        comparison: :meth:`treerank.evaluation.compare.Comparison.to_dict`.
        markdown: the comparison table. family_reports: each family's report part.
        overlap / overlap_markdown: the baseline-overlap analysis (None / "" when absent).
        lexical_gap / lexical_gap_markdown: the lexical-gap breakdown (None / "" when absent).
    """

    kind: ClassVar[str] = "evaluate"
    dir: Path
    comparison: Mapping[str, object]
    markdown: str
    family_reports: Mapping[str, object] = field(default_factory=dict)
    overlap: Mapping[str, object] | None = None
    overlap_markdown: str = ""
    lexical_gap: Mapping[str, object] | None = None
    lexical_gap_markdown: str = ""

    def to_json(self) -> dict[str, object]:
        doc: dict[str, object] = {"comparison": dict(self.comparison), "markdown": self.markdown}
        if self.family_reports:
            doc["family_reports"] = dict(self.family_reports)
        if self.overlap is not None:
            doc["overlap"] = dict(self.overlap)
            doc["overlap_markdown"] = self.overlap_markdown
        if self.lexical_gap is not None:
            doc["lexical_gap"] = dict(self.lexical_gap)
            doc["lexical_gap_markdown"] = self.lexical_gap_markdown
        return doc

    @classmethod
    def from_json(cls, doc: JSONDoc, path: Path) -> EvaluateOutput:
        overlap = _opt_dict(doc, "overlap", path)
        gap = _opt_dict(doc, "lexical_gap", path)
        return cls(
            path,
            _dict(doc, "comparison", path),
            _str(doc, "markdown", path),
            _opt_dict(doc, "family_reports", path) or {},
            overlap,
            "" if overlap is None else _str(doc, "overlap_markdown", path),
            gap,
            "" if gap is None else _str(doc, "lexical_gap_markdown", path),
        )


@dataclass(frozen=True)
class DiagnoseOutput(Output):
    """One dataset's diagnostics (``diagnose:<dataset>``).

    Attributes:
        dir: the stage directory (``report.md``, plots). doc: the diagnostics JSON.
    """

    kind: ClassVar[str] = "diagnose"
    dir: Path
    doc: Mapping[str, object]

    def to_json(self) -> dict[str, object]:
        return dict(self.doc)

    @classmethod
    def from_json(cls, doc: JSONDoc, path: Path) -> DiagnoseOutput:
        if not doc:
            raise OutputFormatError(f"{path / STAGE_FILE}: empty diagnostics summary")
        return cls(path, dict(doc))


@dataclass(frozen=True)
class FinetuneOutput(Output):
    """A tuned encoder (``finetune:<dataset>:<name>``).

    Attributes:
        run: the fine-tune's folder (``model/``, ``checkpoints/``, ``finetune.json``).
        family: ``biencoder`` / ``query-tower``. fingerprint / base_fingerprint: the tuned and
            the starting weights' fingerprints. checkpoint: the checkpoint the weights are from.
        summary: steps, losses, cost.
    """

    kind: ClassVar[str] = "finetune"
    run: Path
    family: str
    fingerprint: str
    base_fingerprint: str
    checkpoint: str
    summary: Mapping[str, object]

    def to_json(self) -> dict[str, object]:
        return {
            "family": self.family,
            "fingerprint": self.fingerprint,
            "base_fingerprint": self.base_fingerprint,
            "checkpoint": self.checkpoint,
            "summary": dict(self.summary),
        }

    @classmethod
    def from_json(cls, doc: JSONDoc, path: Path) -> FinetuneOutput:
        return cls(
            path,
            _str(doc, "family", path),
            _str(doc, "fingerprint", path),
            _str(doc, "base_fingerprint", path),
            _str(doc, "checkpoint", path),
            _dict(doc, "summary", path),
        )


@dataclass(frozen=True)
class ReembedOutput(Output):
    """A split embedded again by a tuned encoder (``reembed:<dataset>:<name>:<split>``).

    Attributes:
        store: the new split directory (the stage's own); its ``meta.json`` names the parent
            store, the checkpoint and the tuned weights' fingerprint.
        fingerprint: the tuned encoder's. n_queries / n_passages: its sizes.
    """

    kind: ClassVar[str] = "reembed"
    store: Path
    fingerprint: str
    n_queries: int
    n_passages: int

    def to_json(self) -> dict[str, object]:
        return {
            "fingerprint": self.fingerprint,
            "n_queries": self.n_queries,
            "n_passages": self.n_passages,
        }

    @classmethod
    def from_json(cls, doc: JSONDoc, path: Path) -> ReembedOutput:
        return cls(
            path,
            _str(doc, "fingerprint", path),
            _int(doc, "n_queries", path),
            _int(doc, "n_passages", path),
        )
