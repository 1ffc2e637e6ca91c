"""Synthetic vectors for benchmarks: a mixture of local low-rank Gaussians fitted to real vectors.

iid Gaussian vectors in 384 dimensions are nearly orthogonal to each other, so every
approximate-nearest-neighbour index looks useless on them, and a mixture of a few broad Gaussians
is not much better: real sentence embeddings have a low *local* intrinsic dimension (each
passage has close neighbours; all-MiniLM-L6-v2 SQuAD paragraphs have a nearest neighbour at
cosine 0.69) although their global spectrum is flat (64 principal axes hold only 60% of the
variance). The model here is a mixture of probabilistic PCA (Tipping & Bishop, "Mixtures of
probabilistic principal component analysers", Neural Computation 1999) inside a global PCA
subspace:

1. centre the fitted vectors and keep their top ``r`` principal axes (PCA by SVD; default
   ``r = 256`` holds 97% of the variance of MiniLM SQuAD passages); the variance outside them,
   per dimension, is the *residual variance*;
2. cluster the subspace coordinates with k-means (``faiss.Kmeans``; about 20 fitted rows per
   component by default, at most 1,024 components) and fit each cluster's PPCA by its
   maximum-likelihood closed form: the top ``q`` (default 8) principal axes of the cluster,
   scaled by ``sqrt(lambda_j - sigma^2)``, plus isotropic noise ``sigma^2`` = the mean of the
   cluster's remaining eigenvalues in the subspace (a hard-assignment fit of the mixture,
   i.e. one k-means E/M pass instead of soft EM);
3. sample: pick a component by weight (its share of the fitted rows), draw
   ``mean_c + W_c y + sigma_c e`` (``y ~ N(0, I_q)``, ``e ~ N(0, I_r)``) in the subspace, map
   it back, add isotropic noise of the residual variance in the orthogonal complement, add the
   global mean and L2-normalise (when the source vectors were unit vectors, as every treerank
   store's are).

Queries and passages are fitted separately (:func:`fit_store`): a model's query and passage
vectors come from different distributions (short questions vs long passages). The realism of
the defaults is measured by ``bench/bench_synthetic.py`` (results in
``bench/results/index/realism/``): at equal size, HNSW / IVF recall and passage neighbourhood
cosines of synthetic vectors fitted to SQuAD match the real ones; synthetic queries sit further
from their nearest passages than real questions do (the query and passage mixtures are
independent, so no synthetic query is "about" a synthetic passage).

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
from treerank.kernels.vectors import ROW_CHUNK
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
from treerank.storelike import StoreLike

DEFAULT_RANK = 256
DEFAULT_LOCAL_RANK = 8
ROWS_PER_COMPONENT = 20
MAX_COMPONENTS = 1024
DEFAULT_MAX_FIT = 50_000
DEFAULT_CHUNK = ROW_CHUNK
KMEANS_ITERATIONS = 20
SYNTHETIC_ENCODER = "synthetic-gaussian-mixture"
_LOADING_BLOCK = 4096


def default_components(rows: int) -> int:
    """Components for ``rows`` fitted rows: ``rows // 20``, clipped to ``[1, 1024]``."""
    return int(min(MAX_COMPONENTS, max(1, rows // ROWS_PER_COMPONENT)))


@dataclass(frozen=True)
class VectorMixture:
    """A mixture of probabilistic PCA in a PCA subspace, plus residual noise (module docstring).

    A sample is ``normalise(center + basis @ z + e)`` with component ``c ~ weights``,
    ``z = means[c] + loadings[c] @ y + sqrt(noise[c]) * u`` (``y ~ N(0, I_q)``,
    ``u ~ N(0, I_r)``) and ``e ~ N(0, residual_variance * I_d)`` projected onto the orthogonal
    complement of ``basis``. Component ``c``'s covariance in the subspace is
    ``loadings[c] @ loadings[c].T + noise[c] * I_r`` (:meth:`covariances`).

    Attributes:
        center: ``float64 (d,)`` mean of the fitted vectors.
        basis: ``float64 (d, r)`` orthonormal principal axes (columns), ``r <= d``.
        weights: ``float64 (C,)`` component weights, summing to 1.
        means: ``float64 (C, r)`` component means in subspace coordinates.
        loadings: ``float64 (C, r, q)`` PPCA loading matrices ``W_c``.
        noise: ``float64 (C,)`` isotropic within-subspace variance ``sigma_c^2`` per component.
        residual_variance: per-dimension variance of the fitted vectors outside the subspace
            (total variance minus the ``r`` kept principal variances, over ``d - r``; 0 when
            ``r = d``).
        normalize: L2-normalise sampled vectors (True when the fitted vectors were unit vectors).
    """

    center: np.ndarray
    basis: np.ndarray
    weights: np.ndarray
    means: np.ndarray
    loadings: np.ndarray
    noise: np.ndarray
    residual_variance: float
    normalize: bool

    @property
    def dim(self) -> int:
        return int(self.center.shape[0])

    @property
    def rank(self) -> int:
        """Subspace dimension ``r``."""
        return int(self.basis.shape[1])

    @property
    def local_rank(self) -> int:
        """PPCA factors per component ``q``."""
        return int(self.loadings.shape[2])

    @property
    def n_components(self) -> int:
        return int(self.weights.shape[0])

    def covariances(self) -> np.ndarray:
        """``float64 (C, r, r)``: each component's covariance in subspace coordinates."""
        eye = np.eye(self.rank)
        return self.loadings @ self.loadings.transpose(0, 2, 1) + self.noise[:, None, None] * eye

    def digest(self) -> str:
        """Hex SHA-256 of the parameters (identifies what :meth:`sample` draws from)."""
        h = hashlib.sha256()
        for a in (self.center, self.basis, self.weights, self.means, self.loadings, self.noise):
            h.update(np.ascontiguousarray(a, dtype=np.float64).tobytes())
        h.update(np.float64(self.residual_variance).tobytes())
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

        Raises:
            ValueError: ``n < 0``.
        """
        if n < 0:
            raise ValueError(f"n must be >= 0, got {n}")
        rng = np.random.default_rng(seed)
        comp = rng.choice(self.n_components, size=n, p=self.weights)
        y = rng.standard_normal((n, self.local_rank))
        u = rng.standard_normal((n, self.rank))
        z = self.means[comp] + u * np.sqrt(self.noise[comp])[:, None]
        for s in range(0, n, _LOADING_BLOCK):  # (block, r, q) gathered loadings at a time
            e = s + _LOADING_BLOCK
            z[s:e] += np.einsum("nrq,nq->nr", self.loadings[comp[s:e]], y[s:e])
        x = z @ self.basis.T + self.center
        if self.residual_variance > 0 and self.rank < self.dim:
            e = rng.standard_normal((n, self.dim)) * np.sqrt(self.residual_variance)
            x += e - (e @ self.basis) @ self.basis.T
        out = x.astype(np.float32)
        if self.normalize:
            out /= np.maximum(np.linalg.norm(out, axis=1, keepdims=True), np.float32(1e-12))
        return out

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
            "loadings": self.loadings.tolist(),
            "noise": self.noise.tolist(),
            "residual_variance": float(self.residual_variance),
            "normalize": self.normalize,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> VectorMixture:
        return cls(
            center=np.asarray(d["center"], dtype=np.float64),
            basis=np.asarray(d["basis"], dtype=np.float64),
            weights=np.asarray(d["weights"], dtype=np.float64),
            means=np.asarray(d["means"], dtype=np.float64),
            loadings=np.asarray(d["loadings"], dtype=np.float64),
            noise=np.asarray(d["noise"], dtype=np.float64),
            residual_variance=float(d["residual_variance"]),
            normalize=bool(d["normalize"]),
        )


def _ppca(z: np.ndarray, q: int) -> tuple[np.ndarray, np.ndarray, float]:
    """Maximum-likelihood PPCA of rows ``z (m, r)``: ``(mean (r,), W (r, q), sigma^2)``.

    Tipping & Bishop (1999), eq. 7-8: ``sigma^2`` is the mean of the ``r - q`` smallest
    eigenvalues of the sample covariance (zeros included when ``m <= r``) and
    ``W = U_q (Lambda_q - sigma^2 I)^(1/2)``. With ``m - 1 < q`` the missing factors are 0.
    """
    r = z.shape[1]
    mean = z.mean(axis=0)
    _, sv, vt = np.linalg.svd(z - mean, full_matrices=False)
    lam = np.zeros(r)
    lam[: sv.shape[0]] = sv**2 / z.shape[0]
    sigma2 = float(lam[q:].mean()) if q < r else 0.0
    k = min(q, sv.shape[0])
    w = np.zeros((r, q))
    w[:, :k] = vt[:k].T * np.sqrt(np.maximum(lam[:k] - sigma2, 0.0))
    return mean, w, sigma2


def fit_mixture(
    vectors: np.ndarray,
    n_components: int | None = None,
    seed: int = 0,
    max_fit: int = DEFAULT_MAX_FIT,
    rank: int | None = DEFAULT_RANK,
    normalize: bool | None = None,
    local_rank: int = DEFAULT_LOCAL_RANK,
) -> VectorMixture:
    """Fit a :class:`VectorMixture` to real vectors (a store's ``passages`` or ``queries``).

    Args:
        vectors: ``float32 (n, d)``, an array or memmap; at most ``max_fit`` rows (chosen
            uniformly with ``seed``) are read.
        n_components: mixture components ``C``; default :func:`default_components` of the rows
            used (about 20 rows each); clipped to the rows used. Components that k-means leaves
            empty are dropped.
        seed: seeds the row sample and the k-means initialisation.
        max_fit: rows used for the fit.
        rank: global principal axes kept, ``r`` (clipped to ``min(d, rows - 1)``; ``None``:
            all); the variance outside them becomes isotropic residual noise.
        normalize: L2-normalise samples; default: whether the fitted rows are unit vectors.
        local_rank: PPCA factors per component ``q`` (clipped to ``r``).

    Returns:
        the fitted mixture.

    Raises:
        ValueError: fewer than 2 rows, a non-2-D input, non-finite values, ``rank``,
            ``n_components`` or ``local_rank`` < 1.
    """
    import faiss

    for name, value in (("rank", rank), ("n_components", n_components), ("local_rank", local_rank)):
        if value is not None and value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
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
    m, d = x.shape
    center = x.mean(axis=0)
    xc = x - center
    _, sv, vt = np.linalg.svd(xc, full_matrices=False)
    r = min(rank or d, vt.shape[0])
    basis = vt[:r].T  # (d, r)
    z = xc @ basis
    total, kept = float(np.sum(sv**2)) / m, float(np.sum(sv[:r] ** 2)) / m
    residual = max(total - kept, 0.0) / (d - r) if r < d else 0.0
    c = min(n_components or default_components(m), m)
    q = min(local_rank, r)
    zf = np.ascontiguousarray(z, dtype=np.float32)
    if c > 1:
        km = faiss.Kmeans(
            r,
            c,
            niter=KMEANS_ITERATIONS,
            seed=seed,
            min_points_per_centroid=1,
            max_points_per_centroid=m,
        )
        km.train(zf)
        labels = km.index.search(zf, 1)[1][:, 0]
    else:
        labels = np.zeros(m, dtype=np.int64)
    counts = np.bincount(labels, minlength=c)
    kept_components = np.flatnonzero(counts)
    fits = [_ppca(z[labels == k], q) for k in kept_components]
    return VectorMixture(
        center=center,
        basis=basis,
        weights=counts[kept_components] / float(m),
        means=np.stack([f[0] for f in fits]),
        loadings=np.stack([f[1] for f in fits]),
        noise=np.array([f[2] for f in fits]),
        residual_variance=residual,
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
    store: StoreLike,
    n_components: int | None = None,
    seed: int = 0,
    max_fit: int = DEFAULT_MAX_FIT,
    rank: int | None = DEFAULT_RANK,
    local_rank: int = DEFAULT_LOCAL_RANK,
) -> StoreMixtures:
    """Fit query and passage mixtures to an :class:`~treerank.store.EmbeddingStore` split.

    Each side gets ``n_components`` components, or by default about one per 20 of its fitted
    rows (:func:`default_components`), so a few hundred test queries get a few components.
    """

    def fit(vectors: np.ndarray) -> VectorMixture:
        return fit_mixture(
            vectors, n_components, seed=seed, max_fit=max_fit, rank=rank, local_rank=local_rank
        )

    return StoreMixtures(
        queries=fit(store.queries),
        passages=fit(store.passages),
        source=str(store.path),
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
