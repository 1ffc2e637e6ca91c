"""Training-config twins: ``untrained: true`` returns the twin, ``init: twin`` starts from it."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.training.test_forest import SMALL, sectioned
from treerank.config import ConfigError
from treerank.forest.model import Forest, ForestConfig, ForestSearch
from treerank.forest.trainer import train_forest


@pytest.mark.parametrize("kind", ["random", "sign"])
def test_untrained_config_is_the_twin_with_its_curve(toy_store, kind) -> None:
    seen = []

    def validate(forest: Forest) -> dict[str, float]:
        seen.append(forest.n_models)
        return {"mrr@10": 0.0}

    cfg = {**SMALL, "twin": kind, "untrained": True, "seed": 5, "name": f"forest-{kind}"}
    cfg["probe"] = 2
    out = train_forest(toy_store, sectioned(cfg), validate=validate, progress=False)
    twin = Forest.twin(kind, ForestConfig(4, 4, int(toy_store.dim)), seed=5)
    for a, b in zip(out.model.query_weights, twin.query_weights, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert out.model.name == f"forest-{kind}"
    assert out.model.search == ForestSearch(probe=2)
    assert seen == [1, 2, 4] and out.summary["untrained"] is True


def test_init_from_twin_trains_from_the_twins_weights(toy_store) -> None:
    cfg = {**SMALL, "twin": "sign", "init": "twin", "steps_query": 0, "steps_passage": 0}
    cfg["steps_joint"] = 0
    out = train_forest(toy_store, sectioned(cfg), progress=False)
    twin = Forest.sign_hyperplanes(ForestConfig(4, 4, int(toy_store.dim)), seed=0)
    x = np.asarray(toy_store.queries)
    np.testing.assert_array_equal(out.model.query_classes(x)[0], twin.query_classes(x)[0])


def test_bad_twin_settings_are_refused(toy_store) -> None:
    # a choice is a Literal: refused with its key path and the choices (issue 31 item 7)
    with pytest.raises(ConfigError, match="model.twin: expected one of 'random', 'sign'"):
        train_forest(toy_store, sectioned({**SMALL, "twin": "pca"}), progress=False)
    with pytest.raises(ConfigError, match="power of two"):
        train_forest(
            toy_store,
            sectioned({**SMALL, "n_classes": 6, "twin": "sign", "untrained": True}),
            progress=False,
        )
    with pytest.raises(ConfigError, match="model.scoring: expected one of 'shipped', 'count'"):
        train_forest(toy_store, sectioned({**SMALL, "scoring": "bm25"}), progress=False)
