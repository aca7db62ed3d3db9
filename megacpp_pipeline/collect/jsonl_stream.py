"""Streaming JSONL -> bounded parquet shards (seed: protobuf-2gb-wall-and-shards, the
streaming converter): tail a JSONL file that may still be growing, consume only complete
lines, promote each validated shard with *.tmp + os.replace, write `_COMPLETE` last.

Resume rule: the state file is the truth. It is rewritten atomically only after a shard has
been promoted, and records the byte offset just past the last line in that shard. On
restart every artifact the state does not list (a shard promoted but not yet recorded, stale
*.tmp, a half-written manifest) is deleted, and reading restarts at the recorded offset.
Because shard boundaries are a pure function of the input bytes and the config, the rewrite
is byte-identical to what an uninterrupted run writes.

Output directory:
    train/part-00000.parquet ...    JSONL_RECORDS rows, rows_per_file each (the last fewer)
    validation/part-00000.parquet   the last `validation_rows` records of the stream, if asked
    rejects.jsonl                   one line per rejected input line: line_no, field, reason
    _state.json                     resume state (small; rewritten atomically)
    manifest.json                   shards with sha256 / rows / bytes / line range
    _COMPLETE                       written last; holds the manifest's sha256
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import io
import json
import os
import signal
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from megacpp_pipeline.storage.versions import COMPLETE, MANIFEST, complete_marker, sha256_file

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

STATE_FILE = "_state.json"
MANIFEST_FILE = MANIFEST
COMPLETE_FILE = COMPLETE
REJECTS_FILE = "rejects.jsonl"
LOCK_FILE = "_lock"
TRAIN_DIR = "train"
VALIDATION_DIR = "validation"

# Field checks in the order they are reported: a line is rejected for its first bad field.
_REQUIRED_FIELDS = ("path", "content")
_OPTIONAL_FIELDS = ("license", "revision")

# Test-only fault injection: MEGACPP_JSONL_CRASH_AT="after_promote:2" SIGKILLs this process
# the 2nd time it passes that point, so resume can be tested at exact crash points.
_CRASH_ENV = "MEGACPP_JSONL_CRASH_AT"


class JsonlConverterConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    rows_per_file: int = Field(default=10_000, ge=1)  # bounds memory and shard size
    follow: bool = False  # keep tailing until the input stops growing
    idle_timeout_s: float = Field(default=60.0, gt=0)  # no growth this long => end of stream
    poll_interval_s: float = Field(default=0.5, gt=0)
    # The last N records of the stream become the validation shard. A tail hold-out (rather
    # than a random fraction) keeps resume a single byte offset: held-back rows are simply
    # re-read after a restart.
    validation_rows: int = Field(default=0, ge=0)
    read_chunk_bytes: int = Field(default=4 << 20, ge=1)
    compression: Literal["zstd", "snappy", "none"] = "zstd"

    @model_validator(mode="after")
    def _poll_within_idle(self) -> JsonlConverterConfig:
        if self.poll_interval_s > self.idle_timeout_s:
            raise ValueError("poll_interval_s must not exceed idle_timeout_s")
        return self


class RecordReject(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    line_no: int
    byte_offset: int  # where the line starts in the input
    field: str  # a record field, or "<json>" / "<record>" / "<line>" for the line itself
    reason: str

    def describe(self, input_path: Path | str) -> str:
        return f"{input_path}:{self.line_no}: field '{self.field}': {self.reason}"


class ShardEntry(BaseModel):
    model_config = ConfigDict(extra="forbid")

    file: str  # relative to the output directory
    rows: int
    bytes: int
    sha256: str
    first_line: int
    last_line: int
    start_offset: int  # input byte range whose records this shard holds
    end_offset: int


class _State(BaseModel):
    model_config = ConfigDict(extra="forbid")

    schema_version: str = JSONL_SCHEMA_VERSION
    input: str
    rows_per_file: int
    validation_rows: int
    compression: str
    offset: int = 0  # input bytes fully ingested (always at a line boundary)
    next_line_no: int = 1
    tail_sha256: str = ""  # sha256 of the last <= 4 KiB before `offset`: same input on resume?
    rejects: int = 0
    rejects_bytes: int = 0  # rejects.jsonl is truncated to this on resume
    train: list[ShardEntry] = Field(default_factory=list)
    validation: list[ShardEntry] = Field(default_factory=list)
    finalized: bool = False  # every shard written; only manifest + _COMPLETE may be missing
    torn_tail_bytes: int = 0
    input_bytes_at_end: int = 0


class JsonlManifest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    schema_version: str = JSONL_SCHEMA_VERSION
    table: str = "jsonl_records"
    input: str
    consumed_bytes: int
    rows: int
    train_rows: int
    validation_rows: int
    rejects: int
    torn_tail_bytes: int
    rows_per_file: int
    train: list[ShardEntry]
    validation: list[ShardEntry]
    rejects_file: str
    rejects_sha256: str


class ConversionReport(BaseModel):
    model_config = ConfigDict(extra="forbid")

    out_dir: Path
    input_path: Path
    rows: int
    train_shards: int
    train_rows: int
    validation_shards: int
    validation_rows: int
    rejects: int
    first_rejects: list[RecordReject]  # up to 20, for a human; all of them are in rejects.jsonl
    torn_tail_bytes: int  # an unterminated last line that was not ingested
    consumed_bytes: int
    resumed_from_offset: int
    already_complete: bool


class JsonlIngestError(Exception):
    """A conversion that cannot go on; str() is one line naming the file and the rule."""


class InputMissingError(JsonlIngestError):
    pass


class InputChangedError(JsonlIngestError):
    """The input no longer matches what the state file says was ingested."""


class ResumeConfigMismatchError(JsonlIngestError):
    pass


class ShardValidationError(JsonlIngestError):
    pass


class OutputLockedError(JsonlIngestError):
    pass


class ShardTooLargeError(JsonlIngestError):
    pass


# --------------------------------------------------------------------------- parsing


def _parse_line(line: bytes, line_no: int, offset: int) -> dict[str, object] | RecordReject:
    """One JSONL line -> a normalized record, or the reject naming the first bad field."""
    try:
        obj = json.loads(line)
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
    for name in (*_REQUIRED_FIELDS, *_OPTIONAL_FIELDS):
        value = obj.get(name)
        if value is None:
            if name in _REQUIRED_FIELDS:
                reason = "missing" if name not in obj else "null, a string expected"
                return RecordReject(line_no=line_no, byte_offset=offset, field=name, reason=reason)
            record[name] = None
            continue
        if not isinstance(value, str):
            return RecordReject(
                line_no=line_no,
                byte_offset=offset,
                field=name,
                reason=f"a string expected, got {type(value).__name__}",
            )
        if name == "path" and not value:
            return RecordReject(line_no=line_no, byte_offset=offset, field=name, reason="empty")
        # A JSON \uD800-style escape decodes to a lone surrogate that UTF-8 (and Arrow)
        # cannot hold. isascii() is O(1) in CPython, so only non-ASCII text pays for the check.
        if not value.isascii():
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                return RecordReject(
                    line_no=line_no,
                    byte_offset=offset,
                    field=name,
                    reason="holds a lone UTF-16 surrogate escape, not encodable as UTF-8",
                )
        record[name] = value
    record["line_no"] = line_no
    return record


def _torn_tail_reject(line_no: int, offset: int, size: int) -> RecordReject:
    return RecordReject(
        line_no=line_no,
        byte_offset=offset,
        field="<line>",
        reason=f"unterminated last line ({size} bytes, no newline yet) was not ingested",
    )


def iter_records(path: Path, rejects: list[RecordReject] | None = None) -> Iterator[dict]:
    """Read a finished JSONL file once (no following). Yields records shaped like
    JSONL_RECORDS rows; bad lines, and an unterminated last line, go to `rejects`."""
    line_no = 0
    offset = 0
    with open(path, "rb") as f:
        for line in f:
            line_no += 1
            start = offset
            offset += len(line)
            if not line.endswith(b"\n"):
                if rejects is not None:
                    rejects.append(_torn_tail_reject(line_no, start, len(line)))
                break
            if not line.strip():
                continue
            parsed = _parse_line(line, line_no, start)
            if isinstance(parsed, RecordReject):
                if rejects is not None:
                    rejects.append(parsed)
            else:
                yield parsed


# --------------------------------------------------------------------------- durable files


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def _crash_point(name: str) -> None:
    spec = os.environ.get(_CRASH_ENV)
    if not spec:
        return
    point, _, nth = spec.partition(":")
    if point != name:
        return
    remaining = int(nth or "1") - 1
    os.environ[_CRASH_ENV] = f"{point}:{remaining}" if remaining > 0 else ""
    if remaining <= 0:
        os.kill(os.getpid(), signal.SIGKILL)


# --------------------------------------------------------------------------- the converter


def _string_array(values: list[str] | list[str | None]) -> pa.Array:
    """Arrow strings straight from buffers. pa.array(list) would do, but it probes for pandas,
    and importing pandas adds ~0.7 s to every converter (re)start; this is also faster."""
    encoded = [b"" if v is None else v.encode("utf-8") for v in values]
    offsets = np.zeros(len(encoded) + 1, dtype=np.int64)
    np.cumsum(np.fromiter(map(len, encoded), np.int64, len(encoded)), out=offsets[1:])
    valid = np.fromiter((v is not None for v in values), bool, len(values))
    nulls = len(values) - int(valid.sum())
    bitmap = pa.py_buffer(np.packbits(valid, bitorder="little")) if nulls else None
    data = pa.py_buffer(b"".join(encoded))
    large = pa.Array.from_buffers(
        pa.large_string(), len(values), [bitmap, pa.py_buffer(offsets), data], null_count=nulls
    )
    try:
        return large.cast(pa.string())
    except pa.ArrowInvalid as exc:  # 32-bit offsets: one column of one shard must stay < 2 GiB
        raise ShardTooLargeError(
            f"one shard's strings exceed 2 GiB ({offsets[-1]} bytes): lower rows_per_file"
        ) from exc


@dataclass
class _Buffer:
    """Parsed rows not yet in a promoted shard, in input order, with the input byte offset
    just past each row's line (the resume offset if that row ends a shard)."""

    path: list[str] = field(default_factory=list)
    content: list[str] = field(default_factory=list)
    license: list[str | None] = field(default_factory=list)
    revision: list[str | None] = field(default_factory=list)
    line_no: list[int] = field(default_factory=list)
    end_offset: list[int] = field(default_factory=list)
    rejects: list[RecordReject] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.line_no)

    def add(self, record: dict, end: int) -> None:
        self.path.append(record["path"])
        self.content.append(record["content"])
        self.license.append(record["license"])
        self.revision.append(record["revision"])
        self.line_no.append(record["line_no"])
        self.end_offset.append(end)

    def take(self, n: int) -> tuple[pa.Table, int]:
        """Remove the first n rows; returns them as a table and the offset past the last."""
        line_no = np.asarray(self.line_no[:n], dtype=np.int64)
        table = pa.Table.from_arrays(
            [
                _string_array(self.path[:n]),
                _string_array(self.content[:n]),
                _string_array(self.license[:n]),
                _string_array(self.revision[:n]),
                pa.Array.from_buffers(pa.int64(), n, [None, pa.py_buffer(line_no)]),
            ],
            schema=JSONL_RECORDS,
        )
        end = self.end_offset[n - 1]
        for column in (
            self.path,
            self.content,
            self.license,
            self.revision,
            self.line_no,
            self.end_offset,
        ):
            del column[:n]
        return table, end

    def take_rejects_before(self, offset: int) -> list[RecordReject]:
        cut = 0
        while cut < len(self.rejects) and self.rejects[cut].byte_offset < offset:
            cut += 1
        taken, self.rejects = self.rejects[:cut], self.rejects[cut:]
        return taken


class _Converter:
    def __init__(self, input_path: Path, out_dir: Path, config: JsonlConverterConfig) -> None:
        self.input_path = input_path
        self.out = out_dir
        self.config = config
        self.buffer = _Buffer()
        self.state = _State(
            input=str(input_path.resolve()),
            rows_per_file=config.rows_per_file,
            validation_rows=config.validation_rows,
            compression=config.compression,
        )

    # ---- startup / resume

    def load_state(self) -> None:
        state_path = self.out / STATE_FILE
        if state_path.exists():
            try:
                saved = _State.model_validate_json(state_path.read_bytes())
            except ValidationError as exc:
                raise JsonlIngestError(f"{state_path}: unreadable resume state: {exc}") from exc
            for name in ("rows_per_file", "validation_rows", "compression"):
                if getattr(saved, name) != getattr(self.state, name):
                    raise ResumeConfigMismatchError(
                        f"{state_path}: resuming with {name}={getattr(self.state, name)} but the "
                        f"shards so far were written with {name}={getattr(saved, name)}"
                    )
            self.state = saved
        self._remove_unlisted_artifacts()

    def _remove_unlisted_artifacts(self) -> None:
        """Everything the state file does not vouch for is from a killed run: delete it,
        the deterministic rewrite recreates it."""
        listed = {e.file for e in (*self.state.train, *self.state.validation)}
        for sub in (TRAIN_DIR, VALIDATION_DIR):
            directory = self.out / sub
            directory.mkdir(parents=True, exist_ok=True)
            for p in directory.iterdir():
                if f"{sub}/{p.name}" not in listed:
                    p.unlink()
        for p in self.out.glob("*.tmp"):
            p.unlink()
        if not self.state.finalized:
            for name in (MANIFEST_FILE, COMPLETE_FILE):
                (self.out / name).unlink(missing_ok=True)
        rejects = self.out / REJECTS_FILE
        if rejects.exists():
            with open(rejects, "r+b") as f:
                f.truncate(self.state.rejects_bytes)
        elif self.state.rejects_bytes:
            raise JsonlIngestError(f"{rejects}: missing, but the resume state counts rejects in it")

    def _check_input_matches_state(self, f: io.FileIO, size: int) -> None:
        state = self.state
        if size < state.offset:
            raise InputChangedError(
                f"{self.input_path}: shrank to {size} bytes, but {state.offset} bytes were "
                "already ingested (rewritten or truncated input)"
            )
        if state.offset:
            back = min(state.offset, 4096)
            f.seek(state.offset - back)
            if hashlib.sha256(f.read(back)).hexdigest() != state.tail_sha256:
                raise InputChangedError(
                    f"{self.input_path}: the bytes before offset {state.offset} differ from the "
                    "ones already ingested (a different file?)"
                )

    # ---- shards

    def _write_shard(self, table: pa.Table, rel: str, start: int, end: int) -> ShardEntry:
        final = self.out / rel
        tmp = final.with_name(final.name + ".tmp")
        pq.write_table(table, tmp, compression=self.config.compression)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        _crash_point("after_shard_tmp")
        self._validate_shard(tmp, table)
        os.replace(tmp, final)
        _fsync_dir(final.parent)
        _crash_point("after_promote")
        line_no = table.column("line_no")
        return ShardEntry(
            file=rel,
            rows=table.num_rows,
            bytes=final.stat().st_size,
            sha256=sha256_file(final),
            first_line=line_no[0].as_py(),
            last_line=line_no[-1].as_py(),
            start_offset=start,
            end_offset=end,
        )

    @staticmethod
    def _validate_shard(path: Path, expected: pa.Table) -> None:
        """Reopen the written file: row count, schema and line numbers must match."""
        try:
            pf = pq.ParquetFile(path)
            rows = pf.metadata.num_rows
            schema = pf.schema_arrow
            line_no = pf.read(columns=["line_no"]).column("line_no")
        except (OSError, pa.ArrowException) as exc:
            raise ShardValidationError(f"{path}: written shard does not reopen: {exc}") from exc
        if rows != expected.num_rows:
            raise ShardValidationError(f"{path}: {rows} rows on disk, {expected.num_rows} written")
        if not schema.equals(JSONL_RECORDS, check_metadata=True):
            raise ShardValidationError(f"{path}: schema on disk differs from JSONL_RECORDS")
        if not line_no.equals(expected.column("line_no")):
            raise ShardValidationError(f"{path}: line_no column differs from what was written")

    def _append_rejects(self, rejects: list[RecordReject]) -> None:
        if not rejects:
            return
        data = b"".join(r.model_dump_json().encode() + b"\n" for r in rejects)
        with open(self.out / REJECTS_FILE, "ab") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        self.state.rejects += len(rejects)
        self.state.rejects_bytes += len(data)

    def _advance(self, offset: int, input_file: io.FileIO) -> None:
        back = min(offset, 4096)
        pos = input_file.tell()
        input_file.seek(offset - back)
        tail = input_file.read(back)
        input_file.seek(pos)
        self.state.offset = offset
        self.state.tail_sha256 = hashlib.sha256(tail).hexdigest()

    def _save_state(self) -> None:
        _write_atomic(self.out / STATE_FILE, self.state.model_dump_json(indent=1).encode())
        _crash_point("after_state")

    def _flush_train(self, n: int, input_file: io.FileIO) -> None:
        table, end = self.buffer.take(n)
        index = len(self.state.train)
        rel = f"{TRAIN_DIR}/part-{index:05d}.parquet"
        entry = self._write_shard(table, rel, self.state.offset, end)
        self._append_rejects(self.buffer.take_rejects_before(end))
        self.state.train.append(entry)
        self.state.next_line_no = entry.last_line + 1
        self._advance(end, input_file)
        self._save_state()

    def _flush_full_shards(self, input_file: io.FileIO) -> None:
        hold = self.config.validation_rows
        while len(self.buffer) >= self.config.rows_per_file + hold:
            self._flush_train(self.config.rows_per_file, input_file)

    # ---- the tail loop

    def ingest(self, input_file: io.FileIO, consumed_end: int, line_no: int) -> tuple[int, int]:
        """Read from the state offset until EOF (or idle timeout when following).
        Returns (offset of the first unconsumed byte, torn tail bytes)."""
        config = self.config
        pending: list[bytes] = []  # bytes of a line whose newline has not arrived yet
        pending_len = 0
        last_growth = time.monotonic()
        while True:
            chunk = input_file.read(config.read_chunk_bytes)
            if chunk:
                last_growth = time.monotonic()
                lines = chunk.split(b"\n")
                if len(lines) == 1:
                    pending.append(chunk)
                    pending_len += len(chunk)
                    continue
                if pending:
                    lines[0] = b"".join([*pending, lines[0]])
                tail = lines.pop()  # after the last newline: a line still being written
                pending = [tail] if tail else []
                pending_len = len(tail)
                line_no, consumed_end = self._consume(lines, consumed_end, line_no)
                self._flush_full_shards(input_file)
                continue
            if not config.follow:
                break
            size = os.fstat(input_file.fileno()).st_size
            if size < consumed_end + pending_len:
                raise InputChangedError(
                    f"{self.input_path}: shrank to {size} bytes while being followed"
                )
            if time.monotonic() - last_growth >= config.idle_timeout_s:
                break
            time.sleep(config.poll_interval_s)
        if pending_len:
            self.buffer.rejects.append(_torn_tail_reject(line_no, consumed_end, pending_len))
        return consumed_end, pending_len

    def _consume(self, lines: list[bytes], offset: int, line_no: int) -> tuple[int, int]:
        """Parse complete lines (newlines stripped) starting at input `offset`.
        Returns the next line number and the offset past the last line."""
        for line in lines:
            start = offset
            offset += len(line) + 1
            this_line = line_no
            line_no += 1
            if not line.strip():
                continue  # a blank line is no record; line numbers still count it
            parsed = _parse_line(line, this_line, start)
            if isinstance(parsed, RecordReject):
                self.buffer.rejects.append(parsed)
            else:
                self.buffer.add(parsed, offset)
        return line_no, offset

    def finalize(
        self, consumed_end: int, torn: int, input_size: int, input_file: io.FileIO
    ) -> None:
        """Last train shard, validation shards, remaining rejects; then mark finalized."""
        state, buffer = self.state, self.buffer
        train_rows = max(0, len(buffer) - self.config.validation_rows)
        if train_rows:
            self._flush_train(train_rows, input_file)
        start = state.offset
        while len(buffer):
            table, end = buffer.take(min(len(buffer), self.config.rows_per_file))
            rel = f"{VALIDATION_DIR}/part-{len(state.validation):05d}.parquet"
            state.validation.append(self._write_shard(table, rel, start, end))
            start = end
        self._append_rejects(buffer.take_rejects_before(sys.maxsize))
        self._advance(consumed_end, input_file)
        state.finalized = True
        state.torn_tail_bytes = torn
        state.input_bytes_at_end = input_size
        self._save_state()

    def write_manifest_and_complete(self) -> None:
        state = self.state
        rejects_path = self.out / REJECTS_FILE
        rejects_path.touch()
        train_rows = sum(e.rows for e in state.train)
        validation_rows = sum(e.rows for e in state.validation)
        manifest = JsonlManifest(
            input=state.input,
            consumed_bytes=state.offset,
            rows=train_rows + validation_rows,
            train_rows=train_rows,
            validation_rows=validation_rows,
            rejects=state.rejects,
            torn_tail_bytes=state.torn_tail_bytes,
            rows_per_file=state.rows_per_file,
            train=state.train,
            validation=state.validation,
            rejects_file=REJECTS_FILE,
            rejects_sha256=sha256_file(rejects_path),
        )
        data = manifest.model_dump_json(indent=1).encode()
        _write_atomic(self.out / MANIFEST_FILE, data)
        _crash_point("before_complete")
        _write_atomic(self.out / COMPLETE_FILE, complete_marker(self.out.name, data))

    def report(self, resumed_from: int, already_complete: bool) -> ConversionReport:
        state = self.state
        first: list[RecordReject] = []
        rejects_path = self.out / REJECTS_FILE
        if rejects_path.exists():
            with open(rejects_path, "rb") as f:
                for line in f:
                    if len(first) == 20:
                        break
                    first.append(RecordReject.model_validate_json(line))
        train_rows = sum(e.rows for e in state.train)
        validation_rows = sum(e.rows for e in state.validation)
        return ConversionReport(
            out_dir=self.out,
            input_path=self.input_path,
            rows=train_rows + validation_rows,
            train_shards=len(state.train),
            train_rows=train_rows,
            validation_shards=len(state.validation),
            validation_rows=validation_rows,
            rejects=state.rejects,
            first_rejects=first,
            torn_tail_bytes=state.torn_tail_bytes,
            consumed_bytes=state.offset,
            resumed_from_offset=resumed_from,
            already_complete=already_complete,
        )


def _open_input_waiting(input_path: Path, config: JsonlConverterConfig) -> io.FileIO:
    """Open the input; when following, give a writer up to idle_timeout_s to create it."""
    deadline = time.monotonic() + (config.idle_timeout_s if config.follow else 0.0)
    while True:
        try:
            return open(input_path, "rb", buffering=0)
        except FileNotFoundError:
            if time.monotonic() >= deadline:
                raise InputMissingError(f"{input_path}: input file does not exist") from None
            time.sleep(config.poll_interval_s)


def convert(input_path: Path, out_dir: Path, config: JsonlConverterConfig) -> ConversionReport:
    """Convert (and, with config.follow, tail) one JSONL file into validated parquet shards.

    Safe to re-run after any crash: it resumes from the last shard the state file records.
    Re-running on a completed directory returns its report, unless the input has grown since.
    """
    input_path = Path(input_path)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    lock = open(out_dir / LOCK_FILE, "a+b")  # noqa: SIM115 - held for the whole conversion
    try:
        try:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise OutputLockedError(
                f"{out_dir}: another converter is writing into this directory"
            ) from None
        converter = _Converter(input_path, out_dir, config)
        converter.load_state()
        state = converter.state
        resumed_from = state.offset
        with _open_input_waiting(input_path, config) as f:
            size = os.fstat(f.fileno()).st_size
            converter._check_input_matches_state(f, size)
            if state.finalized:
                if size > state.input_bytes_at_end:
                    raise InputChangedError(
                        f"{input_path}: grew from {state.input_bytes_at_end} to {size} bytes "
                        f"after the conversion into {out_dir} was finalized"
                    )
                already = (out_dir / COMPLETE_FILE).exists()
                if not already:
                    converter.write_manifest_and_complete()
                return converter.report(resumed_from, already_complete=already)
            f.seek(state.offset)
            consumed_end, torn = converter.ingest(f, state.offset, state.next_line_no)
            size = os.fstat(f.fileno()).st_size
            converter.finalize(consumed_end, torn, size, f)
        converter.write_manifest_and_complete()
        return converter.report(resumed_from, already_complete=False)
    finally:
        lock.close()


def read_manifest(out_dir: Path) -> JsonlManifest:
    """The manifest of a completed conversion; refuses a directory without _COMPLETE."""
    out_dir = Path(out_dir)
    if not (out_dir / COMPLETE_FILE).exists():
        raise JsonlIngestError(f"{out_dir}: no {COMPLETE_FILE}, the conversion is not finished")
    return JsonlManifest.model_validate_json((out_dir / MANIFEST_FILE).read_bytes())


# --------------------------------------------------------------------------- CLI


def _build_parser() -> argparse.ArgumentParser:
    defaults = JsonlConverterConfig()
    parser = argparse.ArgumentParser(
        prog="megacpp jsonl-to-parquet",
        description="Convert a (possibly still growing) JSONL file of {path, content[, license, "
        "revision]} records into validated parquet shards, a manifest and _COMPLETE.",
    )
    parser.add_argument("input", type=Path, metavar="INPUT")
    parser.add_argument("--out", type=Path, required=True, metavar="DIR")
    parser.add_argument("--rows-per-file", type=int, required=True, metavar="N")
    parser.add_argument(
        "--follow", action="store_true", help="keep tailing INPUT until it stops growing"
    )
    parser.add_argument(
        "--idle-timeout",
        type=float,
        default=defaults.idle_timeout_s,
        metavar="S",
        help="with --follow: seconds without growth that end the stream (default %(default)s)",
    )
    parser.add_argument("--poll-interval", type=float, default=None, metavar="S")
    parser.add_argument(
        "--validation-rows",
        type=int,
        default=0,
        metavar="N",
        help="hold the last N records out as the validation shard",
    )
    return parser


def main_jsonl_to_parquet(argv: list[str]) -> int:
    try:
        args = _build_parser().parse_args(argv)
    except SystemExit as exc:  # argparse already printed its one-line usage error
        return int(exc.code or 0)
    prog = "jsonl-to-parquet"
    try:
        poll = args.poll_interval
        if poll is None:
            poll = min(JsonlConverterConfig().poll_interval_s, args.idle_timeout / 4)
        config = JsonlConverterConfig(
            rows_per_file=args.rows_per_file,
            follow=args.follow,
            idle_timeout_s=args.idle_timeout,
            poll_interval_s=poll,
            validation_rows=args.validation_rows,
        )
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"]) or "config"
        print(f"{prog}: error: invalid option {where}: {err['msg']}", file=sys.stderr)
        return 2
    try:
        report = convert(args.input, args.out, config)
    except JsonlIngestError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"{prog}: error: {exc.filename or args.input}: {exc.strerror}", file=sys.stderr)
        return 1
    for reject in report.first_rejects:
        print(f"{prog}: rejected {reject.describe(args.input)}", file=sys.stderr)
    if report.rejects > len(report.first_rejects):
        more = report.rejects - len(report.first_rejects)
        print(f"{prog}: ... {more} more in {args.out / REJECTS_FILE}", file=sys.stderr)
    status = "already complete" if report.already_complete else "complete"
    print(
        f"{prog}: {status}: {report.rows} rows ({report.train_shards} train shards, "
        f"{report.validation_rows} validation rows), {report.rejects} rejected lines, "
        f"{report.consumed_bytes} bytes consumed -> {args.out}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main_jsonl_to_parquet(sys.argv[1:]))
