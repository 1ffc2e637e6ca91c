"""Atomic file writes, used by every layer: a failed or interrupted write never leaves a
half-written file where a good one was.

Each function writes to a temporary file in the destination's directory (created if missing),
flushes it, then ``os.replace``-s it over the destination. Files get the usual
``0o666 & ~umask`` permissions rather than ``mkstemp``'s 0600.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _replace_via_temp(path: str | Path, write: Any, *, suffix: str = ".tmp") -> Path:
    """Create a temp file beside ``path``, call ``write(tmp)``, then rename it over ``path``."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=suffix, dir=p.parent)
    try:
        os.fchmod(fd, 0o666 & ~_umask())
        os.close(fd)
        write(Path(tmp))
        os.replace(tmp, p)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return p


def atomic_write_bytes(path: str | Path, data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically (fsync-ed before the rename); returns ``path``."""

    def write(tmp: Path) -> None:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())

    return _replace_via_temp(path, write)


def atomic_write_text(path: str | Path, text: str | Iterable[str]) -> Path:
    """Write UTF-8 ``text`` (a string, or an iterable of chunks streamed in order) atomically."""

    def write(tmp: Path) -> None:
        with open(tmp, "w", encoding="utf-8", newline="") as f:
            if isinstance(text, str):
                f.write(text)
            else:
                for chunk in text:
                    f.write(chunk)

    return _replace_via_temp(path, write)


def atomic_write_json(path: str | Path, obj: Any, **dumps_kwargs: Any) -> Path:
    """Write ``obj`` as indented UTF-8 JSON (``dumps_kwargs`` go to ``json.dumps``) atomically."""
    dumps_kwargs.setdefault("indent", 2)
    dumps_kwargs.setdefault("ensure_ascii", False)
    return atomic_write_text(path, json.dumps(obj, **dumps_kwargs) + "\n")


def atomic_savefig(fig: Any, path: str | Path, *, dpi: int = 120, **savefig_kwargs: Any) -> Path:
    """Save a matplotlib figure atomically (format from ``path``'s suffix) and close it."""
    import matplotlib.pyplot as plt

    try:
        return _replace_via_temp(
            path,
            lambda tmp: fig.savefig(tmp, dpi=dpi, **savefig_kwargs),
            suffix=Path(path).suffix or ".png",
        )
    finally:
        plt.close(fig)
