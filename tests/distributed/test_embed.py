"""Sharded embedding: the merged store equals the 1-process store byte for byte."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.distributed import workers
from tests.distributed.helpers import torchrun
from treerank.store import EmbeddingStore, embed_split
from treerank.store.format import META_JSON, StoreFormatError
from treerank.store.sharded_embed import SHARDS_DIR, embed_shard, merge_shards

TIMING = ("query_seconds", "passage_seconds")


@pytest.fixture(scope="module")
def inputs(scifact_zip):
    torch.set_num_threads(1)
    return workers.embed_inputs(str(scifact_zip))


@pytest.fixture(scope="module")
def reference(inputs, tmp_path_factory) -> Path:
    split, encoder = inputs
    out = tmp_path_factory.mktemp("one-process") / split.name
    embed_split(split, encoder, out, progress=False)
    return out


def _assert_same_store(got: Path, ref: Path) -> None:
    names = sorted(p.name for p in ref.iterdir())
    assert sorted(p.name for p in got.iterdir()) == names  # no shard directory left behind
    for name in names:
        if name != META_JSON:
            assert (got / name).read_bytes() == (ref / name).read_bytes(), name
    a = json.loads((got / META_JSON).read_text())
    b = json.loads((ref / META_JSON).read_text())
    for meta in (a, b):
        meta.pop("created_unix")
        for k in TIMING:
            meta["stats"].pop(k)
    assert a == b  # same counts, batches, tokens, signature; only the timings differ


def test_two_processes_merge_to_the_one_process_store(inputs, reference, scifact_zip, tmp_path):
    proc = torchrun(["embed", str(scifact_zip), str(tmp_path)])
    assert proc.returncode == 0, proc.stderr[-3000:]
    split, _ = inputs
    _assert_same_store(tmp_path / split.name, reference)
    st = EmbeddingStore.open(tmp_path / split.name)
    assert st.n_passages == workers.EMBED_PASSAGES
    meta = json.loads((reference / META_JSON).read_text())
    assert meta["stats"]["passage_batches"] >= 4  # both ranks really had batches to encode


def test_shards_resume_after_a_crash_and_merge(inputs, reference, tmp_path):
    split, encoder = inputs
    out = tmp_path / split.name
    with pytest.raises(StoreFormatError, match="rank0-of2: no readable shard"):
        merge_shards(split, encoder, out, 2, progress=False)
    embed_shard(split, encoder, out, 0, 2, progress=False)
    with pytest.raises(KeyboardInterrupt):
        embed_shard(split, encoder, out, 1, 2, progress=False, stop_after_batches=2)
    with pytest.raises(StoreFormatError, match="rank1-of2: shard incomplete"):
        merge_shards(split, encoder, out, 2, progress=False)
    state = embed_shard(split, encoder, out, 1, 2, progress=False)  # resumes rank 1
    assert state["complete"] and sum(state["done"].values()) >= 3
    assert len(state["batches"]["passage"]) == state["done"]["passage"]  # no batch twice
    merge_shards(split, encoder, out, 2, progress=False)
    assert not (out / SHARDS_DIR).exists()
    _assert_same_store(out, reference)
