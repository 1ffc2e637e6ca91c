"""MS MARCO v2.1 from Hugging Face ``datasets`` folders, read with pyarrow only (no network, no
``datasets`` import).

Two layouts, both holding Arrow IPC stream files with the HF schema (``query_id``, ``query``,
``query_type``, ``passages`` = struct of lists; see :mod:`treerank.readers.msmarco`):

* a folder written by ``DatasetDict.save_to_disk`` (``dataset_dict.json`` + one subfolder per
  split with ``state.json`` and ``data-00000-of-0000N.arrow``) or by ``Dataset.save_to_disk``
  (``state.json`` at the top): the files named in ``state.json``'s ``_data_files``, in order;
* the ``datasets`` cache that ``load_dataset("microsoft/ms_marco", "v2.1")`` fills
  (``~/.cache/huggingface/datasets/microsoft___ms_marco/v2.1/0.0.0/<hash>/`` with
  ``dataset_info.json`` and ``ms_marco-<split>.arrow`` or ``ms_marco-<split>-0000K-of-0000N.arrow``
  shards): pass that folder or any folder above it that holds exactly one such cache
  directory for the split.

The rows are read by :func:`treerank.readers.msmarco.read_msmarco_files`, so the split equals
the one read from the same rows as parquet.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from treerank.readers.errors import DataFormatError
from treerank.readers.msmarco import read_msmarco_files
from treerank.readers.split import RetrievalSplit

__all__ = ["hf_arrow_files", "is_hf_datasets_dir", "read_hf_datasets"]

_MAX_DEPTH = 6


def is_hf_datasets_dir(path: Path) -> bool:
    """Whether ``path`` looks like a ``save_to_disk`` folder or a ``datasets`` cache folder."""
    if (path / "dataset_dict.json").is_file() or (path / "state.json").is_file():
        return True
    return (path / "dataset_info.json").is_file() and any(path.glob("*.arrow"))


def _saved_files(path: Path, split: str) -> list[Path] | None:
    root = path
    if (path / "dataset_dict.json").is_file():
        try:
            splits = list(json.loads((path / "dataset_dict.json").read_text())["splits"])
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            raise DataFormatError(
                path / "dataset_dict.json", f"not a datasets dict ({exc})"
            ) from None
        if split not in splits:
            raise DataFormatError(
                path / "dataset_dict.json", f"no split {split!r}; it has {', '.join(splits)}"
            )
        root = path / split
    state = root / "state.json"
    if not state.is_file():
        return None
    try:
        names = [d["filename"] for d in json.loads(state.read_text())["_data_files"]]
    except (json.JSONDecodeError, KeyError, TypeError) as exc:
        raise DataFormatError(state, f"not a datasets state file ({exc})") from None
    files = [root / n for n in names]
    for f in files:
        if not f.is_file():
            raise DataFormatError(f, f"listed in {state} but missing")
    if not files:
        raise DataFormatError(state, "lists no data files")
    return files


def _cache_files(path: Path, split: str) -> list[Path]:
    pattern = re.compile(rf"^.+-{re.escape(split)}(-\d{{5}}-of-\d{{5}})?\.arrow$")
    found: dict[Path, list[Path]] = {}
    for info in sorted(path.glob("**/dataset_info.json")):
        if len(info.relative_to(path).parts) > _MAX_DEPTH + 1:
            continue
        shards = sorted(f for f in info.parent.glob("*.arrow") if pattern.match(f.name))
        if shards:
            found[info.parent] = shards
    if not found:
        raise DataFormatError(
            path,
            f"no Hugging Face datasets folder for split {split!r}: expected a save_to_disk "
            "folder (dataset_dict.json / state.json) or a datasets cache folder "
            f"(dataset_info.json + *-{split}.arrow)",
        )
    if len(found) > 1:
        raise DataFormatError(
            path,
            f"{len(found)} datasets cache folders hold split {split!r} "
            f"({', '.join(str(d.relative_to(path)) for d in found)}); pass one of them",
        )
    return next(iter(found.values()))


def hf_arrow_files(path: str | Path, split: str = "validation") -> list[Path]:
    """The Arrow files of ``split`` under ``path`` (see the module docstring), in row order.

    Raises:
        DataFormatError: missing path, an unknown split, files listed but missing, no cache
            folder for the split, or several (each named).
    """
    p = Path(path)
    if not p.is_dir():
        raise DataFormatError(p, "not a directory (expected a Hugging Face datasets folder)")
    saved = _saved_files(p, split)
    return saved if saved is not None else _cache_files(p, split)


def read_hf_datasets(
    path: str | Path, split: str = "validation", limit: int | None = None
) -> RetrievalSplit:
    """Read MS MARCO v2.1 rows from a Hugging Face datasets folder (see the module docstring).

    Args:
        path: a ``save_to_disk`` folder or a ``datasets`` cache folder.
        split: the split to read (a ``DatasetDict`` subfolder or the cache's file names).
        limit: keep only the first ``limit`` queries (rows), read lazily.

    Returns:
        The same `RetrievalSplit` as :func:`~treerank.readers.msmarco.read_msmarco` on the
        same rows (``meta["files"]`` names the Arrow files).

    Raises:
        DataFormatError: see :func:`hf_arrow_files` and :func:`read_msmarco_files`.
    """
    return read_msmarco_files(hf_arrow_files(path, split), split, limit)
