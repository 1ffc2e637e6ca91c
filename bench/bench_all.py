"""Every throughput ratio of issue 34 against its reference, in one command (issue 34 item 5).

Three parts, each measured side by side (runs interleaved, best of the repeats kept):

* **encode**: every encoding path (``plain bf16 autocast``, ``torch/fp32``, ``torch/bf16``,
  ``torch/bf16 + bf16 weights``, ``onnx/fp32``, ``onnx-int8``, ``auto``) against plain
  ``SentenceTransformer.encode`` in fp32, in this process (:func:`bench_encoding.measure`,
  SciFact test abstracts);
* **search**: :func:`treerank.kernels.topk.exact_search` per CPU kernel (``faiss``, ``torch``,
  ``auto``) against FAISS ``IndexFlatIP.search`` on the same unit vectors, in this process;
  the ids are checked equal as sets;
* **serve**: ``treerank serve`` at 1 and 8 concurrent clients, the batch-invariant default
  against ``--no-batch-invariant``, as whole server processes interleaved run by run (each
  repeat starts one server of each mode, in alternating order), on a store with texts
  (default: the cached SciFact test store of the tests, ``.cache/test-stores/scifact-*/test``).

Prints one line per ratio and writes ``--out`` (default ``bench/results/bench_all.json``) with the
CPU's model and flags (``lscpu``), the thread count, the load average before and after each part
and the library versions. The serve part also regenerates the throughput table of
``docs/serving.md`` (between ``<!-- bench_all:serve:begin -->`` and ``<!-- bench_all:serve:end
-->``) from that file (:func:`render_serving`; ``--no-doc`` leaves it alone;
``tests/serve/test_serving_doc.py`` checks the page equals the rendering).

``--quick`` (about 5 minutes on 2 shared cores): 64 abstracts x 2 repeats, 20,000 x 384
passages x 256 queries, 24 / 64 requests at 1 / 8 clients, one server of each mode.

Usage::

    OMP_NUM_THREADS=1 nice -n 10 .venv/bin/python bench/bench_all.py --quick
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
sys.path.insert(0, str(BENCH))

import bench_encoding  # noqa: E402
import bench_serve  # noqa: E402

OUT = BENCH / "results" / "bench_all.json"
DOC = REPO / "docs" / "serving.md"
BEGIN, END = "<!-- bench_all:serve:begin -->", "<!-- bench_all:serve:end -->"
SERVE_MODES = {"batch-invariant (default)": (), "--no-batch-invariant": ("--no-batch-invariant",)}


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def search_ratios(
    n_passages: int, n_queries: int, dim: int, k: int, repeats: int, seed: int = 0
) -> dict[str, Any]:
    """``exact_search`` per CPU kernel against FAISS ``IndexFlatIP`` on random unit vectors.

    Returns:
        ``{"setup": {...}, "rows": {name: {"seconds", "queries_per_s", "ratio"}}}``, ``ratio`` =
        IndexFlatIP seconds / the kernel's seconds (best of ``repeats`` interleaved runs; >= 1:
        at least as fast), ``same_ids``: the fraction of top-``k`` id sets equal to FAISS's.
    """
    import faiss

    from treerank.kernels.topk import cpu_search_backend, exact_search

    rng = np.random.default_rng(seed)
    p = rng.standard_normal((n_passages, dim), dtype=np.float32)
    p /= np.linalg.norm(p, axis=1, keepdims=True)
    q = rng.standard_normal((n_queries, dim), dtype=np.float32)
    q /= np.linalg.norm(q, axis=1, keepdims=True)
    index = faiss.IndexFlatIP(dim)
    index.add(p)
    runs: dict[str, Any] = {
        "faiss IndexFlatIP": lambda: index.search(q, k)[1],
        **{
            f"exact_search {b}": (lambda b=b: exact_search(q, p, k=k, backend=b)[0])
            for b in ("faiss", "torch", "auto")
        },
    }
    best: dict[str, float] = {}
    ids: dict[str, np.ndarray] = {}
    names = list(runs)
    for r in range(repeats):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            t = time.perf_counter()
            ids[name] = runs[name]()
            best[name] = min(best.get(name, np.inf), time.perf_counter() - t)
    ref = np.sort(ids["faiss IndexFlatIP"], axis=1)
    rows = {
        name: {
            "seconds": sec,
            "queries_per_s": n_queries / sec,
            "ratio": best["faiss IndexFlatIP"] / sec,
            "same_ids": float((np.sort(ids[name], axis=1) == ref).all(axis=1).mean()),
        }
        for name, sec in best.items()
    }
    return {
        "setup": {
            "passages": n_passages,
            "queries": n_queries,
            "dim": dim,
            "k": k,
            "repeats": repeats,
            "auto_kernel": cpu_search_backend(),
        },
        "reference": "faiss IndexFlatIP",
        "rows": rows,
    }


def serve_ratios(
    store: Path, requests: dict[int, int], repeats: int, k: int, batch_window_ms: float, log: Path
) -> dict[str, Any]:
    """Requests/s of ``treerank serve`` per client count, batch-invariant default vs off.

    Each repeat starts one server per mode (their order alternating by repeat), sends 8 warm-up
    requests, then ``requests[c]`` single-query requests from ``c`` clients for each ``c``;
    the best requests/s of each (mode, clients) over the repeats is kept.

    Returns:
        ``{"setup": {...}, "rows": [{"mode", "clients", "requests", "failed", "requests_per_s",
        "p50_ms", "p99_ms"}], "ratios": {...}}``; ratios: each mode's 8-client / 1-client
        requests/s, and the default's requests/s / ``--no-batch-invariant``'s per client count.
    """
    from treerank.store import EmbeddingStore

    st = EmbeddingStore.open(store)
    texts = st.query_texts()
    best: dict[tuple[str, int], dict[str, Any]] = {}
    modes = list(SERVE_MODES)
    for r in range(repeats):
        for mode in modes[r % 2 :] + modes[: r % 2]:
            with bench_serve.server(
                store, "cosine", batch_window_ms, log, extra=SERVE_MODES[mode]
            ) as (_, base):
                bench_serve.level(base, texts, 1, 8, k, "cosine", 120.0)  # warm-up
                for c, n in requests.items():
                    row = bench_serve.level(base, texts, c, n, k, "cosine", 300.0)
                    old = best.get((mode, c))
                    if old is None or row["requests_per_s"] > old["requests_per_s"]:
                        best[(mode, c)] = {"mode": mode, **row}
                    print(
                        f"serve {mode:26s} {c} client(s): {row['requests_per_s']:6.1f} req/s "
                        f"({row['failed']} failed)",
                        file=sys.stderr,
                        flush=True,
                    )
    rows = [best[(m, c)] for m in modes for c in requests]
    rps = {(r["mode"], r["clients"]): r["requests_per_s"] for r in rows}
    ratios: dict[str, float] = {}
    for m in modes:
        if rps.get((m, 1)):
            ratios[f"{m}: 8 clients / 1 client"] = rps[(m, 8)] / rps[(m, 1)]
    for c in requests:
        if rps.get((modes[1], c)):
            ratios[f"{c} client(s): default / --no-batch-invariant"] = (
                rps[(modes[0], c)] / rps[(modes[1], c)]
            )
    return {
        "setup": {
            "store": str(store.relative_to(REPO) if store.is_relative_to(REPO) else store),
            "n_passages": int(st.n_passages),
            "system": "cosine",
            "k": k,
            "batch_window_ms": batch_window_ms,
            "repeats": repeats,
        },
        "rows": rows,
        "ratios": ratios,
    }


def render_serving(doc: dict[str, Any]) -> str:
    """The throughput table of ``docs/serving.md`` from a :func:`main` results document."""
    s = doc["serve"]["setup"]
    cpu = doc["cpu"].get("Model name", "unknown CPU")
    lines = [
        f"Measured {doc['date']} by `{doc['command']}` on {doc['cpus']} CPU cores ({cpu}, "
        f"shared; load average {doc['load']['serve'][0][0]:.1f} before the serve part; the "
        f"clients share the cores with the server), store `{s['store']}` "
        f"({s['n_passages']:,} passages), system `{s['system']}`, k = {s['k']}, one query per "
        f"request, batch window {s['batch_window_ms']} ms, best of {s['repeats']} server "
        "run(s) per mode, the modes' servers interleaved "
        "(`bench/results/bench_all.json`).",
        "",
        "| mode | clients | requests | failed | p50 ms | p99 ms | requests/s |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in doc["serve"]["rows"]:
        lines.append(
            f"| {r['mode']} | {r['clients']} | {r['requests']} | {r['failed']} "
            f"| {r['p50_ms']:.1f} | {r['p99_ms']:.1f} | {r['requests_per_s']:.1f} |"
        )
    lines.append("")
    lines += [f"- {name}: **{value:.2f}x**" for name, value in doc["serve"]["ratios"].items()]
    return "\n".join(lines)


def write_doc(doc: dict[str, Any], path: Path = DOC) -> None:
    """Replace the generated throughput section of ``docs/serving.md`` with
    :func:`render_serving` of ``doc``."""
    text = path.read_text(encoding="utf-8")
    head, found, rest = text.partition(BEGIN)
    if not found:
        raise SystemExit(f"{path}: no {BEGIN} marker")
    _, _, tail = rest.partition(END)
    path.write_text(f"{head}{BEGIN}\n{render_serving(doc)}\n{END}{tail}", encoding="utf-8")


def ratio_lines(doc: dict[str, Any]) -> list[str]:
    """One printed line per ratio: ``part: name  ratio x  (reference)``."""
    out = []
    enc = doc.get("encode")
    if enc:
        for name, row in enc["rows"].items():
            out.append(
                f"encode  {name:28s} {row['ratio']:6.3f}x wall, {row['cpu_ratio'] or 0:6.3f}x CPU "
                f"vs plain fp32 encode (min cos {row['cosine_to_fp32']['min']:.5f})"
            )
    srch = doc.get("search")
    if srch:
        for name, row in srch["rows"].items():
            out.append(
                f"search  {name:28s} {row['ratio']:6.3f}x vs faiss IndexFlatIP "
                f"({row['queries_per_s']:.1f} q/s, same ids {row['same_ids']:.0%})"
            )
    srv = doc.get("serve")
    if srv:
        for name, value in srv["ratios"].items():
            out.append(f"serve   {name:44s} {value:6.3f}x")
    return out


def default_store() -> Path | None:
    found = sorted(
        p
        for p in (REPO / ".cache" / "test-stores").glob("scifact-*/test")
        if "slice" not in str(p) and (p / "meta.json").is_file()
    )
    return found[0] if found else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="the ~5-minute sizes (module doc)")
    ap.add_argument("--parts", default="encode,search,serve")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--store", type=Path, default=None, help="serve: a store with texts")
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--no-doc", action="store_true", help="do not rewrite docs/serving.md")
    a = ap.parse_args()
    parts = [p.strip() for p in a.parts.split(",") if p.strip()]
    unknown = set(parts) - {"encode", "search", "serve"}
    if unknown:
        ap.error(f"unknown part(s) {', '.join(sorted(unknown))}; known: encode, search, serve")
    store = a.store or default_store()
    if "serve" in parts and (store is None or not (store / "meta.json").is_file()):
        ap.error(
            f"serve needs a store with texts: --store {store} has no meta.json (build the cached "
            "SciFact test store by running tests/serve/test_server.py once, or pass --store)"
        )
    import torch

    from treerank.atomic import atomic_write_json
    from treerank.encoders.precision import library_versions

    torch.set_num_threads(a.threads)
    quick = a.quick
    doc: dict[str, Any] = {
        "issue": 34,
        "command": "python bench/bench_all.py " + " ".join(sys.argv[1:]),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "quick": quick,
        "threads": a.threads,
        "cpus": os.cpu_count(),
        "cpu": bench_encoding.lscpu(),
        "versions": library_versions(),
        "load": {},
    }
    t0 = time.perf_counter()
    if "encode" in parts:
        before = _load()
        n, reps = (64, 2) if quick else (320, 3)
        doc["encode"] = bench_encoding.measure(n, 32, a.threads, reps, 0 if quick else 128)
        for key in ("cpu", "versions"):  # recorded once, at the top
            doc["encode"].pop(key, None)
        doc["load"]["encode"] = [before, _load()]
    if "search" in parts:
        before = _load()
        n_p, n_q, reps = (20_000, 256, 3) if quick else (200_000, 1_000, 3)
        doc["search"] = search_ratios(n_p, n_q, 384, 100, reps)
        doc["load"]["search"] = [before, _load()]
    if "serve" in parts:
        assert store is not None
        before = _load()
        requests, reps = ({1: 24, 8: 64}, 1) if quick else ({1: 100, 8: 300}, 2)
        log = a.out.with_suffix(".server.log")
        a.out.parent.mkdir(parents=True, exist_ok=True)
        doc["serve"] = serve_ratios(store, requests, reps, 10, 2.0, log)
        log.unlink(missing_ok=True)
        doc["load"]["serve"] = [before, _load()]
    doc["seconds"] = time.perf_counter() - t0
    for line in ratio_lines(doc):
        print(line)
    atomic_write_json(a.out, doc, indent=1)
    print(f"wrote {a.out} ({doc['seconds']:.0f} s)")
    if "serve" in doc and not a.no_doc:
        write_doc(doc)
        print(f"regenerated the throughput table of {DOC.relative_to(REPO)}")


if __name__ == "__main__":
    main()
