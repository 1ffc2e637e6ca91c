"""A new user's mistakes (issue 22): every mistake of the trial
(``shared/trials/new-user-2026-12-01.md``, numbered ``trial-NN`` as there) and new ones
(``new-NN``), each with its exit code (:mod:`treerank.cli.errors`) and the message it must print,
on a 30-passage BEIR folder of our own (``data/samples/mybeir``) embedded once per session.

Commands run in-process through typer's ``CliRunner``; none starts a server. The serve cases
(HTTP errors) use the app in-process. Left to the `faults` work: the port already in use
(trial #27), YAML types (#14: only the exit code is checked here) and FAISS parameter checks
(#34, the small-store IVF-PQ).
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from typer.testing import CliRunner

from treerank.cli.errors import ExitCode
from treerank.cli.main import app

FIXTURE = Path(__file__).resolve().parents[2] / "data" / "samples" / "mybeir"
CONFIGS = Path(__file__).resolve().parents[2] / "configs"
runner = CliRunner()

OK, FAILED, BAD = ExitCode.OK, ExitCode.FAILED, ExitCode.BAD_INPUT


@dataclass
class Env:
    """The session's data: the BEIR folder, its store (train + test), a trained checkpoint."""

    root: Path
    data: Path
    stores: Path
    ckpt: Path
    outputs: dict[str, str] = field(default_factory=dict)

    def fmt(self, s: str, tmp: Path, bad: Path | None = None) -> str:
        return s.format(
            data=self.data, stores=self.stores, ckpt=self.ckpt, tmp=tmp, configs=CONFIGS, bad=bad
        )


def invoke(args: list[str]) -> tuple[int, str]:
    res = runner.invoke(app, args)
    if res.exception is not None and not isinstance(res.exception, SystemExit):
        raise res.exception  # a traceback is never an answer to a mistake
    return res.exit_code, " ".join(res.output.split())


@pytest.fixture(scope="module", autouse=True)
def one_encoder():
    """Every ``embed`` of this file reuses one loaded default encoder (loading costs seconds;
    the commands build it with the default model and settings, which this one has)."""
    import treerank.encoders

    real = treerank.encoders.SentenceEncoder
    mp = pytest.MonkeyPatch()
    mp.setattr(treerank.encoders, "SentenceEncoder", lambda *a, **k: _encoder(real))
    yield
    mp.undo()


@pytest.fixture(scope="module")
def env(tmp_path_factory, one_encoder) -> Env:
    root = tmp_path_factory.mktemp("newuser")
    data = root / "mybeir"
    shutil.copytree(FIXTURE, data)
    e = Env(root, data, root / "stores" / "mybeir", root / "ckpt" / "linear")
    code, out = invoke(
        ["embed", str(data), "--format", "beir", "--split", "train", "--split", "test"]
        + ["--out", str(e.stores), "--no-progress"]
    )
    assert code == OK, out
    e.outputs["embed"] = out
    code, out = invoke(
        ["train", "--model", "linear", "--store", str(e.stores)]
        + ["--config", str(CONFIGS / "heads" / "linear.yaml"), "--out", str(e.ckpt)]
        + ["--no-progress"]
    )
    assert code == OK, out
    e.outputs["train"] = out
    return e


# ------------------------------------------------------------------------------ bad data sets
def bad_copy(env: Env, tmp: Path, **changes: bytes | Callable[[bytes], bytes] | None) -> Path:
    """A copy of the BEIR folder with files replaced (``corpus_jsonl=b"..."``; a callable gets
    the old bytes; ``None`` removes the file)."""
    out = tmp / "bad"
    shutil.copytree(env.data, out)
    for key, new in changes.items():
        rel = key.replace("__", "/").replace("_jsonl", ".jsonl").replace("_tsv", ".tsv")
        p = out / rel
        if new is None:
            p.unlink()
        else:
            p.write_bytes(new(p.read_bytes()) if callable(new) else new)
    return out


def line_edit(i: int, fn: Callable[[bytes], bytes]) -> Callable[[bytes], bytes]:
    """Change 1-based line ``i`` of a file."""

    def edit(raw: bytes) -> bytes:
        lines = raw.split(b"\n")
        lines[i - 1] = fn(lines[i - 1])
        return b"\n".join(lines)

    return edit


@dataclass
class Mistake:
    """One mistake: ``args`` (``{data}``, ``{stores}``, ``{ckpt}``, ``{tmp}``, ``{configs}``
    are filled in; ``{bad}`` is the folder ``setup`` returns), the exit code, and regexes the
    output must match (``absent``: must not)."""

    id: str
    what: str
    args: str | list[str]
    code: int
    message: list[str]
    setup: Callable[[Env, Path], Path | None] | None = None
    absent: list[str] = field(default_factory=list)
    nothing_written: str | None = None  # a path (formatted) that must not exist afterwards


def _drop_train_split(env: Env, tmp: Path) -> Path:
    root = tmp / "sf"
    shutil.copytree(env.stores / "test", root / "test")
    return root


def _afile(env: Env, tmp: Path) -> Path:
    (tmp / "afile").write_text("mine")
    return tmp


def _experiment(**edits: object) -> Callable[[Env, Path], Path]:
    def setup(env: Env, tmp: Path) -> Path:
        doc: dict = {
            "name": "mine",
            "output_dir": str(tmp / "runs" / "mine"),
            "datasets": [
                {"name": "mybeir", "path": str(env.data), "format": "beir"}
                | {"train_split": "train", "eval_split": "test"}
            ],
            "systems": ["cosine", "bm25"],
            "evaluate": {"k": 100, "baselines": ["cosine"], "metrics": ["ndcg@10"]},
            "models": {"lin": {"family": "linear", "trainer": {"epochs": 3}}},
        }
        for path, value in edits.items():
            cur = doc
            *head, last = path.split("__")
            for h in head:
                cur = cur[int(h)] if isinstance(cur, list) else cur[h]
            if isinstance(cur, list):
                cur[int(last)] = value
            else:
                cur[last] = value
        import yaml

        (tmp / "exp.yaml").write_text(yaml.safe_dump(doc))
        return tmp

    return setup


def _other_encoder_ckpt(env: Env, tmp: Path) -> Path:
    ck = tmp / "other"
    shutil.copytree(env.ckpt, ck)
    doc = json.loads((ck / "config.json").read_text())
    doc["encoder"] = {"name": "another/model", "fingerprint": "sha256:" + "0" * 64}
    (ck / "config.json").write_text(json.dumps(doc))
    return tmp


def _partial_store(env: Env, tmp: Path) -> Path:
    from treerank.encoders import SentenceEncoder
    from treerank.readers import read_split
    from treerank.store import embed_split

    split = read_split(env.data, "beir", split="test")
    with pytest.raises(KeyboardInterrupt):
        embed_split(
            split, _encoder(SentenceEncoder), tmp / "sf" / "test", progress=False,
            stop_after_batches=1,
        )  # fmt: skip
    return tmp


_ENC: list = []


def _encoder(cls):  # the one encoder of the session (loading costs seconds)
    if not _ENC:
        _ENC.append(cls(progress=False))
    return _ENC[0]


EMBED = "embed {bad} --format beir --split test --out {tmp}/out --no-progress"
EMBED_SMALL = EMBED + " --max-passages 9"  # a read that succeeds: encode only the judged ones
EVAL = "evaluate --store {stores}/test --system cosine --no-overlap --permutations 200"

MISTAKES = [
    # ------------------------------------------------------------------- the trial's 38
    Mistake(
        "trial-01",
        "--format typo",
        "embed {data} --format bier --out {tmp}/o",
        BAD,
        [r"unknown format 'bier'; use one of \[.*'beir'"],
        nothing_written="{tmp}/o",
    ),
    Mistake(
        "trial-02",
        "wrong format for the folder",
        "embed {data} --format msmarco --out {tmp}/o",
        BAD,
        [
            r"corpus\.jsonl, row 1: row lacks 'query' / 'query_id' \(this looks like 'beir' data: "
            r"pass --format beir or auto\)"
        ],
    ),
    Mistake(
        "trial-03",
        "path does not exist",
        "embed {tmp}/nope --out {tmp}/o",
        BAD,
        [r"nope: file or directory not found"],
    ),
    Mistake(
        "trial-04",
        "split not in qrels",
        "embed {data} --format beir --split dev --out {tmp}/o",
        BAD,
        [r"qrels/dev\.tsv: file not found"],
        nothing_written="{tmp}/o",
    ),
    Mistake(
        "trial-05",
        "a JSON line cut in a string",
        EMBED,
        BAD,
        [r"corpus\.jsonl, row 12: invalid JSON \(Invalid control character at column \d+\)"],
        lambda e, t: bad_copy(e, t, corpus_jsonl=line_edit(12, lambda b: b[:40] + b"\n")),
    ),
    Mistake(
        "trial-06",
        "qrels query id missing from queries.jsonl",
        EMBED,
        BAD,
        [r"qrels/test\.tsv: 1 query id\(s\) absent from queries\.jsonl, e\.g\. q99"],
        lambda e, t: bad_copy(e, t, qrels__test_tsv=lambda b: b + b"q99\tcof1\t1\n"),
    ),
    Mistake(
        "trial-07",
        "a query with empty text",
        EMBED,
        BAD,
        [r"queries\.jsonl, row 5: empty query \(_id q5\)"],
        lambda e, t: bad_copy(
            e, t, queries_jsonl=line_edit(5, lambda b: b'{"_id": "q5", "text": " "}')
        ),
    ),
    Mistake(
        "trial-08",
        "byte 0xe9 on line 5 of corpus.jsonl",
        EMBED,
        BAD,
        [r"corpus\.jsonl, row 5: invalid UTF-8 byte 0xe9 at byte \d+ of the file"],
        lambda e, t: bad_copy(
            e, t, corpus_jsonl=line_edit(5, lambda b: b.replace(b"Light", b"L\xe9ght"))
        ),
    ),
    Mistake(
        "trial-08b",
        "byte 0xe9 on line 7 of queries.jsonl",
        EMBED,
        BAD,
        [r"queries\.jsonl, row 7: invalid UTF-8 byte 0xe9"],
        lambda e, t: bad_copy(
            e, t, queries_jsonl=line_edit(7, lambda b: b.replace(b"caffeine", b"caf\xe9ine"))
        ),
    ),
    Mistake(
        "trial-09",
        "evaluate a split that does not exist",
        "evaluate --store {stores}/dev --system cosine",
        BAD,
        [r"mybeir/dev: store directory not found"],
    ),
    Mistake(
        "trial-10",
        "evaluate the store root",
        "evaluate --store {stores} --system cosine",
        BAD,
        [
            r"a store root holding the split\(s\) test, train",
            r"\(e\.g\. \S+/mybeir/test\)",
            r"or pass --split test",
        ],
    ),
    Mistake(
        "trial-11",
        "search on the store root",
        "search --store {stores} -q coffee",
        BAD,
        [r"a store root holding the split\(s\) test, train", r"\(e\.g\. \S+/mybeir/test\)"],
        absent=[r"--split"],
    ),
    Mistake(
        "trial-11b",
        "index build on the store root",
        "index build --store {stores} --index faiss:flat",
        BAD,
        [r"store root holding", r"mybeir/test\)"],
        absent=[r"--split"],
    ),
    Mistake(
        "trial-11c",
        "serve on the store root",
        "serve --store {stores} --port 1",
        BAD,
        [r"store root holding", r"mybeir/test\)"],
        absent=[r"--split"],
    ),
    Mistake(
        "trial-11d",
        "search --split (an option it has not)",
        "search --store {stores} --split test -q coffee",
        BAD,
        [r"No such option: --split"],
    ),
    Mistake(
        "trial-12",
        "--system typo",
        EVAL + " --system bm52 --out {tmp}/e",
        BAD,
        [r"unknown system kind 'bm52'; did you mean 'bm25'\?"],
        nothing_written="{tmp}/e",
    ),
    Mistake(
        "trial-13",
        "misspelled key deep in the YAML",
        "run {tmp}/exp.yaml",
        BAD,
        [
            r"exp\.yaml: models\.lin\.validation: unknown key\(s\) group_by_pasage; allowed: "
            r".*group_by_passage"
        ],
        _experiment(models__lin__validation={"group_by_pasage": True}),
        nothing_written="{tmp}/runs",
    ),
    Mistake(
        "trial-14",
        "wrong value type in the YAML (epochs: three)",
        "run {tmp}/exp.yaml",
        BAD,
        [r"exp\.yaml: models\.lin\.trainer"],
        _experiment(models__lin__trainer={"epochs": "three"}),
        nothing_written="{tmp}/runs",
    ),
    Mistake(
        "trial-15",
        "system typo inside the YAML",
        "run {tmp}/exp.yaml",
        BAD,
        [
            r"1 problem found before running anything",
            r"systems\[2\]: unknown system kind "
            r"'cosin'; did you mean 'cosine'\?",
        ],
        _experiment(systems=["cosine", "bm25", "rrf:bm25+cosin"]),
        nothing_written="{tmp}/runs",
    ),
    Mistake(
        "trial-16",
        "top-level key typo",
        "run {tmp}/exp.yaml",
        BAD,
        [r"the top level: unknown key\(s\) evalute"],
        _experiment(evalute={"k": 10}),
        nothing_written="{tmp}/runs",
    ),
    Mistake(
        "trial-16b",
        "dataset key typo",
        "run {tmp}/exp.yaml",
        BAD,
        [r"datasets\[0\]: unknown key\(s\) eval_spilt"],
        _experiment(datasets__0__eval_spilt="test"),
        nothing_written="{tmp}/runs",
    ),
    Mistake(
        "trial-16c",
        "dataset path typo",
        "run {tmp}/exp.yaml",
        BAD,
        [r"datasets\[0\]\.path \S+mybeirr does not exist"],
        _experiment(datasets__0__path="/nonexistent/mybeirr"),
        nothing_written="{tmp}/runs",
    ),
    Mistake(
        "trial-17",
        "--k 0",
        EVAL + " --k 0",
        BAD,
        [r"the run depth k \(--k; evaluate\.k in an experiment\) must be at least 1, got 0"],
    ),
    Mistake(
        "trial-18",
        "--k 5 with the default metrics",
        EVAL + " --k 5",
        BAD,
        [r"--k 5 is below the cutoff of every default metric"],
    ),
    Mistake(
        "trial-18b",
        "--k 5 with --metric ndcg@10",
        EVAL + " --k 5 --metric ndcg@10",
        BAD,
        [r"ndcg@10 cannot be measured on a top-5 run"],
    ),
    Mistake(
        "trial-19",
        "--k larger than the corpus",
        EVAL + " --k 1000000",
        OK,
        [r"7 queries evaluated"],
    ),
    Mistake(
        "trial-20",
        "train with a config of another family",
        "train --model linear --store {stores} --config {configs}/drt/default.yaml --out {tmp}/ck",
        BAD,
        [r"default\.yaml.*unknown key\(s\) .*attn_hidden"],
        nothing_written="{tmp}/ck",
    ),
    Mistake(
        "trial-21",
        "--model typo",
        "train --model linaer --store {stores} --out {tmp}/ck",
        BAD,
        [r"unknown model family 'linaer'; did you mean 'linear'\?"],
    ),
    Mistake(
        "trial-22",
        "train on a root without train/",
        "train --model linear --store {bad} --out {tmp}/ck",
        BAD,
        [r"a store root without a 'train' split \(it holds test\)", r"--split train"],
        _drop_train_split,
        absent=[r"sf/test"],
        nothing_written="{tmp}/ck",
    ),
    Mistake(
        "trial-24",
        "re-run an interrupted embed without --resume",
        "embed {data} --format beir --split test --out {tmp}/sf --no-progress",
        BAD,
        [r"sf/test/progress\.json: an unfinished embed run is here; pass resume \(--resume\)"],
        _partial_store,
    ),
    Mistake(
        "trial-26",
        "embed over a finished store",
        "embed {data} --format beir --split test --out {stores} --no-progress",
        BAD,
        [r"meta\.json: a finished store is already here; pass overwrite \(--overwrite\)"],
    ),
    Mistake(
        "trial-31",
        "serve with an index of another store",
        "serve --store {stores}/test --index {tmp}/idx --port 1",
        BAD,
        [
            r"was built on store \S+train \(vectors digest [0-9a-f]{64}\), but the served store "
            r"\S+test has vectors digest"
        ],
        lambda e, t: _index_of(e, t, "train"),
    ),
    Mistake(
        "trial-32",
        "ckpt: path typo",
        EVAL + " --system ckpt:{tmp}/lineaar --out {tmp}/e",
        BAD,
        [r"bad system spec 'ckpt:\S+lineaar': \S+config\.json: missing \(no such directory\)"],
    ),
    Mistake(
        "trial-33",
        "index kind typo",
        "index build --store {stores}/test --index faiss:hsnw",
        BAD,
        [r"unknown index kind 'hsnw'; did you mean 'hnsw'\?"],
    ),
    Mistake(
        "trial-33b",
        "index parameter typo",
        "index build --store {stores}/test --index faiss:hnsw:m=32",
        BAD,
        [r"'m=32' is not one of M=\.\.\."],
    ),
    Mistake(
        "trial-35",
        "evaluate --out is an existing file",
        EVAL + " --out {tmp}/afile",
        BAD,
        [r"afile: exists and is not a directory"],
        _afile,
        absent=[r"Traceback", r"queries evaluated"],
        nothing_written="{tmp}/.afile.lock",
    ),
    Mistake(
        "trial-36",
        "qrels without header, space-separated",
        EMBED_SMALL,
        OK,
        [r"7 queries"],
        lambda e, t: bad_copy(
            e,
            t,
            qrels__test_tsv=lambda b: b"\n".join(
                x.replace(b"\t", b" ") for x in b.split(b"\n")[1:]
            ),
        ),
    ),
    Mistake(
        "trial-36b",
        "a judged passage not in the corpus",
        EMBED_SMALL,
        OK,
        [
            r"warning: 1 of 10 judgments name a passage that is not in the corpus and were "
            r"dropped \(e\.g\. query q7 -> passage bik99\)"
        ],
        lambda e, t: bad_copy(e, t, qrels__test_tsv=lambda b: b + b"q7\tbik99\t1\n"),
    ),
    Mistake(
        "trial-37",
        "duplicate _id",
        EMBED,
        BAD,
        [
            r"corpus\.jsonl, row 15: document id 'vol4' repeated \(rows 14 and 15\); ids must "
            r"be unique"
        ],
        lambda e, t: bad_copy(
            e, t, corpus_jsonl=line_edit(15, lambda b: b.replace(b'"vol5"', b'"vol4"'))
        ),
    ),
    Mistake(
        "trial-37b",
        "id instead of _id",
        EMBED,
        BAD,
        [r"corpus\.jsonl, row 1: missing key\(s\) \['_id'\]"],
        lambda e, t: bad_copy(
            e, t, corpus_jsonl=line_edit(1, lambda b: b.replace(b'"_id"', b'"id"'))
        ),
    ),
    # ------------------------------------------------------------------------- new ones
    Mistake(
        "new-01",
        "an empty corpus.jsonl",
        EMBED,
        BAD,
        [r"bad\S*: .*(no passages|passage)"],
        lambda e, t: bad_copy(e, t, corpus_jsonl=b""),
    ),
    Mistake(
        "new-02",
        "qrels with the header only",
        EMBED,
        BAD,
        [r"qrels/test\.tsv: no judgments \(an empty file or a header line only\)"],
        lambda e, t: bad_copy(e, t, qrels__test_tsv=b"query-id\tcorpus-id\tscore\n"),
    ),
    Mistake(
        "new-03",
        "a negative grade (clipped to 0: not relevant)",
        EMBED_SMALL,
        OK,
        [r"7 queries"],
        lambda e, t: bad_copy(e, t, qrels__test_tsv=lambda b: b.replace(b"cof2\t1", b"cof2\t-1")),
    ),
    Mistake(
        "new-04",
        "a UTF-8 BOM at the start of corpus.jsonl",
        EMBED_SMALL,
        OK,
        [r"7 queries, 9 passages"],
        lambda e, t: bad_copy(e, t, corpus_jsonl=lambda b: b"\xef\xbb\xbf" + b),
    ),
    Mistake(
        "new-05",
        "CRLF line endings everywhere",
        EMBED_SMALL,
        OK,
        [r"7 queries, 9 passages"],
        lambda e, t: bad_copy(
            e,
            t,
            **{
                k: (lambda b: b.replace(b"\n", b"\r\n"))
                for k in ("corpus_jsonl", "queries_jsonl", "qrels__test_tsv")
            },
        ),
    ),
    Mistake(
        "new-06",
        "a directory passed as --config",
        "train --model linear --store {stores} --config {tmp} --out {tmp}/ck",
        BAD,
        [r"is a directory; the config must be a YAML file"],
        nothing_written="{tmp}/ck",
    ),
    Mistake(
        "new-07",
        "--k not an integer",
        EVAL + " --k ten",
        BAD,
        [r"Invalid value for '--k': .*valid integer"],
    ),
    Mistake(
        "new-08",
        "corpus.jsonl is a directory",
        EMBED,
        BAD,
        [r"corpus\.jsonl: not a regular file"],
        lambda e, t: _dir_instead(bad_copy(e, t), "corpus.jsonl"),
        absent=[r"looks like"],
    ),
    Mistake(
        "new-09",
        "a checkpoint of another encoder: refused before any work (issue 34's one mixing check)",
        EVAL + " --system ckpt:{tmp}/other",
        BAD,
        [r"other: trained on vectors from encoder 'another/model' \(fingerprint .*re-train"],
        _other_encoder_ckpt,
    ),
    Mistake(
        "new-10",
        "a repeated query _id",
        EMBED,
        BAD,
        [r"queries\.jsonl, row 12: query id 'q1' repeated \(rows 1 and 12\)"],
        lambda e, t: bad_copy(
            e, t, queries_jsonl=line_edit(12, lambda b: b.replace(b'"q12"', b'"q1"'))
        ),
    ),
    Mistake(
        "new-11",
        "evaluate --out below a file",
        EVAL + " --out {tmp}/afile/eval",
        BAD,
        [r"afile/eval: cannot be created, \S+afile is a file"],
        _afile,
        nothing_written="{tmp}/afile/eval",
    ),
    Mistake(
        "new-12",
        "train --out is an existing file",
        "train --model linear --store {stores} --out {tmp}/afile",
        BAD,
        [r"afile: exists and is not a directory"],
        _afile,
        absent=[r"held-out"],
    ),
    Mistake(
        "new-13",
        "a grade that is not an integer",
        EMBED,
        BAD,
        [r"qrels/test\.tsv, row 3: .*grade"],
        lambda e, t: bad_copy(e, t, qrels__test_tsv=lambda b: b.replace(b"cof2\t1", b"cof2\tx")),
    ),
    Mistake(
        "new-14",
        "search with a missing --queries file",
        "search --store {stores}/test --queries {tmp}/q.txt",
        BAD,
        [r"q\.txt: file not found"],
    ),
    Mistake(
        "new-15",
        "search --format typo",
        "search --store {stores}/test -q coffee -f csv",
        BAD,
        [r"--format must be table, json or trec, not 'csv'"],
    ),
    Mistake(
        "new-16",
        "a corrupt meta.json in a store",
        "evaluate --store {bad} --system cosine",
        BAD,
        [r"meta\.json: not valid JSON"],
        lambda e, t: _corrupt_meta(e, t),
    ),
    Mistake(
        "new-17",
        "evaluate a store whose embed was interrupted",
        "evaluate --store {tmp}/sf/test --system cosine",
        BAD,
        [r"sf/test: incomplete store .*--resume"],
        _partial_store,
    ),
    Mistake(
        "new-18",
        "--baseline not among --system (added, not refused)",
        EVAL + " --system bm25 --baseline bm25",
        OK,
        [r"7 queries evaluated"],
    ),
    Mistake(
        "new-19",
        "a query id with a space in qrels",
        EMBED,
        BAD,
        [r"qrels/test\.tsv, row \d+: query id 'q 1' is empty or contains white space"],
        lambda e, t: bad_copy(e, t, qrels__test_tsv=lambda b: b + b"q 1\tcof1\t1\n"),
    ),
    Mistake(
        "new-20",
        "a JSON array line instead of an object",
        EMBED,
        BAD,
        [r"corpus\.jsonl, row 3: expected a JSON object"],
        lambda e, t: bad_copy(e, t, corpus_jsonl=line_edit(3, lambda b: b"[1, 2]")),
    ),
]


MISTAKES.append(
    Mistake(
        "new-21",
        "search --out is a directory",
        "search --store {stores}/test -q coffee -f json --out {tmp}",
        BAD,
        [r"cannot be written: --out names a file, and this is a directory"],
    )
)


MISTAKES += [
    Mistake(
        f"trial-port-{port}",
        f"serve --port {port} (not a TCP port)",
        f"serve --store {{stores}}/test --port {port}",
        BAD,
        [r"--port': Input should be (less|greater) than or equal to (65535|0)"],
    )
    for port in ("99999", "-1")
]


def _queries_file(content: bytes) -> Callable[[Env, Path], Path]:
    def setup(env: Env, tmp: Path) -> Path:
        (tmp / "q.tsv").write_bytes(content)
        return tmp / "q.tsv"

    return setup


MISTAKES += [
    Mistake(
        "trial-dup-qid",
        "search --queries with a query id given twice",
        "search --store {stores}/test --queries {bad} -f trec --out {tmp}/run.trec",
        BAD,
        [r"q\.tsv:3: query id 'a' was already given on line 1"],
        _queries_file(b"a\tcoffee\nb\ttea\na\tvolcano\n"),
        nothing_written="{tmp}/run.trec",
    ),
    Mistake(
        "trial-queries-utf8",
        "search --queries with a byte that is not UTF-8",
        "search --store {stores}/test --queries {bad}",
        BAD,
        [r"q\.tsv, row 2: invalid UTF-8 byte 0xe9"],
        _queries_file(b"a\tcoffee\nb\tcaf\xe9\n"),
    ),
]

# ---------------------------------------------- issue 36: devices and --max-seq-length, exit 2
_NO_CUDA = not __import__("torch").cuda.is_available()
_CUDA_SPELLINGS = ("cuda", "cuda:7", "CUDA") if _NO_CUDA else ()  # on a GPU machine they work
MISTAKES += (
    [
        Mistake(
            f"i36-embed-device-{spec.replace(':', '')}",
            f"embed --device {spec} on a machine without CUDA",
            f"embed {{data}} --format beir --split test --out {{tmp}}/out --device {spec}",
            BAD,
            [
                rf"error: --device {spec}: device \(auto \| cpu \| cuda\[:n\]\): cuda requested "
                r"but torch.cuda.is_available\(\) is False .*use device: cpu or device: auto"
            ],
            absent=["reading", "queries,"],  # refused before the data is read
            nothing_written="{tmp}/out",
        )  # fmt: skip
        for spec in _CUDA_SPELLINGS
    ]
    + [
        Mistake(
            f"i36-{cmd}-device-gpu",
            f"{cmd} --device gpu (not a device name)",
            args,
            BAD,
            [
                r"error: --device gpu: device \(auto \| cpu \| cuda\[:n\]\): unknown device 'gpu'; "
                r"known: auto, cpu, cuda, cuda:<n>"
            ],
            nothing_written="{tmp}/out",
        )  # fmt: skip
        for cmd, args in (
            ("embed", "embed {data} --format beir --split test --out {tmp}/out --device gpu"),
            ("search", "search --store {stores}/test --query coffee --device gpu --out {tmp}/out"),
            ("serve", "serve --store {stores}/test --device gpu --port 0"),
            ("train", "train --model linear --store {stores} --out {tmp}/out --device gpu"),
            ("evaluate", EVAL + " --device gpu --out {tmp}/out"),
        )
    ]
    + [
        Mistake(
            f"i36-max-seq-length-{n}",
            f"embed --max-seq-length {n} (MiniLM has 512 positions)",
            f"embed {{data}} --format beir --split test --out {{tmp}}/out --max-seq-length={n}",
            BAD,
            [
                rf"error: --max-seq-length {n}: out of range; expected 1\.\.512 tokens "
                r"\(all-MiniLM-L6-v2 has 512 positions"
            ],
            absent=["reading"],
            nothing_written="{tmp}/out",
        )
        for n in (1024, 513, 0, -5)
    ]
)


def _int8_ckpt(env: Env, tmp: Path) -> Path:
    ck = tmp / "int8"
    shutil.copytree(env.ckpt, ck)
    doc = json.loads((ck / "config.json").read_text())
    assert doc["extra"]["encoding"]["precision"] == "fp32"  # recorded by `treerank train`
    doc["extra"]["encoding"].update(precision="int8", backend="onnx-int8")
    (ck / "config.json").write_text(json.dumps(doc))
    return ck


MISTAKES += [
    Mistake(
        "i36-export-int8-store",
        "export to sentence-transformers a head trained on an int8 (onnx-int8) store",
        "export ckpt:{bad} --to sentence-transformers {tmp}/st",
        BAD,
        [r"was encoded at int8 \(backend 'onnx-int8'\); a sentence-transformers folder "
         r"computes fp32"],
        _int8_ckpt,
        nothing_written="{tmp}/st",
    ),
    Mistake(
        "i36-export-other-prompt",
        "export with a --query-prompt the store was not embedded with",
        "export ckpt:{ckpt} --to sentence-transformers {tmp}/st --query-prompt q:",
        BAD,
        [r"--query-prompt 'q:': the store the head was trained on .* was encoded with no "
         r"prompt; the export carries the store's prompts"],
        nothing_written="{tmp}/st",
    ),
]  # fmt: skip


def _index_of(env: Env, tmp: Path, split: str) -> Path:
    from treerank.search.faiss_index import build_index
    from treerank.store import EmbeddingStore

    build_index(EmbeddingStore.open(env.stores / split), "flat", index_dir=tmp / "idx-parent")
    (built,) = [p for p in (tmp / "idx-parent").iterdir() if p.is_dir()]
    built.rename(tmp / "idx")
    return tmp


def _dir_instead(folder: Path, name: str) -> Path:
    (folder / name).unlink()
    (folder / name).mkdir()
    return folder


def _corrupt_meta(env: Env, tmp: Path) -> Path:
    out = tmp / "corrupt"
    shutil.copytree(env.stores / "test", out)
    (out / "meta.json").write_text('{"dim": 384,')
    return out


# --------------------------------------------- issue 33: numbers a researcher can trust (t33-NN)
MSMARCO_FILE = FIXTURE.parents[1] / "samples" / "msmarco" / "ms_marco_v2.1_validation_10.parquet"
TRAIN = "train --model linear --store {stores} --no-progress"


def _nonempty(name: str) -> Callable[[Env, Path], Path]:
    def setup(env: Env, tmp: Path) -> Path:
        (tmp / name).mkdir()
        (tmp / name / "mine.txt").write_text("keep me")
        return tmp

    return setup


def _yaml(doc: dict) -> Callable[[Env, Path], Path]:
    def setup(env: Env, tmp: Path) -> Path:
        import yaml

        (tmp / "c.yaml").write_text(yaml.safe_dump(doc))
        return tmp / "c.yaml"

    return setup


def _text_leak_ckpt(env: Env, tmp: Path) -> Path:
    """The session's checkpoint, its record rewritten as if it trained on a split of another
    store whose query texts are the test split's (one file read under two split names)."""
    from treerank.evaluation.provenance import training_provenance
    from treerank.store import EmbeddingStore

    ck = tmp / "leaky"
    shutil.copytree(env.ckpt, ck)
    doc = json.loads((ck / "config.json").read_text())
    test = training_provenance(EmbeddingStore.open(env.stores / "test"))
    doc["extra"]["train_provenance"] = test | {
        "store": "/elsewhere/train",
        "split": "train",
        "signature": "another",
        "query_id_hashes": "",
    }
    (ck / "config.json").write_text(json.dumps(doc))
    return tmp


def _other_collection(env: Env, tmp: Path) -> Path:
    code, out = invoke(
        ["embed", str(MSMARCO_FILE), "--format", "msmarco", "--split", "validation"]
        + ["--limit", "2", "--out", str(tmp / "other"), "--no-progress"]
    )
    assert code == OK, out
    return tmp / "other" / "validation"


def _forest_ckpt(env: Env, tmp: Path) -> Path:
    import yaml

    cfg = {"model": {"n_models": 2, "n_classes": 4, "untrained": True}}
    (tmp / "f.yaml").write_text(yaml.safe_dump(cfg))
    code, out = invoke(
        ["train", "--model", "forest", "--store", str(env.stores), "--config", str(tmp / "f.yaml")]
        + ["--out", str(tmp / "forest"), "--no-progress"]
    )
    assert code == OK, out
    return tmp


def _run_folder(env: Env, tmp: Path) -> Path:
    shutil.copytree(env.ckpt, tmp / "runs" / "models" / "mybeir" / "lin" / "checkpoint")
    return tmp


def _experiment_without_quick(env: Env, tmp: Path) -> Path:
    return _experiment()(env, tmp)


MISTAKES += [
    # --- the issue's cases
    Mistake(
        "t33-01",
        "train --out over an existing checkpoint",
        TRAIN + " --out {ckpt}",
        BAD,
        [r"linear: already holds a model directory or other files; pass --overwrite"],
    ),
    Mistake(
        "t33-02",
        "evaluate --out over earlier results",
        EVAL + " --out {tmp}/e",
        BAD,
        [r"/e: already holds earlier evaluation results; pass --overwrite", r"kept until"],
        _nonempty("e"),
        absent=[r"queries evaluated"],
    ),
    Mistake(
        "t33-03",
        "diagnose --out over earlier diagnostics",
        "diagnose {ckpt} --store {stores}/test --out {tmp}/d",
        BAD,
        [r"/d: already holds earlier diagnostics; pass --overwrite"],
        _nonempty("d"),
    ),
    Mistake(
        "t33-04",
        "a head evaluated on the split it trained on",
        "evaluate --store {stores}/train --system cosine --system ckpt:{ckpt} --no-overlap "
        "--permutations 200",
        OK,
        [
            r"warning: train/test leak: ckpt:\S+ is evaluated on the very split it trained on "
            r"\(\S+train \(split train\)\): 5 of 5 evaluated query ids and 5 query texts are "
            r"training queries"
        ],
    ),
    Mistake(
        "t33-05",
        "a head evaluated on queries it trained on under another split name (by text)",
        EVAL + " --system ckpt:{tmp}/leaky",
        OK,
        [
            r"train/test leak: ckpt:\S+leaky is evaluated on a split whose queries overlap its "
            r"training queries \(/elsewhere/train \(split train\)\): 0 of 7 evaluated query ids "
            r"and 7 query texts"
        ],
        _text_leak_ckpt,
    ),
    Mistake(
        "t33-06",
        "--train-store of another collection",
        "evaluate --store {stores}/test --system cosine --train-store {bad} --permutations 200",
        BAD,
        [
            r"--train-store \S+validation shares no passage \(by id or text\) with the evaluated "
            r"split",
            r"--no-overlap",
        ],  # fmt: skip
        _other_collection,
    ),
    Mistake(
        "t33-07",
        "one MS MARCO file as both --split train and --split validation",
        f"embed {MSMARCO_FILE} --format msmarco --split train --split validation "
        "--out {tmp}/s --no-progress",
        BAD,
        [
            r"--split train and --split validation would read the same rows \(this file holds "
            r"one split\)"
        ],  # fmt: skip
        nothing_written="{tmp}/s",
    ),
    Mistake(
        "t33-08",
        "run --quick on a config without a quick: section",
        "run {tmp}/exp.yaml --quick",
        BAD,
        [r"exp\.yaml: --quick merges the file's quick: section, but it has none"],
        _experiment_without_quick,
        nothing_written="{tmp}/runs",
    ),
    Mistake(
        "t33-09",
        "embed --limit 0",
        "embed {data} --format beir --split test --limit 0 --out {tmp}/s --no-progress",
        BAD,
        [r"--limit must be at least 1 \(queries kept\), got 0"],
        nothing_written="{tmp}/s",
    ),
    Mistake(
        "t33-10",
        "evaluate --permutations 0",
        "evaluate --store {stores}/test --system cosine --no-overlap --permutations 0",
        BAD,
        [r"--permutations\) must be at least 1"],
    ),
    Mistake(
        "t33-11",
        "embed --model not available offline",
        "embed {data} --format beir --split test --model nosuch-org/nosuch-model --out {tmp}/s",
        BAD,
        [r"--model nosuch-org/nosuch-model: not available offline"],
        nothing_written="{tmp}/s",
    ),
    Mistake(
        "t33-12",
        "export --to db:http://... with no server",
        "export {stores}/test --to db:http://127.0.0.1:9:col --no-progress",
        BAD,
        [r"the Qdrant server at http://127\.0\.0\.1:9 cannot be reached"],
    ),
    Mistake(
        "t33-13",
        "export --head with a forest checkpoint into db:",
        "export {stores}/test --to db:{tmp}/qd:col --head ckpt:{tmp}/forest --no-progress",
        BAD,
        [r"a 'forest' model has no passage vectors to store"],
        _forest_ckpt,
        nothing_written="{tmp}/qd",
    ),
    Mistake(
        "t33-14",
        "export a head without the ckpt: prefix",
        "export {ckpt} --to sentence-transformers {tmp}/st",
        BAD,
        [
            r"lacks the ckpt: prefix: treerank export ckpt:\S+linear --to sentence-transformers "
            r"\S+/st"
        ],  # fmt: skip
        absent=[r"needs OUT"],
        nothing_written="{tmp}/st",
    ),
    Mistake(
        "t33-15",
        "ckpt: naming a run's models folder",
        EVAL + " --system ckpt:{tmp}/runs/models",
        BAD,
        [r"not a treerank checkpoint; checkpoints below it: ckpt:\S+models/mybeir/lin/checkpoint"],
        _run_folder,
    ),
    Mistake(
        "t33-16",
        'forest n_models: "16" (a string)',
        "train --model forest --store {stores} --config {bad} --out {tmp}/ck",
        BAD,
        [r"c\.yaml\.model\.n_models: expected an integer, got '16'"],
        _yaml({"model": {"n_models": "16"}}),
        nothing_written="{tmp}/ck",
    ),
    Mistake(
        "t33-17",
        "forest steps_passage: 30.5",
        "train --model forest --store {stores} --config {bad} --out {tmp}/ck",
        BAD,
        [r"c\.yaml\.trainer\.steps_passage: expected an integer, got 30\.5"],
        _yaml({"trainer": {"steps_passage": 30.5}}),
        nothing_written="{tmp}/ck",
    ),
    # --- new ones of our own
    Mistake(
        "t33-18",
        "a holdout that leaves one training query",
        TRAIN + " --config {bad} --out {tmp}/ck",
        BAD,
        [
            r"c\.yaml: validation: the holdout leaves 1 training query with a relevant passage "
            r"\(of 5; 4 held out\), fewer than 2: lower validation\.fraction"
        ],  # fmt: skip
        _yaml({"validation": {"fraction": 0.8}}),
        nothing_written="{tmp}/ck",
    ),
    Mistake(
        "t33-19",
        "train --out a non-empty folder of other files",
        TRAIN + " --out {tmp}/mine",
        BAD,
        [r"mine: already holds a model directory or other files; pass --overwrite"],
        _nonempty("mine"),
    ),
    Mistake(
        "t33-20",
        "train --overwrite replaces a checkpoint",
        TRAIN + " --config {configs}/heads/linear.yaml --out {tmp}/ck2 --overwrite",
        OK,
        [r"training queries\s*│?\s*4", r"positive pairs\s*│?\s*\d+", r"held-out queries\s*│?\s*1"],
        lambda e, t: shutil.copytree(e.ckpt, t / "ck2") and None,
    ),
    Mistake(
        "t33-21",
        "evaluate --overwrite into earlier results",
        EVAL + " --out {tmp}/e --overwrite",
        OK,
        [r"7 queries evaluated", r"left \S+mine\.txt alone|wrote"],
        _nonempty("e"),
    ),
    Mistake(
        "t33-22",
        "evaluate --permutations -5",
        "evaluate --store {stores}/test --system cosine --permutations -5",
        BAD,
        [r"must be at least 1 .*got -5"],
    ),
    Mistake(
        "t33-23",
        "embed --limit -1",
        "embed {data} --format beir --split test --limit -1 --out {tmp}/s",
        BAD,
        [r"--limit must be at least 1 \(queries kept\), got -1"],
        nothing_written="{tmp}/s",
    ),
    Mistake(
        "t33-24",
        "linear trainer.epochs: 2.5",
        TRAIN + " --config {bad} --out {tmp}/ck",
        BAD,
        [r"c\.yaml\.trainer\.epochs: expected an integer, got 2\.5"],
        _yaml({"trainer": {"epochs": 2.5}}),
        nothing_written="{tmp}/ck",
    ),
    Mistake(
        "t33-25",
        'linear data.batch_size: "64"',
        TRAIN + " --config {bad} --out {tmp}/ck",
        BAD,
        [r"c\.yaml\.data\.batch_size: expected an integer, got '64'"],
        _yaml({"data": {"batch_size": "64"}}),
    ),
    Mistake(
        "t33-26",
        "linear model.temperature: hot",
        TRAIN + " --config {bad} --out {tmp}/ck",
        BAD,
        [r"c\.yaml\.model\.temperature: expected a number, got 'hot'"],
        _yaml({"model": {"temperature": "hot"}}),
    ),
    Mistake(
        "t33-27",
        "forest model.hidden: [64, a]",
        "train --model forest --store {stores} --config {bad} --out {tmp}/ck",
        BAD,
        [r"c\.yaml\.model\.hidden: expected a list of integers, got \[64, 'a'\]"],
        _yaml({"model": {"hidden": [64, "a"]}}),
    ),
    Mistake(
        "t33-28",
        "forest data.bag_queries: most",
        "train --model forest --store {stores} --config {bad} --out {tmp}/ck",
        BAD,
        [r"c\.yaml\.data\.bag_queries: expected a number, got 'most'"],
        _yaml({"data": {"bag_queries": "most"}}),
    ),
    Mistake(
        "t33-29",
        "forest n_models: 0 (range, with its path)",
        "train --model forest --store {stores} --config {bad} --out {tmp}/ck",
        BAD,
        [r"c\.yaml.*n_models must be >= 1"],
        _yaml({"model": {"n_models": 0}}),
    ),
    Mistake(
        "t33-30",
        'validation.fraction: "0.2" (a string)',
        TRAIN + " --config {bad} --out {tmp}/ck",
        BAD,
        [r"c\.yaml\.validation\.fraction: expected a number, got '0\.2'"],
        _yaml({"validation": {"fraction": "0.2"}}),
    ),
    Mistake(
        "t33-31",
        "run --quick with an empty quick: section",
        "run {tmp}/exp.yaml --quick",
        BAD,
        [r"--quick merges the file's quick: section, but it has none"],
        _experiment(quick={}),
        nothing_written="{tmp}/runs",
    ),
    Mistake(
        "t33-32",
        "export a store path --to sentence-transformers without OUT",
        "export {stores}/test --to sentence-transformers",
        BAD,
        [r"lacks the ckpt: prefix: treerank export ckpt:\S+test --to sentence-transformers OUT"],
    ),
    Mistake(
        "t33-33",
        "ckpt: naming a run's model folder (its checkpoint/ inside): accepted",
        EVAL + " --system ckpt:{tmp}/runs/models/mybeir/lin",
        OK,
        [r"7 queries evaluated"],
        _run_folder,
    ),
    Mistake(
        "t33-35",
        "search -q '' (serve refuses it with 422)",
        ["search", "--store", "{stores}/test", "-q", ""],
        BAD,
        [r"--query 1 is empty; give a query text"],
    ),
    Mistake(
        "trial-52",
        "search with two --system options (only the last one was searched, without a word)",
        [
            "search",
            "--store",
            "{stores}/test",
            "-q",
            "coffee",
            "--system",
            "bm25",
            "--system",
            "cosine",
        ],
        BAD,
        [r"--system given 2 times \(bm25, cosine\); search ranks with one system"],
    ),
    Mistake(
        "t33-36",
        "a seen / unseen breakdown on another split than the model trained on",
        EVAL + " --system ckpt:{ckpt} --overlap --train-store {stores}/test",
        OK,
        [
            r"note: ckpt:\S+ trained on \S+train \(split train\), not on the training split "
            r"\S+test of this breakdown"
        ],  # fmt: skip
    ),
    Mistake(
        "t33-34",
        "ckpt: naming an empty folder",
        EVAL + " --system ckpt:{tmp}/empty",
        BAD,
        [r"empty/config\.json: missing \(not a treerank checkpoint\)"],
        lambda e, t: (t / "empty").mkdir() or t,
        absent=[r"below it"],
    ),
]


@pytest.mark.parametrize("m", MISTAKES, ids=[m.id for m in MISTAKES])
def test_mistake(m: Mistake, env: Env, tmp_path: Path) -> None:
    bad = m.setup(env, tmp_path) if m.setup else None
    if isinstance(m.args, list):  # an argument that white space cannot delimit (an empty one)
        args = [env.fmt(a, tmp_path, bad) for a in m.args]
    else:
        args = env.fmt(m.args, tmp_path, bad).split()
    code, out = invoke(args)
    if os.environ.get("TREERANK_MISTAKES_TABLE"):  # a JSON line per case, for the notes' table
        with open(os.environ["TREERANK_MISTAKES_TABLE"], "a", encoding="utf-8") as f:
            root = str(tmp_path)
            f.write(json.dumps({"id": m.id, "what": m.what, "code": code, "out": out.replace(
                root, "<tmp>").replace(str(env.root), "<session>")}) + "\n")  # fmt: skip
    assert code == m.code, out
    for pattern in m.message:
        assert re.search(pattern, out), (pattern, out)
    for pattern in m.absent:
        assert not re.search(pattern, out), (pattern, out)
    assert "Traceback" not in out
    if m.nothing_written:
        assert not Path(env.fmt(m.nothing_written, tmp_path)).exists()
    assert not list(tmp_path.rglob(".*.lock")), "a lock file was left behind"


# ------------------------------------------------------------- cases that need more than a call
def test_trial_23_ctrl_c_during_embed_exits_130(env: Env, tmp_path: Path, monkeypatch) -> None:
    import treerank.tasks.embed

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    # the library call behind `treerank embed` (it imports the name when it runs)
    monkeypatch.setattr(treerank.tasks.embed, "embed", interrupted)
    code, out = invoke(
        ["embed", str(env.data), "--format", "beir", "--split", "test", "--out", str(tmp_path)]
    )
    assert code == ExitCode.INTERRUPTED
    assert "interrupted: the partial store is marked incomplete; rerun the same command with " \
        "--resume to finish it" in out  # fmt: skip


HOLD = """
import sys, time
from treerank.lock import writer_lock
with writer_lock(sys.argv[1], "embed"):
    print("held", flush=True)
    time.sleep(60)
"""


def test_trial_25_two_writers_of_one_store(env: Env, tmp_path: Path) -> None:
    dest = tmp_path / "s_two" / "test"
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(dest)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
        code, out = invoke(
            ["embed", str(env.data), "--format", "beir", "--split", "test"]
            + ["--out", str(tmp_path / "s_two"), "--no-progress"]
        )
    finally:
        proc.kill()
        proc.wait()
    assert code == BAD
    assert re.search(
        rf"s_two/test: another treerank process is writing here: pid {proc.pid} \(embed\)", out
    ), out


def test_trial_tour_and_untrained_head_flagged(env: Env, tmp_path: Path) -> None:
    """Trial tour + problem 17: the linear head early-stopped at step 0 is flagged by train
    and by evaluate (console, table.md, results.json)."""
    assert "30 passages" in env.outputs["embed"]
    assert re.search(r"kept_initialisation\s*│?\s*True", env.outputs["train"])
    assert "is its untrained initialisation" in env.outputs["train"]
    out_dir = tmp_path / "eval"
    code, out = invoke(
        EVAL.format(stores=env.stores).split()
        + ["--system", "bm25", "--system", f"ckpt:{env.ckpt}", "--out", str(out_dir)]
    )
    assert code == OK, out
    assert f"warning: the saved model of ckpt:{env.ckpt} is its untrained initialisation" in out
    assert "untrained initialisation" in (out_dir / "table.md").read_text()
    doc = json.loads((out_dir / "results.json").read_text())
    assert doc["untrained"] == [f"ckpt:{env.ckpt}"]
    assert "exercises the format path" not in out
    assert not list(tmp_path.rglob(".*.lock"))  # a finished evaluate leaves no lock


def test_trial_serve_port_0_prints_the_bound_port(env: Env, monkeypatch) -> None:
    import treerank.serve.app as serve_app

    seen: dict[str, object] = {}

    def fake_serve(service, *, host, port, sock):  # type: ignore[no-untyped-def]
        seen.update(port=port, bound=sock.getsockname()[1])
        sock.close()

    monkeypatch.setattr(serve_app, "serve", fake_serve)
    code, out = invoke(["serve", "--store", str(env.stores / "test"), "--port", "0"])
    assert code == OK, out
    assert seen["port"] == seen["bound"] and seen["bound"] != 0
    assert f"on http://127.0.0.1:{seen['bound']}" in out and "127.0.0.1:0" not in out


def test_trial_38_api_split_as_format(env: Env) -> None:
    from treerank.readers import DataFormatError, read_split

    with pytest.raises(DataFormatError, match=r"unknown format 'test'; use one of"):
        read_split(env.data, "test")
    s = read_split(env.data, "beir", split="test")
    assert repr(s).startswith("RetrievalSplit(name='test', source='beir', n_queries=7")
    assert len(repr(s)) < 200  # problem 16: counts, not every text


def test_trial_28_to_30_http_mistakes(env: Env) -> None:
    from starlette.testclient import TestClient

    from treerank.serve.app import create_app
    from treerank.serve.service import SearchService, ServiceConfig

    service = SearchService(
        ServiceConfig(store=env.stores / "test", systems=("cosine",)),
        encoder=_encoder(__import__("treerank.encoders", fromlist=["x"]).SentenceEncoder),
    )
    client = TestClient(create_app(service))
    bad_json = client.post(
        "/search",
        content=b'{"query": "coffee", "k": 3',
        headers={"content-type": "application/json"},
    )
    assert bad_json.status_code == 422 and "JSON decode error" in bad_json.text
    for k in (-1, 0):
        r = client.post("/search", json={"query": "coffee", "k": k})
        assert r.status_code == 422 and "greater than or equal to 1" in r.text
    assert client.post("/search", json={"query": "coffee", "k": 5000}).status_code == 422
    r = client.post("/search", json={"query": "coffee", "system": "cosin"})
    assert r.status_code == 400 and "system 'cosin' is not served; served: cosine" in r.text
    assert client.post("/search", json={"query": ""}).status_code == 422
    for blank in ("", "  "):  # issue 36: was silently the default system
        r = client.post("/search", json={"query": "coffee", "system": blank})
        assert r.status_code == 422 and "'system' is empty" in r.text, r.text
    assert client.post("/search", json={"query": "x", "kk": 3}).status_code == 422
    assert client.post("/search", json={"k": 3}).status_code == 422
    info = client.get("/info").json()["store"]
    assert "signature" not in info and len(info["vectors_digest"]) == 64


def test_trial_36_search_empty_query_is_refused_like_serve(env: Env) -> None:
    # the HTTP API answers 422 for an empty query; the CLI ranked an empty text (issue 36)
    for args in (["-q", ""], ["-q", "coffee", "-q", "   "]):
        code, out = invoke(["search", "--store", str(env.stores / "test"), *args])
        n = len(args) // 2
        assert code == BAD, out
        assert f"error: --query {n} is empty; give a query text" in out, out
        assert "Traceback" not in out


def _full_disk(monkeypatch, name: str, after: int = 0) -> list[Path]:
    """Atomic writes of files called ``name``, from the ``after + 1``-th on, fail as on a full
    filesystem: half the bytes reach the temp file, then the write raises ``OSError(ENOSPC)``
    with no file name, as ``write(2)`` does. Returns the paths seen."""
    import treerank.atomic

    real = treerank.atomic._replace_via_temp
    seen: list[Path] = []

    def replace(path, write, *, suffix=".tmp"):  # type: ignore[no-untyped-def]
        if Path(path).name != name:
            return real(path, write, suffix=suffix)
        seen.append(Path(path))
        if len(seen) <= after:
            return real(path, write, suffix=suffix)

        def full(tmp: Path) -> None:
            write(tmp)
            tmp.write_bytes(tmp.read_bytes()[: tmp.stat().st_size // 2])
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        return real(path, full, suffix=suffix)

    monkeypatch.setattr(treerank.atomic, "_replace_via_temp", replace)
    return seen


def _one_error_line(out: str, path: Path, advice: str) -> None:
    want = f"error: {path}: no space left on the device (No space left on device); {advice}"
    assert want in out, out
    assert out.count("error:") == 1 and "Traceback" not in out and "Errno" not in out, out


EMBED_ARGS = ["--format", "beir", "--split", "test", "--no-progress"]
EMBED_ADVICE = "the store is left marked incomplete; free space, then rerun with --resume"


@pytest.mark.parametrize("where", ["meta.json", "progress.json", "fallocate"])
def test_issue36_full_disk_during_embed_exits_3_and_resumes(
    env: Env, tmp_path: Path, monkeypatch, where: str
) -> None:
    from treerank.store import EmbeddingStore, StoreFormatError

    fresh, out = tmp_path / "fresh", tmp_path / "out"
    code, log = invoke(["embed", str(env.data), *EMBED_ARGS, "--out", str(fresh)])
    assert code == OK, log
    with monkeypatch.context() as mp:
        if where == "fallocate":  # the vector files are reserved before any encoding
            import treerank.store.embed as embed_mod

            def no_space(fd: int, offset: int, length: int) -> None:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

            mp.setattr(embed_mod.os, "posix_fallocate", no_space)
            failed_file = out / "test" / "queries.bin"
        else:  # progress.json: its 2nd write (a checkpoint); meta.json: the last write
            _full_disk(mp, where, after=1 if where == "progress.json" else 0)
            failed_file = out / "test" / where
        code, log = invoke(["embed", str(env.data), *EMBED_ARGS, "--out", str(out)])
    assert code == ExitCode.DISK_FULL, log
    _one_error_line(log, failed_file, EMBED_ADVICE)
    with pytest.raises((StoreFormatError, FileNotFoundError)):  # nothing looks complete
        EmbeddingStore.open(out / "test")
    assert not list(out.rglob(".*.tmp")), "a temp file was left behind"
    code, log = invoke(["embed", str(env.data), *EMBED_ARGS, "--out", str(out), "--resume"])
    assert code == OK, log
    for f in ("queries.bin", "passages.bin", "passages.jsonl"):  # as an uninterrupted run
        assert (out / "test" / f).read_bytes() == (fresh / "test" / f).read_bytes(), f


def test_issue36_full_disk_during_evaluate_exits_3_keeping_the_earlier_result(
    env: Env, tmp_path: Path, monkeypatch
) -> None:
    args = ["evaluate", "--store", str(env.stores / "test"), "--system", "cosine"]
    args += ["--no-overlap", "--permutations", "200", "--out", str(tmp_path / "ev")]
    code, log = invoke(args)
    assert code == OK, log
    before = (tmp_path / "ev" / "results.json").read_bytes()
    with monkeypatch.context() as mp:
        seen = _full_disk(mp, "results.json")
        code, log = invoke([*args, "--system", "bm25", "--overwrite"])
    assert seen and code == ExitCode.DISK_FULL, log
    _one_error_line(
        log,
        tmp_path / "ev" / "results.json",
        "files written before keep their earlier version; free space, then rerun",
    )
    assert (tmp_path / "ev" / "results.json").read_bytes() == before  # the earlier one survives
    assert not list((tmp_path / "ev").rglob(".*.tmp")), "a temp file was left behind"
    assert not list((tmp_path / "ev").rglob(".*.lock")), "the lock was left behind"


def test_issue36_full_disk_inside_a_system_stops_evaluate_with_exit_3(
    env: Env, tmp_path: Path, monkeypatch
) -> None:
    # a machine fault, not one system's failure: not recorded as "system failed" (exit 1)
    store = tmp_path / "store"
    shutil.copytree(env.stores / "test", store)
    args = ["evaluate", "--store", str(store), "--system", "cosine", "--system", "faiss:flat"]
    args += ["--no-overlap", "--permutations", "200", "--out", str(tmp_path / "ev")]
    with monkeypatch.context() as mp:
        seen = _full_disk(mp, "meta.json")  # the FAISS index cache's meta.json
        code, log = invoke(args)
    assert len(seen) == 1 and seen[0].parent.parent == store / "indexes", seen
    assert code == ExitCode.DISK_FULL, log
    assert "failed" not in log
    _one_error_line(
        log, seen[0], "files written before keep their earlier version; free space, then rerun"
    )
    assert not list((store / "indexes").glob("flat-*")), "a half-written index was left"


def test_every_mistake_id_is_unique() -> None:
    ids = [m.id for m in MISTAKES]
    assert len(ids) == len(set(ids))
    assert sum(i.startswith("new-") for i in ids) >= 10


def test_compare_systems_refuses_a_string_of_systems(env: Env) -> None:
    from treerank import compare_systems
    from treerank.store import EmbeddingStore

    with pytest.raises(
        TypeError, match=r"not str 'cosine'; e\.g\. compare_systems\(store, \['cosine'\]\)"
    ):
        compare_systems(EmbeddingStore.open(env.stores / "test"), "cosine")  # type: ignore[arg-type]


def test_leak_is_flagged_in_results_and_table(env: Env, tmp_path: Path) -> None:
    out_dir = tmp_path / "eval"
    code, out = invoke(
        ["evaluate", "--store", str(env.stores / "train"), "--system", "cosine"]
        + ["--system", f"ckpt:{env.ckpt}", "--permutations", "200", "--out", str(out_dir)]
    )
    assert code == OK, out
    doc = json.loads((out_dir / "results.json").read_text())
    leak = doc["leaks"][f"ckpt:{env.ckpt}"]
    assert leak["same_split"] is True and leak["queries_by_id"] == 5 == leak["n_queries"]
    assert doc["trained_on"][f"ckpt:{env.ckpt}"]["split"] == "train"
    assert "train/test leak" in (out_dir / "table.md").read_text()
    # on the test split: no leak, and the seen / unseen breakdown names where it trained
    code, out = invoke(
        ["evaluate", "--store", str(env.stores / "test"), "--system", "cosine"]
        + ["--system", f"ckpt:{env.ckpt}", "--permutations", "200", "--out", str(tmp_path / "t")]
    )
    assert code == OK, out
    assert "train/test leak" not in out
    assert json.loads((tmp_path / "t" / "results.json").read_text())["leaks"] == {}


def test_train_summary_accounts_for_the_training_set(env: Env) -> None:
    doc = json.loads((env.ckpt / "config.json").read_text())["extra"]
    s = doc["training"]
    assert (s["training_queries"], s["heldout_queries"], s["split_groups"]) == (4, 1, 0)
    assert s["positive_pairs"] >= s["training_queries"]
    prov = doc["train_provenance"]
    assert prov["split"] == "train" and prov["n_queries"] == 5
    assert len(prov["query_id_hashes"]) == 5 * 16 and len(prov["query_text_hashes"]) == 5 * 16
    assert re.search(r"training queries\s*│?\s*4", env.outputs["train"])


def test_train_overwrite_keeps_nothing_stale(env: Env, tmp_path: Path) -> None:
    """--overwrite replaces the checkpoint atomically: the old weights stay until the new ones
    are written, and the new directory is a complete checkpoint."""
    ck = tmp_path / "ck"
    shutil.copytree(env.ckpt, ck)
    before = (ck / "weights.safetensors").stat().st_mtime_ns
    code, out = invoke(
        ["train", "--model", "linear", "--store", str(env.stores), "--seed", "1"]
        + ["--out", str(ck), "--overwrite", "--no-progress"]
    )
    assert code == OK, out
    assert (ck / "weights.safetensors").stat().st_mtime_ns != before
    assert json.loads((ck / "config.json").read_text())["extra"]["training"]["config"]["seed"] == 1
