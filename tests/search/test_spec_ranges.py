"""Every system-spec parameter is range-checked where it is parsed, the range in the message."""

from __future__ import annotations

import numpy as np
import pytest

from treerank.search.fusion import rrf
from treerank.search.run import Run
from treerank.search.specs import build_system


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("rrf:bm25+cosine:k=-60", "k must be > 0, got -60"),
        ("rrf:bm25+cosine:k=0", "k must be > 0, got 0"),
        ("rrf:bm25+cosine:depth=0", "depth must be >= 1, got 0"),
        ("linear-fusion:bm25+cosine:w=1.5", r"w must be in \[0.0, 1.0\], got 1.5"),
        ("linear-fusion:bm25+cosine:w=-0.1", r"w must be in \[0.0, 1.0\], got -0.1"),
        ("linear-fusion:bm25+cosine:w=nan", "w='nan' is not a finite number"),
        ("linear-fusion:bm25+cosine:norm=rank", "norm must be one of minmax, zscore"),
        ("bm25:k1=-1", "k1 must be >= 0.0, got -1.0"),
        ("bm25:k1=inf", "k1='inf' is not a finite number"),
        ("bm25:b=2", r"b must be in \[0.0, 1.0\], got 2.0"),
        ("bm25+rm3:fb_docs=0", "RM3 needs fb_docs >= 1"),
        ("bm25+rm3:orig_weight=nan", "orig_weight='nan' is not a finite number"),
        ("faiss:hnsw:ef_search=0", "ef_search must be >= 1, got 0"),
        ("faiss:ivfflat:nprobe=0", "nprobe must be >= 1, got 0"),
        ("faiss:hnsw:M=1", "M must be >= 2, got 1"),
        ("rescore:bm25:depth=0", "depth must be >= 1, got 0"),
        ("rrf:bm25+cosine:k=1e3", "k='1e3' is not a int"),
    ],
)
def test_out_of_range_parameters_are_refused_at_parse(spec: str, message: str) -> None:
    with pytest.raises(ValueError, match=message) as err:
        build_system(spec)
    assert repr(spec) in str(err.value)  # the message quotes the spec


def test_rrf_constant_must_be_positive_in_the_library_call() -> None:
    a = Run("a", np.array([[0, 1]]), np.array([[2.0, 1.0]], np.float32))
    b = Run("b", np.array([[1, 0]]), np.array([[2.0, 1.0]], np.float32))
    with pytest.raises(ValueError, match="RRF constant k must be > 0, got -60"):
        rrf(a, b, rrf_k=-60)
    fused = rrf(a, b, rrf_k=60)
    # both passages rank 1 once and 2 once: 1/61 + 1/62 each, ties by ascending id
    np.testing.assert_allclose(fused.scores[0], [1 / 61 + 1 / 62] * 2, rtol=1e-6)
    assert fused.ids[0].tolist() == [0, 1]
