"""Service latency: ``treerank serve`` under 1, 4 and 8 concurrent clients.

Starts a real server process on 127.0.0.1 (a free port) over ``--store`` with ``--system``
(default cosine, exact search), waits for ``/health``, then for each client count sends
``--requests`` single-query ``POST /search`` requests (the store's query texts, in turn), each
client a thread with its own HTTP connection, back to back. Reports per level: requests, failed
(non-200 or transport errors), p50 / p99 / max latency (ms) and requests/s; the server is
stopped at the end however the run ends. Writes ``latency.json`` and ``latency.md`` to ``--out``.

Usage: ``nice -n 15 python bench/bench_serve.py --store STORE/test --out DIR``.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def level(base: str, texts: list[str], clients: int, n: int, k: int, system: str) -> dict:
    def worker(slot: int) -> list[tuple[float, bool]]:
        out = []
        with httpx.Client(base_url=base, timeout=120) as c:
            for i in range(slot, n, clients):
                t = time.perf_counter()
                try:
                    r = c.post(
                        "/search", json={"query": texts[i % len(texts)], "k": k, "system": system}
                    )
                    ok = r.status_code == 200 and len(r.json()["results"][0]["hits"]) == k
                except httpx.HTTPError:
                    ok = False
                out.append((time.perf_counter() - t, ok))
        return out

    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=clients) as pool:
        results = [x for part in pool.map(worker, range(clients)) for x in part]
    wall = time.perf_counter() - t0
    lat = np.array([r[0] for r in results]) * 1000
    return {
        "clients": clients,
        "requests": len(results),
        "failed": sum(not r[1] for r in results),
        "p50_ms": float(np.percentile(lat, 50)),
        "p99_ms": float(np.percentile(lat, 99)),
        "max_ms": float(lat.max()),
        "requests_per_s": len(results) / wall,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--store", type=Path, required=True)
    ap.add_argument("--system", default="cosine")
    ap.add_argument("--requests", type=int, default=200, help="Requests per client count.")
    ap.add_argument("--clients", default="1,4,8")
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--start-timeout", type=float, default=600)
    args = ap.parse_args()
    from treerank.store import EmbeddingStore

    texts = EmbeddingStore.open(args.store).query_texts()
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    args.out.mkdir(parents=True, exist_ok=True)
    log = open(args.out / "server.log", "w")
    cmd = [sys.executable, "-m", "treerank.cli.main", "serve", "--store", str(args.store)]
    cmd += ["--system", args.system, "--port", str(port)]
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ))
    rows = []
    try:
        deadline = time.monotonic() + args.start_timeout
        while True:
            if proc.poll() is not None:
                sys.exit(f"server exited: {(args.out / 'server.log').read_text()[-2000:]}")
            try:
                if httpx.get(f"{base}/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                sys.exit("server did not start in time")
            time.sleep(0.5)
        level(base, texts, 1, 10, args.k, args.system)  # warm-up, not reported
        for c in (int(x) for x in args.clients.split(",")):
            row = level(base, texts, c, args.requests, args.k, args.system)
            print(json.dumps(row), flush=True)
            rows.append(row)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()
    title = f"treerank serve, {args.store}, system {args.system}, k={args.k}, one query per request"
    md = [title, "", "| clients | requests | failed | p50 ms | p99 ms | max ms | requests/s |"]
    md.append("|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        md.append(
            f"| {r['clients']} | {r['requests']} | {r['failed']} | {r['p50_ms']:.1f} "
            f"| {r['p99_ms']:.1f} | {r['max_ms']:.1f} | {r['requests_per_s']:.1f} |"
        )
    (args.out / "latency.json").write_text(json.dumps({"title": title, "rows": rows}, indent=2))
    (args.out / "latency.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
