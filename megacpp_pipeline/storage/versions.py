"""The version folder: the one on-disk format every output of this project shares (asset
versions in the store, promoted snapshots, JSONL conversions). A folder of files, then
`manifest.json` listing them, then `_COMPLETE` written last; its absence means "not a
version". `_COMPLETE` holds `<version id> <sha256 of manifest.json>`, so a reader that checks
it catches a changed manifest byte too. A partition's `LATEST` names its newest version; a
version being written has a lease, `<version>.lease`, beside its folder (storage/lease.py).
Nothing here relies on renaming a folder or on its mtime: a version's folder has a unique
name from the start, so it works the same on object storage.

Seed rule (protobuf-2gb-wall-and-shards): many files, explicit metadata, completion markers.
This module owns the names, the marker, the store's manifest model and the file hashing;
ShardStore, the snapshot builder, the JSONL converter, the loader and the Megatron export
use it rather than spelling the format again.
"""

from __future__ import annotations

import hashlib
import json
import os
import uuid
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
from pydantic import BaseModel, ConfigDict, Field, SerializerFunctionWrapHandler, model_serializer

from megacpp_pipeline.snapshot import layout

# A version commits as a snapshot does: its manifest, then the marker holding its sha256.
COMPLETE = layout.COMPLETE
MANIFEST = layout.MANIFEST
LATEST = "LATEST"
UNPARTITIONED = "_"
LEASE_SUFFIX = ".lease"
TMP_SUFFIX = ".tmp"
MANIFEST_SCHEMA_VERSION = 1
_CHUNK = 1 << 20


# names in a partition folder -------------------------------------------------------------
def new_version_id(now: datetime) -> str:
    """A version's folder name: sorts by begin time, unique across writers and hosts."""
    return f"{now:%Y%m%dT%H%M%S%f}-{uuid.uuid4().hex[:8]}"


def is_version_name(name: str) -> bool:
    """Version folders start with their timestamp; `_`/`.` names are the store's own."""
    return bool(name) and name[0].isdigit()


def lease_name(version: str) -> str:
    return f"{version}{LEASE_SUFFIX}"


def tmp_name(name: str, owner: str) -> str:
    """A local temp file for `name`, owned by version `owner`: a cleaner that finds it after
    a crash removes it once that version's lease is dead."""
    return f"{name}.{owner}-{uuid.uuid4().hex[:8]}{TMP_SUFFIX}"


def tmp_owner(name: str) -> str | None:
    """The version that owns a temp file named by `tmp_name` (None for any other name)."""
    if not name.endswith(TMP_SUFFIX) or "." not in name[: -len(TMP_SUFFIX)]:
        return None
    owner = name[: -len(TMP_SUFFIX)].rsplit(".", 1)[1].rsplit("-", 1)[0]
    return owner if is_version_name(owner) else None


# the marker ------------------------------------------------------------------------------
def complete_marker(version_id: str, manifest_bytes: bytes) -> bytes:
    """What `_COMPLETE` holds for a version whose manifest is `manifest_bytes`."""
    return f"{version_id} {hashlib.sha256(manifest_bytes).hexdigest()}\n".encode()


def recorded_manifest_sha256(marker: bytes) -> str | None:
    """The manifest sha256 a `_COMPLETE` marker records (None for a marker that holds only
    the version id, as the earliest versions wrote)."""
    parts = marker.decode().split()
    return parts[1] if len(parts) > 1 else None


# hashing ---------------------------------------------------------------------------------
def sha256_file(path: str | os.PathLike[str]) -> str:
    """sha256 of a local file, read in 1 MiB chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def sha256_on(fs: pafs.FileSystem, path: str) -> str:
    """sha256 of a file on any pyarrow filesystem, streamed."""
    h = hashlib.sha256()
    with fs.open_input_stream(path) as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def write_bytes_atomic(path: Path, data: bytes) -> None:
    """A local file that is either absent, its old bytes, or all of `data`."""
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


# How every parquet file of the pipeline is written: zstd, and no dictionary pages. Their
# large columns (text, token ids, chunk lists, paths and hashes) never fit a dictionary, so
# parquet built one per column chunk and gave it up; without them, writing a per-file
# stage's shard was 8-23% cheaper, a packed-rows shard 23% and a documents shard 26%, and
# no file larger (packed rows 10% smaller; docs/scaling.md §2).
PARQUET_OPTIONS: dict[str, Any] = {"compression": "zstd", "use_dictionary": False}


def write_parquet_atomic(table: pa.Table, path: Path, **options: Any) -> None:
    """A local parquet file written aside, read back (its row count must match), then
    renamed into place."""
    import pyarrow.parquet as pq

    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    pq.write_table(table, tmp, **{**PARQUET_OPTIONS, **options})
    if pq.read_metadata(tmp).num_rows != table.num_rows:
        tmp.unlink(missing_ok=True)
        raise OSError(f"{path}: wrote {table.num_rows} rows, read back a different count")
    os.replace(tmp, path)


def pid_alive(pid: int) -> bool:
    """Whether a process of this host with this id exists (a writer's liveness, where the
    writer is known to be local)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# the store's manifest --------------------------------------------------------------------
# A per-file version's shard may leave the text of a row out and name where it is instead:
# this column holds, for such a row, its place in the shard's `text_from` holders (their
# rows one after another), and is null where the shard holds the row's text itself.
TEXT = "text"
TEXT_AT = "_text_at"
TEXT_FROM = "text_from"
HELD_BYTES = "held_bytes"


class TextHolder(BaseModel):
    """A shard of an earlier version that holds the text of rows of a later one: its
    version's folder relative to the store's root, and its manifest entry (a read of it is
    verified against that size and sha256)."""

    model_config = ConfigDict(extra="forbid")
    dir: str
    path: str
    rows: int
    bytes: int
    sha256: str

    @classmethod
    def of(cls, dir: str, shard: ShardInfo) -> TextHolder:
        """`shard` of the version in `dir` (relative to the store's root) as a holder."""
        return cls(
            dir=dir, path=shard.path, rows=shard.rows, bytes=shard.bytes, sha256=shard.sha256
        )

    def shard(self) -> ShardInfo:
        return ShardInfo(path=self.path, rows=self.rows, bytes=self.bytes, sha256=self.sha256)


class ShardInfo(BaseModel):
    model_config = ConfigDict(extra="forbid")
    path: str  # relative to the version directory
    rows: int
    bytes: int
    sha256: str
    # set on a shard written with a `TEXT_AT` column: the shards its rows' text is read
    # from (empty when it holds every row's text); readers resolve it (ShardStore.read_shard)
    text_from: list[TextHolder] | None = None
    # with text_from: the holders' parquet bytes its rows' text takes, apportioned by rows
    # (an estimate, never verified): what a task that reads the text reads besides this
    # shard, so slices are planned by the work they carry (slices.weight)
    held_bytes: int | None = None

    @model_serializer(mode="wrap")
    def _without_unset_text(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        for key in (TEXT_FROM, HELD_BYTES):
            if data.get(key) is None:
                data.pop(key, None)  # a shard that holds all its text reads as before
        return data


class TableInfo(BaseModel):
    model_config = ConfigDict(extra="forbid")
    schema_fingerprint: str
    rows: int = 0
    shards: list[ShardInfo] = Field(default_factory=list)


class Manifest(BaseModel):
    """An asset version's manifest: its tables' shards, side files, the upstream versions
    it read, its stats and anything else the stage records."""

    model_config = ConfigDict(extra="forbid")
    schema_version: int = MANIFEST_SCHEMA_VERSION
    asset: str
    partition: str
    version: str
    created_at: str
    run_id: str | None = None
    code_version: str
    config_hash: str | None = None
    tables: dict[str, TableInfo] = Field(default_factory=dict)  # "data", "ledger", side tables
    files: list[ShardInfo] = Field(default_factory=list)  # non-parquet artifacts
    upstream: dict[str, str] = Field(default_factory=dict)  # "asset/partition" -> manifest sha256
    stats: dict[str, float] = Field(default_factory=dict)
    extra: dict[str, Any] = Field(default_factory=dict)

    @property
    def rows(self) -> int:
        """Rows of the main table; a global asset splits it as `data:<part>` tables."""
        return sum(t.rows for name, t in self.tables.items() if layout.is_data_table(name))

    def data_tables(self) -> list[str]:
        return [name for name in self.tables if layout.is_data_table(name)]

    def all_shards(self) -> list[ShardInfo]:
        return [s for t in self.tables.values() for s in t.shards] + list(self.files)


def content_id(manifest: Manifest, table: str | None = None) -> str:
    """What a version holds, whichever folder holds it and whenever it was written: its
    stage's code version and config, and each table's and file's shards by path, rows and
    sha256, with the sha256 of every shard holding text it keeps by reference (with
    `table`, that table's alone). Two versions with one content_id read as the same data
    (pipeline/reuse.py)."""
    tables = {
        name: [
            info.schema_fingerprint,
            [
                [s.path, s.rows, s.sha256, [h.sha256 for h in s.text_from or ()]]
                for s in info.shards
            ],
        ]
        for name, info in sorted(manifest.tables.items())
        if table is None or name == table
    }
    data = {
        "asset": manifest.asset,
        "partition": manifest.partition,
        "code_version": manifest.code_version,
        "config_hash": manifest.config_hash,
        "tables": tables,
        "files": [[f.path, f.sha256] for f in manifest.files] if table is None else [],
    }
    return hashlib.sha256(canonical_json(data)).hexdigest()[:32]


def schema_fingerprint(schema: pa.Schema) -> str:
    """Types and names only: metadata (e.g. pandas) does not change the contract."""
    text = ";".join(f"{f.name}:{f.type}:{f.nullable}" for f in schema)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def canonical_json(data: Any) -> bytes:
    return json.dumps(data, sort_keys=True, separators=(",", ":")).encode()


def config_hash(config: BaseModel | Mapping[str, Any] | None) -> str:
    if config is None:
        return "none"
    data = config.model_dump(mode="json") if isinstance(config, BaseModel) else dict(config)
    return hashlib.sha256(canonical_json(data)).hexdigest()[:16]
