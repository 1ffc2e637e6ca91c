"""The one ``device`` setting of every stage (``auto`` | ``cpu`` | ``cuda[:n]``) and its resolution.

The text is parsed once, at the edge (a CLI ``--device`` option, the experiment YAML's
``device:`` field), by :func:`parse_device` into a typed :class:`Device`; every library entry point
that computes on tensors (the trainers, exact search, fusion tuning, the diagnostics, ``serve``,
``embed``) takes ``device: Device = DEFAULT_DEVICE`` and turns it into a ``torch.device`` with
:func:`resolve_device`, so that the spelling, the one default and the error are the same
everywhere:

* ``cpu``: the CPU, the one default (:data:`DEFAULT_DEVICE`).
* ``cuda`` / ``cuda:n``: CUDA device ``n`` (``cuda`` is ``cuda:LOCAL_RANK`` under
  ``torchrun``, else ``cuda:0``); an error when CUDA is absent or ``n`` is out of range.
* ``auto``: ``cuda`` when torch sees a CUDA device, else the CPU.

On a CPU, ``auto`` also picks the faster exact-search kernel
(:func:`treerank.kernels.topk.cpu_search_backend`, beside the kernel it times): torch
matmul + ``torch.topk`` vs FAISS ``faiss.knn`` (``IndexFlatIP``'s BLAS + heap); issue 26 measured
the torch kernel at 1.53x FAISS on one 2-core machine and at 0.43x on another, so the choice is
*measured* once on a small probe and cached in ``$TREERANK_CACHE`` (default
``~/.cache/treerank/``), keyed by the CPU, the usable CPUs, the thread counts, the library
versions and the probe's shape. Both
kernels are exact and break ties by passage id, so the choice never changes a result.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch

from treerank.atomic import atomic_write_json

__all__ = [
    "DEFAULT_DEVICE",
    "DEFAULT_DEVICE_TEXT",
    "DEVICE_CHOICES",
    "Device",
    "DeviceError",
    "cache_dir",
    "parse_device",
    "read_probe_cache",
    "resolve_device",
    "write_probe_cache",
]

DEVICE_CHOICES = ("auto", "cpu", "cuda", "cuda:<n>")
DEFAULT_DEVICE_TEXT: Literal["cpu"] = "cpu"
"""The one default ``device`` of the CLI, the experiment YAML and the library: the CPU, so
that a run's numbers never depend on which machine it lands on (``auto`` is opt-in)."""
DEVICE_SETTING = "device (auto | cpu | cuda[:n])"


class DeviceError(ValueError):
    """A ``device`` setting that cannot be honoured: an unknown spelling, or ``cuda`` without a
    CUDA device (the message says what torch sees and how to run on the CPU instead)."""


@dataclass(frozen=True)
class Device:
    """A ``device`` setting, parsed once (at the CLI edge, :func:`parse_device`) and passed on as
    a typed value: ``kind`` ``"auto"`` | ``"cpu"`` | ``"cuda"``, ``index`` the CUDA device
    number of ``cuda:n`` (``None``: ``cuda`` alone, or not CUDA). ``str()`` renders the
    canonical spelling (``"cpu"``, ``"cuda"``, ``"cuda:7"``, ``"auto"``) that every library
    entry point's ``device=`` accepts."""

    kind: Literal["auto", "cpu", "cuda"]
    index: int | None = None

    def __str__(self) -> str:
        return f"cuda:{self.index}" if self.index is not None else self.kind

    def torch(self) -> torch.device:
        """The ``torch.device`` (see :func:`resolve_device`; raises :class:`DeviceError`)."""
        return resolve_device(self)

    def concrete(self) -> Device:
        """``auto`` made definite: ``cuda`` when torch sees a CUDA device, else ``cpu``."""
        if self.kind != "auto":
            return self
        return Device("cuda") if torch.cuda.is_available() else Device("cpu")

    def resolved_text(self) -> str:
        """What the device means on this machine, as text: ``auto`` resolved
        (``cpu`` or ``cuda:n``), any other value itself; part of the pipeline's stage keys, so
        that ``auto`` on a CPU machine keys like ``cpu``."""
        return str(resolve_device(self)) if self.kind == "auto" else str(self)


DEFAULT_DEVICE = Device(DEFAULT_DEVICE_TEXT)
""":data:`DEFAULT_DEVICE_TEXT` as the typed value every library signature defaults to."""


def _spelling(spec: str) -> Device:
    """The :class:`Device` a spelling names, without asking whether it is available."""
    if not isinstance(spec, str):
        raise DeviceError(f"{DEVICE_SETTING}: expected a string, got {type(spec).__name__}")
    text = spec.strip().lower()
    if text in ("cpu", "auto", "cuda"):
        return Device(text)  # type: ignore[arg-type]
    if text.startswith("cuda:"):
        idx = text[5:]
        if not idx.isdigit():
            raise DeviceError(f"{DEVICE_SETTING}: bad CUDA index in {spec!r}")
        return Device("cuda", int(idx))
    raise DeviceError(
        f"{DEVICE_SETTING}: unknown device {spec!r}; known: {', '.join(DEVICE_CHOICES)}"
    )


def parse_device(text: str, *, check: bool = True) -> Device:
    """Parse a ``device`` setting once, at the edge, before any work: the one place every
    command refuses a device (``treerank.cli.options.cli_device`` turns the error into exit
    code 2; the experiment YAML's ``device:`` field is read here too).

    Args:
        text: ``"auto"`` | ``"cpu"`` | ``"cuda"`` | ``"cuda:n"`` (case-insensitive, surrounding
            blanks ignored).
        check: also refuse a device this machine cannot use (``cuda`` without CUDA, an index
            torch does not see); ``False`` checks the spelling only (a config read on one
            machine and run on another).

    Returns:
        the :class:`Device`.

    Raises:
        DeviceError: an unknown spelling (``"gpu"``, ``"cuda:x"``, ``"mps"``); with ``check``,
            as :func:`resolve_device`.
    """
    dev = _spelling(text)
    if check:
        resolve_device(dev)
    return dev


def resolve_device(device: Device) -> torch.device:
    """The ``torch.device`` a :class:`Device` means on this machine (the one resolution).

    Returns:
        ``torch.device("cpu")`` or ``torch.device("cuda", n)`` (``auto``: CUDA when torch
        sees a device, else the CPU).

    Raises:
        DeviceError: ``cuda`` when ``torch.cuda.is_available()`` is false (a CPU-only torch
            build or no driver); a device index ``>= torch.cuda.device_count()``; a value that
            is not a :class:`Device` (text must go through :func:`parse_device` first).
    """
    if not isinstance(device, Device):
        raise DeviceError(
            f"{DEVICE_SETTING}: expected a parsed Device, got {type(device).__name__} "
            f"{device!r} (parse it once with treerank.kernels.device.parse_device)"
        )
    if device.kind == "cpu":
        return torch.device("cpu")
    if device.kind == "auto":
        return _cuda(None) if torch.cuda.is_available() else torch.device("cpu")
    return _cuda(device.index)


def _cuda(index: int | None) -> torch.device:
    if not torch.cuda.is_available():
        why = "this torch build has no CUDA" if torch.version.cuda is None else "no CUDA device"
        raise DeviceError(
            f"{DEVICE_SETTING}: cuda requested but torch.cuda.is_available() is False ({why}; "
            f"torch {torch.__version__}); use device: cpu or device: auto"
        )
    n = torch.cuda.device_count()
    if index is None:
        index = int(os.environ.get("LOCAL_RANK", "0")) % max(n, 1)
    if index >= n:
        raise DeviceError(f"{DEVICE_SETTING}: cuda:{index} requested, torch sees {n} device(s)")
    return torch.device("cuda", index)


def cache_dir() -> Path:
    """The user cache directory: ``$TREERANK_CACHE`` when set, else ``~/.cache/treerank``."""
    env = os.environ.get("TREERANK_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "treerank"


def read_probe_cache(path: Path) -> dict[str, object]:
    """A measured-choice cache file (``key -> record``); ``{}`` when missing, unreadable or
    not a JSON object (the caches are advisory: a bad one only means measuring again)."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


def write_probe_cache(path: Path, doc: dict[str, object]) -> None:
    """Write a measured-choice cache atomically; an unwritable cache directory is ignored."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_json(path, doc, indent=1, sort_keys=True)
    except OSError:
        pass
