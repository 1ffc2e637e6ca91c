"""`DataFormatError`: bad input data, with the file and row it was found in; and the text-reading
helpers (UTF-8 decoding, line splitting, JSON Lines) that raise it."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any


class DataFormatError(ValueError):
    """Raised by every reader on bad input: missing file, wrong schema, empty text, bad bytes.

    The message always names the file and, where one applies, the row (1-based line number for
    text files, 0-based row index for parquet/JSON lists).

    Attributes:
        path: the offending file (or directory).
        row: the offending row, or ``None`` when the problem is not tied to a row.
    """

    def __init__(self, path: str | Path, problem: str, row: int | str | None = None) -> None:
        self.path = Path(path)
        self.row = row
        self.problem = problem
        where = f"{self.path}" if row is None else f"{self.path}, row {row}"
        super().__init__(f"{where}: {problem}")


def require_file(path: str | Path) -> Path:
    """Return ``path`` as a `Path` if it is an existing file.

    Raises:
        DataFormatError: when it does not exist or is not a regular file.
    """
    p = Path(path)
    if not p.exists():
        raise DataFormatError(p, "file not found")
    if not p.is_file():
        raise DataFormatError(p, "not a regular file")
    return p


def read_text_lines(path: str | Path) -> list[str]:
    """Read a UTF-8 text file (``.gz`` transparently) into lines without their line endings.

    Raises:
        DataFormatError: missing file, or bytes that are not valid UTF-8 (names the line).
    """
    import gzip

    p = require_file(path)
    raw = gzip.open(p, "rb").read() if p.suffix == ".gz" else p.read_bytes()
    return split_lines(decode_utf8(raw, p))


def split_lines(text: str) -> list[str]:
    """Lines of ``text`` split on ``\\n`` (a trailing ``\\r`` dropped), nothing else.

    ``str.splitlines()`` would also break on U+0085, U+2028, form feeds, ... which real passage
    text contains (MS MARCO / DL19 mojibake), silently splitting one row into two.
    """
    lines = [line[:-1] if line.endswith("\r") else line for line in text.split("\n")]
    if lines and lines[-1] == "":
        lines.pop()
    return lines


def decode_utf8(raw: bytes, path: str | Path, *, first_line: int = 1, first_byte: int = 0) -> str:
    """Decode ``raw`` as UTF-8 (a leading BOM is dropped).

    Args:
        raw: the bytes: a whole file, or one piece of it (a line read from a stream).
        path: the file, for the message.
        first_line: the 1-based line number of ``raw``'s first byte in the file (a reader that
            decodes line by line passes that line's number).
        first_byte: the 0-based file offset of ``raw``'s first byte.

    Raises:
        DataFormatError: naming the 1-based line of the first invalid byte in the file and its
            byte offset in the file.
    """
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = first_line + raw[: exc.start].count(b"\n")
        raise DataFormatError(
            path,
            f"invalid UTF-8 byte 0x{raw[exc.start]:02x} at byte {first_byte + exc.start} "
            "of the file",
            row=line,
        ) from None
    return text[1:] if text.startswith("\ufeff") else text


def iter_raw_lines(f: IO[bytes]) -> Iterator[tuple[int, int, bytes]]:
    """Yield ``(1-based line number, 0-based byte offset, raw line)`` from a binary stream.

    Lines end at ``b"\n"`` only (the ending kept), as ``for raw in f`` gives them.
    """
    offset = 0
    for line_no, raw in enumerate(f, start=1):
        yield line_no, offset, raw
        offset += len(raw)


def iter_jsonl(
    path: str | Path, required: tuple[str, ...], stream: IO[bytes] | None = None
) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield ``(1-based line, object)`` from a JSON Lines file.

    Args:
        path: the file; with ``stream``, only the name used in error messages (e.g. a zip
            member written ``archive.zip/member``).
        required: keys every object must have.
        stream: an open binary stream to read instead of opening ``path`` (a zip member).

    Raises:
        DataFormatError: missing file, bad UTF-8, invalid JSON, or a missing required key.
    """
    p = Path(path) if stream is not None else require_file(path)
    with open(p, "rb") if stream is None else stream as f:
        for line_no, offset, raw in iter_raw_lines(f):
            line = decode_utf8(raw, p, first_line=line_no, first_byte=offset)
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DataFormatError(
                    p,
                    f"invalid JSON ({exc.msg.removesuffix(' at')} at column {exc.colno})",
                    row=line_no,
                ) from None
            except RecursionError:
                raise DataFormatError(p, "invalid JSON (nested too deeply)", row=line_no) from None
            if not isinstance(rec, dict):
                raise DataFormatError(p, "expected a JSON object", row=line_no)
            missing = [k for k in required if k not in rec]
            if missing:
                raise DataFormatError(p, f"missing key(s) {missing}", row=line_no)
            yield line_no, rec


def check_id(value: str, path: str | Path, row: int | str | None, what: str) -> str:
    """Return ``value`` if it is a usable source id: non-empty, no white space.

    TREC run and qrels files separate their columns by white space, so an id holding a space or
    tab could not be written back unambiguously (``"doc 1"`` would read as two columns).

    Raises:
        DataFormatError: an empty id or one containing white space (names file, row and id).
    """
    if not value or any(c.isspace() for c in value):
        raise DataFormatError(
            path,
            f"{what} id {value!r} is empty or contains white space; TREC run and qrels files "
            "could not hold it unambiguously",
            row,
        )
    return value


class UniqueIds:
    """Rejects a repeated id within one table, naming both rows.

    Args:
        path: the file the ids come from.
        what: what the ids name (``"query"``, ``"passage"``), for the message.
    """

    def __init__(self, path: str | Path, what: str) -> None:
        self.path = Path(path)
        self.what = what
        self._first: dict[str, int | str] = {}

    def add(self, value: str, row: int | str) -> None:
        """Record ``value`` seen at ``row``.

        Raises:
            DataFormatError: ``value`` was seen before (message names both rows).
        """
        first = self._first.setdefault(value, row)
        if first != row:
            raise DataFormatError(
                self.path,
                f"{self.what} id {value!r} repeated (rows {first} and {row}); ids must be unique",
                row,
            )
