"""``embed:<dataset>:<split>``: a split embedded by the run, or a user's store given as is."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from treerank.encoders import SentenceEncoder
from treerank.encoders.sentence import default_model_path
from treerank.kernels.device import Device
from treerank.pipeline.config import DatasetConfig, EncoderConfig
from treerank.pipeline.identity import StageId
from treerank.pipeline.stages.base import (
    DIGESTS_FILE,
    content_digests,
    digest_sidecar,
    file_sha256,
    fingerprint,
)
from treerank.pipeline.stages.graph import Deps, RunContext, RunStage, Stage
from treerank.pipeline.stages.outputs import EmbedOutput
from treerank.readers import RetrievalSplit
from treerank.search.faiss_index import INDEXES_DIR
from treerank.store import EmbeddingStore
from treerank.store.format import ARRAYS_DIR
from treerank.store.format import FORMAT_VERSION as STORE_FORMAT_VERSION
from treerank.tasks.embed import EncoderLoader, EncoderSettings, embed

__all__ = ["EmbedStage", "Encoder", "GivenStoreStage"]


class Encoder:
    """The experiment's ``encoder:`` section as :class:`~treerank.tasks.embed.EncoderSettings`,
    with one shared :class:`~treerank.tasks.embed.EncoderLoader` (the model is loaded only when
    a stage really has to encode, once for every split)."""

    def __init__(self, cfg: EncoderConfig, device: Device, progress: bool = True) -> None:
        self.cfg = cfg
        self.device = device
        self.settings = EncoderSettings(
            cfg.model,
            query_prompt=cfg.query_prompt,
            token_budget=cfg.token_budget,
            backend=cfg.backend,
            precision=cfg.precision,
        )
        self.loader = EncoderLoader(self.settings, progress=progress)

    def key(self) -> dict[str, object]:
        """What identifies the encoder without loading it: its weights' bytes where local."""
        model = self.cfg.model
        path = Path(default_model_path() if model is None else model)
        ident = file_sha256(path) if path.exists() else str(model)
        return {
            "model": model or "default",
            "weights": ident,
            "query_prompt": self.cfg.query_prompt,
            "token_budget": self.cfg.token_budget,
            "backend": self.cfg.backend,
            # fp32 keeps the key of configs written before precisions existed
            **({"precision": self.cfg.precision} if self.cfg.precision != "fp32" else {}),
        }

    def get(self) -> SentenceEncoder:
        """The encoder on the run's device (loaded on first use)."""
        return self.loader(self.device)


@dataclass(kw_only=True)
class EmbedStage(RunStage):
    """Read one split of a raw dataset and embed it into the stage's directory (resumable)."""

    produces = EmbedOutput
    resumes = True
    dataset: DatasetConfig
    split: str
    encoder: Encoder

    @classmethod
    def make(
        cls,
        ctx: RunContext,
        ds: DatasetConfig,
        split: str,
        data_sha: str,
        encoder: Encoder,
        enc_key: dict[str, object],
    ) -> EmbedStage:
        sid = StageId.embed(ds.name, split)
        inputs = {
            "store_format": STORE_FORMAT_VERSION,
            "data_sha256": data_sha,
            "format": ds.format,
            "limit": ds.limit,
            "max_passages": ds.max_passages,
            "encoder": enc_key,
            "device": ctx.device_key,
        }
        return cls.of(ctx, sid, (), inputs, dataset=ds, split=split, encoder=encoder)

    def run(self, d: Path, deps: Deps) -> EmbedOutput:
        ds, ctx = self.dataset, self.ctx
        assert ds.path is not None and ds.format is not None

        def on_read(name: str, data: RetrievalSplit | None, main: bool) -> None:
            for w in data.warnings() if data is not None else []:
                ctx.log(f"[warn]  {StageId.embed(ds.name, name).name}: {w}")

        # resume continues an interrupted run of the same inputs (byte-identical result); a
        # finished store of other inputs is replaced; passages already encoded by the same
        # encoder in a sibling split are reused, as `treerank embed` does
        (done,) = embed(
            ds.path,
            d.parent,
            self.encoder.loader,
            fmt=ds.format,
            splits=[self.split],
            limit=ds.limit,
            max_passages=ds.max_passages,
            device=self.encoder.device,
            resume=not ctx.force,
            overwrite=ctx.force,
            replace_stale=True,
            progress=ctx.progress,
            split_dir=lambda _split: d,
            on_read=on_read,
        )
        return EmbedOutput(d, done.summary())


@dataclass(kw_only=True)
class GivenStoreStage(Stage):
    """A split of a dataset's existing store (``datasets[].store``): nothing to run.

    Its key covers every file's name and content digest (SHA-256, computed once and kept in
    the run's cache directory, :func:`~treerank.pipeline.stages.base.digest_sidecar`, recomputed
    when a file's size, mtime, ctime or inode changes:
    :func:`~treerank.pipeline.stages.base.content_digests`), so a changed store re-runs the
    stages that read it, even a same-size file with swapped rows and a restored mtime. Derived
    caches other tools may keep beside the split (``arrays/``, ``indexes/``) are left out. The
    run never writes into a given store: mining, teacher runs and pseudo splits are stages of
    their own with their own directories.
    """

    key: str
    out: EmbedOutput

    @classmethod
    def make(cls, ctx: RunContext, ds: DatasetConfig, split: str) -> GivenStoreStage:
        assert ds.store is not None
        sid = StageId.embed(ds.name, split)
        path = ds.store / split
        st = EmbeddingStore.open(path, dim=ds.dim)
        rels = sorted(
            p.relative_to(path).as_posix()
            for p in path.rglob("*")
            if p.is_file()
            and p.name not in ("stage.json", DIGESTS_FILE)
            and p.relative_to(path).parts[0] not in (ARRAYS_DIR, INDEXES_DIR)
        )
        digests = content_digests(path, rels, digest_sidecar(ctx.output_dir, path))
        key = fingerprint("store", str(path), ds.dim, [[r, digests[r]] for r in rels])
        stats: dict[str, object] = {
            "n_queries": st.n_queries,
            "n_passages": st.n_passages,
            "k": st.k,
            "store": str(path),
        }
        return cls(
            sid,
            sid.path(ctx.output_dir, ds.store),
            (),
            {"store": str(ds.store)},
            output=EmbedOutput,
            key=key,
            out=EmbedOutput(path, stats, ds.dim),
        )

    def given(self) -> tuple[str, EmbedOutput]:
        return self.key, self.out
