"""embed_dataset / plan_dataset: the decisions behind `treerank embed`, reachable as a library."""

from __future__ import annotations

import pytest

from treerank.readers import DataFormatError
from treerank.store import EmbeddingStore, StoreExistsError
from treerank.store.dataset import embed_dataset, plan_dataset


def test_plan_detects_the_format_and_its_default_split(msmarco_parquet, tmp_path) -> None:
    plan = plan_dataset(msmarco_parquet)
    assert (plan.format, plan.splits) == ("msmarco", ("validation",))
    # one file holds one split: reading it as train and dev would be a leak (issue 33)
    with pytest.raises(DataFormatError, match="would read the same rows"):
        plan_dataset(msmarco_parquet, "msmarco", ["train", "dev"])
    twice = plan_dataset(msmarco_parquet, "msmarco", ["dev", "dev"])
    assert twice.splits == ("dev",)  # a split named twice is embedded once
    with pytest.raises(DataFormatError, match="unknown format 'nosuch'"):
        plan_dataset(msmarco_parquet, "nosuch")
    (tmp_path / "x.csv").write_text("a,b\n")
    with pytest.raises(DataFormatError, match="cannot detect"):
        plan_dataset(tmp_path / "x.csv")


def test_bad_input_fails_before_the_encoder_loads(tmp_path) -> None:
    bad = tmp_path / "in.jsonl"
    bad.write_text('{"query_id": 1, "text": "q"}\n')
    calls: list[str] = []

    def make(device: object):  # never reached
        calls.append(device)
        raise AssertionError("the encoder must not load before the input was read")

    with pytest.raises(DataFormatError, match="row 1: row lacks 'query'"):
        embed_dataset(bad, tmp_path / "out", make, fmt="msmarco", progress=False)
    assert calls == [] and not (tmp_path / "out" / "validation" / "meta.json").exists()


def test_embed_dataset_writes_the_default_split_and_handles_an_existing_store(
    msmarco_parquet, encoder, tmp_path
) -> None:
    devices: list[str] = []
    events: list[tuple[str, bool]] = []

    def make(device: object):
        devices.append(device)
        return encoder

    def on_read(split, data, main):
        events.append((split, data is not None))

    out = tmp_path / "stores"
    (res,) = embed_dataset(
        msmarco_parquet, out, make, limit=1, progress=False, on_read=on_read, reuse=False
    )
    assert [str(d) for d in devices] == ["cpu"] and events == [
        ("validation", False),
        ("validation", True),
    ]
    assert res.path == out / "validation" and res.n_queries == 1 and res.k == 10
    st = EmbeddingStore.open(res.path)
    assert (st.n_queries, st.n_passages) == (1, res.n_passages)
    assert st.encoder_fingerprint == encoder.fingerprint == res.summary()["encoder_fingerprint"]
    assert res.stats is not None
    assert res.summary()["stats"]["padding_ratio"] == res.stats.padding_ratio
    before = (res.path / "passages.bin").read_bytes()
    events.clear()
    with pytest.raises(StoreExistsError, match="a finished store is already here"):
        embed_dataset(msmarco_parquet, out, make, limit=1, progress=False, on_read=on_read)
    assert events == [] and [str(d) for d in devices] == [
        "cpu"
    ]  # refused before reading or loading anything
    # the pipeline's choice: a finished store of other inputs is replaced, not an error
    (again,) = embed_dataset(
        msmarco_parquet, out, make, limit=1, progress=False, replace_stale=True, reuse=False
    )
    assert (again.path / "passages.bin").read_bytes() == before
