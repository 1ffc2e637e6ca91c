"""``embed``: the one library call behind ``treerank embed`` and the ``embed:`` stage.

Both describe the encoder with the same typed :class:`EncoderSettings` (the command from its
options, the stage from the YAML ``encoder:`` section) and hand :func:`embed` an
:class:`EncoderLoader`, which loads the sentence-transformers model only when a split really has
to be encoded, once per device (the pipeline shares one loader between a dataset's splits).
:func:`embed` reads and embeds the splits with :func:`treerank.store.dataset.embed_dataset`
(under ``torchrun``: ``cuda`` becomes ``cuda:LOCAL_RANK``, one GPU per process).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from treerank.encoders import SentenceEncoder
from treerank.encoders.batching import DEFAULT_TOKEN_BUDGET
from treerank.kernels.device import DEFAULT_DEVICE, Device
from treerank.readers import RetrievalSplit
from treerank.store.dataset import EmbeddedSplit, embed_dataset

__all__ = ["EncoderLoader", "EncoderSettings", "embed"]


@dataclass(frozen=True)
class EncoderSettings:
    """How texts are encoded (the arguments of :class:`~treerank.encoders.SentenceEncoder`).

    Attributes:
        model: a sentence-transformers model name or local path (None: the bundled
            all-MiniLM-L6-v2). query_prompt / passage_prompt: prefixes (None: none).
        max_seq_length: truncation in tokens (None: the model's setting).
        token_budget: padded tokens (rows x longest) per batch. max_batch_size: items per batch.
        max_padding: largest padded fraction of any item in a batch (0..1).
        backend: ``torch``, ``onnx``, ``onnx-int8`` or ``auto``. threads: CPU threads (None:
            torch's setting). precision: ``fp32``, ``bf16`` or ``auto``; bf16_weights: also
            cast the weights with ``bf16``.
    """

    model: str | None = None
    query_prompt: str | None = None
    passage_prompt: str | None = None
    max_seq_length: int | None = None
    token_budget: int = DEFAULT_TOKEN_BUDGET
    max_batch_size: int = 256
    max_padding: float = 0.1
    backend: str = "torch"
    threads: int | None = None
    precision: str = "fp32"
    bf16_weights: bool = False


class EncoderLoader:
    """``loader(device) -> SentenceEncoder`` for :func:`embed`: built on first use, once per
    device, from :class:`EncoderSettings`.

    Args:
        settings: the encoder. progress: progress bars (False also hides transformers'
            "Loading weights" bar).
    """

    def __init__(self, settings: EncoderSettings, *, progress: bool = True) -> None:
        self.settings = settings
        self.progress = progress
        self._loaded: dict[Device, SentenceEncoder] = {}

    def __call__(self, device: Device) -> SentenceEncoder:
        """The encoder on ``device`` (loaded now if it was not yet).

        Raises:
            ValueError / OSError: as :class:`~treerank.encoders.SentenceEncoder` (an unknown
                precision or backend, a model that cannot be loaded).
        """
        if device not in self._loaded:
            s = self.settings
            self._loaded[device] = SentenceEncoder(
                s.model,
                query_prompt=s.query_prompt,
                passage_prompt=s.passage_prompt,
                device=device,
                max_seq_length=s.max_seq_length,
                token_budget=s.token_budget,
                max_batch_size=s.max_batch_size,
                max_padding=s.max_padding,
                progress=self.progress,
                backend=s.backend,
                threads=s.threads,
                precision=s.precision,
                bf16_weights=s.bf16_weights,
            )
        return self._loaded[device]


def embed(
    input_path: str | Path,
    out: str | Path,
    encoder: EncoderLoader,
    *,
    fmt: str = "auto",
    splits: Sequence[str] = (),
    limit: int | None = None,
    max_passages: int | None = None,
    device: Device = DEFAULT_DEVICE,
    resume: bool = False,
    overwrite: bool = False,
    reuse: bool = True,
    replace_stale: bool = False,
    progress: bool = True,
    split_dir: Callable[[str], Path] | None = None,
    on_read: Callable[[str, RetrievalSplit | None, bool], None] | None = None,
    on_done: Callable[[EmbeddedSplit], None] | None = None,
) -> list[EmbeddedSplit]:
    """Read and embed each split of a dataset into ``<out>/<split>/`` (or ``split_dir(split)``).

    Args:
        input_path / fmt / splits: the dataset (see :func:`treerank.store.dataset.plan_dataset`).
        out: the store root. encoder: the :class:`EncoderLoader` (called once a split was read).
        limit / max_passages: keep the first ``limit`` queries; cap the corpus.
        device: where the encoder runs (a parsed ``Device``).
        resume / overwrite / reuse / replace_stale / progress / split_dir / on_read / on_done:
            as :func:`treerank.store.dataset.embed_dataset`.

    Returns:
        One :class:`~treerank.store.dataset.EmbeddedSplit` per split, in order.

    Raises:
        DataFormatError: bad input (names the file and row). StoreFormatError / ValueError:
            an existing store without ``resume`` / ``overwrite``, a bad setting.
        LockHeldError: another process writes the store.
    """
    return embed_dataset(
        input_path,
        out,
        encoder,
        fmt=fmt,
        splits=splits,
        limit=limit,
        max_passages=max_passages,
        device=device,
        resume=resume,
        overwrite=overwrite,
        reuse=reuse,
        replace_stale=replace_stale,
        progress=progress,
        split_dir=split_dir,
        on_read=on_read,
        on_done=on_done,
    )
