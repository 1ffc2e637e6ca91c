"""Incremental, failure-safe pipeline stages.

A stage is a named unit of work (``embed:scifact:test``, ``train:scifact:mlp``, ...) whose
**key** is a SHA-256 of everything its result depends on: its own configuration and the keys of
the stages it reads. A stage directory holds its outputs plus ``stage.json``
(``{"name", "key", "seconds", "finished_at", "summary"}``), written last: a directory without a
matching ``stage.json`` is never reused. A re-run whose key matches is skipped; a failing stage
raises :class:`StageError` naming the stage and the cause and leaves every finished stage
(its own previous result included) untouched, because new results are built in a temporary
directory and swapped in only on success.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from treerank.atomic import atomic_write_json, make_temp_dir
from treerank.faults import crash_point
from treerank.lock import lock_path

STAGE_FILE = "stage.json"


class StageError(RuntimeError):
    """A pipeline stage failed; ``stage`` names it and ``__cause__`` holds the original error."""

    def __init__(self, stage: str, cause: BaseException) -> None:
        self.stage = stage
        super().__init__(f"stage {stage!r} failed: {type(cause).__name__}: {cause}")


class StageInterrupted(KeyboardInterrupt):
    """Ctrl-C (SIGINT) arrived while stage ``stage`` was running.

    A ``KeyboardInterrupt``, so anything that handles Ctrl-C still does; ``in_place`` says
    whether the stage works in place and resumes where it stopped (embedding) rather than
    starting over. Finished stages are untouched either way.
    """

    def __init__(self, stage: str, in_place: bool) -> None:
        self.stage = stage
        self.in_place = in_place
        super().__init__(stage)

    def advice(self) -> str:
        """What the user reads: which stage stopped and what a re-run does."""
        again = (
            "continues this stage where it stopped" if self.in_place else "starts this stage again"
        )
        return (
            f"interrupted during stage {self.stage!r}; every finished stage is kept. "
            f"Re-run the same command to continue: it reuses the finished stages and {again}."
        )


def fingerprint(*parts: Any) -> str:
    """SHA-256 hex digest of the canonical JSON of ``parts`` (dict keys sorted)."""
    blob = json.dumps(parts, sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


def folder_identity(name: str | None) -> str | None:
    """A model folder's identity in a stage key: ``None`` stays ``None``; a local path, the
    SHA-256 of its bytes (:func:`file_sha256`); anything else (a hub name), the name itself."""
    if name is None:
        return None
    return file_sha256(name) if Path(name).exists() else str(name)


def file_sha256(path: str | Path, chunk: int = 1 << 20) -> str:
    """SHA-256 hex digest of a file's bytes (or of every file below a directory, sorted by path).

    Raises:
        FileNotFoundError: ``path`` does not exist.
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such file or directory")
    h = hashlib.sha256()
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    for f in files:
        if path.is_dir():
            h.update(str(f.relative_to(path)).encode())
        with open(f, "rb") as fh:
            while block := fh.read(chunk):
                h.update(block)
    return h.hexdigest()


DIGESTS_FILE = ".treerank-digests.json"
"""The name of the content-digest sidecar :func:`content_digests` keeps (``treerank run``: in
the run's cache directory, never in the store it describes)."""


def _stat_id(st: os.stat_result) -> list[int]:
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev]


def content_digests(root: Path, rels: list[str], sidecar: Path) -> dict[str, str]:
    """SHA-256 of each file ``root / rel``, computed once and kept in the JSON file ``sidecar``.

    ``sidecar`` lies outside ``root`` (``treerank run`` keeps it in the run's cache directory,
    :func:`digest_sidecar`), so a user's store is only ever read.

    The sidecar maps each file to its digest and to the ``stat`` it was computed at: size,
    mtime, **ctime**, inode and device. A digest is reused only when all five still match, so
    a file rewritten in place or replaced (``cp -p``, ``rsync -a`` or ``tar`` restore the
    mtime, but no user tool can restore the ctime, which the kernel sets on every write,
    rename or ``touch``) is hashed again. Callers key on the digests, never on the stat. An
    unwritable ``sidecar`` only means hashing again on the next run.

    Returns:
        ``{rel: hex SHA-256}`` for every ``rel``.
    """
    side = sidecar
    try:
        old = json.loads(side.read_text(encoding="utf-8"))
        old = old if isinstance(old, dict) else {}
    except (OSError, ValueError):
        old = {}
    out: dict[str, str] = {}
    doc: dict[str, Any] = {}
    changed = False
    for rel in rels:
        stat = _stat_id((root / rel).stat())
        hit = old.get(rel)
        if isinstance(hit, dict) and hit.get("stat") == stat and isinstance(hit.get("sha256"), str):
            out[rel] = hit["sha256"]
        else:
            out[rel] = file_sha256(root / rel)
            changed = True
        doc[rel] = {"stat": stat, "sha256": out[rel]}
    if changed or set(old) != set(doc):
        try:
            side.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_json(side, doc, indent=1, sort_keys=True)
        except OSError:
            pass
    return out


CACHE_DIR = ".cache"
"""The run's cache directory under its output directory (derived bookkeeping, never results)."""


def digest_sidecar(out_dir: Path, store: Path) -> Path:
    """Where ``treerank run`` keeps the content digests of a given store split ``store``:
    ``<out>/.cache/digests/<16 hex of the split's absolute path>/.treerank-digests.json``."""
    tag = hashlib.sha256(str(Path(store).resolve()).encode("utf-8")).hexdigest()[:16]
    return Path(out_dir) / CACHE_DIR / "digests" / tag / DIGESTS_FILE


@dataclass
class StageRecord:
    """What a finished stage left behind; ``skipped`` says why a stage did nothing."""

    name: str
    key: str
    path: Path
    seconds: float
    reused: bool
    summary: dict[str, Any] = field(default_factory=dict)
    skipped: str | None = None

    @property
    def status(self) -> str:
        """``"ran"``, ``"reused"`` or ``"skipped: <why>"``."""
        if self.skipped is not None:
            return f"skipped: {self.skipped}"
        return "reused" if self.reused else "ran"


def skip_stage(
    name: str, reason: str, path: Path, log: Callable[[str], None] = print
) -> StageRecord:
    """Record that stage ``name`` does nothing in this experiment, and say why in the log."""
    log(f"[skip]  {name}  ({reason})")
    return StageRecord(name, "", path, 0.0, False, {}, skipped=reason)


def read_stage(path: Path) -> dict[str, Any] | None:
    """The ``stage.json`` of a stage directory, or ``None`` if absent or unreadable."""
    try:
        doc = json.loads((path / STAGE_FILE).read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return doc if isinstance(doc, dict) else None


def run_stage(
    name: str,
    key: str,
    path: Path,
    work: Callable[[Path], dict[str, Any] | None],
    *,
    force: bool = False,
    in_place: bool = False,
    log: Callable[[str], None] = print,
    kind: str = "",
) -> StageRecord:
    """Run ``work(tmp_dir)`` unless ``path`` already holds a finished stage with this ``key``.

    ``work`` writes its outputs into the directory it is given and returns a JSON-serialisable
    summary. On success that directory replaces ``path`` atomically (rename); on failure it is
    deleted and ``path`` keeps whatever it held before.

    With ``in_place=True`` ``work`` runs on ``path`` itself, for work that is resumable on its
    own (embedding): ``stage.json`` is removed first and rewritten only on success, so a
    partial directory is never mistaken for a finished one, and a re-run can resume it.

    ``kind`` (the stage kind) names the crash point ``<kind>:before-stage-json``
    (:func:`treerank.faults.crash_point`), between the finished work and its ``stage.json``.
    Temporary directories of earlier runs that were killed (``.<name>.tmp-<pid>-*`` whose pid
    is no longer alive) are removed before the stage runs.

    Raises:
        StageError: ``work`` raised.
        StageInterrupted: Ctrl-C during ``work`` (a ``KeyboardInterrupt`` naming the stage).
    """
    done = read_stage(path)
    if not force and done is not None and done.get("key") == key:
        log(f"[reuse] {name}  (inputs unchanged; {path})")
        return StageRecord(
            name, key, path, float(done.get("seconds", 0.0)), True, dict(done.get("summary", {}))
        )
    log(f"[run]   {name}")
    path.parent.mkdir(parents=True, exist_ok=True)
    _remove_dead_temporaries(path)
    if in_place:
        path.mkdir(exist_ok=True)
        (path / STAGE_FILE).unlink(missing_ok=True)
        tmp = path
    else:
        tmp = make_temp_dir(path.parent, f".{path.name}.tmp-{os.getpid()}-")
    t0 = time.perf_counter()
    try:
        summary = work(tmp) or {}
        seconds = time.perf_counter() - t0
        crash_point(kind, "before-stage-json")
        doc = {
            "name": name,
            "key": key,
            "seconds": round(seconds, 3),
            "finished_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "summary": summary,
        }
        (tmp / STAGE_FILE).write_text(json.dumps(doc, indent=2, sort_keys=True, default=str))
    except KeyboardInterrupt as exc:
        if not in_place:
            shutil.rmtree(tmp, ignore_errors=True)
            lock_path(tmp).unlink(missing_ok=True)
        if isinstance(exc, StageInterrupted):  # a nested stage already named itself
            raise
        raise StageInterrupted(name, in_place) from exc
    except Exception as exc:
        if not in_place:
            shutil.rmtree(tmp, ignore_errors=True)
            lock_path(tmp).unlink(missing_ok=True)
        raise StageError(name, exc) from exc
    if in_place:
        log(f"[done]  {name}  ({seconds:.1f} s)")
        return StageRecord(name, key, path, seconds, False, summary)
    old = path.with_name(f".{path.name}.old-{os.getpid()}")
    shutil.rmtree(old, ignore_errors=True)
    if path.exists():
        os.replace(path, old)
    os.replace(tmp, path)
    shutil.rmtree(old, ignore_errors=True)
    # the writer lock a library call took on the temporary directory (released by now)
    lock_path(tmp).unlink(missing_ok=True)
    log(f"[done]  {name}  ({seconds:.1f} s)")
    return StageRecord(name, key, path, seconds, False, summary)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        return True
    return True


def _remove_dead_temporaries(path: Path) -> None:
    """Delete ``.<name>.tmp-<pid>-*`` / ``.<name>.old-<pid>`` beside ``path`` left by dead
    processes (a killed run); a live process's temporaries are left alone."""
    # (and the lock files ``..<name>.tmp-<pid>-*.lock`` of those temporaries)
    prefixes = (f".{path.name}.tmp-", f".{path.name}.old-", f"..{path.name}.tmp-")
    for p in path.parent.iterdir() if path.parent.is_dir() else ():
        pre = next((x for x in prefixes if p.name.startswith(x)), None)
        if pre is None:
            continue
        pid = p.name[len(pre) :].partition("-")[0]
        if pid.isdigit() and not _pid_alive(int(pid)):
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p, ignore_errors=True)
            else:
                p.unlink(missing_ok=True)
