"""The synthetic-vector generator: fitted to the real SciFact store, it keeps the structure that
iid Gaussian vectors lack, and writes a store that opens like a real one."""

from __future__ import annotations

import numpy as np
import pytest

from treerank.store import EmbeddingStore
from treerank.store.synthetic import (
    StoreMixtures,
    VectorMixture,
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


@pytest.fixture(scope="module")
def scifact_mixture(scifact_store) -> VectorMixture:
    return fit_mixture(scifact_store["test"].passages, n_components=16, seed=0, max_fit=3000)


def test_samples_match_real_structure(scifact_store, scifact_mixture: VectorMixture) -> None:
    real = np.asarray(scifact_store["test"].passages[:2000], dtype=np.float64)
    fake = scifact_mixture.sample(2000, seed=1).astype(np.float64)
    assert fake.shape == (2000, 384) and scifact_mixture.normalize
    np.testing.assert_allclose(np.linalg.norm(fake, axis=1), 1.0, atol=1e-5)
    # Real MiniLM vectors share a common direction: mean pairwise cosine well above 0. The
    # mixture keeps it; iid Gaussian vectors have ~0.
    real_cos, fake_cos = _mean_pairwise_cosine(real), _mean_pairwise_cosine(fake)
    iid = np.random.default_rng(0).standard_normal((2000, 384))
    assert real_cos > 0.05
    assert abs(fake_cos - real_cos) < 0.25 * real_cos
    assert abs(_mean_pairwise_cosine(iid)) < 0.01
    # Anisotropy: the top 10 principal axes carry a similar share of the variance.
    real_share, fake_share = _top_variance_share(real), _top_variance_share(fake)
    assert abs(fake_share - real_share) < 0.25 * real_share
    assert _top_variance_share(iid) < 0.5 * real_share


def test_sampling_is_deterministic_and_chunked(scifact_mixture: VectorMixture) -> None:
    a = scifact_mixture.sample(50, seed=3)
    np.testing.assert_array_equal(a, scifact_mixture.sample(50, seed=3))
    assert not np.array_equal(a, scifact_mixture.sample(50, seed=4))
    blocks = list(scifact_mixture.sample_chunks(25, seed=7, chunk_size=10))
    assert [len(b) for b in blocks] == [10, 10, 5]
    np.testing.assert_array_equal(blocks[1], scifact_mixture.sample(10, seed=[7, 1]))
    back = VectorMixture.from_dict(scifact_mixture.to_dict())
    assert back.digest() == scifact_mixture.digest()


def test_fit_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="2-D"):
        fit_mixture(np.zeros(5, np.float32))
    with pytest.raises(ValueError, match="NaN"):
        fit_mixture(np.full((4, 3), np.nan, np.float32))


def test_write_store_round_trip(tmp_path, scifact_store) -> None:
    mix = fit_store(scifact_store["test"], n_components=16, seed=0, max_fit=2000)
    assert mix.queries.n_components == 4  # 300 queries < 20 * 16: a quarter of the components
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
