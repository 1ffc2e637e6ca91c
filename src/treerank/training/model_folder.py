"""Model folders written whole or not at all, and the newest resumable checkpoint.

Both trainers built on sentence-transformers (the encoder fine-tune, ``training/finetune.py``,
and the cross-encoder, ``training/cross_encoder.py``) end by saving a model folder and resume
from the newest ``checkpoint-N``. :func:`save_model_folder` writes the folder into a temporary
sibling and renames it into place, so a crash or Ctrl-C mid-save leaves either the old folder
or the new one, never a half-written one; :func:`latest_checkpoint` is the one rule for which
checkpoint a ``--resume`` continues from; :func:`staged_checkpoints` makes a trainer class
write each ``checkpoint-N`` into a staging folder renamed into place (a killed save leaves no
half-written checkpoint, and rotation never removes a complete one for it);
:func:`loss_log` is their one logging callback.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from treerank.atomic import make_temp_dir

__all__ = ["latest_checkpoint", "loss_log", "save_model_folder", "staged_checkpoints"]

_CHECKPOINT = re.compile(r"checkpoint-(\d+)")
TRAINER_STATE = "trainer_state.json"


def save_model_folder(dest: str | Path, write: Callable[[Path], object]) -> Path:
    """Write a model folder atomically: ``write(tmp)`` fills a temporary sibling folder of
    ``dest``, which then replaces ``dest`` (an existing ``dest`` is removed first).

    Args:
        dest: the final folder (its parent is created if missing).
        write: called with the temporary folder (a ``Path``), e.g.
            ``lambda p: model.save(str(p))``; its return value is ignored.

    Returns:
        ``dest``.

    Raises:
        Whatever ``write`` raises; the temporary folder is removed and ``dest`` is left as it
        was.
    """
    final = Path(dest)
    tmp = make_temp_dir(final.parent, f".{final.name}-tmp-")
    try:
        write(tmp)
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


def latest_checkpoint(ckpt_dir: str | Path) -> Path | None:
    """The newest complete ``checkpoint-N`` in ``ckpt_dir``: the largest ``N`` whose folder
    holds its ``trainer_state.json`` (the trainer writes that file last, so a checkpoint cut
    short mid-save is passed over; Hugging Face's ``get_last_checkpoint`` takes any folder of
    that name). None when the folder is missing or holds no complete checkpoint."""
    d = Path(ckpt_dir)
    if not d.is_dir():
        return None
    found: list[tuple[int, Path]] = []
    for sub in d.iterdir():
        m = _CHECKPOINT.fullmatch(sub.name)
        if m and sub.is_dir() and (sub / TRAINER_STATE).is_file():
            found.append((int(m.group(1)), sub))
    return max(found)[1] if found else None


def loss_log(
    records: list[dict[str, Any]],
    log: Callable[[str], None] | None,
    stop_after_steps: int | None,
) -> Any:
    """A Hugging Face ``TrainerCallback`` that appends ``{"step", "loss"}`` to ``records`` (and
    a ``step N: loss x`` line to ``log``) at every logged loss, and raises
    ``KeyboardInterrupt`` at the first checkpoint save at or after ``stop_after_steps`` (a test
    hook simulating Ctrl-C; None: never)."""
    from transformers import TrainerCallback

    class _Log(TrainerCallback):  # type: ignore[misc]
        def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kw: Any) -> None:
            if logs and "loss" in logs:
                rec = {"step": int(state.global_step), "loss": float(logs["loss"])}
                records.append(rec)
                if log is not None:
                    log(f"step {rec['step']}: loss {rec['loss']:.4f}")

        def on_save(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            if stop_after_steps is not None and state.global_step >= stop_after_steps:
                raise KeyboardInterrupt(f"test hook: stopped after step {state.global_step}")

    return _Log()


def staged_checkpoints(base: type) -> type:
    """A subclass of the Hugging Face trainer class ``base`` (sentence-transformers'
    ``SentenceTransformerTrainer`` or ``CrossEncoderTrainer``) whose ``_save_checkpoint``
    writes the whole ``checkpoint-N`` into a staging folder ``.checkpoint-tmp-*`` beside it
    and renames it into place, then rotates (``save_total_limit``): a crash or Ctrl-C mid-save
    leaves the earlier checkpoints and no partial one (the staging folder is removed).

    Under ``torchrun`` (:func:`treerank.distributed.context.current`) every rank writes its
    RNG state into one staging folder per step, ``.checkpoint-tmp-step<N>``, which rank 0
    renames into place between barriers, so no rank looks for a checkpoint before it is whole.
    """
    from transformers.trainer_utils import rotate_checkpoints

    from treerank.distributed.context import current

    class _Staged(base):  # type: ignore[misc,valid-type]
        _staging: Path | None = None

        def _get_output_dir(self, trial: Any) -> str:
            if self._staging is not None:
                return str(self._staging)
            return str(super()._get_output_dir(trial))

        def _save_checkpoint(self, model: Any, trial: Any) -> None:
            final = Path(str(self.args.output_dir))
            ctx = current()
            if ctx is None:
                self._staging = make_temp_dir(final, ".checkpoint-tmp-")
            else:  # one staging folder for every rank (each writes its RNG state into it)
                self._staging = final / f".checkpoint-tmp-step{int(self.state.global_step)}"
                if ctx.is_main:
                    shutil.rmtree(self._staging, ignore_errors=True)
                    self._staging.mkdir(parents=True)
                ctx.barrier()
            try:
                super()._save_checkpoint(model, trial)
                if ctx is not None:
                    ctx.barrier()  # every rank's files are in the staging folder
                if ctx is None or ctx.is_main:
                    for done in self._staging.iterdir():
                        dest = final / done.name
                        if dest.exists():
                            shutil.rmtree(dest)
                        os.replace(done, dest)
            finally:
                if ctx is None or ctx.is_main:
                    shutil.rmtree(self._staging, ignore_errors=True)
                self._staging = None
            if ctx is None or ctx.is_main:
                rotate_checkpoints(
                    output_dir=str(final),
                    save_total_limit=self.args.save_total_limit,
                    use_mtime=False,
                )
            if ctx is not None:
                ctx.barrier()  # nobody looks for the checkpoint before it is in place

    _Staged.__name__ = f"Staged{base.__name__}"
    return _Staged
