"""Sharded exact search: 2 gloo processes, merged top-k == the 1-process top-k, ties included."""

from __future__ import annotations

import numpy as np
import pytest

from tests.distributed import workers
from tests.distributed.helpers import torchrun
from treerank.distributed.context import shard_bounds
from treerank.kernels.topk import exact_search


@pytest.fixture(scope="module")
def two_process_search(scifact_store, tmp_path_factory):
    out = tmp_path_factory.mktemp("dist-search")
    proc = torchrun(["search", str(scifact_store["test"].path), str(out)])
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [dict(np.load(out / f"search-rank{r}.npz")) for r in (0, 1)]


@pytest.mark.parametrize("case", list(workers.SEARCH_CASES))
def test_sharded_topk_equals_one_process(scifact_store, two_process_search, case):
    store = scifact_store["test"]
    q, p, kw = workers.search_case(store, case)
    ref_ids, ref_scores = exact_search(q, p, **kw)
    for rank in two_process_search:
        np.testing.assert_array_equal(rank[f"{case}/ids"], ref_ids)
        np.testing.assert_array_equal(rank[f"{case}/scores"], ref_scores)
    lo, hi = shard_bounds(store.n_passages, 2, 1)
    # both shards contribute (rank 1's rows appear in the results)
    if case != "constant":
        assert ((ref_ids >= lo) & (ref_ids < hi)).any() and (ref_ids < lo).any()
    if case == "rounded-ties":  # the case really has ties at the k-th position across shards
        kth = ref_scores[:, -1:]
        full = np.round(q * 4) / 4 @ (np.round(np.asarray(p) * 4) / 4).T
        assert ((full == kth).sum(axis=1) > (ref_scores == kth).sum(axis=1)).any()
    if case == "constant":
        np.testing.assert_array_equal(ref_ids, np.broadcast_to(np.arange(20), ref_ids.shape))


def test_shard_bounds_cover_in_order():
    for n, w in ((10, 3), (2, 4), (0, 2), (5183, 2)):
        parts = [shard_bounds(n, w, r) for r in range(w)]
        assert parts[0][0] == 0 and parts[-1][1] == n
        assert all(a[1] == b[0] for a, b in zip(parts, parts[1:], strict=False))
        assert max(h - lo for lo, h in parts) - min(h - lo for lo, h in parts) <= 1
    assert shard_bounds(10, 3, 0) == (0, 4) and shard_bounds(10, 3, 2) == (7, 10)
    with pytest.raises(ValueError, match="rank"):
        shard_bounds(10, 2, 2)
