import tarfile
from pathlib import Path

import numpy as np
import pytest

from treerank.readers import DataFormatError, detect_format, read_split
from treerank.readers.cranfield import parse_smart, read_cranfield


@pytest.fixture(scope="module")
def cran(shared_data: Path):
    return read_cranfield(shared_data / "cranfield" / "cran.tar.gz")


def test_counts_grades_and_renumbering(cran, shared_data: Path) -> None:
    assert detect_format(shared_data / "cranfield" / "cran.tar.gz") == "cranfield"
    # 1,400 documents, two of them (471, 995) with neither title nor abstract
    assert (cran.n_queries, cran.n_passages) == (225, 1398)
    assert cran.meta["n_documents_without_text"] == 2
    # 1,837 qrels lines; the one on document 471 is dropped (no text) and counted
    assert cran.meta["n_judgments"] == 1837
    assert cran.meta["n_judgments_on_missing_passages"] == 1
    grades = cran.labels[cran.candidates >= 0]
    # codes -1,1,2,3,4 -> grades 0,4,3,2,1 (counts from cranqrel: 225, 128, 387, 734 - 1, 363)
    assert np.bincount(grades).tolist() == [225, 363, 733, 387, 128]
    # queries are numbered by position (cranqrel's numbering), the .I numbers kept in meta
    assert cran.query_ids[:4] == ["1", "2", "3", "4"]
    assert cran.meta["qry_numbers"][:4] == ["001", "002", "004", "008"]
    assert cran.query_texts[2].startswith("what problems of heat conduction in composite slabs")
    # qrels line "1 184 2": query 1 judges document 184 with code 2 -> grade 3
    row = cran.candidates[0].tolist().index(cran.passage_aliases["184"])
    assert cran.labels[0, row] == 3
    assert cran.passage_texts[0].startswith(
        "experimental investigation of the aerodynamics of a wing in a slipstream . an"
    )


def test_folder_and_tarball_read_identically(tmp_path: Path, shared_data: Path, cran) -> None:
    with tarfile.open(shared_data / "cranfield" / "cran.tar.gz") as tf:
        tf.extractall(tmp_path, filter="data")
    folder = read_split(tmp_path, "auto")
    assert folder.query_texts == cran.query_texts and folder.passage_texts == cran.passage_texts
    np.testing.assert_array_equal(folder.candidates, cran.candidates)


def test_the_published_folder_holding_only_the_tarball_is_read(shared_data: Path, cran) -> None:
    folder = shared_data / "cranfield"  # as published: cran.tar.gz and nothing else
    assert detect_format(folder) == "cranfield"
    split = read_split(folder, "auto")
    assert split.query_texts == cran.query_texts and split.passage_texts == cran.passage_texts


def test_errors_name_file_and_line(tmp_path: Path, shared_data: Path) -> None:
    with tarfile.open(shared_data / "cranfield" / "cran.tar.gz") as tf:
        tf.extractall(tmp_path, filter="data")
    (tmp_path / "cranqrel").write_text("1 184 2\n1 29 7\n")
    with pytest.raises(DataFormatError, match=r"cranqrel.*2.*unknown relevance code 7"):
        read_cranfield(tmp_path)
    (tmp_path / "cranqrel").unlink()
    with pytest.raises(DataFormatError, match="cranqrel"):
        read_cranfield(tmp_path)
    with pytest.raises(DataFormatError, match="before the first .I"):
        parse_smart("stray\n.I 1\n.W\nx\n", "x.qry")
