"""Synthetic vectors for benchmarks: a Gaussian mixture fitted to real store vectors.

iid Gaussian vectors in 384 dimensions are nearly orthogonal to each other, so every
approximate-nearest-neighbour index looks useless on them (no cluster structure to exploit) and
every exact method looks slow for nothing. Real sentence embeddings are clustered and highly
anisotropic. This module fits a mixture to a real store's vectors and samples any number of
vectors with the same structure, so that a 1M-passage benchmark can be run from a 5K-passage
store:

1. centre the fitted vectors and rotate them onto their principal axes (PCA by SVD, full rank by
   default, so the rotation loses nothing);
2. fit a diagonal-covariance Gaussian mixture (scikit-learn ``GaussianMixture``) in the rotated
   coordinates: per-component means and per-axis variances, which with the rotation give each
   component an anisotropic shape aligned with the data's global principal axes;
3. sample: pick components by weight, draw ``mean_c + sqrt(var_c) * N(0, 1)`` in the rotated
   space, rotate back, add the global mean and L2-normalise (when the source vectors were unit
   vectors, as every treerank store's are).

Queries and passages are fitted separately (:func:`fit_store`): a model's query and passage
vectors come from different distributions (short questions vs long passages).

:func:`write_synthetic_store` writes the samples as a treerank store split (``queries.bin``,
``passages.bin``, empty candidate tables, ``meta.json`` last), chunk by chunk, so that a
1M x 384 store (1.5 GB) is written with memory bounded by the chunk; every searcher and index
then reads it memory-mapped like a real store. The store has no texts and no relevance labels:
it is for measuring search (recall against exact search, throughput, memory), not retrieval
quality.

Used by ``bench/bench_index.py`` (the ANN Pareto benchmark) and the forest's benchmarks.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from treerank.atomic import atomic_write_json
from treerank.store.format import (
    FORMAT_NAME,
    FORMAT_VERSION,
    INDICES_BIN,
    META_JSON,
    PASSAGES_BIN,
    QUERIES_BIN,
    SELECTED_BIN,
    VECTOR_DTYPE,
)

DEFAULT_COMPONENTS = 64
DEFAULT_MAX_FIT = 50_000
DEFAULT_CHUNK = 65_536
SYNTHETIC_ENCODER = "synthetic-gaussian-mixture"


@dataclass(frozen=True)
class VectorMixture:
    """A diagonal Gaussian mixture in a PCA-rotated space (see the module docstring).

    Attributes:
        center: ``float64 (d,)`` mean of the fitted vectors.
        basis: ``float64 (d, r)`` orthonormal principal axes (columns), ``r <= d``.
        weights: ``float64 (C,)`` component weights, summing to 1.
        means: ``float64 (C, r)`` component means in rotated coordinates.
        variances: ``float64 (C, r)`` per-axis component variances in rotated coordinates.
        normalize: L2-normalise sampled vectors (True when the fitted vectors were unit vectors).
    """

    center: np.ndarray
    basis: np.ndarray
    weights: np.ndarray
    means: np.ndarray
    variances: np.ndarray
    normalize: bool

    @property
    def dim(self) -> int:
        return int(self.center.shape[0])

    @property
    def n_components(self) -> int:
        return int(self.weights.shape[0])

    def digest(self) -> str:
        """Hex SHA-256 of the parameters (identifies what :meth:`sample` draws from)."""
        h = hashlib.sha256()
        for a in (self.center, self.basis, self.weights, self.means, self.variances):
            h.update(np.ascontiguousarray(a, dtype=np.float64).tobytes())
        h.update(b"1" if self.normalize else b"0")
        return h.hexdigest()

    def sample(self, n: int, seed: int | Sequence[int] = 0) -> np.ndarray:
        """Draw ``n`` vectors.

        Args:
            n: number of vectors (>= 0).
            seed: NumPy ``default_rng`` seed (an int or a sequence of ints); the same
                ``(n, seed)`` gives the same array.

        Returns:
            ``float32 (n, d)``; unit rows when ``normalize``.
        """
        if n < 0:
            raise ValueError(f"n must be >= 0, got {n}")
        rng = np.random.default_rng(seed)
        comp = rng.choice(self.n_components, size=n, p=self.weights)
        z = rng.standard_normal((n, self.means.shape[1]))
        z = z * np.sqrt(self.variances[comp]) + self.means[comp]
        x = (z @ self.basis.T + self.center).astype(np.float32)
        if self.normalize:
            x /= np.maximum(np.linalg.norm(x, axis=1, keepdims=True), np.float32(1e-12))
        return x

    def sample_chunks(
        self, n: int, seed: int = 0, chunk_size: int = DEFAULT_CHUNK
    ) -> Iterator[np.ndarray]:
        """Yield ``float32 (<= chunk_size, d)`` blocks totalling ``n`` rows.

        Block ``i`` is ``sample(len, seed=[seed, i])``: the result depends on ``chunk_size``.
        """
        if chunk_size < 1:
            raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
        for i, start in enumerate(range(0, n, chunk_size)):
            yield self.sample(min(chunk_size, n - start), seed=[seed, i])

    def to_dict(self) -> dict[str, Any]:
        return {
            "center": self.center.tolist(),
            "basis": self.basis.tolist(),
            "weights": self.weights.tolist(),
            "means": self.means.tolist(),
            "variances": self.variances.tolist(),
            "normalize": self.normalize,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> VectorMixture:
        return cls(
            center=np.asarray(d["center"], dtype=np.float64),
            basis=np.asarray(d["basis"], dtype=np.float64),
            weights=np.asarray(d["weights"], dtype=np.float64),
            means=np.asarray(d["means"], dtype=np.float64),
            variances=np.asarray(d["variances"], dtype=np.float64),
            normalize=bool(d["normalize"]),
        )


def fit_mixture(
    vectors: np.ndarray,
    n_components: int = DEFAULT_COMPONENTS,
    seed: int = 0,
    max_fit: int = DEFAULT_MAX_FIT,
    rank: int | None = None,
    normalize: bool | None = None,
) -> VectorMixture:
    """Fit a :class:`VectorMixture` to real vectors (a store's ``passages`` or ``queries``).

    Args:
        vectors: ``float32 (n, d)``, an array or memmap; at most ``max_fit`` rows (chosen
            uniformly with ``seed``) are read.
        n_components: mixture components ``C`` (clipped to the rows used).
        seed: seeds the row sample and scikit-learn's k-means initialisation.
        max_fit: rows used for the fit.
        rank: principal axes kept (default ``min(d, rows - 1)``); the rest of the variance is
            dropped, so keep the default unless the fit is too slow.
        normalize: L2-normalise samples; default: whether the fitted rows are unit vectors.

    Returns:
        the fitted mixture.

    Raises:
        ValueError: fewer than 2 rows, a non-2-D input, or non-finite values.
    """
    from sklearn.mixture import GaussianMixture

    v = np.asarray(vectors)
    if v.ndim != 2 or v.shape[0] < 2:
        raise ValueError(f"need a 2-D array of >= 2 vectors to fit, got shape {v.shape}")
    rng = np.random.default_rng(seed)
    rows = np.sort(rng.choice(v.shape[0], size=min(max_fit, v.shape[0]), replace=False))
    x = np.asarray(v[rows], dtype=np.float64)
    if not np.isfinite(x).all():
        raise ValueError("vectors contain NaN or infinity")
    if normalize is None:
        normalize = bool(np.allclose(np.linalg.norm(x, axis=1), 1.0, atol=1e-3))
    center = x.mean(axis=0)
    xc = x - center
    _, _, vt = np.linalg.svd(xc, full_matrices=False)
    r = min(rank or x.shape[1], vt.shape[0])
    basis = vt[:r].T  # (d, r)
    z = xc @ basis
    c = min(n_components, x.shape[0])
    gm = GaussianMixture(
        n_components=c, covariance_type="diag", random_state=seed, reg_covar=1e-6, max_iter=200
    ).fit(z)
    return VectorMixture(
        center=center,
        basis=basis,
        weights=np.asarray(gm.weights_, dtype=np.float64) / float(np.sum(gm.weights_)),
        means=np.asarray(gm.means_, dtype=np.float64),
        variances=np.asarray(gm.covariances_, dtype=np.float64),
        normalize=normalize,
    )


@dataclass(frozen=True)
class StoreMixtures:
    """The two mixtures of a store: one for its queries, one for its passages."""

    queries: VectorMixture
    passages: VectorMixture
    source: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "queries": self.queries.to_dict(),
            "passages": self.passages.to_dict(),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> StoreMixtures:
        return cls(
            queries=VectorMixture.from_dict(d["queries"]),
            passages=VectorMixture.from_dict(d["passages"]),
            source=str(d.get("source", "")),
        )


def fit_store(
    store: Any,
    n_components: int = DEFAULT_COMPONENTS,
    seed: int = 0,
    max_fit: int = DEFAULT_MAX_FIT,
) -> StoreMixtures:
    """Fit query and passage mixtures to an :class:`~treerank.store.EmbeddingStore` split.

    The query mixture gets ``max(1, n_components // 4)`` components when the split has fewer
    than ``20 * n_components`` queries (a few hundred test queries cannot support 64).
    """
    nq = int(store.n_queries)
    q_comp = n_components if nq >= 20 * n_components else max(1, n_components // 4)
    return StoreMixtures(
        queries=fit_mixture(store.queries, q_comp, seed=seed, max_fit=max_fit),
        passages=fit_mixture(store.passages, n_components, seed=seed, max_fit=max_fit),
        source=str(getattr(store, "path", "")),
    )


def _write_rows(path: Path, mixture: VectorMixture, n: int, seed: int, chunk_size: int) -> None:
    with open(path, "wb") as f:
        for block in mixture.sample_chunks(n, seed=seed, chunk_size=chunk_size):
            f.write(np.ascontiguousarray(block, dtype=VECTOR_DTYPE).tobytes())


def write_synthetic_store(
    dest: str | Path,
    mixtures: StoreMixtures,
    n_passages: int,
    n_queries: int,
    seed: int = 0,
    chunk_size: int = DEFAULT_CHUNK,
) -> Path:
    """Write a synthetic store split to ``dest`` (reused when an identical one is there).

    Files: ``queries.bin`` / ``passages.bin`` (float32, written ``chunk_size`` rows at a time),
    empty ``query_indices.bin`` / ``query_is_selected.bin`` (K = 0: no labels), ``meta.json``
    last with ``"synthetic"`` (mixture digests, source store, seed) and an encoder named
    ``synthetic-gaussian-mixture`` whose fingerprint is the digest of the whole recipe. Queries
    use seed ``seed + 1`` so that they are not copies of passages.

    Returns:
        ``dest`` as a Path; open it with ``EmbeddingStore.open``.
    """
    out = Path(dest)
    recipe = {
        "queries": mixtures.queries.digest(),
        "passages": mixtures.passages.digest(),
        "n_passages": int(n_passages),
        "n_queries": int(n_queries),
        "seed": int(seed),
        "chunk_size": int(chunk_size),
    }
    signature = hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()
    meta_path = out / META_JSON
    if meta_path.is_file():
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
        if meta.get("complete") and meta.get("signature") == signature:
            return out
        meta_path.unlink()
    out.mkdir(parents=True, exist_ok=True)
    _write_rows(out / PASSAGES_BIN, mixtures.passages, n_passages, seed, chunk_size)
    _write_rows(out / QUERIES_BIN, mixtures.queries, n_queries, seed + 1, chunk_size)
    (out / INDICES_BIN).write_bytes(b"")
    (out / SELECTED_BIN).write_bytes(b"")
    meta = {
        "format": FORMAT_NAME,
        "format_version": FORMAT_VERSION,
        "complete": True,
        "split": out.name,
        "source": "synthetic",
        "dim": mixtures.passages.dim,
        "k": 0,
        "n_queries": int(n_queries),
        "n_passages": int(n_passages),
        "dtype": "float32",
        "byteorder": "little",
        "index_dtype": "int32",
        "label_dtype": "uint8",
        "normalized": mixtures.passages.normalize,
        "relevance_threshold": 1,
        "encoder": {"name": SYNTHETIC_ENCODER, "fingerprint": "synthetic:" + signature},
        "signature": signature,
        "synthetic": {**recipe, "fitted_on": mixtures.source},
        "created_unix": time.time(),
    }
    atomic_write_json(meta_path, meta)
    return out
