"""Unknown-name messages: a close match is suggested, only the names are listed."""

from __future__ import annotations

import pytest

from treerank.names import closest, unknown_name

KINDS = ["cosine", "bm25", "bm25+rm3", "rrf", "linear-fusion", "ckpt", "faiss", "rescore"]


@pytest.mark.parametrize(
    ("typo", "expected"),
    [("cosin", "cosine"), ("bm52", "bm25"), ("BM25", "bm25"), ("fais", "faiss"), ("xyz", None)],
)
def test_closest(typo: str, expected: str | None) -> None:
    assert closest(typo, KINDS) == expected


def test_unknown_name_message() -> None:
    assert unknown_name("system kind", "cosin", KINDS) == (
        "unknown system kind 'cosin'; did you mean 'cosine'? known: "
        "cosine, bm25, bm25+rm3, rrf, linear-fusion, ckpt, faiss, rescore"
    )
    assert unknown_name("family", "xgb", ["linear", "mlp"], "see --help") == (
        "unknown family 'xgb'; known: linear, mlp (see --help)"
    )


def test_unknown_family_suggests() -> None:
    from treerank.families import family

    with pytest.raises(KeyError, match=r"unknown model family 'dtr'; did you mean 'drt'\?"):
        family("dtr")
