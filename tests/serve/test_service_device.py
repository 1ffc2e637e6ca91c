"""``serve --device`` reaches the query encoder too (as ``search``'s does), not only the search."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch

from tests.pipeline.test_training import write_store
from treerank.kernels.device import Device
from treerank.serve import service as service_module
from treerank.serve.service import SearchService, ServiceConfig


class _Encoder:
    name, fingerprint, precision = "toy", "sha256:toy", "fp32"
    backend = SimpleNamespace(name="torch", precision="fp32")

    def encode_queries(self, texts: list[str]) -> np.ndarray:
        return np.ones((len(texts), 16), np.float32)


@pytest.mark.parametrize(
    ("device", "cuda", "want"),
    [(Device("cpu"), False, Device("cpu")), (Device("auto"), True, Device("cuda"))],
)
def test_the_query_encoder_loads_on_the_service_device(
    tmp_path, monkeypatch: pytest.MonkeyPatch, device: Device, cuda: bool, want: Device
) -> None:
    store = write_store(tmp_path / "s" / "test")
    if cuda:  # a GPU machine, simulated: `auto` means CUDA there
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    seen: dict[str, Any] = {}

    def fake_load(store: Any, model: Any, backend: Any, **kw: Any) -> _Encoder:
        seen.update(kw)
        return _Encoder()

    monkeypatch.setattr(service_module, "load_store_encoder", fake_load)
    # bm25 ranks by the query texts, so the (simulated) CUDA device is never touched
    SearchService(ServiceConfig(store=store.path, systems=("bm25",), device=device))
    assert seen["device"] == want
