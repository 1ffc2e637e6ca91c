"""Writer locks: one process at a time writes a directory (a store split, an evaluation, a
checkpoint, a run).

:func:`writer_lock` takes an exclusive ``fcntl.flock`` on ``<parent>/.<dir name>.lock``, a file
*beside* the directory (so that a directory replaced atomically, like a checkpoint, keeps its lock),
and writes its holder (pid, host, what, start time) into that file. A second writer does not wait by
default: it stops with :class:`LockHeldError`, whose message names the holder's pid; with ``wait``
it polls up to that many seconds first. The kernel drops a flock when its holder exits, killed or
not, so a lock file left behind by a dead process is *stale*: the next writer takes it over (and
:attr:`LockInfo.stale_holder` names the dead one). The lock is re-entrant within a process (a run
that holds its directory may call a stage that locks the same directory). Local filesystems only
(``flock`` on NFS depends on the mount).

A clean release removes the lock file, and the parent directories the lock itself created when
they are still empty, so a command that stops on a pre-check, or finishes, leaves nothing behind
but its output. Removing a lock file is safe against a writer that opened it just before: each
writer checks, once it holds the flock, that the path still names the file it locked, and starts
over otherwise.
"""

from __future__ import annotations

import fcntl
import functools
import inspect
import json
import os
import socket
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from treerank.atomic import check_output_dir

F = TypeVar("F", bound=Callable[..., Any])
LOCK_SUFFIX = ".lock"


def lock_path(directory: str | Path) -> Path:
    """The lock file of ``directory``: ``<parent>/.<name>.lock``."""
    d = Path(os.path.abspath(directory))
    return d.parent / f".{d.name}{LOCK_SUFFIX}"


class LockHeldError(RuntimeError):
    """Another process holds the writer lock of a directory.

    Attributes:
        directory: the directory. path: the lock file.
        holder: what the holder wrote (``pid``, ``host``, ``what``, ``started``), empty when
            unreadable.
    """

    def __init__(self, directory: Path, path: Path, holder: dict[str, Any]) -> None:
        self.directory = directory
        self.path = path
        self.holder = holder
        pid = holder.get("pid", "?")
        what = f" ({holder['what']})" if holder.get("what") else ""
        since = (
            time.strftime(" since %Y-%m-%d %H:%M:%S", time.localtime(holder["started"]))
            if isinstance(holder.get("started"), (int, float))
            else ""
        )
        super().__init__(
            f"{directory}: another treerank process is writing here: pid {pid}"
            f"{what} on {holder.get('host', '?')}{since}; wait for it to finish or stop it "
            f"(lock file {path})"
        )


@dataclass
class LockInfo:
    """The held lock: its file, and the pid of a dead previous holder whose lock was stale."""

    path: Path
    stale_holder: int | None = None


_HELD: dict[str, tuple[int, int]] = {}  # real path -> (fd, depth), this process


def _read_holder(fd: int) -> dict[str, Any]:
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        raw = os.read(fd, 4096)
        out = json.loads(raw.decode("utf-8")) if raw.strip() else {}
        return out if isinstance(out, dict) else {}
    except (OSError, ValueError):
        return {}


@contextmanager
def writer_lock(directory: str | Path, what: str = "", wait: float = 0.0) -> Iterator[LockInfo]:
    """Hold the writer lock of ``directory`` (its parent is created if missing) for the block.

    Args:
        directory: the directory about to be written.
        what: the holder's task, shown to a second writer (e.g. ``"embed"``).
        wait: seconds to wait for a held lock before giving up (0: stop at once).

    Yields:
        :class:`LockInfo`.

    Raises:
        LockHeldError: another live process holds the lock (after ``wait`` seconds).
        OutputPathError: ``directory`` cannot be a directory (a file is there, a parent is a
            file, or not writable; :func:`treerank.atomic.check_output_dir`), raised before
            anything is created.
    """
    check_output_dir(directory)  # before anything is created: a file there is no directory
    path = lock_path(directory)
    created = _missing_ancestors(path.parent)
    path.parent.mkdir(parents=True, exist_ok=True)
    key = os.path.realpath(path)
    if key in _HELD:  # re-entrant within this process
        fd, depth = _HELD[key]
        _HELD[key] = (fd, depth + 1)
        try:
            yield LockInfo(path)
        finally:
            fd, depth = _HELD[key]
            _HELD[key] = (fd, depth - 1)
        return
    deadline = time.monotonic() + max(wait, 0.0)
    fd = _acquire(path, Path(directory), deadline)
    try:
        previous = _read_holder(fd)
        stale = previous.get("pid") if previous.get("pid") != os.getpid() else None
        info = {"pid": os.getpid(), "host": socket.gethostname(), "what": what}
        info["started"] = time.time()
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(info) + "\n").encode("utf-8"), 0)
        _HELD[key] = (fd, 1)
        try:
            yield LockInfo(path, stale if isinstance(stale, int) else None)
        finally:
            del _HELD[key]
            os.ftruncate(fd, 0)  # never a stale holder, even if the unlink below fails
            with suppress(OSError):
                path.unlink()  # still holding the flock: a waiter re-checks the path (_acquire)
            for d in reversed(created):
                with suppress(OSError):
                    d.rmdir()  # only when still empty: the work wrote nothing there
    finally:
        os.close(fd)  # closing the descriptor releases the flock


def _missing_ancestors(d: Path) -> list[Path]:
    """``d`` and its ancestors that do not exist yet, outermost first."""
    out: list[Path] = []
    d = Path(os.path.abspath(d))
    while not d.exists() and d.parent != d:
        out.append(d)
        d = d.parent
    return out[::-1]


def _acquire(path: Path, directory: Path, deadline: float) -> int:
    """Open ``path`` and take its flock (polling until ``deadline``); return the descriptor.

    A lock file can be removed by its holder at release (see the module doc) between our
    ``open`` and our ``flock``: then we hold a lock on a file no other writer will see, so we
    check that ``path`` still names the locked file and start over when it does not.
    """
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        raise LockHeldError(directory, path, _read_holder(fd)) from None
                    time.sleep(min(0.2, max(deadline - time.monotonic(), 0.01)))
            try:
                same = os.stat(path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
        except BaseException:
            os.close(fd)
            raise
        if same:
            return fd
        os.close(fd)


def writes_dir(arg: str, what: str, attr: str | None = None) -> Callable[[F], F]:
    """Decorator: run the function holding :func:`writer_lock` on the directory given by its
    argument ``arg`` (or by that argument's attribute ``attr``); no lock when it is ``None``.

    Example: ``@writes_dir("out_dir", "embed")`` above ``def embed_split(split, encoder,
    out_dir, ...)``; ``@writes_dir("cfg", "run", attr="output_dir")``.
    """

    def deco(fn: F) -> F:
        sig = inspect.signature(fn)

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            bound = sig.bind_partial(*args, **kwargs)
            target = bound.arguments.get(arg, sig.parameters[arg].default)
            if attr is not None and target is not None:
                target = getattr(target, attr, None)
            if target is None or target is inspect.Parameter.empty:
                return fn(*args, **kwargs)
            with writer_lock(target, what):
                return fn(*args, **kwargs)

        return wrapper  # type: ignore[return-value]

    return deco
