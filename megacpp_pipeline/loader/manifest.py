"""What the loader trusts about a promoted snapshot: `_COMPLETE` and the manifest, the
split's shard list (kept inside the snapshot), optional sha256 checks, and each shard's
packed-row schema and row groups, checked once when a loader opens the split."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from pydantic import ValidationError

from megacpp_pipeline.loader.errors import (
    ShardChecksumError,
    ShardSchemaError,
    SnapshotIncompleteError,
    SnapshotManifestError,
)
from megacpp_pipeline.snapshot.layout import COMPLETE, MANIFEST, SnapshotManifest
from megacpp_pipeline.snapshot.packed_rows import REQUIRED_COLUMNS, packed_rows_schema
from megacpp_pipeline.storage.versions import sha256_file

COMPLETE_MARKER = COMPLETE
MANIFEST_NAME = MANIFEST


@dataclass(frozen=True)
class Shard:
    """One parquet shard of the split as the loader opened it."""

    relpath: str
    path: Path
    sha256: str  # the manifest's, so the row-group cache is keyed by content
    columns: tuple[str, ...]  # schema-known columns present in the shard
    row_group_rows: tuple[int, ...]


def read_snapshot_manifest(snapshot_dir: str | os.PathLike[str]) -> SnapshotManifest:
    """The manifest of a promoted snapshot, as the layout types it; refuses a directory
    without `_COMPLETE`, and names the first field that breaks the model."""
    root = Path(snapshot_dir)
    if not (root / COMPLETE_MARKER).is_file():
        raise SnapshotIncompleteError(root, COMPLETE_MARKER)
    manifest_path = root / MANIFEST_NAME
    if not manifest_path.is_file():
        raise SnapshotIncompleteError(root, MANIFEST_NAME)
    try:
        return SnapshotManifest.model_validate_json(manifest_path.read_bytes())
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(x) for x in first["loc"]) or "<document>"
        raise SnapshotManifestError(manifest_path, where, first["msg"]) from exc


def split_shards(manifest: SnapshotManifest, split: str, snapshot_dir: Path) -> list[str]:
    """The split's shard paths from the manifest, each checked to stay inside the snapshot."""
    manifest_path = snapshot_dir / MANIFEST_NAME
    if split not in manifest.splits:
        raise SnapshotManifestError(
            manifest_path, f"splits.{split}", f"no such split (has {sorted(manifest.splits)})"
        )
    shards = manifest.splits[split].shards
    root = snapshot_dir.resolve()
    for relpath in shards:
        if not (root / relpath).resolve().is_relative_to(root):
            raise SnapshotManifestError(manifest_path, relpath, "shard path leaves the snapshot")
    return list(shards)


file_sha256 = sha256_file  # the loader's name for it, kept for its importers


def verify_files_sha256(
    snapshot_dir: Path, manifest: SnapshotManifest, paths: Sequence[str]
) -> None:
    """Each path's bytes hash to what the manifest's `files` list says, or ShardChecksumError."""
    listed = {entry.path: entry.sha256 for entry in manifest.files}
    for relpath in paths:
        expected = listed.get(relpath)
        actual = file_sha256(snapshot_dir / relpath)
        if expected != actual:
            raise ShardChecksumError(relpath, expected, actual)


def check_packed_schema(shard: str, schema: pa.Schema, seq_len: int) -> list[str]:
    """The schema-known columns this shard holds, in schema order; hard error on a bad one.

    Compares types structurally (value type and list size), not the list's child field name:
    parquet writers disagree on whether that child is called `item` or `element`.
    """
    present = []
    for expected in packed_rows_schema(seq_len):
        index = schema.get_field_index(expected.name)
        if index < 0:
            if expected.name in REQUIRED_COLUMNS:
                raise ShardSchemaError(shard, expected.name, "required column is missing")
            continue
        found = schema.field(index).type
        if pa.types.is_fixed_size_list(expected.type):
            ok = (
                pa.types.is_fixed_size_list(found)
                and found.list_size == seq_len
                and found.value_type == expected.type.value_type
            )
        else:
            ok = found == expected.type
        if not ok:
            raise ShardSchemaError(shard, expected.name, f"must be {expected.type}, found {found}")
        present.append(expected.name)
    return present


def open_split(
    snapshot_dir: Path, manifest: SnapshotManifest, split: str, verify_sha256: bool
) -> list[Shard]:
    """The split's shards in manifest order, each present and of the packed-row schema."""
    seq_len = manifest.seq_len
    relpaths = split_shards(manifest, split, snapshot_dir)
    if verify_sha256:
        verify_files_sha256(snapshot_dir, manifest, relpaths)
    sha_by_path = {e.path: e.sha256 for e in manifest.files}
    shards = []
    for relpath in relpaths:
        path = snapshot_dir / relpath
        if not path.is_file():
            raise SnapshotManifestError(
                snapshot_dir / MANIFEST_NAME, relpath, "listed shard does not exist"
            )
        metadata = pq.ParquetFile(path).metadata
        present = check_packed_schema(relpath, metadata.schema.to_arrow_schema(), seq_len)
        sha256 = sha_by_path.get(relpath) or file_sha256(path)
        rows = tuple(metadata.row_group(i).num_rows for i in range(metadata.num_row_groups))
        shards.append(Shard(relpath, path, sha256, tuple(present), rows))
    return shards
