"""One registration point for checkpoints: the family table's loader, injected below it.

Each public entry that loads a checkpoint is called on a forest checkpoint in a fresh
interpreter that imports only that entry (never ``treerank.families`` first), so no entry works
by the luck of an import made elsewhere. A lower layer left with its default loader refuses the
forest with an error naming the class and the checkpoint path.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from tests.pipeline.test_training import write_store

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def forest_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The smallest forest the tests use (2 random models, 3 classes) saved for a small store
    (80 queries, 300 passages, 16 dims): ``(checkpoint dir, store dir)``."""
    from treerank.forest.model import Forest, ForestConfig
    from treerank.models.checkpoint import save_checkpoint

    root = tmp_path_factory.mktemp("family-ckpt")
    store = write_store(root / "store" / "test")
    forest = Forest.random(ForestConfig(n_models=2, n_classes=3, dim=16), seed=0, name="f")
    save_checkpoint(root / "forest", forest.to_checkpoint("toy", store.encoder_fingerprint))
    return root / "forest", Path(store.path)


ENTRIES = {
    "compare_systems": """
        from treerank.evaluation.compare import compare_systems
        from treerank.evaluation.settings import EvaluationSettings
        from treerank.store import EmbeddingStore
        comp = compare_systems(
            EmbeddingStore.open(STORE),
            {"cosine": "cosine", "forest": f"ckpt:{CKPT}"},
            settings=EvaluationSettings(k=50, metrics=("ndcg@10",), n_permutations=50),
        )
        assert not comp.failed, comp.failed
        print(type(comp.runs["forest"]).__name__, comp.runs["forest"].ids.shape)
    """,
    "run_diagnostics": """
        from treerank.diagnostics.procedure import DiagnosticsSettings, run_diagnostics
        from treerank.store import EmbeddingStore
        settings = DiagnosticsSettings(
            k=50, metrics=("ndcg@10",), n_resamples=50, plots=False
        )
        res = run_diagnostics(CKPT, EmbeddingStore.open(STORE), OUT, settings=settings)
        print(res["meta"]["model_type"], res["model"]["mean"]["ndcg@10"] >= 0)
    """,
    "serve": """
        from types import SimpleNamespace
        import numpy as np
        from treerank.serve.app import create_app
        from treerank.serve.service import SearchService, ServiceConfig

        class Encoder:  # the store's encoder, without loading a model
            name, fingerprint, precision = "toy", "sha256:toy", "fp32"
            backend = SimpleNamespace(name="torch", precision="fp32")

            def encode_queries(self, texts):
                rng = np.random.default_rng(len(texts))
                return rng.standard_normal((len(texts), 16)).astype(np.float32)

        cfg = ServiceConfig(store=STORE, systems=(f"ckpt:{CKPT}",))
        service = SearchService(cfg, encoder=Encoder())  # warms the forest up
        create_app(service)
        print(type(service.systems[f"ckpt:{CKPT}"].system_for(service.store)).__name__)
    """,
    "load_model": """
        from treerank.families import load_model
        print(type(load_model(CKPT, "sha256:toy")).__name__)
    """,
}
EXPECTED = {
    "compare_systems": "Run (80, 50)",
    "run_diagnostics": "forest True",
    "serve": "ForestSystem",
    "load_model": "Forest",
}


@pytest.mark.parametrize("entry", list(ENTRIES))
def test_each_public_entry_loads_a_forest_in_a_fresh_interpreter(
    entry: str, forest_checkpoint: tuple[Path, Path], tmp_path: Path
) -> None:
    ckpt, store = forest_checkpoint
    code = (
        "import sys\n"
        f"CKPT, STORE, OUT = {str(ckpt)!r}, {str(store)!r}, {str(tmp_path / 'out')!r}\n"
        + textwrap.dedent(ENTRIES[entry])
    )
    assert "import treerank.families" not in code.splitlines()[:2]
    res = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300
    )
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.strip().splitlines()[-1] == EXPECTED[entry]


def test_a_lower_layer_refuses_an_unknown_class_naming_it_and_the_path(
    forest_checkpoint: tuple[Path, Path],
) -> None:
    """Without the family table's loader, the models and search layers know only their own
    (dense) families: the forest is refused with its class and checkpoint named."""
    from treerank.models.registry import UnknownModelClassError, load_model
    from treerank.search.specs import build_system
    from treerank.search.systems import DENSE_CHECKPOINTS
    from treerank.store import EmbeddingStore

    ckpt, store = forest_checkpoint
    with pytest.raises(UnknownModelClassError) as err:
        load_model(ckpt)
    msg = str(err.value)
    assert f"{ckpt}: checkpoint of unknown model class 'forest'" in msg
    assert "cosine, linear, mlp, drt" in msg and "treerank.families" in msg
    assert err.value.model_type == "forest" and err.value.path == ckpt
    assert isinstance(err.value, KeyError) and isinstance(err.value, ValueError)
    with pytest.raises(UnknownModelClassError, match=r"unknown model class 'forest'"):
        DENSE_CHECKPOINTS.load(ckpt)
    system = build_system(f"ckpt:{ckpt}")  # the default BuildContext: the dense loader
    with pytest.raises(UnknownModelClassError, match=rf"{ckpt}: .*'forest'"):
        system.retrieve(EmbeddingStore.open(store), 10)


def test_a_class_lookup_without_the_family_gives_the_path_too(tmp_path: Path) -> None:
    """Any injected lookup's KeyError becomes the same error, naming the class and the path."""
    from treerank.models.checkpoint import save_checkpoint
    from treerank.models.cosine import CosineScorer
    from treerank.models.registry import UnknownModelClassError, load_model

    save_checkpoint(tmp_path / "cos", CosineScorer().to_checkpoint("toy", "sha256:toy"))

    def nothing(model_type: str) -> type:
        raise KeyError(f"no family {model_type!r} here")

    with pytest.raises(UnknownModelClassError, match=r"cos: .*'cosine' \(no family 'cosine'"):
        load_model(tmp_path / "cos", classes=nothing)
    assert np.isfinite(load_model(tmp_path / "cos").encode_queries(np.ones((1, 4))).sum())
