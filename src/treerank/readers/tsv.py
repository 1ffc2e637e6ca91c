"""Generic TSV collections: ``collection.tsv`` (``pid<TAB>text``), queries + TREC qrels.

Folder layout (MS MARCO passage-ranking style)::

    collection.tsv                       pid<TAB>text, one passage per line
    queries.<split>.tsv | queries.tsv    qid<TAB>text
    qrels.<split>.tsv|.txt | qrels.tsv|.txt   TREC qrels (qid iter pid grade)

Queries without any judgment are dropped (nothing to evaluate);
candidates are the judged passages with their grades.
"""

from __future__ import annotations

from pathlib import Path

from treerank.readers.builder import SplitBuilder
from treerank.readers.errors import (
    DataFormatError,
    UniqueIds,
    check_id,
    decode_utf8,
    iter_raw_lines,
    require_file,
)
from treerank.readers.split import RetrievalSplit
from treerank.readers.trec import build_judged_split, read_trec_qrels, read_trec_topics


def _first(root: Path, names: list[str]) -> Path:
    for n in names:
        if (root / n).is_file():
            return root / n
    raise DataFormatError(root / names[0], f"file not found (also tried {names[1:]})")


def read_tsv_collection(path: str | Path, b: SplitBuilder) -> int:
    """Add every ``pid<TAB>text`` line of ``path`` to ``b``; return the number of lines read.

    Raises:
        DataFormatError: missing file, bad UTF-8, a line without a tab or with empty text, a
            repeated pid (both lines named) or one with white space.
    """
    p = require_file(path)
    ids = UniqueIds(p, "passage")
    n = 0
    with open(p, "rb") as f:
        for line_no, offset, raw in iter_raw_lines(f):
            line = decode_utf8(raw, p, first_line=line_no, first_byte=offset).rstrip("\r\n")
            if not line:
                continue
            pid, sep, text = line.partition("\t")
            if not sep:
                raise DataFormatError(p, "expected 'pid<TAB>text'", row=line_no)
            if not text.strip():
                raise DataFormatError(p, f"empty passage text (pid {pid})", row=line_no)
            pid = check_id(pid.strip(), p, line_no, "passage")
            ids.add(pid, line_no)
            b.add_passage(pid, text)
            n += 1
    return n


def read_tsv(folder: str | Path, split: str = "test") -> RetrievalSplit:
    """Read a TSV collection folder (layout above) as split ``split``.

    Raises:
        DataFormatError: missing files or malformed lines (file and line named).
    """
    root = Path(folder)
    if not root.is_dir():
        raise DataFormatError(root, "directory not found")
    b = SplitBuilder(split, "tsv", relevance_threshold=1)
    n = read_tsv_collection(root / "collection.tsv", b)
    topics = read_trec_topics(_first(root, [f"queries.{split}.tsv", "queries.tsv"]))
    qrels = read_trec_qrels(
        _first(root, [f"qrels.{split}.tsv", f"qrels.{split}.txt", "qrels.tsv", "qrels.txt"])
    )
    out = build_judged_split(split, "tsv", topics, qrels, b, keep_unjudged_queries=False)
    out.meta.update({"path": str(root), "n_collection_lines": n})
    return out
