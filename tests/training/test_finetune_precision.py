"""``resolve_precision("auto", ...)`` decides on the resolved device, not on the setting's text.

CUDA is simulated (``torch.cuda`` monkeypatched), so the test runs on a CPU-only machine: on a
GPU machine ``auto`` resolves to CUDA and takes the CUDA rule (bf16 where the GPU supports it);
``cpu`` still takes the encoding probe.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from treerank.encoders import precision as precision_module
from treerank.encoders.precision import TORCH_BF16, Choice
from treerank.kernels.device import Device
from treerank.training.finetune import resolve_precision


@pytest.fixture
def probe_calls(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every call of the encoding probe (``resolve_path``), which answers ``torch/bf16``."""
    calls: list[str] = []

    def fake_resolve_path(encoder: Any, backend: str, setting: str, **_: Any) -> Choice:
        calls.append(f"{backend}/{setting}")
        return Choice(TORCH_BF16, 2.0, {"torch/fp32": 1.0, "torch/bf16": 0.5}, {})

    monkeypatch.setattr(precision_module, "resolve_path", fake_resolve_path)
    return calls


def _simulate_cuda(monkeypatch: pytest.MonkeyPatch, *, bf16: bool) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: bf16)


@pytest.mark.parametrize(("bf16", "want"), [(True, "bf16"), (False, "fp32")])
def test_auto_on_a_cuda_machine_takes_the_cuda_rule(
    monkeypatch: pytest.MonkeyPatch, probe_calls: list[str], bf16: bool, want: str
) -> None:
    _simulate_cuda(monkeypatch, bf16=bf16)
    for device in (Device("auto"), Device("cuda"), Device("cuda", 0)):
        got, record = resolve_precision("auto", object(), device)
        assert got == want, device
        assert record["setting"] == "auto" and "probe" not in record
        assert record["reason"].startswith("CUDA")
    assert probe_calls == []  # the CPU probe never ran


def test_cpu_takes_the_probe_even_on_a_cuda_machine(
    monkeypatch: pytest.MonkeyPatch, probe_calls: list[str]
) -> None:
    _simulate_cuda(monkeypatch, bf16=False)
    got, record = resolve_precision("auto", object(), Device("cpu"))
    assert got == "bf16"  # the probe's answer, not the (simulated) GPU's lack of bf16
    assert probe_calls == ["torch/auto"]
    assert record["probe"]["path"] == "torch/bf16" and record["device"] == "cpu"


def test_auto_without_cuda_takes_the_probe(
    monkeypatch: pytest.MonkeyPatch, probe_calls: list[str]
) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    got, _ = resolve_precision("auto", object(), Device("auto"))
    assert got == "bf16" and probe_calls == ["torch/auto"]
