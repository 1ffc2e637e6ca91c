"""The device check script (bench/gpu_check.py, scripts/gpu_check.sh) on a CPU machine."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.bench_module import load_bench

ROOT = Path(__file__).resolve().parents[1]


def _module():
    return load_bench("gpu_check")


def test_self_test_on_cpu_compares_exactly(tmp_path):
    """--gpu-device cpu runs the "GPU" halves on the CPU: every comparison must be exact."""
    out = tmp_path / "gc.json"
    assert (
        _module().main(
            ["--quick", "--only", "search,head,forest", "--gpu-device", "cpu", "--out", str(out)]
        )
        == 0
    )
    doc = json.loads(out.read_text())
    s, h = doc["checks"]["search"], doc["checks"]["head"]
    assert s["status"] == "ok" and s["ids_differ"] == 0 and s["max_metric_diff"] == 0.0
    assert 0.0 < s["cpu_metrics"]["mrr@10"] <= 1.0 and s["cpu_metrics"]["recall@100"] == 1.0
    assert h["status"] == "ok" and h["max_weight_diff"] == 0.0 and h["steps"] > 0
    f = doc["checks"]["forest"]
    assert f["status"] == "ok" and f["max_weight_diff"] == 0.0 and f["cpu_kernel"] == "numba"
    assert f["ids_differ"] == f["counts_differ"] == f["secondary_differ"] == 0
    assert f["query_class_agreement"] == f["passage_class_agreement"] == 1.0


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only message")
def test_script_without_cuda_says_gpu_parts_skipped(tmp_path):
    out = tmp_path / "gc.json"
    proc = subprocess.run(
        [
            "bash",
            str(ROOT / "scripts" / "gpu_check.sh"),
            "--quick",
            "--only",
            "search,head,forest",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", "PYTHON": sys.executable, "OMP_NUM_THREADS": "1"},
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert "every GPU part below is SKIPPED" in proc.stdout
    doc = json.loads(out.read_text())
    assert doc["gpu_parts"] == "skipped: no CUDA device"
    assert {r["status"] for r in doc["checks"].values()} == {"skipped (no CUDA)"}
