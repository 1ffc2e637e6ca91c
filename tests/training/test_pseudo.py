"""Pseudo-query construction on hand fixtures and a real SciFact slice; stored once, reused."""

from __future__ import annotations

import numpy as np
import pytest

from treerank.store import split_digest
from treerank.training.pseudo import (
    PseudoConfig,
    build_pseudo_store,
    inverse_cloze,
    make_pseudo_split,
    random_crops,
    sentences,
    title_body,
)

PASSAGE = "Cells divide by mitosis. The spindle pulls chromatids apart. Cytokinesis ends it."


def test_sentences_and_inverse_cloze_by_hand():
    assert sentences(PASSAGE) == [
        "Cells divide by mitosis.",
        "The spindle pulls chromatids apart.",
        "Cytokinesis ends it.",
    ]
    assert sentences("p < 0.05 was found. e.g. in mice") == ["p < 0.05 was found. e.g. in mice"]
    seen = set()
    for seed in range(20):
        q, pos = inverse_cloze(PASSAGE, np.random.default_rng(seed), min_query_words=4)
        assert q in sentences(PASSAGE) and q not in pos and len(q.split()) >= 4
        assert pos == " ".join(s for s in sentences(PASSAGE) if s != q)
        seen.add(q)
    # "Cytokinesis ends it." has 3 words: never a query at min_query_words=4
    assert seen == {"Cells divide by mitosis.", "The spindle pulls chromatids apart."}
    assert inverse_cloze("One sentence only here.", np.random.default_rng(0)) is None


def test_title_body_and_crops_by_hand():
    assert title_body("Mitosis", "Cells divide.") == ("Mitosis", "Cells divide.")
    assert title_body("", "x") is None and title_body("t", None) is None
    words = [f"w{i}" for i in range(40)]
    text = " ".join(words)
    for seed in range(20):
        a, b = random_crops(text, np.random.default_rng(seed), 0.1, 0.5, 4)
        for crop in (a, b):
            toks = crop.split()
            assert 4 <= len(toks) <= 20  # round(0.5 * 40)
            start = words.index(toks[0])
            assert toks == words[start : start + len(toks)]  # a contiguous span
    assert random_crops("too short text", np.random.default_rng(0)) is None


@pytest.fixture(scope="module")
def corpus(scifact_zip):
    from treerank.readers.scifact import read_scifact_corpus

    ids, titles, texts = read_scifact_corpus(scifact_zip)
    n = 200
    full = [f"{t} {x}".strip() for t, x in zip(titles[:n], texts[:n], strict=True)]
    return ids[:n], titles[:n], texts[:n], full


def test_pseudo_split_on_real_passages(corpus):
    ids, titles, bodies, full = corpus
    cfg = PseudoConfig(methods=["ict", "title", "crops"], cap=120, seed=3)
    s = make_pseudo_split(ids, full, cfg, titles=titles, bodies=bodies)
    assert s.name == "pseudo" and s.relevance_threshold == 2 and s.n_queries == 120
    assert sum(s.meta["pairs"].values()) == 120 and all(v > 0 for v in s.meta["pairs"].values())
    assert s.passage_texts[:200] == full  # the corpus keeps its ids
    assert s.n_passages > 200  # new positive texts follow
    for i in range(s.n_queries):
        method, _, src_id = s.query_ids[i].partition(":")
        src = ids.index(src_id)
        grades = dict(zip(s.candidates[i].tolist(), s.labels[i].tolist(), strict=True))
        pos = [p for p, g in grades.items() if g == 2]
        assert len(pos) == 1 and grades.get(src) == 1  # source passage: labelled, masked
        q, ptext = s.query_texts[i], s.passage_texts[pos[0]]
        if method == "ict":
            assert q in full[src] and q not in ptext
        elif method == "title":
            assert q == titles[src].strip() and ptext == bodies[src].strip()
        else:
            words = " ".join(full[src].split())  # crops are word spans (white space normalised)
            assert q in words and ptext in words
    again = make_pseudo_split(ids, full, cfg, titles=titles, bodies=bodies)
    assert split_digest(again) == split_digest(s)  # seeded: a re-run builds the same split
    other = make_pseudo_split(ids, full, PseudoConfig(seed=4, cap=120))
    assert split_digest(other) != split_digest(s)
    with pytest.raises(ValueError, match="unknown"):
        PseudoConfig(methods=["nope"])


def test_pseudo_store_encodes_new_texts_once(scifact_store, encoder, tmp_path):
    train = scifact_store["train"]
    cfg = PseudoConfig(methods=["ict"], cap=12, seed=0)
    st, stats = build_pseudo_store(
        train, cfg, encoder=encoder, out_dir=tmp_path / "pseudo", progress=False
    )
    assert st.n_queries == 12 and st.n_passages == train.n_passages + 12
    assert stats.n_reused_passages == train.n_passages  # corpus copied, not encoded
    np.testing.assert_array_equal(
        np.asarray(st.passages[: train.n_passages]), np.asarray(train.passages)
    )
    # the pseudo-query vector is the encoder's vector of the sentence
    q = encoder.encode_queries([st.query_texts()[0]])
    np.testing.assert_allclose(np.asarray(st.queries[0]), q[0], atol=1e-5)
    before = (tmp_path / "pseudo" / "passages.bin").stat().st_mtime_ns
    st2, _ = build_pseudo_store(
        train, cfg, encoder=encoder, out_dir=tmp_path / "pseudo", progress=False
    )
    assert (tmp_path / "pseudo" / "passages.bin").stat().st_mtime_ns == before  # nothing redone
    assert st2.n_queries == 12


def test_two_passes_try_both_recipes_on_each_passage(corpus):
    ids, titles, bodies, full = corpus
    s = make_pseudo_split(
        ids,
        full,
        PseudoConfig(methods=["title", "ict"], passes=2, cap=10_000),
        titles=titles,
        bodies=bodies,
    )
    by_source: dict[str, set[str]] = {}
    for q in s.query_ids:
        method, _, rest = q.partition(":")
        by_source.setdefault(rest.split("#")[0], set()).add(method)
    with_two = [m for m in by_source.values() if len(m) == 2]
    assert len(with_two) >= 150 and s.meta["pairs"]["title"] == 200  # every passage has a title


def test_source_positive_adds_no_passage(corpus):
    ids, titles, bodies, full = corpus
    s = make_pseudo_split(
        ids,
        full,
        PseudoConfig(methods=["title"], cap=50, positive="source"),
        titles=titles,
        bodies=bodies,
    )
    assert s.n_passages == 200 and s.n_queries == 50
    for i in range(50):
        src = ids.index(s.query_ids[i].split(":", 1)[1])
        assert (
            s.candidates[i, 0] == src
            and s.labels[i, 0] == 2
            and s.query_texts[i] == titles[src].strip()
        )
