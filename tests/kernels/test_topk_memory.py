"""Exact search over a memory-mapped store larger than one chunk: read with ``pread`` into memory
the process owns (``kernels.rows.FileRows``), bit-identical to the in-memory search, and resident
memory that does not grow with the passages (issue 34 item 4)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from treerank.kernels.rows import FileRows
from treerank.kernels.topk import exact_search


def _store_file(tmp_path: Path, x: np.ndarray) -> np.memmap:
    path = tmp_path / "passages.bin"
    x.tofile(path)
    return np.memmap(path, dtype=np.float32, mode="r", shape=x.shape)


def test_file_rows_reads_and_gathers_the_stored_bytes(tmp_path: Path) -> None:
    x = np.arange(50 * 6, dtype=np.float32).reshape(50, 6)
    mm = _store_file(tmp_path, x)
    rows = FileRows.of(mm)
    assert rows is not None and rows.shape == (50, 6)
    buf = np.full((8, 6), -1.0, np.float32)
    block = rows.read(10, 15, buf)
    assert block.base is buf or block is buf[:5]
    np.testing.assert_array_equal(block, x[10:15])
    np.testing.assert_array_equal(buf[5:], -1.0)  # only the rows read are written
    ids = np.array([7, 3, 3, 49, 0, 1, 2, 8])  # any order, repeats, runs of consecutive ids
    np.testing.assert_array_equal(rows.gather(ids), x[ids])
    np.testing.assert_array_equal(rows.gather(np.arange(20, 30)), x[20:30])
    assert rows.gather(np.array([], np.int64)).shape == (0, 6)
    with pytest.raises(IndexError, match=r"\[0, 50\)"):
        rows.gather(np.array([50]))
    with pytest.raises(ValueError, match="outside"):
        rows.read(45, 51)
    with pytest.raises(ValueError, match="fewer than 9 rows"):
        rows.read(0, 9, buf)
    rows.close()


def test_file_rows_only_wraps_a_whole_read_only_map(tmp_path: Path) -> None:
    x = np.ones((10, 4), np.float32)
    mm = _store_file(tmp_path, x)
    assert FileRows.of(mm) is not None
    assert FileRows.of(mm[2:]) is None  # a view: its offset is not the file's
    assert FileRows.of(np.asarray(x)) is None
    rw = np.memmap(tmp_path / "passages.bin", dtype=np.float32, mode="r+", shape=x.shape)
    assert FileRows.of(rw) is None


@pytest.mark.parametrize("backend", ["faiss", "torch"])
def test_exact_search_over_a_large_map_equals_the_in_memory_search(
    tmp_path: Path, backend: str
) -> None:
    rng = np.random.default_rng(3)
    p = rng.standard_normal((2_000, 16)).astype(np.float32)
    p /= np.linalg.norm(p, axis=1, keepdims=True)
    p[1500:1600] = p[100]  # 101 identical rows: ties across the k-th position, full rescoring
    q = rng.standard_normal((40, 16)).astype(np.float32)
    q[:3] = p[100]  # these queries' top 101 scores tie: rescored over every passage
    mm = _store_file(tmp_path, p)
    kw = {"k": 100, "chunk_size": 333, "backend": backend, "query_batch": 16}
    for transform in (None, lambda b: 2.0 * b):
        ref = exact_search(q, p, passage_transform=transform, **kw)  # type: ignore[arg-type]
        got = exact_search(q, mm, passage_transform=transform, **kw)  # type: ignore[arg-type]
        np.testing.assert_array_equal(got[0], ref[0])
        np.testing.assert_array_equal(got[1], ref[1])  # bit-identical scores
    # the tied queries: the 101 identical rows rank by ascending id
    ids, _ = exact_search(q[:1], mm, k=101, chunk_size=333, backend=backend)
    assert ids[0].tolist() == [100, *range(1500, 1600)]


_CHILD = textwrap.dedent(
    """
    import json, sys
    from pathlib import Path
    import numpy as np
    from treerank.kernels.topk import exact_search

    path, n, d = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    mm = np.memmap(path, dtype=np.float32, mode="r", shape=(n, d))
    q = np.ascontiguousarray(mm[:256][::-1] + 0.01, dtype=np.float32)
    exact_search(q, np.array(mm[:5000]), k=100, chunk_size=4096, backend="torch")  # warm-up

    def kib(key):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1])

    Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM to the current RSS
    base = kib("VmRSS")
    exact_search(q, mm, k=100, chunk_size=4096, backend="torch")
    print(json.dumps({"growth_kib": kib("VmHWM") - base, "file_kib": kib("RssFile")}))
    """
)


def _peak_growth_mib(tmp_path: Path, n: int, d: int) -> float:
    rng = np.random.default_rng(0)
    path = tmp_path / f"p{n}.bin"
    with open(path, "wb") as f:
        for s in range(0, n, 65_536):
            f.write(rng.standard_normal((min(65_536, n - s), d), dtype=np.float32).tobytes())
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, str(path), str(n), str(d)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=True,
    )
    return float(json.loads(out.stdout.strip().splitlines()[-1])["growth_kib"]) / 1024


@pytest.mark.skipif(
    not Path("/proc/self/clear_refs").exists(), reason="needs Linux /proc (VmHWM reset)"
)
def test_exact_search_peak_memory_does_not_grow_with_the_passages(tmp_path: Path) -> None:
    """Peak resident growth of one search (256 queries, top-100, 4,096-row chunks of 64-d
    float32 = 1 MiB) over a 16 MiB and a 64 MiB passage file. What the search holds: the chunk
    buffer (1 MiB), 256 x 4,096 float32 scores (4 MiB) and the gathered rows of the exact
    rescoring (256 x 116 x 64 float32 = 7.25 MiB), ~13 MiB, plus bookkeeping and allocator
    slack (measured 16 to 25 MiB at either size, run to run): bound 40 MiB at both sizes, and
    the two within 20 MiB of each other. Reading the map in place fails both (measured 28 and
    76 MiB): every page fault of the
    rescoring's scattered gathers also maps the cached neighbours of the row, so the whole
    64 MiB file became resident (the cause of the seed-scale stage's 6.39 GiB)."""
    small = _peak_growth_mib(tmp_path, 65_536, 64)
    large = _peak_growth_mib(tmp_path, 262_144, 64)
    assert small <= 40 and large <= 40, (small, large)
    assert abs(large - small) <= 20, (small, large)


_GATHER_CHILD = textwrap.dedent(
    """
    import json, sys
    from pathlib import Path
    import numpy as np
    from treerank.forest.data import _read_rows

    path, n, d = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    mm = np.memmap(path, dtype=np.float32, mode="r", shape=(n, d))
    ids = np.sort(np.random.default_rng(1).choice(n, 2_000, replace=False))
    _read_rows(np.array(mm[:100]), ids[ids < 100])  # warm-up

    def kib(key):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1])

    Path("/proc/self/clear_refs").write_text("5")
    base = kib("VmRSS")
    rows = _read_rows(mm, ids)
    growth = kib("VmHWM") - base
    assert (rows == np.asarray(mm[ids])).all()  # the stored rows (read through the map)
    print(json.dumps({"growth_kib": growth}))
    """
)


@pytest.mark.skipif(
    not Path("/proc/self/clear_refs").exists(), reason="needs Linux /proc (VmHWM reset)"
)
def test_forest_row_gathers_do_not_map_the_file(tmp_path: Path) -> None:
    """The forest's row reads (``forest.data._read_rows``): 2,000 scattered rows of a
    64 MiB file of 64-d float32 are 0.5 MiB; the peak grows by at most 8 MiB (the rows, the
    sort and index arrays). Through the map (the old read) every fault also mapped the cached
    neighbours: the whole 64 MiB file became resident before its release."""
    n, d = 262_144, 64
    path = tmp_path / "p.bin"
    np.random.default_rng(0).standard_normal((n, d), dtype=np.float32).tofile(path)
    out = subprocess.run(
        [sys.executable, "-c", _GATHER_CHILD, str(path), str(n), str(d)],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    growth = float(json.loads(out.stdout.strip().splitlines()[-1])["growth_kib"]) / 1024
    assert growth <= 8, growth
