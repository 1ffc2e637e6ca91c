"""Atomic file writes, used by every layer: a failed or interrupted write never leaves a
half-written file where a good one was.

Each function writes to a temporary file in the destination's directory (created if missing),
flushes it, then ``os.replace``-s it over the destination. Files get the usual
``0o666 & ~umask`` permissions rather than ``mkstemp``'s 0600, and temporary directories swapped
in place of a destination (:func:`make_temp_dir`) ``0o777 & ~umask`` rather than ``mkdtemp``'s
0700, so colleagues on a shared machine can read what the umask lets them read.

:func:`check_output_dir` is the one pre-check of an output directory, run before any work by
every command that writes one (through :func:`treerank.lock.writer_lock`);
:func:`refuse_existing_output` refuses a non-empty one without ``--overwrite``.

:func:`is_disk_full` names the machine fault of a full filesystem (``ENOSPC``, ``EDQUOT``): the
CLI turns it into one line and its own exit code, and a per-system error catch re-raises it
instead of recording it as that system's failure.
"""

from __future__ import annotations

import errno
import json
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

DISK_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
"""``errno`` values of a full filesystem: no space left, disk quota exceeded."""


def is_disk_full(exc: BaseException) -> bool:
    """Whether ``exc`` is an ``OSError`` of a full filesystem (:data:`DISK_FULL_ERRNOS`)."""
    return isinstance(exc, OSError) and exc.errno in DISK_FULL_ERRNOS


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


class OutputPathError(ValueError):
    """An output path cannot be written: it is a file where a directory is needed, a parent is
    a file, or the nearest existing parent is not writable. The message names the path."""


def check_output_dir(path: str | Path, what: str = "output directory") -> Path:
    """Check, before any work, that directory ``path`` can be created or written; return it.

    Nothing is created. ``what`` names the path in the message (e.g. ``"--out"``).

    Raises:
        OutputPathError: ``path`` exists and is not a directory; an ancestor is a file; or the
            nearest existing ancestor (``path`` itself when it exists) is not writable.
    """
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise OutputPathError(
            f"{p}: exists and is not a directory; the {what} must be a directory "
            "(choose another path, or remove the file)"
        )
    anc = p
    while not anc.exists() and anc.parent != anc:
        anc = anc.parent
    if not anc.is_dir():
        raise OutputPathError(
            f"{p}: cannot be created, {anc} is a file (the {what} must be a directory)"
        )
    if not os.access(anc, os.W_OK | os.X_OK):
        raise OutputPathError(f"{p}: cannot write the {what}: {anc} is not writable")
    return p


class OutputExistsError(OutputPathError):
    """An output directory already holds earlier results and replacing them was not asked
    for (``--overwrite``)."""


def refuse_existing_output(
    path: str | Path, overwrite: bool, what: str = "earlier results", flag: str = "--overwrite"
) -> None:
    """Refuse, before any work, to write into a non-empty existing directory unless
    ``overwrite`` (every command that writes an output directory calls it; no silent
    overwrite). A missing or empty directory, or a path that is not a directory (refused by
    :func:`check_output_dir` with its own message), passes.

    Raises:
        OutputExistsError: ``path`` is a non-empty directory and ``overwrite`` is false; the
            message names the path, what is there and the flag.
    """
    p = Path(path)
    if overwrite or not p.is_dir() or not any(p.iterdir()):
        return
    raise OutputExistsError(
        f"{p}: already holds {what}; pass {flag} to replace them (the old contents are kept "
        "until the new ones are complete), or choose another output directory"
    )


def chmod_as_umask(path: str | Path) -> Path:
    """Give ``path`` the mode a plain ``open`` / ``mkdir`` would have: ``0o666 & ~umask`` for a
    file, ``0o777 & ~umask`` for a directory (for writers, like safetensors, that use 0600)."""
    p = Path(path)
    os.chmod(p, (0o777 if p.is_dir() else 0o666) & ~_umask())
    return p


def make_temp_dir(parent: str | Path, prefix: str) -> Path:
    """A new empty directory in ``parent`` (created if missing) with ``0o777 & ~umask``
    permissions, to be filled and then ``os.replace``-d over a destination."""
    parent = Path(parent)
    parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
    os.chmod(tmp, 0o777 & ~_umask())
    return tmp


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
    except BaseException as exc:
        Path(tmp).unlink(missing_ok=True)
        if is_disk_full(exc) and getattr(exc, "filename", None) is None:
            # a write(2) error names no file: name the destination (its old version is intact)
            raise OSError(exc.errno, exc.strerror, str(p)) from exc  # type: ignore[attr-defined]
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
