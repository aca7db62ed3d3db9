"""The converter's output directory, its one owner: the file names, the resume state, the
manifest and the report, and how a restart reconciles the directory with its state.

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

import hashlib
import io
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from megacpp_pipeline.collect.jsonl_stream.errors import (
    InputChangedError,
    JsonlIngestError,
    ResumeConfigMismatchError,
)
from megacpp_pipeline.collect.jsonl_stream.reader import JSONL_SCHEMA_VERSION, RecordReject
from megacpp_pipeline.storage.versions import COMPLETE, MANIFEST

STATE_FILE = "_state.json"
MANIFEST_FILE = MANIFEST
COMPLETE_FILE = COMPLETE
REJECTS_FILE = "rejects.jsonl"
LOCK_FILE = "_lock"
TRAIN_DIR = "train"
VALIDATION_DIR = "validation"


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


class ResumeState(BaseModel):
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


def read_manifest(out_dir: Path) -> JsonlManifest:
    """The manifest of a completed conversion; refuses a directory without _COMPLETE."""
    out_dir = Path(out_dir)
    if not (out_dir / COMPLETE_FILE).exists():
        raise JsonlIngestError(f"{out_dir}: no {COMPLETE_FILE}, the conversion is not finished")
    return JsonlManifest.model_validate_json((out_dir / MANIFEST_FILE).read_bytes())


# --------------------------------------------------------------------------- resume


def load_state(out: Path, fresh: ResumeState) -> ResumeState:
    """The state to go on from: the saved one (refused when its shards were written with
    other settings than `fresh`'s), else `fresh`; every artifact it does not list is removed."""
    state = fresh
    state_path = out / STATE_FILE
    if state_path.exists():
        try:
            saved = ResumeState.model_validate_json(state_path.read_bytes())
        except ValidationError as exc:
            raise JsonlIngestError(f"{state_path}: unreadable resume state: {exc}") from exc
        for name in ("rows_per_file", "validation_rows", "compression"):
            if getattr(saved, name) != getattr(fresh, name):
                raise ResumeConfigMismatchError(
                    f"{state_path}: resuming with {name}={getattr(fresh, name)} but the "
                    f"shards so far were written with {name}={getattr(saved, name)}"
                )
        state = saved
    _remove_unlisted_artifacts(out, state)
    return state


def _remove_unlisted_artifacts(out: Path, state: ResumeState) -> None:
    """Everything the state file does not vouch for is from a killed run: delete it,
    the deterministic rewrite recreates it."""
    listed = {e.file for e in (*state.train, *state.validation)}
    for sub in (TRAIN_DIR, VALIDATION_DIR):
        directory = out / sub
        directory.mkdir(parents=True, exist_ok=True)
        for p in directory.iterdir():
            if f"{sub}/{p.name}" not in listed:
                p.unlink()
    for p in out.glob("*.tmp"):
        p.unlink()
    if not state.finalized:
        for name in (MANIFEST_FILE, COMPLETE_FILE):
            (out / name).unlink(missing_ok=True)
    rejects = out / REJECTS_FILE
    if rejects.exists():
        with open(rejects, "r+b") as f:
            f.truncate(state.rejects_bytes)
    elif state.rejects_bytes:
        raise JsonlIngestError(f"{rejects}: missing, but the resume state counts rejects in it")


def check_input_matches_state(
    input_path: Path, state: ResumeState, f: io.FileIO, size: int
) -> None:
    """The input still holds the bytes the state says were ingested (same length at least,
    same last 4 KiB before the offset)."""
    if size < state.offset:
        raise InputChangedError(
            f"{input_path}: shrank to {size} bytes, but {state.offset} bytes were "
            "already ingested (rewritten or truncated input)"
        )
    if state.offset:
        back = min(state.offset, 4096)
        f.seek(state.offset - back)
        if hashlib.sha256(f.read(back)).hexdigest() != state.tail_sha256:
            raise InputChangedError(
                f"{input_path}: the bytes before offset {state.offset} differ from the "
                "ones already ingested (a different file?)"
            )


def conversion_report(
    out: Path, input_path: Path, state: ResumeState, resumed_from: int, already_complete: bool
) -> ConversionReport:
    """What a conversion did, from its state and the first 20 lines of its rejects file."""
    first: list[RecordReject] = []
    rejects_path = out / REJECTS_FILE
    if rejects_path.exists():
        with open(rejects_path, "rb") as f:
            for line in f:
                if len(first) == 20:
                    break
                first.append(RecordReject.model_validate_json(line))
    train_rows = sum(e.rows for e in state.train)
    validation_rows = sum(e.rows for e in state.validation)
    return ConversionReport(
        out_dir=out,
        input_path=input_path,
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
