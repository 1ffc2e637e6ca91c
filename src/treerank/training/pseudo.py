"""Pseudo-queries cut from the corpus itself: label-free training pairs, stored as a split.

Three recipes, each turning one passage into a (query, positive) pair of texts:

* ``ict`` -- **inverse cloze task** (Lee et al., 2019, "Latent Retrieval for Weakly Supervised
  Open Domain Question Answering"): a sentence of the passage is the query, the passage with
  that sentence removed is the positive (ORQA removes it 90% of the time; here always, so the
  pair never matches on the copied sentence).
* ``title`` -- title -> body where the corpus has titles (the passage's title is the query, its
  body without the title the positive).
* ``crops`` -- two **independent random crops** of the passage (Izacard et al., 2022,
  "Contriever"): each a span of ``crop_min..crop_max`` of the passage's words, drawn
  independently, one the query, the other the positive.

:func:`make_pseudo_split` builds a :class:`~treerank.readers.split.RetrievalSplit` named
``pseudo``: the whole corpus first (same texts, so the store copies their vectors from the
sibling split instead of encoding them), then the new positive texts. Each pseudo-query's
candidates are its new positive (grade 2 = relevant, the split's relevance threshold) and the
passage it was cut from (grade 1 = labelled but not relevant), so the source passage, which
contains the query's words verbatim, is masked out of the query's softmax rather than pushed
away as a negative. :func:`build_pseudo_store` embeds the split once with the store's encoder
into ``<store root>/pseudo``; a re-run with the same settings builds the same split (seeded),
whose digest matches the finished store, and encodes nothing.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from treerank.readers.builder import SplitBuilder
from treerank.readers.split import RetrievalSplit
from treerank.store.format import PSEUDO_SOURCE
from treerank.storelike import StoreLike, meta_object

__all__ = [
    "PSEUDO_METHODS",
    "PseudoConfig",
    "build_pseudo_store",
    "inverse_cloze",
    "make_pseudo_split",
    "random_crops",
    "sentences",
    "title_body",
]

PSEUDO_METHODS = ("ict", "title", "crops")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[\"'(\[]?[A-Z0-9])")


@dataclass
class PseudoConfig:
    """How pseudo-queries are made (the ``pseudo`` source of the training-data section).

    Attributes:
        methods: recipes to use, in order, from :data:`PSEUDO_METHODS`; on each pass a passage
            gets one pair from the first recipe of a rotation that applies to it (pass ``p``
            starts the rotation ``p`` recipes later, so ``passes = len(methods)`` tries every
            recipe on every passage).
        passes: passes over the (seeded) passage order, until ``cap``.
        positive: ``"cut"`` (the recipe's positive: passage without the sentence, body, second
            crop; one new passage text to encode per pair) or ``"source"`` (the whole passage
            the query was cut from: only the queries are encoded, ~20x cheaper on 2 CPU cores,
            at the price of a positive that contains the query's words verbatim).
        cap: at most this many pseudo-queries (encoding ~100K new texts costs ~50 minutes on
            two CPU cores, so keep it in the tens of thousands).
        min_query_words: shortest pseudo-query kept (words).
        crop_min, crop_max: crop length as a fraction of the passage's words (Contriever: 0.1-0.5).
        seed: seed of every random choice (passage order, sentence, crop positions).
    """

    methods: list[str] = field(default_factory=lambda: ["ict"])
    cap: int = 20_000
    passes: int = 1
    positive: str = "cut"
    min_query_words: int = 4
    crop_min: float = 0.1
    crop_max: float = 0.5
    seed: int = 0

    def __post_init__(self) -> None:
        bad = [m for m in self.methods if m not in PSEUDO_METHODS]
        if bad or not self.methods:
            raise ValueError(f"pseudo.methods: unknown {bad}; known: {', '.join(PSEUDO_METHODS)}")
        if self.positive not in ("cut", "source"):
            raise ValueError(f"pseudo.positive must be 'cut' or 'source', got {self.positive!r}")
        if self.cap < 1 or self.passes < 1 or not 0 < self.crop_min <= self.crop_max <= 1:
            raise ValueError(
                "pseudo: cap >= 1, passes >= 1 and 0 < crop_min <= crop_max <= 1 are required"
            )


def sentences(text: str) -> list[str]:
    """Split ``text`` into sentences (a break after ``.!?`` followed by an upper-case start)."""
    return [s.strip() for s in _SENTENCE_END.split(text.strip()) if s.strip()]


def inverse_cloze(
    text: str, rng: np.random.Generator, min_query_words: int = 4
) -> tuple[str, str] | None:
    """``(sentence, passage without it)`` or None when the passage has < 2 usable sentences."""
    sents = sentences(text)
    usable = [i for i, s in enumerate(sents) if len(s.split()) >= min_query_words]
    if len(sents) < 2 or not usable:
        return None
    i = usable[int(rng.integers(len(usable)))]
    return sents[i], " ".join(s for j, s in enumerate(sents) if j != i)


def title_body(
    title: str | None, body: str | None, min_query_words: int = 1
) -> tuple[str, str] | None:
    """``(title, body)`` or None when either is empty or the title is too short."""
    t, b = (title or "").strip(), (body or "").strip()
    if not t or not b or len(t.split()) < min_query_words:
        return None
    return t, b


def random_crops(
    text: str,
    rng: np.random.Generator,
    crop_min: float = 0.1,
    crop_max: float = 0.5,
    min_query_words: int = 4,
) -> tuple[str, str] | None:
    """Two independent random word spans of ``text`` (Contriever's cropping), or None if short.

    Each span's length is ``round(u * n_words)`` with ``u ~ U[crop_min, crop_max]``, at least
    ``min_query_words``; its start is uniform over the valid positions.
    """
    words = text.split()
    n = len(words)
    if n < 2 * min_query_words:
        return None
    out = []
    for _ in range(2):
        length = max(min_query_words, round(float(rng.uniform(crop_min, crop_max)) * n))
        length = min(length, n)
        start = int(rng.integers(0, n - length + 1))
        out.append(" ".join(words[start : start + length]))
    return out[0], out[1]


def make_pseudo_split(
    passage_ids: Sequence[str],
    passage_texts: Sequence[str],
    config: PseudoConfig | None = None,
    *,
    titles: Sequence[str | None] | None = None,
    bodies: Sequence[str | None] | None = None,
) -> RetrievalSplit:
    """Pseudo-queries of a corpus as a split (see the module docstring).

    Args:
        passage_ids, passage_texts: the corpus (store passage ids and texts, in store order).
        config: recipes, cap and seed.
        titles, bodies: per-passage title and body for ``title`` (None: that recipe never
            applies).

    Returns:
        A ``RetrievalSplit`` named ``pseudo`` (source ``pseudo``, relevance threshold 2): the
        corpus as passages ``0..n-1`` then the new positive texts; one query per pair, query id
        ``"<method>:<source passage id>[#<pass>]"``, ``meta["pairs"]`` counting pairs per recipe.

    Raises:
        ValueError: mismatched lengths, or no passage yields a pair.
    """
    cfg = config or PseudoConfig()
    n = len(passage_texts)
    if len(passage_ids) != n or (titles is not None and len(titles) != n):
        raise ValueError("pseudo: passage ids, texts (and titles) must have the same length")
    rng = np.random.default_rng(cfg.seed)
    b = SplitBuilder("pseudo", PSEUDO_SOURCE, relevance_threshold=2)
    for pid, text in zip(passage_ids, passage_texts, strict=True):
        b.add_passage(f"corpus:{pid}", text)
    order = rng.permutation(n)
    counts = dict.fromkeys(cfg.methods, 0)
    visits = [(p, j, int(row)) for p in range(cfg.passes) for j, row in enumerate(order)]
    for p, j, row in visits:
        if len(b.query_texts) >= cfg.cap:
            break
        text = passage_texts[row]
        tag = f"#{p}" if p else ""
        start = (j + p) % len(cfg.methods)
        for method in cfg.methods[start:] + cfg.methods[:start]:
            pair: tuple[str, str] | None
            if method == "ict":
                pair = inverse_cloze(text, rng, cfg.min_query_words)
            elif method == "title":
                pair = (
                    title_body(titles[row], (bodies or passage_texts)[row])
                    if titles is not None
                    else None
                )
            else:
                pair = random_crops(text, rng, cfg.crop_min, cfg.crop_max, cfg.min_query_words)
            if pair is None:
                continue
            query, positive = pair
            qid = b.add_query(f"{method}:{passage_ids[row]}{tag}", query)
            if cfg.positive == "source":
                b.add_candidate(qid, int(row), 2)
            else:
                pos = b.add_passage(f"{method}:{passage_ids[row]}{tag}", positive)
                b.add_candidate(qid, pos, 2)
                b.add_candidate(qid, int(row), 1)  # folded into grade 2 if the texts coincide
            counts[method] += 1
            break
    if not b.query_texts:
        raise ValueError("pseudo: no passage yielded a pair (texts too short for the recipes)")
    out = b.build()
    out.meta.update({"pairs": counts, "config": asdict(cfg), "corpus_passages": n})
    out.validate()
    return out


def build_pseudo_store(
    store: StoreLike,
    config: PseudoConfig | None = None,
    *,
    encoder: Any = None,
    out_dir: str | Path | None = None,
    titles: Sequence[str | None] | None = None,
    bodies: Sequence[str | None] | None = None,
    progress: bool = True,
) -> tuple[Any, Any]:
    """Make the pseudo split of ``store``'s corpus and embed it once beside the store.

    Args:
        store: an ``EmbeddingStore`` split whose passages are the corpus (e.g. ``train``).
        config: the recipes (:class:`PseudoConfig`).
        encoder: a ``SentenceEncoder``; None loads the store's own encoder (its name; the
            weights fingerprint is checked against the store's).
        out_dir: where to write (default: ``<store root>/pseudo``); the corpus vectors are
            copied from ``store``, never encoded again.
        titles, bodies: per-passage titles / bodies for the ``title`` recipe.
        progress: progress bars.

    Returns:
        ``(pseudo EmbeddingStore, EmbedStats)``; the stats say what was encoded (a re-run with
        the same settings finds the finished store and encodes nothing).

    Raises:
        ValueError: the encoder's fingerprint differs from the store's.
    """
    from treerank.store import EmbeddingStore, embed_split

    split = make_pseudo_split(
        store.passage_ids(), store.passage_texts(), config, titles=titles, bodies=bodies
    )
    if encoder is None:
        from treerank.encoders import DEFAULT_MODEL_NAME, SentenceEncoder
        from treerank.encoders.backend import store_backend
        from treerank.encoders.precision import store_precision

        name = store.encoder_name
        enc_meta = meta_object(store.meta, "encoder")
        encoder = SentenceEncoder(
            None if name in (None, DEFAULT_MODEL_NAME) else name,
            query_prompt=store.query_prompt,
            backend=store_backend(enc_meta),
            precision="bf16" if store_precision(enc_meta) == "bf16" else "fp32",
            bf16_weights=bool(enc_meta.get("bf16_weights")),
            progress=progress,
        )
    if store.encoder_fingerprint and encoder.fingerprint != store.encoder_fingerprint:
        raise ValueError(
            f"{store.path}: embedded with encoder {store.encoder_fingerprint}, the pseudo split "
            f"would use {encoder.fingerprint}"
        )
    out = Path(out_dir) if out_dir is not None else Path(store.path).parent / "pseudo"
    stats = embed_split(split, encoder, out, resume=True, reuse=[store.path], progress=progress)
    return EmbeddingStore.open(out), stats
