"""CosineScorer: unit vectors, checkpoint round trip, encoder mismatch refused."""

from __future__ import annotations

import numpy as np
import pytest

from treerank.models.base import DenseScorer
from treerank.models.checkpoint import EncoderMismatchError, save_checkpoint
from treerank.models.cosine import CosineScorer, l2_normalize
from treerank.models.registry import load_model


def test_scores_are_cosines() -> None:
    x = np.array([[3.0, 4.0], [0.0, 0.0], [-2.0, 0.0]], np.float32)
    s = CosineScorer()
    assert isinstance(s, DenseScorer)
    q = s.encode_queries(x)
    np.testing.assert_allclose(q, [[0.6, 0.8], [0.0, 0.0], [-1.0, 0.0]], rtol=1e-6)
    assert (q @ s.encode_passages(x).T)[0, 2] == pytest.approx(-0.6)
    with pytest.raises(ValueError, match="2-D"):
        l2_normalize(np.ones(3))
    with pytest.raises(ValueError, match="dim"):
        CosineScorer(dim=3).encode_queries(x)


def test_checkpoint_round_trip_through_registry(tmp_path) -> None:
    ckpt = CosineScorer(dim=2).to_checkpoint("minilm", "sha256:abc")
    save_checkpoint(tmp_path / "cos", ckpt)
    model = load_model(tmp_path / "cos", expected_fingerprint="sha256:abc")
    assert isinstance(model, CosineScorer) and model.dim == 2
    with pytest.raises(EncoderMismatchError):
        load_model(tmp_path / "cos", expected_fingerprint="sha256:other")
