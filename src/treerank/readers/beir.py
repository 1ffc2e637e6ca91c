"""BEIR dataset folders (``corpus.jsonl``, ``queries.jsonl``, ``qrels/<split>.tsv``) -> split.

Follows BEIR's ``GenericDataLoader`` (Thakur et al., 2021): the split's queries are those in
``qrels/<split>.tsv``, in order of first appearance there; every corpus document is a passage;
passage text = ``(title + " " + text).strip()`` exactly as BEIR's dense models build it (so
``text`` alone when the title is empty). Documents whose title and text are both empty
are skipped (counted in ``meta``). A query's candidates are its judged documents with their
grades (``K`` = the largest judged set). Ids must be unique within ``corpus.jsonl`` and within
``queries.jsonl`` (a repeated ``_id`` is an error naming both lines) and free of white space.
"""

from __future__ import annotations

from pathlib import Path

from treerank.readers.builder import SplitBuilder
from treerank.readers.errors import DataFormatError, UniqueIds, check_id, iter_jsonl
from treerank.readers.split import RetrievalSplit
from treerank.readers.trec import build_judged_split, read_trec_qrels


def beir_passage_text(title: str | None, text: str | None) -> str:
    """BEIR's passage string ``(title + " " + text).strip()`` (BEIR's ``SentenceBERT`` model)."""
    return f"{title or ''} {text or ''}".strip()


def read_beir(folder: str | Path, split: str = "test") -> RetrievalSplit:
    """Read BEIR ``split`` from ``folder``.

    Raises:
        DataFormatError: missing files, bad JSON/UTF-8 (file and line named), empty query text,
            a qrels query id absent from ``queries.jsonl``, a repeated ``_id`` in the corpus or
            queries, an id with white space.
    """
    root = Path(folder)
    if not root.is_dir():
        raise DataFormatError(root, "directory not found")
    qrels_path = root / "qrels" / f"{split}.tsv"
    qrels = read_trec_qrels(qrels_path)
    b = SplitBuilder(split, "beir", relevance_threshold=1)
    n_empty = 0
    corpus_path = root / "corpus.jsonl"
    corpus_ids = UniqueIds(corpus_path, "document")
    for line_no, rec in iter_jsonl(corpus_path, ("_id",)):
        doc_id = check_id(str(rec["_id"]), corpus_path, line_no, "document")
        corpus_ids.add(doc_id, line_no)
        text = beir_passage_text(rec.get("title"), rec.get("text"))
        if not text:
            n_empty += 1
            continue
        b.add_passage(doc_id, text)
    wanted = list(dict.fromkeys(q for q, _, _ in qrels))
    wanted_set = set(wanted)
    texts: dict[str, str] = {}
    queries_path = root / "queries.jsonl"
    query_ids = UniqueIds(queries_path, "query")
    for line_no, rec in iter_jsonl(queries_path, ("_id", "text")):
        qid = str(rec["_id"])
        query_ids.add(qid, line_no)
        if qid in wanted_set:
            if not isinstance(rec["text"], str) or not rec["text"].strip():
                raise DataFormatError(queries_path, f"empty query (_id {qid})", row=line_no)
            texts[qid] = rec["text"]
    missing = [q for q in wanted if q not in texts]
    if missing:
        raise DataFormatError(
            qrels_path,
            f"{len(missing)} query id(s) absent from {queries_path.name}, e.g. {missing[0]}",
        )
    out = build_judged_split(split, "beir", [(q, texts[q]) for q in wanted], qrels, b)
    out.meta.update({"path": str(root), "n_empty_documents_skipped": n_empty})
    return out
