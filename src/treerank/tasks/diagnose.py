"""``diagnose``: the one library call behind ``treerank diagnose`` and the ``diagnose:`` stage.

Both hand it the typed :class:`~treerank.diagnostics.settings.DiagnosticsSettings`, the
baseline included (the stage builds it from the YAML ``diagnose:`` section and ``evaluate.k``);
it opens nothing and decides nothing itself:
:func:`~treerank.diagnostics.procedure.run_diagnostics` does the work.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from treerank.diagnostics.procedure import run_diagnostics
from treerank.diagnostics.settings import DiagnosticsSettings
from treerank.kernels.device import DEFAULT_DEVICE, Device
from treerank.storelike import StoreLike

__all__ = ["DiagnosticsSettings", "diagnose"]


def diagnose(
    checkpoint: str | Path,
    store: StoreLike,
    out_dir: str | Path,
    settings: DiagnosticsSettings,
    *,
    probe_stores: Sequence[StoreLike] = (),
    progress: bool = False,
    device: Device = DEFAULT_DEVICE,
) -> dict[str, Any]:
    """The four diagnostics of ``checkpoint`` on every passage of ``store``, into ``out_dir``.

    Args:
        checkpoint: a treerank checkpoint directory. store: the evaluation split.
        out_dir: where ``diagnostics.json``, the plots and ``report.md`` go (created).
        settings: every diagnostics setting (the baseline's spec, metric, metrics, ``k``, seeds,
            thresholds, plots).
        probe_stores: more stores of the same encoder whose queries join the probes and CKA.
        progress: progress bars. device: where the model scores (a parsed ``Device``).

    Returns:
        The diagnostics as plain JSON types (what ``diagnostics.json`` holds).

    Raises:
        FileNotFoundError / EncoderMismatchError / ValueError: as
            :func:`~treerank.diagnostics.procedure.run_diagnostics`.
    """
    return run_diagnostics(
        checkpoint,
        store,
        out_dir,
        settings=settings,
        probe_stores=probe_stores,
        progress=progress,
        device=device,
    )
