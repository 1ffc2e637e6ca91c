"""TreeRank forest: an ensemble of M (query model, passage model) classifier pairs into C classes.

The TreeRank seed (Overview): every pair ``m`` maps a query to one of ``C`` classes and a passage
to one of the same ``C`` classes **or** to "not retrievable". The retrieval score of a (query,
passage) pair is the number of models whose classes agree,

    score(q, p) = #{m : class_m(q) == class_m(p)}        (a Hamming match count in [0, M])

and a passage that model ``m`` deems not retrievable is simply absent from model ``m``'s index
(it stays retrievable through the other models). Each model is a small feed-forward net over the
frozen embedding; with no hidden layers (the default) it is a linear softmax classifier.

All M models of one side are held as **stacked** parameters, so one ``einsum`` evaluates every
model at once:

* layer ``l`` weight ``float32 (M, d_in, d_out)``, bias ``float32 (M, d_out)``; ReLU between
  layers; the query side ends in ``C`` logits, the passage side in ``C + 1`` logits whose last
  entry is the **not-retrievable** class (the "extra class" variant of the seed's
  not-retrievable outcome).
* class prediction: query class = ``argmax`` of the softmax over ``C``; passage: not retrievable
  when ``P(not retrievable) > nr_threshold``, else ``argmax`` over the ``C`` real classes of the
  same ``C + 1``-way softmax. The returned probability is the softmax probability of the chosen
  class; the forest search uses it for its deterministic secondary score.

Search lives in :mod:`treerank.forest.index`; training in :mod:`treerank.forest.trainer`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, get_args

import numpy as np
import torch
from torch import Tensor

from treerank.kernels.device import DEFAULT_DEVICE, Device, resolve_device
from treerank.models.checkpoint import CheckpointMixin

MODEL_TYPE = "forest"
Twin = Literal["random", "sign", "kmeans"]
TWINS: tuple[str, ...] = get_args(Twin)
"""Kinds of untrained twin (:meth:`Forest.twin`)."""
NOT_RETRIEVABLE = -1
"""Class value returned for a passage that a model does not index."""


def stacked_forward(
    x: torch.Tensor,
    weights: Sequence[torch.Tensor],
    biases: Sequence[torch.Tensor],
    *,
    dropout: float = 0.0,
    generators: Sequence[torch.Generator] | None = None,
    masks: Sequence[torch.Tensor] | None = None,
) -> torch.Tensor:
    """Logits of ``G`` stacked feed-forward classifiers.

    Args:
        x: ``float32 (n, d)`` inputs shared by all ``G`` models, or ``float32 (G, n, d)`` one
            input block per model, on the parameters' device (CPU or CUDA; float32 throughout,
            no autocast).
        weights: per layer ``float32 (G, d_in, d_out)``.
        biases: per layer ``float32 (G, d_out)``.
        dropout: dropout probability on the input and on every hidden layer, in steps of 1/256
            (``round(256 p) / 256``); applied only when ``generators`` is given.
        generators: one ``torch.Generator`` per model: model ``g``'s masks are drawn from
            ``generators[g]`` alone (over its ``(n, width)`` block, in layer order), so a
            model's masks do not depend on which other models share the call. This is what
            makes a group of ``G`` pairs train exactly like ``G`` separate runs. The generators
            are CPU generators whatever the device: masks are drawn on the CPU and moved to
            ``x``'s device, so a GPU run drops exactly the entries a CPU run drops.
        masks: instead of ``generators``, the keep masks themselves, one ``bool (G, n, width)``
            per layer input (:func:`draw_dropout_masks` draws them exactly as ``generators``
            would), so that a block of rows can be recomputed, or gathered, with the same masks.

    Returns:
        ``float32 (G, n, d_out_last)`` logits.

    Raises:
        ValueError: no layers, weight/bias shapes that do not chain, or a generator count that is
            not ``G``.
    """
    if not weights or len(weights) != len(biases):
        raise ValueError("stacked_forward: need one bias per weight and at least one layer")
    g, d, o = weights[0].shape
    drop = (generators is not None or masks is not None) and dropout > 0.0
    if drop and masks is None and len(generators or ()) != g:
        raise ValueError(
            f"stacked_forward: need {g} dropout generators, got {len(generators or ())}"
        )
    if drop and masks is not None and len(masks) != len(weights):
        raise ValueError(f"stacked_forward: need {len(weights)} dropout masks, got {len(masks)}")
    cut = round(256 * dropout)
    scale = 256.0 / (256 - cut)
    layer = iter(range(len(weights)))

    def masked(h: torch.Tensor) -> torch.Tensor:  # (G, n, w) -> same, one mask per model
        i = next(layer)
        if masks is not None:
            return h * masks[i] * scale
        assert generators is not None
        # masks come from the models' CPU generators (the same bits on every device)
        return h * _keep_mask(generators, h.shape, cut).to(h.device) * scale

    if x.ndim == 2 and not drop:
        # One (n, d) x (d, G*o) GEMM for all models (an einsum would broadcast x G times).
        h = (x @ weights[0].permute(1, 0, 2).reshape(d, g * o)).view(-1, g, o).transpose(0, 1)
        h = h + biases[0].unsqueeze(1)
    else:
        xs = x.unsqueeze(0).expand(g, -1, -1) if x.ndim == 2 else x
        if drop:
            xs = masked(xs)
        h = torch.baddbmm(biases[0].unsqueeze(1), xs, weights[0])
    for w, b in zip(weights[1:], biases[1:], strict=True):
        h = torch.relu(h)
        if drop:
            h = masked(h)
        h = torch.baddbmm(b.unsqueeze(1), h, w)
    return h


def _keep_mask(
    generators: Sequence[torch.Generator], shape: Sequence[int], cut: int
) -> torch.Tensor:
    """``bool (G, n, w)`` keep mask, model ``g``'s from ``generators[g]``: random bytes (8 per
    int64 draw, 4x cheaper than ``bernoulli_``), an entry dropped when its byte is
    ``< cut = round(256 p)``, i.e. with probability ``cut / 256`` (0.1 -> 26 / 256)."""
    n = int(shape[1]) * int(shape[2])
    keep = torch.empty(tuple(shape), dtype=torch.bool)
    for i, gen in enumerate(generators):
        r = torch.randint(-(2**63), 2**63 - 1, (n // 8 + 1,), dtype=torch.int64, generator=gen)
        keep[i] = (r.view(torch.uint8)[:n] >= cut).view(tuple(shape[1:]))
    return keep


def draw_dropout_masks(
    generators: Sequence[torch.Generator], n: int, widths: Sequence[int], dropout: float
) -> list[torch.Tensor]:
    """The keep masks :func:`stacked_forward` would draw for an ``n``-row block.

    Args:
        generators: one per model (``G``), advanced exactly as a forward pass advances them.
        n: rows of the block.
        widths: the input width of every layer (``d``, then each hidden width).
        dropout: dropout probability (``round(256 p) / 256``).

    Returns:
        per layer ``bool (G, n, width)``, to pass as ``stacked_forward(masks=...)``.
    """
    cut = round(256 * dropout)
    return [_keep_mask(generators, (len(generators), n, int(w)), cut) for w in widths]


def _device(device: Device) -> torch.device:
    """The ``torch.device`` of a parsed device (:func:`treerank.kernels.device.resolve_device`)."""
    return resolve_device(device)


def _argmax(p: Tensor) -> tuple[Tensor, Tensor]:
    """``(max prob, argmax class)`` over the last axis."""
    pmax, cls = p.max(dim=-1)
    return pmax, cls


@dataclass(frozen=True)
class ForestConfig:
    """Architecture of a forest.

    Attributes:
        n_models: M, number of (query, passage) model pairs (the seed: 2000).
        n_classes: C, classes per model (the seed: 1000).
        dim: d, input embedding dimension.
        hidden: widths of hidden layers (default none: a linear softmax classifier).
        nr_threshold: a passage is not retrievable for model m when its softmax probability of
            the not-retrievable class exceeds this (in ``(0, 1]``; 1.0 disables the outcome).
    """

    n_models: int
    n_classes: int
    dim: int
    hidden: tuple[int, ...] = ()
    nr_threshold: float = 0.5

    def __post_init__(self) -> None:
        if self.n_models < 1 or self.n_classes < 2 or self.dim < 1:
            raise ValueError(
                f"forest config: need n_models >= 1, n_classes >= 2, dim >= 1 "
                f"(got {self.n_models}, {self.n_classes}, {self.dim})"
            )
        if any(h < 1 for h in self.hidden):
            raise ValueError(f"forest config: hidden widths must be >= 1 (got {self.hidden})")
        if not 0.0 < self.nr_threshold <= 1.0:
            raise ValueError(f"forest config: nr_threshold must be in (0, 1] ({self.nr_threshold})")

    def layer_shapes(self, side: str) -> list[tuple[int, int]]:
        """``(d_in, d_out)`` of each layer of the ``"query"`` or ``"passage"`` model."""
        out = self.n_classes + (1 if side == "passage" else 0)
        widths = [self.dim, *self.hidden, out]
        return list(zip(widths[:-1], widths[1:], strict=True))

    def to_dict(self) -> dict[str, Any]:
        return {
            "n_models": self.n_models,
            "n_classes": self.n_classes,
            "dim": self.dim,
            "hidden": list(self.hidden),
            "nr_threshold": self.nr_threshold,
        }

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> ForestConfig:
        return cls(
            n_models=int(doc["n_models"]),
            n_classes=int(doc["n_classes"]),
            dim=int(doc["dim"]),
            hidden=tuple(int(h) for h in doc.get("hidden", ())),
            nr_threshold=float(doc.get("nr_threshold", 0.5)),
        )


Scoring = Literal["shipped", "count", "soft", "query-prob"]
SCORINGS: tuple[str, ...] = get_args(Scoring)
"""Scoring orders of the forest search (:mod:`treerank.forest.index`):

* ``"shipped"``: match count, then ``sum P_m(c|q) * P_m(c|p)`` over matching models, then id;
* ``"count"``: match count, then id (the seed's plain Hamming count);
* ``"soft"``: ``sum over matching models of log P_m(c|q) - log P_m(c_{t+1}|q)`` (the passage's
  class log-probability under the query's model, the unprobed classes floored at the best
  unprobed class), then id;
* ``"query-prob"``: ``sum over matching models of P_m(c|q)`` (a probe-weighted count), then id.
"""


@dataclass(frozen=True)
class ForestSearch:
    """How a forest is searched (no retraining needed to change any of it).

    Attributes:
        probe: t, classes visited per query and model (its top-t by ``P_m(c|q)``); 1 = the seed.
        assign: K, classes a passage is indexed in per model (its top-K real classes); 1 = the
            seed. A passage counts at most once per model.
        capacity_epsilon: with ``assign > 1``, each (model, class) list holds at most
            ``ceil((1 + epsilon) * K * N_m / C)`` passages (``N_m`` = passages model m indexes;
            power-of-K-choices: the most confident passage chooses first and falls back to its
            next classes when one is full); None = unbounded. Ignored at ``assign = 1``.
        scoring: one of :data:`SCORINGS`.
    """

    probe: int = 1
    assign: int = 1
    capacity_epsilon: float | None = 0.2
    scoring: Scoring = "shipped"

    def __post_init__(self) -> None:
        if self.probe < 1 or self.assign < 1:
            raise ValueError(
                f"forest search: probe and assign must be >= 1 (got {self.probe}, {self.assign})"
            )
        if self.capacity_epsilon is not None and self.capacity_epsilon < 0:
            raise ValueError(
                f"forest search: capacity_epsilon must be >= 0 or null ({self.capacity_epsilon})"
            )
        if self.scoring not in SCORINGS:
            raise ValueError(
                f"forest search: scoring must be one of {SCORINGS} (got {self.scoring!r})"
            )

    def to_dict(self) -> dict[str, Any]:
        return {
            "probe": self.probe,
            "assign": self.assign,
            "capacity_epsilon": self.capacity_epsilon,
            "scoring": self.scoring,
        }

    @classmethod
    def from_dict(cls, doc: dict[str, Any] | None) -> ForestSearch:
        doc = doc or {}
        eps = doc.get("capacity_epsilon", 0.2)
        return cls(
            probe=int(doc.get("probe", 1)),
            assign=int(doc.get("assign", 1)),
            capacity_epsilon=None if eps is None else float(eps),
            scoring=doc.get("scoring", "shipped"),
        )


def init_layers(
    shapes: Sequence[tuple[int, int]], n_models: int, generator: torch.Generator, scale: float = 1.0
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Independent random init of ``n_models`` stacked models (each model its own draw).

    Weights ``N(0, scale^2 / d_in)`` for hidden layers and ``N(0, scale^2)`` for the output layer
    of a linear model over unit-norm inputs (so logits have standard deviation ~``scale``); biases
    zero.

    Returns:
        ``(weights, biases)`` lists of ``float32 (n_models, d_in, d_out)`` / ``(n_models, d_out)``.
    """
    ws, bs = [], []
    for i, (din, dout) in enumerate(shapes):
        std = scale if i == 0 else scale * (2.0 / din) ** 0.5
        ws.append(torch.randn(n_models, din, dout, generator=generator) * std)
        bs.append(torch.zeros(n_models, dout))
    return ws, bs


class Forest(CheckpointMixin):
    """A trained TreeRank forest: M stacked query models and M stacked passage models.

    Args:
        config: the architecture.
        query_weights / query_biases: per layer ``float32 (M, d_in, d_out)`` / ``(M, d_out)``,
            last ``d_out = C``.
        passage_weights / passage_biases: same, last ``d_out = C + 1`` (last column = not
            retrievable).
        name: display name (runs, reports).
        search: how it is searched (:class:`ForestSearch`; default: the seed's t = K = 1 and the
            shipped order).

    Raises:
        ValueError: tensor shapes disagree with ``config``.
    """

    model_type = MODEL_TYPE
    own_retrieval = True

    def __init__(
        self,
        config: ForestConfig,
        query_weights: Sequence[torch.Tensor],
        query_biases: Sequence[torch.Tensor],
        passage_weights: Sequence[torch.Tensor],
        passage_biases: Sequence[torch.Tensor],
        name: str = "forest",
        search: ForestSearch | None = None,
    ) -> None:
        self.config = config
        self.name = name
        self.search = search or ForestSearch()
        self.extra: dict[str, Any] = {}
        self.query_weights = [w.detach().float().contiguous() for w in query_weights]
        self.query_biases = [b.detach().float().contiguous() for b in query_biases]
        self.passage_weights = [w.detach().float().contiguous() for w in passage_weights]
        self.passage_biases = [b.detach().float().contiguous() for b in passage_biases]
        for side, ws, bs in (
            ("query", self.query_weights, self.query_biases),
            ("passage", self.passage_weights, self.passage_biases),
        ):
            shapes = config.layer_shapes(side)
            if len(ws) != len(shapes) or len(bs) != len(shapes):
                raise ValueError(f"forest: {side} model needs {len(shapes)} layers")
            for (din, dout), w, b in zip(shapes, ws, bs, strict=True):
                if tuple(w.shape) != (config.n_models, din, dout) or tuple(b.shape) != (
                    config.n_models,
                    dout,
                ):
                    raise ValueError(
                        f"forest: {side} layer shapes {tuple(w.shape)}/{tuple(b.shape)} do not "
                        f"match (M={config.n_models}, {din}, {dout})"
                    )

    # ------------------------------------------------------------------ construction
    @classmethod
    def random(cls, config: ForestConfig, seed: int = 0, name: str = "forest") -> Forest:
        """An untrained forest: independent random query models, passage models copied from them
        (not-retrievable column zero with bias ``-4``). Useful for tests and as an LSH baseline."""
        gen = torch.Generator().manual_seed(seed)
        qw, qb = init_layers(config.layer_shapes("query"), config.n_models, gen)
        pw, pb = passage_init_from_query(qw, qb)
        return cls(config, qw, qb, pw, pb, name=name)

    @classmethod
    def sign_hyperplanes(
        cls, config: ForestConfig, seed: int = 0, name: str = "forest-sign", scale: float = 1.0
    ) -> Forest:
        """Untrained sign-hyperplane twin (SimHash / MRPT style): ``C = 2^b``, model ``m`` draws
        ``b`` Gaussian hyperplanes ``H_m float32 (d, b)`` and puts ``x`` in class
        ``c = sum_i [h_i . x > 0] 2^i``.

        Written as a linear argmax forest so that it shares the index and scoring: weight
        ``W_m = scale * H_m S`` with ``S float32 (b, C)``, ``S[i, c] = +1`` when bit ``i`` of
        ``c`` is set, else ``-1``; ``argmax_c (x W_m)_c`` is the sign pattern of ``x H_m`` (exact
        ties only at ``h_i . x = 0``). The passage model is the query model plus a
        not-retrievable column (bias ``-4``; never chosen at ``nr_threshold >= 0.5``).
        The hyperplanes are ``hyperplanes(config, seed)``.

        Raises:
            ValueError: hidden layers, or ``C`` not a power of two.
        """
        return cls.from_hyperplanes(config, cls.hyperplanes(config, seed), name, scale)

    @classmethod
    def from_hyperplanes(
        cls, config: ForestConfig, hs: np.ndarray, name: str = "forest-sign", scale: float = 1.0
    ) -> Forest:
        """The sign-hyperplane forest of given hyperplanes ``hs float (M, d, b)``, ``2^b = C``
        (see :meth:`sign_hyperplanes`).

        Raises:
            ValueError: ``hs`` does not match ``config``.
        """
        hs = np.asarray(hs, dtype=np.float64)
        if (
            hs.ndim != 3
            or hs.shape[:2] != (config.n_models, config.dim)
            or (2 ** hs.shape[2] != config.n_classes)
        ):
            raise ValueError(
                f"sign twin: hyperplanes {hs.shape} do not match (M={config.n_models}, "
                f"d={config.dim}, log2 C)"
            )
        bits = hs.shape[2]
        c = np.arange(config.n_classes)
        sign = np.where((c[None, :] >> np.arange(bits)[:, None]) & 1, 1.0, -1.0)  # (b, C)
        qw = torch.from_numpy((scale * hs @ sign).astype(np.float32))  # (M, d, C)
        qb = torch.zeros(config.n_models, config.n_classes)
        pw, pb = passage_init_from_query([qw], [qb])
        return cls(config, [qw], [qb], pw, pb, name=name)

    @staticmethod
    def hyperplanes(config: ForestConfig, seed: int = 0) -> np.ndarray:
        """The sign twin's hyperplanes: ``float64 (M, d, b)`` standard normal draws of
        ``numpy.random.default_rng(seed)``, ``b = log2 C``.

        Raises:
            ValueError: hidden layers, or ``C`` not a power of two.
        """
        bits = int(round(math.log2(config.n_classes)))
        if config.hidden or 2**bits != config.n_classes:
            raise ValueError(
                f"sign twin: needs a linear forest with C a power of two (C={config.n_classes}, "
                f"hidden={config.hidden})"
            )
        rng = np.random.default_rng(seed)
        return rng.standard_normal((config.n_models, config.dim, bits))

    @classmethod
    def kmeans(
        cls,
        config: ForestConfig,
        vectors: np.ndarray,
        seed: int = 0,
        name: str = "forest-kmeans",
        sample: int = 4096,
        iters: int = 10,
    ) -> Forest:
        """Untrained k-means twin: model ``m`` is spherical k-means (``C`` centroids, ``iters``
        Lloyd rounds from a k-means++ seeding, Arthur & Vassilvitskii 2007, on ``1 - cos``) on
        its own bootstrap sample of ``sample`` rows of ``vectors`` (with replacement;
        ``numpy.random.default_rng(seed)``).

        As a linear argmax forest: ``W_m = centroids_m^T / s_m`` (unit-norm centroids, so the
        class is the nearest centroid by cosine) with ``s_m`` the standard deviation of the
        sample's logits, so the softmax is neither flat nor one-hot.

        Args:
            vectors: ``float32 (n, d)`` rows to cluster (the passages; unit-norm).

        Raises:
            ValueError: hidden layers, wrong dimension or fewer than ``C`` rows.
        """
        x = np.asarray(vectors, dtype=np.float32)
        if config.hidden or x.ndim != 2 or x.shape[1] != config.dim or len(x) < config.n_classes:
            raise ValueError(
                f"kmeans twin: needs a linear forest and >= C rows of dim {config.dim} "
                f"(got {x.shape}, hidden={config.hidden})"
            )
        rng = np.random.default_rng(seed)
        c = config.n_classes
        ws = np.empty((config.n_models, config.dim, c), dtype=np.float32)
        for m in range(config.n_models):
            boot = x[rng.integers(0, len(x), size=max(sample, c))]
            cent = _kmeans_pp(boot, c, rng)
            for _ in range(iters):
                assign = (boot @ cent.T).argmax(1)
                onehot = np.zeros((c, len(boot)), dtype=np.float32)
                onehot[assign, np.arange(len(boot))] = 1.0
                sums = onehot @ boot  # (C, d) per-cluster sums
                norms = np.linalg.norm(sums, axis=1, keepdims=True)
                cent = np.where(norms > 0, sums / np.maximum(norms, 1e-12), cent)
            logits = boot @ cent.T
            ws[m] = cent.T / max(float(logits.std()), 1e-6)
        qw = torch.from_numpy(ws)
        qb = torch.zeros(config.n_models, c)
        pw, pb = passage_init_from_query([qw], [qb])
        return cls(config, [qw], [qb], pw, pb, name=name)

    @classmethod
    def twin(
        cls,
        kind: str,
        config: ForestConfig,
        seed: int = 0,
        vectors: np.ndarray | None = None,
        name: str | None = None,
    ) -> Forest:
        """The untrained twin of a forest by kind (:data:`TWINS`: ``random``, ``sign``,
        ``kmeans``; ``vectors`` = the passages for ``kmeans``).

        Raises:
            ValueError: unknown kind, or ``kmeans`` without vectors.
        """
        nm = name or f"forest-{kind}"
        if kind == "random":
            return cls.random(config, seed, name=nm)
        if kind == "sign":
            return cls.sign_hyperplanes(config, seed, name=nm)
        if kind == "kmeans":
            if vectors is None:
                raise ValueError("kmeans twin: needs the vectors to cluster")
            return cls.kmeans(config, vectors, seed, name=nm)
        raise ValueError(f"forest twin: unknown kind {kind!r} (one of {TWINS})")

    def with_search(self, search: ForestSearch) -> Forest:
        """The same models searched another way (probe depth, assignment, scoring)."""
        out = Forest(
            self.config,
            self.query_weights,
            self.query_biases,
            self.passage_weights,
            self.passage_biases,
            name=self.name,
            search=search,
        )
        out.extra = dict(self.extra)
        return out

    @property
    def n_models(self) -> int:
        return self.config.n_models

    @property
    def n_classes(self) -> int:
        return self.config.n_classes

    def subset(self, n_models: int) -> Forest:
        """The forest made of the first ``n_models`` pairs (for metric-vs-M curves)."""
        if not 1 <= n_models <= self.n_models:
            raise ValueError(f"forest subset: n_models must be in [1, {self.n_models}]")
        cfg = ForestConfig(
            n_models, self.n_classes, self.config.dim, self.config.hidden, self.config.nr_threshold
        )
        return Forest(
            cfg,
            [w[:n_models] for w in self.query_weights],
            [b[:n_models] for b in self.query_biases],
            [w[:n_models] for w in self.passage_weights],
            [b[:n_models] for b in self.passage_biases],
            name=f"{self.name}[:{n_models}]",
            search=self.search,
        )

    def with_nr_threshold(self, nr_threshold: float) -> Forest:
        """The same forest with another not-retrievable threshold (1.0 switches the outcome off:
        every passage is indexed under its argmax real class)."""
        cfg = ForestConfig(
            self.n_models, self.n_classes, self.config.dim, self.config.hidden, nr_threshold
        )
        return Forest(
            cfg,
            self.query_weights,
            self.query_biases,
            self.passage_weights,
            self.passage_biases,
            name=self.name,
            search=self.search,
        )

    # ------------------------------------------------------------------ prediction
    def _check_input(self, x: np.ndarray) -> torch.Tensor:
        arr = np.asarray(x)
        if arr.ndim != 2 or arr.shape[1] != self.config.dim:
            raise ValueError(
                f"forest {self.name!r}: expected inputs of shape (n, {self.config.dim}), "
                f"got {arr.shape}"
            )
        out = np.ascontiguousarray(arr, dtype=np.float32)
        if not out.flags.writeable:  # read-only memmap: torch wants a writable buffer
            out = out.copy()
        return torch.from_numpy(out)

    def _blocks(self, n: int, width: int) -> tuple[int, int]:
        """Row block and model block so that one logits block stays ~64 MiB."""
        budget = 1 << 24
        mb = max(1, min(self.n_models, budget // max(1, width * min(n, 256))))
        rb = max(1, min(max(n, 1), budget // max(1, width * mb)))
        return rb, mb

    @torch.no_grad()
    def query_classes(
        self, x: np.ndarray, device: Device = DEFAULT_DEVICE
    ) -> tuple[np.ndarray, np.ndarray]:
        """Class of every query under every model.

        Args:
            x: ``float32 (n, d)`` stored query vectors.
            device: where the logits are computed (``auto | cpu | cuda[:n]``, None = the CPU;
                :func:`treerank.kernels.device.resolve_device`): model and row blocks are moved
                there, the results come back as numpy arrays. float32 on every device, so a GPU
                may differ from the CPU in the last bits of a probability and, where two classes
                tie within that, in the argmax.

        Returns:
            ``(classes int32 (n, M) in [0, C), probs float32 (n, M))``: argmax class and its softmax
            probability.

        Raises:
            ValueError: wrong input shape. DeviceError: a device that cannot be used.
        """
        return self._classify(
            x, self.query_weights, self.query_biases, self.n_classes, _argmax, device
        )

    @torch.no_grad()
    def passage_classes(
        self, x: np.ndarray, device: Device = DEFAULT_DEVICE
    ) -> tuple[np.ndarray, np.ndarray]:
        """Class of every passage under every model, ``-1`` where not retrievable.

        Args:
            x: ``float32 (n, d)`` stored passage vectors.
            device: where the logits are computed (as :meth:`query_classes`).

        Returns:
            ``(classes int32 (n, M) in [-1, C), probs float32 (n, M))``: the argmax over the ``C``
            real classes of the ``C + 1``-way softmax, or ``-1`` (:data:`NOT_RETRIEVABLE`) when
            ``P(not retrievable) > nr_threshold``; probs = softmax probability of the returned
            real class (0 where not retrievable).

        Raises:
            ValueError: wrong input shape. DeviceError: a device that cannot be used.
        """
        thr = self.config.nr_threshold

        def pick(p: Tensor) -> tuple[Tensor, Tensor]:
            pmax, cls = p[..., :-1].max(dim=-1)
            nr = p[..., -1] > thr
            cls = torch.where(nr, torch.full_like(cls, NOT_RETRIEVABLE), cls)
            return torch.where(nr, torch.zeros_like(pmax), pmax), cls

        return self._classify(
            x, self.passage_weights, self.passage_biases, self.n_classes + 1, pick, device
        )

    @torch.no_grad()
    def query_top(
        self, x: np.ndarray, t: int, device: Device = DEFAULT_DEVICE
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The top-``t`` classes of every query under every model (multi-probe).

        Args:
            x: ``float32 (n, d)`` query vectors. t: probe depth (``1 <= t <= C``).
            device: where the logits are computed (as :meth:`query_classes`).

        Returns:
            ``(classes int32 (n, M, t), probs float32 (n, M, t), floor float32 (n, M))``:
            classes by descending softmax probability (ties: lower class first), their
            probabilities, and the probability of the best class not probed (``0`` when
            ``t = C``). ``classes[:, :, 0]`` equals :meth:`query_classes`.

        Raises:
            ValueError: wrong input shape or ``t`` outside ``[1, C]``.
        """
        if not 1 <= t <= self.n_classes:
            raise ValueError(f"forest query_top: t must be in [1, {self.n_classes}] (got {t})")
        xt = self._check_input(x)
        dev = _device(device)
        n = xt.shape[0]
        classes = np.empty((n, self.n_models, t), dtype=np.int32)
        probs = np.empty((n, self.n_models, t), dtype=np.float32)
        floor = np.zeros((n, self.n_models), dtype=np.float32)
        rb, mb = self._blocks(n, self.n_classes)
        for m0 in range(0, self.n_models, mb):
            ws = [w[m0 : m0 + mb].to(dev) for w in self.query_weights]
            bs = [b[m0 : m0 + mb].to(dev) for b in self.query_biases]
            for r0 in range(0, n, rb):
                z = stacked_forward(xt[r0 : r0 + rb].to(dev), ws, bs)
                p = torch.softmax(z, dim=-1)  # (g, r, C)
                top = min(t + 1, self.n_classes)
                # stable descending order: ties keep the lower class first (as argmax does)
                order = torch.sort(p, dim=-1, descending=True, stable=True).indices[..., :top]
                pv = torch.gather(p, -1, order)
                classes[r0 : r0 + rb, m0 : m0 + mb] = order[..., :t].permute(1, 0, 2).cpu().numpy()
                probs[r0 : r0 + rb, m0 : m0 + mb] = pv[..., :t].permute(1, 0, 2).cpu().numpy()
                if top > t:
                    floor[r0 : r0 + rb, m0 : m0 + mb] = pv[..., t].T.cpu().numpy()
        return classes, probs, floor

    @torch.no_grad()
    def passage_probabilities(
        self, x: np.ndarray, m0: int, m1: int, device: Device = DEFAULT_DEVICE
    ) -> np.ndarray:
        """Passage-model softmax of models ``m0 .. m1-1``: ``float32 (m1 - m0, n, C + 1)`` (last
        column = not retrievable); for capacity-bounded multi-assignment. ``device``: where the
        logits are computed (as :meth:`query_classes`)."""
        xt = self._check_input(x)
        dev = _device(device)
        ws = [w[m0:m1].to(dev) for w in self.passage_weights]
        bs = [b[m0:m1].to(dev) for b in self.passage_biases]
        rb, _ = self._blocks(xt.shape[0], (self.n_classes + 1) * (m1 - m0))
        out = np.empty((m1 - m0, xt.shape[0], self.n_classes + 1), dtype=np.float32)
        for r0 in range(0, xt.shape[0], rb):
            z = stacked_forward(xt[r0 : r0 + rb].to(dev), ws, bs)
            out[:, r0 : r0 + rb] = torch.softmax(z, dim=-1).cpu().numpy()
        return out

    def _classify(
        self,
        x: np.ndarray,
        weights: list[Tensor],
        biases: list[Tensor],
        width: int,
        pick: Callable[[Tensor], tuple[Tensor, Tensor]],
        device: Device = DEFAULT_DEVICE,
    ) -> tuple[np.ndarray, np.ndarray]:
        """Softmax every model's logits over ``x`` in memory-bounded blocks on ``device`` and
        ``pick`` ``(prob, class)`` per (row, model) -> ``(int32 (n, M), float32 (n, M))``."""
        t = self._check_input(x)
        dev = _device(device)
        n = t.shape[0]
        classes = np.empty((n, self.n_models), dtype=np.int32)
        probs = np.empty((n, self.n_models), dtype=np.float32)
        rb, mb = self._blocks(n, width)
        for m0 in range(0, self.n_models, mb):
            ws = [w[m0 : m0 + mb].to(dev) for w in weights]
            bs = [b[m0 : m0 + mb].to(dev) for b in biases]
            for r0 in range(0, n, rb):
                z = stacked_forward(t[r0 : r0 + rb].to(dev), ws, bs)
                pmax, cls = pick(torch.softmax(z, dim=-1))  # (g, r, W) -> (g, r) each
                classes[r0 : r0 + rb, m0 : m0 + mb] = cls.T.cpu().numpy()
                probs[r0 : r0 + rb, m0 : m0 + mb] = pmax.T.cpu().numpy()
        return classes, probs

    # ------------------------------------------------------------------ dense view
    def encode_queries(self, x: np.ndarray) -> np.ndarray:
        """Match-count features of queries: ``float32 (n, 2*M*C)``.

        ``encode_queries(Q) @ encode_passages(P).T == count + secondary / (M + 1)``, the forest
        search's score (see :mod:`treerank.forest.index`), so a forest is also a
        :class:`~treerank.models.base.DenseScorer` and any dense tool (exact search, the
        pipeline's validator) ranks with it exactly (up to float32 rounding of the secondary
        score). The features are one-hot per model: ``O(n * 2 * M * C)`` memory, fine for
        validation-size splits; the inverted-list search is the scalable path.

        Layout: block 1 = one-hot of the class under each model; block 2 = the same one-hot
        times the class probability.
        """
        classes, probs = self.query_classes(x)
        return self._one_hot(classes, np.ones_like(probs), probs)

    def encode_passages(self, x: np.ndarray) -> np.ndarray:
        """Match-count features of passages: ``float32 (n, 2*M*C)``, zero for models that do not
        index the passage (block 2 scaled by ``1 / (M + 1)``); see :meth:`encode_queries`."""
        classes, probs = self.passage_classes(x)
        return self._one_hot(classes, np.ones_like(probs), probs / (self.n_models + 1))

    def _one_hot(self, classes: np.ndarray, first: np.ndarray, second: np.ndarray) -> np.ndarray:
        n, m = classes.shape
        width = m * self.n_classes
        out = np.zeros((n, 2 * width), dtype=np.float32)
        rows, cols = np.nonzero(classes >= 0)
        pos = cols * self.n_classes + classes[rows, cols]
        out[rows, pos] = first[rows, cols]
        out[rows, width + pos] = second[rows, cols]
        return out

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict[str, torch.Tensor]:
        state: dict[str, torch.Tensor] = {}
        for side, ws, bs in (
            ("query", self.query_weights, self.query_biases),
            ("passage", self.passage_weights, self.passage_biases),
        ):
            for i, (w, b) in enumerate(zip(ws, bs, strict=True)):
                state[f"{side}.{i}.weight"] = w
                state[f"{side}.{i}.bias"] = b
        return state

    def checkpoint_config(self) -> dict[str, Any]:
        return {**self.config.to_dict(), "name": self.name, "search": self.search.to_dict()}

    def checkpoint_state(self) -> dict[str, torch.Tensor]:
        return self.state_dict()

    @classmethod
    def from_checkpoint_parts(
        cls, config: dict[str, Any], state: dict[str, torch.Tensor]
    ) -> Forest:
        fcfg = ForestConfig.from_dict(config)
        n_layers = len(fcfg.hidden) + 1
        tensors = {
            side: (
                [state[f"{side}.{i}.weight"] for i in range(n_layers)],
                [state[f"{side}.{i}.bias"] for i in range(n_layers)],
            )
            for side in ("query", "passage")
        }
        return cls(
            fcfg,
            *tensors["query"],
            *tensors["passage"],
            name=str(config.get("name", "forest")),
            search=ForestSearch.from_dict(config.get("search")),
        )


def passage_init_from_query(
    query_weights: Sequence[torch.Tensor],
    query_biases: Sequence[torch.Tensor],
    nr_bias: float = -4.0,
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Passage model initialised from the query model (TreeRank seed, training step 2).

    Copies every layer; the output layer gains a not-retrievable column with zero weights and
    bias ``nr_bias`` (so the outcome starts rare).

    Returns:
        ``(weights, biases)``; the last layer has ``C + 1`` outputs.
    """
    pw = [w.detach().clone() for w in query_weights]
    pb = [b.detach().clone() for b in query_biases]
    last_w, last_b = pw[-1], pb[-1]
    dev = last_w.device
    pw[-1] = torch.cat([last_w, torch.zeros(*last_w.shape[:-1], 1, device=dev)], dim=-1)
    pb[-1] = torch.cat([last_b, torch.full((last_b.shape[0], 1), nr_bias, device=dev)], dim=-1)
    return pw, pb


def _kmeans_pp(x: np.ndarray, c: int, rng: np.random.Generator) -> np.ndarray:
    """k-means++ seeding (Arthur & Vassilvitskii 2007) with the distance ``1 - cos``:
    ``float32 (c, d)`` rows of ``x float32 (n, d)``."""
    cent = np.empty((c, x.shape[1]), dtype=np.float32)
    cent[0] = x[rng.integers(len(x))]
    dist = np.maximum(1.0 - x @ cent[0], 0.0).astype(np.float64)
    for i in range(1, c):
        tot = dist.sum()
        j = int(rng.choice(len(x), p=dist / tot)) if tot > 0 else int(rng.integers(len(x)))
        cent[i] = x[j]
        dist = np.minimum(dist, np.maximum(1.0 - x @ cent[i], 0.0))
    return cent
