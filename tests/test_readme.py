"""Every command of the README runs as printed (issue 22).

The README's ```` ```bash ```` blocks run line by line, in order, in a temporary directory that
holds copies of ``configs/`` and ``data/samples/mybeir/`` (so relative paths read as printed
and nothing is written into the repository); its ```` ```python ```` blocks run afterwards in
the same directory. A block right after ``<!-- readme-test: skip ... -->`` is not run (the main
job and the whole suite). Adjustments, each needed to run under a test: ``. .venv/bin/activate``
is replaced by putting this interpreter's ``bin/`` first on ``PATH``; a line ending in ``&``
(``treerank serve``) is started in the background, waited for on ``/health`` and stopped with
SIGTERM where the README says ``kill %1`` (it must exit 0); the port ``8000`` becomes a free
port.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
SKIP = "<!-- readme-test: skip"
PORT = "8000"


def blocks(text: str, lang: str) -> list[str]:
    """The fenced ``lang`` blocks of ``text`` not preceded by the skip marker."""
    out = []
    for m in re.finditer(rf"(^[^\n]*\n)?```{lang}\n(.*?)^```", text, flags=re.M | re.S):
        if m.group(1) and m.group(1).startswith(SKIP):
            continue
        out.append(m.group(2))
    return out


def commands(block: str) -> list[str]:
    """Shell commands of a block: comments and blank lines dropped, ``\\`` continuations joined."""
    out: list[str] = []
    pending = ""
    for raw in block.splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        out.append(pending + line)
        pending = ""
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_healthy(url: str, proc: subprocess.Popen[bytes], timeout: float = 180.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"serve exited with {proc.returncode} before it was healthy")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    raise AssertionError(f"serve not healthy after {timeout:.0f} s")


def stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM, then wait: ``serve`` shuts down cleanly and exits 0."""
    proc.send_signal(signal.SIGTERM)
    try:
        code = proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise
    assert code == 0, f"serve exited with {code} after SIGTERM (its log: serve*.log)"


def test_readme_structure() -> None:
    text = README.read_text(encoding="utf-8")
    lines = text.splitlines()
    assert len(lines) < 220, len(lines)
    first = blocks(text.replace(SKIP, "<!-- x"), "bash")[0]
    assert "bash scripts/sample.sh" in first and "bash scripts/test.sh" in first
    assert "scripts/bootstrap.sh" in text
    from treerank.pipeline.published import read_block

    generated = set(read_block(text).splitlines())
    long = [line for line in lines if len(line) > 120 and line not in generated]
    assert not long, f"README lines over 120 characters: {long}"
    from treerank.readers.detect import FORMATS

    for name in re.findall(r"--format (\S+)`", text):
        assert name in FORMATS, name
    tour = [c for b in blocks(text, "bash") for c in commands(b)]
    for name in ("embed", "evaluate", "train", "search", "index", "serve", "run", "diagnose"):
        assert any(c.startswith(f"treerank {name}") for c in tour), name


@pytest.mark.slow
def test_every_readme_command_runs_as_printed(tmp_path: Path) -> None:
    text = README.read_text(encoding="utf-8")
    work = tmp_path / "repo"
    (work / "data" / "samples").mkdir(parents=True)
    shutil.copytree(REPO / "configs", work / "configs")
    shutil.copytree(REPO / "data" / "samples" / "mybeir", work / "data" / "samples" / "mybeir")
    bindir = str(Path(sys.executable).parent)
    env = {
        **os.environ,
        "PATH": bindir + os.pathsep + os.environ.get("PATH", ""),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "MPLBACKEND": "Agg",
    }
    port = str(free_port())
    servers: list[subprocess.Popen[bytes]] = []
    ran: list[str] = []
    try:
        for block in blocks(text, "bash"):
            for cmd in commands(block):
                if cmd == ". .venv/bin/activate":
                    continue  # PATH already starts with this interpreter's bin/
                if cmd.startswith("kill %1"):
                    assert servers, "kill %1 without a background command"
                    stop(servers.pop())
                    continue
                m = re.fullmatch(r"export (\w+)=(\S+)", cmd)
                if m:
                    env[m.group(1)] = m.group(2)
                    continue
                cmd = cmd.replace(f"--port {PORT}", f"--port {port}")
                cmd = cmd.replace(f"localhost:{PORT}", f"localhost:{port}")
                ran.append(cmd)
                if cmd.endswith("&"):
                    proc = subprocess.Popen(
                        ["bash", "-c", "exec " + cmd[:-1]],
                        cwd=work,
                        env=env,
                        stdout=subprocess.DEVNULL,
                        stderr=(tmp_path / f"serve{len(servers)}.log").open("wb"),
                    )
                    servers.append(proc)
                    wait_healthy(f"http://127.0.0.1:{port}/health", proc)
                    continue
                res = subprocess.run(
                    ["bash", "-c", "set -o pipefail; " + cmd],
                    cwd=work,
                    env=env,
                    capture_output=True,
                    text=True,
                    timeout=600,
                )
                assert res.returncode == 0, f"{cmd}\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}"
                if cmd.startswith("curl"):
                    assert '"results"' in res.stdout or '"hits"' in res.stdout, res.stdout
    finally:
        for proc in servers:
            stop(proc)
    assert any(c.startswith("treerank serve") for c in ran)
    assert (work / "runs" / "mybeir" / "report.md").is_file()
    for snippet in blocks(text, "python"):
        res = subprocess.run(
            [sys.executable, "-c", snippet],
            cwd=work,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert res.returncode == 0, f"{snippet}\n{res.stderr[-3000:]}"
        assert "cosine" in res.stdout
