"""TREC topics (``qid<TAB>text``) and qrels (``qid iter docid grade``), and a TREC-style split.

A TREC split has no candidate lists: a query's candidates are its judged passages in qrels file
order, labelled with their grades (0 = judged not relevant), so ``K`` is the largest judged set
(see `RetrievalSplit`). Queries without any judgment on a corpus passage are kept, with an
all-padding row (metrics leave them out).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from treerank.readers.builder import SplitBuilder
from treerank.readers.errors import DataFormatError, read_text_lines
from treerank.readers.split import RetrievalSplit


def read_trec_topics(path: str | Path) -> list[tuple[str, str]]:
    """Read ``qid<TAB>text`` lines (``.gz`` allowed) in file order.

    Raises:
        DataFormatError: missing file, bad UTF-8, a line without a tab, an empty query text or
            a repeated query id (names the 1-based line).
    """
    out: list[tuple[str, str]] = []
    seen: set[str] = set()
    for line_no, line in enumerate(read_text_lines(path), start=1):
        if not line.strip():
            continue
        qid, sep, text = line.partition("\t")
        if not sep:
            raise DataFormatError(path, "expected 'qid<TAB>text'", row=line_no)
        qid = qid.strip()
        if not text.strip():
            raise DataFormatError(path, f"empty query (qid {qid})", row=line_no)
        if qid in seen:
            raise DataFormatError(path, f"query id {qid} repeated", row=line_no)
        seen.add(qid)
        out.append((qid, text))
    return out


def read_trec_qrels(path: str | Path) -> list[tuple[str, str, int]]:
    """Read TREC qrels ``qid iter docid grade`` (whitespace-separated) in file order.

    A ``qid docid grade`` three-column file and BEIR's TSV with a ``query-id`` header are also
    accepted. Negative grades are clipped to 0 (not relevant).

    Returns:
        ``[(qid, docid, grade), ...]``.

    Raises:
        DataFormatError: missing file, bad UTF-8, wrong column count, non-integer grade.
    """
    return parse_trec_qrels(read_text_lines(path), path)


def parse_trec_qrels(lines: Sequence[str], path: str | Path) -> list[tuple[str, str, int]]:
    """:func:`read_trec_qrels` on lines already read (``path`` names them in errors)."""
    out: list[tuple[str, str, int]] = []
    for line_no, line in enumerate(lines, start=1):
        parts = line.split()
        if not parts:
            continue
        if line_no == 1 and parts[0].lower() in ("query-id", "qid", "query_id"):
            continue
        if len(parts) == 4:
            qid, _, docid, grade = parts
        elif len(parts) == 3:
            qid, docid, grade = parts
        else:
            raise DataFormatError(
                path, f"expected 'qid iter docid grade', got {len(parts)} fields", line_no
            )
        try:
            g = int(float(grade))
        except ValueError:
            raise DataFormatError(path, f"grade {grade!r} is not a number", line_no) from None
        out.append((qid, docid, max(g, 0)))
    return out


def build_judged_split(
    name: str,
    source: str,
    topics: Sequence[tuple[str, str]],
    qrels: Sequence[tuple[str, str, int]],
    b: SplitBuilder,
    keep_unjudged_queries: bool = True,
) -> RetrievalSplit:
    """Add ``topics`` to builder ``b`` (passages already added) with qrels as candidates.

    Judgments on passages absent from the corpus are dropped and counted in ``meta``. With
    ``keep_unjudged_queries=False`` a topic without any judgment on a corpus passage is left out.
    """
    by_query: dict[str, list[tuple[str, int]]] = {}
    for qid, docid, grade in qrels:
        by_query.setdefault(qid, []).append((docid, grade))
    n_missing = 0
    for qsrc, text in topics:
        judged = by_query.get(qsrc, [])
        if not keep_unjudged_queries and not any(d in b.aliases for d, _ in judged):
            continue
        row = b.add_query(qsrc, text)
        for docid, grade in judged:
            pid = b.aliases.get(docid)
            if pid is None:
                n_missing += 1
                continue
            b.add_candidate(row, pid, grade)
    out = b.build()
    topic_ids = {q for q, _ in topics}
    out.meta.update(
        {
            "n_judgments": len(qrels),
            "n_judgments_on_missing_passages": n_missing,
            "n_judgments_on_unknown_topics": sum(1 for q, _, _ in qrels if q not in topic_ids),
        }
    )
    return out
