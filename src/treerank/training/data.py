"""The ``data.sources`` list of a training config: which pairs a trainable family learns from.

One list, the same for every contrastive family (heads, DRT)::

    data:
      sources:                       # absent / null: the split's labels (today's behaviour)
        - {kind: labels, weight: 1.0}
        - {kind: pseudo, methods: [ict, crops], cap: 20000, positive: cut, weight: 1.0}
        - {kind: teacher, system: bm25, queries: train, mode: soft, k: 50, temperature: 2.0}
        - {kind: teacher, system: "rescore:bm25:depth=20,scorer=ce:runs/ce/model",
           mode: margin-mse, k: 20}    # a cross-encoder's graded scores (MarginMSE)
      collisions: true               # no same-passage / same-text pairs in a batch

Each entry is a :class:`SourceSpec`. The pieces that need other layers are made **before** the
trainer runs, by the pipeline (``treerank.tasks.train.ensure_training_sources``), and
stored so that a re-run reuses them:

* ``pseudo``: the pseudo split, embedded once into ``<store root>/pseudo-<hash>/``
  (:func:`pseudo_dir`);
* ``teacher``: the teacher system's top-``k`` for the chosen queries, a sidecar array pair
  ``<name>-ids`` / ``<name>-scores`` on the store whose queries it ranks (:func:`teacher_array`).

:func:`build_training_table` then reads them and returns one vector table (training store
queries, then pseudo queries; the corpus passages, then any new pseudo passages) and the pair
sets over it, restricted to the training rows (held-out queries never become pairs).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from treerank.kernels.rows import StackedRows
from treerank.store.embedding_store import EmbeddingStore
from treerank.storelike import StoreLike
from treerank.training.pseudo import PSEUDO_METHODS, PseudoConfig
from treerank.training.sources import PairSet, label_pairs, teacher_pairs

__all__ = [
    "SOURCE_KINDS",
    "SourceSpec",
    "TrainingTable",
    "build_training_table",
    "parse_sources",
    "pseudo_dir",
    "pseudo_dir_name",
    "sample_rows",
    "source_rows",
    "teacher_array",
]

SOURCE_KINDS = ("labels", "teacher", "pseudo")
TEACHER_MODES = ("soft", "sample", "margin-mse")


@dataclass
class SourceSpec:
    """One training-data source (a ``data.sources`` entry).

    Attributes:
        kind: ``labels`` | ``teacher`` | ``pseudo``.
        weight: relative share of batch slots.
        system: (teacher) a system spec: ``bm25``, ``rrf:bm25+cosine``, ``ckpt:<dir>``, ...
        queries: (teacher) whose queries it ranks: ``train`` (the training split's query texts;
            labels unused) or ``pseudo`` (the pseudo-queries of the ``pseudo`` entry).
        mode: (teacher) ``soft`` (listwise KL on ``softmax(scores / temperature)`` over the top
            ``k``), ``sample`` (the top ``n_positives`` as positives) or ``margin-mse`` (the
            student's score margins between the teacher's best and each other of its top ``k``
            regress onto the teacher's ``scores / temperature`` margins; a graded teacher such
            as a cross-encoder, ``rescore:<first stage>:depth=N,scorer=ce:<dir>``).
        k, n_positives, temperature: (teacher) see ``treerank.training.sources.teacher_pairs``.
        methods, cap, passes, positive, seed: (pseudo) see
            ``treerank.training.pseudo.PseudoConfig``.
        max_queries: (labels, teacher on ``train`` queries) only a seeded sample of this many
            of the split's queries (:func:`source_rows`); None: all of them. An expensive
            teacher (a cross-encoder reranking BM25) then ranks only those queries, and a
            ``labels`` entry with the same ``max_queries`` and ``sample_seed`` reads the same
            ones: the binary-label twin of a distilled model. Held-out queries stay held out.
        sample_seed: seed of that sample.
    """

    kind: str = "labels"
    weight: float = 1.0
    system: str | None = None
    queries: str = "train"
    mode: str = "soft"
    k: int = 50
    n_positives: int = 1
    temperature: float = 1.0
    methods: list[str] = field(default_factory=lambda: ["ict"])
    cap: int = 20_000
    passes: int = 1
    positive: str = "cut"
    seed: int = 0
    max_queries: int | None = None
    sample_seed: int = 0

    def __post_init__(self) -> None:
        if self.kind not in SOURCE_KINDS:
            raise ValueError(f"kind {self.kind!r} unknown; known: {', '.join(SOURCE_KINDS)}")
        if self.weight <= 0:
            raise ValueError(f"weight must be > 0, got {self.weight}")
        if self.kind == "teacher":
            if not self.system:
                raise ValueError("a teacher source needs system: (e.g. bm25, rrf:bm25+cosine)")
            if self.queries not in ("train", "pseudo") or self.mode not in TEACHER_MODES:
                raise ValueError(
                    "teacher: queries must be train|pseudo and mode " + "|".join(TEACHER_MODES)
                )
            if self.k < 1 or self.n_positives < 1 or self.temperature <= 0:
                raise ValueError("teacher: k >= 1, n_positives >= 1 and temperature > 0")
        if self.kind == "pseudo":
            self.pseudo_config()  # validates methods, cap, ...
        if self.max_queries is not None:
            if self.max_queries < 1:
                raise ValueError(f"max_queries must be >= 1, got {self.max_queries}")
            if self.kind == "pseudo" or self.queries == "pseudo":
                raise ValueError("max_queries samples the split's own queries (labels, teacher)")

    def teacher_key(self) -> dict[str, Any]:
        """What names a teacher's run (its sidecar array and its stage key): ``system`` and
        ``k``, plus ``max_queries`` / ``sample_seed`` only when sampled (so unsampled keys stay
        as they were)."""
        key: dict[str, Any] = {"system": self.system, "k": self.k}
        if self.max_queries is not None:
            key.update(max_queries=self.max_queries, sample_seed=self.sample_seed)
        return key

    def pseudo_config(self) -> PseudoConfig:
        """The :class:`PseudoConfig` of a ``pseudo`` entry."""
        return PseudoConfig(
            methods=list(self.methods),
            cap=self.cap,
            passes=self.passes,
            positive=self.positive,
            seed=self.seed,
        )


def source_rows(n_queries: int, spec: SourceSpec) -> np.ndarray | None:
    """The query rows a ``labels`` or ``teacher`` source reads: a seeded sample of
    ``spec.max_queries`` of the split's ``n_queries`` (``numpy.random.default_rng(sample_seed)
    .choice`` without replacement, sorted ascending), or None (all of them) when
    ``max_queries`` is None or not below ``n_queries``.

    Returns:
        ``int64 (min(max_queries, n_queries),)`` or None. Sources with equal ``max_queries``
        and ``sample_seed`` on one split get equal rows.
    """
    return sample_rows(n_queries, spec.max_queries, spec.sample_seed)


def sample_rows(n_queries: int, max_queries: int | None, seed: int = 0) -> np.ndarray | None:
    """A seeded sample of ``max_queries`` of ``n_queries`` query rows
    (``numpy.random.default_rng(seed).choice`` without replacement, sorted ascending), or None
    (all of them) when ``max_queries`` is None or not below ``n_queries``. The one sampling rule
    of a ``data.sources`` entry (:func:`source_rows`) and of a head's ``data.max_queries``.

    Returns:
        ``int64 (max_queries,)`` or None.
    """
    if max_queries is None or max_queries >= n_queries:
        return None
    rng = np.random.default_rng(seed)
    return np.sort(rng.choice(n_queries, size=max_queries, replace=False)).astype(np.int64)


def parse_sources(raw: Sequence[Any] | None, where: str = "data.sources") -> list[SourceSpec]:
    """Parse the ``data.sources`` list (None: ``[labels]``).

    Raises:
        ConfigError: not a list, an unknown key or kind (the message names the entry), more
            than one ``pseudo`` entry, or a teacher on ``pseudo`` queries without one.
    """
    from treerank.config import ConfigError, build

    if raw is None:
        return [SourceSpec()]
    if not isinstance(raw, list) or not raw:
        raise ConfigError(f"{where}: must be a non-empty list of sources")
    specs = [build(SourceSpec, d, f"{where}[{i}]") for i, d in enumerate(raw)]
    n_pseudo = sum(s.kind == "pseudo" for s in specs)
    if n_pseudo > 1:
        raise ConfigError(f"{where}: at most one pseudo source")
    if any(s.kind == "teacher" and s.queries == "pseudo" for s in specs) and not n_pseudo:
        raise ConfigError(f"{where}: a teacher on pseudo queries needs a pseudo source")
    bad = [m for s in specs if s.kind == "pseudo" for m in s.methods if m not in PSEUDO_METHODS]
    if bad:
        raise ConfigError(f"{where}: unknown pseudo method(s) {bad}")
    return specs


def _digest(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:10]


def pseudo_dir(store: StoreLike, spec: SourceSpec) -> Path:
    """Where the pseudo split of ``store`` with ``spec``'s settings lives: a store sibling, or
    under a store view's pseudo roots (:meth:`~treerank.store.EmbeddingStore.pseudo_split_dir`;
    ``treerank run`` points them at the pseudo stages' own directories)."""
    if isinstance(store, EmbeddingStore):
        return store.pseudo_split_dir(pseudo_dir_name(spec))
    return Path(store.path).parent / pseudo_dir_name(spec)


def pseudo_dir_name(spec: SourceSpec) -> str:
    """The pseudo split's directory name for ``spec``'s settings: ``pseudo-<digest>``."""
    return f"pseudo-{_digest(asdict(spec.pseudo_config()))}"


def teacher_array(spec: SourceSpec) -> str:
    """Sidecar array stem of a teacher's run (``<stem>-ids`` / ``<stem>-scores``)."""
    return f"teacher-{_digest(spec.teacher_key())}"


@dataclass
class TrainingTable:
    """One vector table and the pair sets over it.

    Attributes:
        queries: ``float32 (nq', d)`` training store queries, then pseudo queries: the store's
            array (a memory map) or a :class:`~treerank.kernels.rows.StackedRows` over both,
            indexed by rows; never read whole.
        passages: ``float32 (N', d)`` the corpus, then new pseudo passages (likewise).
        sources: pair sets, one per source entry. weights: their weights.
        info: counts per source (logged).
    """

    queries: Any
    passages: Any
    sources: list[PairSet]
    weights: list[float]
    info: dict[str, Any]


class _PassageTail:
    """Rows ``offset ..`` of a pseudo split's passages (its new ones), indexed by rows."""

    def __init__(self, passages: Any, offset: int) -> None:
        self.passages, self.offset = passages, offset
        self.shape = (int(passages.shape[0]) - offset, int(passages.shape[1]))

    def __getitem__(self, rows: Any) -> np.ndarray:
        return np.asarray(self.passages[np.asarray(rows, dtype=np.int64) + self.offset])


def _open_pseudo(store: StoreLike, spec: SourceSpec) -> Any:
    path = pseudo_dir(store, spec)
    if not (path / "meta.json").is_file():
        raise FileNotFoundError(
            f"{path}: the pseudo split is not built; run the pipeline's "
            "ensure_training_sources (treerank train / treerank run do)"
        )
    pseudo = EmbeddingStore.open(path)
    if isinstance(store, EmbeddingStore):  # its teacher arrays where the store view keeps them
        pseudo = store.pseudo_view(pseudo)
    if pseudo.passage_texts()[: store.n_passages] != store.passage_texts():
        raise ValueError(f"{path}: its corpus is not {store.path}'s passages")
    return pseudo


def _teacher_run(target: Any, spec: SourceSpec) -> tuple[np.ndarray, np.ndarray]:
    stem = teacher_array(spec)
    ids, scores = target.load_array(f"{stem}-ids"), target.load_array(f"{stem}-scores")
    if ids is None or scores is None:
        raise FileNotFoundError(
            f"{target.path}: no teacher run {stem} ({spec.system}); run the pipeline's "
            "ensure_training_sources"
        )
    return np.asarray(ids), np.asarray(scores)


def build_training_table(
    store: StoreLike, specs: Sequence[SourceSpec], train_rows: np.ndarray | None = None
) -> TrainingTable:
    """Read every source of ``specs`` into one :class:`TrainingTable`.

    Args:
        store: the training split (its labels, queries and corpus).
        specs: parsed ``data.sources``.
        train_rows: the training split's query ids that may become pairs (held-out ones
            excluded; None: all).

    Raises:
        FileNotFoundError: a pseudo split or teacher run has not been prepared.
        ValueError: a source yields no pair.
    """
    nq = int(store.n_queries)
    rows = np.arange(nq) if train_rows is None else np.asarray(train_rows, dtype=np.int64)
    pseudo_spec = next((s for s in specs if s.kind == "pseudo"), None)
    pseudo = _open_pseudo(store, pseudo_spec) if pseudo_spec is not None else None
    # the stored arrays as they are (memory maps, read by rows in training), never concatenated
    queries: Any = store.queries
    passages: Any = store.passages
    if pseudo is not None:
        queries = StackedRows(queries, pseudo.queries)
        passages = StackedRows(passages, _PassageTail(pseudo.passages, int(store.n_passages)))
    cand, lab = np.asarray(store.candidates), np.asarray(store.labels)
    thr = int(store.relevance_threshold)
    texts = store.query_texts()
    _, labelled = _labelled(cand, lab)
    out: list[PairSet] = []
    info: dict[str, Any] = {}
    for i, spec in enumerate(specs):
        name = f"{i}:{spec.kind}" + (f":{spec.system}" if spec.system else "")
        sample = source_rows(nq, spec)  # None for pseudo entries (refused with max_queries)
        source_q = rows if sample is None else np.intersect1d(rows, sample)
        if spec.kind == "labels":
            ps = label_pairs(
                cand, lab, texts, relevance_threshold=thr, query_rows=source_q, name=name
            )
        elif spec.kind == "pseudo":
            assert pseudo is not None
            ps = label_pairs(
                np.asarray(pseudo.candidates),
                np.asarray(pseudo.labels),
                pseudo.query_texts(),
                relevance_threshold=int(pseudo.relevance_threshold),
                name=name,
            )
            ps.query_rows = ps.query_rows + nq
        else:
            on_pseudo = spec.queries == "pseudo"
            target: Any = pseudo if on_pseudo else store
            ids, scores = _teacher_run(target, spec)
            keep = np.arange(ids.shape[0]) if on_pseudo else source_q
            ids, scores = ids[keep], scores[keep]
            valid = (ids >= 0) & np.isfinite(scores)
            ok = valid.any(axis=1)
            ids = np.where(valid, ids, -1)
            ps = teacher_pairs(
                ids[ok],
                np.where(valid, scores, 0.0)[ok],
                target.query_texts(),
                query_rows=keep[ok],
                mode=spec.mode,
                k=spec.k,
                n_positives=spec.n_positives,
                temperature=spec.temperature,
                labelled=None if on_pseudo else labelled[keep[ok]],
                name=name,
            )
            if on_pseudo:
                ps.query_rows = ps.query_rows + nq
        if not len(ps):
            raise ValueError(f"data.sources[{i}] ({spec.kind}): no training pair")
        out.append(ps)
        info[name] = {"pairs": len(ps), "weight": spec.weight, "mode": ps.mode}
        if sample is not None:
            info[name]["sampled_queries"] = int(sample.size)
    return TrainingTable(queries, passages, out, [s.weight for s in specs], info)


def _labelled(cand: np.ndarray, lab: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    from treerank.training.sampler import relevant_lists

    return relevant_lists(cand, lab, 1)
