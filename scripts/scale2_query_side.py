"""The query-side variant of the DRT seed's Scale 2 (issue 35): the ``query-tower`` and
``drt-query-tower`` families trained from the same checkpoint on the same batches, schedule
and seed, over several seeds, then compared on the evaluation split.

Where the full bi-encoder pair is beyond a CPU budget (SQuAD: a bi-encoder epoch is hours
here), only the query side moves: both arms train the query encoder against the store's frozen
passage vectors, one scoring by cosine, the other through the DRT heads. The passage side
cannot drift, so a gap between the arms is the DRT scoring's, not the passage space's.

Usage (docs/finetune.md, "The query-side variant on SQuAD"):

    # everything: per seed, the two arms side by side (one thread each), then the comparison
    python scripts/scale2_query_side.py run stores/squad runs/s2q --seeds 0 1 2 \\
        --results docs/results/scale2_squad_query_side.json

    # or one run per (arm, seed), then the comparison
    python scripts/scale2_query_side.py train stores/squad runs/s2q \\
        configs/finetune/squad_query_tower_scale2.yaml --seed 0
    python scripts/scale2_query_side.py train stores/squad runs/s2q \\
        configs/finetune/squad_drt_query_tower.yaml --seed 0
    ...
    python scripts/finetune_scale2_seeds.py --store stores/squad --eval-split dev \\
        --arms query-tower drt-query-tower \\
        --pair runs/s2q/query-tower-seed0 runs/s2q/drt-query-tower-seed0 ... \\
        --out docs/results/scale2_squad_query_side.json

``train`` writes ``OUT/<family>-seed<N>/``: the ``treerank finetune`` training folder (model,
checkpoints, ``finetune.json``, ``drt_head/`` for the DRT arm) and ``stores/<eval split>/``,
the evaluation split with its queries re-encoded by the tuned tower (passage vectors copied:
``treerank.pipeline.finetune.reembed_split``). Only the evaluation split is re-embedded (the
training questions are not needed for the comparison; ``treerank finetune`` re-embeds both).
The run's cost goes into ``OUT/<family>-seed<N>/cost.json``.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

CONFIGS = Path(__file__).resolve().parents[1] / "configs" / "finetune"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    tr = sub.add_parser("train", help="train one arm at one seed and re-embed the eval split")
    tr.add_argument("store", type=Path, help="the frozen store root (train and eval splits)")
    tr.add_argument("out", type=Path, help="the experiment folder")
    tr.add_argument("config", type=Path, help="a configs/finetune/*.yaml of a query tower")
    tr.add_argument("--seed", type=int, required=True)
    tr.add_argument("--train-split", default="train")
    tr.add_argument("--eval-split", default="dev")
    rn = sub.add_parser("run", help="train both arms at every seed, then compare them")
    rn.add_argument("store", type=Path)
    rn.add_argument("out", type=Path)
    rn.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    rn.add_argument(
        "--configs",
        type=Path,
        nargs=2,
        default=[CONFIGS / "squad_query_tower_scale2.yaml", CONFIGS / "squad_drt_query_tower.yaml"],
        metavar=("COSINE_ARM", "DRT_ARM"),
    )
    rn.add_argument("--results", type=Path, required=True, help="the comparison's JSON")
    rn.add_argument("--train-split", default="train")
    rn.add_argument("--eval-split", default="dev")
    args = ap.parse_args(argv)
    if args.cmd == "run":
        return _run_all(args)

    from treerank.atomic import atomic_write_json
    from treerank.config import ConfigError, load_yaml
    from treerank.pipeline.finetune import cost_clock, cost_since, reembed_split
    from treerank.store.embedding_store import EmbeddingStore
    from treerank.training.finetune import finetune
    from treerank.training.finetune_config import parse_finetune_config

    try:
        doc = dict(load_yaml(args.config))
        doc["seed"] = args.seed
        cfg = parse_finetune_config(doc, where=str(args.config))
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if not cfg.query_only:
        print(f"error: {args.config}: family {cfg.family} is not a query tower", file=sys.stderr)
        return 2
    train = EmbeddingStore.open(args.store / args.train_split)
    test = EmbeddingStore.open(args.store / args.eval_split)
    run = args.out / f"{cfg.family}-seed{args.seed}"
    t0 = cost_clock()
    ft = finetune(train, cfg, run, resume=(run / "checkpoints").is_dir(), log=print)
    trained = cost_since(t0)
    t1 = cost_clock()
    reembed_split(run, test, run / "stores" / args.eval_split, overwrite=True)
    atomic_write_json(
        run / "cost.json",
        {"train": trained, "reembed_eval_split": cost_since(t1), "summary": ft.summary["cost"]},
        indent=1,
    )
    print(f"{run}: {ft.summary['steps']} steps, loss {ft.summary['train_loss']:.4f}")
    return 0


def _run_all(args: argparse.Namespace) -> int:
    """Per seed, both arms as two processes side by side (each config's ``trainer.threads``),
    a seed's runs resumed where a checkpoint exists; then scripts/finetune_scale2_seeds.py."""
    from treerank.config import load_yaml

    families = [str(load_yaml(c)["family"]) for c in args.configs]
    split_args = ["--train-split", args.train_split, "--eval-split", args.eval_split]
    for seed in args.seeds:
        procs = []
        for cfg in args.configs:
            cmd = [sys.executable, __file__, "train", str(args.store), str(args.out), str(cfg)]
            procs.append(subprocess.Popen([*cmd, "--seed", str(seed), *split_args]))
        codes = [p.wait() for p in procs]
        if any(codes):
            print(f"error: seed {seed}: an arm failed (exit codes {codes})", file=sys.stderr)
            return 1
    cmd = [sys.executable, str(Path(__file__).with_name("finetune_scale2_seeds.py"))]
    cmd += ["--store", str(args.store), "--out", str(args.results), *split_args]
    cmd += ["--arms", *families]
    for seed in args.seeds:
        cmd += ["--pair", *(str(args.out / f"{f}-seed{seed}") for f in families)]
    return subprocess.call(cmd)


if __name__ == "__main__":
    sys.exit(main())
