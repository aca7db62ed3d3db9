"""The streaming converter: tails a JSONL file that may still be growing, consumes only
complete lines, and commits each validated shard in order (*.tmp, fsync, reopen, os.replace,
then the resume state), writing the manifest and `_COMPLETE` last.
"""

from __future__ import annotations

import fcntl
import hashlib
import io
import os
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from megacpp_pipeline.collect.jsonl_stream import output
from megacpp_pipeline.collect.jsonl_stream.buffer import RowBuffer
from megacpp_pipeline.collect.jsonl_stream.config import JsonlConverterConfig
from megacpp_pipeline.collect.jsonl_stream.crash import CrashPlan
from megacpp_pipeline.collect.jsonl_stream.durable import (
    append_synced,
    fsync_dir,
    fsync_file,
    write_atomic,
)
from megacpp_pipeline.collect.jsonl_stream.errors import (
    CompressedInputError,
    InputChangedError,
    InputMissingError,
    OutputLockedError,
    ShardValidationError,
)
from megacpp_pipeline.collect.jsonl_stream.reader import (
    JSONL_RECORDS,
    MAGIC_BYTES,
    RecordReject,
    compression_problem,
    parse_line,
    torn_tail_reject,
)
from megacpp_pipeline.storage.versions import complete_marker, sha256_file


class _Converter:
    def __init__(
        self,
        input_path: Path,
        out_dir: Path,
        config: JsonlConverterConfig,
        crash: CrashPlan | None = None,
    ) -> None:
        self.input_path = input_path
        self.out = out_dir
        self.config = config
        self.crash = crash
        self.buffer = RowBuffer()
        self.state = output.ResumeState(
            input=str(input_path.resolve()),
            rows_per_file=config.rows_per_file,
            validation_rows=config.validation_rows,
            compression=config.compression,
        )

    def _crash_point(self, point: str) -> None:
        if self.crash is not None:
            self.crash.passed(point)

    # ---- shards

    def _write_shard(self, table: pa.Table, rel: str, start: int, end: int) -> output.ShardEntry:
        final = self.out / rel
        tmp = final.with_name(final.name + ".tmp")
        pq.write_table(table, tmp, compression=self.config.compression)
        fsync_file(tmp)
        self._crash_point("after_shard_tmp")
        self._validate_shard(tmp, table)
        os.replace(tmp, final)
        fsync_dir(final.parent)
        self._crash_point("after_promote")
        line_no = table.column("line_no")
        return output.ShardEntry(
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
        append_synced(self.out / output.REJECTS_FILE, data)
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
        write_atomic(self.out / output.STATE_FILE, self.state.model_dump_json(indent=1).encode())
        self._crash_point("after_state")

    def _flush_train(self, n: int, input_file: io.FileIO) -> None:
        table, end = self.buffer.take(n)
        index = len(self.state.train)
        rel = f"{output.TRAIN_DIR}/part-{index:05d}.parquet"
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
            self.buffer.rejects.append(torn_tail_reject(line_no, consumed_end, pending_len))
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
            parsed = parse_line(line, this_line, start)
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
            rel = f"{output.VALIDATION_DIR}/part-{len(state.validation):05d}.parquet"
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
        rejects_path = self.out / output.REJECTS_FILE
        rejects_path.touch()
        train_rows = sum(e.rows for e in state.train)
        validation_rows = sum(e.rows for e in state.validation)
        manifest = output.JsonlManifest(
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
            rejects_file=output.REJECTS_FILE,
            rejects_sha256=sha256_file(rejects_path),
        )
        data = manifest.model_dump_json(indent=1).encode()
        write_atomic(self.out / output.MANIFEST_FILE, data)
        self._crash_point("before_complete")
        write_atomic(self.out / output.COMPLETE_FILE, complete_marker(self.out.name, data))


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


def convert(
    input_path: Path,
    out_dir: Path,
    config: JsonlConverterConfig,
    *,
    crash: CrashPlan | None = None,
) -> output.ConversionReport:
    """Convert (and, with config.follow, tail) one JSONL file into validated parquet shards.

    Safe to re-run after any crash: it resumes from the last shard the state file records.
    Re-running on a completed directory returns its report, unless the input has grown since.
    """
    input_path = Path(input_path)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    lock = open(out_dir / output.LOCK_FILE, "a+b")  # noqa: SIM115 - held for the whole conversion
    try:
        try:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise OutputLockedError(
                f"{out_dir}: another converter is writing into this directory"
            ) from None
        converter = _Converter(input_path, out_dir, config, crash)
        converter.state = output.load_state(out_dir, converter.state)
        state = converter.state
        resumed_from = state.offset
        with _open_input_waiting(input_path, config) as f:
            size = os.fstat(f.fileno()).st_size
            if problem := compression_problem(input_path, os.pread(f.fileno(), MAGIC_BYTES, 0)):
                raise CompressedInputError(problem)
            output.check_input_matches_state(input_path, state, f, size)
            if state.finalized:
                if size > state.input_bytes_at_end:
                    raise InputChangedError(
                        f"{input_path}: grew from {state.input_bytes_at_end} to {size} bytes "
                        f"after the conversion into {out_dir} was finalized"
                    )
                already = (out_dir / output.COMPLETE_FILE).exists()
                if not already:
                    converter.write_manifest_and_complete()
                return output.conversion_report(out_dir, input_path, state, resumed_from, already)
            f.seek(state.offset)
            consumed_end, torn = converter.ingest(f, state.offset, state.next_line_no)
            size = os.fstat(f.fileno()).st_size
            converter.finalize(consumed_end, torn, size, f)
        converter.write_manifest_and_complete()
        return output.conversion_report(out_dir, input_path, state, resumed_from, False)
    finally:
        lock.close()
