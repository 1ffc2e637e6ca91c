"""`treerank.names.file_name`: one injective, filesystem-safe map from a name to a file name
(issue 36). Hypothesis feeds arbitrary Unicode names; the field cases are checked by value."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from treerank.names import PLAIN_MAX, check_name, file_name, name_problem, slug

SAFE = re.compile(r"[a-z0-9_.+=@~-]+")
WINDOWS_DEVICES = {"con", "prn", "aux", "nul"} | {
    f"{p}{i}" for p in ("com", "lpt") for i in range(1, 10)
}


def _safe_on_every_filesystem(f: str) -> None:
    assert SAFE.fullmatch(f), f
    assert 1 <= len(f) <= PLAIN_MAX and len(f.encode()) <= PLAIN_MAX  # far below 255 bytes
    assert f[0] not in ".-" and f not in (".", "..")
    assert f.partition(".")[0] not in WINDOWS_DEVICES


names = st.text(min_size=1, max_size=400).filter(lambda s: name_problem(s) is None)


@settings(max_examples=400, deadline=None)
@given(st.lists(names, min_size=2, max_size=8, unique=True))
def test_file_name_is_injective_and_safe(batch: list[str]) -> None:
    files = [file_name(n) for n in batch]
    for f in files:
        _safe_on_every_filesystem(f)
    assert len(set(files)) == len(files), dict(zip(batch, files, strict=True))
    # case-insensitive filesystems (macOS, Windows) see no collision either
    assert len({f.lower() for f in files}) == len(files)


@settings(max_examples=200, deadline=None)
@given(names)
def test_file_name_is_deterministic_and_plain_names_are_kept(name: str) -> None:
    f = file_name(name)
    assert f == file_name(name)
    plain = "~" not in f
    assert plain == (f == name)  # a name is its own file name exactly when it is plain


def test_field_cases() -> None:
    # the collision of issue 36: both were "system" before
    a, b = file_name("модель"), file_name("模型")
    assert a != b and a.startswith("name~") and b.startswith("name~")
    assert re.fullmatch(r"name~[0-9a-f]{16}", a)
    long = "x" * 300
    assert file_name(long) == "x" * 40 + "~" + file_name(long)[-16:] and len(file_name(long)) == 57
    assert file_name("x" * 301) != file_name(long)
    # plain names keep their earlier rendering
    for plain in ("bm25", "cosine", "linear@seed0", "mlp@seed1@squad", "lin-2.v1"):
        assert file_name(plain) == plain
    # lossy spellings get a digest, so the old collisions are gone
    pairs = [
        ("rrf:bm25+cosine", "rrf_bm25+cosine"),
        ("BM25", "bm25"),
        ("a b", "a_b"),
        ("con", "c0n"),
    ]
    for x, y in pairs:
        assert file_name(x) != file_name(y)
    assert file_name("rrf:bm25+cosine").startswith("rrf_bm25+cosine~")
    assert file_name("con").startswith("con~") and file_name(".hidden").startswith("hidden~")
    assert slug("模型") == "name" and slug("Dense Passage!") == "dense_passage"


@pytest.mark.parametrize(
    "bad, why",
    [("", "empty"), ("   ", "empty"), ("a\nb", "U\\+000A"), ("tab\there", "U\\+0009"),
     ("nul\x00", "U\\+0000"), ("sur\ud800", "U\\+D800"), ("line\u2028sep", "U\\+2028")],
)  # fmt: skip
def test_unrepresentable_names_are_refused(bad: str, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        check_name(bad, "model name")
    with pytest.raises(ValueError, match=why):
        file_name(bad)
