"""TREC topics (``qid<TAB>text``) and qrels (``qid iter docid grade``), and a TREC-style split.

A TREC split has no candidate lists: a query's candidates are its judged passages in qrels file
order, labelled with their grades (0 = judged not relevant), so ``K`` is the largest judged set
(see `RetrievalSplit`). The split also keeps the source's own judgments (``RetrievalSplit.qrels``),
including those on documents absent from the corpus: evaluation scores runs against them, as
``trec_eval`` would on the written run file (an absent document is relevant and never retrieved).

Ids are checked on read: a query or document id with white space is rejected (a TREC run file
could not hold it), a repeated topic id is rejected naming both lines, and the same (query,
document) judged twice is rejected when the grades differ (``trec_eval`` refuses such qrels); an
identical repeated judgment is read once.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from treerank.readers.builder import SplitBuilder
from treerank.readers.errors import DataFormatError, UniqueIds, check_id, read_text_lines
from treerank.readers.split import RetrievalSplit


def read_trec_topics(path: str | Path) -> list[tuple[str, str]]:
    """Read ``qid<TAB>text`` lines (``.gz`` allowed) in file order.

    Raises:
        DataFormatError: missing file, bad UTF-8, a line without a tab, an empty query text, a
            query id with white space, or a repeated query id (names both 1-based lines).
    """
    out: list[tuple[str, str]] = []
    seen = UniqueIds(path, "query")
    for line_no, line in enumerate(read_text_lines(path), start=1):
        if not line.strip():
            continue
        qid, sep, text = line.partition("\t")
        if not sep:
            raise DataFormatError(path, "expected 'qid<TAB>text'", row=line_no)
        qid = check_id(qid.strip(), path, line_no, "query")
        if not text.strip():
            raise DataFormatError(path, f"empty query (qid {qid})", row=line_no)
        seen.add(qid, line_no)
        out.append((qid, text))
    return out


def read_trec_qrels(path: str | Path) -> list[tuple[str, str, int]]:
    """Read TREC qrels ``qid iter docid grade`` (whitespace-separated) in file order.

    A ``qid docid grade`` three-column file and BEIR's TSV with a ``query-id`` header are also
    accepted. A line holding a tab is split on tabs only (BEIR's TSV), so a document id with a
    space is read whole, and then rejected (see the module doc). Negative grades are clipped to
    0 (not relevant). A (query, document) pair judged twice with the same grade is kept once.

    Returns:
        ``[(qid, docid, grade), ...]``, each pair once.

    Raises:
        DataFormatError: missing file, bad UTF-8, wrong column count, non-integer grade, an id
            with white space, or a pair judged twice with different grades (both lines named).
    """
    return parse_trec_qrels(read_text_lines(path), path)


def parse_trec_qrels(lines: Sequence[str], path: str | Path) -> list[tuple[str, str, int]]:
    """:func:`read_trec_qrels` on lines already read (``path`` names them in errors)."""
    out: list[tuple[str, str, int]] = []
    seen: dict[tuple[str, str], tuple[int, int]] = {}
    for line_no, line in enumerate(lines, start=1):
        if "\t" in line:
            parts = [p.strip() for p in line.split("\t")]
            if parts and parts[-1] == "":
                parts.pop()
        else:
            parts = line.split()
        if not parts or not any(parts):
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
        check_id(qid, path, line_no, "query")
        check_id(docid, path, line_no, "document")
        g = max(g, 0)
        prev = seen.setdefault((qid, docid), (g, line_no))
        if prev[1] != line_no:
            if prev[0] != g:
                raise DataFormatError(
                    path,
                    f"query {qid} judges document {docid} twice with different grades "
                    f"({prev[0]} on line {prev[1]}, {g} on line {line_no})",
                    line_no,
                )
            continue
        out.append((qid, docid, g))
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

    Judgments on passages absent from the corpus get no candidate slot but stay in the split's
    source qrels (``out.qrels``; evaluation counts them relevant and not retrieved); both they
    and judgments on unknown topics are counted in ``meta``. With
    ``keep_unjudged_queries=False`` a topic without any judgment is left out.
    """
    by_query: dict[str, list[tuple[str, int]]] = {}
    for qid, docid, grade in qrels:
        by_query.setdefault(qid, []).append((docid, grade))
    n_missing = 0
    for qsrc, text in topics:
        judged = by_query.get(qsrc, [])
        if not keep_unjudged_queries and not judged:
            continue
        row = b.add_query(qsrc, text)
        for docid, grade in judged:
            pid = b.aliases.get(docid)
            if pid is None:
                n_missing += 1
                continue
            b.add_candidate(row, pid, grade)
    out = b.build()
    out.qrels = [(q, d, g) for q in out.query_ids for d, g in by_query.get(q, [])]
    topic_ids = {q for q, _ in topics}
    out.meta.update(
        {
            "n_judgments": len(qrels),
            "n_judgments_on_missing_passages": n_missing,
            "n_judgments_on_unknown_topics": sum(1 for q, _, _ in qrels if q not in topic_ids),
        }
    )
    return out
