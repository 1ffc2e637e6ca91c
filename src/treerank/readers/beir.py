"""BEIR datasets (``corpus.jsonl``, ``queries.jsonl``, ``qrels/<split>.tsv``) -> split.

Follows BEIR's ``GenericDataLoader`` (Thakur et al., 2021): the split's queries are those in
``qrels/<split>.tsv``, in order of first appearance there; every corpus document is a passage;
passage text = ``(title + " " + text).strip()`` exactly as BEIR's dense models build it (so
``text`` alone when the title is empty). Documents whose title and text are both empty
are skipped (counted in ``meta``). A query's candidates are its judged documents with their
grades (``K`` = the largest judged set). Ids must be unique within ``corpus.jsonl`` and within
``queries.jsonl`` (a repeated ``_id`` is an error naming both lines) and free of white space.

The dataset is a folder or a **zip** as BEIR distributes it (``scifact.zip`` holds
``scifact/corpus.jsonl``, ...): members are read from the archive without extracting it. All
qrels splits share one corpus: the parsed corpus is kept for the next split of the same file
(:func:`beir_splits` lists them), and the store reuses passage vectors across splits, so each
passage is read once and embedded once for every split.
"""

from __future__ import annotations

import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path
from typing import IO

from treerank.readers.builder import SplitBuilder
from treerank.readers.errors import (
    DataFormatError,
    UniqueIds,
    check_id,
    decode_utf8,
    iter_jsonl,
    require_file,
    split_lines,
)
from treerank.readers.split import RetrievalSplit
from treerank.readers.trec import build_judged_split, parse_trec_qrels, read_trec_qrels

__all__ = ["BeirFiles", "beir_passage_text", "beir_splits", "is_beir_zip", "read_beir"]


def beir_passage_text(title: str | None, text: str | None) -> str:
    """BEIR's passage string ``(title + " " + text).strip()`` (BEIR's ``SentenceBERT`` model)."""
    return f"{title or ''} {text or ''}".strip()


def _zip_prefix(names: list[str]) -> str | None:
    """The folder inside a zip that holds ``corpus.jsonl`` (shallowest), ``""`` at the top."""
    hits = sorted((n for n in names if n.rsplit("/", 1)[-1] == "corpus.jsonl"), key=len)
    return hits[0][: -len("corpus.jsonl")] if hits else None


def is_beir_zip(path: str | Path) -> bool:
    """True when ``path`` is a zip archive holding a BEIR ``corpus.jsonl``."""
    try:
        with zipfile.ZipFile(path) as zf:
            return _zip_prefix(zf.namelist()) is not None
    except (zipfile.BadZipFile, OSError):
        return False


class BeirFiles:
    """The files of one BEIR dataset, in a folder or a zip archive.

    Args:
        path: the dataset folder, or a ``.zip`` holding it (at any depth).

    Raises:
        DataFormatError: the path is missing, or a zip without ``corpus.jsonl``.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.prefix: str | None = None
        if self.path.is_dir():
            return
        if not self.path.is_file():
            raise DataFormatError(self.path, "directory or zip file not found")
        try:
            with zipfile.ZipFile(self.path) as zf:
                self.prefix = _zip_prefix(zf.namelist())
        except zipfile.BadZipFile:
            raise DataFormatError(self.path, "neither a directory nor a zip archive") from None
        if self.prefix is None:
            raise DataFormatError(self.path, "zip archive without a BEIR corpus.jsonl")

    @property
    def is_zip(self) -> bool:
        return self.prefix is not None

    def name(self, rel: str) -> Path:
        """How member ``rel`` is named in messages: ``folder/rel`` or ``archive.zip/prefix/rel``."""
        return self.path / f"{self.prefix or ''}{rel}"

    @contextmanager
    def open(self, rel: str) -> Iterator[IO[bytes]]:
        """Open member ``rel`` (e.g. ``"qrels/test.tsv"``) for binary reading.

        Raises:
            DataFormatError: the member does not exist.
        """
        if self.prefix is None:
            p = require_file(self.path / rel)  # a directory there is "not a regular file"
            with open(p, "rb") as f:
                yield f
            return
        with zipfile.ZipFile(self.path) as zf:
            try:
                member = zf.open(self.prefix + rel)
            except KeyError:
                raise DataFormatError(self.name(rel), "file not found in the zip") from None
            with member:
                yield member

    def qrels(self, split: str) -> list[tuple[str, str, int]]:
        """The qrels of ``split`` (``qrels/<split>.tsv``)."""
        rel = f"qrels/{split}.tsv"
        if self.prefix is None:
            return read_trec_qrels(self.path / rel)
        with self.open(rel) as f:
            raw = f.read()
        return parse_trec_qrels(split_lines(decode_utf8(raw, self.name(rel))), self.name(rel))

    def splits(self) -> list[str]:
        """Names of the qrels splits present, sorted."""
        if self.prefix is None:
            return sorted(p.stem for p in (self.path / "qrels").glob("*.tsv"))
        with zipfile.ZipFile(self.path) as zf:
            lead = f"{self.prefix}qrels/"
            return sorted(
                n[len(lead) : -4]
                for n in zf.namelist()
                if n.startswith(lead) and n.endswith(".tsv") and "/" not in n[len(lead) :]
            )


def beir_splits(path: str | Path) -> list[str]:
    """The qrels splits of a BEIR folder or zip (``["dev", "train"]`` for SQuAD)."""
    return BeirFiles(path).splits()


@lru_cache(maxsize=2)
def _corpus(
    path: str, mtime_ns: int, size: int
) -> tuple[tuple[tuple[str, str], ...], int, tuple[int, ...]]:
    """``((doc id, passage text), ...)``, the count of empty documents and the lines of the
    documents without a ``text`` field (kept as their title only), read once per file version
    (the key changes when the file does)."""
    files = BeirFiles(path)
    docs: list[tuple[str, str]] = []
    n_empty = 0
    no_text: list[int] = []
    corpus_path = files.name("corpus.jsonl")
    ids = UniqueIds(corpus_path, "document")
    with files.open("corpus.jsonl") as f:
        for line_no, rec in iter_jsonl(corpus_path, ("_id",), stream=f):
            doc_id = check_id(str(rec["_id"]), corpus_path, line_no, "document")
            ids.add(doc_id, line_no)
            text = beir_passage_text(rec.get("title"), rec.get("text"))
            if not text:
                n_empty += 1
                continue
            if "text" not in rec:
                no_text.append(line_no)
            docs.append((doc_id, text))
    return tuple(docs), n_empty, tuple(no_text)


def _corpus_key(files: BeirFiles) -> tuple[str, int, int]:
    p = files.path if files.is_zip else files.path / "corpus.jsonl"
    try:
        st = p.stat()
    except OSError:
        raise DataFormatError(p, "file not found") from None
    return str(files.path.resolve()), st.st_mtime_ns, st.st_size


def read_beir(folder: str | Path, split: str = "test") -> RetrievalSplit:
    """Read BEIR ``split`` from a dataset folder or zip.

    Raises:
        DataFormatError: missing files, bad JSON/UTF-8 (file and line named; a zip member is
            named ``archive.zip/member``), empty query text, a qrels query id absent from
            ``queries.jsonl``, a repeated ``_id`` in the corpus or queries (both lines named),
            an id with white space.
    """
    files = BeirFiles(folder)
    qrels_name = files.name(f"qrels/{split}.tsv")
    qrels = files.qrels(split)
    if not qrels:
        raise DataFormatError(
            qrels_name,
            "no judgments (an empty file or a header line only): the split has no queries",
        )
    docs, n_empty, no_text = _corpus(*_corpus_key(files))
    b = SplitBuilder(split, "beir", relevance_threshold=1)
    for doc_id, text in docs:
        b.add_passage(doc_id, text)
    wanted = list(dict.fromkeys(q for q, _, _ in qrels))
    wanted_set = set(wanted)
    texts: dict[str, str] = {}
    queries_path = files.name("queries.jsonl")
    query_ids = UniqueIds(queries_path, "query")
    with files.open("queries.jsonl") as f:
        for line_no, rec in iter_jsonl(queries_path, ("_id", "text"), stream=f):
            qid = str(rec["_id"])
            query_ids.add(qid, line_no)
            if qid in wanted_set:
                if not isinstance(rec["text"], str) or not rec["text"].strip():
                    raise DataFormatError(queries_path, f"empty query (_id {qid})", row=line_no)
                texts[qid] = rec["text"]
    missing = [q for q in wanted if q not in texts]
    if missing:
        raise DataFormatError(
            qrels_name,
            f"{len(missing)} query id(s) absent from {queries_path.name}, e.g. {missing[0]}",
        )
    out = build_judged_split(split, "beir", [(q, texts[q]) for q in wanted], qrels, b)
    out.meta.update({"path": str(files.path), "n_empty_documents_skipped": n_empty})
    if no_text:
        out.meta.update(
            {
                "corpus_file": str(files.name("corpus.jsonl")),
                "n_documents_without_text": len(no_text),
                "rows_without_text": list(no_text[:5]),
            }
        )
    if files.is_zip:
        out.meta["zip_member_prefix"] = files.prefix
    return out
