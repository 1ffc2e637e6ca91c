"""Retrieval systems over a store split (specs and their parsing: :mod:`treerank.search.specs`).

A :class:`System` returns a :class:`~treerank.search.run.Run` of the top ``k`` passages of the
split for every query of the split (the evaluation contract: candidates are all passages of the
split). :class:`DenseSystem` (exact inner product of two towers), :class:`BM25System`,
:class:`FusionSystem` and :class:`CheckpointSystem` live here; ``docs/systems.md`` lists every
spec kind.

A checkpoint loads through the :class:`CheckpointLoader` it is given (the family table's
``treerank.families.CHECKPOINTS`` in every upper-layer call; this layer's dense families by
default) with the store's encoder fingerprint (a checkpoint trained on another encoder's vectors
is refused); the model's family says how it searches: its own retrieval (a :class:`SystemHook`,
e.g. the forest's inverted lists), or, for a dense family, :class:`DenseSystem` over its two
towers.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

from treerank.distributed.context import DistContext
from treerank.encoders.precision import vector_precision
from treerank.kernels.device import DEFAULT_DEVICE, Device
from treerank.kernels.sharded import sharded_exact_search
from treerank.kernels.topk import DEFAULT_CHUNK_SIZE, RUN_DEPTH, exact_search
from treerank.models.base import DenseScorer
from treerank.models.checkpoint import CheckpointMixin
from treerank.models.registry import ModelClassOf, load_model, model_class
from treerank.search.bm25 import BM25Index, BM25Params
from treerank.search.fusion import (
    DEFAULT_RRF_K,
    FUSION_METHOD_NAMES,
    NORMALISATIONS,
    FusionMethod,
    Normalisation,
    linear_fusion,
    rrf,
)
from treerank.search.run import Run, store_key
from treerank.storelike import StoreLike, Vectors


@runtime_checkable
class System(Protocol):
    """Anything that ranks all passages of a store split for each of its queries."""

    name: str

    def retrieve(self, store: StoreLike, k: int = RUN_DEPTH) -> Run:
        """Top-``k`` passages of the split for each of its queries (row ``i`` = query ``i``)."""
        ...


class VectorSystem(Protocol):
    """A system that ranks from a split's vectors alone (a family's own retrieval, such as the
    forest's inverted lists): every :class:`VectorSystem` is a :class:`System`, and it also ranks
    a split of bare vectors (the held-out queries of training's validation)."""

    name: str

    def retrieve(self, store: Vectors, k: int = RUN_DEPTH) -> Run:
        """Top-``k`` passages of the split for each of its queries (row ``i`` = query ``i``)."""
        ...


class SystemHook(Protocol):
    """A model family's own search (``ModelFamily.system``, e.g. the forest's inverted lists):
    ``make(model, name, device=...) -> VectorSystem``; ``device`` is always passed."""

    def __call__(self, model: CheckpointMixin, name: str | None, *, device: Device) -> VectorSystem:
        """The system that ranks with the loaded ``model`` on ``device``."""
        ...


@dataclass(frozen=True)
class DenseOptions:
    """How a dense system searches: ``chunk_size`` passages per exact-search block (``None``:
    one block), tqdm ``progress`` bars, the CPU ``backend`` (``"faiss"`` | ``"torch"`` |
    ``"auto"``), the ``device``, and under ``torchrun`` the process group ``shard`` whose
    rank's passage shard is searched (merged across ranks; ``None``: one process)."""

    chunk_size: int | None = DEFAULT_CHUNK_SIZE
    progress: bool = False
    backend: str = "faiss"
    device: Device = DEFAULT_DEVICE
    shard: DistContext | None = field(default=None, compare=False)


class _RunMemo:
    """Keeps the deepest run computed for the last store, so that a system shared by several
    fusions (``rrf:bm25+cosine`` next to ``bm25`` and ``cosine``) runs once."""

    def __init__(self) -> None:
        self._memo: tuple[str, Run] | None = None

    def get(self, store: StoreLike, k: int) -> Run | None:
        if self._memo and self._memo[0] == store_key(store) and self._memo[1].k >= k:
            run = self._memo[1]
            return run if run.k == k else run.truncate(min(k, run.k))
        return None

    def put(self, store: StoreLike, run: Run) -> Run:
        self._memo = (store_key(store), run)
        return run


class DenseSystem:
    """Exact inner-product search with a :class:`DenseScorer`'s two towers.

    Queries go through ``scorer.encode_queries`` once; passages through ``scorer.encode_passages``
    chunk by chunk while streaming the memory-mapped store (:func:`exact_search`).
    """

    def __init__(
        self,
        scorer: DenseScorer,
        name: str | None = None,
        chunk_size: int | None = DEFAULT_CHUNK_SIZE,
        progress: bool = False,
        backend: str = "faiss",
        device: Device = DEFAULT_DEVICE,
        shard: DistContext | None = None,
    ) -> None:
        self.scorer = scorer
        self.name: str = name or str(getattr(scorer, "name", "dense"))
        self.chunk_size = chunk_size
        self.progress = progress
        self.backend = backend
        self.device = device  # where exact search runs
        self.shard = shard  # torchrun: search this rank's passage shard, merge across ranks
        self._memo = _RunMemo()

    @classmethod
    def with_options(
        cls, scorer: DenseScorer, name: str | None, options: DenseOptions
    ) -> DenseSystem:
        """A dense system searching as ``options`` say."""
        return cls(
            scorer,
            name,
            options.chunk_size,
            options.progress,
            options.backend,
            options.device,
            options.shard,
        )

    def retrieve(self, store: StoreLike, k: int = RUN_DEPTH) -> Run:
        k = min(k, int(store.n_passages))
        if (hit := self._memo.get(store, k)) is not None:
            return hit
        q = np.asarray(self.scorer.encode_queries(np.asarray(store.queries, dtype=np.float32)))
        if self.shard is not None:
            ids, scores = sharded_exact_search(
                q,
                store.passages,
                k,
                ctx=self.shard,
                chunk_size=self.chunk_size,
                passage_transform=self.scorer.encode_passages,
                progress=self.progress,
                backend=self.backend,
                device=self.device,
            )
        else:
            ids, scores = exact_search(
                q,
                store.passages,
                k=k,
                chunk_size=self.chunk_size,
                passage_transform=self.scorer.encode_passages,
                progress=self.progress,
                backend=self.backend,
                source=str(store.path),
                device=self.device,
            )
        return self._memo.put(store, Run(self.name, ids, scores))


class BM25System:
    """BM25 over the split's passage texts, queries tokenised the same way (:mod:`.bm25`).

    The index is built on first use per store path and kept for later calls.
    """

    def __init__(self, params: BM25Params | None = None, name: str = "bm25") -> None:
        self.params = params or BM25Params()
        self.name = name
        self._cache: tuple[str, BM25Index] | None = None
        self._memo = _RunMemo()

    def index_for(self, store: StoreLike) -> BM25Index:
        key = store_key(getattr(store, "base", store))  # a query view shares its index
        if self._cache is None or self._cache[0] != key:
            self._cache = (key, BM25Index(store.passage_texts(), self.params))
        return self._cache[1]

    def retrieve(self, store: StoreLike, k: int = RUN_DEPTH) -> Run:
        k = min(k, int(store.n_passages))
        if (hit := self._memo.get(store, k)) is not None:
            return hit
        ids, scores = self.index_for(store).search(store.query_texts(), k)
        return self._memo.put(store, Run(self.name, ids, scores))


class FusionSystem:
    """Fusion of two systems' runs: ``method="rrf"`` (``rrf_k``) or ``"linear"`` (``weight``,
    ``norm``); both runs are retrieved at depth ``max(k, depth)``."""

    def __init__(
        self,
        a: System,
        b: System,
        method: FusionMethod = "rrf",
        rrf_k: int = DEFAULT_RRF_K,
        weight: float = 0.5,
        norm: Normalisation = "minmax",
        depth: int = 1000,
        name: str | None = None,
    ) -> None:
        if method not in FUSION_METHOD_NAMES:
            known = ", ".join(FUSION_METHOD_NAMES)
            raise ValueError(f"unknown fusion method {method!r}; known: {known}")
        if norm not in NORMALISATIONS:
            raise ValueError(f"unknown normalisation {norm!r}; known: {', '.join(NORMALISATIONS)}")
        self.a, self.b = a, b
        self.method, self.rrf_k, self.weight, self.norm, self.depth = (
            method,
            rrf_k,
            weight,
            norm,
            depth,
        )
        self.name = name or (
            f"rrf:{a.name}+{b.name}"
            if method == "rrf"
            else f"linear-fusion:{a.name}+{b.name}:w={weight}"
        )

    def retrieve(self, store: StoreLike, k: int = RUN_DEPTH) -> Run:
        d = max(k, self.depth)
        ra, rb = self.a.retrieve(store, d), self.b.retrieve(store, d)
        if self.method == "rrf":
            return rrf(ra, rb, k=k, rrf_k=self.rrf_k, name=self.name)
        return linear_fusion(ra, rb, k=k, weight=self.weight, norm=self.norm, name=self.name)


class CheckpointSystemMaker(Protocol):
    """``make(model, name, *, device=...) -> System``: a family's own retrieval for a loaded
    model."""

    def __call__(self, model: CheckpointMixin, name: str, *, device: Device) -> System: ...


def no_own_system(model_type: str) -> CheckpointSystemMaker | None:
    """The own retrieval of this layer's families: none (cosine, linear, mlp, drt are dense)."""
    return None


@dataclass(frozen=True)
class CheckpointLoader:
    """How a checkpoint directory becomes a model and its system: the one thing every
    ``ckpt:`` load of this layer takes (through :class:`~treerank.search.specs.BuildContext`,
    or as an argument), so that no lower table is filled by an import.

    The family table (``treerank.families.CHECKPOINTS``, a layer above) gives the loader that
    knows every family (the forest and any registered plugin); :data:`DENSE_CHECKPOINTS`, the
    default, knows the families whose classes live below this layer, all dense.

    Attributes:
        classes: ``model_type -> model class``
            (:data:`~treerank.models.registry.ModelClassOf`; raises ``KeyError`` when unknown).
        own_system: ``model_type -> SystemHook`` of a family with its own retrieval (the
            forest's inverted lists); ``None``: a dense family, searched by
            :class:`DenseSystem` over its two towers.
    """

    classes: ModelClassOf = model_class
    own_system: Callable[[str], CheckpointSystemMaker | None] = no_own_system

    def load(
        self,
        path: str | Path,
        expected_fingerprint: str | None = None,
        expected_precision: str | None = None,
    ) -> Any:  # load_model's model, of any family (models/ is not under the Any ban)
        """The checkpoint at ``path`` as its model object (see
        :func:`~treerank.models.registry.load_model`).

        Raises:
            UnknownModelClassError: ``classes`` does not know its family (names class and path).
            FileNotFoundError, ValueError, EncoderMismatchError, PrecisionMixError: see
                :func:`~treerank.models.checkpoint.load_checkpoint`.
        """
        return load_model(path, expected_fingerprint, expected_precision, classes=self.classes)


DENSE_CHECKPOINTS = CheckpointLoader()
"""The default loader: this layer's (dense) families only; a forest checkpoint is refused with
an :class:`~treerank.models.registry.UnknownModelClassError` naming the class and the path."""


class CheckpointSystem:
    """A checkpoint directory, loaded for the store it is asked to rank (fingerprint-checked)."""

    def __init__(
        self,
        path: str | Path,
        name: str | None = None,
        options: DenseOptions | None = None,
        loader: CheckpointLoader = DENSE_CHECKPOINTS,
    ) -> None:
        self.path = Path(path)
        self.name = name or self.path.name
        self.options = options or DenseOptions()  # a dense family's search; its device for all
        self.loader = loader  # which families it can load (the family table's: all of them)
        self._loaded: tuple[str | None, System] | None = None
        self._model_type = ""

    def system_for(self, store: StoreLike) -> System:
        """The loaded model's system for ``store`` (loaded once per encoder fingerprint).

        Raises:
            EncoderMismatchError: the checkpoint was trained on another encoder's vectors.
            UnknownModelClassError: the loader does not know the checkpoint's family (the
                default :data:`DENSE_CHECKPOINTS` and a forest: build with the family table's
                ``treerank.families.CHECKPOINTS``).
            TypeError: a dense family's model lacks ``encode_queries`` / ``encode_passages``.
        """
        fp = store.encoder_fingerprint
        if self._loaded is None or self._loaded[0] != fp:
            model = self.loader.load(
                self.path, expected_fingerprint=fp, expected_precision=vector_precision(store)
            )
            system: System
            if (make := self.loader.own_system(model.model_type)) is not None:
                system = make(model, self.name, device=self.options.device)
            elif isinstance(model, DenseScorer):
                system = DenseSystem.with_options(model, self.name, self.options)
            else:
                raise TypeError(
                    f"{self.path}: {type(model).__name__} (family {model.model_type!r}) has no "
                    "system hook "
                    "and is not a dense scorer (encode_queries / encode_passages)"
                )
            self._loaded = (fp, system)
            self._model_type = str(model.model_type)
        return self._loaded[1]

    def check_store(self, store: StoreLike) -> None:
        """Refuse ``store`` before any work when the checkpoint is bound to another encoder or
        to vectors of a precision the mixing rule keeps apart (reads ``config.json`` only).

        Raises:
            EncoderMismatchError / PrecisionMixError: see
                `treerank.models.checkpoint.check_binding`.
        """
        from treerank.models.checkpoint import check_checkpoint_store

        check_checkpoint_store(self.path, store.encoder_fingerprint, vector_precision(store))

    def _extra(self) -> dict[str, object] | None:
        """The ``extra`` record of the checkpoint's ``config.json`` (of ``<dir>`` or of a run's
        ``<dir>/checkpoint``), read without loading the weights; ``None``: unreadable."""
        import json

        for cfg in (self.path / "config.json", self.path / "checkpoint" / "config.json"):
            try:
                doc = json.loads(cfg.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                continue
            extra = doc.get("extra") if isinstance(doc, dict) else None
            return extra if isinstance(extra, dict) else {}
        return None

    def kept_initialisation(self) -> bool:
        """Whether the checkpoint's training kept its initialisation (training summary
        ``kept_initialisation``: early-stopped at step 0), read from its ``config.json``
        without loading the weights; ``False`` when the file cannot say."""
        training = (self._extra() or {}).get("training") or {}
        return bool(isinstance(training, dict) and training.get("kept_initialisation"))

    def training_provenance(self) -> dict[str, object] | None:
        """The checkpoint's record of its training store (``extra.train_provenance`` of its
        ``config.json``, :func:`treerank.evaluation.provenance.training_provenance`), read
        without loading the weights; ``None`` when it has none (an older checkpoint)."""
        prov = (self._extra() or {}).get("train_provenance")
        return prov if isinstance(prov, dict) else None

    def model_type_for(self, store: StoreLike) -> str:
        """The family name (``model_type``) of the checkpoint loaded for ``store``."""
        self.system_for(store)
        return self._model_type

    def retrieve(self, store: StoreLike, k: int = RUN_DEPTH) -> Run:
        run = self.system_for(store).retrieve(store, k)
        return Run(self.name, run.ids, run.scores)


# ------------------------------------------------------------------------- checkpoint input
def checkpoint_problem(path: Path) -> str | None:
    """Why ``path`` is not a checkpoint directory (``<dir>/config.json`` or a run's
    ``<dir>/checkpoint/config.json``), naming the missing file and any checkpoints below it;
    ``None`` when it is one."""
    config = path / "config.json"
    if config.is_file() or (path / "checkpoint" / "config.json").is_file():
        return None
    what = "no such directory" if not path.exists() else "not a treerank checkpoint"
    found = _checkpoints_below(path) if path.is_dir() else []
    if found:
        what += "; checkpoints below it: " + ", ".join(f"ckpt:{f}" for f in found[:3])
        what += " ..." if len(found) > 3 else ""
    return f"{config}: missing ({what})"


def _checkpoints_below(folder: Path, depth: int = 3) -> list[Path]:
    """Checkpoint directories (holding ``config.json`` + ``weights.safetensors``) up to
    ``depth`` levels below ``folder`` (a run's output or ``models/`` folder), sorted."""
    found: list[Path] = []
    for level in range(1, depth + 1):
        pattern = "/".join(["*"] * level) + "/weights.safetensors"
        found += [w.parent for w in folder.glob(pattern) if (w.parent / "config.json").is_file()]
    return sorted(found)
