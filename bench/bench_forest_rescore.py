"""First-stage benchmark: the forest, its random twin, k-means IVF-Flat and HNSW as candidate
generators for exact cosine (issue 27, part 6). One command, one table, one Pareto plot.

For one store split, in ONE run, one thread everywhere, exact cosine over every passage as the
reference measured in the same run:

* **forest** (a trained checkpoint, ``--forest``; optional) and its **random twin**
  (:meth:`Forest.random`, same M and C, mean over ``--twin-seeds``), at every (probe depth t,
  assignment K) of ``--settings`` and every candidate depth N of ``--depths``: the forest's
  top-N by its search order (:class:`ForestSearch`, shipped scoring), rescored by exact cosine
  (:func:`treerank.search.rescore.rescore`);
* **IVF-Flat** (FAISS, ``nlist`` = ``--nlist`` or ``4 sqrt(n)``, k-means on the passages) at
  every ``--nprobe``; its scores are already exact inner products over the probed lists;
* **HNSW** (FAISS ``IndexHNSWFlat``, 32 links) at every ``--ef``.

Per point: passages scored per query (forest: candidates rescored; IVF: vectors in the probed
lists; HNSW: distance computations, ``faiss.cvar.hnsw_stats.ndis``) and its fraction of the
collection; postings scanned per query (forest: inverted-list entries read; IVF: the same as
scored); index bytes per passage **beside the vectors** (forest: its lists; IVF: ids and
centroids; HNSW: the graph); Recall@100 of exact cosine's top 100; label Recall@100 and
nDCG@10 (on all queries, and on ``seen`` / ``unseen`` ones when ``--train`` gives the training
split); queries/s (classification, search and rescoring timed together; index building not).

**Cross-validated forest** (``--cv-config CFG --cv-folds K``, for a split without a training
split: TREC DL19): the queries are cut into K folds by :func:`treerank.evaluation.folds.topic_folds`
(the config's ``seed``); fold f's forest is trained (:func:`treerank.forest.trainer.train_forest`,
``train_rows`` = the other folds' queries) or read from its cache file under ``--work`` (one
checkpoint per fold, keyed by the config, the fold's rows and the store), indexes the full pool
and ranks fold f's queries; the folds' runs are concatenated (every query ranked by a forest that
never saw its judgments) and its costs are means over all queries (index bytes: mean over the
folds' indexes; queries/s: all queries over the folds' summed search time). The twin has the
config's M and C.

``--table`` indexes an IRLI forest's training-collection assignment (``bench_forest_twins``'s
``.npz``) instead of its passage models; ``--prefixes`` adds the forest's and the twin's first M
pairs (t = K = 1) so that the recall can be read off at another system's postings or bytes;
``--sample-queries`` evaluates a fixed seeded sample of the queries.

Writes ``results.json``, ``table.md`` (with a best-point-per-budget summary, also alone in
``budget.md``) and ``pareto.png`` under ``--out`` (atomically); ``--render-only`` rewrites the
tables and the plot from ``results.json``. Run::

    OMP_NUM_THREADS=1 NUMBA_NUM_THREADS=1 nice -n 10 python bench/bench_forest_rescore.py \
        --store STORE/test [--train STORE/train] [--forest FOREST.pt] --out DIR

    # TREC DL19 pool, trained forest by 5-fold CV over the 43 topics
    OMP_NUM_THREADS=1 NUMBA_NUM_THREADS=1 nice -n 10 python bench/bench_forest_rescore.py \
        --store STORES/dl19/test --cv-config configs/forest/dl19_cv.yaml --cv-folds 5 \
        --work WORK --out docs/results/forest_first_stage_dl19 ...
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import hashlib
import json
import sys
import time
from pathlib import Path
from typing import Any

import numba
import numpy as np
import torch
import yaml

from treerank.atomic import atomic_savefig, atomic_write_json, atomic_write_text
from treerank.config import load_yaml
from treerank.evaluation.folds import topic_folds
from treerank.forest.index import ForestIndex, assign_passages
from treerank.forest.model import Forest, ForestConfig, ForestSearch
from treerank.kernels.topk import exact_search
from treerank.kernels.vectors import l2_normalize
from treerank.metrics.metrics import evaluate_run
from treerank.metrics.qrels import Qrels
from treerank.search.rescore import rescore

METRICS = ["ndcg@10", "recall@100"]


def rescore_cosine(
    queries: np.ndarray, passages: np.ndarray, candidates: np.ndarray, k: int
) -> np.ndarray:
    """``int64 (nq, k)`` candidates re-ranked by cosine (ties by id), ``-1`` padding last: the
    generic second stage :func:`treerank.search.rescore.rescore` with both sides L2-normalised."""
    q = l2_normalize(np.asarray(queries, dtype=np.float32))
    ids, _ = rescore(q, passages, candidates, k, passage_transform=l2_normalize)
    return ids


def overlap100(ids: np.ndarray, ref: list[set[int]]) -> float:
    """Mean share of the reference top 100 found in ``ids``' top 100."""
    return float(
        np.mean(
            [len(ref[i] & set(r[:100][r[:100] >= 0].tolist())) / 100 for i, r in enumerate(ids)]
        )
    )


def load_forest(path: str) -> Forest:
    """A forest from a ``bench_forest_twins`` cache file (``.pt``) or a checkpoint directory."""
    if path.endswith(".pt"):
        doc = torch.load(path, weights_only=True)
        return Forest.from_checkpoint_parts(doc["config"], doc["state"])
    from treerank.models.registry import load_model

    return load_model(path)


def load_table(path: str, n_passages: int, n_models: int) -> tuple[np.ndarray, np.ndarray]:
    """An IRLI assignment table (``.npz`` of ``bench_forest_twins``: ``classes`` / ``probs``
    ``(n, M, K)``), first choice per model: ``(int32 (n, M), float32 (n, M))``.

    Raises:
        SystemExit: the table does not cover ``n_passages`` rows and ``n_models`` models.
    """
    tab = np.load(path)
    cls, pr = tab["classes"], tab["probs"]
    if cls.shape[0] != n_passages or cls.shape[1] < n_models:
        raise SystemExit(
            f"{path}: table {cls.shape} does not match {n_passages} passages, M = {n_models}"
        )
    return cls[:, :n_models, 0], pr[:, :n_models, 0]


def forest_points(
    name: str,
    forest: Forest,
    q: np.ndarray,
    p: np.ndarray,
    settings: list[tuple[int, int]],
    depths: list[int],
    table: tuple[np.ndarray, np.ndarray] | None = None,
) -> list[dict[str, Any]]:
    """One point per (t, K, N): candidates ids and costs (metrics added by the caller); the
    point's ``seconds`` (classification, search and rescoring of all ``q``) ride along.
    ``table``: an IRLI assignment ``(classes (n, M), probs)`` indexed instead of the passage
    models (K = 1 only)."""
    out = []
    n = len(p)
    for t, kk in settings:
        f = forest.with_search(ForestSearch(probe=t, assign=kk))
        if table is not None:
            if kk != 1:
                raise SystemExit(f"{name}: an assignment table is K = 1; drop setting {t},{kk}")
            index = ForestIndex.build(*table, n_classes=f.n_classes)
        elif kk == 1:
            index = ForestIndex.build(*f.passage_classes(p), n_classes=f.n_classes)
        else:
            index = assign_passages(f, p)
        for depth in depths:
            t0 = time.perf_counter()
            if t == 1 and kk == 1:
                hits = index.search(*f.query_classes(q), depth)
            else:
                qc, qp, fl = f.query_top(q, t)
                hits = index.search_probes(qc, qp, fl, depth, "shipped")
            ids = rescore_cosine(q, p, hits.ids, 100)
            sec = time.perf_counter() - t0
            out.append(
                {
                    "system": name,
                    "setting": f"M={f.n_models} C={f.n_classes} t={t} K={kk} N={depth}",
                    "params": {"M": f.n_models, "C": f.n_classes, "t": t, "K": kk, "N": depth},
                    "ids": ids,
                    "scored_per_query": float((hits.ids >= 0).sum(1).mean()),
                    "postings_per_query": float(hits.scanned.mean()),
                    "index_bytes_per_passage": index.nbytes / n,
                    "qps": len(q) / sec,
                    "seconds": sec,
                }
            )
    return out


def cv_forest_points(
    name: str,
    forests: list[Forest],
    folds: list[np.ndarray],
    q: np.ndarray,
    p: np.ndarray,
    settings: list[tuple[int, int]],
    depths: list[int],
) -> list[dict[str, Any]]:
    """:func:`forest_points` of a cross-validated forest: fold f's forest ranks ``q[folds[f]]``;
    per (t, K, N) the folds' ``(n_f, 100)`` ids are put back in query order and the costs
    averaged over all queries (index bytes over the folds, queries/s over the summed seconds).

    Raises:
        ValueError: the folds do not cover every query row exactly once.
    """
    rows = np.concatenate(folds)
    if len(rows) != len(q) or len(np.unique(rows)) != len(q):
        raise ValueError(
            f"cv_forest_points: the folds hold {len(rows)} rows ({len(np.unique(rows))} distinct) "
            f"for {len(q)} queries: every query must be held out exactly once"
        )
    per_fold = [
        forest_points(name, f, q[held], p, settings, depths)
        for f, held in zip(forests, folds, strict=True)
    ]
    w = np.array([len(h) for h in folds], dtype=np.float64) / len(q)
    out = []
    for group in zip(*per_fold, strict=True):
        ids = np.full((len(q), group[0]["ids"].shape[1]), -1, dtype=np.int64)
        for pt, held in zip(group, folds, strict=True):
            ids[held] = pt["ids"]
        sec = float(sum(pt["seconds"] for pt in group))

        def mean(key: str, group: tuple[dict[str, Any], ...] = group) -> float:
            return float(np.dot(w, [pt[key] for pt in group]))

        out.append(
            {
                "system": name,
                "setting": group[0]["setting"] + f" ({len(folds)}-fold CV)",
                "ids": ids,
                "scored_per_query": mean("scored_per_query"),
                "postings_per_query": mean("postings_per_query"),
                "index_bytes_per_passage": float(
                    np.mean([pt["index_bytes_per_passage"] for pt in group])
                ),
                "qps": len(q) / sec,
                "seconds": sec,
            }
        )
    return out


def with_overrides(cfg: dict[str, Any], sets: list[str]) -> dict[str, Any]:
    """``cfg`` with ``section.key=yaml_value`` (or ``key=yaml_value``) overrides applied, as
    ``scripts/experiments/forest_experiment.py --set`` does.

    Raises:
        ValueError: an override without ``=``.
    """
    out = copy.deepcopy(cfg)
    for kv in sets:
        key, eq, val = kv.partition("=")
        if not eq:
            raise ValueError(f"--set {kv!r}: expected section.key=value")
        sec, dot, name = key.partition(".")
        if dot:
            out.setdefault(sec, {})[name] = yaml.safe_load(val)
        else:
            out[key] = yaml.safe_load(val)
    return out


def cv_forests(
    store: Any, cfg: dict[str, Any], folds: list[np.ndarray], work: Path
) -> tuple[list[Forest], list[dict[str, Any]]]:
    """Fold f's forest trained on the other folds' query rows (all passages), read
    from ``work/fold{f}of{K}-{key}.pt`` when cached there (``key``: a digest of the config, the
    fold's rows and the store path and encoder). Returns the forests and per fold
    ``{"train_queries", "seconds", "cached"}`` (training seconds as measured when trained)."""
    from treerank.forest.trainer import train_forest

    work.mkdir(parents=True, exist_ok=True)
    rows = np.concatenate(folds)
    forests, info = [], []
    for f, held in enumerate(folds):
        train_rows = np.setdiff1d(rows, held)  # the other folds' topics, as forest_experiment.py
        key = hashlib.sha256(
            json.dumps(
                [cfg, held.tolist(), str(Path(store.path).resolve()), store.encoder_fingerprint],
                sort_keys=True,
                default=str,
            ).encode()
        ).hexdigest()[:12]
        path = work / f"fold{f}of{len(folds)}-{key}.pt"
        if path.is_file():
            forests.append(load_forest(str(path)))
            side = json.loads(path.with_suffix(".json").read_text())
            info.append({**side, "cached": True})
            continue
        t0 = time.perf_counter()
        out = train_forest(store, cfg, train_rows=train_rows, progress=False)
        sec = time.perf_counter() - t0
        forest = out.model
        tmp = path.with_suffix(".tmp")
        torch.save({"config": forest.checkpoint_config(), "state": forest.state_dict()}, tmp)
        side = {"train_queries": int(out.summary["n_train_queries"]), "seconds": sec}
        atomic_write_json(path.with_suffix(".json"), side)
        tmp.replace(path)
        forests.append(forest)
        info.append({**side, "cached": False})
        print(f"fold {f}: trained on {side['train_queries']} queries in {sec:.0f} s", flush=True)
    return forests, info


def faiss_points(
    q: np.ndarray, p: np.ndarray, nlist: int, nprobes: list[int], efs: list[int]
) -> list[dict[str, Any]]:
    import faiss

    faiss.omp_set_num_threads(1)
    n, d = p.shape
    out = []
    quant = faiss.IndexFlatIP(d)
    ivf = faiss.IndexIVFFlat(quant, d, nlist, faiss.METRIC_INNER_PRODUCT)
    ivf.cp.seed = 0
    ivf.train(p)
    ivf.add(p)
    sizes = np.array([ivf.invlists.list_size(i) for i in range(nlist)])
    ivf_bytes = (8 * n + 4 * d * nlist) / n
    for nprobe in nprobes:
        ivf.nprobe = nprobe
        t0 = time.perf_counter()
        _, ids = ivf.search(q, 100)
        sec = time.perf_counter() - t0
        _, lists = quant.search(q, nprobe)
        scored = float(sizes[lists].sum(1).mean())
        out.append(
            {
                "system": "ivf-flat",
                "setting": f"nlist={nlist} nprobe={nprobe}",
                "params": {"nlist": nlist, "nprobe": nprobe},
                "ids": ids.astype(np.int64),
                "scored_per_query": scored,
                "postings_per_query": scored,
                "index_bytes_per_passage": ivf_bytes,
                "qps": len(q) / sec,
            }
        )
    hnsw = faiss.IndexHNSWFlat(d, 32, faiss.METRIC_INNER_PRODUCT)
    hnsw.add(p)
    hnsw_bytes = (faiss.serialize_index(hnsw).size - 4 * d * n) / n
    for ef in efs:
        hnsw.hnsw.efSearch = ef
        faiss.cvar.hnsw_stats.reset()
        t0 = time.perf_counter()
        _, ids = hnsw.search(q, 100)
        sec = time.perf_counter() - t0
        scored = faiss.cvar.hnsw_stats.ndis / len(q)
        out.append(
            {
                "system": "hnsw",
                "setting": f"M=32 efSearch={ef}",
                "params": {"M": 32, "efSearch": ef},
                "ids": ids.astype(np.int64),
                "scored_per_query": float(scored),
                "postings_per_query": float(scored),
                "index_bytes_per_passage": hnsw_bytes,
                "qps": len(q) / sec,
            }
        )
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--store", default=None, help="the evaluation split (required to measure)")
    ap.add_argument("--train", default=None, help="its training split (seen / unseen parts)")
    ap.add_argument("--forest", default=None, help="a trained forest (.pt cache or checkpoint)")
    ap.add_argument("--cv-config", default=None, help="forest config trained by k-fold CV")
    ap.add_argument("--cv-folds", type=int, default=5, help="folds with --cv-config")
    ap.add_argument("--set", nargs="*", default=[], help="--cv-config overrides section.key=v")
    ap.add_argument("--work", default=None, help="cache of the CV folds' forests")
    ap.add_argument(
        "--table", default=None, help="its IRLI assignment table (.npz), indexed instead (K = 1)"
    )
    ap.add_argument(
        "--prefixes",
        type=int,
        nargs="*",
        default=[],
        help="also the forest's and the twin's first M pairs at t = K = 1, every depth "
        "(the postings / bytes curves)",
    )
    ap.add_argument(
        "--sample-queries",
        type=int,
        default=0,
        help="a fixed sample of this many queries (numpy default_rng(--seed)); 0: all",
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--models", type=int, default=64, help="twin's M without --forest")
    ap.add_argument("--classes", type=int, default=32, help="twin's C without --forest")
    ap.add_argument("--settings", nargs="+", default=["1,1", "2,1", "1,2", "2,2"], help="t,K")
    ap.add_argument("--depths", type=int, nargs="+", default=[100, 200, 500, 1000])
    ap.add_argument("--twin-seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--nlist", type=int, default=0)
    ap.add_argument("--nprobe", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32])
    ap.add_argument("--ef", type=int, nargs="+", default=[16, 32, 64, 128])
    ap.add_argument("--label", default=None, help="dataset label for the table and plot")
    ap.add_argument("--out", required=True)
    ap.add_argument(
        "--render-only",
        action="store_true",
        help="rewrite table.md and pareto.png from --out's results.json (no measuring)",
    )
    args = ap.parse_args(argv)
    if args.render_only:
        doc = json.loads((Path(args.out) / "results.json").read_text())
        write_tables(doc, Path(args.out))
        plot(doc, Path(args.out) / "pareto.png")
        return
    if not args.store:
        ap.error("--store is required (except with --render-only)")
    if args.cv_config and (args.forest or not args.work):
        ap.error("--cv-config needs --work and excludes --forest")
    if args.cv_config and args.sample_queries:
        ap.error("--cv-config folds every query of the store: it excludes --sample-queries")
    cv_cfg = with_overrides(load_yaml(args.cv_config), args.set) if args.cv_config else None
    torch.set_num_threads(1)
    numba.set_num_threads(1)
    from treerank.store import EmbeddingStore

    st = EmbeddingStore.open(args.store)
    q = l2_normalize(np.asarray(st.queries, dtype=np.float32))
    p = l2_normalize(np.asarray(st.passages, dtype=np.float32))
    n = len(p)
    qrels = Qrels.from_store(st)
    sample = None
    if 0 < args.sample_queries < len(q):
        rng = np.random.default_rng(args.seed)
        sample = np.sort(rng.choice(len(q), args.sample_queries, replace=False))
        q = q[sample]
        qrels = dataclasses.replace(  # the same judgments (document ids, aliases kept)
            qrels, candidates=qrels.candidates[sample], labels=qrels.labels[sample]
        )
    parts = {"all": np.ones(len(q), dtype=bool)}
    if args.train:
        from treerank.evaluation.overlap import seen_positive_mask

        seen = seen_positive_mask(st, EmbeddingStore.open(args.train))
        if sample is not None:
            seen = seen[sample]
        if seen.any():  # SQuAD dev: nothing seen, the parts would repeat "all"
            parts.update(seen=seen, unseen=~seen)
    settings = [tuple(int(v) for v in s.split(",")) for s in args.settings]
    t0 = time.perf_counter()
    cos_ids, _ = exact_search(q, p, k=100)
    t_cos = time.perf_counter() - t0
    ref = [set(r[r >= 0].tolist()) for r in cos_ids]
    points: list[dict[str, Any]] = [
        {
            "system": "exact cosine",
            "setting": "all passages",
            "params": {},
            "ids": cos_ids,
            "scored_per_query": float(n),
            "postings_per_query": float(n),
            "index_bytes_per_passage": 0.0,
            "qps": len(q) / t_cos,
        }
    ]
    cv: dict[str, Any] | None = None
    if cv_cfg is not None:
        folds = topic_folds(st, args.cv_folds, int(cv_cfg.get("seed", 0)))
        forests, info = cv_forests(st, cv_cfg, folds, Path(args.work))
        for fold_info, forest_f in zip(info, forests, strict=True):
            # share of (passage, model) slots the learned outcome leaves out of the index
            nr = forest_f.passage_classes(p)[0] < 0
            fold_info["not_retrievable_fraction"] = float(nr.mean())
        points += cv_forest_points("forest", forests, folds, q, p, settings, args.depths)  # type: ignore[arg-type]
        m, c = forests[0].n_models, forests[0].n_classes
        qids = st.query_ids()
        cv = {
            "config": str(args.cv_config),
            "overrides": list(args.set),
            "n_folds": args.cv_folds,
            "seed": int(cv_cfg.get("seed", 0)),
            "held_out_query_ids": [[qids[i] for i in held] for held in folds],
            "folds": info,
        }
    elif args.forest:
        forest = load_forest(args.forest)
        m, c = forest.n_models, forest.n_classes
        table = load_table(args.table, n, m) if args.table else None
        points += forest_points("forest", forest, q, p, settings, args.depths, table)  # type: ignore[arg-type]
        for mm in args.prefixes:
            if mm < m:
                tab_m = (table[0][:, :mm], table[1][:, :mm]) if table else None
                points += forest_points(
                    "forest", forest.subset(mm), q, p, [(1, 1)], args.depths, tab_m
                )
    else:
        m, c = args.models, args.classes
    seeds = []
    for seed in args.twin_seeds:
        twin = Forest.random(ForestConfig(m, c, q.shape[1]), seed=seed)
        pts = forest_points("random twin", twin, q, p, settings, args.depths)  # type: ignore[arg-type]
        for mm in args.prefixes:
            if mm < m:
                pts += forest_points("random twin", twin.subset(mm), q, p, [(1, 1)], args.depths)
        seeds.append(pts)
    points += faiss_points(q, p, args.nlist or int(4 * np.sqrt(n)), args.nprobe, args.ef)
    rows = []
    for pt in points:
        rows.append(_measure(pt, qrels, ref, parts, n))
    for group in zip(*seeds, strict=True):  # twin: mean over seeds, point by point
        ms = [_measure(pt, qrels, ref, parts, n) for pt in group]
        row = dict(ms[0].items())
        for key in (
            "scored_per_query",
            "fraction_scored",
            "postings_per_query",
            "qps",
            "index_bytes_per_passage",
            "recall100_vs_cosine",
        ):
            row[key] = float(np.mean([r[key] for r in ms]))
        row["parts"] = {
            part: {k: float(np.mean([r["parts"][part][k] for r in ms])) for k in METRICS}
            for part in parts
        }
        row["setting"] += f" (mean of seeds {args.twin_seeds})"
        rows.append(row)
    label = args.label or str(st.meta.get("source", "store"))
    doc = {
        "store": str(args.store),
        "label": label,
        "n_queries": len(q),
        "n_queries_store": len(st.queries),
        "query_sample_seed": args.seed if sample is not None else None,
        "n_passages": n,
        "command": "python bench/bench_forest_rescore.py " + " ".join(sys.argv[1:]),
        "parts": {k: int(v.sum()) for k, v in parts.items()},
        "rows": rows,
    }
    if cv is not None:
        doc["cv"] = cv
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out / "results.json", doc, indent=1)
    write_tables(doc, out)
    plot(doc, out / "pareto.png")
    print(render(doc))


def _measure(
    pt: dict[str, Any], qrels: Qrels, ref: list[set[int]], parts: dict[str, np.ndarray], n: int
) -> dict[str, Any]:
    ids = pt["ids"]
    pq = evaluate_run(ids, qrels, METRICS).per_query
    row = {k: v for k, v in pt.items() if k not in ("ids", "seconds")}
    row["fraction_scored"] = pt["scored_per_query"] / n
    row["recall100_vs_cosine"] = overlap100(ids, ref)
    row["parts"] = {
        part: {k: float(np.asarray(v)[mask].mean()) for k, v in pq.items()}
        for part, mask in parts.items()
    }
    return row


def write_tables(doc: dict[str, Any], out: Path) -> None:
    """``table.md`` (the full table and the budget summary) and ``budget.md`` (the summary
    alone, headed by the table's title line) under ``out``."""
    atomic_write_text(out / "table.md", render(doc))
    title = render(doc).splitlines()[0]
    atomic_write_text(out / "budget.md", title + "\n\n" + budget_summary(doc))


def render(doc: dict[str, Any]) -> str:
    parts = list(doc["parts"])
    head = (
        "| system | setting | scored / query (%) | postings / query | index B / passage | "
        "R@100 of cosine's top 100 | "
        + " | ".join(f"nDCG@10 {p} ({doc['parts'][p]})" for p in parts)
        + " | "
        + " | ".join(f"R@100 {p}" for p in parts)
        + " | q/s |"
    )
    cv = doc.get("cv")
    how = (
        f" Trained forest: {cv['n_folds']}-fold cross-validation over the queries "
        f"(`{cv['config']}`{', ' + ' '.join(cv['overrides']) if cv['overrides'] else ''}): "
        "each fold's forest is trained on the other folds' judgments and ranks the full pool "
        "for its held-out queries; the folds' runs are concatenated."
        if cv
        else ""
    )
    if doc.get("query_sample_seed") is not None:
        queries = (
            f"a fixed sample of {doc['n_queries']} of the {doc['n_queries_store']} queries "
            f"(numpy default_rng({doc['query_sample_seed']}))"
        )
    else:
        queries = f"{doc['n_queries']} queries"
    out = [
        f"{doc['label']}: {queries}, {doc['n_passages']} passages; one thread; "
        "candidates rescored by exact cosine." + how,
        "",
        head,
        "|" + "---|" * (7 + 2 * len(parts)),
    ]
    for r in doc["rows"]:
        cells = [
            r["system"],
            r["setting"],
            f"{r['scored_per_query']:.0f} ({100 * r['fraction_scored']:.1f})",
            f"{r['postings_per_query']:.0f}",
            f"{r['index_bytes_per_passage']:.1f}",
            f"{r['recall100_vs_cosine']:.3f}",
        ]
        cells += [f"{r['parts'][p]['ndcg@10']:.4f}" for p in parts]
        cells += [f"{r['parts'][p]['recall@100']:.3f}" for p in parts]
        cells.append(f"{r['qps']:.0f}")
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out) + "\n\n" + budget_summary(doc)


BUDGETS = (2.0, 5.0)
"""Budgets of :func:`budget_summary`: percent of the collection scored, compared with the
table's one-decimal rounding (730 of 14,580 passages, 5.007 %, counts as 5.0 %)."""


def budget_summary(doc: dict[str, Any], budgets: tuple[float, ...] = BUDGETS) -> str:
    """Per system and budget B (% scored), the point with the most of exact cosine's top 100
    among those scoring at most B % (ties: fewer scored), with its nDCG@10 on all queries minus
    exact cosine's; ``-`` where the system has no point within B."""
    cos = next(r for r in doc["rows"] if r["system"] == "exact cosine")
    base = cos["parts"]["all"]["ndcg@10"]
    systems = list(dict.fromkeys(r["system"] for r in doc["rows"] if r is not cos))
    head = "| system | " + " | ".join(
        f"at <= {b:.0f} % scored: R@100 of cosine's top 100 (setting; postings / query) | "
        "nDCG@10 - cosine"
        for b in budgets
    )
    out = [
        "Best point per system within a budget of passages scored (from the full table):",
        "",
        head + " |",
        "|" + "---|" * (1 + 2 * len(budgets)),
    ]
    for sys_ in systems:
        cells = [sys_]
        for b in budgets:
            fit = [
                r
                for r in doc["rows"]
                if r["system"] == sys_ and round(100 * r["fraction_scored"], 1) <= b
            ]
            if not fit:
                cells += ["-", "-"]
                continue
            best = max(fit, key=lambda r: (r["recall100_vs_cosine"], -r["scored_per_query"]))
            cells.append(
                f"{best['recall100_vs_cosine']:.3f} ({best['setting']}; "
                f"{best['postings_per_query']:.0f} postings)"
            )
            cells.append(f"{best['parts']['all']['ndcg@10'] - base:+.4f}")
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out) + "\n"


def plot(doc: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.8, 4.4))
    systems = sorted({r["system"] for r in doc["rows"]} - {"exact cosine"})
    for i, s in enumerate(systems):
        rs = sorted(
            (r for r in doc["rows"] if r["system"] == s), key=lambda r: r["fraction_scored"]
        )
        ax.scatter(
            [100 * r["fraction_scored"] for r in rs],
            [r["recall100_vs_cosine"] for r in rs],
            color=f"C{i}",
            label=s,
            s=14,
        )
    ax.set_xscale("log")
    ax.set_xlabel("passages scored per query (% of the collection, log)")
    ax.set_ylabel("Recall@100 of exact cosine's top 100")
    ax.set_title(f"{doc['label']}:\nfirst stages + exact cosine", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    atomic_savefig(fig, path, dpi=120)


if __name__ == "__main__":
    # subnormal gradients slow CPU GEMMs ~30x and change nothing here; the flag is process-wide
    # (it breaks float32 round trips elsewhere), so it is set for the script, never by main()
    torch.set_flush_denormal(True)
    main()
