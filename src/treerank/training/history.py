"""Training history: a JSONL log written as training runs, and a PNG of its curves.

Each line of the log is one JSON object with a ``kind``: ``"train"`` (step diagnostics, see
``treerank.training.monitor``), ``"eval"`` (held-out metrics) or ``"summary"``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from treerank.atomic import atomic_savefig

__all__ = ["TrainingLog", "best_step", "plot_curves", "read_log"]


class TrainingLog:
    """Append-only JSONL log, flushed after every record; keeps the records in memory too.

    Args:
        path: file to write, or None to keep records in memory only.
    """

    def __init__(self, path: str | Path | None = None) -> None:
        self.path = Path(path) if path is not None else None
        self.records: list[dict[str, Any]] = []
        self._fh = None
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._fh = self.path.open("w", encoding="utf-8")

    def write(self, kind: str, **fields: Any) -> dict[str, Any]:
        """Append one record ``{"kind": kind, **fields}`` (non-finite floats become null)."""
        rec = {"kind": kind, **{k: _clean(v) for k, v in fields.items()}}
        self.records.append(rec)
        if self._fh is not None:
            self._fh.write(json.dumps(rec, sort_keys=True) + "\n")
            self._fh.flush()
        return rec

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None


def _clean(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


def read_log(path: str | Path) -> list[dict[str, Any]]:
    """Records of a JSONL training log.

    Raises:
        ValueError: a line is not JSON (the message names the file and line).
    """
    out = []
    for i, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        if line.strip():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{i}: not a JSON line ({exc})") from exc
    return out


def best_step(records: list[dict[str, Any]]) -> int | None:
    """The step of the last held-out evaluation that improved on every earlier one (the
    checkpoint that early stopping restores), or ``None`` without such a record."""
    steps = [r["step"] for r in records if r.get("kind") == "eval" and r.get("best")]
    return int(steps[-1]) if steps else None


def plot_curves(
    records: list[dict[str, Any]], path: str | Path, metric: str | None = None, title: str = ""
) -> Path:
    """PNG with two panels: training loss (and chance floor) by step; held-out metric by step.

    A dotted vertical line and a star mark the best step (:func:`best_step`), the checkpoint
    that is kept. Put the dataset in ``title``.

    Args:
        records: log records (``kind`` ``"train"`` with ``step``/``loss``/``chance_loss``;
            ``"eval"`` with ``step`` and metric values).
        path: PNG to write (atomically).
        metric: held-out metric to draw (default: every numeric field of the eval records).
        title: figure title.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    train = [r for r in records if r.get("kind") == "train"]
    evals = [r for r in records if r.get("kind") == "eval"]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    if train:
        steps = [r["step"] for r in train]
        # markers: a run that logged a single step still shows its point (a line needs two)
        marker = "o" if len(steps) <= 50 else None
        ax1.plot(steps, [r.get("loss") for r in train], marker=marker, ms=4, label="loss")
        if any(r.get("chance_loss") is not None for r in train):
            ax1.plot(
                steps,
                [r.get("chance_loss") for r in train],
                "--",
                marker=marker,
                ms=3,
                label="chance log(M)",
            )
        ax1.legend()
    ax1.set_xlabel("optimizer step")
    ax1.set_ylabel("loss (nats per query: InfoNCE + regularisers)")
    ax1.set_title("training loss")
    if evals:
        keys = (
            [metric]
            if metric
            else sorted(
                k
                for k, v in evals[0].items()
                if k not in ("kind", "step", "epoch", "best")
                and isinstance(v, (int, float))
                and not isinstance(v, bool)
            )
        )
        for k in keys:
            ax2.plot([r["step"] for r in evals], [r.get(k) for r in evals], "o-", label=k)
        best = best_step(records)
        if best is not None:
            rec = [r for r in evals if r["step"] == best][-1]
            for ax in (ax1, ax2):
                ax.axvline(best, color="black", ls=":", lw=1)
            for k in keys:
                if isinstance(rec.get(k), int | float):
                    ax2.plot([best], [rec[k]], "*", color="black", ms=12)
            ax2.plot([], [], "*", color="black", label=f"best step {best} (kept)")
        ax2.legend()
    ax2.set_xlabel("optimizer step")
    ax2.set_ylabel("held-out metric (all passages of the split)")
    ax2.set_title("held-out metrics")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_savefig(fig, path, dpi=100)
    return path
