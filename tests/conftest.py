"""Shared fixtures: real data paths, the default encoder, and cached real embedding stores.

Stores are built once with the default encoder (all-MiniLM-L6-v2) and cached on disk under
``<repo>/.cache/test-stores/<name>-<split>-<data digest>-<encoder fingerprint>/``, so repeated
test runs (and parallel pytest sessions, which wait on a file lock) do not re-encode. The key
changes when the data or the encoder weights change. ``TREERANK_SEED_STORES`` (an
``os.pathsep``-separated list of store roots) lets a finished store with the same data digest
and fingerprint be copied instead of built, e.g. ``TREERANK_SEED_STORES=/work/cache/stores``.

Fixtures (session-scoped):

* ``scifact_store``: ``{"train": EmbeddingStore, "test": EmbeddingStore}``, BEIR's splits, full
  5,183-passage corpus in both (test reuses train's passage vectors; first build ~3-10 min).
* ``msmarco_store``: ``{"validation": EmbeddingStore}``, the 10-query MS MARCO v2.1 sample.
* ``dl19_store``: ``{"test": EmbeddingStore}``, a subset of the DL19 pool to keep CI time sane:
  the first 10 topics (file order) with every judged pool passage of theirs, plus the first
  other pool passages up to 2,000 passages in all (`subset_split`).

Two tiers (``pytest -m "not integration"`` / ``-m integration``; ``scripts/test.sh`` runs both,
unit first): a test is in the **integration** tier when it is marked so, when it is marked
``slow``, when it sits under ``tests/distributed/`` (``torchrun`` processes), when it uses a
fixture of :data:`INTEGRATION_FIXTURES` (the real data files, the encoder, the real stores), or
when it is one of the slow end-to-end runs of :data:`INTEGRATION_TESTS`; the marks are added at
collection (:func:`pytest_collection_modifyitems`). Everything else is the
**unit** tier: small hand-made inputs, under three minutes in all on two CPU cores.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("MPLBACKEND", "Agg")

REPO = Path(__file__).resolve().parents[1]
# ../shared/data beside the repo; TREERANK_SHARED_DATA points elsewhere (a git worktree)
SHARED_DATA = Path(os.environ.get("TREERANK_SHARED_DATA", REPO.parent / "shared" / "data"))
SAMPLES = REPO / "data" / "samples"
CACHE = REPO / ".cache" / "test-stores"

INTEGRATION_FIXTURES = frozenset(
    {
        "shared_data",
        "scifact_zip",
        "msmarco_parquet",
        "dl19_dir",
        "encoder",
        "scifact_store",
        "msmarco_store",
        "dl19_store",
    }
)
"""Fixtures that read the real data sets or load the encoder: their tests are integration."""


INTEGRATION_TESTS = (
    "tests/cli/test_go_layout.py::",
    "tests/cli/test_mistakes.py::test_issue36_full_disk_during_embed_exits_3_and_resumes",
    "tests/cli/test_run.py::test_sigint_during_run_names_the_stage_and_says_rerun_continues",
    "tests/pipeline/test_name_files.py::test_unicode_and_long_model_names_keep_their_own_files",
    "tests/pipeline/test_published.py::test_published_numbers_equal_the_committed_report_results",
    "tests/pipeline/test_seeds.py::test_seed_variance_in_the_report",
    "tests/search/test_forest_probes.py::test_each_scoring_equals_dense_reference",
    "tests/search/test_forest_probes.py::test_forest_system_default_search_is_the_seed",
    "tests/test_gpu_check.py::",
    "tests/training/test_finetune.py::test_cached_mnrl_gradients_equal_plain_mnrl",
    "tests/training/test_forest_repartition.py::test_sampled_rounds_and_the_passage_term",
)
"""Node-id prefixes of end-to-end tests on hand-made inputs (whole experiments through the CLI
or the pipeline, a GPU-check script, training runs) that ``--durations`` measured slowest: the
integration tier too, so that the unit tier stays under three minutes."""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark the integration tier (see the module docstring)."""
    distributed = REPO / "tests" / "distributed"
    for item in items:
        names = set(getattr(item, "fixturenames", ()))
        if (
            names & INTEGRATION_FIXTURES
            or item.get_closest_marker("slow") is not None
            or distributed in Path(str(item.fspath)).parents
            or item.nodeid.startswith(INTEGRATION_TESTS)
        ):
            item.add_marker(pytest.mark.integration)


DL19_TEST_TOPICS = 10
DL19_TEST_MAX_PASSAGES = 2000


def _scifact_path() -> Path:
    p = SHARED_DATA / "beir-scifact" / "scifact.zip"
    return p if p.is_file() else SAMPLES / "scifact" / "scifact.zip"


def _msmarco_path() -> Path:
    p = SHARED_DATA / "msmarco-qna-v2.1-validation10" / "ms_marco_v2.1_validation_10.parquet"
    return p if p.is_file() else SAMPLES / "msmarco" / "ms_marco_v2.1_validation_10.parquet"


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """``../shared/data`` beside the repo (skips when absent)."""
    if not SHARED_DATA.is_dir():
        pytest.skip(f"real data folder {SHARED_DATA} not found")
    return SHARED_DATA


@pytest.fixture(scope="session")
def scifact_zip() -> Path:
    return _scifact_path()


@pytest.fixture(scope="session")
def msmarco_parquet() -> Path:
    return _msmarco_path()


@pytest.fixture(scope="session")
def dl19_dir(shared_data: Path) -> Path:
    return shared_data / "msmarco-trec-dl19"


@pytest.fixture(scope="session")
def encoder():
    """The default `SentenceEncoder` (all-MiniLM-L6-v2, offline), loaded once per session."""
    from treerank.encoders import SentenceEncoder

    return SentenceEncoder()


def _seed_dirs() -> list[Path]:
    raw = os.environ.get("TREERANK_SEED_STORES", "")
    return [Path(p) for p in raw.split(os.pathsep) if p]


def _find_seed(data_sha: str, fingerprint: str, split: str) -> Path | None:
    for root in _seed_dirs():
        for meta_path in sorted(root.glob(f"**/{split}/meta.json")):
            try:
                meta = json.loads(meta_path.read_text(encoding="utf-8"))
            except (OSError, json.JSONDecodeError):
                continue
            if (
                meta.get("complete")
                and meta.get("data_sha256") == data_sha
                and meta.get("encoder", {}).get("fingerprint") == fingerprint
                and not meta.get("encoder", {}).get("query_prompt")
            ):
                return meta_path.parent
    return None


def cached_store(name: str, split_loader: Callable[[], object], encoder) -> dict[str, object]:
    """Build (or reuse) the cached store of one dataset; see the module doc.

    ``split_loader`` returns a list of `RetrievalSplit` written in order under one root, so a
    later split reuses an earlier one's passage vectors.
    """
    from treerank.store import EmbeddingStore, embed_split, split_digest

    splits = split_loader()
    assert isinstance(splits, list)
    digest = "-".join(split_digest(s)[7:15] for s in splits)
    root = CACHE / f"{name}-{digest}-{encoder.fingerprint[7:19]}"
    root.mkdir(parents=True, exist_ok=True)
    out: dict[str, object] = {}
    with open(root / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        for split in splits:
            dest = root / split.name
            if not (dest / "meta.json").is_file():
                seed = _find_seed(split_digest(split), encoder.fingerprint, split.name)
                if seed is not None:
                    tmp = root / f".{split.name}.copy"
                    shutil.rmtree(tmp, ignore_errors=True)
                    shutil.copytree(seed, tmp)
                    shutil.rmtree(dest, ignore_errors=True)
                    os.replace(tmp, dest)
                else:
                    embed_split(split, encoder, dest, resume=True, progress=False)
            out[split.name] = EmbeddingStore.open(dest)
    return out


@pytest.fixture(scope="session")
def scifact_store(encoder) -> dict[str, object]:
    """``{"train", "test"}`` -> EmbeddingStore of BEIR SciFact with the full corpus."""
    from treerank.readers.scifact import read_scifact

    return cached_store(
        "scifact", lambda: [read_scifact(_scifact_path(), s) for s in ("train", "test")], encoder
    )


@pytest.fixture(scope="session")
def msmarco_store(encoder) -> dict[str, object]:
    """``{"validation"}`` -> EmbeddingStore of the 10-query MS MARCO v2.1 sample."""
    from treerank.readers.msmarco import read_msmarco

    return cached_store("msmarco", lambda: [read_msmarco(_msmarco_path(), "validation")], encoder)


@pytest.fixture(scope="session")
def dl19_store(encoder, dl19_dir: Path) -> dict[str, object]:
    """``{"test"}`` -> EmbeddingStore of the DL19 subset (10 topics, <= 2,000 passages)."""
    from treerank.readers import read_split

    return cached_store(
        "dl19",
        lambda: [read_split(dl19_dir, "trec-dl", "test", DL19_TEST_TOPICS, DL19_TEST_MAX_PASSAGES)],
        encoder,
    )


_FAILED_MODULES: set[str] = set()
"""Node ids of the test modules with a failed test: their scratch directories are kept."""


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):
    """Record the module of a failed setup, call or teardown (for :func:`_module_scratch`)."""
    report = yield
    if report.failed:
        _FAILED_MODULES.add(item.nodeid.split("::")[0])
    return report


@pytest.fixture(scope="module", autouse=True)
def _module_scratch(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    """Delete, when a test module ends with every test passed, what it left in pytest's base
    temporary directory: the ``tmp_path_factory.mktemp`` folders of its module-scoped fixtures
    (real stores, trained encoders and their checkpoints, ~0.3-5 GB a module). With
    ``tmp_path_retention_policy = "failed"`` (pyproject.toml) pytest already deletes a passed
    test's ``tmp_path``, but module folders would stay until the session ends: the integration
    tier once piled up 29 GB and filled CI's disk. A module with a failure keeps its folders.
    Being autouse and module-scoped, this is set up before the module's other module fixtures
    and torn down after them. Only module-scoped fixtures may ``mktemp`` in a test module."""
    base = tmp_path_factory.getbasetemp()
    before = set(base.iterdir())
    yield
    if request.node.nodeid in _FAILED_MODULES:
        return
    for path in sorted(set(base.iterdir()) - before):
        if path.is_symlink():  # mktemp's <prefix>current link
            path.unlink()
        else:
            shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def tmp_store_root(tmp_path: Path) -> Iterator[Path]:
    """An empty directory for stores written by a test."""
    root = tmp_path / "stores"
    root.mkdir()
    yield root


@pytest.fixture(autouse=True)
def _subnormals_kept() -> Iterator[None]:
    """Fail the test that leaves flush-to-zero on (``torch.set_flush_denormal(True)``): the flag
    is process-wide CPU state, so a leak breaks float32 round trips and Hypothesis in whatever
    test runs next, far from its cause. The flag is turned back off for the tests after it."""
    yield
    import numpy as np

    if np.float32(1e-40) * np.float32(1.0) == 0:  # a float32 subnormal read or made as zero
        import torch

        torch.set_flush_denormal(False)
        pytest.fail("this test left torch.set_flush_denormal(True) on (process-wide CPU state)")
