"""``treerank finetune`` end to end on real SciFact slices: re-embedded stores, the refusal of
mismatched stores, drift diagnostics, results.json and the CLI's bad-input exit."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from treerank.diagnostics.drift import StoreDataMismatchError, neighbour_overlap, store_drift
from treerank.pipeline.finetune import TunedStoreSystem, reembed_split, run_finetune
from treerank.store import EmbeddingStore
from treerank.training.finetune import EncoderStoreMismatchError
from treerank.training.finetune_config import parse_finetune_config


@pytest.fixture(scope="module")
def slice_root(tmp_path_factory: pytest.TempPathFactory, scifact_zip: Path) -> Path:
    """SciFact train (24 claims) and test (16 claims) slices, 80 abstracts each."""
    from treerank.encoders import SentenceEncoder
    from treerank.readers import read_split
    from treerank.store import embed_split

    root = tmp_path_factory.mktemp("ft-root")
    enc = SentenceEncoder(progress=False)
    for split, n in (("train", 24), ("test", 16)):
        embed_split(
            read_split(scifact_zip, "scifact", split, n, 80), enc, root / split, progress=False
        )
    return root


def _cfg(steps: int, family: str = "query-tower"):
    return parse_finetune_config(
        {
            "family": family,
            "data": {"batch_size": 4},
            "trainer": {"max_steps": steps, "save_steps": 1, "lr": 1e-4},
            "validation": {"fraction": 0},
        }
    )


@pytest.fixture(scope="module")
def run2(slice_root: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("ft-run") / "run"
    res = run_finetune(_cfg(2), slice_root, out, n_permutations=200)
    return out, res


def test_results_json_has_metrics_tests_parts_and_cost(run2: tuple[Path, dict]) -> None:
    out, res = run2
    on_disk = json.loads((out / "results.json").read_text(encoding="utf-8"))
    assert on_disk["checkpoint"] == "checkpoint-2" == res["checkpoint"]
    assert set(on_disk["systems"]) == {"cosine", "finetune-query-tower"}
    t = on_disk["paired_vs_cosine"]["ndcg@10"]
    assert t["ci_low"] <= t["delta"] <= t["ci_high"] and 0.0 <= t["p"] <= 1.0
    delta = (
        on_disk["systems"]["finetune-query-tower"]["ndcg@10"]
        - on_disk["systems"]["cosine"]["ndcg@10"]
    )
    assert t["delta"] == pytest.approx(delta, abs=1e-9)
    parts = on_disk["seen_unseen"]
    assert parts["n_seen"] + parts["n_unseen"] == on_disk["n_eval_queries"]
    cost = on_disk["cost"]
    assert cost["train"]["tokens"] > 0 and cost["train"]["cpu_seconds"] > 0
    assert cost["total"]["peak_rss_mib"] > 100
    assert 0.0 < on_disk["drift"]["test"]["cka_queries"] <= 1.0 + 1e-9


def test_reembedded_store_names_parent_checkpoint_and_keeps_frozen_passages(
    slice_root: Path, run2: tuple[Path, dict]
) -> None:
    out, res = run2
    parent = EmbeddingStore.open(slice_root / "test")
    tuned = EmbeddingStore.open(out / "stores" / "test")
    ft = tuned.meta["finetune"]
    assert ft["checkpoint"] == "checkpoint-2"
    assert ft["fingerprint"] == res["fingerprint"] == tuned.encoder_fingerprint
    assert ft["parent"]["store"] == str(parent.path.resolve())
    assert ft["parent"]["fingerprint"] == parent.encoder_fingerprint
    assert tuned.meta["data_sha256"] == parent.meta["data_sha256"]
    # re-embedded at the parent's truncation (256), not the training query length (64): the
    # saved model keeps the base model's limits (a fresh user's run failed here)
    assert tuned.meta["encoder"]["max_seq_length"] == parent.meta["encoder"]["max_seq_length"]
    tok = json.loads((out / "model" / "tokenizer_config.json").read_text(encoding="utf-8"))
    assert tok["model_max_length"] >= parent.meta["encoder"]["max_seq_length"] == 256
    # the query tower's passage side is the parent's, byte for byte; its queries moved
    assert np.array_equal(np.asarray(tuned.passages), np.asarray(parent.passages))
    assert not np.array_equal(np.asarray(tuned.queries), np.asarray(parent.queries))
    assert tuned.encoder_fingerprint != parent.encoder_fingerprint
    # search / serve load the store's encoder by name and pin it by fingerprint: the tuned one
    from treerank.search.query import load_store_encoder

    assert load_store_encoder(tuned).fingerprint == res["fingerprint"]


def test_store_key_changes_with_the_checkpoint(
    slice_root: Path, run2: tuple[Path, dict], tmp_path: Path
) -> None:
    out2, _ = run2
    from treerank.training.finetune import finetune

    train = EmbeddingStore.open(slice_root / "train")
    finetune(train, _cfg(1), tmp_path / "run1")
    one = reembed_split(
        tmp_path / "run1", EmbeddingStore.open(slice_root / "test"), tmp_path / "s1"
    )
    two = EmbeddingStore.open(out2 / "stores" / "test")
    assert one.meta["finetune"]["checkpoint"] == "checkpoint-1"
    assert one.encoder_fingerprint != two.encoder_fingerprint
    assert one.meta["signature"] != two.meta["signature"]


def test_mismatched_store_and_model_are_refused(
    slice_root: Path, run2: tuple[Path, dict], tmp_path: Path
) -> None:
    out, _ = run2
    tuned_test = EmbeddingStore.open(out / "stores" / "test")
    train = EmbeddingStore.open(slice_root / "train")
    with pytest.raises(EncoderStoreMismatchError) as err:
        TunedStoreSystem(tuned_test).retrieve(train, 10)
    assert str(tuned_test.path) in str(err.value) and str(train.path) in str(err.value)
    # a query tower over passage vectors of another encoder (here: the tuned store's own)
    with pytest.raises(EncoderStoreMismatchError) as err2:
        reembed_split(out, tuned_test, tmp_path / "again")
    assert str(tuned_test.path) in str(err2.value) and str(slice_root / "train") in str(err2.value)


def test_drift_of_a_store_with_itself_is_one(slice_root: Path, run2: tuple[Path, dict]) -> None:
    test = EmbeddingStore.open(slice_root / "test")
    same = store_drift(test, test, k=5)
    assert same["cka_queries"] == pytest.approx(1.0, abs=1e-9)
    assert same["cka_passages"] == pytest.approx(1.0, abs=1e-9)
    assert same["overlap_at_k"] == 1.0
    tuned = EmbeddingStore.open(run2[0] / "stores" / "test")
    moved = store_drift(test, tuned, k=5, passages=False)
    assert moved["cka_queries"] < 1.0 and moved["cka_passages"] is None
    with pytest.raises(StoreDataMismatchError, match="train"):
        store_drift(test, EmbeddingStore.open(slice_root / "train"))


def test_scale2_cka_table_is_one_for_a_store_with_itself_and_below_for_a_tuned_one(
    slice_root: Path, run2: tuple[Path, dict]
) -> None:
    import torch

    from treerank.diagnostics.drift import scale2_cka_table
    from treerank.models.drt import DRTConfig, DRTHead

    torch.manual_seed(0)
    head = DRTHead(DRTConfig(dim=384, k=3, slot_dim=16, hidden=32))
    head.eval()
    test = EmbeddingStore.open(slice_root / "test")
    same = scale2_cka_table(head, test, test, test)
    for side in ("passages", "queries"):
        row = same[side]
        values = [row["raw_bi_vs_drt"], row["raw_frozen_vs_bi"], row["raw_frozen_vs_drt"]]
        for key in ("slots_bi_vs_drt", "slots_frozen_vs_drt"):
            values += [row[key]["concatenated"], *row[key]["slots"]]
        assert values == pytest.approx([1.0] * len(values), abs=1e-6)
    tuned = EmbeddingStore.open(run2[0] / "stores" / "test")  # a query tower: queries moved
    moved = scale2_cka_table(head, test, test, tuned)
    assert moved["passages"]["raw_frozen_vs_drt"] == pytest.approx(1.0, abs=1e-6)
    assert moved["queries"]["raw_frozen_vs_drt"] < 1.0
    assert moved["queries"]["slots_frozen_vs_drt"]["n"] == test.n_queries


def test_neighbour_overlap_hand_computed() -> None:
    a = np.array([[1, 2, 3], [4, 5, -1]])
    b = np.array([[3, 9, 1], [-1, 7, 8]])
    assert neighbour_overlap(a, b).tolist() == [2 / 3, 0.0]


def test_cli_bad_config_exits_2_before_any_work(slice_root: Path, tmp_path: Path) -> None:
    from treerank.cli.main import app

    bad = tmp_path / "bad.yaml"
    bad.write_text("family: query-tower\ntrainer: {lrr: 1}\n", encoding="utf-8")
    res = CliRunner().invoke(
        app, ["finetune", str(bad), "--store", str(slice_root), "--out", str(tmp_path / "o")]
    )
    assert res.exit_code == 2, res.output
    assert "lrr" in res.output and not (tmp_path / "o").exists()
    res = CliRunner().invoke(app, ["drift", str(slice_root / "test"), str(slice_root / "train")])
    assert res.exit_code == 2 and "same items" in res.output


def test_heldout_queries_are_never_trained_and_are_scored(slice_root: Path, tmp_path: Path) -> None:
    cfg = parse_finetune_config(
        {
            "family": "query-tower",
            "data": {"batch_size": 4},
            "trainer": {"max_steps": 1},
            "validation": {"fraction": 0.25},
        }
    )
    res = run_finetune(cfg, slice_root, tmp_path / "run", n_permutations=50)
    held = res["heldout"]
    assert res["n_heldout_queries"] == held["n_queries"] > 0
    assert res["n_train_queries"] + res["n_heldout_queries"] <= 24
    assert set(held) == {"n_queries", "cosine", "finetune-query-tower"}
    assert 0.0 <= held["finetune-query-tower"]["ndcg@10"] <= 1.0


def test_drt_e2e_run_scores_its_heads_on_the_reembedded_store(
    slice_root: Path, tmp_path: Path
) -> None:
    """drt-e2e end to end: the re-embedded store holds raw vectors of the tuned encoder, the
    heads (RUN/drt_head) score it as a ckpt: system, the DRT slot CKA is in the drift record,
    and the heads refuse the frozen store (another encoder's vectors)."""
    from treerank.models.checkpoint import EncoderMismatchError
    from treerank.search.specs import build_system
    from treerank.training.finetune import DRT_HEAD_DIR

    cfg = parse_finetune_config(
        {
            "family": "drt-e2e",
            "model": {"max_passage_length": 48, "drt": {"k": 3, "slot_dim": 16, "hidden": 32}},
            "data": {"batch_size": 4},
            "trainer": {"max_steps": 2, "save_steps": 2, "lr": 1e-4, "head_lr": 2e-3},
            "validation": {"fraction": 0},
        }
    )
    out = tmp_path / "run"
    res = run_finetune(cfg, slice_root, out, n_permutations=100)
    assert set(res["systems"]) == {"cosine", "finetune-drt-e2e", "finetune-drt-e2e-cosine"}
    tuned = EmbeddingStore.open(out / "stores" / "test")
    frozen = EmbeddingStore.open(slice_root / "test")
    assert tuned.dim == frozen.dim == 384  # raw encoder vectors, not DRT vectors
    assert tuned.encoder_fingerprint == res["fingerprint"] != frozen.encoder_fingerprint
    assert tuned.meta["finetune"]["passage_vectors"] == "encoded by the tuned encoder"
    head = build_system(f"ckpt:{out / DRT_HEAD_DIR}")
    run = head.retrieve(tuned, 10)
    assert run.ids.shape == (tuned.n_queries, 10)
    with pytest.raises(EncoderMismatchError):
        head.retrieve(frozen, 10)
    slots = res["drift"]["test"]["drt_slots"]
    for side in ("passages", "queries"):
        s = slots[side]
        assert len(s["slots"]) == 3
        assert all(0.0 < v <= 1.0 + 1e-9 for v in [s["raw"], s["concatenated"], *s["slots"]])
    assert slots["passages"]["n"] == frozen.n_passages


def test_drt_query_tower_run_scores_its_heads_over_the_frozen_passage_vectors(
    slice_root: Path, tmp_path: Path
) -> None:
    """drt-query-tower end to end: only the queries are re-encoded, the heads score the
    re-embedded store as a ckpt: system beside cosine over the same vectors, and the passage
    side's slot CKA is 1 by construction (the same stored vectors)."""
    cfg = parse_finetune_config(
        {
            "family": "drt-query-tower",
            "model": {"drt": {"k": 3, "slot_dim": 16, "hidden": 32}},
            "data": {"batch_size": 4},
            "trainer": {"max_steps": 2, "save_steps": 2, "lr": 1e-4, "head_lr": 2e-3},
            "validation": {"fraction": 0},
        }
    )
    out = tmp_path / "run"
    res = run_finetune(cfg, slice_root, out, n_permutations=100)
    name = "finetune-drt-query-tower"
    assert set(res["systems"]) == {"cosine", name, f"{name}-cosine"}
    tuned = EmbeddingStore.open(out / "stores" / "test")
    frozen = EmbeddingStore.open(slice_root / "test")
    assert tuned.encoder_fingerprint == res["fingerprint"] != frozen.encoder_fingerprint
    assert np.array_equal(np.asarray(tuned.passages), np.asarray(frozen.passages))
    assert not np.array_equal(np.asarray(tuned.queries), np.asarray(frozen.queries))
    slots = res["drift"]["test"]["drt_slots"]
    assert slots["passages"]["raw"] == pytest.approx(1.0, abs=1e-6)
    assert 0.0 < slots["queries"]["raw"] <= 1.0 + 1e-9


def test_untied_towers_train_apart_and_encode_each_side_with_its_own(
    slice_root: Path, tmp_path: Path
) -> None:
    """``model.untied: true`` (DPR's separate towers, issue 35 item 1): both towers start from
    the store's encoder and train apart; the re-embedded store's queries come from the query
    tower and its passages from the document tower, as a fresh SentenceEncoder of the saved
    folder encodes them; the ONNX backends refuse the model."""
    from treerank.encoders import SentenceEncoder
    from treerank.encoders.sentence import is_routed

    cfg = parse_finetune_config(
        {
            "family": "biencoder",
            "model": {"untied": True, "max_passage_length": 48},
            "data": {"batch_size": 4},
            "trainer": {"max_steps": 2, "save_steps": 2, "lr": 1e-4},
            "validation": {"fraction": 0},
        }
    )
    out = tmp_path / "run"
    res = run_finetune(cfg, slice_root, out, n_permutations=50)
    enc = SentenceEncoder(out / "model", progress=False)
    assert enc.routed and is_routed(enc.model)
    q_tower = enc.model[0].sub_modules["query"][0].auto_model.state_dict()
    d_tower = enc.model[0].sub_modules["document"][0].auto_model.state_dict()
    apart = [k for k in q_tower if not np.array_equal(q_tower[k].numpy(), d_tower[k].numpy())]
    assert apart  # trained apart from the same start
    tuned = EmbeddingStore.open(out / "stores" / "test")
    assert tuned.encoder_fingerprint == res["fingerprint"] == enc.fingerprint
    texts = tuned.query_texts()  # every one: the same length-bucketed batches as the store's
    np.testing.assert_array_equal(np.asarray(tuned.queries), enc.encode_queries(texts))
    as_passages = enc.encode_passages(texts)  # the other tower: other vectors
    assert not np.allclose(as_passages, np.asarray(tuned.queries), atol=1e-4)
    # passages: re-embedding batches them by the parent store's token budget, so another batch
    # composition moves a float's last bits (tolerance 1e-6 on unit vectors)
    p_texts = tuned.passage_texts()
    np.testing.assert_allclose(np.asarray(tuned.passages), enc.encode_passages(p_texts), atol=1e-6)
    assert not np.allclose(np.asarray(tuned.passages), enc.encode_queries(p_texts), atol=1e-4)
    assert res["systems"]["finetune-biencoder"]["ndcg@10"] >= 0.0
    with pytest.raises(ValueError, match="separate query and passage towers"):
        enc._load_onnx(None, enc.backend)


def test_untied_applies_to_the_biencoder_only() -> None:
    from treerank.config import ConfigError

    with pytest.raises(ConfigError, match=r"ft\.model\.untied: .* biencoder only"):
        parse_finetune_config({"family": "query-tower", "model": {"untied": True}}, "ft")


def test_a_distilled_run_ranks_its_teacher_into_its_own_folder(
    slice_root: Path, tmp_path: Path
) -> None:
    """``treerank finetune`` with a ``data.sources`` teacher: the teacher's run goes into
    ``OUT/arrays`` (the store is only read) and the results carry the sources."""
    before = sorted(p.name for p in (slice_root / "train").rglob("*"))
    teacher = {"kind": "teacher", "system": "bm25", "mode": "margin-mse", "k": 5}
    cfg = parse_finetune_config(
        {
            "family": "query-tower",
            "data": {"batch_size": 4, "sources": [{"kind": "labels"}, teacher]},
            "trainer": {"max_steps": 1, "save_steps": 0, "lr": 1e-4},
            "validation": {"fraction": 0},
        }
    )
    out = tmp_path / "run"
    res = run_finetune(cfg, slice_root, out, n_permutations=20)
    assert sorted(p.name for p in (slice_root / "train").rglob("*")) == before
    stems = {p.name for p in (out / "arrays").iterdir()}
    assert any(s.startswith("teacher-") and s.endswith("-ids.npy") for s in stems)
    sources = res["training"]["sources"]
    assert [v["mode"] for v in sources.values()] == ["sample", "margin-mse"]
