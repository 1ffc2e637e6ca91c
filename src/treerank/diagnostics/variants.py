"""Scoring variants of one trained DRT checkpoint (step 1 of the DRT seed's diagnostics).

No retraining: each variant re-scores the same slots differently, and every variant is an inner
product of a query vector and a passage vector, so each one is evaluated with the same full-split
exact search and metrics as any model. A registry of named variants (one table, no if-chains):

=====================  =========================================================
name                   score(q, p)
=====================  =========================================================
``learned``            ``sum_i alpha_i(q) q_i . p_i`` (the model itself)
``uniform``            ``(1/k) sum_i q_i . p_i`` (did the attention learn?)
``concat-cosine``      ``cos(concat_i q_i, concat_i p_i)`` (is scoring the bottleneck?)
``concat-raw-cosine``  cosine of the concatenated slots *before* L2-normalisation
``top2``               ``alpha`` kept on each query's two largest slots, renormalised
``slot-<i>``           ``q_i . p_i`` (what one slot carries alone)
=====================  =========================================================

Note: slots are unit vectors, so ``||concat_i q_i|| = sqrt(k)`` and ``concat-cosine`` equals
``uniform`` exactly; the seed's two rules ("concat-cosine == full DRT" and "learned == uniform")
therefore read the same number here. ``concat-raw-cosine`` is the variant that tests the
representation without the per-slot normalisation.

Kernels are plain functions on ``(n, k, d_s)`` slot arrays; :func:`evaluate_variants` runs them
over a store with exact search (passages streamed through the decomposition once, kept as raw
slots; each variant transforms chunks of them).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from treerank.kernels.device import DEFAULT_DEVICE, Device
from treerank.kernels.topk import RUN_DEPTH
from treerank.kernels.vectors import ROW_CHUNK
from treerank.metrics.metrics import DEFAULT_METRICS
from treerank.storelike import StoreLike

EPS = 1e-12  # as torch.nn.functional.normalize


def l2_normalize(x: np.ndarray, axis: int = -1) -> np.ndarray:
    """``x / max(||x||, 1e-12)`` along ``axis`` (torch ``F.normalize`` semantics), float32."""
    x = np.asarray(x, dtype=np.float32)
    n = np.linalg.norm(x, axis=axis, keepdims=True)
    return (x / np.maximum(n, EPS)).astype(np.float32, copy=False)


def _flat(s: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(s.reshape(s.shape[0], -1), dtype=np.float32)


# --------------------------------------------------------------------------- query kernels
# Each takes (slots (n,k,d_s) unit, alpha (n,k), raw (n,k,d_s)) and returns float32 (n, D).


def _q_learned(slots: np.ndarray, alpha: np.ndarray, raw: np.ndarray) -> np.ndarray:
    return _flat(alpha[:, :, None] * slots)


def _q_uniform(slots: np.ndarray, alpha: np.ndarray, raw: np.ndarray) -> np.ndarray:
    return _flat(slots / slots.shape[1])


def _q_concat(slots: np.ndarray, alpha: np.ndarray, raw: np.ndarray) -> np.ndarray:
    return l2_normalize(_flat(slots))


def _q_concat_raw(slots: np.ndarray, alpha: np.ndarray, raw: np.ndarray) -> np.ndarray:
    return l2_normalize(_flat(raw))


def top_m_alpha(alpha: np.ndarray, m: int = 2) -> np.ndarray:
    """``alpha`` kept on each row's ``m`` largest entries (ties -> lower slot index), renormalised.

    Args:
        alpha: ``float (n, k)`` non-negative slot weights.
    Returns:
        ``float32 (n, k)`` with ``min(m, k)`` non-zeros per row summing to 1.
    """
    alpha = np.asarray(alpha, dtype=np.float32)
    m = min(m, alpha.shape[1])
    order = np.argsort(-alpha, axis=1, kind="stable")[:, :m]
    keep = np.zeros_like(alpha, dtype=bool)
    np.put_along_axis(keep, order, True, axis=1)
    a = np.where(keep, alpha, 0.0).astype(np.float32)
    return a / np.maximum(a.sum(axis=1, keepdims=True), EPS)


def _q_top2(slots: np.ndarray, alpha: np.ndarray, raw: np.ndarray) -> np.ndarray:
    return _flat(top_m_alpha(alpha, 2)[:, :, None] * slots)


def _q_slot(i: int) -> Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]:
    def fn(slots: np.ndarray, alpha: np.ndarray, raw: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(slots[:, i], dtype=np.float32)

    return fn


# --------------------------------------------------------------------------- passage kernels
# Each takes (slots (n,k,d_s) unit, raw (n,k,d_s)) and returns float32 (n, D).


def _p_concat_slots(slots: np.ndarray, raw: np.ndarray) -> np.ndarray:
    return _flat(slots)


def _p_concat_cos(slots: np.ndarray, raw: np.ndarray) -> np.ndarray:
    return l2_normalize(_flat(slots))


def _p_concat_raw(slots: np.ndarray, raw: np.ndarray) -> np.ndarray:
    return l2_normalize(_flat(raw))


def _p_slot(i: int) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
    def fn(slots: np.ndarray, raw: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(slots[:, i], dtype=np.float32)

    return fn


@dataclass(frozen=True)
class Variant:
    """A named scoring variant: query and passage kernels whose inner product is its score."""

    name: str
    description: str
    query: Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]
    passage: Callable[[np.ndarray, np.ndarray], np.ndarray]

    def query_vectors(
        self, slots: np.ndarray, alpha: np.ndarray, raw: np.ndarray | None = None
    ) -> np.ndarray:
        """``(n, k, d_s)`` unit slots, ``(n, k)`` alpha[, raw slots] -> ``float32 (n, D)``."""
        return self.query(slots, alpha, slots if raw is None else raw)

    def passage_vectors(self, slots: np.ndarray, raw: np.ndarray | None = None) -> np.ndarray:
        """``(n, k, d_s)`` unit slots[, raw slots] -> ``float32 (n, D)``."""
        return self.passage(slots, slots if raw is None else raw)


VARIANTS: dict[str, Variant] = {
    v.name: v
    for v in (
        Variant(
            "learned",
            "learned alpha: sum_i alpha_i(q) q_i.p_i (the model)",
            _q_learned,
            _p_concat_slots,
        ),
        Variant("uniform", "uniform alpha = 1/k", _q_uniform, _p_concat_slots),
        Variant("concat-cosine", "cosine of the concatenated unit slots", _q_concat, _p_concat_cos),
        Variant(
            "concat-raw-cosine",
            "cosine of the concatenated slots before per-slot L2 normalisation",
            _q_concat_raw,
            _p_concat_raw,
        ),
        Variant(
            "top2",
            "alpha kept on the 2 largest slots per query, renormalised",
            _q_top2,
            _p_concat_slots,
        ),
    )
}
_SLOT = re.compile(r"^slot-(\d+)$")


def get_variant(name: str, k: int | None = None) -> Variant:
    """The variant called ``name`` (``slot-<i>`` for single slots).

    Raises:
        KeyError: unknown name, or a slot index ``>= k`` (the message lists the known names).
    """
    if name in VARIANTS:
        return VARIANTS[name]
    m = _SLOT.match(name)
    if m and (k is None or int(m.group(1)) < k):
        i = int(m.group(1))
        return Variant(name, f"slot {i} alone: q_{i}.p_{i}", _q_slot(i), _p_slot(i))
    known = ", ".join([*VARIANTS, "slot-<i>" if k is None else f"slot-0..slot-{k - 1}"])
    raise KeyError(f"unknown DRT scoring variant {name!r}; known: {known}")


def default_variant_names(k: int) -> list[str]:
    """The seed's variant set for ``k`` slots: every registry entry plus each single slot."""
    return [*VARIANTS, *(f"slot-{i}" for i in range(k))]


# --------------------------------------------------------------------------- evaluation


def evaluate_variants(
    model: Any,
    store: StoreLike,
    *,
    names: Sequence[str] | None = None,
    k: int = RUN_DEPTH,
    metrics: Sequence[str] = DEFAULT_METRICS,
    qrels: Any = None,
    chunk_size: int = ROW_CHUNK,
    progress: bool = False,
    device: Device = DEFAULT_DEVICE,
) -> dict[str, Any]:
    """Evaluate scoring variants of a DRT head on every query of ``store`` against all its passages.

    Args:
        model: a :class:`~treerank.models.drt.DRTHead`.
        store: an :class:`~treerank.store.EmbeddingStore` (its queries, passages, qrels).
        names: variants to run (default :func:`default_variant_names`).
        k: depth of each run (1000 for Recall@1000).
        metrics: metric names understood by :func:`treerank.metrics.metrics.evaluate_run`.
        qrels: optional prebuilt :class:`~treerank.metrics.qrels.Qrels` (default from the store).
        chunk_size: passages per search block.
        progress: tqdm bars of the searches.

    Memory: the raw passage slots are held in RAM (``n_passages * k * d_s * 4`` bytes, 8 MB for
    SciFact's 5,183 passages at ``k * d_s = 384``), so the decomposition runs once for all variants.

    Returns:
        ``{"variants": {name: {"description", "mean": {metric: float}, "n_evaluated"}},
        "per_query": {name: {metric: float64 (nq,)}}, "k", "metrics"}``; per-query arrays stay
        NumPy (the report serialises them).
    """
    from treerank.kernels.topk import exact_search
    from treerank.metrics.metrics import evaluate_run
    from treerank.metrics.qrels import Qrels

    n_slots, d_s = model.config.k, model.config.slot_dim
    names = list(names) if names is not None else default_variant_names(n_slots)
    variants = [get_variant(n, n_slots) for n in names]
    qrels = qrels if qrels is not None else Qrels.from_store(store)

    qx = np.asarray(store.queries, dtype=np.float32)
    q_raw = model.query_raw_slots(qx)
    q_slots = l2_normalize(q_raw)
    alpha = model.query_alpha(qx)

    # One decomposition pass over the passages; variants then transform chunks of raw slots.
    p_raw = np.empty((store.n_passages, n_slots * d_s), dtype=np.float32)
    for start, block in store.iter_passage_chunks(chunk_size):
        p_raw[start : start + block.shape[0]] = model.passage_raw_slots(block).reshape(
            block.shape[0], -1
        )

    out: dict[str, Any] = {"k": k, "metrics": list(metrics), "variants": {}, "per_query": {}}
    for v in variants:

        def transform(chunk: np.ndarray, v: Variant = v) -> np.ndarray:
            raw = chunk.reshape(chunk.shape[0], n_slots, d_s)
            return v.passage_vectors(l2_normalize(raw), raw)

        qv = v.query_vectors(q_slots, alpha, q_raw)
        ids, _ = exact_search(
            qv,
            p_raw,
            k=k,
            chunk_size=chunk_size,
            passage_transform=transform,
            progress=progress,
            device=device,
        )
        res = evaluate_run(ids, qrels, metrics=tuple(metrics))
        out["variants"][v.name] = {
            "description": v.description,
            "mean": {m: float(res.mean[m]) for m in metrics},
            "n_evaluated": int(res.n_evaluated),
        }
        out["per_query"][v.name] = {
            m: np.asarray(res.per_query[m], dtype=np.float64) for m in metrics
        }
    out["alpha"] = {
        "mean": alpha.mean(axis=0).tolist(),
        "argmax_share": np.bincount(alpha.argmax(axis=1), minlength=n_slots).astype(float).tolist(),
        "entropy_mean": float(np.mean(-np.sum(alpha * np.log(np.maximum(alpha, EPS)), axis=1))),
        "entropy_max": float(np.log(n_slots)),
    }
    nq = max(alpha.shape[0], 1)
    out["alpha"]["argmax_share"] = [c / nq for c in out["alpha"]["argmax_share"]]
    return out
