"""Input format registry, detection and the one entry point `read_split`."""

from __future__ import annotations

import zipfile
from collections.abc import Callable
from pathlib import Path

from treerank.readers.beir import is_beir_zip, read_beir
from treerank.readers.cranfield import folder_tarball, read_cranfield
from treerank.readers.dl19 import read_trec_dl_pool
from treerank.readers.errors import DataFormatError
from treerank.readers.hf_datasets import is_hf_datasets_dir, read_hf_datasets
from treerank.readers.msmarco import read_msmarco
from treerank.readers.scifact import read_scifact
from treerank.readers.split import RetrievalSplit
from treerank.readers.subset import subset_split
from treerank.readers.tsv import read_tsv

#: format name -> (reader(path, split) -> RetrievalSplit, default split name, description)
FORMATS: dict[str, tuple[Callable[[Path, str], RetrievalSplit], str, str]] = {
    "msmarco": (
        read_msmarco,
        "validation",
        "MS MARCO v2.1 HF schema: parquet file/shard dir, JSON, JSONL",
    ),
    "hf-datasets": (
        read_hf_datasets,
        "validation",
        "MS MARCO v2.1 as Hugging Face datasets Arrow: a save_to_disk folder or a datasets cache",
    ),
    "beir": (
        read_beir,
        "test",
        "BEIR folder or zip: corpus.jsonl, queries.jsonl, qrels/<split>.tsv",
    ),
    "scifact": (read_scifact, "test", "SciFact export scifact.zip (BEIR splits train/test)"),
    "trec-dl": (
        read_trec_dl_pool,
        "test",
        "TREC DL pool: topics, qrels, retrieve_results/<RUN>/*.json",
    ),
    "tsv": (read_tsv, "test", "collection.tsv + queries[.<split>].tsv + TREC qrels"),
    "cranfield": (
        read_cranfield,
        "test",
        "Cranfield SMART: cran.tar.gz, or a folder of its files or of it",
    ),
}


def detect_format(path: str | Path) -> str:
    """Guess the input format from the path's name and contents.

    Raises:
        DataFormatError: the path is missing or matches no format (pass one explicitly).
    """
    p = Path(path)
    if not p.exists():
        raise DataFormatError(p, "file or directory not found")
    if p.is_file():
        if p.suffix in (".parquet", ".jsonl", ".json"):
            return "msmarco"
        if p.name.endswith((".tar.gz", ".tgz", ".tar")) and "cran" in p.name:
            return "cranfield"
        if p.suffix == ".zip":
            try:
                with zipfile.ZipFile(p) as zf:
                    names = zf.namelist()
                if any(n.endswith("corpus_train.csv") for n in names):
                    return "scifact"
                if is_beir_zip(p):
                    return "beir"
            except zipfile.BadZipFile:
                raise DataFormatError(p, "not a zip archive") from None
        raise DataFormatError(
            p, f"cannot detect the format of this file; use one of {sorted(FORMATS)}"
        )
    if (p / "corpus.jsonl").is_file():
        return "beir"
    if is_hf_datasets_dir(p):
        return "hf-datasets"
    if (p / "scifact.zip").is_file() or (p / "corpus_train.csv").is_file():
        return "scifact"
    if (p / "retrieve_results").is_dir():
        return "trec-dl"
    if (p / "cran.all.1400").is_file() or folder_tarball(p) is not None:
        return "cranfield"
    if (p / "collection.tsv").is_file():
        return "tsv"
    if any(p.glob("*.parquet")) or any(p.glob("*.jsonl")):
        return "msmarco"
    raise DataFormatError(
        p, f"cannot detect the format of this directory; use one of {sorted(FORMATS)}"
    )


def read_split(
    path: str | Path,
    fmt: str = "auto",
    split: str | None = None,
    limit: int | None = None,
    max_passages: int | None = None,
) -> RetrievalSplit:
    """Read ``path`` as ``fmt`` (``"auto"``: `detect_format`) into a `RetrievalSplit`.

    Args:
        path: input file or directory.
        fmt: one of `FORMATS` or ``"auto"``.
        split: split name (default per format: ``validation`` for MS MARCO, else ``test``).
        limit: keep the first ``limit`` queries (MS MARCO reads only those rows).
        max_passages: cap the corpus (see `subset_split`); None keeps it whole.

    Raises:
        DataFormatError: unknown format, any reader error (file and row named), or a split
            without a single passage (nothing could be embedded or retrieved).
    """
    name = detect_format(path) if fmt == "auto" else fmt
    if name not in FORMATS:
        raise DataFormatError(path, f"unknown format {fmt!r}; use one of {sorted(FORMATS)} or auto")
    reader, default_split, _ = FORMATS[name]
    split_name = split or default_split
    try:
        if name == "msmarco":
            out = read_msmarco(path, split_name, limit=limit)
        elif name == "hf-datasets":  # MS MARCO rows too: read only the first `limit`
            out = read_hf_datasets(path, split_name, limit=limit)
        else:
            out = reader(Path(path), split_name)
    except DataFormatError as exc:
        # a format given by hand failed on a row: say when the data looks like another format
        # (not for file-level problems, where the guess has nothing to go on)
        if fmt != "auto" and exc.row is not None:
            try:
                guess = detect_format(path)
            except DataFormatError:
                guess = None
            if guess is not None and guess != name:
                exc.args = (f"{exc.args[0]} (this looks like {guess!r} data: pass --format "
                            f"{guess} or auto)",)  # fmt: skip
        raise
    out.meta["format"] = name
    if out.n_passages == 0:
        corpus = Path(path) / "corpus.jsonl"
        raise DataFormatError(
            corpus if corpus.is_file() else path,
            f"no passages in split {split_name!r}: the corpus is empty or every document's "
            "text is empty, so there is nothing to embed or retrieve",
        )
    return subset_split(out, limit, max_passages)
