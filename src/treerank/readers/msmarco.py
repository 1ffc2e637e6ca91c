"""MS MARCO v2.1 (Hugging Face ``microsoft/ms_marco``, config ``v2.1``) -> `RetrievalSplit`.

Accepted inputs:

* one parquet file with the HF schema (``query_id``, ``query``, ``query_type``, ``passages`` =
  struct of lists ``is_selected`` / ``passage_text`` / ``url``);
* a directory of parquet shards (``*.parquet``, read in name order; when ``split`` is given and
  some shard names start with it, e.g. ``validation-00000-of-00001.parquet``, only those);
* JSON Lines (one HF row per line) or a JSON file holding a list of rows, or the original
  MS MARCO column-oriented JSON (``{"query": {"0": ...}, "passages": {"0": [{...}, ...]}}``);
  in JSON, ``passages`` may be the HF struct of lists or a list of per-passage objects.

``is_selected = -1`` (the public test split: no labels) is read as unlabelled, grade 0, and
counted in ``meta["n_unlabelled_passages"]``; a query id repeated across rows is an error.

Each query keeps its (up to 10) shown passages in their original slots; an empty passage text
is skipped and its slot left at ``-1`` (as the original Go ``cmd/embed`` tool does). Passages are
de-duplicated by exact text across the whole split (real MS MARCO repeats passages across
queries); a passage's source id is ``"<query_id>:<slot>"`` of its first occurrence.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from treerank.readers.builder import SplitBuilder
from treerank.readers.errors import (
    DataFormatError,
    check_id,
    decode_utf8,
    iter_jsonl,
    require_file,
)
from treerank.readers.split import RetrievalSplit

MSMARCO_K = 10
_COLUMNS = ["query_id", "query", "query_type", "passages"]


def msmarco_files(path: str | Path, split: str | None = None) -> list[Path]:
    """The data files behind ``path`` (a file, or a directory of parquet shards).

    Raises:
        DataFormatError: missing path or a directory without ``*.parquet`` / ``*.jsonl`` files.
    """
    p = Path(path)
    if not p.exists():
        raise DataFormatError(p, "file or directory not found")
    if p.is_file():
        return [p]
    files = sorted(p.glob("*.parquet")) or sorted(p.glob("*.jsonl")) or sorted(p.glob("*.json"))
    if not files:
        raise DataFormatError(p, "directory holds no *.parquet, *.jsonl or *.json files")
    if split:
        chosen = [f for f in files if f.name.startswith(split)]
        files = chosen or files
    return files


def _iter_parquet(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(path)
    except Exception as exc:  # pyarrow raises several types for non-parquet bytes
        raise DataFormatError(path, f"not a readable parquet file ({exc})") from None
    cols = _columns(path, set(pf.schema_arrow.names))
    yield from _numbered(pf.iter_batches(batch_size=4096, columns=cols), cols)


def _iter_arrow(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """Rows of an Arrow IPC file as written by Hugging Face ``datasets`` (stream format; the
    random-access file format is read too)."""
    import pyarrow as pa

    try:
        source = pa.memory_map(str(path))
        try:
            reader: Any = pa.ipc.open_stream(source)
            batches = iter(reader)
        except pa.ArrowInvalid:
            reader = pa.ipc.open_file(source)
            batches = (reader.get_batch(i) for i in range(reader.num_record_batches))
        names = set(reader.schema.names)
    except Exception as exc:  # pyarrow raises several types for non-arrow bytes
        raise DataFormatError(path, f"not a readable Arrow IPC file ({exc})") from None
    cols = _columns(path, names)
    yield from _numbered(batches, cols)


def _columns(path: Path, names: set[str]) -> list[str]:
    """The columns of :data:`_COLUMNS` a file has; DataFormatError when it lacks one that
    every MS MARCO v2.1 row needs."""
    missing = [c for c in ("query_id", "query", "passages") if c not in names]
    if missing:
        raise DataFormatError(
            path, f"not the MS MARCO v2.1 schema: missing column(s) {missing}; has {sorted(names)}"
        )
    return [c for c in _COLUMNS if c in names]


def _numbered(batches: Iterable[Any], cols: list[str]) -> Iterator[tuple[int, dict[str, Any]]]:
    """``(row number, record)`` of every row of Arrow record ``batches``, ``cols`` only."""
    row = 0
    for batch in batches:
        for rec in batch.select(cols).to_pylist():
            yield row, rec
            row += 1


def _iter_json(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    text = decode_utf8(path.read_bytes(), path)
    stripped = text.lstrip()
    if path.suffix == ".jsonl" or (stripped.startswith("{") and "\n{" in stripped):
        yield from iter_jsonl(path, ())
        return
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise DataFormatError(path, f"invalid JSON ({exc.msg})", row=exc.lineno) from None
    if isinstance(data, list):
        yield from enumerate(data)
    elif isinstance(data, dict) and isinstance(data.get("query"), dict):
        keys = list(data["query"].keys())
        for i, key in enumerate(keys):
            yield i, {c: data[c].get(key) for c in _COLUMNS if isinstance(data.get(c), dict)}
    else:
        raise DataFormatError(path, "JSON must be a list of rows or MS MARCO column-oriented")


def _passages_of(rec: dict[str, Any], path: Path, row: int) -> tuple[list[str], list[int]]:
    passages = rec.get("passages")
    if isinstance(passages, dict):
        texts, selected = passages.get("passage_text"), passages.get("is_selected")
    elif isinstance(passages, list):
        try:
            texts = [p["passage_text"] for p in passages]
            selected = [p["is_selected"] for p in passages]
        except (TypeError, KeyError):
            raise DataFormatError(
                path, "passages must carry passage_text and is_selected", row
            ) from None
    else:
        raise DataFormatError(path, "missing or malformed 'passages'", row)
    if not isinstance(texts, list) or not isinstance(selected, list) or len(texts) != len(selected):
        raise DataFormatError(path, "passages.passage_text / is_selected lengths differ", row)
    grades = []
    for s in selected:
        try:
            g: int | None = int(s)
        except (TypeError, ValueError):
            g = None
        if g is None or g != s and str(g) != s or not -1 <= g <= 255:
            raise DataFormatError(
                path, f"is_selected {s!r} is not -1 (unlabelled), 0, 1 or another grade 0-255", row
            )
        grades.append(g)
    return texts, grades


def read_msmarco(
    path: str | Path, split: str = "validation", limit: int | None = None
) -> RetrievalSplit:
    """Read MS MARCO v2.1 rows into a split (``K`` = 10, grade = ``is_selected``).

    Args:
        path: parquet file, directory of parquet shards, or JSON / JSONL file.
        split: name given to the split (and shard-name filter for directories).
        limit: keep only the first ``limit`` queries (rows), read lazily.

    Returns:
        `RetrievalSplit` with ``query_types`` and ``relevance_threshold = 1``.

    Raises:
        DataFormatError: missing file, wrong schema, empty or non-string query, bad UTF-8/JSON,
            an ``is_selected`` outside -1..255, a repeated query id (both rows named).
    """
    return read_msmarco_files(msmarco_files(path, split), split, limit)


def read_msmarco_files(
    files: list[Path], split: str = "validation", limit: int | None = None
) -> RetrievalSplit:
    """:func:`read_msmarco` on a list of data files (``.parquet``, ``.arrow`` (Arrow IPC, as
    written by Hugging Face ``datasets``), ``.json`` / ``.jsonl``), read in order as one split.

    Raises:
        DataFormatError: as :func:`read_msmarco`.
    """
    b = SplitBuilder(split, "msmarco", relevance_threshold=1)
    n_empty = 0
    n_unlabelled = 0
    n_rows = 0
    first_row: dict[str, tuple[Path, int]] = {}
    for f in files:
        require_file(f)
        rows = {".parquet": _iter_parquet, ".arrow": _iter_arrow}.get(f.suffix, _iter_json)(f)
        for row, rec in rows:
            if limit is not None and n_rows >= limit:
                break
            if not isinstance(rec, dict) or "query" not in rec or "query_id" not in rec:
                raise DataFormatError(f, "row lacks 'query' / 'query_id'", row)
            query = rec["query"]
            if not isinstance(query, str) or not query.strip():
                raise DataFormatError(f, f"empty query (query_id {rec.get('query_id')})", row)
            texts, selected = _passages_of(rec, f, row)
            qsrc = check_id(str(rec["query_id"]), f, row, "query")
            prev = first_row.setdefault(qsrc, (f, row))
            if prev != (f, row):
                raise DataFormatError(
                    f, f"query id {qsrc} repeated (first at {prev[0].name} row {prev[1]})", row
                )
            qid = b.add_query(qsrc, query, str(rec.get("query_type") or ""))
            for slot, (text, sel) in enumerate(zip(texts, selected, strict=True)):
                if not isinstance(text, str) or not text.strip():
                    n_empty += 1
                    b.add_candidate(qid, -1, 0)
                    continue
                if sel < 0:
                    n_unlabelled += 1
                b.add_candidate(qid, b.add_passage(f"{qsrc}:{slot}", text), max(sel, 0))
            n_rows += 1
        if limit is not None and n_rows >= limit:
            break
    longest = max([len(c) for c in b._cands] + [MSMARCO_K])
    out = b.build(k=longest, keep_query_types=True)
    out.meta.update(
        {
            "files": [str(f) for f in files],
            "n_empty_passages_skipped": n_empty,
            "n_unlabelled_passages": n_unlabelled,
            "limit": limit,
        }
    )
    return out
