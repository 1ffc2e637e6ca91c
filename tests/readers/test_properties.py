"""Property tests (Hypothesis): every reader, fed arbitrary bytes or valid-looking rows, either
reads the data or raises `DataFormatError` naming the file (and, for a row problem, a line that
exists in it); never another exception. A bad UTF-8 byte is reported on its true line.

Examples are bounded (``max_examples``) so the file runs in well under a minute on a loaded CPU.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from treerank.readers.beir import read_beir
from treerank.readers.cranfield import read_cranfield
from treerank.readers.errors import DataFormatError
from treerank.readers.msmarco import read_msmarco
from treerank.readers.scifact import read_scifact
from treerank.readers.split import RetrievalSplit
from treerank.readers.trec import read_trec_qrels, read_trec_topics
from treerank.readers.tsv import read_tsv

# 40 fixed (derandomized) examples per test in CI; TREERANK_HYPOTHESIS_EXAMPLES=600 explores
# more, with random seeds, when a reader changes
_EXPLORE = os.environ.get("TREERANK_HYPOTHESIS_EXAMPLES")
FAST = settings(
    max_examples=int(_EXPLORE or 40),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    derandomize=not _EXPLORE,
)

# ---------------------------------------------------------------- valid layouts, one per reader
BEIR = {
    "corpus.jsonl": b'{"_id": "d1", "title": "Coffee", "text": "Beans are roasted."}\n'
    b'{"_id": "d2", "title": "", "text": "Lava flows downhill."}\n',
    "queries.jsonl": b'{"_id": "q1", "text": "roasting coffee"}\n{"_id": "q2", "text": "lava"}\n',
    "qrels/test.tsv": b"query-id\tcorpus-id\tscore\nq1\td1\t1\nq2\td2\t2\n",
}
TSV = {
    "collection.tsv": b"p1\tBeans are roasted.\np2\tLava flows downhill.\n",
    "queries.tsv": b"q1\troasting coffee\nq2\tlava\n",
    "qrels.tsv": b"q1 0 p1 1\nq2 0 p2 1\n",
}
CRANFIELD = {
    "cran.all.1400": b".I 1\n.T\ncoffee\n.W\nbeans are roasted\n.I 2\n.T\nlava\n.W\nlava flows\n",
    "cran.qry": b".I 001\r\n.W\r\nroasting coffee\r\n.I 002\r\n.W\r\nlava\r\n",
    "cranqrel": b"1 1 2\n2 2 1\n2 1 -1\n",
}
SCIFACT = {
    "corpus_train.csv": b"doc_id,title,abstract,structured\n"
    b"1,Coffee,\"['Beans are roasted.' 'Twice.']\",False\n"
    b"2,Lava,\"['Lava flows downhill.']\",False\n",
    "claims_validation.csv": b"id,claim,cited_doc_ids,evidence\n"
    b'1,roasting coffee,[1],x\n2,lava,"[2, 1]",x\n',
}
MSMARCO = {
    "rows.json": json.dumps(
        [
            {
                "query_id": 1,
                "query": "roasting coffee",
                "query_type": "DESCRIPTION",
                "passages": {"passage_text": ["beans", "lava"], "is_selected": [1, 0]},
            }
        ]
    ).encode()
}


def _parquet_bytes() -> bytes:
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq

    buf = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(json.loads(MSMARCO["rows.json"])), buf)
    return buf.getvalue()


MSMARCO_PARQUET = {"rows.parquet": _parquet_bytes()}
TOPICS = {"topics.tsv": b"q1\troasting coffee\nq2\tlava\n"}
QRELS = {"qrels.txt": b"q1 0 d1 1\nq2 0 d2 0\n"}


READERS: dict[str, tuple[dict[str, bytes], Callable[[Path], object]]] = {
    "beir": (BEIR, lambda root: read_beir(root, "test")),
    "tsv": (TSV, lambda root: read_tsv(root, "test")),
    "cranfield": (CRANFIELD, lambda root: read_cranfield(root)),
    "scifact": (SCIFACT, lambda root: read_scifact(root, "test")),
    "msmarco-json": (MSMARCO, lambda root: read_msmarco(root / "rows.json")),
    "msmarco-parquet": (MSMARCO_PARQUET, lambda root: read_msmarco(root / "rows.parquet")),
    "trec-topics": (TOPICS, lambda root: read_trec_topics(root / "topics.tsv")),
    "trec-qrels": (QRELS, lambda root: read_trec_qrels(root / "qrels.txt")),
}
CASES = [(name, member) for name, (layout, _) in READERS.items() for member in layout]


def _write(root: Path, layout: dict[str, bytes]) -> None:
    for rel, data in layout.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)


def _read(name: str, layout: dict[str, bytes]) -> tuple[object | None, DataFormatError | None]:
    """Write ``layout`` to a fresh folder and read it: (result, None) or (None, the error)."""
    _, reader = READERS[name]
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        _write(root, layout)
        try:
            return reader(root), None
        except DataFormatError as exc:
            assert str(exc).startswith(str(exc.path)), exc
            assert exc.problem and "Traceback" not in str(exc)
            return None, exc


def _check_error(exc: DataFormatError, member: str, data: bytes) -> None:
    """A row-level error on ``member`` names a line that exists in it."""
    if exc.row is None or not str(exc.path).endswith(Path(member).name):
        return
    if isinstance(exc.row, int):
        n_lines = data.count(b"\n") + 1
        assert 0 <= exc.row <= n_lines, (exc, n_lines)


@pytest.mark.parametrize("name", list(READERS))
def test_valid_layouts_read(name):
    result, err = _read(name, READERS[name][0])
    assert err is None, err
    if isinstance(result, RetrievalSplit):
        assert result.n_queries >= 1 and result.n_passages >= 1


@pytest.mark.parametrize(("name", "member"), CASES)
@FAST
@given(data=st.binary(max_size=200))
def test_arbitrary_bytes(name, member, data):
    layout = dict(READERS[name][0])
    layout[member] = data
    _, err = _read(name, layout)
    if err is not None:
        _check_error(err, member, data)


LINE_FILES = [
    (n, m)
    for n, m in CASES
    if not m.endswith(".csv") and not n.startswith("msmarco") and n != "cranfield"  # whole files
]


@pytest.mark.parametrize(("name", "member"), LINE_FILES + [("cranfield", "cranqrel")])
@FAST
@given(where=st.integers(min_value=0), byte=st.sampled_from([0xE9, 0xFF, 0x80, 0xC3]))
def test_bad_utf8_names_its_true_line(name, member, where, byte):
    layout = dict(READERS[name][0])
    lines = layout[member].split(b"\n")[:-1]
    i = where % len(lines)
    raw = lines[i]
    pos = len(raw) // 2 if raw else 0
    lines[i] = raw[:pos] + bytes([byte]) + b"x" + raw[pos:]  # 0xC3 + 'x': an invalid sequence
    layout[member] = b"\n".join(lines) + b"\n"
    _, err = _read(name, layout)
    assert err is not None
    assert str(err.path).endswith(Path(member).name), err
    assert err.row == i + 1, err
    assert f"0x{byte:02x}" in str(err)
    offset = sum(len(x) + 1 for x in lines[:i]) + pos
    assert f"at byte {offset} " in str(err), err


# ------------------------------------------------------------------- valid-looking rows (BEIR)
ID = st.text(alphabet="abc1 \t-_é", min_size=0, max_size=4)
TEXT = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=12)
VALUE = st.one_of(TEXT, st.integers(-3, 3), st.none(), st.booleans(), st.lists(TEXT, max_size=2))


@FAST
@given(
    docs=st.lists(st.fixed_dictionaries({"_id": ID, "title": VALUE, "text": VALUE}), max_size=5),
    queries=st.lists(st.fixed_dictionaries({"_id": ID, "text": VALUE}), max_size=4),
    qrels=st.lists(st.tuples(ID, ID, st.integers(-2, 3) | st.text("x1.", max_size=2)), max_size=5),
    header=st.booleans(),
    crlf=st.booleans(),
)
def test_beir_valid_looking_rows(docs, queries, qrels, header, crlf):
    nl = "\r\n" if crlf else "\n"
    layout = {
        "corpus.jsonl": "".join(json.dumps(d) + nl for d in docs).encode(),
        "queries.jsonl": "".join(json.dumps(q) + nl for q in queries).encode(),
        "qrels/test.tsv": (
            ("query-id\tcorpus-id\tscore" + nl if header else "")
            + "".join(f"{q}\t{d}\t{g}{nl}" for q, d, g in qrels)
        ).encode(),
    }
    result, err = _read("beir", layout)
    if err is not None:
        for member, data in layout.items():
            _check_error(err, member, data)
        return
    assert isinstance(result, RetrievalSplit)
    assert set(result.passage_ids) <= {str(d["_id"]) for d in docs}


@FAST
@given(
    rows=st.lists(
        st.tuples(ID, st.text(alphabet="ab \t\r", max_size=5), st.sampled_from(["\t", " ", ""])),
        max_size=5,
    )
)
def test_tsv_and_topics_valid_looking_rows(rows):
    data = "".join(f"{i}{sep}{t}\n" for i, t, sep in rows).encode()
    for name, member in (("tsv", "collection.tsv"), ("trec-topics", "topics.tsv")):
        layout = dict(READERS[name][0])
        layout[member] = data
        _, err = _read(name, layout)
        if err is not None:
            _check_error(err, member, data)


def test_error_messages_name_line_of_bad_byte_in_real_layout(tmp_path):
    """The trial's case: 0xe9 on line 5 of corpus.jsonl is reported as row 5, not row 1."""
    lines = [json.dumps({"_id": f"d{i}", "text": f"passage {i}"}) for i in range(1, 8)]
    layout = dict(BEIR)
    raw = [x.encode() for x in lines]
    raw[4] = raw[4].replace(b"passage", b"caf\xe9 passage")
    layout["corpus.jsonl"] = b"\n".join(raw) + b"\n"
    _write(tmp_path, layout)
    offset = sum(len(x) + 1 for x in raw[:4]) + raw[4].index(b"\xe9")
    with pytest.raises(
        DataFormatError,
        match=rf"corpus\.jsonl, row 5: invalid UTF-8 byte 0xe9 at byte {offset} of the file",
    ):
        read_beir(tmp_path, "test")


CELL = st.text(alphabet="ab1,'\"[] \n", max_size=6)


@FAST
@given(
    corpus=st.lists(st.lists(CELL, min_size=0, max_size=5), max_size=4),
    claims=st.lists(st.lists(CELL, min_size=0, max_size=5), max_size=4),
)
def test_scifact_valid_looking_rows(corpus, claims):
    import csv
    import io

    def table(header: list[str], rows: list[list[str]]) -> bytes:
        buf = io.StringIO()
        w = csv.writer(buf)
        w.writerow(header)
        w.writerows(rows)
        return buf.getvalue().encode()

    layout = {
        "corpus_train.csv": table(["doc_id", "title", "abstract", "structured"], corpus),
        "claims_validation.csv": table(["id", "claim", "cited_doc_ids", "evidence"], claims),
    }
    _read("scifact", layout)


JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers(-2, 300) | st.floats(allow_nan=False) | TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TEXT, inner, max_size=3),
    max_leaves=8,
)


@FAST
@given(
    rows=st.lists(
        st.fixed_dictionaries(
            {"query_id": JSONISH, "query": JSONISH},
            optional={
                "passages": JSONISH
                | st.fixed_dictionaries({"passage_text": JSONISH, "is_selected": JSONISH}),
                "query_type": JSONISH,
            },
        ),
        max_size=3,
    )
    | JSONISH
)
def test_msmarco_json_valid_looking_rows(rows):
    _read("msmarco-json", {"rows.json": json.dumps(rows).encode()})


@FAST
@given(
    qrels=st.lists(st.lists(st.text(alphabet="12-x ", max_size=3), max_size=4), max_size=5),
    docs=st.lists(st.sampled_from([".I 1", ".I 2", ".T", ".W", "text", ".X", ""]), max_size=8),
)
def test_cranfield_valid_looking_rows(qrels, docs):
    layout = dict(CRANFIELD)
    layout["cranqrel"] = "".join(" ".join(r) + "\n" for r in qrels).encode()
    layout["cran.all.1400"] = "".join(x + "\n" for x in docs).encode()
    _read("cranfield", layout)
