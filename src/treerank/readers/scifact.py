"""SciFact in its original CSV export (``scifact.zip``) -> `RetrievalSplit`, with BEIR's splits.

BEIR's SciFact (Thakur et al., 2021, "BEIR: A Heterogeneous Benchmark for Zero-shot Evaluation
of Information Retrieval Models") is rebuilt from the export exactly:

* corpus: every row of ``corpus_train.csv`` (5,183 documents) in file order; BEIR's ``title`` is
  ``title`` and BEIR's ``text`` is the abstract's sentences joined with one space. The column
  ``abstract`` holds the numpy *repr* of a list of sentences (``['s1'\\n 's2' ...]``, no commas),
  parsed literal by literal, so quotes and escapes come back exactly.
* passage text = ``title + " " + text``: the string BEIR's and sentence-transformers' dense
  evaluators embed (``doc["title"] + " " + doc["text"]``) and what BEIR's BM25 indexes (title and
  text). It is what the published nDCG@10 figures (BM25 0.665, all-MiniLM-L6-v2 0.645) score.
* ``test`` split: the unique claims of ``claims_validation.csv`` with their ``cited_doc_ids``
  (300 queries, 339 pairs, identical to ``qrels.beir-v1.0.0-scifact.test.txt``); ``train``:
  the same rule on ``claims_train.csv`` (809 queries, 919 pairs). Grade 1 for every pair.
  (``claims_test.csv`` has no labels; BEIR has no dev split for SciFact.)

Every split carries the full corpus; a query's candidates are its cited documents (K = the
largest cited set).
"""

from __future__ import annotations

import ast
import csv
import io
import re
import zipfile
from pathlib import Path

from treerank.readers.builder import SplitBuilder
from treerank.readers.errors import DataFormatError, decode_utf8
from treerank.readers.split import RetrievalSplit

SCIFACT_SPLITS = {"train": "claims_train.csv", "test": "claims_validation.csv"}
_LITERAL = re.compile(r"""'(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*\"""", re.DOTALL)
_INT = re.compile(r"-?\d+")


def parse_sentence_array(cell: str) -> list[str]:
    """Parse the numpy repr of a string list (``['a'\\n 'b']``) into its strings.

    Raises:
        ValueError: when the cell is not a bracketed list of Python string literals.
    """
    body = cell.strip()
    if not (body.startswith("[") and body.endswith("]")):
        raise ValueError("abstract is not a bracketed list")
    out: list[str] = []
    pos, end = 1, len(body) - 1
    for m in _LITERAL.finditer(body, 1, end):
        if body[pos : m.start()].strip(" \n\r\t,"):
            raise ValueError(f"unexpected text between sentences: {body[pos : m.start()][:40]!r}")
        lit = m.group(0)
        out.append(ast.literal_eval(lit) if "\\" in lit else lit[1:-1])
        pos = m.end()
    if body[pos:end].strip(" \n\r\t,"):
        raise ValueError(f"unexpected text after sentences: {body[pos:end][:40]!r}")
    return out


def _open_member(path: Path, name: str) -> tuple[str, str]:
    """Return (text, display name) of CSV ``name`` from a zip file or a directory."""
    if path.is_dir():
        zipped = path / "scifact.zip"
        if (path / name).is_file():
            f = path / name
            return decode_utf8(f.read_bytes(), f), str(f)
        if zipped.is_file():
            path = zipped
        else:
            raise DataFormatError(path / name, "file not found (nor scifact.zip beside it)")
    if not path.is_file():
        raise DataFormatError(path, "file not found")
    try:
        with zipfile.ZipFile(path) as zf:
            names = {Path(n).name: n for n in zf.namelist()}
            if name not in names:
                raise DataFormatError(path, f"archive has no {name}")
            raw = zf.read(names[name])
    except zipfile.BadZipFile:
        raise DataFormatError(path, "not a zip archive") from None
    display = f"{path}!{name}"
    return decode_utf8(raw, display), display


def _rows(text: str, display: str, required: tuple[str, ...]) -> list[dict[str, str]]:
    """The CSV records as dicts (record ``i``, 1-based after the header, is ``out[i - 1]``).

    Raises:
        DataFormatError: a required column missing from the header, a record with fewer fields
            than the header (names the record), or a CSV syntax error.
    """
    reader = csv.DictReader(io.StringIO(text, newline=""))
    try:
        missing = [c for c in required if c not in (reader.fieldnames or [])]
        if missing:
            raise DataFormatError(display, f"missing column(s) {missing}; has {reader.fieldnames}")
        out = []
        for i, rec in enumerate(reader, start=1):
            short = [c for c in required if rec.get(c) is None]
            if short:
                raise DataFormatError(
                    display, f"record has no value for column(s) {short} (too few fields)", row=i
                )
            out.append(rec)
    except csv.Error as exc:
        raise DataFormatError(display, f"not valid CSV ({exc})", row=reader.line_num) from None
    return out


def read_scifact_corpus(path: str | Path) -> tuple[list[str], list[str], list[str]]:
    """Return (doc ids, titles, BEIR texts) of ``corpus_train.csv``, in file order.

    Raises:
        DataFormatError: missing archive/member, wrong columns, or an unparsable abstract (row =
            1-based CSV record number after the header).
    """
    text, display = _open_member(Path(path), "corpus_train.csv")
    ids, titles, texts = [], [], []
    for i, rec in enumerate(_rows(text, display, ("doc_id", "title", "abstract")), start=1):
        try:
            sentences = parse_sentence_array(rec["abstract"])
        except (ValueError, SyntaxError) as exc:
            raise DataFormatError(display, f"abstract: {exc}", row=i) from None
        ids.append(rec["doc_id"].strip())
        titles.append(rec["title"])
        texts.append(" ".join(sentences))
    return ids, titles, texts


def read_scifact_qrels(
    path: str | Path, split: str
) -> tuple[list[str], list[str], list[list[str]]]:
    """Return (claim ids, claim texts, cited doc ids per claim) for BEIR ``split``.

    Raises:
        DataFormatError: unknown split, missing member, wrong columns, empty claim.
    """
    if split not in SCIFACT_SPLITS:
        raise DataFormatError(
            path, f"unknown SciFact split {split!r}; use {sorted(SCIFACT_SPLITS)}"
        )
    text, display = _open_member(Path(path), SCIFACT_SPLITS[split])
    ids: list[str] = []
    claims: list[str] = []
    cited: list[list[str]] = []
    seen: dict[str, int] = {}
    for i, rec in enumerate(_rows(text, display, ("id", "claim", "cited_doc_ids")), start=1):
        cid = rec["id"].strip()
        if not rec["claim"].strip():
            raise DataFormatError(display, f"empty claim (id {cid})", row=i)
        docs = _INT.findall(rec["cited_doc_ids"])
        if cid in seen:
            j = seen[cid]
            cited[j].extend(d for d in docs if d not in cited[j])
            continue
        seen[cid] = len(ids)
        ids.append(cid)
        claims.append(rec["claim"])
        cited.append(list(dict.fromkeys(docs)))
    return ids, claims, cited


def read_scifact(path: str | Path, split: str = "test") -> RetrievalSplit:
    """Read BEIR's SciFact ``split`` (``"train"`` or ``"test"``) with the full corpus.

    Args:
        path: ``scifact.zip``, or a directory holding it or the extracted CSVs.
        split: ``"test"`` (claims_validation.csv, 300 q) or ``"train"`` (809 q).

    Raises:
        DataFormatError: as `read_scifact_corpus` / `read_scifact_qrels`, or a cited document
            missing from the corpus.
    """
    doc_ids, titles, texts = read_scifact_corpus(path)
    b = SplitBuilder(split, "scifact", relevance_threshold=1)
    by_doc: dict[str, int] = {}
    for d, t, x in zip(doc_ids, titles, texts, strict=True):
        by_doc[d] = b.add_passage(d, f"{t} {x}".strip())
    qids, claims, cited = read_scifact_qrels(path, split)
    for qsrc, claim, docs in zip(qids, claims, cited, strict=True):
        qid = b.add_query(qsrc, claim)
        for d in docs:
            if d not in by_doc:
                raise DataFormatError(path, f"claim {qsrc} cites doc {d} absent from the corpus")
            b.add_candidate(qid, by_doc[d], 1)
    out = b.build()
    out.qrels = [(q, d, 1) for q, docs in zip(qids, cited, strict=True) for d in docs]
    out.meta.update({"path": str(path), "n_documents": len(doc_ids), "text": "title + ' ' + text"})
    return out
