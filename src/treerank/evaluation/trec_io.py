"""TREC run and qrels files: read and write.

- Run: one line per retrieved passage, ``qid Q0 pid rank score tag``, ranks from 1, best first.
  Scores are written so that the file gives ``trec_eval`` (which reads scores as float32 and
  re-sorts by score, ties by descending doc id) exactly treerank's order: every float32 score
  in its shortest text that reads back to the same float32, and where treerank broke a tie by
  passage id (or a passage stands for several source ids) the later entries are written one
  float32 step below the previous one, so the written scores strictly decrease
  (:func:`trec_scores`).
- Qrels: ``qid 0 pid grade`` (the second column is ignored on read).

Ids are the source ids (strings) of the store; conversion to row numbers goes through the id
lists of the split. An id holding white space cannot be written (it would read back as two
columns): the writers raise. Writes are atomic (temporary file, then ``os.replace``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

from treerank.atomic import atomic_write_text
from treerank.kernels.vectors import Scores
from treerank.metrics.qrels import Qrels
from treerank.search.run import Run


def trec_scores(scores: Scores) -> list[str]:
    """Score texts of one ranked row for a TREC run file (see the module doc).

    ``trec_eval`` (and pytrec_eval, ir-measures' default provider) holds scores as float32 and
    breaks equal scores by descending doc id, so a tie treerank broke by ascending passage id
    would come back reversed. Each score is written as the shortest text that reads back to its
    float32; a score not below the previous written one (a tie) is written one float32 step
    below it instead.

    Args:
        scores: ``float32 (k,)`` non-increasing scores of one query's ranking.

    Returns:
        ``k`` strings, strictly decreasing as float32; equal to the input scores except at ties,
        which move down by as few float32 steps as keep the order.
    """
    s = np.asarray(scores, np.float32) + np.float32(0)  # -0.0 -> 0.0
    if s.size == 0:
        return []
    # order-preserving integer image of float32 (consecutive floats differ by 1), so "one
    # float32 step below the previous written score" is "- 1": w_i = min(s_i, w_{i-1} - 1), in
    # closed form a running minimum of s_j + j, minus i
    b = s.view(np.int32).astype(np.int64)
    order = np.where(b < 0, (b ^ 0x7FFFFFFF) + 1, b)  # -0.0 skipped: 0.0 -> 0, -1e-45 -> -1
    pos = np.arange(s.size, dtype=np.int64)
    w = np.minimum.accumulate(order + pos) - pos
    w = np.where(w < 0, (w - 1) ^ 0x7FFFFFFF, w).astype(np.int32).view(np.float32)
    return [_float32_text(x) for x in w]


def _float32_text(x: np.float32) -> str:
    """Shortest decimal text that reads back (as float32) to ``x``."""
    if 1e-4 <= abs(x) < 1e16 or x == 0:
        return np.format_float_positional(x, unique=True, trim="-")
    return np.format_float_scientific(x, unique=True, trim="-")


def _check_ids(ids: Sequence[str], what: str, path: str | Path) -> None:
    bad = next((i for i in ids if not i or any(c.isspace() for c in i)), None)
    if bad is not None:
        raise ValueError(
            f"{path}: {what} id {bad!r} is empty or holds white space; a TREC file cannot hold "
            "it unambiguously"
        )


def write_trec_run(
    path: str | Path,
    run: Run,
    query_ids: Sequence[str],
    passage_ids: Sequence[str],
    tag: str | None = None,
) -> Path:
    """Write ``run`` as a TREC run file (padding ``-1`` skipped).

    Args:
        path: output file.
        run: the run; row ``i`` is query ``query_ids[i]``.
        query_ids, passage_ids: source ids of the split's queries / passages.
        tag: run tag (last column); defaults to ``run.name`` with spaces replaced.

    Raises:
        ValueError: ``len(query_ids)`` differs from the run's rows, or an id holds white space.
    """
    if len(query_ids) != run.n_queries:
        raise ValueError(f"{path}: {len(query_ids)} query ids for a run of {run.n_queries} rows")
    tag = (tag or run.name or "treerank").replace(" ", "_")
    _check_ids(query_ids, "query", path)
    _check_ids(passage_ids, "passage", path)

    def lines() -> Iterable[str]:
        for i, qid in enumerate(query_ids):
            n = int((run.ids[i] >= 0).sum())
            texts = trec_scores(run.scores[i, :n])
            for r, (pid, s) in enumerate(zip(run.ids[i, :n].tolist(), texts, strict=True)):
                yield f"{qid} Q0 {passage_ids[pid]} {r + 1} {s} {tag}\n"

    return atomic_write_text(path, lines())


def read_trec_run(path: str | Path) -> dict[str, list[tuple[str, float]]]:
    """Read a TREC run file into ``{qid: [(pid, score), ...]}`` in rank order.

    Rows are ordered by the rank column (ties in rank keep file order).

    Raises:
        FileNotFoundError: missing file. ValueError: a malformed line (file and line number).
    """
    path = Path(path)
    rows: dict[str, list[tuple[int, str, float]]] = {}
    with path.open(encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            parts = line.split()
            if not parts:
                continue
            if len(parts) != 6:
                raise ValueError(f"{path}:{n}: expected 'qid Q0 pid rank score tag', got {line!r}")
            try:
                rank, score = int(parts[3]), float(parts[4])
            except ValueError:
                raise ValueError(f"{path}:{n}: rank/score not numeric in {line!r}") from None
            rows.setdefault(parts[0], []).append((rank, parts[2], score))
    return {q: [(p, s) for _, p, s in sorted(r, key=lambda t: t[0])] for q, r in rows.items()}


def run_from_dict(
    name: str,
    ranking: dict[str, list[tuple[str, float]]],
    query_ids: Sequence[str],
    passage_index: dict[str, int],
    k: int | None = None,
) -> Run:
    """Turn ``{qid: [(pid, score), ...]}`` into a :class:`Run` aligned to ``query_ids``.

    Passages absent from ``passage_index`` are dropped (they are not in the split); queries absent
    from ``ranking`` get an empty (all ``-1``) row. The first occurrence of a repeated passage is
    kept.
    """
    rows = []
    for q in query_ids:
        seen: set[int] = set()
        row = []
        for p, s in ranking.get(q, []):
            pid = passage_index.get(p)
            if pid is not None and pid not in seen:
                seen.add(pid)
                row.append((pid, s))
        rows.append(row[:k] if k else row)
    width = max((len(r) for r in rows), default=0)
    if k:
        width = k
    ids = np.full((len(query_ids), width), -1, np.int64)
    scores = np.full((len(query_ids), width), -np.inf, np.float32)
    for i, r in enumerate(rows):
        if r:
            ids[i, : len(r)] = [p for p, _ in r]
            scores[i, : len(r)] = [s for _, s in r]
    return Run(name, ids, scores)


def read_qrels(path: str | Path) -> dict[str, dict[str, int]]:
    """Read TREC qrels ``qid iter pid grade`` into ``{qid: {pid: grade}}``.

    Raises:
        FileNotFoundError: missing file. ValueError: a malformed line, or a (query, doc) judged
            twice with different grades (file and line number).
    """
    path = Path(path)
    out: dict[str, dict[str, int]] = {}
    with path.open(encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            parts = line.split()
            if not parts:
                continue
            if len(parts) != 4:
                raise ValueError(f"{path}:{n}: expected 'qid 0 pid grade', got {line!r}")
            try:
                grade = int(parts[3])
            except ValueError:
                raise ValueError(f"{path}:{n}: grade not an integer in {line!r}") from None
            row = out.setdefault(parts[0], {})
            if row.setdefault(parts[2], grade) != grade:
                raise ValueError(
                    f"{path}:{n}: query {parts[0]} judges {parts[2]} twice with different grades "
                    f"({row[parts[2]]} and {grade}); trec_eval refuses such qrels"
                )
    return out


def write_qrels(
    path: str | Path, qrels: Qrels, query_ids: Sequence[str], passage_ids: Sequence[str]
) -> Path:
    """Write the judgments with grade > 0 of ``qrels`` as a TREC qrels file."""
    if len(query_ids) != qrels.n_queries:
        raise ValueError(f"{path}: {len(query_ids)} query ids for {qrels.n_queries} qrels rows")
    keys, grades = qrels.index()
    _check_ids(query_ids, "query", path)
    _check_ids(passage_ids, "passage", path)

    def lines() -> Iterable[str]:
        for key, g in zip(keys.tolist(), grades.tolist(), strict=True):
            yield f"{query_ids[key >> 32]} 0 {passage_ids[key & 0xFFFFFFFF]} {g}\n"

    return atomic_write_text(path, lines())
