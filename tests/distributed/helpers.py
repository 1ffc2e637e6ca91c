"""Launch a 2-process gloo group on 127.0.0.1 with torchrun for the distributed tests."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
WORKERS = Path(__file__).resolve().parent / "workers.py"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def torchrun(
    args: list[str], nproc: int = 2, timeout: float = 900.0, cli: bool = False
) -> subprocess.CompletedProcess:
    """Run ``workers.py ARGS`` (``cli``: ``treerank ARGS``) under ``torchrun
    --nproc_per_node=nproc`` (gloo, one thread each).

    Returns the finished process (its ``returncode`` is torchrun's: 0 only when every worker
    exited with 0).
    """
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        "TREERANK_DIST_BACKEND": "gloo",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "PYTHONPATH": os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")]),
    }
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nproc_per_node={nproc}",
        "--nnodes=1",
        "--master_addr=127.0.0.1",
        f"--master_port={free_port()}",
        *(["-m", "treerank.cli.main"] if cli else [str(WORKERS)]),
        *args,
    ]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
