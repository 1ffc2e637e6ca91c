import numpy as np
import pytest
import torch

from treerank.models.base import DenseScorer
from treerank.models.checkpoint import EncoderMismatchError, save_checkpoint
from treerank.models.cosine import CosineScorer
from treerank.models.linear import LinearHead
from treerank.models.registry import load_model


def _vectors(n, d, seed):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((n, d)) * rng.uniform(0.5, 2, (n, 1))).astype(np.float32)


def test_identity_init_scores_exactly_like_cosine():
    q, p = _vectors(20, 32, 0), _vectors(500, 32, 1)
    head, cos = LinearHead(32), CosineScorer(32)
    assert isinstance(head, DenseScorer)
    s_head = head.encode_queries(q) @ head.encode_passages(p).T
    s_cos = cos.encode_queries(q) @ cos.encode_passages(p).T
    np.testing.assert_allclose(s_head, s_cos, atol=1e-6)
    assert np.array_equal(
        np.argsort(-s_head, axis=1, kind="stable")[:, :50],
        np.argsort(-s_cos, axis=1, kind="stable")[:, :50],
    )
    # the training-side logits agree too: cos / tau
    qt, pt = torch.from_numpy(q), torch.from_numpy(p)
    logits = head.score_matrix(head.encode_queries_t(qt), head.encode_passages_t(pt))
    np.testing.assert_allclose(logits.detach().numpy(), s_cos / 0.05, rtol=1e-5, atol=1e-4)


def test_identity_init_on_real_store(scifact_store):
    """Same check on real MiniLM vectors (the shared cached SciFact test store)."""
    st = scifact_store["test"]
    q, p = np.asarray(st.queries[:50]), np.asarray(st.passages[:2000])
    head, cos = LinearHead(st.dim), CosineScorer(st.dim)
    s_head = head.encode_queries(q) @ head.encode_passages(p).T
    s_cos = cos.encode_queries(q) @ cos.encode_passages(p).T
    np.testing.assert_allclose(s_head, s_cos, atol=1e-6)


def test_separate_towers_by_default_shared_as_option():
    sep, sh = LinearHead(8), LinearHead(8, shared=True)
    assert sep.query_tower is not sep.passage_tower
    assert sh.query_tower is sh.passage_tower
    assert sum(p.numel() for p in sep.parameters()) == 2 * 64
    assert sum(p.numel() for p in sh.parameters()) == 64


def test_projection_to_smaller_dim_is_orthogonal():
    torch.manual_seed(0)
    head = LinearHead(16, out_dim=8)
    w = head.query_tower.weight.detach()
    np.testing.assert_allclose((w @ w.T).numpy(), np.eye(8), atol=1e-5)
    assert head.encode_queries(_vectors(3, 16, 0)).shape == (3, 8)


def test_dot_scoring_has_no_normalisation_or_temperature():
    head = LinearHead(4, scoring="dot")
    x = _vectors(3, 4, 0)
    np.testing.assert_array_equal(head.encode_queries(x), x)
    t = torch.from_numpy(x)
    assert torch.allclose(head.score_matrix(t, t), t @ t.T)
    assert head.temperature == 1.0


def test_learned_temperature_gets_gradient_and_is_capped():
    head = LinearHead(4, learn_temperature=True, temperature=0.05)
    assert head.temperature == pytest.approx(0.05)
    x = torch.from_numpy(_vectors(3, 4, 0))
    head.score_matrix(x, x).sum().backward()
    assert head.log_scale.grad is not None
    with torch.no_grad():
        head.log_scale.fill_(10.0)
    assert head.temperature == pytest.approx(0.01)  # 1 / 100 cap


def test_checkpoint_round_trip_and_encoder_refusal(tmp_path):
    torch.manual_seed(0)
    head = LinearHead(8, scoring="cosine", temperature=0.1, learn_temperature=True)
    with torch.no_grad():
        head.query_tower.weight.add_(0.1 * torch.randn(8, 8))
    save_checkpoint(tmp_path / "ck", head.to_checkpoint("minilm", "fp-A"))
    back = load_model(tmp_path / "ck", expected_fingerprint="fp-A")
    assert isinstance(back, LinearHead)
    assert back.config() == head.config()
    assert back.config()["scoring"] == "cosine" and back.config()["temperature"] == 0.1
    x = _vectors(5, 8, 3)
    np.testing.assert_array_equal(back.encode_queries(x), head.encode_queries(x))
    with pytest.raises(EncoderMismatchError, match="fingerprint"):
        load_model(tmp_path / "ck", expected_fingerprint="fp-B")


def test_run_stage_directory_loads_its_checkpoint_subfolder(tmp_path):
    head = LinearHead(4)
    save_checkpoint(tmp_path / "linear@seed0" / "checkpoint", head.to_checkpoint("m", "f"))
    back = load_model(tmp_path / "linear@seed0")  # what `ckpt:runs/.../linear@seed0` names
    x = _vectors(3, 4, 1)
    np.testing.assert_array_equal(back.encode_queries(x), head.encode_queries(x))
    with pytest.raises(FileNotFoundError, match="not a treerank checkpoint"):
        load_model(tmp_path)


def test_shared_tower_survives_checkpoint(tmp_path):
    head = LinearHead(4, shared=True)
    save_checkpoint(tmp_path / "ck", head.to_checkpoint("m", "f"))
    back = load_model(tmp_path / "ck")
    assert back.query_tower is back.passage_tower


def test_bad_input():
    with pytest.raises(ValueError, match=r"\(n, 8\)"):
        LinearHead(8).encode_queries(np.zeros((2, 4), np.float32))
    with pytest.raises(ValueError, match="scoring"):
        LinearHead(8, scoring="l2")


def test_query_side_adapter_leaves_passage_tower_untouched(tmp_path):
    """``trainable="query"``: training moves only the query tower; the passage tower (and so
    the passage index of a residual head) stays the identity, also after a checkpoint."""
    from treerank.training.sources import label_pairs, train_on_pairs
    from treerank.training.trainer import TrainerConfig

    q, p = _vectors(40, 8, 0), _vectors(60, 8, 1)
    cand = np.arange(40, dtype=np.int32)[:, None]  # query i -> passage i
    lab = np.ones((40, 1), np.uint8)
    pairs = label_pairs(cand, lab, [f"q{i}" for i in range(40)])
    cfg = TrainerConfig(max_steps=5, lr=1e-2, patience=None, warmup_ratio=0.0)
    for trainable, moved, kept in (
        ("query", "query_tower", "passage_tower"),
        ("passage", "passage_tower", "query_tower"),
    ):
        torch.manual_seed(0)
        head = LinearHead(8, trainable=trainable)
        train_on_pairs(head, q, p, [pairs], cfg, batch_size=8, progress=False)
        assert torch.count_nonzero(getattr(head, kept).weight) == 0
        assert torch.count_nonzero(getattr(head, moved).weight) > 0
        save_checkpoint(tmp_path / trainable, head.to_checkpoint("m", "f"))
        back = load_model(tmp_path / trainable)
        assert back.config()["trainable"] == trainable
        assert not getattr(back, kept).weight.requires_grad
        np.testing.assert_array_equal(back.encode_passages(p), head.encode_passages(p))
    with pytest.raises(ValueError, match="shared=False"):
        LinearHead(8, shared=True, trainable="query")
    with pytest.raises(ValueError, match="trainable"):
        LinearHead(8, trainable="neither")
