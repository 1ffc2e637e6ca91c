"""The stage graph of ``treerank run`` and its runner.

A :class:`Stage` is a small typed object: its :class:`~treerank.pipeline.identity.StageId`, its
directory, the stages whose outputs it reads (``deps``), its own JSON-able ``inputs`` and
``run(dir, deps) -> Output``. :class:`StageGraph` keys every stage when it is added
(``fingerprint("stage", id, treerank version, inputs, [(dep name, dep key), ...])``, each dep
key read through :meth:`StageGraph.key_of`, which refuses an undeclared edge), and
:meth:`StageGraph.execute` runs them in order, handing each stage a :class:`Deps` that holds
exactly its declared dependencies' outputs: a stage cannot read what it did not declare, so its
key always covers what it read.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, Self, TypeVar

from treerank.kernels.device import Device
from treerank.pipeline.identity import StageId, UnknownDependencyError
from treerank.pipeline.stages.base import (
    StageRecord,
    fingerprint,
    read_stage,
    run_stage,
    skip_stage,
)
from treerank.pipeline.stages.outputs import Output, OutputFormatError

__all__ = ["Deps", "RunContext", "RunStage", "Skip", "Stage", "StageGraph"]

OutT = TypeVar("OutT", bound=Output)


@dataclass(frozen=True)
class RunContext:
    """What every stage of one run shares.

    Attributes:
        output_dir: the run's output directory. source: the experiment file (error messages).
        device: the experiment's device (parsed once, from the YAML ``device:``); its
            resolved text (``device_key``) is what stage keys hold.
        progress: progress bars inside stages. force: re-run every stage.
        log: where stage lines go.
    """

    output_dir: Path
    source: str
    device: Device
    progress: bool = True
    force: bool = False
    log: Callable[[str], None] = print

    @property
    def device_key(self) -> str:
        """The device as stage keys hold it (``auto`` resolved: ``cpu`` or ``cuda:n``)."""
        return self.device.resolved_text()


class Deps:
    """The outputs of the stages one stage declared, and nothing else."""

    def __init__(self, reader: StageId, outputs: Mapping[StageId, Output]) -> None:
        self.reader = reader
        self._outputs = dict(outputs)

    def get(self, stage: StageId, kind: type[OutT]) -> OutT:
        """The output of ``stage``, which must be a declared dependency of type ``kind``.

        Raises:
            UnknownDependencyError: ``stage`` was not declared by the reader.
            TypeError: its output is not a ``kind``.
        """
        if stage not in self._outputs:
            raise UnknownDependencyError(f"stage {self.reader.name} did not declare {stage.name}")
        out = self._outputs[stage]
        if not isinstance(out, kind):
            raise TypeError(f"{stage.name}: output is {type(out).__name__}, not {kind.__name__}")
        return out

    def of_kind(self, kind: type[OutT]) -> list[OutT]:
        """Every declared dependency's output of type ``kind``, in declaration order."""
        return [o for o in self._outputs.values() if isinstance(o, kind)]


@dataclass
class Stage:
    """One node of the graph (subclasses implement :meth:`run`).

    Attributes:
        id: the stage's identity (its name and default path are rendered from it).
        path: its directory in the run's output.
        deps: the stages whose outputs it reads; their keys are part of its key.
        inputs: its own configuration (JSON-able; part of its key).
        output: the type of what it produces.
        in_place: the work resumes in place (embedding).
    """

    id: StageId
    path: Path
    deps: tuple[StageId, ...]
    inputs: Mapping[str, object]
    output: type[Output] = field(default=Output, kw_only=True)
    in_place: bool = field(default=False, kw_only=True)

    def given(self) -> tuple[str, Output] | None:
        """``(key, output)`` of a stage with nothing to run (a user's store); None otherwise."""
        return None

    def run(self, d: Path, deps: Deps) -> Output:
        """Do the work into directory ``d`` (a temporary one, or :attr:`path` when
        ``in_place``), reading only ``deps``; return the output."""
        raise NotImplementedError(f"{type(self).__name__}.run")


@dataclass(kw_only=True)
class RunStage(Stage):
    """The base of the stages of ``treerank run``: a subclass states only what differs (its
    own fields, :attr:`produces`, :attr:`resumes`, how it builds its id and inputs in ``make``,
    and :meth:`run`); :meth:`of` fills in the rest.

    Attributes:
        ctx: the run's shared context (output directory, device, progress, log).
    """

    produces: ClassVar[type[Output]] = Output
    """The type of the stage's output (the ``output`` every stage of this class gets)."""
    resumes: ClassVar[bool] = False
    """The work resumes in place (``in_place``: embedding, pseudo splits)."""

    ctx: RunContext

    @classmethod
    def of(
        cls,
        ctx: RunContext,
        sid: StageId,
        deps: tuple[StageId, ...],
        inputs: Mapping[str, object],
        **own: object,
    ) -> Self:
        """The stage ``sid`` in its directory of the run (``sid.path(ctx.output_dir)``),
        reading ``deps``, keyed on ``inputs``; ``own``: the subclass's own fields."""
        return cls(
            sid,
            sid.path(ctx.output_dir),
            deps,
            inputs,
            output=cls.produces,
            in_place=cls.resumes,
            ctx=ctx,
            **own,  # type: ignore[arg-type]
        )


@dataclass
class Skip:
    """A stage that does nothing in this experiment, with the reason (shown in the report)."""

    name: str
    reason: str
    path: Path


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


class StageGraph:
    """The stages of one run in execution order, each key computed when the stage is added.

    A stage may only read (declare as ``deps``) stages added before it; asking for anything
    else raises :class:`~treerank.pipeline.identity.UnknownDependencyError`.
    """

    def __init__(self) -> None:
        self.stages: dict[StageId, Stage] = {}
        self.keys: dict[StageId, str] = {}
        self.order: list[Stage | Skip] = []

    def add(self, stage: Stage) -> str:
        """Add ``stage`` and return its key.

        Raises:
            UnknownDependencyError: a dependency that is not a stage of the graph (yet).
            ValueError: a stage added twice.
        """
        if stage.id in self.stages:
            raise ValueError(f"stage {stage.id.name} added twice")
        for dep in stage.deps:
            if dep not in self.keys:
                raise UnknownDependencyError(
                    f"stage {stage.id.name} reads {dep.name}, which is not a stage of this run "
                    "(or is added after it)"
                )
        given = stage.given()
        self.stages[stage.id] = stage
        key = (
            given[0]
            if given is not None
            else fingerprint(
                "stage",
                stage.id.key_part(),
                _version("treerank"),
                stage.inputs,
                [[dep.name, self.key_of(dep, stage.id)] for dep in stage.deps],
            )
        )
        self.keys[stage.id] = key
        self.order.append(stage)
        return key

    def skip(self, name: str, reason: str, path: Path) -> None:
        self.order.append(Skip(name, reason, path))

    def key_of(self, stage: StageId, reader: StageId) -> str:
        """The key of ``stage`` as read by ``reader``, which must have declared it.

        Raises:
            UnknownDependencyError: ``reader`` did not declare ``stage``, or it is unknown.
        """
        if reader in self.stages and stage not in self.stages[reader].deps:
            raise UnknownDependencyError(f"stage {reader.name} did not declare {stage.name}")
        if stage not in self.keys:
            raise UnknownDependencyError(f"{stage.name} is not a stage of this run")
        return self.keys[stage]

    def names(self) -> dict[str, str]:
        """Stage name -> key, for every stage (given stores included)."""
        return {sid.name: key for sid, key in self.keys.items()}

    def edges(self) -> dict[str, list[str]]:
        """Stage name -> the names of the stages it reads."""
        return {sid.name: [d.name for d in st.deps] for sid, st in self.stages.items()}

    def execute(
        self, ctx: RunContext, stage_cache: Path | None = None
    ) -> Iterator[tuple[Stage | Skip, StageRecord, Output | None]]:
        """Run (or reuse) every stage in order; yield ``(stage, record, output)`` for each.

        Each stage gets a :class:`Deps` of its declared dependencies' outputs only, each read
        through :meth:`key_of`. With a ``stage_cache`` (sweeps) a stage lives in
        ``<cache>/<name>-<key>`` (:meth:`StageId.cache_dir_name`) and its path becomes a
        relative symlink to it, so equal stages of several runs are computed once.

        Raises:
            StageError / StageInterrupted: as :func:`~treerank.pipeline.stages.base.run_stage`.
        """
        outputs: dict[StageId, Output] = {}
        for item in self.order:
            if isinstance(item, Skip):
                yield item, skip_stage(item.name, item.reason, item.path, log=ctx.log), None
                continue
            given = item.given()
            if given is not None:
                outputs[item.id] = given[1]
                continue
            for dep in item.deps:
                self.key_of(dep, item.id)
            deps = Deps(item.id, {d: outputs[d] for d in item.deps})
            rec, out = self._run_one(item, self.keys[item.id], deps, ctx, stage_cache)
            outputs[item.id] = out
            yield item, rec, out

    @staticmethod
    def _run_one(
        st: Stage, key: str, deps: Deps, ctx: RunContext, stage_cache: Path | None
    ) -> tuple[StageRecord, Output]:
        phys = st.path if stage_cache is None else stage_cache / st.id.cache_dir_name(key)
        force = ctx.force
        done = read_stage(phys)
        if not force and done is not None and done.get("key") == key:
            try:  # a finished stage of an older layout is run again, never guessed at
                st.output.from_json(_summary(done), phys)
            except OutputFormatError:
                force = True
        rec = run_stage(
            st.id.name,
            key,
            phys,
            lambda d: _jsonable(st.run(d, deps).to_json()),
            force=force,
            in_place=st.in_place,
            log=ctx.log,
            kind=st.id.kind,
        )
        if stage_cache is not None:
            _link(st.path, phys)
            rec.path = st.path
        return rec, st.output.from_json(rec.summary, rec.path)


def _jsonable(doc: Mapping[str, object]) -> dict[str, object]:
    """``doc`` as plain JSON types (numpy scalars and paths rendered as JSON renders them)."""
    out = json.loads(json.dumps(doc, default=str))
    assert isinstance(out, dict)
    return out


def _summary(doc: Mapping[str, object]) -> Mapping[str, object]:
    summary = doc.get("summary")
    return summary if isinstance(summary, dict) else {}


def _link(path: Path, target: Path) -> None:
    """Make ``path`` a relative symlink to ``target`` (replacing an older link there).

    Raises:
        FileExistsError: ``path`` is a real file or directory (never overwritten).
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    rel = os.path.relpath(target.resolve(), path.parent.resolve())
    if path.is_symlink():
        if os.readlink(path) == rel:
            return
        path.unlink()
    elif path.exists():
        raise FileExistsError(f"{path}: exists and is not a stage-cache link; not overwritten")
    tmp = path.with_name(f".{path.name}.link-{os.getpid()}")
    tmp.unlink(missing_ok=True)
    os.symlink(rel, tmp)
    os.replace(tmp, path)
