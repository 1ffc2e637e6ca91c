"""The training log as TensorBoard event files, offline, in the model directory.

Every numeric field of every log record that has a ``step`` becomes a scalar
``<kind>/<field>`` at that step (``train/loss``, ``train/chance_loss``, ``eval/mrr@10``, ...):
exactly the values of ``training_log.jsonl`` (float32 in the event file), nothing recomputed.
Booleans, ``step`` / ``epoch`` and non-finite values (``null`` in the log) are left out.
``tensorboard --logdir <models root>`` then finds every model directory.

Needs the ``tensorboard`` package (the ``tensorboard`` extra) for
``torch.utils.tensorboard.SummaryWriter``; without it nothing is written.
"""

from __future__ import annotations

import math
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

__all__ = ["EVENTS_FILE", "EVENTS_GLOB", "scalars_of", "write_event_files"]

EVENTS_GLOB = "events.out.tfevents.*"
EVENTS_FILE = "events.out.tfevents.treerank"
"""The event file's one fixed name (TensorBoard reads any ``*tfevents*`` file): the writer's
own name holds a timestamp, the host and the pid, so two runs of one config would leave
different file lists."""
_SKIP = ("step", "epoch", "kind")


def scalars_of(records: list[dict[str, Any]]) -> list[tuple[str, int, float]]:
    """``(tag, step, value)`` of every scalar written (see the module docstring), in log order."""
    out = []
    for rec in records:
        step = rec.get("step")
        if not isinstance(step, int) or isinstance(step, bool):
            continue
        kind = str(rec.get("kind", "log"))
        for key, value in rec.items():
            if key in _SKIP or isinstance(value, bool) or not isinstance(value, int | float):
                continue
            if math.isfinite(value):
                out.append((f"{kind}/{key}", step, float(value)))
    return out


def write_event_files(records: list[dict[str, Any]], out_dir: str | Path) -> Path | None:
    """Write the records' scalars as one TensorBoard event file in ``out_dir``.

    The file is written in a temporary folder inside ``out_dir`` and moved into place as
    :data:`EVENTS_FILE`; event files already there are replaced.

    Returns:
        The event file, or ``None`` when ``tensorboard`` is not installed or there is no scalar.
    """
    scalars = scalars_of(records)
    if not scalars:
        return None
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:  # the optional tensorboard extra is not installed
        return None
    out = Path(out_dir)
    tmp = Path(tempfile.mkdtemp(prefix=".tensorboard.", dir=out))
    try:
        writer = SummaryWriter(log_dir=str(tmp))
        for tag, step, value in scalars:
            writer.add_scalar(tag, value, global_step=step)
        writer.close()
        (event,) = tmp.glob(EVENTS_GLOB)
        for old in out.glob(EVENTS_GLOB):
            old.unlink()
        dest = out / EVENTS_FILE
        os.replace(event, dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest
