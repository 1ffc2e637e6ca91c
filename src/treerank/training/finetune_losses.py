"""The fine-tune's own losses: the query tower's (a trained query encoder against a store's
fixed passage vectors) and the ``drt-e2e`` family's (DRT heads on the unfrozen encoder).

sentence-transformers' losses encode every text column; the ``query-tower`` family trains only
the query side, so its loss looks the passage side up in the store (no passage is encoded and
the passage space cannot drift). Each training row carries, as its ``label``, its index into
the tables given here: the designated positive passage id and the passages to keep out of its
softmax (the query's other relevant passages, labelled non-targets, same-text twins' targets:
``treerank.training.sources.PairSampler``'s masks). InfoNCE (van den Oord et al., 2018) over

* ``all``: every passage of the split (exact full softmax; the DPR gold-standard denominator);
* ``in-batch``: the batch's positives and hard negatives (DPR's in-batch negatives).

:class:`StoredPassageDRTLoss` is the query tower's loss with DRT scores (the heads on the
trained query vectors and on the stored passage vectors): the query-side variant of Scale 2.

:class:`DRTEndToEndLoss` is the DRT seed's "Scale 2" objective: the encoder's vectors of the
batch's queries and passages go through a :class:`~treerank.models.drt.DRTHead` (a module of
the loss, so sentence-transformers' trainer optimises it with the encoder, at its own learning
rate), scored by DRT, InfoNCE over the in-batch columns exactly as
``MultipleNegativesRankingLoss`` lays them out, plus the slot decorrelation term of
:mod:`treerank.training.drt`.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn

__all__ = [
    "CrossRankLoss",
    "DRTEndToEndLoss",
    "DistilledMNRLLoss",
    "StoredPassageDRTLoss",
    "StoredPassageLoss",
    "cached_drt_loss",
]


class StoredPassageLoss(nn.Module):
    """InfoNCE of encoded queries against fixed stored passage vectors.

    Args:
        model: the ``SentenceTransformer`` being trained (its query side).
        passages: ``float32 (n_passages, dim)`` the store's passage vectors (L2-normalised
            here, the one cosine rule).
        positive: ``int64 (n_rows,)`` designated positive passage id of each training row.
        masked: ``int64 (n_rows, m)`` passage ids kept out of each row's softmax (``-1``
            padding); the row's own positive is never masked.
        hard: ``int64 (n_rows, h)`` hard negatives of each row (``-1`` padding), added to the
            columns of an ``in-batch`` softmax; ``None``: none.
        negatives: ``"all"`` or ``"in-batch"``.
        scale: logit scale ``1 / temperature``.
        targets: ``int64 (n_rows, L)`` distillation (``data.sources``): each row's passages
            carrying target mass (``-1`` padding); None: the designated positive alone.
        weights: ``float32 (n_rows, L)`` that mass (rows summing to 1), with ``targets``.
        teacher: ``float32 (n_rows, L)`` a ``margin-mse`` teacher's scores of ``targets``
            (NaN on rows it did not grade), or None.

    With ``targets`` each row's loss is listwise KL between its target distribution and the
    student's softmax (:func:`treerank.training.losses.listwise_kl`; InfoNCE for a one-hot
    row), and a row the teacher graded regresses the student's margins between its anchor
    (the teacher's best) and each other passage the teacher scored onto the teacher's
    (:func:`treerank.training.losses.margin_mse`, Hofstätter et al. 2020), over the same
    columns. Without, the loss is ``cross_entropy`` on the positive, as before.

    Raises:
        ValueError: tables of mismatched lengths, an unknown ``negatives``, ids out of range.
    """

    def __init__(
        self,
        model: Any,
        passages: np.ndarray,
        positive: np.ndarray,
        masked: np.ndarray,
        hard: np.ndarray | None = None,
        *,
        negatives: str = "all",
        scale: float = 20.0,
        targets: np.ndarray | None = None,
        weights: np.ndarray | None = None,
        teacher: np.ndarray | None = None,
    ) -> None:
        super().__init__()
        if negatives not in ("all", "in-batch"):
            raise ValueError(f"negatives must be 'all' or 'in-batch', got {negatives!r}")
        n_rows = int(np.asarray(positive).shape[0])
        tables = (masked, hard, targets, weights, teacher)
        if any(t is not None and np.asarray(t).shape[0] != n_rows for t in tables):
            raise ValueError(f"positive, masked, hard and target tables must have {n_rows} rows")
        if (targets is None) != (weights is None) or (teacher is not None and targets is None):
            raise ValueError("targets and weights go together; teacher needs them")
        for what, tab in (("weights", weights), ("teacher", teacher)):
            if tab is not None and np.asarray(tab).shape != np.asarray(targets).shape:
                raise ValueError(f"{what} must be shaped like targets")
        p = torch.from_numpy(np.array(passages, dtype=np.float32))  # a private copy
        n_pas = int(p.shape[0])
        for what, tab in (
            ("positive", positive),
            ("masked", masked),
            ("hard", hard),
            ("targets", targets),
        ):
            if tab is not None and np.asarray(tab).size and int(np.asarray(tab).max()) >= n_pas:
                raise ValueError(f"{what}: passage id beyond the store's {n_pas} passages")
        self.model = model
        self.passages: torch.Tensor = nn.functional.normalize(p, dim=1)
        self.positive = torch.as_tensor(np.asarray(positive, dtype=np.int64))
        self.masked = torch.as_tensor(np.asarray(masked, dtype=np.int64))
        self.hard = None if hard is None else torch.as_tensor(np.asarray(hard, dtype=np.int64))
        self.negatives = negatives
        self.scale = float(scale)
        self.targets = None if targets is None else torch.as_tensor(np.asarray(targets, np.int64))
        self.weights = None if weights is None else torch.as_tensor(np.asarray(weights, np.float32))
        self.teacher = None if teacher is None else torch.as_tensor(np.asarray(teacher, np.float32))

    def forward(
        self, features: list[dict[str, torch.Tensor]], labels: torch.Tensor
    ) -> torch.Tensor:
        """Mean InfoNCE loss of one batch.

        Args:
            features: one tokenised column (the queries), as sentence-transformers passes it.
            labels: ``int64 (B,)`` row indices into the tables.

        Returns:
            scalar loss tensor.
        """
        return self.compute_loss_from_embeddings(
            [self.model(features[0])["sentence_embedding"]], labels
        )

    def compute_loss_from_embeddings(
        self, embeddings: list[torch.Tensor], labels: torch.Tensor
    ) -> torch.Tensor:
        """The loss from the query column's vectors (``float (B, d)``) and the rows' labels."""
        q = embeddings[0].float()  # (B, d)
        rows = labels.to(torch.long).cpu()
        pos = self.positive[rows]  # (B,)
        if self.negatives == "all":
            cols = torch.arange(self.passages.shape[0])
        else:
            parts = [pos] + ([self.hard[rows].reshape(-1)] if self.hard is not None else [])
            if self.targets is not None:
                parts.append(self.targets[rows].reshape(-1))
            flat = torch.cat(parts)
            cols = torch.unique(flat[flat >= 0])  # sorted
        scores = self.scale * self._scores(q, cols)  # (B, M)
        target = torch.searchsorted(cols, pos)  # column of each positive
        m = self.masked[rows]  # (B, m)
        at = torch.searchsorted(cols, m.clamp(min=0)).clamp(max=cols.numel() - 1)
        own = m[:, :, None] == (
            pos[:, None, None] if self.targets is None else self.targets[rows][:, None, :]
        )
        hit = (m >= 0) & (cols[at] == m) & ~own.any(dim=2)  # a row's own targets stay in
        mask = torch.zeros(scores.shape, dtype=torch.bool)
        r_idx = torch.arange(len(rows))[:, None].expand_as(m)
        mask[r_idx[hit], at[hit]] = True
        if self.targets is None:
            scores = scores.masked_fill(mask.to(scores.device), float("-inf"))
            loss = nn.functional.cross_entropy(scores, target.to(scores.device))
        else:
            loss = self._distilled(scores, cols, rows, target, mask.to(scores.device))
        return loss + self._regulariser(target)

    def _scores(self, q: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
        """Unscaled scores ``(B, M)`` of the encoded queries ``q`` against passages ``cols``:
        cosine (the one cosine rule: both sides L2-normalised)."""
        p = self.passages.to(q.device)[cols.to(q.device)]
        return nn.functional.normalize(q, dim=1) @ p.T

    def _regulariser(self, target: torch.Tensor) -> torch.Tensor | float:
        """A term added to the loss (none here; the DRT heads' decorrelation in
        :class:`StoredPassageDRTLoss`); ``target``: ``int64 (B,)`` each row's positive column."""
        return 0.0

    def _distilled(
        self,
        scores: torch.Tensor,
        cols: torch.Tensor,
        rows: torch.Tensor,
        target: torch.Tensor,
        mask: torch.Tensor,
    ) -> torch.Tensor:
        """The mean over rows of listwise KL (or MarginMSE on graded rows) over ``cols``."""
        from treerank.training.losses import listwise_kl, margin_mse

        assert self.targets is not None and self.weights is not None
        tid, w = self.targets[rows], self.weights[rows]  # (B, L)
        ok = tid >= 0
        at = torch.searchsorted(cols, tid.clamp(min=0)).clamp(max=cols.numel() - 1)
        b_idx = torch.arange(len(rows))[:, None].expand_as(tid)
        dist = torch.zeros(scores.shape, dtype=torch.float32)
        dist.index_put_((b_idx[ok], at[ok]), w[ok], accumulate=True)
        dev = scores.device
        per_row = listwise_kl(scores, dist.to(dev), mask, reduction="none")
        if self.teacher is None:
            return per_row.mean()
        g = self.teacher[rows]  # (B, L)
        graded = torch.isfinite(g) & ok
        grid = torch.full(scores.shape, float("nan"))
        grid[b_idx[graded], at[graded]] = g[graded]
        anchor = torch.zeros(scores.shape, dtype=torch.bool)
        anchor[torch.arange(len(rows)), target] = True
        mm = margin_mse(scores, grid.to(dev), anchor.to(dev), reduction="none")
        return torch.where(graded.any(dim=1).to(dev), mm, per_row).mean()


class StoredPassageDRTLoss(StoredPassageLoss):
    """The query-side variant of the DRT seed's Scale 2 (``drt-query-tower``): the DRT heads
    on a trained query encoder, against the store's fixed passage vectors.

    The query encoder's vectors go through ``head.query_tower`` and the stored passage vectors
    of the softmax's columns through ``head.passage_tower`` (the heads train, the passage
    vectors do not), so the scores are DRT scores (``head.score``) where
    :class:`StoredPassageLoss` has cosine; the columns, masks and targets are that loss's (the
    full softmax over every passage with ``negatives: all``). The loss adds the seed's slot
    decorrelation (:func:`treerank.training.drt.decorrelation_loss`) over the batch's query
    slots and its positives' passage slots, as :class:`DRTEndToEndLoss` does over its batch::

        loss = InfoNCE(scale * head.score(Q, P_cols)) + lambda_dec * (dec(Q) + dec(P_pos)) / 2

    Args:
        model: the ``SentenceTransformer`` being trained (its query side).
        head: the DRT heads (:class:`~treerank.models.drt.DRTHead`; the attribute name
            ``head`` is what the trainer's learning-rate mapping and checkpoints look for).
        passages, positive, masked, hard, negatives, scale, targets, weights: as
            :class:`StoredPassageLoss` (the passage vectors are given to the heads as stored,
            not re-normalised; no graded teacher: the config refuses one).
        lambda_dec: weight of the decorrelation term (``>= 0``).

    Raises:
        ValueError: as :class:`StoredPassageLoss`, or ``lambda_dec < 0``.
    """

    def __init__(
        self,
        model: Any,
        head: Any,
        passages: np.ndarray,
        positive: np.ndarray,
        masked: np.ndarray,
        hard: np.ndarray | None = None,
        *,
        negatives: str = "all",
        scale: float = 20.0,
        targets: np.ndarray | None = None,
        weights: np.ndarray | None = None,
        lambda_dec: float = 0.1,
    ) -> None:
        if lambda_dec < 0:
            raise ValueError(f"need lambda_dec >= 0, got {lambda_dec}")
        super().__init__(
            model,
            passages,
            positive,
            masked,
            hard,
            negatives=negatives,
            scale=scale,
            targets=targets,
            weights=weights,
        )
        self.head = head
        self.raw_passages = torch.from_numpy(np.array(passages, dtype=np.float32))
        self.lambda_dec = float(lambda_dec)

    def _scores(self, q: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
        p = self.raw_passages.to(q.device)[cols.to(q.device)]
        return self.head.score(self.head.query_tower(q), self.head.passage_tower(p))

    def _regulariser(self, target: torch.Tensor) -> torch.Tensor | float:
        if self.lambda_dec == 0:
            return 0.0
        from treerank.training.drt import decorrelation_loss

        qs, ps = self.head.last_query_slots, self.head.last_passage_slots
        ps = ps[target.to(ps.device)]  # the batch's positives' slots
        return self.lambda_dec * (decorrelation_loss(qs) + decorrelation_loss(ps)) / 2


class DRTEndToEndLoss(nn.Module):
    """InfoNCE over DRT scores of encoder vectors, plus slot decorrelation (``drt-e2e``).

    For one batch of ``B`` rows ``(anchor, positive, negative_0, ...)``: the encoder embeds
    every column (``float (B, d)`` each), the head maps the anchors to ``(B, k*d_s)`` query
    representations (slot dropout in training mode) and the ``B * (1 + h)`` passages to
    passage representations, and::

        S    = scale * head.score(Q, P)                   (B, B * (1 + h))
        loss = cross_entropy(S, arange(B)) + lambda_dec * (dec(Q_slots) + dec(P_slots)) / 2

    the positives of the batch being the first ``B`` columns (row ``i``'s target is column
    ``i``), as in sentence-transformers' ``MultipleNegativesRankingLoss``; ``dec`` is
    :func:`treerank.training.drt.decorrelation_loss` on the un-dropped unit slots.

    Args:
        model: the ``SentenceTransformer`` being trained (``float (B, d)`` sentence embeddings).
        head: the DRT heads (trained with the encoder; the attribute name ``head`` is what the
            trainer's learning-rate mapping and checkpoints look for).
        scale: logit scale ``1 / temperature``.
        lambda_dec: weight of the decorrelation term (``>= 0``).

    Raises:
        ValueError: ``lambda_dec < 0`` or ``scale <= 0``.
    """

    def __init__(self, model: Any, head: Any, *, scale: float = 20.0, lambda_dec: float = 0.1):
        super().__init__()
        if lambda_dec < 0 or not scale > 0:
            raise ValueError(f"need lambda_dec >= 0 and scale > 0, got {lambda_dec}, {scale}")
        self.model = model
        self.head = head
        self.scale = float(scale)
        self.lambda_dec = float(lambda_dec)

    def forward(
        self, features: list[dict[str, torch.Tensor]], labels: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Mean loss of one batch (``labels`` unused: the targets are the batch's diagonal).

        Args:
            features: the tokenised columns, anchors first, as sentence-transformers passes them.

        Returns:
            scalar loss tensor.
        """
        if len(features) < 2:
            raise ValueError("drt-e2e needs (anchor, positive[, negatives]) columns")
        return self.loss_from_reps([self.model(f)["sentence_embedding"] for f in features])

    def compute_loss_from_embeddings(
        self, embeddings: list[torch.Tensor], labels: torch.Tensor | None = None
    ) -> torch.Tensor:
        """:meth:`loss_from_reps` under sentence-transformers' name (``labels`` unused)."""
        return self.loss_from_reps(embeddings)

    def loss_from_reps(self, reps: list[torch.Tensor]) -> torch.Tensor:
        """The loss from each column's encoder vectors (``float (B, d)``, anchors first)."""
        from treerank.training.drt import decorrelation_loss

        reps = [r.float() for r in reps]
        q = self.head.query_tower(reps[0])
        p = self.head.passage_tower(torch.cat(reps[1:], dim=0))
        scores = self.scale * self.head.score(q, p)
        target = torch.arange(q.shape[0], device=scores.device)
        loss = nn.functional.cross_entropy(scores, target)
        if self.lambda_dec > 0:
            qs, ps = self.head.last_query_slots, self.head.last_passage_slots
            dec = (decorrelation_loss(qs) + decorrelation_loss(ps)) / 2
            loss = loss + self.lambda_dec * dec
        return loss


class DistilledMNRLLoss(nn.Module):
    """The bi-encoder's distillation: sentence-transformers' ``MultipleNegativesRankingLoss``
    over the batch, plus a teacher term on the rows a graded teacher ranked.

    For one batch of ``B`` rows ``(anchor, positive, negative_0, ...)`` with student logits
    ``s_ic = scale * cos(q_i, p_ic)`` over row ``i``'s own ``1 + h`` columns and the teacher's
    logits ``t_ic`` of them (``pair_teacher``, NaN where the teacher has none)::

        loss = MNRL(batch) + (1 / B) * sum over graded rows i of d_i
        d_i  = margin_mse(s_i, t_i)                    (mode 2; Hofstätter et al. 2020)
             = listwise_kl(softmax(t_i) || s_i)        (mode 1; over the finite columns)

    the teacher's best as the anchor (column 0). The margins are in the student's logit units
    (``1 / temperature`` times cosine), as for the heads and the query tower
    (:func:`treerank.training.losses.margin_mse`, :func:`~treerank.training.losses.listwise_kl`:
    one formula for every family). MNRL is sentence-transformers' own, unchanged.

    Args:
        model: the ``SentenceTransformer`` being trained.
        pair_teacher: ``float32 (n_rows, 1 + h)`` the teacher's logits per training row.
        pair_mode: ``int8 (n_rows,)`` 0 (no teacher), 1 (soft), 2 (margin-mse).
        scale: logit scale ``1 / temperature`` (MNRL's and the teacher term's).

    Raises:
        ValueError: tables of different lengths, or a mode outside ``{0, 1, 2}``.
    """

    def __init__(
        self, model: Any, pair_teacher: np.ndarray, pair_mode: np.ndarray, *, scale: float = 20.0
    ) -> None:
        super().__init__()
        from sentence_transformers.sentence_transformer import losses

        if np.asarray(pair_teacher).shape[0] != np.asarray(pair_mode).shape[0]:
            raise ValueError("pair_teacher and pair_mode must have one row per training row")
        if not set(np.unique(pair_mode).tolist()) <= {0, 1, 2}:
            raise ValueError("pair_mode: 0 (no teacher), 1 (soft) or 2 (margin-mse)")
        self.model = model
        self.mnrl = losses.MultipleNegativesRankingLoss(model, scale=scale)
        self.teacher = torch.as_tensor(np.asarray(pair_teacher, dtype=np.float32))
        self.mode = torch.as_tensor(np.asarray(pair_mode, dtype=np.int64))
        self.scale = float(scale)

    def forward(
        self, features: list[dict[str, torch.Tensor]], labels: torch.Tensor
    ) -> torch.Tensor:
        """Mean loss of one batch (``labels``: ``int64 (B,)`` row indices into the tables)."""
        return self.compute_loss_from_embeddings(
            [self.model(f)["sentence_embedding"] for f in features], labels
        )

    def compute_loss_from_embeddings(
        self, embeddings: list[torch.Tensor], labels: torch.Tensor
    ) -> torch.Tensor:
        """The loss from each column's vectors (``float (B, d)``, anchors first) and the rows'
        labels (``int64 (B,)`` row indices into the tables)."""
        from treerank.training.losses import listwise_kl, margin_mse

        emb = embeddings
        loss = self.mnrl.compute_loss_from_embeddings(emb, labels)
        rows = labels.to(torch.long).cpu()
        mode = self.mode[rows]
        if not bool((mode > 0).any()):
            return loss
        q = nn.functional.normalize(emb[0].float(), dim=1)
        cols = [nn.functional.normalize(e.float(), dim=1) for e in emb[1:]]
        s = self.scale * torch.stack([(q * c).sum(dim=1) for c in cols], dim=1)  # (B, 1 + h)
        t = self.teacher[rows].to(s.device)
        anchor = torch.zeros(s.shape, dtype=torch.bool, device=s.device)
        anchor[:, 0] = True
        d = torch.zeros(s.shape[0], device=s.device)
        soft = (mode == 1).to(s.device)
        if bool(soft.any()):
            scored = torch.isfinite(t[soft])
            z = t[soft].masked_fill(~scored, float("-inf"))
            d[soft] = listwise_kl(s[soft], torch.softmax(z, dim=1), ~scored, reduction="none")
        graded = (mode == 2).to(s.device)
        if bool(graded.any()):
            d[graded] = margin_mse(s[graded], t[graded], anchor[graded], reduction="none")
        return loss + d.sum() / s.shape[0]


def cached_drt_loss(
    model: Any, head: Any, *, scale: float, lambda_dec: float, mini_batch_size: int
) -> DRTEndToEndLoss:
    """:class:`DRTEndToEndLoss` under GradCache (Gao et al. 2021, "Scaling Deep Contrastive
    Learning Batch Size under Memory Limited Setup"): the same loss and gradients, with only
    ``mini_batch_size`` texts' activations alive at a time.

    Built on sentence-transformers' own GradCache machinery (``CachedLossMixin``: embed every
    mini-batch without a graph, keep each one's RNG state; the loss's backward up to the
    embeddings caches their gradients; the trainer's backward re-embeds each mini-batch with
    the same RNG state and pushes the cached gradients through). The DRT heads are part of the
    loss, so their gradients are made in the caching step: exact when the trainer scales
    nothing between the loss and the step, which treerank's fine-tune never does (no gradient
    accumulation, no fp16 scaler; bf16 autocast needs none).

    Returns:
        A :class:`DRTEndToEndLoss` subclass instance (made here, so that importing this module
        does not import sentence-transformers).

    Raises:
        ValueError: ``mini_batch_size < 1`` (and :class:`DRTEndToEndLoss`'s own errors).
    """
    from sentence_transformers.base.losses.gradcache import CachedLossMixin

    if mini_batch_size < 1:
        raise ValueError(f"mini_batch_size must be >= 1, got {mini_batch_size}")

    class CachedDRTEndToEndLoss(CachedLossMixin, DRTEndToEndLoss):  # type: ignore[misc]
        def calculate_loss(
            self, reps: list[list[torch.Tensor]], labels: Any = None, *, with_backward: bool = False
        ) -> torch.Tensor:
            loss = self.loss_from_reps([torch.cat(r) for r in reps])
            if with_backward:
                loss.backward()
                return loss.detach()
            return loss

        def forward(
            self, features: list[dict[str, torch.Tensor]], labels: torch.Tensor | None = None
        ) -> torch.Tensor:
            if len(features) < 2:
                raise ValueError("drt-e2e needs (anchor, positive[, negatives]) columns")
            return self.forward_cached(features, labels)

    loss = CachedDRTEndToEndLoss(model, head, scale=scale, lambda_dec=lambda_dec)
    loss.mini_batch_size = int(mini_batch_size)
    return loss


class CrossRankLoss(nn.Module):
    """Any of the fine-tune's losses under ``torchrun``, with every rank's rows as negatives.

    The trainer splits each planned batch of ``B`` rows into ``W`` contiguous shards
    (accelerate's ``split_batches``), and rank ``r`` encodes its shard of every column. This
    loss gathers each column's vectors from every rank in rank order
    (:func:`treerank.distributed.gather.gather_rows`: other ranks' rows detached, this rank's
    through a gradient scaled by ``W``), gathers the rows' labels, and computes the wrapped
    loss of the **whole** batch (``inner.compute_loss_from_embeddings``), the value a
    one-process run computes. DDP then averages the encoder's gradients, which gives exactly the
    one-process gradient of the batch (proof in :mod:`treerank.distributed.gather`); modules of
    the loss itself (the DRT heads) act after the gather and get the full gradient on every
    rank. The heads' slot dropout draws the same masks on every rank (a generator seeded by
    ``seed`` and the step, set by the trainer's callback), so their weights stay equal; with
    dropout on, runs of different ``W`` agree in distribution, not bit for bit (as the heads'
    data-parallel training: :mod:`treerank.distributed.training`). The score matrix of the
    batch is computed on every rank (redundant, as for the heads; the towers are not).

    Args:
        inner: the one-process loss (``model``; ``compute_loss_from_embeddings``; ``head``).
        ctx: the process group (:func:`treerank.distributed.context.current`).
        seed: the run's seed (the heads' dropout generator).
    """

    def __init__(self, inner: nn.Module, ctx: Any, *, seed: int = 0) -> None:
        super().__init__()
        head = getattr(inner, "head", None)
        if head is not None:  # first, so that its parameters keep their names (head.*)
            self.head = head
        self.model: Any = inner.model
        self.inner = inner
        self.ctx = ctx
        self.seed = int(seed)
        self.step = 0  # the trainer's global step (set by the callback of finetune())

    def forward(
        self, features: list[dict[str, torch.Tensor]], labels: torch.Tensor | None = None
    ) -> torch.Tensor:
        """The whole batch's loss from this rank's shard of it (see the class doc)."""
        import torch.distributed as dist

        from treerank.distributed.gather import gather_rows

        local = [self.model(f)["sentence_embedding"] for f in features]
        n = torch.tensor([local[0].shape[0]], dtype=torch.int64)
        sizes = [torch.zeros_like(n) for _ in range(self.ctx.world_size)]
        dist.all_gather(sizes, n, group=self.ctx.group)
        counts = [int(c.item()) for c in sizes]
        full = [gather_rows(e, counts, self.ctx) for e in local]
        rows = None
        if labels is not None and labels.numel():
            rows = gather_rows(labels.to(torch.float64), counts, self.ctx).to(labels.dtype)
        loss_of: Any = self.inner.compute_loss_from_embeddings
        if getattr(self, "head", None) is None:
            return loss_of(full, rows)  # type: ignore[no-any-return]
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.seed * 1_000_003 + self.step)
            return loss_of(full, rows)  # type: ignore[no-any-return]
