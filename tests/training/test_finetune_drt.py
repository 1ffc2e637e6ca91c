"""The ``drt-e2e`` fine-tune family (the DRT heads on the unfrozen encoder), its config rules,
its loss, differential learning rates, resume, the saved heads, and the model-folder helper.

Real data: the first 24 training claims of BEIR SciFact and 80 abstracts, embedded once per
module with the real all-MiniLM-L6-v2; a handful of steps of batch 4.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from treerank.config import ConfigError
from treerank.training.finetune import (
    CHECKPOINTS_DIR,
    DRT_HEAD_DIR,
    HEAD_WEIGHTS,
    finetune,
    latest_checkpoint,
)
from treerank.training.finetune_config import drt_head_config, parse_finetune_config
from treerank.training.model_folder import save_model_folder


@pytest.fixture(scope="module")
def slice_store(tmp_path_factory: pytest.TempPathFactory, scifact_zip: Path):
    from treerank.encoders import SentenceEncoder
    from treerank.readers import read_split
    from treerank.store import EmbeddingStore, embed_split

    root = tmp_path_factory.mktemp("ft-drt-store")
    split = read_split(scifact_zip, "scifact", "train", 24, 80)
    embed_split(split, SentenceEncoder(progress=False), root / "train", progress=False)
    return EmbeddingStore.open(root / "train")


def _cfg(**trainer: object):
    return parse_finetune_config(
        {
            "family": "drt-e2e",
            "seed": 3,
            "model": {"max_passage_length": 48, "drt": {"k": 3, "slot_dim": 16, "hidden": 32}},
            "data": {"batch_size": 4},
            "trainer": {
                "max_steps": 4,
                "save_steps": 2,
                "logging_steps": 1,
                "lr": 5e-5,
                "head_lr": 2e-3,
                **trainer,
            },
            "validation": {"fraction": 0},
        }
    )


# ------------------------------------------------------------------ config


def test_drt_e2e_config_and_its_refusals() -> None:
    cfg = _cfg()
    assert cfg.family == "drt-e2e" and cfg.trainer.head_lr == 2e-3
    head = drt_head_config(cfg, 384)
    assert (head.dim, head.k, head.slot_dim, head.temperature) == (384, 3, 16, 0.05)
    assert drt_head_config(parse_finetune_config({"family": "drt-e2e"}), 384).k == 6
    with pytest.raises(ConfigError, match=r"model\.untied.*biencoder only"):
        parse_finetune_config({"family": "drt-e2e", "model": {"untied": True}})
    assert parse_finetune_config({"family": "biencoder", "model": {"untied": True}}).model.untied
    with pytest.raises(ConfigError, match=r"trainer\.head_lr.*drt-query-tower only"):
        parse_finetune_config({"family": "biencoder", "trainer": {"head_lr": 1e-3}})
    with pytest.raises(ConfigError, match=r"model\.drt.*drt-query-tower only"):
        parse_finetune_config({"family": "query-tower", "model": {"drt": {"k": 2}}})
    assert parse_finetune_config({"family": "drt-e2e", "trainer": {"loss": "cached-mnrl"}})
    with pytest.raises(ConfigError, match=r"model\.drt.*slots"):
        parse_finetune_config({"family": "drt-e2e", "model": {"drt": {"slots": 2}}})
    with pytest.raises(ConfigError, match=r"model\.drt.*dim"):
        parse_finetune_config({"family": "drt-e2e", "model": {"drt": {"dim": 8}}})
    with pytest.raises(ConfigError, match="head_lr"):
        parse_finetune_config({"family": "drt-e2e", "trainer": {"head_lr": 0}})


def test_drt_query_tower_config_takes_the_heads_and_refuses_graded_teachers() -> None:
    cfg = parse_finetune_config(
        {"family": "drt-query-tower", "model": {"drt": {"k": 2}}, "trainer": {"head_lr": 1e-3}}
    )
    assert cfg.query_only and cfg.drt_heads and cfg.trainer.head_lr == 1e-3
    assert drt_head_config(cfg, 384).k == 2
    plain = parse_finetune_config({"family": "query-tower"})
    assert plain.query_only and not plain.drt_heads
    e2e = parse_finetune_config({"family": "drt-e2e"})
    assert e2e.drt_heads and not e2e.query_only
    teacher = {"kind": "teacher", "system": "bm25", "mode": "margin-mse", "k": 5}
    with pytest.raises(ConfigError, match=r"data\.sources.*drt-query-tower takes sample"):
        parse_finetune_config(
            {"family": "drt-query-tower", "data": {"sources": [{"kind": "labels"}, teacher]}}
        )
    with pytest.raises(ConfigError, match=r"model\.untied.*biencoder only"):
        parse_finetune_config({"family": "drt-query-tower", "model": {"untied": True}})


def test_shipped_scale2_configs_differ_only_in_the_heads() -> None:
    from treerank.config import load_yaml

    repo = Path(__file__).resolve().parents[2] / "configs" / "finetune"
    bi = parse_finetune_config(load_yaml(repo / "scifact_biencoder_scale2.yaml")).to_dict()
    drt = parse_finetune_config(load_yaml(repo / "scifact_drt_e2e.yaml")).to_dict()
    assert bi["family"] == "biencoder" and drt["family"] == "drt-e2e"
    assert bi["seed"] == drt["seed"] and bi["data"] == drt["data"]
    assert bi["trainer"]["lr"] == drt["trainer"]["lr"] == 5e-5
    assert drt["trainer"]["head_lr"] == 2e-3
    same = {k for k in bi["trainer"] if k != "head_lr"}
    assert {k: bi["trainer"][k] for k in same} == {k: drt["trainer"][k] for k in same}
    # the query-side pair on SQuAD: the family and the heads apart, everything else equal
    qt = parse_finetune_config(load_yaml(repo / "squad_query_tower_scale2.yaml")).to_dict()
    dq = parse_finetune_config(load_yaml(repo / "squad_drt_query_tower.yaml")).to_dict()
    assert (qt["family"], dq["family"]) == ("query-tower", "drt-query-tower")
    assert qt["seed"] == dq["seed"] and qt["data"] == dq["data"]
    assert {k: v for k, v in qt["model"].items() if k != "drt"} == {
        k: v for k, v in dq["model"].items() if k != "drt"
    }
    assert qt["trainer"]["lr"] == dq["trainer"]["lr"] == 5e-5 and dq["trainer"]["head_lr"] == 2e-3
    same = {k for k in qt["trainer"] if k != "head_lr"}
    assert {k: qt["trainer"][k] for k in same} == {k: dq["trainer"][k] for k in same}
    assert qt["trainer"]["max_steps"] == 200 and qt["trainer"]["precision"] == "fp32"


# ------------------------------------------------------------------ loss


class _Fixed(torch.nn.Module):
    """A stand-in encoder: the features are the sentence embeddings."""

    def forward(self, features: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {"sentence_embedding": features["x"]}


def test_e2e_loss_equals_the_frozen_vector_drt_objective() -> None:
    """On the same vectors, the drt-e2e loss is the frozen-vector DRT trainer's objective
    (treerank.training.drt: InfoNCE over DRT scores / tau + lambda * decorrelation) with the
    batch's positives as the diagonal; tolerance 1e-6."""
    from treerank.models.drt import DRTConfig, DRTHead
    from treerank.training.drt import DRTObjective
    from treerank.training.finetune_losses import DRTEndToEndLoss

    torch.manual_seed(0)
    head = DRTHead(DRTConfig(dim=8, k=2, slot_dim=4, hidden=16, attn_hidden=4, slot_dropout=0.0))
    head.eval()
    q, p, n = (torch.nn.functional.normalize(torch.randn(5, 8), dim=1) for _ in range(3))
    loss = DRTEndToEndLoss(_Fixed(), head, scale=20.0, lambda_dec=0.1)
    got = loss([{"x": q}, {"x": p}, {"x": n}])
    obj = DRTObjective(head, lambda_dec=0.1)
    qr, pr = obj.encode_queries_t(q), obj.encode_passages_t(torch.cat([p, n]))
    logits = obj.score_matrix(qr, pr)  # DRT score / tau, tau = 0.05 = 1 / 20
    want = torch.nn.functional.cross_entropy(logits, torch.arange(5)) + obj.extra_loss(qr, pr)
    assert float(got.detach()) == pytest.approx(float(want.detach()), abs=1e-6)
    # the decorrelation term is really in it: lambda 0 gives a smaller loss
    plain = DRTEndToEndLoss(_Fixed(), head, lambda_dec=0.0)([{"x": q}, {"x": p}])
    assert float(plain.detach()) < float(loss([{"x": q}, {"x": p}]).detach())
    with pytest.raises(ValueError, match="anchor, positive"):
        loss([{"x": q}])


def test_gradcache_drt_gradients_equal_the_plain_steps() -> None:
    """GradCache over the drt-e2e loss (mini-batch 2, sentence-transformers' CachedLossMixin)
    gives the plain step's gradients, the encoder's and the heads' (slot dropout on, the same
    seed), on a real batch of 4 (claim, abstract, abstract) rows; tolerance 1e-6 absolute +
    1e-4 relative to the largest entry (float32 sums in another order)."""
    from sentence_transformers import SentenceTransformer

    from treerank.encoders.sentence import default_model_path
    from treerank.models.drt import DRTConfig, DRTHead
    from treerank.training.finetune_losses import DRTEndToEndLoss, cached_drt_loss

    model = SentenceTransformer(default_model_path(), device="cpu")
    model.eval()  # no encoder dropout: both passes see the same function
    torch.manual_seed(0)
    head = DRTHead(DRTConfig(dim=384, k=3, slot_dim=16, slot_dropout=0.2))
    texts = [
        ["Vitamin D deficiency is linked to depression.", "Aspirin lowers heart attack risk.",
         "Smoking causes lung cancer.", "Exercise improves memory in older adults."],
        ["Low serum vitamin D was associated with depressive symptoms.",
         "Daily low-dose aspirin reduced myocardial infarction.",
         "Tobacco smoke is the leading cause of lung carcinoma.",
         "Aerobic training increased hippocampal volume."],
        ["Statins lower LDL cholesterol.", "Coffee intake and liver enzymes.",
         "Sleep deprivation impairs attention.", "Obesity raises type 2 diabetes risk."],
    ]  # fmt: skip

    def grads(loss_fn) -> dict[str, torch.Tensor]:
        model.zero_grad()
        head.zero_grad()
        torch.manual_seed(7)  # the same slot-dropout masks
        loss_fn([model.preprocess(t) for t in texts], None).backward()
        named = [*model.named_parameters(), *(("head." + n, p) for n, p in head.named_parameters())]
        return {n: p.grad.detach().clone() for n, p in named if p.grad is not None}

    plain = grads(DRTEndToEndLoss(model, head, scale=20.0, lambda_dec=0.1))
    cached = grads(cached_drt_loss(model, head, scale=20.0, lambda_dec=0.1, mini_batch_size=2))
    assert plain.keys() == cached.keys() and len(plain) > 50
    assert any(n.startswith("head.") for n in plain)
    top = max(float(g.abs().max()) for g in plain.values())
    assert top > 0
    for name, g in plain.items():
        diff = float((g - cached[name]).abs().max())
        assert diff <= 1e-6 + 1e-4 * top, (name, diff, top)
    with pytest.raises(ValueError, match="mini_batch_size"):
        cached_drt_loss(model, head, scale=20.0, lambda_dec=0.1, mini_batch_size=0)


# ------------------------------------------------------------------ training


def _head_weights(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(path))


def test_drt_query_tower_loss_is_infonce_over_drt_scores_of_every_stored_passage() -> None:
    """StoredPassageDRTLoss, hand-built: the heads on the queries' vectors and on every stored
    passage vector, InfoNCE at scale 20 with a masked column at -inf, plus lambda x the mean
    decorrelation of the query slots and the positives' passage slots; tolerance 1e-6."""
    from treerank.models.drt import DRTConfig, DRTHead
    from treerank.training.drt import decorrelation_loss
    from treerank.training.finetune_losses import StoredPassageDRTLoss

    torch.manual_seed(0)
    head = DRTHead(DRTConfig(dim=8, k=2, slot_dim=4, hidden=16, attn_hidden=4, slot_dropout=0.0))
    head.eval()
    passages = torch.nn.functional.normalize(torch.randn(7, 8), dim=1)
    q = torch.nn.functional.normalize(torch.randn(3, 8), dim=1)
    positive = np.array([4, 0, 6, 2])  # four training rows; the batch is rows 0, 1, 2
    masked = np.array([[1, -1], [-1, -1], [-1, -1], [-1, -1]])  # row 0: passage 1 is relevant
    loss = StoredPassageDRTLoss(
        _Fixed(), head, passages.numpy(), positive, masked, scale=20.0, lambda_dec=0.1
    )
    got = loss([{"x": q}], torch.tensor([0, 1, 2]))
    with torch.no_grad():
        logits = 20.0 * head(q, passages)
        logits[0, 1] = float("-inf")
        pos = torch.tensor([4, 0, 6])
        ce = torch.nn.functional.cross_entropy(logits, pos)
        dec = decorrelation_loss(head.slots(q)) + decorrelation_loss(
            head.slots(passages[pos], "passage")
        )
    assert float(got.detach()) == pytest.approx(float(ce + 0.1 * dec / 2), abs=1e-6)
    # the loss reaches the heads and the query vectors, never the stored passages
    qv = q.clone().requires_grad_(True)
    loss([{"x": qv}], torch.tensor([0, 1, 2])).backward()
    assert qv.grad is not None and float(qv.grad.abs().sum()) > 0
    assert all(p.grad is not None for p in head.parameters() if p.requires_grad)
    assert not loss.raw_passages.requires_grad
    with pytest.raises(ValueError, match="lambda_dec"):
        StoredPassageDRTLoss(_Fixed(), head, passages.numpy(), positive, masked, lambda_dec=-1)


def test_drt_query_tower_trains_the_query_side_and_heads_on_the_query_towers_batches(
    slice_store, tmp_path: Path
) -> None:
    """drt-query-tower and query-tower of one seed see the same batches (same rows trained,
    same tokens); the DRT run saves heads bound to its tuned encoder, whose passage vectors
    are the store's (only queries were encoded while training)."""
    from treerank.models.drt import DRTHead
    from treerank.models.registry import load_model

    def cfg(family: str, **model: object):
        return parse_finetune_config(
            {
                "family": family,
                "seed": 3,
                "model": {"max_query_length": 32, **model},
                "data": {"batch_size": 4},
                "trainer": {"max_steps": 2, "save_steps": 2, "logging_steps": 1, "lr": 5e-5},
                "validation": {"fraction": 0},
            }
        )

    drt = finetune(
        slice_store,
        cfg("drt-query-tower", drt={"k": 3, "slot_dim": 16, "hidden": 32}),
        tmp_path / "drt",
    )
    plain = finetune(slice_store, cfg("query-tower"), tmp_path / "qt")
    assert drt.summary["steps"] == plain.summary["steps"] == 2
    assert drt.summary["cost"]["tokens"] == plain.summary["cost"]["tokens"]
    assert drt.fingerprint not in (plain.fingerprint, drt.base_fingerprint)
    ckpt = latest_checkpoint(tmp_path / "drt" / CHECKPOINTS_DIR)
    assert ckpt is not None and (ckpt / HEAD_WEIGHTS).is_file()
    assert not (tmp_path / "qt" / DRT_HEAD_DIR).exists()
    head = load_model(tmp_path / "drt" / DRT_HEAD_DIR, expected_fingerprint=drt.fingerprint)
    assert isinstance(head, DRTHead) and head.config.k == 3


def test_drt_e2e_trains_encoder_and_heads_at_their_own_rates(slice_store, tmp_path: Path) -> None:
    from sentence_transformers import SentenceTransformer

    from treerank.encoders.fingerprint import weights_fingerprint
    from treerank.models.checkpoint import EncoderMismatchError
    from treerank.models.drt import DRTHead
    from treerank.models.registry import load_model

    cfg = _cfg()
    out = finetune(slice_store, cfg, tmp_path / "run")
    assert out.summary["steps"] == 4 and out.fingerprint != out.base_fingerprint
    ckpt = latest_checkpoint(tmp_path / "run" / CHECKPOINTS_DIR)
    assert ckpt is not None and (ckpt / HEAD_WEIGHTS).is_file()
    # differential learning rates and no weight decay on norms and biases, from the saved
    # optimiser: the encoder's groups start at lr, the heads' at head_lr
    opt = torch.load(ckpt / "optimizer.pt", weights_only=False)
    groups = opt["param_groups"]
    by_lr: dict[float, int] = {}
    for g in groups:
        by_lr[g["initial_lr"]] = by_lr.get(g["initial_lr"], 0) + len(g["params"])
    head = load_model(tmp_path / "run" / DRT_HEAD_DIR, expected_fingerprint=out.fingerprint)
    assert isinstance(head, DRTHead) and head.config.k == 3
    n_head = len([p for p in head.parameters()])  # shared towers: each tensor once
    assert by_lr[2e-3] == n_head
    assert by_lr[5e-5] > 50
    decays = sorted({g["weight_decay"] for g in groups})
    assert decays == [0.0, 0.01]
    # the saved heads are the checkpoint's, and they moved from their seeded initialisation
    saved = _head_weights(ckpt / HEAD_WEIGHTS)
    state = head.checkpoint_state()
    for name, t in saved.items():
        assert torch.equal(state[name], t), name
    from treerank.models.drt import DRTHead as _H

    torch.manual_seed(cfg.train.seed)
    init = _H(drt_head_config(cfg, 384))
    assert saved.keys() == init.checkpoint_state().keys()
    assert max(float((state[n] - t).abs().max()) for n, t in init.checkpoint_state().items()) > 1e-4
    # model/ is the encoder alone (raw vectors), and the heads are bound to it
    enc = SentenceTransformer(str(out.model_dir), device="cpu")
    assert weights_fingerprint(enc) == out.fingerprint
    assert enc.get_embedding_dimension() == 384
    with pytest.raises(EncoderMismatchError):
        load_model(tmp_path / "run" / DRT_HEAD_DIR, expected_fingerprint=out.base_fingerprint)


def test_drt_e2e_trains_under_gradcache_and_saves_its_heads(slice_store, tmp_path: Path) -> None:
    out = finetune(
        slice_store, _cfg(loss="cached-mnrl", mini_batch_size=2, max_steps=2), tmp_path / "gc"
    )
    assert out.summary["steps"] == 2 and out.fingerprint != out.base_fingerprint
    ckpt = latest_checkpoint(tmp_path / "gc" / CHECKPOINTS_DIR)
    assert ckpt is not None and (ckpt / HEAD_WEIGHTS).is_file()
    assert (tmp_path / "gc" / DRT_HEAD_DIR).is_dir()


def test_drt_e2e_resume_is_bit_identical_heads_included(slice_store, tmp_path: Path) -> None:
    cfg = _cfg(max_steps=3, save_steps=1)
    full = finetune(slice_store, cfg, tmp_path / "full")
    with pytest.raises(KeyboardInterrupt):
        finetune(slice_store, cfg, tmp_path / "cut", stop_after_steps=2)
    resumed = finetune(slice_store, cfg, tmp_path / "cut", resume=True)
    assert resumed.summary["resumed_from"] == "checkpoint-2"
    assert resumed.fingerprint == full.fingerprint
    a = _head_weights(latest_checkpoint(tmp_path / "full" / CHECKPOINTS_DIR) / HEAD_WEIGHTS)
    b = _head_weights(latest_checkpoint(tmp_path / "cut" / CHECKPOINTS_DIR) / HEAD_WEIGHTS)
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name
    # the resumed run started from the step-2 heads, not from a fresh initialisation
    mid = _head_weights(tmp_path / "cut" / CHECKPOINTS_DIR / "checkpoint-2" / HEAD_WEIGHTS)
    assert max(float((b[n] - mid[n]).abs().max()) for n in b) > 0.0


# ------------------------------------------------------------------ diagnostics


def test_slot_cka_is_one_for_itself_and_for_rotated_slots() -> None:
    from treerank.diagnostics.drift import slot_cka

    rng = np.random.default_rng(0)
    a = rng.standard_normal((50, 3, 4))
    same = slot_cka(a, a)
    assert same["concatenated"] == pytest.approx(1.0, abs=1e-9)
    assert same["slots"] == pytest.approx([1.0] * 3, abs=1e-9)
    # linear CKA is invariant to an orthogonal map and an isotropic scale of each slot
    qmat, _ = np.linalg.qr(rng.standard_normal((4, 4)))
    rot = np.stack([2.0 * a[:, i] @ qmat for i in range(3)], axis=1)
    assert slot_cka(a, rot)["slots"] == pytest.approx([1.0] * 3, abs=1e-9)
    # independent noise is far from 1
    other = slot_cka(a, rng.standard_normal((50, 3, 4)))
    assert max(other["slots"]) < 0.6
    with pytest.raises(ValueError, match="same n and k"):
        slot_cka(a, a[:, :2])


# ------------------------------------------------------------------ model folders


def test_save_model_folder_is_all_or_nothing(tmp_path: Path) -> None:
    dest = tmp_path / "model"

    def write(text: str):
        def go(p: Path) -> None:
            (p / "weights.txt").write_text(text)

        return go

    save_model_folder(dest, write("one"))
    assert (dest / "weights.txt").read_text() == "one"

    def broken(p: Path) -> None:
        (p / "weights.txt").write_text("half")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        save_model_folder(dest, broken)
    assert (dest / "weights.txt").read_text() == "one"  # the old folder is untouched
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]  # no temp folder left
    save_model_folder(dest, write("two"))
    assert (dest / "weights.txt").read_text() == "two"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]


def test_latest_checkpoint_is_the_newest_complete_one(tmp_path: Path) -> None:
    assert latest_checkpoint(tmp_path / "missing") is None
    for n in (2, 10):
        (tmp_path / f"checkpoint-{n}").mkdir()
        (tmp_path / f"checkpoint-{n}" / "trainer_state.json").write_text("{}")
    (tmp_path / "checkpoint-12").mkdir()  # no trainer state: incomplete
    got = latest_checkpoint(tmp_path)
    assert got is not None and got.name == "checkpoint-10"


# ------------------------------------------------------------------ precision: auto


@pytest.mark.parametrize(("bf16_seconds", "want"), [(0.5, "bf16"), (2.0, "fp32"), (1.0, "fp32")])
def test_auto_precision_picks_bf16_only_where_the_probe_measured_it_faster(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, bf16_seconds: float, want: str
) -> None:
    """The real probe (the encoder's forward pass, fp32 and bf16 autocast on PROBE_TEXTS, so
    the fidelity bound is checked on real vectors) with an injected clock: bf16 twice as fast
    is chosen; slower, or merely equal, keeps fp32."""
    from treerank.encoders import SentenceEncoder
    from treerank.kernels.device import DEFAULT_DEVICE
    from treerank.training.finetune import resolve_precision

    monkeypatch.setenv("TREERANK_CACHE", str(tmp_path / "cache"))
    enc = SentenceEncoder(progress=False)
    clock = {"torch/fp32": 1.0, "torch/bf16": bf16_seconds}
    got, record = resolve_precision("auto", enc, DEFAULT_DEVICE, timer=lambda p, fn: clock[p.name])
    assert got == want
    assert record["setting"] == "auto" and record["probe"]["path"] == f"torch/{want}"
    assert record["probe"]["seconds"] == pytest.approx(clock)
    # fixed settings are kept without measuring
    assert resolve_precision("bf16", enc, DEFAULT_DEVICE, timer=None) == (
        "bf16",
        {"setting": "bf16"},
    )
    assert resolve_precision("fp32", enc, DEFAULT_DEVICE)[0] == "fp32"


# ------------------------------------------------------------------ ONNX export


def test_tuned_encoder_exports_through_onnx_and_agrees_with_torch(
    slice_store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A drt-e2e run's model/ is a plain module stack (the heads live in drt_head/), so the
    ONNX backend exports it; ONNX and torch vectors of real claims and abstracts agree within
    2e-5 per coordinate (float32 kernels in another order) and their fingerprint is the run's."""
    from treerank.encoders import SentenceEncoder
    from treerank.training.finetune import export_onnx

    monkeypatch.setenv("TREERANK_CACHE", str(tmp_path / "cache"))
    out = finetune(slice_store, _cfg(max_steps=1, save_steps=1), tmp_path / "run")
    onnx = export_onnx(out.model_dir, tmp_path / "run" / "onnx")
    assert onnx.is_file() and (onnx.parent / "key.json").is_file()
    import json

    key = json.loads((onnx.parent / "key.json").read_text(encoding="utf-8"))
    assert out.fingerprint in json.dumps(key)
    texts = list(slice_store.query_texts()[:6]) + list(slice_store.passage_texts()[:6])
    torch_vecs = SentenceEncoder(out.model_dir, progress=False).encode(texts, "passage")
    onnx_enc = SentenceEncoder(out.model_dir, backend="onnx", progress=False)
    assert onnx_enc.fingerprint == out.fingerprint
    onnx_vecs = onnx_enc.encode(texts, "passage")
    assert onnx_vecs.shape == torch_vecs.shape == (12, 384)
    assert float(np.abs(onnx_vecs - torch_vecs).max()) <= 2e-5


def test_scale2_query_side_run_trains_both_arms_per_seed_then_compares_their_pairs(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """``scripts/scale2_query_side.py run``: per seed, one ``train`` process per shipped config
    started before either is waited on (side by side), then one comparison over the seeds'
    pairs in (cosine arm, DRT arm) order; a failed arm stops it before the comparison."""
    import importlib.util

    path = Path(__file__).resolve().parents[2] / "scripts" / "scale2_query_side.py"
    spec = importlib.util.spec_from_file_location("scale2_query_side", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    events: list[tuple[str, list[str]]] = []
    code = {"rc": 0}

    class _Proc:
        def __init__(self, cmd: list[str]) -> None:
            events.append(("start", cmd))

        def wait(self) -> int:
            events.append(("wait", []))
            return code["rc"]

    monkeypatch.setattr(mod.subprocess, "Popen", _Proc)
    monkeypatch.setattr(mod.subprocess, "call", lambda cmd: events.append(("call", cmd)) or 0)
    argv = ["run", "S", str(tmp_path / "o"), "--seeds", "0", "1", "--results", "r.json"]
    assert mod.main(argv) == 0
    kinds = [k for k, _ in events]
    assert kinds == ["start", "start", "wait", "wait", "start", "start", "wait", "wait", "call"]
    starts = [c for k, c in events if k == "start"]
    assert [Path(c[5]).name for c in starts[:2]] == [
        "squad_query_tower_scale2.yaml",
        "squad_drt_query_tower.yaml",
    ]
    assert [c[c.index("--seed") + 1] for c in starts] == ["0", "0", "1", "1"]
    call = events[-1][1]
    assert call[call.index("--arms") + 1 : call.index("--arms") + 3] == [
        "query-tower",
        "drt-query-tower",
    ]
    pairs = [call[i + 1 : i + 3] for i, a in enumerate(call) if a == "--pair"]
    assert pairs == [
        [str(tmp_path / "o" / f"{f}-seed{s}") for f in ("query-tower", "drt-query-tower")]
        for s in (0, 1)
    ]
    events.clear()
    code["rc"] = 3
    assert mod.main(argv) == 1
    assert "call" not in [k for k, _ in events]


def test_scale2_seeds_costs_are_each_runs_own_and_render_in_gigabytes(tmp_path: Path) -> None:
    """``finetune_scale2_seeds.run_costs`` reads each run's ``finetune.json`` cost and, where
    ``scale2_query_side.py`` wrote one, the re-embedding in ``cost.json``; the page's row gives
    CPU-s and wall-s rounded, the peak RSS in GiB (2,048 MiB -> 2.0), the run's mean loss and
    its last logged loss with the step (a run without a log shows ``-``)."""
    import importlib.util

    path = Path(__file__).resolve().parents[2] / "scripts" / "finetune_scale2_seeds.py"
    spec = importlib.util.spec_from_file_location("finetune_scale2_seeds", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    cost = {"cpu_seconds": 396.8, "wall_seconds": 421.1, "peak_rss_mib": 2048.0}
    for name, family, extra in (("a", "query-tower", True), ("b", "drt-query-tower", False)):
        run = tmp_path / name
        run.mkdir()
        log = [{"step": 100, "loss": 4.5}, {"step": 200, "loss": 3.68541}] if extra else []
        summary = {"steps": 200, "cost": cost, "train_loss": 3.97612, "log": log}
        summary |= {"training_queries": 87552, "rows_trained": 12800}
        ft = {"config": {"family": family, "seed": 2}, "summary": summary}
        (run / "finetune.json").write_text(json.dumps(ft), encoding="utf-8")
        if extra:
            reembed = {"reembed_eval_split": {"cpu_seconds": 65.49}}
            (run / "cost.json").write_text(json.dumps(reembed), encoding="utf-8")
    rows = mod.run_costs([[tmp_path / "a", tmp_path / "b"]])
    assert [(r["family"], r["seed"], r["steps"]) for r in rows] == [
        ("query-tower", 2, 200),
        ("drt-query-tower", 2, 200),
    ]
    assert rows[0]["reembed_eval_split"] == {"cpu_seconds": 65.49}
    assert rows[1]["reembed_eval_split"] is None
    lines = mod._render_costs(rows)
    assert rows[0]["last_log"] == {"step": 200, "loss": 3.68541}
    assert (rows[1]["training_queries"], rows[1]["rows_trained"]) == (87552, 12800)
    assert lines[-2] == (
        "| `a` | query-tower | 2 | 200 | 397 | 421 | 2.0 | 65 | 3.9761 | 3.6854 (200) |"
    )
    assert lines[-1] == "| `b` | drt-query-tower | 2 | 200 | 397 | 421 | 2.0 | - | 3.9761 | - |"
