"""The Cranfield collection in its original SMART-format tarball (or an unpacked folder).

Files: ``cran.all.1400`` (documents: ``.I`` id, ``.T`` title, ``.A`` authors, ``.B`` source,
``.W`` abstract), ``cran.qry`` (``.I`` number, ``.W`` text; CRLF line endings) and ``cranqrel``
(``qid docid code``).

Conventions (documented choices):

* **Query numbering.** ``cran.qry`` numbers its 225 queries non-consecutively up to 365 while
  ``cranqrel`` numbers them 1..225 *by position*; query source ids are therefore the positions
  ``"1".."225"`` (the ``.I`` number is kept in ``meta["qry_numbers"]``).
* **Grades.** Cleverdon's codes run from 1 (complete answer) to 4 (minimum interest); each
  query also has one ``-1`` line (no interest). treerank grades are ``5 - code`` for codes 1-4
  (complete answer = 4 ... minimum interest = 1) and 0 for ``-1`` (judged, not relevant), with
  relevance threshold 1: every coded reference counts as relevant for MRR and Recall, nDCG uses
  the grades.
* **Text.** A document's passage text is its ``.W`` abstract (which repeats the title) with the
  SMART line wrapping collapsed to single spaces, or its ``.T`` title where the abstract is
  empty (two documents); queries likewise.
"""

from __future__ import annotations

import tarfile
from pathlib import Path

from treerank.readers.builder import SplitBuilder
from treerank.readers.errors import DataFormatError, UniqueIds, decode_utf8, split_lines
from treerank.readers.split import RetrievalSplit
from treerank.readers.trec import build_judged_split

DOCS, QUERIES, QRELS = "cran.all.1400", "cran.qry", "cranqrel"


def _read_member(path: Path, name: str) -> tuple[str, str]:
    """Text of ``name`` from the tarball or folder ``path``, and a display name for errors."""
    if path.is_dir():
        f = path / name
        if not f.is_file():
            raise DataFormatError(f, "file not found (expected the Cranfield SMART files)")
        return decode_utf8(f.read_bytes(), f), str(f)
    try:
        with tarfile.open(path) as tf:
            member = next((m for m in tf.getmembers() if Path(m.name).name == name), None)
            fh = tf.extractfile(member) if member is not None else None
            if fh is None:
                raise DataFormatError(path, f"archive has no member {name!r}")
            display = f"{path}:{member.name}"  # type: ignore[union-attr]
            return decode_utf8(fh.read(), display), display
    except tarfile.TarError as exc:
        raise DataFormatError(path, f"not a readable tar archive ({exc})") from None


def parse_smart(text: str, display: str) -> list[tuple[str, dict[str, str]]]:
    """SMART records: ``[(".I" value, {field letter: text with whitespace collapsed})]``.

    Raises:
        DataFormatError: text before the first ``.I`` line (names the line).
    """
    records: list[tuple[str, dict[str, str]]] = []
    field: str | None = None
    buf: dict[str, list[str]] = {}
    for line_no, line in enumerate(split_lines(text), start=1):
        if line.startswith(".I"):
            buf = {}
            records.append((line[2:].strip(), {}))
            field = None
            continue
        if len(line) >= 2 and line[0] == "." and line[1].isalpha() and line[2:].strip() == "":
            field = line[1]
            continue
        if not records:
            if line.strip():
                raise DataFormatError(display, "text before the first .I record", row=line_no)
            continue
        if field is not None:
            buf.setdefault(field, []).append(line)
            records[-1][1][field] = " ".join(" ".join(buf[field]).split())
    return records


def folder_tarball(path: Path) -> Path | None:
    """The one Cranfield tarball (``cran*.tar.gz`` / ``.tgz`` / ``.tar``) of a folder that does
    not hold the unpacked files (the published layout: the folder holds only the tarball)."""
    if not path.is_dir() or (path / DOCS).is_file():
        return None
    found = sorted(f for pat in ("cran*.tar.gz", "cran*.tgz", "cran*.tar") for f in path.glob(pat))
    return found[0] if len(found) == 1 else None


def read_cranfield(path: str | Path, split: str = "test") -> RetrievalSplit:
    """Read Cranfield (``cran.tar.gz``, a folder with the three files, or a folder holding only
    the tarball) into one split.

    Args:
        path: the original tarball or an unpacked folder.
        split: split name recorded in the result (Cranfield has one).

    Raises:
        DataFormatError: missing file or member, malformed records or qrels (file and line named).
    """
    p = Path(path)
    if not p.exists():
        raise DataFormatError(p, "file or directory not found")
    p = folder_tarball(p) or p
    docs_text, docs_name = _read_member(p, DOCS)
    qry_text, qry_name = _read_member(p, QUERIES)
    rel_text, rel_name = _read_member(p, QRELS)

    b = SplitBuilder(split, "cranfield", relevance_threshold=1)
    n_empty = 0
    doc_ids = UniqueIds(docs_name, "document")
    for rec_no, (doc_id, fields) in enumerate(parse_smart(docs_text, docs_name), start=1):
        doc_ids.add(doc_id, f"record {rec_no}")
        text = fields.get("W") or fields.get("T", "")
        if not text:
            n_empty += 1
            continue
        b.add_passage(doc_id, text)

    topics: list[tuple[str, str]] = []
    numbers: list[str] = []
    for pos, (number, fields) in enumerate(parse_smart(qry_text, qry_name), start=1):
        text = fields.get("W", "")
        if not text:
            raise DataFormatError(qry_name, f"query .I {number} (position {pos}) has no text")
        topics.append((str(pos), text))
        numbers.append(number)

    qrels: list[tuple[str, str, int]] = []
    for line_no, line in enumerate(split_lines(rel_text), start=1):
        parts = line.split()
        if not parts:
            continue
        try:
            qid, docid, code = parts[0], parts[1], int(parts[2])
        except (IndexError, ValueError):
            raise DataFormatError(rel_name, "expected 'qid docid code'", row=line_no) from None
        if code not in (-1, 1, 2, 3, 4):
            raise DataFormatError(rel_name, f"unknown relevance code {code}", row=line_no)
        qrels.append((qid, docid, 0 if code == -1 else 5 - code))

    out = build_judged_split(split, "cranfield", topics, qrels, b)
    out.meta.update({"qry_numbers": numbers, "n_documents_without_text": n_empty})
    return out
