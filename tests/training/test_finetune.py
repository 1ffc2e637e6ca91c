"""Fine-tuning the encoder (``treerank.training.finetune``) on a real SciFact slice.

The slice: the first 24 training claims of BEIR SciFact and 80 abstracts (their cited ones
plus the first others), embedded once per session with the real all-MiniLM-L6-v2.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from treerank.config import ConfigError
from treerank.training.finetune import (
    CHECKPOINTS_DIR,
    EncoderStoreMismatchError,
    finetune,
    latest_checkpoint,
    plan_batches,
)
from treerank.training.finetune_config import parse_finetune_config


@pytest.fixture(scope="module")
def slice_store(tmp_path_factory: pytest.TempPathFactory, scifact_zip: Path):
    from treerank.encoders import SentenceEncoder
    from treerank.readers import read_split
    from treerank.store import EmbeddingStore, embed_split

    root = tmp_path_factory.mktemp("ft-store")
    split = read_split(scifact_zip, "scifact", "train", 24, 80)
    embed_split(split, SentenceEncoder(progress=False), root / "train", progress=False)
    return EmbeddingStore.open(root / "train")


def _cfg(family: str = "query-tower", **trainer: object):
    return parse_finetune_config(
        {
            "family": family,
            "seed": 3,
            "data": {"batch_size": 4},
            "trainer": {"max_steps": 4, "save_steps": 2, "logging_steps": 1, **trainer},
            "validation": {"fraction": 0},
        }
    )


def _weights(model_dir: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    files = sorted(model_dir.glob("**/model.safetensors"))
    assert files, f"no weights under {model_dir}"
    return load_file(str(files[0]))


def test_config_rejects_unknown_keys_and_values() -> None:
    with pytest.raises(ConfigError, match="family"):
        parse_finetune_config({"family": "drt"})
    with pytest.raises(ConfigError, match=r"trainer.*lrr"):
        parse_finetune_config({"family": "biencoder", "trainer": {"lrr": 1}})
    with pytest.raises(ConfigError, match="precision"):
        parse_finetune_config({"family": "biencoder", "trainer": {"precision": "fp8"}})
    cfg = parse_finetune_config({"family": "biencoder", "seed": 5})
    assert cfg.trainer.seed == 5 and cfg.to_dict()["family"] == "biencoder"


def test_batch_plan_keeps_the_collision_rule(slice_store) -> None:
    cfg = _cfg()
    plan = plan_batches(slice_store, cfg)
    assert plan.query_rows.shape[0] == plan.n_batches * 4
    texts = slice_store.query_texts()
    from treerank.training.sampler import relevant_lists

    rel, _ = relevant_lists(slice_store.candidates, slice_store.labels, 1)
    for b in range(plan.n_batches):
        rows = plan.query_rows[b * 4 : (b + 1) * 4]
        assert len({texts[r] for r in rows}) == 4  # no repeated query text
        targets = [set(rel[r][rel[r] >= 0].tolist()) for r in rows]
        for i in range(4):
            for j in range(i + 1, 4):
                assert not targets[i] & targets[j]  # no shared relevant passage
        for i in range(4):  # the designated positive is one of the query's
            assert plan.positive[b * 4 + i] in targets[i]
    # the same seed gives the same plan (what resuming relies on)
    again = plan_batches(slice_store, cfg)
    assert np.array_equal(again.query_rows, plan.query_rows)
    assert np.array_equal(again.positive, plan.positive)


def test_resume_is_bit_identical_and_trains_the_resumed_weights(
    slice_store, tmp_path: Path
) -> None:
    cfg = _cfg()
    full = finetune(slice_store, cfg, tmp_path / "full")
    assert full.summary["steps"] == 4
    with pytest.raises(KeyboardInterrupt):
        finetune(slice_store, cfg, tmp_path / "cut", stop_after_steps=2)
    ckpt = latest_checkpoint(tmp_path / "cut" / CHECKPOINTS_DIR)
    assert ckpt is not None and ckpt.name == "checkpoint-2"
    assert not any(p.name.startswith(".checkpoint-tmp") for p in ckpt.parent.iterdir())
    with pytest.raises(FileExistsError, match="resume"):
        finetune(slice_store, cfg, tmp_path / "cut")
    resumed = finetune(slice_store, cfg, tmp_path / "cut", resume=True)
    assert resumed.summary["resumed_from"] == "checkpoint-2"
    assert resumed.summary["steps"] == 4
    a, b = _weights(full.model_dir), _weights(resumed.model_dir)
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name
    assert resumed.fingerprint == full.fingerprint
    # the resumed run did train: its weights moved from the step-2 checkpoint's
    mid = _weights(ckpt)
    moved = max(float((b[n] - mid[n]).abs().max()) for n in b)
    assert moved > 0.0
    assert full.fingerprint != full.base_fingerprint


def test_refuses_a_base_encoder_that_is_not_the_stores(slice_store, tmp_path: Path) -> None:
    import shutil

    from sentence_transformers import SentenceTransformer

    from treerank.encoders.sentence import default_model_path

    other = SentenceTransformer(default_model_path(), device="cpu")
    with torch.no_grad():
        next(other.parameters()).add_(0.01)
    other.save(str(tmp_path / "other"))
    cfg = parse_finetune_config(
        {"family": "query-tower", "model": {"base": str(tmp_path / "other")}}
    )
    with pytest.raises(EncoderStoreMismatchError, match=str(slice_store.path)):
        finetune(slice_store, cfg, tmp_path / "run")
    shutil.rmtree(tmp_path / "other")


def _grads(loss_fn, features) -> dict[str, torch.Tensor]:
    model = loss_fn.model
    model.zero_grad()
    loss = loss_fn(features, None)
    loss.backward()
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def test_cached_mnrl_gradients_equal_plain_mnrl() -> None:
    """GradCache (CachedMNRL, mini-batch 2) gives the plain MNRL step's gradients on a real
    batch of 4 (claim, abstract) pairs; tolerance 1e-6 absolute, 1e-4 relative to the
    largest gradient entry (float32 sums in another order)."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer import losses

    from treerank.encoders.sentence import default_model_path

    model = SentenceTransformer(default_model_path(), device="cpu")
    model.eval()  # no dropout: both losses see the same function
    anchors = [
        "Vitamin D deficiency is linked to depression.",
        "Aspirin lowers the risk of heart attack.",
        "Smoking causes lung cancer.",
        "Exercise improves memory in older adults.",
    ]
    positives = [
        "Low serum vitamin D levels were associated with depressive symptoms in a cohort.",
        "Daily low-dose aspirin reduced myocardial infarction in a randomised trial.",
        "Tobacco smoke exposure is the leading cause of lung carcinoma.",
        "Aerobic training increased hippocampal volume and spatial memory.",
    ]
    feats = [model.preprocess(anchors), model.preprocess(positives)]
    plain = _grads(losses.MultipleNegativesRankingLoss(model, scale=20.0), feats)
    cached = _grads(
        losses.CachedMultipleNegativesRankingLoss(model, scale=20.0, mini_batch_size=2), feats
    )
    assert plain.keys() == cached.keys() and len(plain) > 50
    top = max(float(g.abs().max()) for g in plain.values())
    assert top > 0
    for name, g in plain.items():
        diff = float((g - cached[name]).abs().max())
        assert diff <= 1e-6 + 1e-4 * top, (name, diff, top)


def test_biencoder_gradcache_checkpointing_with_frozen_embeddings(
    slice_store, tmp_path: Path
) -> None:
    """BM25 negatives never labelled for their query; GradCache + gradient checkpointing with
    frozen embeddings and two frozen layers trains the layers above and nothing below
    (sentence-transformers #2531 / #2717: checkpointing with frozen inputs must still train)."""
    from treerank.search.negatives import mine_bm25_negatives
    from treerank.training.sampler import relevant_lists

    mined = mine_bm25_negatives(slice_store, 20)
    cfg = parse_finetune_config(
        {
            "family": "biencoder",
            "model": {"freeze_embeddings": True, "freeze_layers": 2, "max_passage_length": 64},
            "data": {"batch_size": 4, "hard_negatives": "mined", "n_hard": 1},
            "trainer": {
                "loss": "cached-mnrl",
                "mini_batch_size": 2,
                "gradient_checkpointing": True,
                "max_steps": 2,
                "lr": 1e-4,
            },
            "validation": {"fraction": 0},
        }
    )
    plan = plan_batches(slice_store, cfg, mined=mined)
    rel, _ = relevant_lists(slice_store.candidates, slice_store.labels, 1)
    assert (plan.hard >= 0).any()
    for q, h in zip(plan.query_rows, plan.hard[:, 0], strict=True):
        assert h < 0 or h not in set(rel[q].tolist())
    out = finetune(slice_store, cfg, tmp_path / "bi", mined=mined)
    from treerank.encoders.sentence import default_model_path

    base = _weights(Path(default_model_path()))
    tuned = _weights(out.model_dir)
    emb = [n for n in tuned if "embeddings" in n]
    low = [n for n in tuned if ".layer.0." in n or ".layer.1." in n]
    high = [n for n in tuned if ".layer.5." in n]
    assert emb and low and high
    for n in emb + low:
        assert torch.equal(tuned[n], base[n]), n
    assert any(not torch.equal(tuned[n], base[n]) for n in high)
    assert out.summary["trainable_parameters"] < 22_713_216


def test_bf16_precision_trains_under_autocast_and_keeps_fp32_weights(
    slice_store, tmp_path: Path
) -> None:
    cfg = parse_finetune_config(
        {
            "family": "query-tower",
            "data": {"batch_size": 4},
            "trainer": {"max_steps": 2, "precision": "bf16", "lr": 1e-4},
            "validation": {"fraction": 0},
        }
    )
    out = finetune(slice_store, cfg, tmp_path / "bf16")
    w = _weights(out.model_dir)
    assert {t.dtype for t in w.values()} == {torch.float32}
    assert out.fingerprint != out.base_fingerprint
    assert np.isfinite(out.summary["train_loss"])


def test_untie_copies_the_encoder_into_two_towers_and_freeze_reaches_both(encoder) -> None:
    """``untie`` (DPR's separate towers): the query tower starts as an exact copy of the
    document tower (the encoder itself), each routes its own kind of text, and
    ``freeze`` freezes the same parts of both."""
    from sentence_transformers import SentenceTransformer

    from treerank.encoders.sentence import is_routed
    from treerank.training.finetune import freeze, untie

    base = SentenceTransformer(encoder.model_path, device="cpu")
    n_base = sum(p.numel() for p in base.parameters())
    two = untie(base)
    assert is_routed(two) and not is_routed(base)
    towers = two[0].sub_modules
    q, d = towers["query"][0].auto_model, towers["document"][0].auto_model
    assert q is not d
    for (k, a), (_, b) in zip(q.state_dict().items(), d.state_dict().items(), strict=True):
        assert torch.equal(a, b), k
    text = ["does decaf coffee still have caffeine"]
    # equal weights; the copy's tensors sit elsewhere in memory, and the BLAS kernels may
    # round the last bit differently there (tolerance 1e-6 on unit vectors)
    np.testing.assert_allclose(two.encode_query(text), two.encode_document(text), atol=1e-6)
    np.testing.assert_allclose(two.encode_query(text), encoder.encode_queries(text), atol=1e-6)
    trainable = freeze(two, embeddings=True, layers=2)
    one = freeze(SentenceTransformer(encoder.model_path, device="cpu"), embeddings=True, layers=2)
    assert trainable == 2 * one < 2 * n_base
    with torch.no_grad():  # the towers are separate parameters: changing one leaves the other
        w = q.embeddings.word_embeddings.weight
        w.add_(0.5 * torch.randn(w.shape, generator=torch.Generator().manual_seed(0)))
    assert not np.allclose(two.encode_query(text), two.encode_document(text), atol=1e-3)


def test_an_untied_run_resumes_bit_identically_in_both_towers(slice_store, tmp_path: Path) -> None:
    """Resume (issue 35 item 4) with separate towers: every weights file of the two-tower
    folder equals the uninterrupted run's, bit for bit."""
    from safetensors.torch import load_file

    cfg = parse_finetune_config(
        {
            "family": "biencoder",
            "seed": 3,
            "model": {"untied": True, "max_passage_length": 32},
            "data": {"batch_size": 4},
            "trainer": {"max_steps": 4, "save_steps": 2, "logging_steps": 1},
            "validation": {"fraction": 0},
        }
    )
    full = finetune(slice_store, cfg, tmp_path / "full")
    with pytest.raises(KeyboardInterrupt):
        finetune(slice_store, cfg, tmp_path / "cut", stop_after_steps=2)
    resumed = finetune(slice_store, cfg, tmp_path / "cut", resume=True)
    assert resumed.summary["resumed_from"] == "checkpoint-2"
    files = sorted(p.relative_to(full.model_dir) for p in full.model_dir.glob("**/*.safetensors"))
    assert len(files) >= 2  # one per tower
    for rel in files:
        a, b = load_file(str(full.model_dir / rel)), load_file(str(resumed.model_dir / rel))
        assert a.keys() == b.keys()
        for name in a:
            assert torch.equal(a[name], b[name]), (rel, name)
    assert resumed.fingerprint == full.fingerprint != full.base_fingerprint
