"""Exports carry the store's encoding contract (issue 36): a store embedded with
``--max-seq-length 32`` exported with 256 moved passage vectors by up to 0.147; prompts given at
embed time were dropped unless repeated at export (0.054), and plain ``encode()`` skipped the
document prompt (0.009). Here every encoder option is round-tripped through every export kind
(shared tower, untied towers through a Router, MLP), and the export's vectors are compared with
the head applied to the store's own vectors: max abs difference per component <= TOL (1e-5,
float32 rounding of a re-encode in other batches). What cannot be carried is refused."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from tests.models.test_export_st import _perturbed
from treerank.models.checkpoint import save_checkpoint
from treerank.models.export_st import (
    ContractError,
    encoding_contract,
    export_sentence_transformers,
)
from treerank.models.linear import LinearHead
from treerank.models.mlp import MLPHead

TOL = 1e-5

# encoder options of `treerank embed` that change vectors (backend: see test_backends_below)
OPTIONS = {
    "short-both-prompts": {
        "max_seq_length": 32,
        "query_prompt": "query: ",
        "passage_prompt": "passage: ",
    },
    "query-prompt-only": {"query_prompt": "Represent this question for retrieval: "},
}
HEADS = {
    "linear-untied": lambda: LinearHead(384, bias=True),
    "linear-shared": lambda: LinearHead(384, shared=True),
    "mlp-untied": lambda: MLPHead(384, hidden=64),
}


@pytest.fixture(scope="module", params=sorted(OPTIONS))
def option_store(request, msmarco_parquet, tmp_path_factory, encoder):
    """The 10-query MS MARCO sample embedded with one set of encoder options."""
    from treerank.encoders import SentenceEncoder
    from treerank.readers.msmarco import read_msmarco
    from treerank.store import EmbeddingStore, embed_split

    opts = OPTIONS[request.param]
    enc = SentenceEncoder(progress=False, **opts)
    out = tmp_path_factory.mktemp(request.param) / "validation"
    split = read_msmarco(msmarco_parquet, "validation")
    embed_split(split, enc, out, progress=False)
    return request.param, EmbeddingStore.open(out), enc


@pytest.mark.parametrize("head_name", sorted(HEADS))
def test_every_option_round_trips_through_every_export_kind(option_store, head_name, tmp_path):
    from sentence_transformers import SentenceTransformer

    opt_name, store, enc = option_store
    opts = OPTIONS[opt_name]
    head = _perturbed(HEADS[head_name](), seed=sorted(HEADS).index(head_name))
    ckpt = head.to_checkpoint(enc.name, enc.fingerprint)
    ckpt.extra["train_store"] = str(store.path)  # what `treerank train` records
    save_checkpoint(tmp_path / "ckpt", ckpt)

    res = export_sentence_transformers(tmp_path / "ckpt", tmp_path / "st")  # no prompt options
    model = SentenceTransformer(str(tmp_path / "st"), device="cpu")
    assert model.max_seq_length == opts.get("max_seq_length", 256) == res.max_seq_length
    want_prompts = {
        k: v
        for k, v in (("query", opts.get("query_prompt")), ("document", opts.get("passage_prompt")))
        if v is not None
    }
    assert {k: v for k, v in model.prompts.items() if v} == want_prompts == res.prompts

    want_q = head.encode_queries(np.asarray(store.queries))
    want_p = head.encode_passages(np.asarray(store.passages))
    got_q = model.encode_query(store.query_texts(), convert_to_numpy=True)
    got_p = model.encode_document(store.passage_texts(), convert_to_numpy=True)
    assert np.abs(got_q - want_q).max() <= TOL
    assert np.abs(got_p - want_p).max() <= TOL
    # treerank's own encoder of the folder sends each side through its own tower too
    from treerank.encoders import SentenceEncoder

    mine = SentenceEncoder(tmp_path / "st", progress=False, **opts)
    assert mine.routed == (head_name != "linear-shared")
    assert np.abs(mine.encode_queries(store.query_texts()) - want_q).max() <= TOL
    assert np.abs(mine.encode_passages(store.passage_texts()) - want_p).max() <= TOL
    # plain encode() is the passage tower with the passage prompt (default_prompt_name)
    plain = model.encode(store.passage_texts()[:16], convert_to_numpy=True)
    assert np.abs(plain - want_p[:16]).max() <= TOL
    info = json.loads((tmp_path / "st" / "treerank_export.json").read_text())
    assert info["encoding"]["max_seq_length"] == enc.max_seq_length

    # the contract recorded in the checkpoint itself (treerank train / run) gives the same
    ckpt.extra = {"encoding": encoding_contract(store.meta)}
    save_checkpoint(tmp_path / "ckpt2", ckpt)
    export_sentence_transformers(tmp_path / "ckpt2", tmp_path / "st2")
    again = SentenceTransformer(str(tmp_path / "st2"), device="cpu")
    got = again.encode_document(store.passage_texts()[:16], convert_to_numpy=True)
    assert np.abs(got - want_p[:16]).max() <= TOL


def _store_copy(store, tmp_path: Path, **encoder_meta) -> Path:
    out = tmp_path / "store"
    shutil.copytree(store.path, out)
    meta = json.loads((out / "meta.json").read_text())
    meta["encoder"].update(encoder_meta)
    (out / "meta.json").write_text(json.dumps(meta))
    return out


def test_backends_and_refusals(option_store, tmp_path):
    """onnx (fp32) is carried like torch; onnx-int8 cannot be (a sentence-transformers folder
    computes fp32) and is refused with the reason, as are prompts that differ from the store's
    and a recorded store that is gone. Nothing is written when refused."""
    opt_name, store, enc = option_store
    head = _perturbed(LinearHead(384), seed=3)

    def ckpt_for(store_path: Path, name: str) -> Path:
        ck = head.to_checkpoint(enc.name, enc.fingerprint)
        ck.extra["train_store"] = str(store_path)
        return save_checkpoint(tmp_path / name, ck)

    onnx = ckpt_for(_store_copy(store, tmp_path / "o", backend="onnx"), "onnx")
    assert export_sentence_transformers(onnx, tmp_path / "st-onnx").path.is_dir()

    int8 = ckpt_for(
        _store_copy(store, tmp_path / "i", backend="onnx-int8", precision="int8"), "int8"
    )
    with pytest.raises(ContractError, match=r"encoded at int8 \(backend 'onnx-int8'\)"):
        export_sentence_transformers(int8, tmp_path / "st-int8")
    assert not (tmp_path / "st-int8").exists()

    ck = ckpt_for(store.path, "ck")
    with pytest.raises(ContractError, match="--query-prompt 'other: '.*leave the option out"):
        export_sentence_transformers(ck, tmp_path / "st-p", query_prompt="other: ")
    same = OPTIONS[opt_name]["query_prompt"]  # the store's own prompt is accepted
    export_sentence_transformers(ck, tmp_path / "st-same", query_prompt=same)

    gone = ckpt_for(tmp_path / "no-such-store", "gone")
    with pytest.raises(ContractError, match=r"cannot read the store's encoding contract"):
        export_sentence_transformers(gone, tmp_path / "st-gone")
    # --store points at the store instead
    export_sentence_transformers(gone, tmp_path / "st-given", store=store.path)
