"""Service under load: ``treerank serve`` with 1, 8 and 32 concurrent clients, and its memory.

Starts a real server process on 127.0.0.1 (a free port) over ``--store`` with ``--system``
(default cosine, exact search), waits for ``/health``, then for each client count sends
``--requests`` single-query ``POST /search`` requests (the store's query texts, in turn, ``k``
hits), each client a thread with its own HTTP connection, back to back, stopping early at
``--time-limit`` seconds per level. Reports per level: requests sent, failed (non-200, a short
hit list or a transport error), p50 / p99 / max latency (ms), requests/s, the server's RSS (MiB,
``/proc/<pid>/status``) before and after; then the **8-client / 1-client throughput ratio**
(concurrent requests are micro-batched into one encoder + search call,
:mod:`treerank.serve.batching`; the issue's goal is >= 2x on 2 cores shared with the clients).

``--rss-requests N`` adds a memory run: N requests from 8 clients, the server's RSS sampled
every N/20 requests; the table reports first / last / max RSS and the growth over the last half
(flat: a few MiB). The clients run in this process, so they share the machine's cores with the
server: on a loaded machine every number is a lower bound.

Writes ``--out`` JSON (default ``bench/results/serve/scifact-cosine.json``) and regenerates the
table section of ``docs/serving.md`` from it (between ``<!-- bench_serve:begin -->`` and
``<!-- bench_serve:end -->``), so no number is typed by hand.

Usage::

    OMP_NUM_THREADS=1 nice -n 10 python bench/bench_serve.py \\
        --store .cache/test-stores/scifact-*/test --requests 400 --rss-requests 10000
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import numpy as np

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "serving.md"
BEGIN, END = "<!-- bench_serve:begin -->", "<!-- bench_serve:end -->"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def rss_mib(pid: int) -> float:
    """Resident set of process ``pid`` (MiB), from ``/proc/<pid>/status``; 0 when unknown."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def level(
    base: str,
    texts: list[str],
    clients: int,
    n: int,
    k: int,
    system: str,
    time_limit: float,
    on_done: Any = None,
) -> dict[str, Any]:
    """``n`` requests from ``clients`` threads (stopping at ``time_limit`` s); latencies."""
    deadline = time.perf_counter() + time_limit
    counter = iter(range(n))

    def worker(slot: int) -> list[tuple[float, bool]]:
        out = []
        with httpx.Client(base_url=base, timeout=120) as c:
            for i in counter:  # shared iterator: exactly n requests in all
                if time.perf_counter() > deadline:
                    break
                t = time.perf_counter()
                try:
                    r = c.post(
                        "/search", json={"query": texts[i % len(texts)], "k": k, "system": system}
                    )
                    ok = r.status_code == 200 and len(r.json()["results"][0]["hits"]) == k
                except httpx.HTTPError:
                    ok = False
                out.append((time.perf_counter() - t, ok))
                if on_done is not None:
                    on_done(i)
        return out

    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=clients) as pool:
        results = [x for part in pool.map(worker, range(clients)) for x in part]
    wall = time.perf_counter() - t0
    lat = np.array([r[0] for r in results] or [0.0]) * 1000
    return {
        "clients": clients,
        "requests": len(results),
        "planned": n,
        "failed": sum(not r[1] for r in results),
        "p50_ms": float(np.percentile(lat, 50)),
        "p99_ms": float(np.percentile(lat, 99)),
        "max_ms": float(lat.max()),
        "seconds": wall,
        "requests_per_s": len(results) / wall if wall > 0 else 0.0,
        "time_limited": len(results) < n,
    }


@contextlib.contextmanager
def server(
    store: Path,
    system: str,
    batch_window_ms: float,
    log_path: Path,
    start_timeout: float = 600,
    extra: Sequence[str] = (),
) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """A ``treerank serve`` process on a free port of 127.0.0.1, once ``/health`` answers 200;
    yields ``(process, base URL)`` and stops the process on exit (its output in ``log_path``).

    Raises:
        SystemExit: the server exited, or did not answer within ``start_timeout`` seconds.
    """
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    cmd = [sys.executable, "-m", "treerank.cli.main", "serve", "--store", str(store)]
    cmd += ["--system", system, "--port", str(port), "--batch-window-ms", str(batch_window_ms)]
    cmd += list(extra)
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ))
        try:
            deadline = time.monotonic() + start_timeout
            while True:
                if proc.poll() is not None:
                    sys.exit(f"server exited: {log_path.read_text()[-2000:]}")
                try:
                    if httpx.get(f"{base}/health", timeout=2).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                if time.monotonic() > deadline:
                    sys.exit("server did not start in time")
                time.sleep(0.5)
            yield proc, base
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()


def render(doc: dict[str, Any]) -> str:
    """The markdown tables of a results document (what ``docs/serving.md`` shows)."""
    s = doc["setup"]
    lines = [
        f"Measured {s['date']} on {s['cpus']} CPU cores (load average {s['load_before']:.1f} "
        f"before the run; the clients share the cores with the server), store `{s['store']}` "
        f"({s['n_passages']:,} passages), system `{s['system']}`, k = {s['k']}, one query per "
        f"request, batch window {s['batch_window_ms']} ms; `{doc['command']}`.",
        "",
        "| clients | requests | failed | p50 ms | p99 ms | max ms | requests/s | RSS MiB "
        "before -> after |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in doc["levels"]:
        note = " (time limit)" if r["time_limited"] else ""
        lines.append(
            f"| {r['clients']} | {r['requests']}{note} | {r['failed']} | {r['p50_ms']:.1f} "
            f"| {r['p99_ms']:.1f} | {r['max_ms']:.1f} | {r['requests_per_s']:.1f} "
            f"| {r['rss_before_mib']:.0f} -> {r['rss_after_mib']:.0f} |"
        )
    ratio = doc.get("throughput_ratio_8_over_1")
    if ratio is not None:
        lines += ["", f"8-client / 1-client throughput: **{ratio:.2f}x** (goal >= 2x)."]
    mem = doc.get("rss")
    if mem:
        lines += [
            "",
            f"Memory over {mem['requests']:,} requests from 8 clients ({mem['failed']} failed, "
            f"{mem['seconds']:.0f} s): RSS {mem['first_mib']:.0f} MiB after the first "
            f"{mem['every']:,}, {mem['last_mib']:.0f} MiB at the end, max {mem['max_mib']:.0f}; "
            f"growth over the second half {mem['growth_second_half_mib']:+.1f} MiB.",
        ]
    return "\n".join(lines)


def write_doc(doc: dict[str, Any], path: Path = DOC) -> None:
    """Replace the generated section of ``docs/serving.md`` with :func:`render` of ``doc``."""
    text = path.read_text(encoding="utf-8")
    head, _, rest = text.partition(BEGIN)
    _, _, tail = rest.partition(END)
    path.write_text(f"{head}{BEGIN}\n{render(doc)}\n{END}{tail}", encoding="utf-8")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--store", type=Path, required=True)
    ap.add_argument("--system", default="cosine")
    ap.add_argument("--requests", type=int, default=400, help="Requests per client count.")
    ap.add_argument("--clients", default="1,8,32")
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--time-limit", type=float, default=120.0, help="Seconds per level.")
    ap.add_argument("--rss-requests", type=int, default=0, help="Memory run size (0: none).")
    ap.add_argument("--batch-window-ms", type=float, default=2.0)
    ap.add_argument("--out", type=Path, default=REPO / "bench/results/serve/scifact-cosine.json")
    ap.add_argument("--no-doc", action="store_true", help="Do not rewrite docs/serving.md.")
    ap.add_argument("--start-timeout", type=float, default=600)
    args = ap.parse_args()
    from treerank.store import EmbeddingStore

    store = EmbeddingStore.open(args.store)
    texts = store.query_texts()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    log_path = args.out.with_suffix(".server.log")
    load_before = os.getloadavg()[0]
    rows: list[dict[str, Any]] = []
    memory: dict[str, Any] | None = None
    window, limit = args.batch_window_ms, args.start_timeout
    with server(args.store, args.system, window, log_path, limit) as (proc, base):
        level(base, texts, 1, 20, args.k, args.system, args.time_limit)  # warm-up, not reported
        for c in (int(x) for x in args.clients.split(",")):
            before = rss_mib(proc.pid)
            row = level(base, texts, c, args.requests, args.k, args.system, args.time_limit)
            row.update(rss_before_mib=before, rss_after_mib=rss_mib(proc.pid))
            print(json.dumps(row), flush=True)
            rows.append(row)
        if args.rss_requests:
            every = max(1, args.rss_requests // 20)
            samples: list[tuple[int, float]] = []

            def sample(i: int) -> None:
                if (i + 1) % every == 0:
                    samples.append((i + 1, rss_mib(proc.pid)))

            run = level(base, texts, 8, args.rss_requests, args.k, args.system, 1e9, on_done=sample)
            samples.sort()
            vals = [v for _, v in samples] or [0.0]
            half = vals[len(vals) // 2 :]
            memory = {
                "requests": run["requests"],
                "failed": run["failed"],
                "seconds": run["seconds"],
                "every": every,
                "samples": samples,
                "first_mib": vals[0],
                "last_mib": vals[-1],
                "max_mib": max(vals),
                "growth_second_half_mib": half[-1] - half[0],
            }
            print(json.dumps({k: v for k, v in memory.items() if k != "samples"}), flush=True)
    by = {r["clients"]: r for r in rows}
    ratio = (
        by[8]["requests_per_s"] / by[1]["requests_per_s"]
        if 1 in by and 8 in by and by[1]["requests_per_s"] > 0
        else None
    )
    doc = {
        "setup": {
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "cpus": os.cpu_count(),
            "load_before": load_before,
            "python": platform.python_version(),
            "store": str(args.store),
            "n_passages": store.n_passages,
            "system": args.system,
            "k": args.k,
            "batch_window_ms": args.batch_window_ms,
            "time_limit_s": args.time_limit,
        },
        "command": "python bench/bench_serve.py " + " ".join(sys.argv[1:]),
        "levels": rows,
        "throughput_ratio_8_over_1": ratio,
        "rss": memory,
        "server_exit_code": proc.returncode,
    }
    args.out.write_text(json.dumps(doc, indent=2) + "\n")
    print(render(doc))
    if not args.no_doc:
        write_doc(doc)


if __name__ == "__main__":
    main()
