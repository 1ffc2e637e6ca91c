"""The synthetic-vector generator: a mixture of probabilistic PCA recovers the statistics it was
fitted to, keeps the structure of the real SciFact vectors that iid Gaussian vectors lack, is
deterministic by seed, and writes a store that opens like a real one."""

from __future__ import annotations

import numpy as np
import pytest

from treerank.store import EmbeddingStore
from treerank.store.synthetic import (
    StoreMixtures,
    VectorMixture,
    _ppca,
    default_components,
    fit_mixture,
    fit_store,
    write_synthetic_store,
)


def _mean_pairwise_cosine(x: np.ndarray) -> float:
    x = x / np.linalg.norm(x, axis=1, keepdims=True)
    s = x @ x.T
    n = len(x)
    return float((s.sum() - np.trace(s)) / (n * (n - 1)))


def _top_variance_share(x: np.ndarray, k: int = 10) -> float:
    ev = np.linalg.svd(x - x.mean(axis=0), compute_uv=False) ** 2
    return float(ev[:k].sum() / ev.sum())


def _nearest_cosine(x: np.ndarray) -> float:
    """Mean cosine of each row's nearest other row."""
    x = x / np.linalg.norm(x, axis=1, keepdims=True)
    s = x @ x.T
    np.fill_diagonal(s, -np.inf)
    return float(s.max(axis=1).mean())


def test_ppca_closed_form_on_a_hand_fixture() -> None:
    # Four points (+-a, 0, 0), (0, +-b, 0): mean 0, covariance diag(a^2/2, b^2/2, 0).
    # Tipping & Bishop's ML fit with q = 1: sigma^2 = mean(b^2/2, 0) = b^2/4 and
    # W = e1 * sqrt(a^2/2 - b^2/4).
    a, b = 4.0, 2.0
    z = np.array([[a, 0, 0], [-a, 0, 0], [0, b, 0], [0, -b, 0]])
    mean, w, sigma2 = _ppca(z, 1)
    np.testing.assert_allclose(mean, 0.0, atol=1e-12)
    assert sigma2 == pytest.approx(b**2 / 4)
    np.testing.assert_allclose(np.abs(w[:, 0]), [np.sqrt(a**2 / 2 - b**2 / 4), 0, 0], atol=1e-12)
    # Fewer rows than factors: the missing factors are zero, sigma^2 = 0 when q >= rank.
    mean, w, sigma2 = _ppca(z[:2], 3)
    assert w.shape == (3, 3) and sigma2 == 0.0
    np.testing.assert_allclose(np.abs(w[:, 0]), [a, 0, 0], atol=1e-12)
    np.testing.assert_allclose(w[:, 1:], 0.0)


def _known_mixture() -> VectorMixture:
    """Three well-separated components in a 4-D subspace of R^10, q = 2, residual noise."""
    rng = np.random.default_rng(0)
    d, r, q = 10, 4, 2
    basis = np.linalg.qr(rng.standard_normal((d, r)))[0]
    means = np.array([[20.0, 0, 0, 0], [0, 20.0, 0, 0], [0, 0, -20.0, 10.0]])
    loadings = rng.standard_normal((3, r, q))
    return VectorMixture(
        center=rng.standard_normal(d),
        basis=basis,
        weights=np.array([0.5, 0.3, 0.2]),
        means=means,
        loadings=loadings,
        noise=np.array([0.05, 0.1, 0.2]),
        residual_variance=0.01,
        normalize=False,
    )


def test_fit_recovers_a_known_mixture() -> None:
    true = _known_mixture()
    x = true.sample(20_000, seed=1)
    assert x.shape == (20_000, 10) and x.dtype == np.float32
    fit = fit_mixture(x, n_components=3, rank=4, local_rank=2, seed=0)
    assert not fit.normalize and fit.n_components == 3
    assert fit.residual_variance == pytest.approx(true.residual_variance, rel=0.05)
    # Match components by their means in the full space; compare weights, means, covariances.
    full_mean = lambda m: m.center + m.means @ m.basis.T  # noqa: E731
    true_means, fit_means = full_mean(true), full_mean(fit)
    match = [int(np.argmin(np.linalg.norm(fit_means - m, axis=1))) for m in true_means]
    assert sorted(match) == [0, 1, 2]
    np.testing.assert_allclose(fit.weights[match], true.weights, atol=0.01)
    np.testing.assert_allclose(fit_means[match], true_means, atol=0.05)
    true_cov = true.basis @ true.covariances() @ true.basis.T
    fit_cov = fit.basis @ fit.covariances()[match] @ fit.basis.T
    for c in range(3):
        err = np.linalg.norm(fit_cov[c] - true_cov[c]) / np.linalg.norm(true_cov[c])
        assert err < 0.04, (c, err)  # 0.33 when q = 1 is fitted instead


def test_sampling_is_deterministic_unit_and_chunked(scifact_mixture: VectorMixture) -> None:
    a = scifact_mixture.sample(50, seed=3)
    assert a.shape == (50, 384) and a.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(a, axis=1), 1.0, atol=1e-5)
    np.testing.assert_array_equal(a, scifact_mixture.sample(50, seed=3))
    assert not np.array_equal(a, scifact_mixture.sample(50, seed=4))
    blocks = list(scifact_mixture.sample_chunks(25, seed=7, chunk_size=10))
    assert [len(b) for b in blocks] == [10, 10, 5]
    np.testing.assert_array_equal(blocks[1], scifact_mixture.sample(10, seed=[7, 1]))
    back = VectorMixture.from_dict(scifact_mixture.to_dict())
    assert back.digest() == scifact_mixture.digest()
    np.testing.assert_array_equal(back.sample(5, seed=0), scifact_mixture.sample(5, seed=0))
    assert scifact_mixture.sample(0).shape == (0, 384)


@pytest.fixture(scope="module")
def scifact_mixture(scifact_store) -> VectorMixture:
    return fit_mixture(scifact_store["test"].passages, seed=0, max_fit=3000)


def test_fit_is_deterministic_by_seed(scifact_store, scifact_mixture: VectorMixture) -> None:
    again = fit_mixture(scifact_store["test"].passages, seed=0, max_fit=3000)
    assert again.digest() == scifact_mixture.digest()
    assert scifact_mixture.n_components == default_components(3000) == 150
    assert (scifact_mixture.rank, scifact_mixture.local_rank) == (256, 8)


def test_samples_match_real_structure(scifact_store, scifact_mixture: VectorMixture) -> None:
    real = np.asarray(scifact_store["test"].passages[3000:5000], dtype=np.float64)
    fake = scifact_mixture.sample(2000, seed=1).astype(np.float64)
    iid = np.random.default_rng(0).standard_normal((2000, 384))
    # Real MiniLM vectors share a common direction: mean pairwise cosine well above 0. The
    # mixture keeps it; iid Gaussian vectors have ~0.
    real_cos, fake_cos = _mean_pairwise_cosine(real), _mean_pairwise_cosine(fake)
    assert real_cos > 0.05
    assert abs(fake_cos - real_cos) < 0.25 * real_cos
    assert abs(_mean_pairwise_cosine(iid)) < 0.01
    # Anisotropy: the top 10 principal axes carry a similar share of the variance.
    real_share, fake_share = _top_variance_share(real), _top_variance_share(fake)
    assert abs(fake_share - real_share) < 0.25 * real_share
    assert _top_variance_share(iid) < 0.5 * real_share
    # Local structure: every passage has a close neighbour, as in the real held-out rows.
    real_nn, fake_nn = _nearest_cosine(real), _nearest_cosine(fake)
    assert abs(fake_nn - real_nn) < 0.1, (real_nn, fake_nn)
    assert _nearest_cosine(iid) < real_nn - 0.3


def test_fit_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="2-D"):
        fit_mixture(np.zeros(5, np.float32))
    with pytest.raises(ValueError, match="NaN"):
        fit_mixture(np.full((4, 3), np.nan, np.float32))
    with pytest.raises(ValueError, match="local_rank"):
        fit_mixture(np.ones((4, 3), np.float32), local_rank=0)
    with pytest.raises(ValueError, match="n must be"):
        _known_mixture().sample(-1)


def test_write_store_round_trip(tmp_path, scifact_store) -> None:
    mix = fit_store(scifact_store["test"], seed=0, max_fit=2000)
    assert mix.queries.n_components == 15  # 300 queries: one component per 20
    dest = write_synthetic_store(
        tmp_path / "syn", mix, n_passages=1000, n_queries=30, chunk_size=300
    )
    store = EmbeddingStore.open(dest)
    assert (store.n_passages, store.n_queries, store.dim, store.k) == (1000, 30, 384, 0)
    assert store.encoder_fingerprint.startswith("synthetic:")
    expected = np.concatenate(list(mix.passages.sample_chunks(1000, seed=0, chunk_size=300)))
    np.testing.assert_array_equal(np.asarray(store.passages), expected)
    mtime = (dest / "passages.bin").stat().st_mtime_ns
    write_synthetic_store(dest, mix, n_passages=1000, n_queries=30, chunk_size=300)
    assert (dest / "passages.bin").stat().st_mtime_ns == mtime  # identical recipe: reused
    again = StoreMixtures.from_dict(mix.to_dict())
    assert again.passages.digest() == mix.passages.digest()
