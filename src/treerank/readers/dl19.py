"""The TREC Deep Learning 2019 passage pool (``msmarco-trec-dl19/``) -> `RetrievalSplit`.

Files: ``topics.dl19-passage.txt`` (43 judged topics), ``qrels.dl19-passage.txt`` (grades
0-3) and ``retrieve_results/<RUN>/retrieve_results_dl19.json`` (JSON list, one entry per topic:
``{"query", "hits": [{"content", "qid", "docid", "rank", "score"}]}``).

Passages = the union of all runs' hits, de-duplicated by ``docid`` (14,581 passages). A docid's
text is taken from the first run in name order that is not ``REP_LLAMA`` (whose texts differ in
white space for a few hundred hits), REP_LLAMA only when no other run has it. Passage ids follow
first appearance over runs (that order), topics and ranks. Text is kept exactly (mojibake
included). Candidates are each topic's judged passages present in the pool with their grades;
the split's source qrels keep every judgment, those on passages outside the pool included
(evaluation counts them relevant and never retrieved, as ``trec_eval`` does on the run file);
``relevance_threshold = 2`` (the track's convention for MRR and Recall; nDCG uses the grades).
Note this is a pooled mini-corpus: scores compare systems run here, not published figures.
"""

from __future__ import annotations

import json
from pathlib import Path

from treerank.readers.builder import SplitBuilder
from treerank.readers.errors import DataFormatError, decode_utf8
from treerank.readers.split import RetrievalSplit
from treerank.readers.trec import build_judged_split, read_trec_qrels, read_trec_topics

LAST_RESORT_RUNS = ("REP_LLAMA",)


def _one(folder: Path, pattern: str) -> Path:
    found = sorted(folder.glob(pattern))
    if not found:
        raise DataFormatError(folder / pattern, "file not found")
    return found[0]


def pool_run_files(folder: str | Path) -> list[Path]:
    """The run files of a pool folder, in text-preference order (REP_LLAMA last)."""
    root = Path(folder) / "retrieve_results"
    files = sorted(root.glob("*/*.json"))
    if not files:
        raise DataFormatError(root, "no retrieve_results/<RUN>/*.json run files")
    return sorted(files, key=lambda p: (p.parent.name in LAST_RESORT_RUNS, p.parent.name))


def read_pool_passages(run_files: list[Path]) -> dict[str, str]:
    """Union of the runs' hits: docid -> text (first run in the given order wins).

    Raises:
        DataFormatError: unreadable JSON, or an entry/hit lacking the expected keys (names the
            file and the topic entry index).
    """
    texts: dict[str, str] = {}
    for f in run_files:
        try:
            data = json.loads(decode_utf8(f.read_bytes(), f))
        except json.JSONDecodeError as exc:
            raise DataFormatError(f, f"invalid JSON ({exc.msg})", row=exc.lineno) from None
        if not isinstance(data, list):
            raise DataFormatError(f, "expected a JSON list of {query, hits} entries")
        for i, entry in enumerate(data):
            try:
                hits = sorted(entry["hits"], key=lambda h: int(h["rank"]))
                for h in hits:
                    texts.setdefault(str(h["docid"]), h["content"])
            except (TypeError, KeyError, ValueError) as exc:
                raise DataFormatError(
                    f, f"entry lacks hits/docid/content/rank ({exc})", row=i
                ) from None
    return texts


def read_trec_dl_pool(folder: str | Path, split: str = "test") -> RetrievalSplit:
    """Read a TREC DL passage pool folder (the DL19 layout above).

    Args:
        folder: directory with ``topics.*.txt``, ``qrels.*.txt`` and ``retrieve_results/``.
        split: name given to the split.

    Raises:
        DataFormatError: missing files, bad JSON/UTF-8, malformed topics or qrels.
    """
    root = Path(folder)
    if not root.is_dir():
        raise DataFormatError(root, "directory not found")
    topics_path = _one(root, "topics*.txt")
    qrels_path = _one(root, "qrels*.txt")
    runs = pool_run_files(root)
    texts = read_pool_passages(runs)
    b = SplitBuilder(split, "trec-dl", relevance_threshold=2)
    for docid, text in texts.items():
        if not text.strip():
            raise DataFormatError(root, f"empty passage text for docid {docid}")
        b.add_passage(docid, text)
    out = build_judged_split(
        split, "trec-dl", read_trec_topics(topics_path), read_trec_qrels(qrels_path), b
    )
    out.meta.update(
        {
            "topics": str(topics_path),
            "qrels": str(qrels_path),
            "runs": [p.parent.name for p in runs],
            "n_pool_docids": len(texts),
        }
    )
    return out
