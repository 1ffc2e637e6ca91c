"""Forest search: per-model inverted lists ``class -> passage ids`` and vectorised match counting.

A TreeRank forest (:class:`treerank.forest.model.Forest`) assigns every passage, under each of
its ``M`` models, one of ``C`` classes or "not retrievable". The index keeps, for each
``(model m, class c)``, the ascending list of passage ids with ``class_m(p) == c`` in one
CSR-style layout (bm25s / scipy style: plain arrays, mmap-able):

* ``offsets``: ``int64 (M * C + 1,)``; list ``l = m * C + c`` is ``ids[offsets[l]:offsets[l+1]]``
* ``ids``: ``int32 (nnz,)`` passage ids, ascending inside every list
* ``probs``: ``float32 (nnz,)`` the passage model's softmax probability of that class

Passages not retrievable for model ``m`` appear in none of ``m``'s lists.

Search (:meth:`ForestIndex.search`) runs the compiled counting kernel of
:mod:`treerank.forest.kernel`: the match count stays sparse end to end and the top ``k``
is taken over the passages the query's lists touch, never over all ``n`` passages.

**Devices**: ``search`` / ``search_probes`` take ``device`` (``auto | cpu | cuda[:n]``, None =
the CPU) and ``backend`` (:data:`COUNT_BACKENDS`): ``"auto"`` is the numba kernel on the CPU and
the torch kernel (:mod:`treerank.forest.torch_kernel`, the index's arrays gathered and
scattered on the device) on a GPU; ``"torch"`` forces the torch kernel (on the CPU too, which is
how it is tested against the numba kernel). Both give the same ids, counts, secondary scores and
keys, bit for bit, for every scoring. numba is imported only when the numba kernel runs.

Ranking (TreeRank seed): ``count(q, p) = #{m : class_m(q) == class_m(p)}``. Integer counts tie
massively, so the order is **lexicographic and deterministic**:

1. match count, highest first;
2. secondary score ``sum over matching models of P_m(class | q) * P_m(class | p)`` (the summed
   probability that both sides really fall in the matching class), highest first;
3. passage id, ascending.

The ``Run.scores`` written for a forest are ``count + secondary / (M + 1)`` (``secondary <=
count <= M``, so this is strictly monotone in the lexicographic order in exact arithmetic; the
float32 copy in the run may round, the ids carry the exact order). Passages with zero matching
models are **not retrieved** (the run is padded with ``-1``): a forest retrieves only what shares
at least one class with the query.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from treerank.forest.model import Forest
from treerank.kernels.device import DEFAULT_DEVICE, Device
from treerank.kernels.topk import RUN_DEPTH
from treerank.search.run import Run
from treerank.storelike import Vectors

COUNT_BACKENDS = ("auto", "numba", "torch")
"""Counting kernels of :meth:`ForestIndex.search`: ``auto`` = numba on the CPU, torch on a GPU."""
ID_BLOCK = 16384
""":data:`treerank.forest.kernel.ID_BLOCK` (repeated, not imported, so that numba loads
only when the numba kernel runs; a test checks the two agree)."""
_ID_BLOCK = ID_BLOCK
"""Passage ids per accumulation block of the numba kernel (a knob for tests)."""
_QUERY_BLOCK = 4096
"""Queries per kernel call (bounds the ``(B, k)`` outputs held at once with the scratch)."""


def build_inverted_lists(
    classes: np.ndarray, probs: np.ndarray, n_classes: int, id_offset: int = 0
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """CSR inverted lists from a passage-class table.

    Args:
        classes: ``int (n, M)`` class of passage ``i`` under model ``m``; ``-1`` = not indexed;
            or ``int (n, M, K)`` up to ``K`` distinct classes per model (multi-assignment).
        probs: ``float32`` of the same shape, the probability of that class.
        n_classes: C.
        id_offset: passage id of row 0.

    Returns:
        ``(offsets int64 (M*C+1,), ids int32 (nnz,), probs float32 (nnz,))``; ids ascending
        inside each list.

    Raises:
        ValueError: shapes differ or a class is outside ``[-1, C)``.
    """
    classes = np.asarray(classes)
    probs = np.asarray(probs, dtype=np.float32)
    if classes.ndim not in (2, 3) or classes.shape != probs.shape:
        raise ValueError(f"forest index: classes {classes.shape} and probs {probs.shape} differ")
    n, m = classes.shape[:2]
    per = 1 if classes.ndim == 2 else classes.shape[2]
    classes = classes.reshape(n, m * per)
    probs = probs.reshape(n, m * per)
    if classes.size and (classes.min() < -1 or classes.max() >= n_classes):
        raise ValueError(f"forest index: classes must lie in [-1, {n_classes})")
    valid = classes >= 0
    # Row-major nonzero: rows ascending, so a stable sort on the list key keeps ids ascending.
    rows, cols = np.nonzero(valid)
    keys = (cols // per).astype(np.int64) * n_classes + classes[rows, cols]
    order = np.argsort(keys, kind="stable")
    keys = keys[order]
    offsets = np.zeros(m * n_classes + 1, dtype=np.int64)
    np.cumsum(np.bincount(keys, minlength=m * n_classes), out=offsets[1:])
    ids = (rows[order] + id_offset).astype(np.int32)
    return offsets, ids, probs[rows, cols][order]


@dataclass
class ForestHits:
    """Search result: ``ids int64 (nq, k)`` (-1 pad), ``counts int32 (nq, k)``, ``secondary
    float64 (nq, k)``, ranked by (count desc, secondary desc, id asc); ``scanned int64 (nq,)``
    posting entries read per query (empty when not measured)."""

    ids: np.ndarray
    counts: np.ndarray
    secondary: np.ndarray
    scanned: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    keys: np.ndarray | None = None
    """``float64 (nq, k)`` ranking keys of a non-seed scoring (:meth:`ForestIndex.search_probes`;
    ``secondary`` is then zero); None for the shipped order."""

    def scores(self, n_models: int) -> np.ndarray:
        """``float32 (nq, k)`` run scores ``count + secondary / (M + 1)`` (``-inf`` on padding),
        or the ranking keys of another scoring."""
        if self.keys is not None:
            return np.where(self.ids >= 0, self.keys, -np.inf).astype(np.float32)
        s = (self.counts + self.secondary / (n_models + 1)).astype(np.float32)
        return np.where(self.ids >= 0, s, np.float32(-np.inf)).astype(np.float32)

    def tie_stats(self, at: int = 10) -> dict[str, float]:
        """How often ties decide the rank-``at`` boundary (needs ``k > at``).

        Returns:
            ``count_tie``: fraction of queries whose match count at rank ``at`` equals the one at
            rank ``at + 1`` (the count alone cannot decide who is in the top ``at``);
            ``secondary_tie``: fraction where count *and* secondary tie there (passage id
            decides); ``mean_tied_at_boundary``: mean number of retrieved passages sharing the
            count of rank ``at``. Queries with fewer than ``at + 1`` retrieved passages count as
            no tie.

        Raises:
            ValueError: ``k <= at``.
        """
        if self.ids.shape[1] <= at:
            raise ValueError(f"tie_stats: need k > {at} (got k={self.ids.shape[1]})")
        valid = self.ids[:, at] >= 0
        ct = valid & (self.counts[:, at - 1] == self.counts[:, at])
        st = ct & (self.secondary[:, at - 1] == self.secondary[:, at])
        same = (self.counts == self.counts[:, at - 1 : at]) & (self.ids >= 0)
        n = max(1, len(self.ids))
        return {
            "count_tie": float(ct.sum() / n),
            "secondary_tie": float(st.sum() / n),
            "mean_tied_at_boundary": float(same.sum(axis=1).mean()) if len(self.ids) else 0.0,
        }


class ForestIndex:
    """Inverted lists of a forest over a passage collection (see the module docstring).

    Args:
        n_models: M.
        n_classes: C.
    """

    def __init__(self, n_models: int, n_classes: int) -> None:
        self.n_models = int(n_models)
        self.n_classes = int(n_classes)
        self.n_passages = 0
        self.offsets = np.zeros(self.n_models * self.n_classes + 1, dtype=np.int64)
        self.ids = np.zeros(0, dtype=np.int32)
        self.probs = np.zeros(0, dtype=np.float32)
        self._table: tuple[torch.device, torch.Tensor, torch.Tensor, torch.Tensor] | None = None

    @classmethod
    def build(cls, classes: np.ndarray, probs: np.ndarray, n_classes: int) -> ForestIndex:
        """Index passages ``0 .. n-1`` from ``classes int (n, M)`` (-1 = not retrievable) and
        ``probs float32 (n, M)``."""
        index = cls(np.asarray(classes).shape[1], n_classes)
        index.add(classes, probs)
        return index

    def add(self, classes: np.ndarray, probs: np.ndarray) -> np.ndarray:
        """Index new passages without retraining; they get ids ``n_passages, n_passages+1, ...``.

        The new entries are merged into every list with a stable sort on the list key, so lists
        stay ascending by id (cost ``O(nnz log nnz)``).

        Args:
            classes: ``int (n_new, M)`` from :meth:`Forest.passage_classes`.
            probs: ``float32 (n_new, M)``.

        Returns:
            ``int64 (n_new,)`` the ids given to the new passages.

        Raises:
            ValueError: wrong number of models or classes out of range.
        """
        classes = np.asarray(classes)
        if classes.ndim not in (2, 3) or classes.shape[1] != self.n_models:
            raise ValueError(
                f"forest index: expected classes of shape (n, {self.n_models}[, K]), got "
                f"{classes.shape}"
            )
        new_off, new_ids, new_probs = build_inverted_lists(
            classes, probs, self.n_classes, id_offset=self.n_passages
        )
        n_lists = self.n_models * self.n_classes
        if self.ids.size == 0:
            self.offsets, self.ids, self.probs = new_off, new_ids, new_probs
        else:
            old_keys = np.repeat(np.arange(n_lists, dtype=np.int64), np.diff(self.offsets))
            new_keys = np.repeat(np.arange(n_lists, dtype=np.int64), np.diff(new_off))
            order = np.argsort(np.concatenate([old_keys, new_keys]), kind="stable")
            self.ids = np.concatenate([self.ids, new_ids])[order]
            self.probs = np.concatenate([self.probs, new_probs])[order]
            self.offsets = self.offsets + new_off
        first = self.n_passages
        self.n_passages += len(classes)
        self._table = None
        return np.arange(first, self.n_passages, dtype=np.int64)

    def _device_lists(self, dev: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The CSR arrays as tensors on ``dev`` (kept for the next search there)."""
        table = self._table
        if table is None or table[0] != dev:
            offsets, ids, probs = (
                torch.from_numpy(np.ascontiguousarray(a)).to(dev)
                for a in (self.offsets, self.ids, self.probs)
            )
            table = self._table = (dev, offsets, ids, probs)
        return table[1], table[2], table[3]

    def _scanned(self, lists: np.ndarray) -> np.ndarray:
        """``int64 (B,)`` posting entries of each query's lists ``int64 (B, L)``."""
        return np.diff(self.offsets)[lists].sum(axis=1).astype(np.int64)

    def _count(
        self,
        kernel: str,
        dev: torch.device,
        lists: np.ndarray,
        w: np.ndarray,
        probe: int,
        k: int,
        count_on: bool,
        use_pp: bool,
        divisor: float,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Top ``k`` of the model-major lists ``int64 (nq, M * t)`` with weights ``float64 (nq,
        M * t)`` -> numpy ``(ids int64, keys float64, counts int32, secondary float64)``, each
        ``(nq, k)``: :func:`~treerank.forest.kernel.count_topk` (``kernel="numba"``, on the CPU,
        :data:`_QUERY_BLOCK` queries a call) or its bit-identical twin
        :func:`~treerank.forest.torch_kernel.count_topk_torch` on ``dev`` (``"torch"``)."""
        if kernel == "torch":
            from treerank.forest.torch_kernel import count_topk_torch

            offsets, t_ids, t_probs = self._device_lists(dev)
            res = count_topk_torch(
                offsets,
                t_ids,
                t_probs,
                torch.from_numpy(np.ascontiguousarray(lists, dtype=np.int64)).to(dev),
                torch.from_numpy(np.ascontiguousarray(w, dtype=np.float64)).to(dev),
                probe,
                self.n_passages,
                k,
                count_on=count_on,
                use_passage_prob=use_pp,
                divisor=divisor,
            )
            i, keys, cnt, sec = (t.cpu().numpy() for t in res)
            return i, keys, cnt, sec
        import numba

        from treerank.forest.kernel import count_topk

        nq = len(lists)
        out: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] = (
            np.full((nq, k), -1, dtype=np.int64),
            np.full((nq, k), -np.inf, dtype=np.float64),
            np.zeros((nq, k), dtype=np.int32),
            np.zeros((nq, k), dtype=np.float64),
        )
        ids = np.ascontiguousarray(self.ids, dtype=np.int32)
        probs = np.ascontiguousarray(self.probs, dtype=np.float32)
        w = np.ascontiguousarray(w, dtype=np.float64)
        for s in range(0, nq, _QUERY_BLOCK):
            sl = slice(s, min(nq, s + _QUERY_BLOCK))
            part = count_topk(
                self.offsets,
                ids,
                probs,
                np.ascontiguousarray(lists[sl]),
                w[sl],
                probe,
                self.n_passages,
                k,
                count_on,
                use_pp,
                divisor,
                numba.get_num_threads(),
                _ID_BLOCK,
            )
            for arr, got in zip(out, part[:4], strict=True):
                arr[sl] = got
        return out

    @property
    def nbytes(self) -> int:
        """Bytes of the stored index arrays (offsets, ids, probs)."""
        return int(self.offsets.nbytes + self.ids.nbytes + self.probs.nbytes)

    def search_nbytes(self, threads: int = 1) -> int:
        """Bytes while searching: the stored arrays plus the kernel's per-thread scratch
        (``int32`` count, ``float64`` secondary and ``int64`` touched id per id of a block)."""
        return self.nbytes + threads * 20 * min(_ID_BLOCK, self.n_passages)

    def list_sizes(self) -> np.ndarray:
        """``int64 (M, C)`` passages per (model, class) list."""
        return np.diff(self.offsets).reshape(self.n_models, self.n_classes)

    def search(
        self,
        query_classes: np.ndarray,
        query_probs: np.ndarray,
        k: int,
        *,
        device: Device = DEFAULT_DEVICE,
        backend: str = "auto",
    ) -> ForestHits:
        """Top ``k`` passages of each query by (match count, secondary score, passage id).

        Args:
            query_classes: ``int (nq, M)`` from :meth:`Forest.query_classes`.
            query_probs: ``float32 (nq, M)``.
            k: depth (``>= 1``).
            device: where the counting runs (``auto | cpu | cuda[:n]``, None = the CPU).
            backend: :data:`COUNT_BACKENDS` (``auto``: numba on the CPU, torch on a GPU); the
                results do not depend on it.

        Returns:
            :class:`ForestHits` with ``(nq, k)`` arrays.

        Raises:
            ValueError: shapes disagree with the index, ``k < 1``, an unknown backend, or
                ``numba`` on a GPU. DeviceError: a device that cannot be used.
        """
        dev, kernel = count_kernel(device, backend)
        qc = np.asarray(query_classes)
        qp = np.asarray(query_probs, dtype=np.float32)
        if qc.ndim != 2 or qc.shape[1] != self.n_models or qc.shape != qp.shape:
            raise ValueError(
                f"forest search: expected query classes/probs of shape (nq, {self.n_models}), "
                f"got {qc.shape} / {qp.shape}"
            )
        if k < 1:
            raise ValueError(f"forest search: k must be >= 1 (got {k})")
        if qc.size and (qc.min() < 0 or qc.max() >= self.n_classes):
            raise ValueError(f"forest search: query classes must lie in [0, {self.n_classes})")
        lists = np.arange(self.n_models, dtype=np.int64)[None, :] * self.n_classes + qc
        w = np.asarray(qp, dtype=np.float64)
        h_ids, _, h_cnt, h_sec = self._count(
            kernel, dev, lists, w, 1, int(k), True, True, float(self.n_models + 1)
        )
        return ForestHits(h_ids, h_cnt, h_sec, self._scanned(lists))

    def search_probes(
        self,
        query_classes: np.ndarray,
        query_probs: np.ndarray,
        floor: np.ndarray,
        k: int,
        scoring: str = "shipped",
        *,
        device: Device = DEFAULT_DEVICE,
        backend: str = "auto",
    ) -> ForestHits:
        """Top ``k`` passages over each query's top-``t`` classes per model, by ``scoring``.

        A passage counts at most once per model (the first, most probable, of the query's
        probed classes it is indexed in). Keys (:data:`treerank.forest.model.SCORINGS`):
        ``shipped`` = count + ``sum P(c|q) P(c|p)`` / (M + 1); ``count`` = count; ``soft`` =
        ``sum (log P(c|q) - log floor)`` (floor = the best unprobed class's probability, at
        least ``1e-30``); ``query-prob`` = ``sum P(c|q)``; ties by id ascending.

        Args:
            query_classes: ``int (nq, M, t)`` from :meth:`Forest.query_top` (descending).
            query_probs: ``float32 (nq, M, t)``. floor: ``float32 (nq, M)``.
            k: depth (``>= 1``). scoring: one of ``SCORINGS``.
            device / backend: as :meth:`search` (every scoring runs on both kernels).

        Returns:
            :class:`ForestHits` with ``keys`` set (``secondary`` zero).

        Raises:
            ValueError: shapes, classes, ``k``, ``scoring`` or ``backend`` out of range.
            DeviceError: a device that cannot be used.
        """
        from treerank.forest.model import SCORINGS

        dev, kernel = count_kernel(device, backend)
        qc = np.asarray(query_classes)
        qp = np.asarray(query_probs, dtype=np.float64)
        fl = np.asarray(floor, dtype=np.float64)
        if qc.ndim != 3 or qc.shape[1] != self.n_models or qc.shape != qp.shape:
            raise ValueError(
                f"forest search: expected probes of shape (nq, {self.n_models}, t), got "
                f"{qc.shape} / {qp.shape}"
            )
        if fl.shape != qc.shape[:2]:
            raise ValueError(f"forest search: floor {fl.shape} does not match {qc.shape[:2]}")
        if k < 1:
            raise ValueError(f"forest search: k must be >= 1 (got {k})")
        if scoring not in SCORINGS:
            raise ValueError(f"forest search: scoring must be one of {SCORINGS} ({scoring!r})")
        if qc.size and (qc.min() < 0 or qc.max() >= self.n_classes):
            raise ValueError(f"forest search: query classes must lie in [0, {self.n_classes})")
        nq, m, t = qc.shape
        lists = (np.arange(m, dtype=np.int64)[None, :, None] * self.n_classes + qc).reshape(nq, -1)
        if scoring == "soft":
            w = np.log(np.maximum(qp, 1e-30)) - np.log(np.maximum(fl, 1e-30))[:, :, None]
        else:
            w = qp
        w = np.ascontiguousarray(w.reshape(nq, -1), dtype=np.float64)
        count_on = scoring in ("shipped", "count")
        use_pp = scoring == "shipped"
        divisor = {"shipped": float(m + 1), "count": float("inf")}.get(scoring, 1.0)
        h_ids, h_keys, h_cnt, _ = self._count(
            kernel, dev, lists, w, t, int(k), count_on, use_pp, divisor
        )
        zero = np.zeros((nq, k), dtype=np.float64)
        return ForestHits(h_ids, h_cnt, zero, self._scanned(lists), h_keys)

    def stats(self) -> dict[str, Any]:
        """Class-balance statistics of the indexed passages.

        Returns:
            ``passage_class_entropy``: per-model entropy (nats) of the class-usage distribution
            over indexed passages, as a list of M floats; ``max_entropy`` = ``log C``;
            ``not_retrievable_fraction``: fraction of (passage, model) entries left out;
            ``passages_never_indexed``: passages absent from every model; ``nbytes``.
        """
        sizes = self.list_sizes().astype(np.float64)
        tot = sizes.sum(axis=1, keepdims=True)
        p = np.divide(sizes, tot, out=np.zeros_like(sizes), where=tot > 0)
        ent = -(p * np.log(np.where(p > 0, p, 1.0))).sum(axis=1)
        cells = max(1, self.n_passages * self.n_models)
        seen = np.zeros(self.n_passages, dtype=bool)
        seen[self.ids] = True
        # distinct (model, passage) cells (a passage may sit in K lists of one model)
        model_of = np.repeat(
            np.arange(self.n_models, dtype=np.int64), sizes.sum(axis=1).astype(np.int64)
        )
        n_cells = np.unique(model_of * max(1, self.n_passages) + self.ids).size
        return {
            "passage_class_entropy": ent.tolist(),
            "max_entropy": float(np.log(self.n_classes)),
            "not_retrievable_fraction": float(1.0 - n_cells / cells),
            "postings_per_passage": float(self.ids.size / max(1, self.n_passages)),
            "passages_never_indexed": int((~seen).sum()),
            "nbytes": self.nbytes,
        }


def count_kernel(
    device: Device = DEFAULT_DEVICE, backend: str = "auto"
) -> tuple[torch.device, str]:
    """The device and counting kernel a search runs: ``(torch.device, "numba" | "torch")``.

    Raises:
        ValueError: ``backend`` not in :data:`COUNT_BACKENDS`, or ``numba`` on a GPU.
        DeviceError: ``device`` cannot be used (:func:`treerank.kernels.device.resolve_device`).
    """
    from treerank.kernels.device import resolve_device

    if backend not in COUNT_BACKENDS:
        raise ValueError(
            f"forest search: unknown counting backend {backend!r}; known: "
            f"{', '.join(COUNT_BACKENDS)}"
        )
    dev = resolve_device(device)
    if dev.type != "cpu" and backend == "numba":
        raise ValueError(f"forest search: the numba kernel runs on the CPU only (device {dev})")
    if backend == "auto":
        return dev, "numba" if dev.type == "cpu" else "torch"
    return dev, backend


def assign_passages(
    forest: Forest, passages: Any, chunk_size: int = 16384, device: Device = DEFAULT_DEVICE
) -> ForestIndex:
    """Index ``passages`` in each passage's top-K classes per model under the per-class
    capacity of ``forest.search`` (:func:`treerank.forest.capacity.assign_capacity`).

    The capacity of model ``m`` is ``ceil((1 + epsilon) * K * N_m / C)`` with ``N_m`` the
    passages it indexes (not retrievable ones excluded), unbounded when ``epsilon`` is None.
    The whole passage matrix is classified (in row chunks) one model block at a time: memory
    ``O(n * (C + 1))`` per model of the block.

    Args:
        forest: the forest (``search.assign`` = K). passages: ``float32 (n, d)`` (a memmap is
            read in chunks).
        device: where the passage models' softmax is computed (``auto | cpu | cuda[:n]``,
            None = the CPU); the capacity-bounded assignment itself (numba) runs on the CPU.

    Returns:
        the :class:`ForestIndex` (postings ``<= K`` per (passage, model)).
    """
    from treerank.forest.capacity import assign_capacity

    sc = forest.search
    n, m_all, c = len(passages), forest.n_models, forest.n_classes
    kk = min(sc.assign, c)
    classes = np.full((n, m_all, kk), -1, dtype=np.int32)
    probs = np.zeros((n, m_all, kk), dtype=np.float32)
    mb = max(1, min(m_all, (1 << 24) // max(1, n * (c + 1))))
    for m0 in range(0, m_all, mb):
        m1 = min(m_all, m0 + mb)
        pr = np.empty((m1 - m0, n, c + 1), dtype=np.float32)
        for r0 in range(0, n, chunk_size):
            block = np.asarray(passages[r0 : r0 + chunk_size], dtype=np.float32)
            pr[:, r0 : r0 + len(block)] = forest.passage_probabilities(block, m0, m1, device)
        for g in range(m1 - m0):
            n_in = int((pr[g, :, c] <= forest.config.nr_threshold).sum())
            if sc.capacity_epsilon is None:
                cap = max(1, n_in)
            else:
                cap = max(1, int(np.ceil((1.0 + sc.capacity_epsilon) * kk * n_in / c)))
            cg, pg = assign_capacity(pr[g], kk, cap, float(forest.config.nr_threshold))
            classes[:, m0 + g] = cg
            probs[:, m0 + g] = pg
    return ForestIndex.build(classes, probs, c)


def class_entropy(classes: np.ndarray, n_classes: int) -> np.ndarray:
    """Entropy (nats) of class usage per model: ``classes int (n, M)`` (-1 ignored) ->
    ``float64 (M,)``; ``log C`` is perfectly balanced, 0 is all in one class."""
    classes = np.asarray(classes)
    n, m = classes.shape
    keys = (np.arange(m)[None, :] * n_classes + classes)[classes >= 0]
    counts = np.bincount(keys, minlength=m * n_classes).reshape(m, n_classes).astype(np.float64)
    tot = counts.sum(axis=1, keepdims=True)
    p = np.divide(counts, tot, out=np.zeros_like(counts), where=tot > 0)
    return -(p * np.log(np.where(p > 0, p, 1.0))).sum(axis=1)


class ForestSystem:
    """A forest as a retrieval system: ``retrieve(store, k) -> Run`` (the ``System`` protocol).

    ``retrieve`` classifies the store's passages in chunks, builds the inverted lists, classifies
    the queries and searches. The last index and hits are kept in ``index`` / ``hits`` for
    statistics (class balance, ties).

    Args:
        forest: a trained :class:`Forest`.
        name: run name (default: the forest's name).
        chunk_size: passages classified per chunk.
        device: where queries and passages are classified and the matches counted (``auto |
            cpu | cuda[:n]``, None = the CPU; resolved before any work). On a GPU the counting
            is the torch kernel (:mod:`treerank.forest.torch_kernel`), on the CPU the
            numba kernel unless ``backend="torch"``. The counting gives the same ranking on
            every device and kernel for the same classes; the classes themselves are float32
            argmaxes, so a GPU can differ from the CPU where two classes tie within rounding.
        backend: the counting kernel (:data:`COUNT_BACKENDS`).

    Raises:
        DeviceError / ValueError: a device or backend that cannot be used.
    """

    def __init__(
        self,
        forest: Forest,
        name: str | None = None,
        chunk_size: int = 16384,
        device: Device = DEFAULT_DEVICE,
        backend: str = "auto",
    ) -> None:
        count_kernel(device, backend)  # a device or backend that cannot be used fails here
        self.device = device
        self.backend = backend
        self.forest = forest
        self.name = name or forest.name
        self.chunk_size = chunk_size
        self.index: ForestIndex | None = None
        self.hits: ForestHits | None = None
        self._query_classes = np.zeros((0, forest.n_models), dtype=np.int64)
        self._store: Vectors | None = None

    def build_index(self, store: Vectors) -> ForestIndex:
        """Index every passage of ``store`` (an ``EmbeddingStore``) the forest's way
        (``forest.search.assign``: its argmax class per model, or its top-K under the capacity
        of :func:`assign_passages`)."""
        if self.forest.search.assign > 1:
            return assign_passages(self.forest, store.passages, self.chunk_size, self.device)
        index = ForestIndex(self.forest.n_models, self.forest.n_classes)
        for _, block in store.iter_passage_chunks(self.chunk_size):
            x = np.asarray(block, dtype=np.float32)
            index.add(*self.forest.passage_classes(x, device=self.device))
        return index

    def search_queries(self, queries: np.ndarray, k: int) -> ForestHits:
        """Search :attr:`index` for ``float32 (nq, d)`` queries the forest's way
        (``forest.search``: probe depth and scoring)."""
        if self.index is None:
            raise RuntimeError("search_queries: build the index first")
        sc = self.forest.search
        q = np.asarray(queries, dtype=np.float32)
        dev, backend = self.device, self.backend
        if sc.probe == 1 and sc.scoring == "shipped" and sc.assign == 1:
            qc, qp = self.forest.query_classes(q, device=dev)
            self._query_classes = qc
            return self.index.search(qc, qp, k, device=dev, backend=backend)
        t = min(sc.probe, self.forest.n_classes)
        qc3, qp3, floor = self.forest.query_top(q, t, device=self.device)
        self._query_classes = qc3[:, :, 0]
        return self.index.search_probes(qc3, qp3, floor, k, sc.scoring, device=dev, backend=backend)

    def retrieve(self, store: Vectors, k: int = RUN_DEPTH) -> Run:
        """Rank all passages of ``store`` (its vectors alone) for all its queries.

        Returns:
            ``Run`` with ``ids int64 (nq, k)`` (-1 padded past the passages sharing no class with
            the query) and ``scores float32 (nq, k)`` = ``count + secondary / (M + 1)`` (or the
            key of the forest's ``search.scoring``).
        """
        self.index = self.build_index(store)
        self.hits = self.search_queries(np.asarray(store.queries, dtype=np.float32), k)
        self._store = store
        return Run(name=self.name, ids=self.hits.ids, scores=self.hits.scores(self.forest.n_models))

    def balance_stats(self) -> dict[str, Any]:
        """Class balance, not-retrievable share and ties of the last :meth:`retrieve`.

        Returns:
            ``max_entropy_log_c``; mean / min over models of the class-usage entropy (nats) of the
            split's queries and indexed passages; ``not_retrievable_fraction`` of (passage, model)
            entries; ``passages_never_indexed``; ``index_bytes``; ``ties_at_rank_10``
            (:meth:`ForestHits.tie_stats`); ``mean_retrieved_per_query``;
            ``mean_postings_scanned_per_query`` (posting entries the counting search read, against
            ``n_passages`` vectors for dense exact search).

        Raises:
            RuntimeError: :meth:`retrieve` has not run yet.
        """
        if self.index is None or self.hits is None:
            raise RuntimeError("balance_stats: call retrieve(store, k) first")
        st = self.index.stats()
        q_ent = class_entropy(self._query_classes, self.forest.n_classes)
        p_ent = np.asarray(st["passage_class_entropy"])
        return {
            "max_entropy_log_c": st["max_entropy"],
            "query_class_entropy_mean": float(q_ent.mean()),
            "query_class_entropy_min": float(q_ent.min()),
            "passage_class_entropy_mean": float(p_ent.mean()),
            "passage_class_entropy_min": float(p_ent.min()),
            "not_retrievable_fraction": st["not_retrievable_fraction"],
            "passages_never_indexed": st["passages_never_indexed"],
            "index_bytes": st["nbytes"],
            "ties_at_rank_10": self.hits.tie_stats(10) if self.hits.ids.shape[1] > 10 else None,
            "mean_retrieved_per_query": float((self.hits.ids >= 0).sum(1).mean()),
            "mean_postings_scanned_per_query": float(self.hits.scanned.mean())
            if self.hits.scanned.size
            else 0.0,
            "diagnostics": self._diagnostics(),
        }

    def _diagnostics(self, max_pairs: int = 5000) -> dict[str, Any] | None:
        """:func:`treerank.forest.diagnostics.forest_diagnostics` on the split's
        (query, relevant passage) pairs (the first ``max_pairs``), or None without labels."""
        st = self._store  # judgments are not Vectors' (training's validation split has none)
        if st is None or not (hasattr(st, "candidates") and hasattr(st, "labels")):
            return None
        from treerank.forest.diagnostics import forest_diagnostics

        cand, lab = np.asarray(st.candidates), np.asarray(st.labels)
        rows, cols = np.nonzero((cand >= 0) & (lab >= int(getattr(st, "relevance_threshold", 1))))
        if not len(rows):
            return None
        pairs = np.stack([rows, cand[rows, cols]], 1)[:max_pairs]
        d = forest_diagnostics(self.forest, np.asarray(st.queries), st.passages, pairs)
        return {k: v for k, v in d.items() if not isinstance(v, list)}


def forest_report(systems: dict[str, ForestSystem]) -> dict[str, Any]:
    """The forest family's part of the evaluation report (``report`` hook of its family entry).

    Args:
        systems: report name -> a :class:`ForestSystem` that has retrieved on the split.

    Returns:
        ``{"stats": {name: balance_stats()}, "markdown": str}``: a table of class balance,
        not-retrievable share, ties and passages retrieved per query.
    """
    stats = {name: s.balance_stats() for name, s in systems.items()}
    md = [
        "### Forest index on this split",
        "",
        "| forest | query class entropy (mean / min, nats) | passage class entropy "
        "(mean / min) | max = log C | not retrievable | ties at rank 10 (count / "
        "count + secondary) | passages retrieved per query | postings scanned per query | "
        "collision rate relevant / random pairs (lift) | vote correlation |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    nan = float("nan")
    for fname, st in stats.items():
        ties = st.get("ties_at_rank_10") or {}
        md.append(
            f"| {fname} | {st['query_class_entropy_mean']:.3f} / "
            f"{st['query_class_entropy_min']:.3f} | {st['passage_class_entropy_mean']:.3f}"
            f" / {st['passage_class_entropy_min']:.3f} | {st['max_entropy_log_c']:.3f} | "
            f"{st['not_retrievable_fraction']:.1%} | {ties.get('count_tie', nan):.0%}"
            f" / {ties.get('secondary_tie', nan):.0%} | "
            f"{st['mean_retrieved_per_query']:.0f} | "
            f"{st['mean_postings_scanned_per_query']:.0f} | "
            + (
                f"{dg['collision_relevant_mean']:.3f} / {dg['collision_random_mean']:.3f} "
                f"({dg['lift_mean']:.1f}x) | {dg['vote_correlation_relevant']:.3f} |"
                if (dg := st.get("diagnostics"))
                else "- | - |"
            )
        )
    return {"stats": stats, "markdown": "\n".join(md)}
