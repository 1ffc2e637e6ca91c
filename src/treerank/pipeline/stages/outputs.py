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

import typing
from collections.abc import Mapping
from dataclasses import MISSING, Field, dataclass, field, fields
from pathlib import Path
from typing import ClassVar

from treerank.pipeline.stages.base import STAGE_FILE
from treerank.store import EmbeddingStore

__all__ = [
    "CrossEncoderOutput",
    "DenoiseOutput",
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


def _json_kind(hint: object) -> tuple[type, bool]:
    """``(JSON type, None allowed)`` of a field annotation: ``str``, ``int``, a mapping
    (``dict``), each optionally ``| None``."""
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    optional = len(args) < len(typing.get_args(hint))
    base = args[0] if optional and len(args) == 1 else hint
    origin = typing.get_origin(base) or base
    if origin in (str, int):
        assert isinstance(origin, type)
        return origin, optional
    if isinstance(origin, type) and issubclass(origin, Mapping):
        return dict, optional
    raise TypeError(f"an output field is str, int or a mapping (| None), not {hint!r}")


@dataclass(frozen=True)
class Output:
    """Base of every stage output: a frozen record that renders to, and is read back from, the
    ``summary`` of its stage's ``stage.json``.

    Generic over the fields: the first field is a path derived from the stage's directory
    (``path / place``, or the directory itself when ``place`` is ``""``) and is never stored;
    every other field is a ``str``, an ``int`` or a mapping (each may be ``| None``) stored under
    its own name. A field with a default is left out of the summary while it equals the default
    and read back as the default when absent; a field without one must be present with its
    type. A subclass states only its fields and ``place`` (``EmbedOutput``, ``PseudoOutput`` and
    ``DiagnoseOutput``, whose summaries have another shape, override both methods).
    """

    kind: ClassVar[str] = ""
    place: ClassVar[str] = ""

    def to_json(self) -> dict[str, object]:
        """The ``summary`` written to ``stage.json`` (JSON types only)."""
        doc: dict[str, object] = {}
        for f in fields(self)[1:]:
            value = getattr(self, f.name)
            if _has_default(f) and value == _default(f):
                continue
            doc[f.name] = dict(value) if isinstance(value, Mapping) else value
        return doc

    @classmethod
    def from_json(cls, doc: JSONDoc, path: Path) -> Output:
        """The output of the finished stage in directory ``path`` whose summary is ``doc``.

        Raises:
            OutputFormatError: ``doc`` lacks a field or has one of another type.
        """
        hints = typing.get_type_hints(cls)
        values: list[object] = [path / cls.place if cls.place else path]
        for f in fields(cls)[1:]:
            kind, optional = _json_kind(hints[f.name])
            if f.name not in doc and _has_default(f):
                values.append(_default(f))
            elif optional and f.name in doc and doc[f.name] is None:
                values.append(None)
            else:
                value = _get(doc, f.name, kind, path)
                values.append(dict(value) if isinstance(value, dict) else value)
        return cls(*values)


def _has_default(f: Field[object]) -> bool:
    return f.default is not MISSING or f.default_factory is not MISSING


def _default(f: Field[object]) -> object:
    if f.default is not MISSING:
        return f.default
    return f.default_factory()  # type: ignore[operator]  # a field with a default has one


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

    def open(self) -> EmbeddingStore:
        """The split as an opened store (``dim`` for a Go-tool store).

        Raises:
            StoreFormatError: the directory holds no store.
        """
        return EmbeddingStore.open(self.store, dim=self.dim)


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
    place: ClassVar[str] = "arrays"
    arrays: Path
    array: str
    meta: Mapping[str, object] | None


@dataclass(frozen=True)
class DenoiseOutput(MineOutput):
    """A training split's mined negatives, denoised by a cross-encoder
    (``denoise:<dataset>:<part>``; fields as :class:`MineOutput`'s, ``meta`` the counts and
    cost of ``treerank.tasks.train.ensure_denoised_negatives``)."""

    kind: ClassVar[str] = "denoise"


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
        return cls(path, path / str(_get(doc, "split", str, path)))


@dataclass(frozen=True)
class TeacherOutput(Output):
    """A teacher system's run over training or pseudo queries (``teacher:<dataset>:<part>``).

    Attributes:
        arrays: the directory holding ``<stem>-ids.npy`` / ``<stem>-scores.npy``.
        queries: ``train`` (the training split's queries) or ``pseudo``.
        system: the teacher's system spec. k: its depth.
    """

    kind: ClassVar[str] = "teacher"
    place: ClassVar[str] = "arrays"
    arrays: Path
    queries: str
    system: str
    k: int


@dataclass(frozen=True)
class TrainOutput(Output):
    """One trained run (``train:<dataset>:<run>``).

    Attributes:
        checkpoint: the checkpoint directory (``<stage dir>/checkpoint``).
        family: the model family. summary: the trainer's JSON summary (the report's).
    """

    kind: ClassVar[str] = "train"
    place: ClassVar[str] = "checkpoint"
    checkpoint: Path
    family: str
    summary: Mapping[str, object]


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


@dataclass(frozen=True)
class CrossEncoderOutput(Output):
    """A trained cross-encoder (``finetune:<dataset>:<name>`` of a ``family: cross-encoder``
    entry): a reranker, so no split is embedded again.

    Attributes:
        model: the ``CrossEncoder`` folder (``<stage dir>/model``).
        fingerprint: its weights' fingerprint (``sha256:<hex>``; the evaluate stage pins it).
        summary: the run's ``results.json`` (config, steps, pairs, loss, cost).
    """

    kind: ClassVar[str] = "cross-encoder"
    place: ClassVar[str] = "model"
    model: Path
    fingerprint: str
    summary: Mapping[str, object]
