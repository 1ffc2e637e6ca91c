import numpy as np
import pytest
import torch

from treerank.models.checkpoint import save_checkpoint
from treerank.models.cosine import CosineScorer
from treerank.models.mlp import MLPHead
from treerank.models.registry import load_model


def _vectors(n, d, seed):
    return np.random.default_rng(seed).standard_normal((n, d)).astype(np.float32)


def test_identity_init_scores_like_cosine():
    torch.manual_seed(0)
    q, p = _vectors(10, 16, 0), _vectors(300, 16, 1)
    head, cos = MLPHead(16, hidden=32, dropout=0.5), CosineScorer(16)
    s_head = head.encode_queries(q) @ head.encode_passages(p).T
    s_cos = cos.encode_queries(q) @ cos.encode_passages(p).T
    np.testing.assert_allclose(s_head, s_cos, atol=1e-6)


def test_dropout_only_in_training_and_encode_is_deterministic():
    torch.manual_seed(0)
    head = MLPHead(16, hidden=64, dropout=0.5)
    with torch.no_grad():
        head.query_tower.fc2.weight.normal_()
    x = _vectors(4, 16, 0)
    head.train()
    t = torch.from_numpy(x)
    assert not torch.equal(head.encode_queries_t(t), head.encode_queries_t(t))
    a, b = head.encode_queries(x), head.encode_queries(x)
    np.testing.assert_array_equal(a, b)
    assert head.training  # encode_* restores the mode


def test_residual_formula_by_hand():
    torch.manual_seed(0)
    head = MLPHead(3, hidden=2, dropout=0.0, scoring="dot")
    tw = head.query_tower
    with torch.no_grad():
        tw.fc2.weight.copy_(torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]))
    x = torch.tensor([[1.0, -2.0, 0.5]])
    h = torch.nn.functional.gelu(x @ tw.fc1.weight.T + tw.fc1.bias)
    want = x + h @ tw.fc2.weight.T
    assert torch.allclose(head.encode_queries_t(x), want)


def test_checkpoint_round_trip(tmp_path):
    torch.manual_seed(0)
    head = MLPHead(8, hidden=12, dropout=0.2)
    with torch.no_grad():
        head.passage_tower.fc2.weight.normal_()
    save_checkpoint(tmp_path / "ck", head.to_checkpoint("minilm", "fp"))
    back = load_model(tmp_path / "ck", "fp")
    assert isinstance(back, MLPHead) and back.config() == head.config()
    x = _vectors(5, 8, 2)
    np.testing.assert_array_equal(back.encode_passages(x), head.encode_passages(x))


def test_bad_config():
    with pytest.raises(ValueError, match="dropout"):
        MLPHead(8, dropout=1.0)
