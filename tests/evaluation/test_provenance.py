"""Train/test leak checks (``evaluation.provenance``) on hand-built splits: a leak needs the same
split, a shared query text, or shared ids where texts cannot be compared; two collections that
only share an id scheme (``q1``, ``q2``, ...) are not flagged (a fresh user's trial)."""

from __future__ import annotations

from types import SimpleNamespace

from treerank.evaluation.provenance import check_leaks, training_provenance


def _split(path: str, ids: list[str], texts: list[str] | None) -> SimpleNamespace:
    return SimpleNamespace(
        path=path,
        split="x",
        meta={},
        has_texts=texts is not None,
        query_ids=lambda: ids,
        query_texts=lambda: texts,
    )


def test_shared_ids_with_other_texts_are_not_a_leak() -> None:
    train = _split("/a/train", ["q1", "q2", "q3"], ["wind tunnel", "heat flux", "shock waves"])
    other = _split("/b/test", ["q1", "q2"], ["does coffee help", "vitamin d bones"])
    assert check_leaks(other, {"ckpt:h": training_provenance(train)}) == []


def test_a_shared_text_is_a_leak_whatever_the_ids() -> None:
    train = _split("/a/train", ["q1", "q2"], ["wind tunnel", "heat flux"])
    test = _split("/a/test", ["t9", "t8"], ["Heat  Flux", "new question"])  # case, spaces folded
    (leak,) = check_leaks(test, {"ckpt:h": training_provenance(train)})
    assert (leak.by_text, leak.by_id, leak.same_split, leak.n_queries) == (1, 0, False, 2)


def test_shared_ids_count_when_texts_cannot_be_compared() -> None:
    train = _split("/a/train", ["q1", "q2"], None)
    test = _split("/a/test", ["q2", "q7"], ["x", "y"])
    (leak,) = check_leaks(test, {"ckpt:h": training_provenance(train)})
    assert (leak.by_id, leak.by_text) == (1, 0)


def test_the_same_split_is_a_leak() -> None:
    train = _split("/a/train", ["q1"], ["wind tunnel"])
    (leak,) = check_leaks(train, {"ckpt:h": training_provenance(train)})
    assert leak.same_split and (leak.by_id, leak.by_text) == (1, 1)
