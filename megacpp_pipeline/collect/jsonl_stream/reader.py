"""Reading JSONL records: decides, line by line, whether a line is a valid
`{path, content[, license, revision]}` record or a reject naming its line and first bad field.
The converter and the `jsonl` collector both read through this module.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

import pyarrow as pa
from pydantic import BaseModel, ConfigDict

JSONL_SCHEMA_VERSION = "1"

JSONL_RECORDS = pa.schema(
    [
        pa.field("path", pa.string(), nullable=False),
        pa.field("content", pa.string(), nullable=False),
        pa.field("license", pa.string()),  # SPDX expression as the record declared it
        pa.field("revision", pa.string()),
        pa.field("line_no", pa.int64(), nullable=False),  # 1-based line in the input file
    ],
    metadata={"megacpp.table": "jsonl_records", "megacpp.schema_version": JSONL_SCHEMA_VERSION},
)

# Field checks in the order they are reported: a line is rejected for its first bad field.
_REQUIRED_FIELDS = ("path", "content")
_OPTIONAL_FIELDS = ("license", "revision")


class RecordReject(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    line_no: int
    byte_offset: int  # where the line starts in the input
    field: str  # a record field, or "<json>" / "<record>" / "<line>" for the line itself
    reason: str
    # the record's `path` where it was a non-empty string: a record rejected for another
    # field is still named by the file it meant
    path: str | None = None

    def describe(self, input_path: Path | str) -> str:
        return f"{input_path}:{self.line_no}: field '{self.field}': {self.reason}"


def parse_line(line: bytes, line_no: int, offset: int) -> dict[str, object] | RecordReject:
    """One JSONL line -> a normalized record, or the reject naming the first bad field."""
    try:
        obj = json.loads(line)
    except RecursionError:
        return RecordReject(
            line_no=line_no,
            byte_offset=offset,
            field="<json>",
            reason="nested deeper than the JSON reader can follow",
        )
    except UnicodeDecodeError as exc:
        return RecordReject(
            line_no=line_no, byte_offset=offset, field="<json>", reason=f"not UTF-8: {exc.reason}"
        )
    except ValueError as exc:
        return RecordReject(
            line_no=line_no, byte_offset=offset, field="<json>", reason=f"not valid JSON: {exc}"
        )
    if not isinstance(obj, dict):
        return RecordReject(
            line_no=line_no,
            byte_offset=offset,
            field="<record>",
            reason=f"a JSON object expected, got {type(obj).__name__}",
        )
    record: dict[str, object] = {}
    meant = obj.get("path")
    path = meant if isinstance(meant, str) and meant and _encodable(meant) else None
    for name in (*_REQUIRED_FIELDS, *_OPTIONAL_FIELDS):
        value = obj.get(name)
        if value is None:
            if name in _REQUIRED_FIELDS:
                reason = "missing" if name not in obj else "null, a string expected"
                return RecordReject(
                    line_no=line_no, byte_offset=offset, field=name, reason=reason, path=path
                )
            record[name] = None
            continue
        if not isinstance(value, str):
            return RecordReject(
                line_no=line_no,
                byte_offset=offset,
                field=name,
                reason=f"a string expected, got {type(value).__name__}",
                path=path,
            )
        if name == "path" and not value:
            return RecordReject(line_no=line_no, byte_offset=offset, field=name, reason="empty")
        if not _encodable(value):
            return RecordReject(
                line_no=line_no,
                byte_offset=offset,
                field=name,
                reason="holds a lone UTF-16 surrogate (escaped or raw), not encodable as UTF-8",
                path=path,
            )
        record[name] = value
    record["line_no"] = line_no
    return record


def _encodable(value: str) -> bool:
    """Whether UTF-8 (and Arrow) can hold `value`: a JSON \\uD800-style escape (or its raw
    bytes, which json decodes with surrogatepass) gives a lone surrogate that it cannot.
    isascii() is O(1) in CPython, so only non-ASCII text pays for the check."""
    if value.isascii():
        return True
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


# What a compressed file starts with: JSONL read as text would be nothing but rejected lines
_MAGIC = (
    (b"\x1f\x8b", "gzip"),
    (b"\x28\xb5\x2f\xfd", "zstd"),
    (b"\xfd7zXZ\x00", "xz"),
    (b"BZh", "bzip2"),
)
MAGIC_BYTES = max(len(magic) for magic, _ in _MAGIC)


def compressed_format(head: bytes) -> str | None:
    """The compression a file starting with `head` is in (gzip, zstd, xz, bzip2), if any."""
    return next((name for magic, name in _MAGIC if head.startswith(magic)), None)


def compression_problem(path: Path, head: bytes) -> str | None:
    """Why `path` (starting with `head`) cannot be read as JSONL text, when it is compressed."""
    kind = compressed_format(head)
    if kind is None:
        return None
    return (
        f"{path}: is {kind}-compressed, not JSONL text; decompress it first "
        "(records are located by byte offset, which a compressed stream does not have)"
    )


def torn_tail_reject(line_no: int, offset: int, size: int) -> RecordReject:
    return RecordReject(
        line_no=line_no,
        byte_offset=offset,
        field="<line>",
        reason=f"unterminated last line ({size} bytes, no newline yet) was not ingested",
    )


def iter_records(path: Path, rejects: list[RecordReject] | None = None) -> Iterator[dict]:
    """Read a finished JSONL file once (no following). Yields records shaped like
    JSONL_RECORDS rows; bad lines, and an unterminated last line, go to `rejects`."""
    for record, _, _ in iter_located_records(path, rejects):
        yield record


def iter_located_records(
    path: Path,
    rejects: list[RecordReject] | None = None,
    max_line_bytes: int | None = None,
    *,
    at_rest: bool = False,
) -> Iterator[tuple[dict, int, int]]:
    """iter_records, each record with its line's byte offset and length (record_at reads
    it again from there). A line longer than `max_line_bytes` (its newline not counted) is
    rejected unread: memory holds at most that much of one line (a file of a single 10 GB
    line is not read whole). A last line without a newline is a record still being written
    and rejected, unless the file is `at_rest` (a pinned export, which may simply not end in
    a newline): then it is read like any other."""
    line_no = 0
    offset = 0
    limit = -1 if max_line_bytes is None else max_line_bytes + 1
    with open(path, "rb") as f:
        while line := f.readline(limit):
            line_no += 1
            start = offset
            offset += len(line)
            complete = line.endswith(b"\n")
            if max_line_bytes is not None and len(line) > max_line_bytes and not complete:
                skipped, newline = _skip_line(f)
                offset += skipped
                if rejects is not None:
                    size = offset - start - newline  # the line's bytes, its newline not counted
                    rejects.append(_long_line_reject(line_no, start, size, max_line_bytes))
                continue
            if not complete and not at_rest:
                if rejects is not None:
                    rejects.append(torn_tail_reject(line_no, start, len(line)))
                break
            if not line.strip():
                continue
            parsed = parse_line(line, line_no, start)
            if isinstance(parsed, RecordReject):
                if rejects is not None:
                    rejects.append(parsed)
            else:
                yield parsed, start, len(line)


def _skip_line(f: BinaryIO) -> tuple[int, bool]:
    """(bytes up to and through the next newline or the end, read a block at a time;
    whether a newline ended them)."""
    skipped = 0
    while block := f.readline(1 << 20):
        skipped += len(block)
        if block.endswith(b"\n"):
            return skipped, True
    return skipped, False


def _long_line_reject(line_no: int, offset: int, size: int, limit: int) -> RecordReject:
    return RecordReject(
        line_no=line_no,
        byte_offset=offset,
        field="<line>",
        reason=f"line of {size} bytes is longer than the {limit} a record may take; not read",
    )


def record_at(f: BinaryIO, offset: int, size: int, line_no: int) -> dict:
    """The record iter_located_records found at `offset` of the open file `f`."""
    f.seek(offset)
    parsed = parse_line(f.read(size), line_no, offset)
    if isinstance(parsed, RecordReject):  # the file changed under the reader
        raise ValueError(f"line {line_no}: no longer the record read before ({parsed.reason})")
    return parsed
