"""`SentenceEncoder` against plain sentence-transformers encode, prompts and fingerprints."""

from __future__ import annotations

import numpy as np
import torch

from treerank.encoders import SentenceEncoder, weights_fingerprint

TEXTS = [
    "what is a corporation?",
    "0-dimensional biomaterials show inductive properties.",
    "The Drosophila spaghetti squash ( sqh ) gene encodes the regulatory myosin light chain "
    "(RMLC) of nonmuscle myosin II. " * 3,
    "short",
    "caf\u00e9 \u00e2\u20ac\u201c mojibake is kept as is",
]


def test_matches_sentence_transformers(encoder):
    ours = encoder.encode_passages(TEXTS)
    ref = encoder.model.encode(TEXTS, batch_size=2, normalize_embeddings=True)
    assert ours.dtype == np.float32 and ours.shape == (5, encoder.dim) == (5, 384)
    np.testing.assert_allclose(np.linalg.norm(ours, axis=1), 1.0, atol=1e-6)
    assert np.all((ours * ref).sum(1) > 0.9999)


def test_batch_composition_does_not_change_vectors(encoder):
    # mean pooling with the attention mask: padding does not leak into a vector
    alone = np.stack([encoder.encode_batch([t]).vectors[0] for t in TEXTS])
    together = encoder.encode_batch(TEXTS).vectors
    assert np.all((alone * together).sum(1) > 0.99999)
    res = encoder.encode_batch(TEXTS)
    lengths = encoder.token_lengths(TEXTS)
    assert res.real_tokens == lengths.sum() and res.padded_tokens == len(TEXTS) * lengths.max()


def test_query_prompt(encoder):
    prompt = "Instruct: Given a query, retrieve relevant passages\nQuery: "
    enc = SentenceEncoder(query_prompt=prompt)
    assert enc.fingerprint == encoder.fingerprint
    q = enc.encode_queries(TEXTS[:2])
    ref = enc.model.encode(TEXTS[:2], prompt=prompt, normalize_embeddings=True)
    assert np.all((q * ref).sum(1) > 0.9999)
    plain = encoder.encode_queries(TEXTS[:2])
    assert np.all((q * plain).sum(1) < 0.999)
    np.testing.assert_array_equal(
        enc.encode_passages(TEXTS[:1]), encoder.encode_passages(TEXTS[:1])
    )
    assert enc.token_lengths(TEXTS[:1], "query")[0] > encoder.token_lengths(TEXTS[:1], "query")[0]


def test_fingerprint_tracks_weights():
    lin = torch.nn.Linear(3, 2)
    torch.nn.init.zeros_(lin.weight)
    torch.nn.init.zeros_(lin.bias)
    a = weights_fingerprint(lin)
    assert a == weights_fingerprint(lin) and a.startswith("sha256:") and len(a) == 7 + 64
    with torch.no_grad():
        lin.weight[0, 0] = 1e-7
    assert weights_fingerprint(lin) != a


def test_encode_empty(encoder):
    assert encoder.encode_passages([]).shape == (0, 384)


def test_no_progress_hides_the_loading_weights_bar(capfd) -> None:
    """Issue 22: ``--no-progress`` (``progress=False``) also hides transformers' ``Loading
    weights`` bar; the process-wide switch is restored afterwards."""
    from transformers.utils import logging as hf_logging

    assert hf_logging.is_progress_bar_enabled()
    SentenceEncoder(progress=False)
    assert "Loading weights" not in capfd.readouterr().err
    assert hf_logging.is_progress_bar_enabled()
