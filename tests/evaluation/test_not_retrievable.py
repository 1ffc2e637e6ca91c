"""The forest's not-retrievable statistics on a hand fixture."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from treerank.forest.model import Forest, ForestConfig
from treerank.forest.not_retrievable import not_retrievable_stats


class _Store:
    meta: dict[str, object] = {}

    def __init__(self, q, p):
        self.queries, self.passages = q, p

    def source_qrels(self) -> None:
        return None  # judged by candidates / labels alone


def test_not_retrievable_stats_hand_fixture() -> None:
    """One model, 2 classes over 2-d inputs (class = larger coordinate); the passage model's NR
    logit ``30 x0 - 15`` fires on passages with a large first coordinate."""
    cfg = ForestConfig(n_models=1, n_classes=2, dim=2, nr_threshold=0.5)
    eye = torch.eye(2).unsqueeze(0) * 10.0
    qb = torch.zeros(1, 2)
    pw = torch.cat([eye, torch.tensor([[[30.0], [0.0]]])], dim=-1)
    pb = torch.tensor([[0.0, 0.0, -15.0]])
    forest = Forest(cfg, [eye], [qb], [pw], [pb])
    passages = np.array([[1.0, 0.0], [0.6, 0.4], [0.0, 1.0], [0.9, 0.1]], np.float32)
    pc, _ = forest.passage_classes(passages)
    np.testing.assert_array_equal(pc[:, 0], [-1, 0, 1, -1])  # 0 and 3 not retrievable
    queries = np.array([[1.0, 0.0], [0.0, 1.0]], np.float32)  # classes 0 and 1

    class S(_Store):
        candidates = np.array([[0, 1], [2, -1]])
        labels = np.array([[1, 1], [1, 0]])
        relevance_threshold = 1

    st = not_retrievable_stats(forest, S(queries, passages), k=4)
    assert st["not_indexed_fraction"] == [0.5]
    # relevant pairs meeting without NR: (q0, p0), (q0, p1), (q1, p2); p0 is lost -> 1/3
    assert st["recall_lost"] == [pytest.approx(1 / 3)]
    assert st["recall_at_k"] == pytest.approx((1 / 2 + 1) / 2)
    assert st["recall_at_k_without"] == pytest.approx(1.0)
    assert st["index_bytes_without"] - st["index_bytes"] == 2 * 8  # two postings of 4 + 4 bytes
