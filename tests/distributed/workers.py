"""Worker programs of the distributed tests (run under torchrun by ``helpers.torchrun``).

``workers.py train STORE OUT FAMILY``: one global batch's loss and gradients, then a 3-step
``fit``, written by every rank to ``OUT/rank<r>.npz``. ``workers.py finetune STORE OUT
FAMILIES [MODE]``: 2-step encoder fine-tunes (:func:`finetune`). Shared with the tests' one-process
reference through :func:`make_model` / :func:`make_sampler`.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch

B = 6  # per-rank batch
FIT_STEPS = 3


def make_sampler(store, batch_size: int):
    """SciFact train, 2 random hard negatives per query from a seeded pool (uneven M)."""
    from treerank.training.sampler import ContrastiveSampler

    rng = np.random.default_rng(7)
    pool = rng.integers(0, store.n_passages, size=(store.n_queries, 20)).astype(np.int64)
    return ContrastiveSampler(
        np.asarray(store.candidates),
        np.asarray(store.labels),
        batch_size=batch_size,
        n_hard=2,
        hard_pool=pool,
        seed=3,
    )


def make_model(family: str, dim: int) -> torch.nn.Module:
    """A small model of ``family``, built after ``torch.manual_seed(0)`` (no dropout)."""
    torch.manual_seed(0)
    if family == "linear":
        from treerank.models.linear import LinearHead

        return LinearHead(dim, learn_temperature=True)
    if family == "mlp":
        from treerank.models.mlp import MLPHead

        mlp = MLPHead(dim, hidden=32, dropout=0.0)
        with torch.no_grad():  # fc2 starts at 0 (identity head); perturb it so fc1 gets gradient
            for name, prm in mlp.named_parameters():
                if "fc2" in name:
                    prm.normal_(0.0, 0.05)
        return mlp
    from treerank.models.drt import DRTConfig, DRTHead
    from treerank.training.drt import DRTObjective

    head = DRTHead(DRTConfig(dim=dim, k=3, slot_dim=16, hidden=32, attn_hidden=8, slot_dropout=0.0))
    return DRTObjective(head, lambda_dec=0.5)


def trainer_config():
    from treerank.training.trainer import TrainerConfig

    return TrainerConfig(
        max_steps=FIT_STEPS,
        lr=1e-2,
        warmup_ratio=0.0,
        symmetric_weight=0.5,
        patience=None,
        log_every=1,
    )


def train(store_path: str, out: str, *families: str) -> None:
    from treerank.distributed.context import launch
    from treerank.store import EmbeddingStore

    torch.set_num_threads(1)
    store = EmbeddingStore.open(store_path)
    with launch() as ctx:
        assert ctx is not None and ctx.world_size == 2
        for family in families:
            _train_family(store, Path(out), family, ctx.rank)


def _train_family(store, out: Path, family: str, rank: int) -> None:
    from treerank.distributed.training import sharded_training
    from treerank.training.trainer import fit, loss_from_representations

    model = make_model(family, store.dim)
    shard = sharded_training(model, 0)
    assert shard is not None
    batch = next(iter(shard.global_sampler(make_sampler(store, B)).epoch(0)))
    loss, parts = shard.loss(
        batch,
        np.asarray(store.queries),
        np.asarray(store.passages),
        loss_from_representations,
        symmetric_weight=0.5,
    )
    loss.backward()
    grads = {f"grad/{n}": p.grad.numpy().copy() for n, p in model.named_parameters()}
    model = make_model(family, store.dim)
    res = fit(
        model,
        make_sampler(store, B),
        store.queries,
        store.passages,
        trainer_config(),
        progress=False,
    )
    state = {f"state/{k}": v.numpy().copy() for k, v in model.state_dict().items()}
    losses = np.array([r["loss"] for r in res.records if r["kind"] == "train"])
    np.savez(
        out / f"{family}-rank{rank}.npz",
        loss=np.array(float(loss.detach())),
        comm_bytes=np.array(parts["comm_bytes"]),
        batch_shape=np.array(batch.size),
        fit_losses=losses,
        **grads,
        **state,
    )


SEARCH_CASES = {
    # name: (k, chunk_size, query transform, passage transform)
    "cosine-k100": (100, 1000, None, None),
    "cosine-k4000": (4000, 700, None, None),  # k larger than a shard
    "rounded-ties": (50, 900, "round", "round"),  # scores on a coarse grid: many exact ties
    "constant": (20, 1000, None, "constant"),  # every score equal: ids 0..k-1
}


def search_case(store, name: str):
    """``(queries, passages, kwargs)`` of a search case (the tests' reference reuses it)."""
    k, chunk, qt, pt = SEARCH_CASES[name]
    q = np.asarray(store.queries, dtype=np.float32)
    if qt == "round":
        q = np.round(q * 4) / 4
    transform = None
    if pt == "round":
        transform = lambda x: np.round(np.asarray(x) * 4) / 4  # noqa: E731
    elif pt == "constant":
        transform = lambda x: np.ones_like(x)  # noqa: E731
    return q, store.passages, {"k": k, "chunk_size": chunk, "passage_transform": transform}


def search(store_path: str, out: str) -> None:
    from treerank.distributed.context import launch
    from treerank.kernels.sharded import sharded_exact_search
    from treerank.store import EmbeddingStore

    store = EmbeddingStore.open(store_path)
    with launch() as ctx:
        assert ctx is not None
        res = {}
        for name in SEARCH_CASES:
            q, p, kw = search_case(store, name)
            ids, scores = sharded_exact_search(q, p, ctx=ctx, **kw)
            res[f"{name}/ids"], res[f"{name}/scores"] = ids, scores
        np.savez(Path(out) / f"search-rank{ctx.rank}.npz", **res)


EMBED_QUERIES, EMBED_PASSAGES, EMBED_BATCH = 10, 40, 8


def embed_inputs(scifact_zip: str):
    """A 40-passage SciFact slice and the default encoder with small batches (5 + 2 batches)."""
    from treerank.encoders import SentenceEncoder
    from treerank.readers import read_split

    split = read_split(Path(scifact_zip), "scifact", "test", EMBED_QUERIES, EMBED_PASSAGES)
    return split, SentenceEncoder(max_batch_size=EMBED_BATCH)


def embed(scifact_zip: str, out: str) -> None:
    from treerank.distributed.context import launch
    from treerank.store.sharded_embed import embed_sharded

    torch.set_num_threads(1)
    split, encoder = embed_inputs(scifact_zip)
    with launch() as ctx:
        assert ctx is not None
        embed_sharded(split, encoder, Path(out) / split.name, progress=False)


FT_BATCH, FT_STEPS = 4, 2


def finetune_config(family: str):
    """A 2-step fine-tune of ``family`` at batch 4 with 1 hard negative column (biencoder,
    drt-e2e) and no dropout anywhere (the encoder's is switched off by :func:`finetune`)."""
    from treerank.training.finetune_config import parse_finetune_config

    data: dict = {"batch_size": FT_BATCH, "hard_negatives": "mined", "n_hard": 1}
    data["guard_skip_top"] = 0
    model: dict = {"max_query_length": 24, "max_passage_length": 48}
    if family in ("drt-e2e", "drt-query-tower"):
        model["drt"] = {"slot_dropout": 0.0}
    if family in ("query-tower", "drt-query-tower"):
        data["negatives"] = "in-batch"
    return parse_finetune_config(
        {
            "family": family,
            "seed": 3,
            "model": model,
            "data": data,
            "trainer": {"max_steps": FT_STEPS, "save_steps": 1, "logging_steps": 1, "lr": 1e-4},
            "validation": {"fraction": 0},
        }
    )


def finetune(store_path: str, out: str, families: str, mode: str = "run") -> None:
    """``treerank.training.finetune.finetune`` of :func:`finetune_config` into
    ``OUT/<family>`` for each of the comma-separated ``families``, with the encoder's dropout
    off, under ``launch()`` (torchrun with 1 or 2 processes, or none). ``mode``: ``run``,
    ``stop`` (a simulated Ctrl-C once step 1's checkpoint is written) or ``resume``."""
    import treerank.training.finetune as ft
    from treerank.store import EmbeddingStore

    torch.set_num_threads(1)
    base = ft._base_encoder

    def no_dropout(*args, **kwargs):
        enc = base(*args, **kwargs)
        for mod in enc.model.modules():
            if isinstance(mod, torch.nn.Dropout):
                mod.p = 0.0
        return enc

    ft._base_encoder = no_dropout  # restored below (the tests call this in their process)
    try:
        _finetune(EmbeddingStore.open(store_path), Path(out), families, mode)
    finally:
        ft._base_encoder = base


def _finetune(store, out: Path, families: str, mode: str) -> None:
    import treerank.training.finetune as ft
    from treerank.distributed.context import launch

    rng = np.random.default_rng(7)  # a seeded stand-in for BM25's mined negatives
    mined = rng.integers(0, store.n_passages, size=(store.n_queries, 10)).astype(np.int64)
    try:
        with launch():
            for family in families.split(","):  # one process group, one run per family
                ft.finetune(
                    store,
                    finetune_config(family),
                    out / family,
                    mined=mined,
                    resume=mode == "resume",
                    stop_after_steps=1 if mode == "stop" else None,
                )
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    cmd, *rest = sys.argv[1:]
    {"train": train, "search": search, "embed": embed, "finetune": finetune}[cmd](*rest)
