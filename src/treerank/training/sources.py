"""Training-data sources as one table of pairs, their mixture, and collision-free batches.

Every trainable family draws its training signal from a :class:`PairSet`: for each training
query, a **target distribution** over passage ids (``target_ids`` / ``target_weights``) and the
passages to keep out of its softmax (``exclude_ids``). The sources fill it:

* ``labels``: the split's relevant passages, uniform (today's behaviour: the sampler draws one
  designated positive per epoch, mode ``sample``);
* ``teacher``: any system's ranking of the training (or pseudo-) queries, given as its
  ``(ids, scores)`` (``treerank.search`` runs the system; this layer only sees arrays): its
  top-``n_positives`` as positives (mode ``sample``), or ``softmax(scores / temperature)`` over
  its top-``k`` as soft labels (mode ``soft``, listwise KL distillation, Hinton et al., 2015),
  or its graded scores themselves (mode ``margin-mse``: the student's score margins between
  the teacher's best passage and each other one of its top-``k`` regress onto the teacher's,
  Hofstätter et al., 2020; a cross-encoder teacher is ``rescore:bm25:depth=N,scorer=ce:<dir>``);
* ``pseudo``: the labels of a pseudo split (``treerank.training.pseudo``).

:class:`PairSampler` mixes several pair sets with weights and builds batches in which **no
two queries share a target passage** (by passage id) **or a query text** (by a hash of the
text): SQuAD asks ~4.6 questions per paragraph and MedQuAD repeats 1,428 question texts, so a
plain batch would use one query's positive as another's negative. Passages are de-duplicated
by text in the store, so equal passage ids are equal texts. Queries whose text repeats
elsewhere in the set also get every target of their twins in ``exclude_ids``
(:func:`exclude_same_text_targets`), which covers full-corpus negatives too.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from treerank.training.history import TrainingLog
from treerank.training.sampler import Batch, collision_mask, relevant_lists, text_keys
from treerank.training.trainer import FitResult, TrainerConfig, Validate, fit

__all__ = [
    "PairSampler",
    "PairSet",
    "exclude_same_text_targets",
    "label_pairs",
    "teacher_pairs",
    "text_keys",
    "train_on_pairs",
]

MODES = ("sample", "soft", "margin-mse")


@dataclass
class PairSet:
    """Training pairs over one store's vectors.

    Attributes:
        name: source name (``labels``, ``teacher:bm25``, ``pseudo``), recorded in logs.
        query_rows: ``int64 (n,)`` store query ids.
        target_ids: ``int64 (n, L)`` passage ids carrying target mass, ``-1`` padding.
        target_weights: ``float32 (n, L)`` mass per id, each row summing to 1, 0 on padding.
        exclude_ids: ``int64 (n, K)`` passages kept out of the row's softmax (labelled but not
            targets; targets of a same-text query), ``-1`` padding.
        query_keys: ``int64 (n,)`` text hash of each query (:func:`text_keys`).
        mode: ``"sample"`` (one target drawn per epoch by weight, InfoNCE), ``"soft"`` (the
            whole distribution, listwise KL) or ``"margin-mse"`` (one-hot on the teacher's best
            passage; ``teacher_scores`` carry the margins).
        teacher_scores: ``float32 (n, L)`` (``margin-mse``) the teacher's scores of
            ``target_ids`` divided by its temperature, NaN on padding; None otherwise.
    """

    name: str
    query_rows: np.ndarray
    target_ids: np.ndarray
    target_weights: np.ndarray
    exclude_ids: np.ndarray
    query_keys: np.ndarray
    mode: str = "sample"
    teacher_scores: np.ndarray | None = None

    def __post_init__(self) -> None:
        n = self.query_rows.shape[0]
        if self.mode not in MODES:
            raise ValueError(f"{self.name}: mode {self.mode!r} unknown; known: {MODES}")
        if (self.mode == "margin-mse") != (self.teacher_scores is not None):
            raise ValueError(f"{self.name}: teacher_scores go with mode margin-mse, and only it")
        if self.teacher_scores is not None and self.teacher_scores.shape != self.target_ids.shape:
            raise ValueError(f"{self.name}: teacher_scores must be shaped like target_ids")
        if self.target_ids.shape != self.target_weights.shape or self.target_ids.shape[0] != n:
            raise ValueError(f"{self.name}: target ids/weights must be (n={n}, L)")
        if self.exclude_ids.shape[0] != n or self.query_keys.shape != (n,):
            raise ValueError(f"{self.name}: exclude ids / query keys must have n={n} rows")
        w = np.where(self.target_ids >= 0, self.target_weights, 0.0)
        if n and not np.allclose(w.sum(axis=1), 1.0, atol=1e-4):
            raise ValueError(f"{self.name}: target weights must sum to 1 per row")

    def __len__(self) -> int:
        return int(self.query_rows.shape[0])


def label_pairs(
    candidates: np.ndarray,
    labels: np.ndarray,
    query_texts: Sequence[str],
    *,
    relevance_threshold: int = 1,
    query_rows: np.ndarray | None = None,
    name: str = "labels",
) -> PairSet:
    """Pairs from a split's labels: uniform over each query's relevant passages (mode sample).

    Args:
        candidates: ``int32 (nq, K)``; labels: ``uint8 (nq, K)`` (the whole split).
        query_texts: every query text of the split (for the collision keys).
        relevance_threshold: grade ``>=`` this is a target; other labelled passages are excluded.
        query_rows: the training queries (None: all); queries without a target are dropped.

    Raises:
        ValueError: no query has a relevant passage.
    """
    rel, lab = relevant_lists(np.asarray(candidates), np.asarray(labels), relevance_threshold)
    rows = np.arange(rel.shape[0]) if query_rows is None else np.asarray(query_rows, np.int64)
    rows = rows[(rel[rows] >= 0).any(axis=1)]
    if rows.size == 0:
        raise ValueError(f"{name}: no training query has a relevant passage")
    tid = rel[rows]
    w = (tid >= 0).astype(np.float32)
    w /= w.sum(axis=1, keepdims=True)
    excl = np.where(lab[rows] != tid, lab[rows], -1)  # labelled below the threshold
    keys = text_keys(query_texts)[rows]
    return PairSet(name, rows, tid, w, excl, keys, "sample")


def teacher_pairs(
    ids: np.ndarray,
    scores: np.ndarray,
    query_texts: Sequence[str],
    *,
    query_rows: np.ndarray | None = None,
    mode: str = "soft",
    k: int = 50,
    n_positives: int = 1,
    temperature: float = 1.0,
    labelled: np.ndarray | None = None,
    name: str = "teacher",
) -> PairSet:
    """Pairs from a teacher's ranking (any system: BM25, a fusion, a checkpoint).

    Args:
        ids: ``int64 (n, R)`` the teacher's ranked passage ids for queries ``query_rows``
            (``-1`` padding), best first.
        scores: ``float32 (n, R)`` its scores (any scale).
        query_texts: every query text of the split.
        query_rows: store query ids of the rows (None: ``0..n-1``).
        mode: ``"sample"``: the top ``n_positives`` are positives (uniform, one drawn per
            epoch); ``"soft"``: ``softmax(scores / temperature)`` over the top ``k``;
            ``"margin-mse"``: the top ``k`` with their ``scores / temperature`` kept as they are
            (``PairSet.teacher_scores``), the first (the teacher's best) as the positive.
        k: teacher depth used by ``soft`` and ``margin-mse``.
        n_positives: positives per query in ``sample`` mode.
        temperature: teacher temperature (``soft``, ``margin-mse``); in units of the
            teacher's scores.
        labelled: ``int64 (n, K)`` passages known relevant for each row (labels, where there are
            any): excluded from the row's softmax when not among its targets.
        name: recorded name.

    Raises:
        ValueError: bad mode / sizes, ``temperature <= 0``, a row without any teacher result.
    """
    ids = np.asarray(ids, dtype=np.int64)
    scores = np.asarray(scores, dtype=np.float64)
    n = ids.shape[0]
    rows = np.arange(n) if query_rows is None else np.asarray(query_rows, dtype=np.int64)
    if scores.shape != ids.shape or rows.shape != (n,):
        raise ValueError(f"{name}: ids {ids.shape}, scores {scores.shape}, rows {rows.shape}")
    if mode == "sample":
        tid = ids[:, :n_positives].copy()
        w = (tid >= 0).astype(np.float64)
    elif mode in ("soft", "margin-mse"):
        if temperature <= 0:
            raise ValueError(f"{name}: temperature must be > 0, got {temperature}")
        tid = ids[:, :k].copy()
        z = np.where(tid >= 0, scores[:, :k] / temperature, -np.inf)
        if mode == "margin-mse":
            graded = np.where(tid >= 0, z, np.nan).astype(np.float32)
            w = np.zeros(tid.shape)
            w[:, 0] = (tid[:, 0] >= 0).astype(np.float64)  # the teacher's best (runs are sorted)
        else:
            z -= z.max(axis=1, keepdims=True)
            w = np.where(tid >= 0, np.exp(z), 0.0)
    else:
        raise ValueError(f"{name}: mode {mode!r} unknown; known: {MODES}")
    total = w.sum(axis=1, keepdims=True)
    if bool((total[:, 0] <= 0).any()):
        raise ValueError(f"{name}: a query has no teacher result")
    w = (w / total).astype(np.float32)
    if labelled is not None:
        lab = np.asarray(labelled, dtype=np.int64)
        is_target = ((lab[:, :, None] == tid[:, None, :]) & (lab[:, :, None] >= 0)).any(axis=2)
        excl = np.where(is_target, -1, lab)
    else:
        excl = np.full((n, 0), -1, dtype=np.int64)
    keys = text_keys(query_texts)[rows]
    return PairSet(name, rows, tid, w, excl, keys, mode, graded if mode == "margin-mse" else None)


def exclude_same_text_targets(pairs: PairSet) -> PairSet:
    """Add to each row's ``exclude_ids`` the targets of every other row with the same query text.

    Returns:
        A new :class:`PairSet` (rows whose text is unique are unchanged, padded with ``-1``).
    """
    keys = pairs.query_keys
    _, inv, counts = np.unique(keys, return_inverse=True, return_counts=True)
    twins = np.flatnonzero(counts[inv] > 1)
    if twins.size == 0:
        return pairs
    by_key: dict[int, set[int]] = {}
    for r in twins:
        by_key.setdefault(int(keys[r]), set()).update(int(x) for x in pairs.target_ids[r] if x >= 0)
    extra: list[list[int]] = [[] for _ in range(len(pairs))]
    for t in twins.tolist():
        own = {int(x) for x in pairs.target_ids[t] if x >= 0}
        extra[t] = sorted(by_key[int(keys[t])] - own)
    width = max(len(e) for e in extra)
    add = np.full((len(pairs), width), -1, dtype=np.int64)
    for i, e in enumerate(extra):
        add[i, : len(e)] = e
    excl = np.concatenate([pairs.exclude_ids, add], axis=1)
    return PairSet(
        pairs.name,
        pairs.query_rows,
        pairs.target_ids,
        pairs.target_weights,
        excl,
        pairs.query_keys,
        pairs.mode,
        pairs.teacher_scores,
    )


class PairSampler:
    """Seeded epochs of collision-free batches drawn from a weighted mixture of pair sets.

    All pair sets index the same store (query and passage ids of one vector table).

    Args:
        sources: the pair sets.
        weights: relative share of batch slots per source (default: proportional to size).
        batch_size: ``B``.
        epoch_size: queries per epoch (default: the total number of pairs).
        seed: epoch ``e`` draws from ``numpy.random.default_rng([seed, e])``.
        collisions: ``True``: a batch never holds two queries that share a target passage or
            a query text (a query that would collide waits for a later batch).

    Raises:
        ValueError: no pairs, or weights of the wrong length / not positive.
    """

    def __init__(
        self,
        sources: Sequence[PairSet],
        *,
        weights: Sequence[float] | None = None,
        batch_size: int = 64,
        epoch_size: int | None = None,
        seed: int = 0,
        collisions: bool = True,
    ) -> None:
        self.sources = [exclude_same_text_targets(s) for s in sources if len(s)]
        if not self.sources:
            raise ValueError("no training pairs in any source")
        sizes = np.array([len(s) for s in self.sources], dtype=np.float64)
        w = sizes if weights is None else np.asarray(list(weights), dtype=np.float64)
        if w.shape != sizes.shape or bool((w <= 0).any()):
            raise ValueError(f"need one positive weight per non-empty source, got {list(w)}")
        self.weights = w / w.sum()
        self.batch_size = int(batch_size)
        self.epoch_size = int(epoch_size or sizes.sum())
        self.seed = int(seed)
        self.collisions = collisions
        self.soft = any(s.mode == "soft" for s in self.sources)
        self.margin = any(s.mode == "margin-mse" for s in self.sources)

    def __len__(self) -> int:
        return max(1, self.epoch_size // self.batch_size)

    def _stream(self, rng: np.random.Generator) -> Iterator[tuple[int, int]]:
        """Endless ``(source, row)`` draws: source by weight, rows in per-source permutations."""
        perms = [rng.permutation(len(s)) for s in self.sources]
        pos = [0] * len(self.sources)
        while True:
            for si in rng.choice(len(self.sources), size=1024, p=self.weights):
                if pos[si] == len(perms[si]):
                    perms[si], pos[si] = rng.permutation(len(self.sources[si])), 0
                yield int(si), int(perms[si][pos[si]])
                pos[si] += 1

    def epoch(self, epoch: int) -> Iterator[Batch]:
        """The batches of epoch ``epoch``."""
        rng = np.random.default_rng([self.seed, epoch])
        stream = self._stream(rng)
        waiting: list[tuple[int, int]] = []
        for _ in range(len(self)):
            chosen: list[tuple[int, int]] = []
            used_p: set[int] = set()
            used_q: set[int] = set()
            pending, waiting = waiting, []
            tries = 0
            while len(chosen) < self.batch_size:
                item = pending.pop(0) if pending else next(stream)
                tries += 1
                src = self.sources[item[0]]
                tids = {int(x) for x in src.target_ids[item[1]] if x >= 0}
                key = int(src.query_keys[item[1]])
                clash = self.collisions and (bool(tids & used_p) or key in used_q)
                if clash and tries < 50 * self.batch_size:
                    waiting.append(item)
                    continue
                chosen.append(item)
                used_p |= tids
                used_q.add(key)
            waiting.extend(pending)
            yield self.make_batch(chosen, rng)

    def make_batch(self, items: Sequence[tuple[int, int]], rng: np.random.Generator) -> Batch:
        """Batch of ``(source, row)`` items: columns = the targets (one drawn per ``sample``
        row, all of a ``soft`` row), the target matrix, and masks (excluded passages, other
        rows' same-text targets)."""
        q_rows, tlists, wlists, excl, graded = [], [], [], [], []
        for si, r in items:
            s = self.sources[si]
            ids, w = s.target_ids[r], s.target_weights[r]
            ok = ids >= 0
            ids, w = ids[ok], w[ok].astype(np.float64)
            if s.mode == "sample":
                pick = int(rng.choice(ids.size, p=w / w.sum()))
                ids, w = ids[pick : pick + 1], np.ones(1)
            q_rows.append(int(s.query_rows[r]))
            tlists.append(ids)
            wlists.append(w / w.sum())
            excl.append(s.exclude_ids[r][s.exclude_ids[r] >= 0])
            graded.append(None if s.teacher_scores is None else s.teacher_scores[r][ok])
        cols = np.unique(np.concatenate(tlists))
        bsz, m = len(items), cols.size
        target = np.zeros((bsz, m), dtype=np.float32)
        mask_out = np.zeros((bsz, m), dtype=bool)
        teacher = None
        if self.margin:
            teacher = np.full((bsz, m), np.nan, dtype=np.float32)
            for i, (ids, g) in enumerate(zip(tlists, graded, strict=True)):
                if g is not None:
                    teacher[i, np.searchsorted(cols, ids)] = g  # the teacher's values, as they are
        for i, (ids, w, ex) in enumerate(zip(tlists, wlists, excl, strict=True)):
            np.add.at(target[i], np.searchsorted(cols, ids), w)
            at = np.searchsorted(cols, ex)
            hit = (at < m) & (cols[np.clip(at, 0, m - 1)] == ex)
            mask_out[i, at[hit]] = True
        keys = np.array([self.sources[si].query_keys[r] for si, r in items], dtype=np.int64)
        known = [np.concatenate([t, e]) for t, e in zip(tlists, excl, strict=True)]
        mask_out |= collision_mask(keys, known, cols)  # the one rule (sampler.collision_mask)
        mask_out &= target == 0
        positive = np.zeros((bsz, m), dtype=bool)
        positive[np.arange(bsz), target.argmax(axis=1)] = True
        t_len = max(len(t) for t in tlists)
        t_ids = np.full((bsz, t_len), -1, dtype=np.int64)
        t_w = np.zeros((bsz, t_len), dtype=np.float32)
        for i, (ids, w) in enumerate(zip(tlists, wlists, strict=True)):
            t_ids[i, : ids.size], t_w[i, : ids.size] = ids, w
        e_len = max([len(e) for e in excl] + [0])
        e_ids = np.full((bsz, e_len), -1, dtype=np.int64)
        for i, e in enumerate(excl):
            e_ids[i, : e.size] = e
        return Batch(
            np.asarray(q_rows, dtype=np.int64),
            cols,
            positive,
            mask_out,
            target=target if self.soft else None,
            target_ids=t_ids,
            target_weights=t_w,
            exclude_ids=e_ids,
            teacher_scores=teacher,
        )


def train_on_pairs(
    model: Any,
    query_vectors: np.ndarray,
    passage_vectors: np.ndarray,
    sources: Sequence[PairSet],
    config: TrainerConfig | None = None,
    *,
    weights: Sequence[float] | None = None,
    batch_size: int = 64,
    epoch_size: int | None = None,
    collisions: bool = True,
    seed: int = 0,
    validate: Validate | None = None,
    log: TrainingLog | None = None,
    progress: bool = True,
) -> FitResult:
    """Train a :class:`~treerank.training.trainer.ContrastiveModule` on a mixture of sources.

    Args:
        model: the module (heads, DRT).
        query_vectors, passage_vectors: the store's vectors (``float32 (nq, d)``, ``(N, d)``);
            every pair set indexes them.
        sources: pair sets (:func:`label_pairs`, :func:`teacher_pairs`, pseudo labels).
        config: trainer settings; ``negatives: all`` takes the softmax over all ``N`` passages.
        weights, batch_size, epoch_size, collisions, seed: see :class:`PairSampler`.
        validate, log, progress: see :func:`~treerank.training.trainer.fit`.
    """
    sampler = PairSampler(
        sources,
        weights=weights,
        batch_size=batch_size,
        epoch_size=epoch_size,
        seed=seed,
        collisions=collisions,
    )
    return fit(
        model,
        sampler,
        query_vectors,
        passage_vectors,
        config,
        validate=validate,
        log=log,
        progress=progress,
    )
