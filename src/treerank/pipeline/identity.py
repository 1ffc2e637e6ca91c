"""Typed identities of ``treerank run``: trained runs, systems and stages.

Every name a user reads (``train:scifact:linear@seed0``, the system ``linear@seed0@squad``), every
output path and every stage-cache directory is **rendered** from one of the small frozen records
below; nothing in the pipeline splits a name to recover which model, seed or dataset it meant
(``tests/test_no_name_parsing.py`` checks that). ``@`` appears in names with three meanings (a
seed suffix, a transfer dataset, a metric cutoff such as ``ndcg@10``), which is exactly why a
name cannot be parsed back safely.

Records:

* :class:`RunId`: one trained model run: the experiment's model name, the dataset whose train
  split trained it, and its training seed (``None``: a model without ``seeds:``).
* :class:`SystemId`: one system evaluated on one dataset: a configured spec string (``bm25``,
  ``rrf:cosine+bm25``), a trained run (its checkpoint), or a seeded model's seed average.
* :class:`StageId`: one stage of the run's graph: its kind (``embed``, ``train``, ``evaluate``,
  ``diagnose``, ``report``) and the dataset / split / run it is about.

Renderings (kept equal to the names of earlier versions, so links, reports and users' scripts
keep working):

=========================================  ==============================================
record                                     rendering
=========================================  ==============================================
``RunId("linear", "scifact", 0)``          run name ``linear@seed0`` (the seed suffix of
                                           :func:`treerank.evaluation.seeds.seed_system_name`)
``SystemId.of_run(run, "scifact")``        ``linear@seed0`` (on its training dataset)
``SystemId.of_run(run, "squad")``          ``linear@seed0@scifact`` (transfer: evaluated on
                                           ``squad``, trained on ``scifact``)
``SystemId.seed_average(...)``             ``linear`` / ``linear@scifact``
``StageId.train(run)``                     ``train:scifact:linear@seed0``, path
                                           ``models/scifact/linear@seed0``
``StageId.embed("scifact", "test")``       ``embed:scifact:test``, path ``stores/scifact/test``
=========================================  ==============================================

Every name becomes a path component through :func:`treerank.names.file_name` (one injective,
filesystem-safe map: a plain name such as ``linear@seed0`` is its own file name, any other gets
a readable slug plus a digest, ``модель`` -> ``name~<16 hex>``), so two names never share a
directory or a run file, and a long name never exceeds the filesystem's limit.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal, get_args

from treerank.names import file_name, slug
from treerank.search.specs import CheckpointSpec, SystemSpec, parse_spec

__all__ = [
    "STAGE_KINDS",
    "RunId",
    "StageId",
    "StageKind",
    "SystemId",
    "UnknownDependencyError",
    "dataset_dir",
]

StageKind = Literal[
    "embed",
    "mine",
    "denoise",
    "pseudo",
    "teacher",
    "train",
    "finetune",
    "reembed",
    "evaluate",
    "diagnose",
    "report",
]
STAGE_KINDS: tuple[StageKind, ...] = get_args(StageKind)
DERIVED_KINDS: tuple[StageKind, ...] = (
    "mine",
    "denoise",
    "pseudo",
    "teacher",
    "finetune",
    "reembed",
)
"""Stages named by a ``part``: derived training data (its settings label), a fine-tune and its
re-embedded splits (the ``finetune:`` entry's name)."""


def dataset_dir(out_dir: Path, kind: str, dataset: str) -> Path:
    """``<out>/<kind>/<file_name(dataset)>``: a dataset's directory under ``stores``,
    ``models``, ``eval`` or ``diagnose``."""
    return out_dir / kind / file_name(dataset)


class UnknownDependencyError(KeyError):
    """A stage asked for the key of a stage it did not declare, or of one not in the graph.

    Never answered with a fallback (a spec string, a path): a missing edge is a bug that would
    let a stage be reused after its input changed.
    """

    def __str__(self) -> str:  # KeyError's default quotes the message
        return str(self.args[0]) if self.args else "unknown dependency"


@dataclass(frozen=True, order=True)
class RunId:
    """One trained run of a model.

    Attributes:
        model: the experiment's model name (``models.<name>``).
        trained_on: the dataset whose train split trained it.
        seed: the training seed of a model with ``seeds:``; ``None`` for a single model.
    """

    model: str
    trained_on: str
    seed: int | None = None

    @property
    def name(self) -> str:
        """``"linear"`` or ``"linear@seed0"``: the run's name on its own dataset."""
        from treerank.evaluation.seeds import seed_system_name

        return self.model if self.seed is None else seed_system_name(self.model, self.seed)

    def path(self, out_dir: Path) -> Path:
        """The run's stage directory: ``<out>/models/<trained_on>/<name>`` (each part through
        :func:`treerank.names.file_name`: injective and filesystem-safe)."""
        return dataset_dir(out_dir, "models", self.trained_on) / file_name(self.name)

    def checkpoint(self, out_dir: Path) -> Path:
        """The checkpoint directory inside :meth:`path`."""
        return self.path(out_dir) / "checkpoint"

    def key_part(self) -> dict[str, object]:
        """The run's identity as a cache-key component (names, never a rendered string)."""
        return {"model": self.model, "trained_on": self.trained_on, "seed": self.seed}


@dataclass(frozen=True)
class SystemId:
    """One system evaluated on dataset ``evaluated_on``.

    Exactly one of ``spec`` (a configured system spec), ``run`` (a trained run, evaluated from
    its checkpoint) or ``seed_group`` (the model whose seeds' per-query average this is, with
    ``trained_on``) is set; build them with :meth:`of_spec`, :meth:`of_run`,
    :meth:`seed_average`.
    """

    evaluated_on: str
    spec: str | None = None
    run: RunId | None = None
    seed_group: str | None = None
    trained_on: str | None = None

    @classmethod
    def of_spec(cls, spec: str, evaluated_on: str) -> SystemId:
        return cls(evaluated_on, spec=spec)

    @classmethod
    def of_run(cls, run: RunId, evaluated_on: str) -> SystemId:
        return cls(evaluated_on, run=run)

    @classmethod
    def seed_average(cls, model: str, trained_on: str, evaluated_on: str) -> SystemId:
        return cls(evaluated_on, seed_group=model, trained_on=trained_on)

    @property
    def transfer(self) -> bool:
        """Whether the system was trained on another dataset than it is evaluated on."""
        src = self.run.trained_on if self.run is not None else self.trained_on
        return src is not None and src != self.evaluated_on

    @property
    def name(self) -> str:
        """The name in tables and run files: the spec, the run name, or the model name; a
        model trained on another dataset gets ``@<training dataset>`` appended."""
        if self.spec is not None:
            return self.spec
        if self.run is not None:
            base, src = self.run.name, self.run.trained_on
        else:
            assert self.seed_group is not None and self.trained_on is not None
            base, src = self.seed_group, self.trained_on
        return f"{base}@{src}" if src != self.evaluated_on else base

    def build_node(self, out_dir: Path) -> SystemSpec:
        """The spec node that builds the system: the configured spec, parsed, or the trained
        run's checkpoint as a :class:`~treerank.search.specs.CheckpointSpec` (never a
        ``ckpt:`` string parsed back).

        Raises:
            ValueError: a seed average (it is computed from its seeds, never built), or a
                configured spec that does not parse.
        """
        if self.spec is not None:
            return parse_spec(self.spec)
        if self.run is None:
            raise ValueError(f"{self.name}: a seed average has no spec of its own")
        return CheckpointSpec(self.run.checkpoint(out_dir))


@dataclass(frozen=True, order=True)
class StageId:
    """One stage of ``treerank run``'s graph (see ``docs/DESIGN.md``, "The stage graph").

    Attributes:
        kind: ``embed`` / ``mine`` / ``pseudo`` / ``teacher`` / ``train`` / ``evaluate`` /
            ``diagnose`` / ``report``.
        dataset: the dataset it is about (``""`` for the report).
        split: the split of an embed stage.
        run: the trained run of a train stage.
        part: the settings label of a mine / pseudo / teacher stage (``bm25_negatives-100``,
            ``pseudo-<digest>``, ``teacher-<digest>``): several models whose settings agree share
            one such stage.
    """

    kind: StageKind
    dataset: str = ""
    split: str | None = None
    run: RunId | None = None
    part: str | None = None

    def __post_init__(self) -> None:
        if self.kind not in STAGE_KINDS:
            raise ValueError(f"unknown stage kind {self.kind!r}; known: {', '.join(STAGE_KINDS)}")
        if (self.kind in ("embed", "reembed")) != (self.split is not None):
            raise ValueError(f"{self.kind} stage: a split is given exactly for (re)embed stages")
        if (self.kind == "train") != (self.run is not None):
            raise ValueError(f"{self.kind} stage: a run is given exactly for train stages")
        if (self.kind in DERIVED_KINDS) != (self.part is not None):
            raise ValueError(f"{self.kind} stage: a part is given exactly for {DERIVED_KINDS}")

    @classmethod
    def embed(cls, dataset: str, split: str) -> StageId:
        return cls("embed", dataset, split=split)

    @classmethod
    def train(cls, run: RunId) -> StageId:
        return cls("train", run.trained_on, run=run)

    @classmethod
    def derived(cls, kind: StageKind, dataset: str, part: str) -> StageId:
        """A ``mine`` / ``pseudo`` / ``teacher`` stage of ``dataset`` with settings ``part``."""
        return cls(kind, dataset, part=part)

    @classmethod
    def finetune(cls, dataset: str, name: str) -> StageId:
        """The encoder fine-tune ``finetune.<name>`` on ``dataset``'s train split."""
        return cls("finetune", dataset, part=name)

    @classmethod
    def reembed(cls, dataset: str, name: str, split: str) -> StageId:
        """``split`` of ``dataset`` re-embedded by the tuned encoder of ``finetune.<name>``."""
        return cls("reembed", dataset, split=split, part=name)

    @classmethod
    def evaluate(cls, dataset: str) -> StageId:
        return cls("evaluate", dataset)

    @classmethod
    def diagnose(cls, dataset: str) -> StageId:
        return cls("diagnose", dataset)

    @classmethod
    def report(cls) -> StageId:
        return cls("report")

    @property
    def name(self) -> str:
        """``embed:<dataset>:<split>``, ``mine|pseudo|teacher|finetune:<dataset>:<part>``,
        ``reembed:<dataset>:<finetune name>:<split>``, ``train:<dataset>:<run name>``,
        ``evaluate:<dataset>``, ``diagnose:<dataset>``, ``report``."""
        if self.kind == "report":
            return "report"
        if self.kind == "reembed":
            return f"{self.kind}:{self.dataset}:{self.part}:{self.split}"
        if self.split is not None:
            return f"{self.kind}:{self.dataset}:{self.split}"
        if self.run is not None:
            return f"{self.kind}:{self.dataset}:{self.run.name}"
        if self.part is not None:
            return f"{self.kind}:{self.dataset}:{self.part}"
        return f"{self.kind}:{self.dataset}"

    def path(self, out_dir: Path, store_root: Path | None = None) -> Path:
        """The stage's directory under the run's ``out_dir`` (an embed stage's under
        ``store_root`` when given: the dataset's store root)."""
        if self.kind == "reembed":  # a store root per fine-tune: its splits are siblings
            assert self.split is not None and self.part is not None
            return dataset_dir(out_dir, self.kind, self.dataset) / file_name(self.part) / self.split
        if self.kind == "embed":
            assert self.split is not None
            root = (
                store_root
                if store_root is not None
                else dataset_dir(out_dir, "stores", self.dataset)
            )
            return root / self.split  # a split is a directory of the data, named as it is
        if self.kind == "train":
            assert self.run is not None
            return self.run.path(out_dir)
        if self.kind == "report":
            return out_dir
        if self.part is not None:  # <out>/<mine|pseudo|teacher>/<dataset>/<part>
            return dataset_dir(out_dir, self.kind, self.dataset) / file_name(self.part)
        return dataset_dir(out_dir, "eval" if self.kind == "evaluate" else "diagnose", self.dataset)

    def cache_dir_name(self, key: str) -> str:
        """The stage's directory name in a sweep's shared stage cache: ``<slug>-<key[:24]>``
        (:func:`treerank.names.slug` of the name, at most 40 characters; the key, which hashes
        the stage's identity and inputs, makes it unique; one-way, never read back)."""
        return f"{slug(self.name)}-{key[:24]}"

    def key_part(self) -> dict[str, object]:
        """The stage's identity as a cache-key component."""
        doc: dict[str, object] = {
            "kind": self.kind,
            "dataset": self.dataset,
            "split": self.split,
            "run": None if self.run is None else self.run.key_part(),
        }
        if self.part is not None:  # only the new kinds have it: older keys stay as they were
            doc["part"] = self.part
        return doc
