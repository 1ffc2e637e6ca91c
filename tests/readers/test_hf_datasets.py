"""Hugging Face ``datasets`` folders as input, read with pyarrow only: a ``save_to_disk`` folder
and a ``datasets`` cache folder, both built by the real ``datasets`` library from the 10-query
MS MARCO v2.1 sample parquet, read into the same `RetrievalSplit` as the parquet path."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import numpy as np
import pytest

from treerank.readers import detect_format, read_split
from treerank.readers.errors import DataFormatError
from treerank.readers.hf_datasets import hf_arrow_files, read_hf_datasets
from treerank.readers.msmarco import read_msmarco

datasets = pytest.importorskip("datasets")  # in the dev extra: CI installs it


def assert_same_split(a, b) -> None:
    for f in dataclasses.fields(a):
        if f.name == "meta":
            continue
        x, y = getattr(a, f.name), getattr(b, f.name)
        if isinstance(x, np.ndarray):
            assert x.dtype == y.dtype
            np.testing.assert_array_equal(x, y)
        else:
            assert x == y, f.name
    drop = {"files", "format"}
    assert {k: v for k, v in a.meta.items() if k not in drop} == {
        k: v for k, v in b.meta.items() if k not in drop
    }


@pytest.fixture(scope="module")
def hf_folders(msmarco_parquet, tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("hf")
    dd = datasets.load_dataset(
        "parquet",
        data_files={"validation": str(msmarco_parquet), "train": str(msmarco_parquet)},
        cache_dir=str(root / "cache"),
    )
    dd.save_to_disk(str(root / "saved"))
    dd["validation"].save_to_disk(str(root / "saved-one"))
    # the cache of load_dataset: <cache>/<builder>/<config>/<version>/<hash>/<builder>-<split>.arrow
    (info,) = (root / "cache").glob("**/dataset_info.json")
    return {
        "saved": root / "saved",
        "saved-one": root / "saved-one",
        "cache-root": root / "cache",
        "cache": info.parent,
    }


@pytest.mark.parametrize("layout", ["saved", "saved-one", "cache", "cache-root"])
def test_reads_equal_the_parquet_path(hf_folders, msmarco_parquet, layout):
    want = read_msmarco(msmarco_parquet, "validation")
    assert want.n_queries == 10
    got = read_hf_datasets(hf_folders[layout], "validation")
    assert_same_split(got, want)
    assert all(Path(f).suffix == ".arrow" for f in got.meta["files"])


def test_detection_and_read_split(hf_folders, msmarco_parquet):
    assert detect_format(hf_folders["saved"]) == "hf-datasets"
    assert detect_format(hf_folders["cache"]) == "hf-datasets"
    want = read_split(msmarco_parquet, "msmarco", "validation", limit=4)
    got = read_split(hf_folders["saved"], "auto", "validation", limit=4)
    assert got.meta["format"] == "hf-datasets"
    assert_same_split(got, want)
    train = read_split(hf_folders["saved"], "hf-datasets", "train")
    assert train.name == "train" and train.n_queries == 10


def test_errors_name_the_folder(hf_folders, tmp_path):
    with pytest.raises(DataFormatError, match="no split 'test'; it has"):
        hf_arrow_files(hf_folders["saved"], "test")
    with pytest.raises(DataFormatError, match="no Hugging Face datasets folder for split 'test'"):
        hf_arrow_files(hf_folders["cache"], "test")
    two = tmp_path / "two"
    shutil.copytree(hf_folders["cache"], two / "a")
    shutil.copytree(hf_folders["cache"], two / "b")
    with pytest.raises(DataFormatError, match="2 datasets cache folders"):
        hf_arrow_files(two, "validation")
    broken = tmp_path / "broken"
    shutil.copytree(hf_folders["saved-one"], broken)
    next(broken.glob("*.arrow")).write_bytes(b"not arrow")
    with pytest.raises(DataFormatError, match="not a readable Arrow IPC file"):
        read_hf_datasets(broken, "validation")
