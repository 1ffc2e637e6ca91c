"""The whole kind of "a stage reused after its input changed" (issue 21): on the stage graph,
without running anything, change every input of every stage one at a time and check that exactly
the stages downstream of it get new keys, and that nothing changed means no key changed.

The graph: dataset ``a`` (tiny BEIR, train + test split) trains ``linear`` (seeds 0, 1) and
``mlp`` (one run; the diagnosed model); dataset ``b`` (eval only) evaluates both zero-shot
(``transfer: true``). Expected sets are written out by hand (not derived from the graph's own
edges), so a missing edge fails here.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.pipeline.tiny_beir import write_tiny_beir
from treerank.kernels.device import Device
from treerank.pipeline.config import load_experiment
from treerank.pipeline.experiment import Stage, StageGraph, plan_experiment
from treerank.pipeline.identity import RunId, StageId, SystemId, UnknownDependencyError

EMBED_A = {"embed:a:train", "embed:a:test"}
EMBED_B = {"embed:b:test"}
TRAIN_LINEAR = {"train:a:linear@seed0", "train:a:linear@seed1"}
TRAIN_MLP = {"train:a:mlp"}
EVALUATE = {"evaluate:a", "evaluate:b"}
DIAGNOSE = {"diagnose:a"}
# BM25 negatives of a's train split: one stage shared by linear and mlp (equal settings)
MINE_A = {"mine:a:bm25_negatives-100"}
ALL = EMBED_A | EMBED_B | MINE_A | TRAIN_LINEAR | TRAIN_MLP | EVALUATE | DIAGNOSE
FROM_A = ALL - EMBED_B  # everything that reads dataset a's stores (b evaluates a's models)


def _base(tmp: Path) -> dict[str, Any]:
    a = write_tiny_beir(tmp / "data-a")
    b = write_tiny_beir(tmp / "data-b")
    return {
        "name": "g",
        "device": "cpu",
        "encoder": {"model": "some/encoder", "query_prompt": None, "token_budget": 16384},
        "datasets": [
            {"name": "a", "path": str(a), "format": "beir", "train_split": "train",
             "eval_split": "test"},
            {"name": "b", "path": str(b), "format": "beir", "eval_split": "test"},
        ],
        "systems": ["bm25", "cosine"],
        "evaluate": {"k": 100, "baselines": ["cosine", "bm25"],
                     "metrics": ["mrr@10", "ndcg@10"], "seed": 0},
        "transfer": True,
        "diagnose": {"model": "mlp", "baseline": "cosine"},
        "models": {
            "linear": {"family": "linear", "seeds": [0, 1], "trainer": {"lr": 0.001}},
            "mlp": {"family": "mlp", "seed": 0, "trainer": {"lr": 0.001}},
        },
    }  # fmt: skip


def _keys(tmp: Path, raw: dict[str, Any], tag: str) -> dict[str, str]:
    p = tmp / f"{tag}.yaml"
    p.write_text(yaml.safe_dump(raw))
    return plan_experiment(load_experiment(p, output_dir=tmp / "out")).names()


def _edit_file(tmp: Path, name: str, line: str) -> Callable[[dict[str, Any]], None]:
    """A mutation that points dataset ``name`` at a copy of its data with one more passage."""

    def edit(raw: dict[str, Any]) -> None:
        ds = next(d for d in raw["datasets"] if d["name"] == name)
        new = write_tiny_beir(tmp / f"data-{name}-edited")
        with open(new / "corpus.jsonl", "a") as fh:
            fh.write(json.dumps({"_id": "d9", "title": "", "text": line}) + "\n")
        ds["path"] = str(new)

    return edit


def _set(*path: Any, value: Any) -> Callable[[dict[str, Any]], None]:
    def edit(raw: dict[str, Any]) -> None:
        node = raw
        for p in path[:-1]:
            node = node[p] if isinstance(p, int) else node.setdefault(p, {})
        node[path[-1]] = value

    return edit


CASES: list[tuple[str, Callable[[Path], Callable[[dict[str, Any]], None]], set[str]]] = [
    # models: each model's hyperparameters and seed list
    ("linear lr", lambda t: _set("models", "linear", "trainer", "lr", value=0.003),
     TRAIN_LINEAR | EVALUATE),
    ("mlp lr", lambda t: _set("models", "mlp", "trainer", "lr", value=0.003),
     TRAIN_MLP | EVALUATE | DIAGNOSE),
    ("mlp seed", lambda t: _set("models", "mlp", "seed", value=1), TRAIN_MLP | EVALUATE | DIAGNOSE),
    ("linear seeds + 2", lambda t: _set("models", "linear", "seeds", value=[0, 1, 2]),
     {"train:a:linear@seed2"} | EVALUATE),
    ("linear seeds - 1", lambda t: _set("models", "linear", "seeds", value=[0]), EVALUATE),
    # mining: a new depth for linear only is a new mine stage; mlp keeps the shared one
    ("linear mine depth", lambda t: _set("models", "linear", "data", "mine_depth", value=50),
     {"mine:a:bm25_negatives-50"} | TRAIN_LINEAR | EVALUATE),
    # datasets: file contents, format, limit, max_passages, split, systems
    ("a contents", lambda t: _edit_file(t, "a", "a new passage about whales"), FROM_A),
    ("b contents", lambda t: _edit_file(t, "b", "a new passage about whales"),
     EMBED_B | {"evaluate:b"}),
    ("a format", lambda t: _set("datasets", 0, "format", value="scifact"), FROM_A),
    ("a limit", lambda t: _set("datasets", 0, "limit", value=5), FROM_A),
    ("a max_passages", lambda t: _set("datasets", 0, "max_passages", value=6), FROM_A),
    ("b limit", lambda t: _set("datasets", 1, "limit", value=3), EMBED_B | {"evaluate:b"}),
    ("b systems", lambda t: _set("datasets", 1, "systems", value=["bm25"]), {"evaluate:b"}),
    # evaluate settings (k is also the diagnostics' depth)
    ("k", lambda t: _set("evaluate", "k", value=50), EVALUATE | DIAGNOSE),
    ("metrics", lambda t: _set("evaluate", "metrics", value=["ndcg@10"]), EVALUATE),
    ("baselines", lambda t: _set("evaluate", "baselines", value=["bm25", "cosine"]), EVALUATE),
    ("evaluate seed", lambda t: _set("evaluate", "seed", value=1), EVALUATE),
    ("a system spec", lambda t: _set("systems", value=["bm25", "cosine", "rrf:bm25+cosine"]),
     EVALUATE),
    ("transfer off", lambda t: _set("transfer", value=False), {"evaluate:b"}),
    # the encoder: everything is embedded again
    ("encoder model", lambda t: _set("encoder", "model", value="other/encoder"), ALL),
    ("query prompt", lambda t: _set("encoder", "query_prompt", value="query: "), ALL),
    ("token budget", lambda t: _set("encoder", "token_budget", value=8192), ALL),
    ("backend", lambda t: _set("encoder", "backend", value="onnx-int8"), ALL),
    ("precision", lambda t: _set("encoder", "precision", value="bf16"), ALL),
    # where it runs
    ("device", lambda t: _set("device", value="cuda:0"), ALL),
    # diagnose settings
    ("diagnose baseline", lambda t: _set("diagnose", "baseline", value="bm25"), DIAGNOSE),
    ("probe seed", lambda t: _set("diagnose", "probe_seed", value=7), DIAGNOSE),
]  # fmt: skip


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any], dict[str, str]]:
    tmp = tmp_path_factory.mktemp("graph")
    raw = _base(tmp)
    return tmp, raw, _keys(tmp, raw, "base")


def test_graph_has_every_stage_and_edge(base: tuple[Path, dict[str, Any], dict[str, str]]) -> None:
    tmp, raw, keys = base
    assert set(keys) == ALL
    graph = plan_experiment(load_experiment(tmp / "base.yaml", output_dir=tmp / "out"))
    edges = graph.edges()
    assert edges["train:a:linear@seed0"] == ["embed:a:train", "mine:a:bm25_negatives-100"]
    assert edges["train:a:mlp"] == ["embed:a:train", "mine:a:bm25_negatives-100"]
    assert edges["mine:a:bm25_negatives-100"] == ["embed:a:train"]
    assert set(edges["evaluate:b"]) == {"embed:b:test"} | TRAIN_LINEAR | TRAIN_MLP
    assert set(edges["evaluate:a"]) == EMBED_A | TRAIN_LINEAR | TRAIN_MLP
    assert set(edges["diagnose:a"]) == {"embed:a:test", "train:a:mlp"}


def test_nothing_changed_means_no_key_changed(
    base: tuple[Path, dict[str, Any], dict[str, str]],
) -> None:
    tmp, raw, keys = base
    assert _keys(tmp, copy.deepcopy(raw), "same") == keys
    # the same bytes under another path are the same data
    moved = copy.deepcopy(raw)
    moved["datasets"][0]["path"] = str(write_tiny_beir(tmp / "data-a-copy"))
    assert _keys(tmp, moved, "moved") == keys
    # `auto` is the device it resolves to on this machine
    auto = copy.deepcopy(raw)
    auto["device"] = "auto"
    raw_resolved = copy.deepcopy(raw)
    raw_resolved["device"] = Device("auto").resolved_text()
    assert _keys(tmp, auto, "auto") == _keys(tmp, raw_resolved, "resolved")


@pytest.mark.parametrize(("what", "make", "expected"), CASES, ids=[c[0] for c in CASES])
def test_one_input_changes_exactly_its_downstream_stages(
    base: tuple[Path, dict[str, Any], dict[str, str]],
    what: str,
    make: Callable[[Path], Callable[[dict[str, Any]], None]],
    expected: set[str],
) -> None:
    tmp, raw, keys = base
    changed = copy.deepcopy(raw)
    make(tmp)(changed)
    new = _keys(tmp, changed, what.replace(" ", "_"))
    differ = {name for name, key in new.items() if keys.get(name) != key}
    assert differ == expected, f"{what}: unexpected {differ ^ expected}"


def test_forest_train_stage_is_keyed_by_the_device(
    base: tuple[Path, dict[str, Any], dict[str, str]],
) -> None:
    """The forest trains (and validates) on ``device`` (issue 26): its train stage's key holds
    the device as the dense families' do, and ``auto`` is the device it resolves to."""
    tmp, raw, _ = base
    with_forest = copy.deepcopy(raw)
    with_forest["models"]["forest"] = {
        "family": "forest",
        "seed": 0,
        "model": {"n_models": 2, "n_classes": 2},
    }
    keys = _keys(tmp, with_forest, "forest")
    assert "train:a:forest" in keys
    on_gpu = copy.deepcopy(with_forest)
    on_gpu["device"] = "cuda:0"
    changed = _keys(tmp, on_gpu, "forest_cuda")
    assert changed["train:a:forest"] != keys["train:a:forest"]
    auto = copy.deepcopy(with_forest)
    auto["device"] = "auto"
    resolved = copy.deepcopy(with_forest)
    resolved["device"] = Device("auto").resolved_text()
    assert (
        _keys(tmp, auto, "forest_auto")["train:a:forest"]
        == (_keys(tmp, resolved, "forest_resolved")["train:a:forest"])
    )
    graph = plan_experiment(load_experiment(tmp / "forest_cuda.yaml", output_dir=tmp / "out"))
    stage = next(s for s in graph.stages.values() if s.id.name == "train:a:forest")
    assert stage.inputs["device"] == "cuda:0"


def test_undeclared_or_unknown_dependency_raises(tmp_path: Path) -> None:
    graph = StageGraph()
    embed = StageId.embed("a", "test")
    graph.add(Stage(embed, tmp_path / "e", (), {"x": 1}))
    train = StageId.train(RunId("linear", "a", 0))
    with pytest.raises(UnknownDependencyError, match="train:a:linear@seed0 reads embed:a:train"):
        graph.add(Stage(train, tmp_path / "t", (StageId.embed("a", "train"),), {}))
    ev = StageId.evaluate("a")
    graph.add(Stage(ev, tmp_path / "v", (embed,), {}))
    with pytest.raises(UnknownDependencyError, match="did not declare"):
        graph.key_of(train, reader=ev)
    assert graph.key_of(embed, reader=ev) == graph.keys[embed]


def test_runner_hands_a_stage_only_its_declared_outputs(tmp_path: Path) -> None:
    """The runner gives each stage a ``Deps`` of its declared edges: reading another stage's
    output (even one that ran before it) fails, so a stage's key covers everything it read."""
    from treerank.pipeline.stages import StageError
    from treerank.pipeline.stages.graph import Deps, RunContext
    from treerank.pipeline.stages.outputs import EmbedOutput

    a, b = StageId.embed("a", "train"), StageId.embed("a", "test")

    class Store(Stage):
        def run(self, d: Path, deps: Deps) -> EmbedOutput:
            return EmbedOutput(d, {"n": 1})

    class Reader(Stage):
        def run(self, d: Path, deps: Deps) -> EmbedOutput:
            deps.get(a, EmbedOutput)  # declared
            return deps.get(b, EmbedOutput)  # ran before, but not declared

    graph = StageGraph()
    graph.add(Store(a, tmp_path / "a", (), {}, output=EmbedOutput))
    graph.add(Store(b, tmp_path / "b", (), {}, output=EmbedOutput))
    graph.add(Reader(StageId.evaluate("a"), tmp_path / "v", (a,), {}, output=EmbedOutput))
    ctx = RunContext(tmp_path, "x.yaml", "cpu", progress=False, log=lambda s: None)
    with pytest.raises(StageError, match="did not declare embed:a:test") as err:
        list(graph.execute(ctx))
    assert isinstance(err.value.__cause__, UnknownDependencyError)
    assert (tmp_path / "a" / "stage.json").is_file() and not (tmp_path / "v").exists()


def test_identities_render_todays_names(tmp_path: Path) -> None:
    run = RunId("linear", "scifact", 0)
    assert StageId.train(run).name == "train:scifact:linear@seed0"
    assert StageId.train(run).path(tmp_path) == tmp_path / "models" / "scifact" / "linear@seed0"
    assert SystemId.of_run(run, "scifact").name == "linear@seed0"
    assert SystemId.of_run(run, "squad").name == "linear@seed0@scifact"
    assert SystemId.seed_average("linear", "scifact", "squad").name == "linear@scifact"
    assert SystemId.of_spec("rrf:bm25+cosine", "squad").name == "rrf:bm25+cosine"
    assert StageId.embed("s", "test").name == "embed:s:test"
    assert StageId.evaluate("s").path(tmp_path) == tmp_path / "eval" / "s"
    assert StageId.train(run).cache_dir_name("f" * 64) == "train_scifact_linear@seed0-" + "f" * 24
    with pytest.raises(ValueError, match="split"):
        StageId("embed", "s")


def test_outputs_round_trip_and_an_older_summary_reruns_the_stage(tmp_path: Path) -> None:
    """Each output renders to its ``stage.json`` summary and is read back strictly: a summary
    of another layout (a missing field) is never guessed at with a default; the runner runs
    that stage again instead of reusing it."""
    from treerank.pipeline.stages import read_stage
    from treerank.pipeline.stages.graph import Deps, RunContext
    from treerank.pipeline.stages.outputs import (
        EvaluateOutput,
        MineOutput,
        OutputFormatError,
        TrainOutput,
    )

    train = TrainOutput(tmp_path / "checkpoint", "linear", {"steps": 3})
    assert TrainOutput.from_json(train.to_json(), tmp_path) == train
    mine = MineOutput(tmp_path / "arrays", "bm25_negatives", None)
    assert MineOutput.from_json(mine.to_json(), tmp_path) == mine
    ev = EvaluateOutput(tmp_path, {"systems": {}}, "| a |", overlap={"n_seen": 1},
                        overlap_markdown="x")  # fmt: skip
    assert EvaluateOutput.from_json(ev.to_json(), tmp_path) == ev
    with pytest.raises(OutputFormatError, match="summary has no 'family'"):
        TrainOutput.from_json({"summary": {}}, tmp_path)
    with pytest.raises(OutputFormatError, match="summary.k is str, not int"):
        from treerank.pipeline.stages.outputs import TeacherOutput

        TeacherOutput.from_json({"queries": "train", "system": "bm25", "k": "10"}, tmp_path)

    runs: list[int] = []

    class Train(Stage):
        def run(self, d: Path, deps: Deps) -> TrainOutput:
            runs.append(1)
            return TrainOutput(d / "checkpoint", "linear", {"steps": len(runs)})

    sid = StageId.train(RunId("linear", "a"))
    graph = StageGraph()
    graph.add(Train(sid, tmp_path / "t", (), {}, output=TrainOutput))
    ctx = RunContext(tmp_path, "x.yaml", "cpu", progress=False, log=lambda s: None)
    list(graph.execute(ctx))
    list(graph.execute(ctx))
    assert runs == [1]  # reused
    doc = read_stage(tmp_path / "t")
    assert doc is not None
    doc["summary"] = {"summary": {"steps": 1}}  # an older layout with the same key
    (tmp_path / "t" / "stage.json").write_text(json.dumps(doc))
    ((_, rec, out),) = list(graph.execute(ctx))
    assert runs == [1, 1] and rec.status == "ran"
    assert out == TrainOutput(tmp_path / "t" / "checkpoint", "linear", {"steps": 2})
