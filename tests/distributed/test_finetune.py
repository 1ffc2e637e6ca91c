"""Data-parallel fine-tuning: ``torchrun`` with 2 processes trains on the one-process batches.

The 2-process run splits each planned batch of 4 rows into two shards of 2, and every rank's
rows are the negatives of all (:class:`treerank.training.finetune_losses.CrossRankLoss`); so
its losses and weights equal a one-process run's on the same plan, to float rounding (the
shards are tokenised with their own padding and the gradients are summed in another order).
Tolerance: losses to 1e-5 relative; weights to 2e-5 after two Adam steps at lr 1e-4 (a wrong
gradient, e.g. each rank's rows only as negatives, changes the losses at once and moves
weights by the order of lr). A resumed 2-process run equals the uninterrupted one exactly.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.distributed import workers
from tests.distributed.helpers import torchrun
from treerank.training.finetune import check_data_parallel
from treerank.training.finetune_config import DRT_FAMILIES, parse_finetune_config

FAMILIES = ("biencoder", "drt-e2e", "query-tower", "drt-query-tower")


@pytest.fixture(scope="module")
def ft_store(tmp_path_factory: pytest.TempPathFactory, scifact_zip: Path) -> Path:
    """The first 24 SciFact training claims and 80 abstracts, embedded with MiniLM."""
    from treerank.encoders import SentenceEncoder
    from treerank.readers import read_split
    from treerank.store import embed_split

    root = tmp_path_factory.mktemp("ddp-ft-store")
    split = read_split(scifact_zip, "scifact", "train", 24, 80)
    embed_split(split, SentenceEncoder(progress=False), root / "train", progress=False)
    return root / "train"


@pytest.fixture(scope="module")
def runs(ft_store: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Every family trained by 2 processes, by 1 process (this one), and biencoder stopped
    after step 1 and resumed (2 processes)."""
    root = tmp_path_factory.mktemp("ddp-ft")
    done = torchrun(["finetune", str(ft_store), str(root / "two"), ",".join(FAMILIES)])
    assert done.returncode == 0, done.stderr[-3000:]
    stop = torchrun(["finetune", str(ft_store), str(root / "cut"), "biencoder", "stop"])
    assert stop.returncode != 0  # the simulated Ctrl-C
    again = torchrun(["finetune", str(ft_store), str(root / "cut"), "biencoder", "resume"])
    assert again.returncode == 0, again.stderr[-3000:]
    threads = torch.get_num_threads()
    try:
        workers.finetune(str(ft_store), str(root / "one"), ",".join(FAMILIES))
    finally:
        torch.set_num_threads(threads)
    return {"two": root / "two", "one": root / "one", "cut": root / "cut"}


def _weights(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    out: dict[str, torch.Tensor] = {}
    for f in sorted(folder.glob("**/*.safetensors")):
        out.update({f"{f.relative_to(folder)}/{k}": v for k, v in load_file(str(f)).items()})
    assert out, f"no weights under {folder}"
    return out


def _summary(run: Path) -> dict:
    return json.loads((run / "finetune.json").read_text())["summary"]


@pytest.mark.parametrize("family", FAMILIES)
def test_two_processes_train_the_one_process_batches(runs: dict[str, Path], family: str) -> None:
    one, two = runs["one"] / family, runs["two"] / family
    s1, s2 = _summary(one), _summary(two)
    assert (s1["world_size"], s2["world_size"]) == (1, 2)
    assert s1["steps"] == s2["steps"] == workers.FT_STEPS
    l1 = [r["loss"] for r in s1["log"]]
    l2 = [r["loss"] for r in s2["log"]]
    assert len(l1) == workers.FT_STEPS
    assert l2 == pytest.approx(l1, rel=1e-5)
    folders = ["model"] + (["drt_head"] if family in DRT_FAMILIES else [])
    for folder in folders:
        a, b = _weights(one / folder), _weights(two / folder)
        assert a.keys() == b.keys()
        diff = max(float((a[k] - b[k]).abs().max()) for k in a)
        assert diff < 2e-5, (folder, diff)
    doc = json.loads((two / "finetune.json").read_text())
    assert doc["fingerprint"] != doc["base_fingerprint"]  # it did train
    # every rank wrote its RNG state into the same checkpoint folder, and only rank 0 the rest
    ckpt = two / "checkpoints" / f"checkpoint-{workers.FT_STEPS}"
    assert {p.name for p in ckpt.glob("rng_state_*.pth")} == {"rng_state_0.pth", "rng_state_1.pth"}
    assert not list((two / "checkpoints").glob(".checkpoint-tmp*"))


def test_a_two_process_run_resumes_bit_identically(runs: dict[str, Path]) -> None:
    full, cut = runs["two"] / "biencoder", runs["cut"] / "biencoder"
    assert _summary(cut)["resumed_from"] == "checkpoint-1"
    a, b = _weights(full / "model"), _weights(cut / "model")
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


def test_a_batch_that_does_not_split_or_gradcache_is_refused_before_any_work() -> None:
    cfg = parse_finetune_config({"family": "biencoder", "data": {"batch_size": 6}})
    check_data_parallel(cfg, 2)
    check_data_parallel(cfg, 3)
    with pytest.raises(ValueError, match="batch_size 6 does not split over 4"):
        check_data_parallel(cfg, 4)
    cached = parse_finetune_config(
        {"family": "biencoder", "data": {"batch_size": 8}, "trainer": {"loss": "cached-mnrl"}}
    )
    with pytest.raises(ValueError, match="cached-mnrl"):
        check_data_parallel(cached, 2)
    ce = parse_finetune_config({"family": "cross-encoder"})
    with pytest.raises(ValueError, match="cross-encoder family trains in one process"):
        check_data_parallel(ce, 2)


def test_the_cli_refuses_a_batch_that_does_not_split_once_on_every_rank(tmp_path: Path) -> None:
    for split in ("train", "test"):  # only their presence is read before the refusal
        (tmp_path / "store" / split).mkdir(parents=True)
        (tmp_path / "store" / split / "meta.json").write_text("{}")
    config = tmp_path / "ft.yaml"
    config.write_text("family: biencoder\ndata: {batch_size: 5}\n")
    args = [
        "finetune",
        str(config),
        "--store",
        str(tmp_path / "store"),
        "-o",
        str(tmp_path / "run"),
    ]
    done = torchrun(args, cli=True)
    assert done.returncode != 0
    assert done.stderr.count("data.batch_size 5 does not split over 2") == 1, done.stderr[-2000:]
    assert not (tmp_path / "run").exists()
