"""Compiled match-counting kernel of the forest search: sparse counts, top-k over touched passages.

The forest's score of passage ``p`` for query ``q`` is the number of models whose classes agree
(TreeRank seed): the query's ``M`` inverted lists (one per model, the list of its class) are
walked and every passage id met is counted. Only the ``~M * n / C`` posting entries of those
lists are read, so the work per query is independent of the collection size ``n`` up to the list
lengths. numpy/scipy cannot keep this sparse end to end: a sparse x sparse product returns a
``(B, n)`` matrix whose top-k needs a partition over every passage (``O(n)`` per query, the
reason the scipy path was slower than dense exact search). This kernel (numba, compiled once and
cached on disk) walks the query's ``M`` ascending lists together, one block of ``block``
passage ids at a time, so that its per-thread counters stay in cache (random increments over a
1M-entry array are memory-latency bound: ~1.5x dense exact search; blocked, many times that);
it records the touched passages of the block, offers each to a bounded heap of the top ``k``
(``O(T log k)`` for ``T`` touched passages) and resets only what it touched.

Order (identical to the brute-force definition, ties included): match count descending, then the
secondary score ``sum over matching models of P_m(c | q) * P_m(c | p)`` descending (accumulated
in float64 in model order), then passage id ascending. The two keys are compared as the single
float64 ``count + secondary / (M + 1)``.
"""

from __future__ import annotations

import numba
import numpy as np

ID_BLOCK = 16384
"""Default passage ids per accumulation block: int32 count + float64 secondary + int64 touched
id per id, 320 KiB, resident in a core's L2 cache."""


@numba.njit(cache=True, inline="always")
def _better(key_a: float, id_a: int, key_b: float, id_b: int) -> bool:
    """``a`` ranks before ``b``: higher key, or equal key and smaller id."""
    return key_a > key_b or (key_a == key_b and id_a < id_b)


@numba.njit(cache=True, inline="always")
def _swap(keys: np.ndarray, ids: np.ndarray, cnt: np.ndarray, sec: np.ndarray, i: int, j: int):
    keys[i], keys[j] = keys[j], keys[i]
    ids[i], ids[j] = ids[j], ids[i]
    cnt[i], cnt[j] = cnt[j], cnt[i]
    sec[i], sec[j] = sec[j], sec[i]


@numba.njit(cache=True)
def _sift_down(
    keys: np.ndarray, ids: np.ndarray, cnt: np.ndarray, sec: np.ndarray, size: int, i: int
) -> None:
    """Restore the heap (root = worst kept candidate) below position ``i``."""
    while True:
        worst = i
        left = 2 * i + 1
        right = left + 1
        if left < size and _better(keys[worst], ids[worst], keys[left], ids[left]):
            worst = left
        if right < size and _better(keys[worst], ids[worst], keys[right], ids[right]):
            worst = right
        if worst == i:
            return
        _swap(keys, ids, cnt, sec, i, worst)
        i = worst


@numba.njit(cache=True)
def _sift_up(keys: np.ndarray, ids: np.ndarray, cnt: np.ndarray, sec: np.ndarray, i: int) -> None:
    while i > 0:
        parent = (i - 1) // 2
        if not _better(keys[parent], ids[parent], keys[i], ids[i]):
            return
        _swap(keys, ids, cnt, sec, i, parent)
        i = parent


@numba.njit(parallel=True, cache=True, nogil=True)
def count_topk(
    offsets: np.ndarray,
    ids: np.ndarray,
    probs: np.ndarray,
    query_lists: np.ndarray,
    list_weights: np.ndarray,
    probe: int,
    n_passages: int,
    k: int,
    count_on: bool,
    use_passage_prob: bool,
    divisor: float,
    n_threads: int,
    block: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Top ``k`` passages of every query over ``t`` probed lists per model, a passage counted at
    most once per model: the one counting kernel of the forest search.

    The query's lists are model-major: ``query_lists[b, m * t + j]`` is model ``m``'s ``j``-th
    probed list (``j = 0`` its most probable class). A passage met in several of one model's
    probed lists (multi-assignment) counts once, with the weight of the first (most probable)
    of them. Per passage: ``count`` = models that matched, ``secondary = sum over matched
    models of w * (P_m(c|p) if use_passage_prob else 1)`` (float64, model order), and the key

        ``key = (count if count_on else 0) + secondary / divisor``,

    ranked by key descending, then id ascending (the scorings of
    :data:`treerank.forest.model.SCORINGS` are choices of ``w``, ``count_on``,
    ``use_passage_prob`` and ``divisor``; ``divisor = inf`` ranks by count alone).

    The seed's rule is ``t = 1``, ``w = P_m(c | q)``, ``count_on``, ``use_passage_prob`` and
    ``divisor = M + 1`` (the module docstring's order); with ``t = 1`` a passage is met at most
    once per model (each id at most once per list), so its fast path (any ``t = 1`` weighted by
    ``P_m(c | p)``) walks the lists without the once-per-model mark or a branch per posting.
    Every path adds the same float64 terms in the same order.

    Args:
        offsets: ``int64 (L + 1,)`` CSR offsets of the ``L = M * C`` inverted lists.
        ids: ``int32 (nnz,)`` passage ids of the lists, ascending inside every list (each id at
            most once per list).
        probs: ``float32 (nnz,)`` passage probabilities ``P_m(c | p)`` of the postings.
        query_lists: ``int64 (B, M * t)`` list ids (``m * C + c``).
        list_weights: ``float64 (B, M * t)`` the weight ``w`` of each list.
        probe: ``t >= 1`` (divides the lists per query).
        n_passages: ``n``, ids lie in ``[0, n)``.
        k: depth (``>= 1``).
        count_on / use_passage_prob / divisor: the key above.
        n_threads: parallel slots (queries are dealt round-robin). Results do not depend on it.
        block: passage ids per accumulation block (:data:`ID_BLOCK`; each slot owns ``20 *
            block`` bytes of scratch, ``28 * block`` with ``t > 1``). Results do not depend on
            it.

    Returns:
        ``(ids int64 (B, k), keys float64 (B, k), counts int32 (B, k), secondary float64 (B, k),
        scanned int64 (B,))``: ranked hits padded with ``-1`` / ``-inf`` / ``0`` / ``0.0`` past
        the passages with at least one match; ``scanned`` = posting entries read per query.
    """
    n_q, n_lists = query_lists.shape
    out_ids = np.full((n_q, k), -1, dtype=np.int64)
    out_keys = np.full((n_q, k), -np.inf, dtype=np.float64)
    out_counts = np.zeros((n_q, k), dtype=np.int32)
    out_sec = np.zeros((n_q, k), dtype=np.float64)
    scanned = np.zeros(n_q, dtype=np.int64)
    if n_q == 0:
        return out_ids, out_keys, out_counts, out_sec, scanned
    n_slots = max(1, min(n_threads, n_q))
    block = max(1, min(block, n_passages))
    once_per_list = probe == 1  # a passage is met at most once per model: no mark needed
    seed_rule = once_per_list and use_passage_prob  # (with count_on, divisor M + 1: the seed)
    for slot in numba.prange(n_slots):
        counts = np.zeros(block, dtype=np.int32)
        sec = np.zeros(block, dtype=np.float64)
        # the once-per-model mark: only with several probed lists per model
        last = np.full(1 if once_per_list else block, -1, dtype=np.int64)
        touched = np.empty(block, dtype=np.int64)
        cursor = np.empty(n_lists, dtype=np.int64)
        h_key = np.empty(k, dtype=np.float64)
        h_id = np.empty(k, dtype=np.int64)
        h_cnt = np.empty(k, dtype=np.int32)
        h_sec = np.empty(k, dtype=np.float64)
        for b in range(slot, n_q, n_slots):
            n_read = 0
            for j in range(n_lists):
                lst = query_lists[b, j]
                cursor[j] = offsets[lst]
                n_read += offsets[lst + 1] - offsets[lst]
            scanned[b] = n_read
            size = 0
            for lo in range(0, n_passages, block):
                hi = lo + block
                n_touched = 0
                # Lists in model-major order: the float64 secondary sums in model order.
                if seed_rule:  # the fast path: each id once per list, so once per model
                    for j in range(n_lists):
                        stop = offsets[query_lists[b, j] + 1]
                        w = list_weights[b, j]
                        i = cursor[j]
                        while i < stop and ids[i] < hi:
                            p = ids[i] - lo
                            if counts[p] == 0:
                                touched[n_touched] = p
                                n_touched += 1
                            counts[p] += 1
                            sec[p] += w * np.float64(probs[i])
                            i += 1
                        cursor[j] = i
                else:
                    for j in range(n_lists):
                        m = j // probe
                        stop = offsets[query_lists[b, j] + 1]
                        w = list_weights[b, j]
                        i = cursor[j]
                        while i < stop and ids[i] < hi:
                            p = ids[i] - lo
                            if once_per_list or last[p] != m:
                                if counts[p] == 0:
                                    touched[n_touched] = p
                                    n_touched += 1
                                if not once_per_list:
                                    last[p] = m
                                counts[p] += 1
                                if use_passage_prob:
                                    sec[p] += w * np.float64(probs[i])
                                else:
                                    sec[p] += w
                            i += 1
                        cursor[j] = i
                for tt in range(n_touched):
                    p = touched[tt]
                    key = sec[p] / divisor
                    if count_on:
                        key = np.float64(counts[p]) + key
                    pid = lo + p
                    if size < k:
                        h_key[size] = key
                        h_id[size] = pid
                        h_cnt[size] = counts[p]
                        h_sec[size] = sec[p]
                        _sift_up(h_key, h_id, h_cnt, h_sec, size)
                        size += 1
                    elif _better(key, pid, h_key[0], h_id[0]):
                        h_key[0] = key
                        h_id[0] = pid
                        h_cnt[0] = counts[p]
                        h_sec[0] = sec[p]
                        _sift_down(h_key, h_id, h_cnt, h_sec, size, 0)
                    counts[p] = 0
                    sec[p] = 0.0
                    if not once_per_list:
                        last[p] = -1
            # Pop the worst first into the last free rank.
            for r in range(size - 1, -1, -1):
                out_ids[b, r] = h_id[0]
                out_keys[b, r] = h_key[0]
                out_counts[b, r] = h_cnt[0]
                out_sec[b, r] = h_sec[0]
                _swap(h_key, h_id, h_cnt, h_sec, 0, r)
                _sift_down(h_key, h_id, h_cnt, h_sec, r, 0)
    return out_ids, out_keys, out_counts, out_sec, scanned
