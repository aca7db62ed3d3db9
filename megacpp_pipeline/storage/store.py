"""The shard store: every gate writes bounded parquet shards plus a manifest into a new
version directory, and a version exists for readers only once `_COMPLETE` is in it.

Seed rule (protobuf-2gb-wall-and-shards): many files, explicit metadata, atomic promotion,
completion markers. Each shard goes to `*.tmp`, is reopened and validated, then renamed into
place; the manifest is written after its shards; `_COMPLETE` last; `LATEST` is swung after.
A crash at any point leaves the previous version intact and readable.

Layout: <root>/assets/<asset>/<partition or _>/<version>/{part-*.parquet, manifest.json,
_COMPLETE}. The root is any pyarrow filesystem URI (local path by default; s3://, gs://).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import socket
import uuid
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from pydantic import BaseModel

from megacpp_pipeline.storage.versions import (
    COMPLETE,
    LATEST,
    MANIFEST,
    UNPARTITIONED,
    Manifest,
    ShardInfo,
    TableInfo,
    canonical_json,
    complete_marker,
    config_hash,
    is_data_table,
    pid_alive,
    recorded_manifest_sha256,
    schema_fingerprint,
    sha256_on,
)

__all__ = [
    "COMPLETE",
    "LATEST",
    "MANIFEST",
    "UNPARTITIONED",
    "IncompleteVersionError",
    "Manifest",
    "ShardInfo",
    "ShardStore",
    "StoreError",
    "TableInfo",
    "VersionWriter",
    "canonical_json",
    "config_hash",
    "is_data_table",
    "schema_fingerprint",
]

WRITER = "_WRITER"
_WRITER_GRACE_S = 60.0


class StoreError(Exception):
    """A store operation failed; the message names the path and what was wrong."""


class IncompleteVersionError(StoreError):
    """A reader was pointed at a directory without `_COMPLETE`."""


class ShardStore:
    """A root directory of versioned asset outputs on a pyarrow filesystem."""

    def __init__(
        self,
        root: str,
        *,
        max_rows_per_shard: int = 50_000,
        max_bytes_per_shard: int = 16 << 20,
        compression: str = "zstd",
        keep_versions: int = 2,
        filesystem: pafs.FileSystem | None = None,
    ) -> None:
        if filesystem is not None:  # e.g. a wrapped or mounted filesystem; root is its path
            self.fs, self.root = filesystem, root
        elif "://" in root:
            self.fs, self.root = pafs.FileSystem.from_uri(root)
        else:
            self.fs, self.root = pafs.LocalFileSystem(), os.path.abspath(root)
        self.uri = root
        self.max_rows_per_shard = max_rows_per_shard
        self.max_bytes_per_shard = max_bytes_per_shard
        self.compression = compression
        self.keep_versions = keep_versions

    # paths -------------------------------------------------------------------------------
    def join(self, *parts: str) -> str:
        return "/".join((self.root.rstrip("/"), *parts))

    def partition_dir(self, asset: str, partition: str | None) -> str:
        return self.join("assets", asset, partition or UNPARTITIONED)

    def local_path(self, path: str) -> str:
        """The OS path for a store path, for libraries that need one (local roots only)."""
        if not isinstance(self.fs, pafs.LocalFileSystem):
            raise StoreError(f"{path}: a local path was asked of a non-local store {self.uri}")
        return path

    # low-level file ops --------------------------------------------------------------------
    def exists(self, path: str) -> bool:
        return self.fs.get_file_info(path).type != pafs.FileType.NotFound

    def read_bytes(self, path: str) -> bytes:
        try:
            with self.fs.open_input_stream(path) as f:
                return bytes(f.read())
        except (FileNotFoundError, OSError) as e:
            raise StoreError(f"{path}: cannot read ({e})") from e

    def write_bytes_atomic(self, path: str, data: bytes) -> None:
        # the pid in the name lets a cleaner tell a dead writer's temp file from a live one's
        tmp = f"{path}.{os.getpid()}-{uuid.uuid4().hex[:8]}.tmp"
        try:
            with self.fs.open_output_stream(tmp) as f:
                f.write(data)
            self.fs.move(tmp, path)
        except OSError as e:
            self._discard(tmp)
            raise StoreError(f"{path}: write failed ({e})") from e

    def sha256_of(self, path: str) -> str:
        return sha256_on(self.fs, path)

    def _discard(self, path: str) -> None:
        with contextlib.suppress(OSError):
            self.fs.delete_file(path)

    # writing -------------------------------------------------------------------------------
    def begin(
        self,
        asset: str,
        partition: str | None,
        *,
        code_version: str,
        config: BaseModel | Mapping[str, Any] | None = None,
        run_id: str | None = None,
    ) -> VersionWriter:
        pdir = self.partition_dir(asset, partition)
        self._clean_abandoned_versions(pdir)
        now = datetime.now(UTC)
        version = f"{now:%Y%m%dT%H%M%S%f}-{uuid.uuid4().hex[:8]}"
        vdir = f"{pdir}/{version}"
        try:
            self.fs.create_dir(vdir, recursive=True)
        except OSError as e:
            raise StoreError(f"{vdir}: cannot create version directory ({e})") from e
        self.write_bytes_atomic(
            f"{vdir}/{WRITER}", f"{socket.gethostname()} {os.getpid()}".encode()
        )
        return VersionWriter(
            self,
            Manifest(
                asset=asset,
                partition=partition or UNPARTITIONED,
                version=version,
                created_at=now.isoformat(),
                run_id=run_id,
                code_version=code_version,
                config_hash=config_hash(config),
            ),
            vdir,
        )

    def _clean_abandoned_versions(self, pdir: str) -> None:
        """Remove versions without `_COMPLETE` whose writer process is gone (a crash left
        them); a version still being written by a live process is left alone."""
        for info in self._list_dirs(pdir):
            vdir = info.path
            if self.exists(f"{vdir}/{COMPLETE}"):
                continue
            alive = self._writer_alive(vdir)
            if alive or (alive is None and self._just_created(info)):
                continue
            with contextlib.suppress(OSError):
                self.fs.delete_dir(vdir)
        # stale pointer temp files of dead writers (a live writer's LATEST.<pid>-<id>.tmp stays)
        try:
            for info in self.fs.get_file_info(pafs.FileSelector(pdir, allow_not_found=True)):
                if info.type == pafs.FileType.File and info.base_name.endswith(".tmp"):
                    pid = info.base_name.rsplit(".", 2)[-2].split("-")[0]
                    if not (pid.isdigit() and pid_alive(int(pid))):
                        self._discard(info.path)
        except OSError:
            pass

    @staticmethod
    def _just_created(info: pafs.FileInfo) -> bool:
        """A concurrent writer creates its version directory, then its `_WRITER` record: a
        directory younger than a minute without a record may be one in between (a crash
        right there leaves one that the next writer after that minute removes)."""
        if info.mtime is None:
            return False
        age = datetime.now(UTC) - info.mtime.astimezone(UTC)
        return age.total_seconds() < _WRITER_GRACE_S

    def _prune_old_versions(self, pdir: str) -> None:
        """Keep the newest `keep_versions` complete versions; older ones go."""
        complete = [i for i in self._list_dirs(pdir) if self.exists(f"{i.path}/{COMPLETE}")]
        for info in complete[: max(0, len(complete) - self.keep_versions)]:
            try:
                # _COMPLETE first, so a half-deleted old version is never readable
                self._discard(f"{info.path}/{COMPLETE}")
                self.fs.delete_dir(info.path)
            except OSError:
                pass

    def _writer_alive(self, vdir: str) -> bool | None:
        """None when there is no writer record (yet, or the crash came before it)."""
        try:
            host, pid = self.read_bytes(f"{vdir}/{WRITER}").decode().split()
        except (StoreError, ValueError):
            return None
        if host != socket.gethostname():
            return True  # cannot tell for another host: keep it
        return pid_alive(int(pid))

    def _list_dirs(self, path: str) -> list[pafs.FileInfo]:
        try:
            infos = self.fs.get_file_info(pafs.FileSelector(path, allow_not_found=True))
        except OSError:
            return []
        return sorted(
            (i for i in infos if i.type == pafs.FileType.Directory), key=lambda i: i.base_name
        )

    # reading -------------------------------------------------------------------------------
    def latest(self, asset: str, partition: str | None = None) -> Manifest:
        """The manifest of the newest complete version; StoreError if there is none."""
        pdir = self.partition_dir(asset, partition)
        version: str | None = None
        if self.exists(f"{pdir}/{LATEST}"):
            version = self.read_bytes(f"{pdir}/{LATEST}").decode().strip()
            if not self.exists(f"{pdir}/{version}/{COMPLETE}"):
                version = None
        if version is None:
            complete = [
                i.base_name for i in self._list_dirs(pdir) if self.exists(f"{i.path}/{COMPLETE}")
            ]
            if not complete:
                raise StoreError(
                    f"{pdir}: no complete version of asset {asset!r}"
                    f" partition {partition or UNPARTITIONED!r}; materialize it first"
                )
            version = complete[-1]
        return self.read_manifest(f"{pdir}/{version}")

    def has_version(self, asset: str, partition: str | None = None) -> bool:
        try:
            self.latest(asset, partition)
        except StoreError:
            return False
        return True

    def version_dir(self, manifest: Manifest) -> str:
        return f"{self.partition_dir(manifest.asset, manifest.partition)}/{manifest.version}"

    def manifest_path(self, manifest: Manifest) -> str:
        return f"{self.version_dir(manifest)}/{MANIFEST}"

    def read_manifest(self, vdir: str) -> Manifest:
        if not self.exists(f"{vdir}/{COMPLETE}"):
            raise IncompleteVersionError(f"{vdir}: no {COMPLETE}; not a readable version")
        raw = self.read_bytes(f"{vdir}/{MANIFEST}")
        try:
            return Manifest.model_validate_json(raw)
        except ValueError as e:
            raise StoreError(f"{vdir}/{MANIFEST}: invalid manifest ({e})") from e

    def manifest_sha256(self, manifest: Manifest) -> str:
        return hashlib.sha256(self.read_bytes(self.manifest_path(manifest))).hexdigest()

    def iter_tables(
        self, manifest: Manifest, table: str = "data", columns: list[str] | None = None
    ) -> Iterator[pa.Table]:
        """One shard at a time, so memory is bounded by the shard size."""
        info = manifest.tables.get(table)
        if info is None:
            return
        vdir = self.version_dir(manifest)
        for shard in info.shards:
            path = f"{vdir}/{shard.path}"
            try:
                yield pq.read_table(path, filesystem=self.fs, columns=columns)
            except (OSError, pa.ArrowInvalid) as e:
                raise StoreError(f"{path}: unreadable shard ({e})") from e

    def read_table(self, manifest: Manifest, table: str = "data") -> pa.Table:
        """A whole (small) side table; never use this for a corpus table."""
        parts = list(self.iter_tables(manifest, table))
        if not parts:
            raise StoreError(f"{self.version_dir(manifest)}: no table {table!r}")
        return pa.concat_tables(parts)

    def verify(self, manifest: Manifest, *, check_sha256: bool = True) -> list[str]:
        """Every problem with a version on disk, each naming the file; [] when it is sound."""
        vdir = self.version_dir(manifest)
        problems: list[str] = self._verify_manifest_bytes(vdir)
        for name, info in manifest.tables.items():
            total = 0
            for shard in info.shards:
                path = f"{vdir}/{shard.path}"
                problems.extend(self._verify_file(path, shard, check_sha256))
                try:
                    meta = pq.read_metadata(path, filesystem=self.fs)
                    schema = meta.schema.to_arrow_schema()
                except (OSError, pa.ArrowInvalid) as e:
                    problems.append(f"{path}: not readable parquet ({e})")
                    continue
                if meta.num_rows != shard.rows:
                    problems.append(f"{path}: {meta.num_rows} rows, manifest says {shard.rows}")
                if schema_fingerprint(schema) != info.schema_fingerprint:
                    problems.append(f"{path}: schema differs from the manifest's table {name!r}")
                total += meta.num_rows
            if total != info.rows and not any(p.startswith(vdir) for p in problems):
                problems.append(f"{vdir}: table {name!r} has {total} rows, manifest {info.rows}")
        for f in manifest.files:
            problems.extend(self._verify_file(f"{vdir}/{f.path}", f, check_sha256))
        return problems

    def _verify_manifest_bytes(self, vdir: str) -> list[str]:
        """The manifest's sha256 against the one `_COMPLETE` recorded (older versions have
        none)."""
        try:
            recorded = recorded_manifest_sha256(self.read_bytes(f"{vdir}/{COMPLETE}"))
            actual = hashlib.sha256(self.read_bytes(f"{vdir}/{MANIFEST}")).hexdigest()
        except (StoreError, UnicodeDecodeError) as e:
            return [f"{vdir}/{MANIFEST}: cannot check against {COMPLETE} ({e})"]
        if recorded is not None and recorded != actual:
            return [f"{vdir}/{MANIFEST}: sha256 differs from the one {COMPLETE} recorded"]
        return []

    def _verify_file(self, path: str, shard: ShardInfo, check_sha256: bool) -> list[str]:
        info = self.fs.get_file_info(path)
        if info.type == pafs.FileType.NotFound:
            return [f"{path}: missing"]
        if info.size != shard.bytes:
            return [f"{path}: {info.size} bytes, manifest says {shard.bytes}"]
        if check_sha256 and self.sha256_of(path) != shard.sha256:
            return [f"{path}: sha256 mismatch (manifest {shard.sha256[:12]}...)"]
        return []


class TableWriter:
    """Writes one logical table as bounded shards: rows and bytes per shard are capped."""

    def __init__(self, version: VersionWriter, name: str, schema: pa.Schema) -> None:
        self.version = version
        self.name = name
        self.schema = schema
        self.info = TableInfo(schema_fingerprint=schema_fingerprint(schema))
        self._pending: list[pa.Table] = []
        self._pending_rows = 0
        self._pending_bytes = 0

    def write(self, table: pa.Table) -> None:
        if table.num_rows == 0:
            return
        if table.schema != self.schema:
            try:
                table = table.select(self.schema.names).cast(self.schema)
            except (KeyError, pa.ArrowInvalid, ValueError) as e:
                raise StoreError(
                    f"{self.version.manifest.asset}: table {self.name!r} does not match its "
                    f"declared schema ({e})"
                ) from e
        store = self.version.store
        start = 0
        row_bytes = max(1, table.nbytes // table.num_rows)
        while start < table.num_rows:
            room_bytes = max(0, store.max_bytes_per_shard - self._pending_bytes)
            room = max(
                1, min(store.max_rows_per_shard - self._pending_rows, room_bytes // row_bytes)
            )
            piece = table.slice(start, room)
            self._pending.append(piece)
            self._pending_rows += piece.num_rows
            self._pending_bytes += piece.nbytes
            start += piece.num_rows
            if (
                self._pending_rows >= store.max_rows_per_shard
                or self._pending_bytes >= store.max_bytes_per_shard
            ):
                self.flush()

    def flush(self) -> None:
        if not self._pending:
            return
        table = pa.concat_tables(self._pending).combine_chunks()
        self._pending, self._pending_rows, self._pending_bytes = [], 0, 0
        index = len(self.info.shards)
        prefix = "part" if self.name == "data" else self.name.replace(":", "-")
        shard = self.version.write_parquet(f"{prefix}-{index:05d}.parquet", table)
        if not self.info.shards:
            # the contract is what parquet holds: fingerprint the schema read back from disk
            self.info.schema_fingerprint = schema_fingerprint(self.version.last_schema)
        self.info.shards.append(shard)
        self.info.rows += shard.rows

    def close(self) -> TableInfo:
        self.flush()
        return self.info


class VersionWriter:
    """One new version of one asset partition; invisible to readers until `commit()`."""

    def __init__(self, store: ShardStore, manifest: Manifest, vdir: str) -> None:
        self.store = store
        self.manifest = manifest
        self.dir = vdir
        self._writers: dict[str, TableWriter] = {}
        self.last_schema: pa.Schema | None = None

    def table(self, name: str, schema: pa.Schema) -> TableWriter:
        if name not in self._writers:
            self._writers[name] = TableWriter(self, name, schema)
        return self._writers[name]

    def write_parquet(self, relpath: str, table: pa.Table, **kwargs: Any) -> ShardInfo:
        """tmp -> reopen and validate -> rename: a shard is listed only once it reads back."""
        fs, final = self.store.fs, f"{self.dir}/{relpath}"
        tmp = f"{final}.tmp"
        parent = final.rsplit("/", 1)[0]
        try:
            fs.create_dir(parent, recursive=True)
            options: dict[str, Any] = {"compression": self.store.compression}
            options.update(kwargs)
            pq.write_table(table, tmp, filesystem=fs, **options)
            meta = pq.read_metadata(tmp, filesystem=fs)
            if meta.num_rows != table.num_rows:
                raise StoreError(f"{final}: wrote {table.num_rows} rows, read back {meta.num_rows}")
            written = meta.schema.to_arrow_schema()
            if written.names != table.schema.names:
                raise StoreError(f"{final}: columns changed on the way to disk")
            sha = self.store.sha256_of(tmp)
            size = fs.get_file_info(tmp).size
            fs.move(tmp, final)
        except OSError as e:
            self.store._discard(tmp)
            raise StoreError(f"{final}: shard write failed ({e})") from e
        self.last_schema = written
        return ShardInfo(path=relpath, rows=table.num_rows, bytes=size, sha256=sha)

    def write_file(self, relpath: str, data: bytes) -> ShardInfo:
        final = f"{self.dir}/{relpath}"
        if "/" in relpath:
            self.store.fs.create_dir(final.rsplit("/", 1)[0], recursive=True)
        self.store.write_bytes_atomic(final, data)
        info = ShardInfo(
            path=relpath, rows=0, bytes=len(data), sha256=hashlib.sha256(data).hexdigest()
        )
        self.manifest.files.append(info)
        return info

    def file_path(self, relpath: str) -> str:
        return f"{self.dir}/{relpath}"

    def commit(
        self,
        *,
        upstream: Mapping[str, str] | None = None,
        stats: Mapping[str, float] | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> Manifest:
        """Close every table, write the manifest, then `_COMPLETE`, then swing `LATEST`."""
        for name, writer in self._writers.items():
            self.manifest.tables[name] = writer.close()
        if upstream:
            self.manifest.upstream.update(upstream)
        if stats:
            self.manifest.stats.update({k: float(v) for k, v in stats.items()})
        if extra:
            self.manifest.extra.update(extra)
        store = self.store
        raw = self.manifest.model_dump_json(indent=2).encode()
        store.write_bytes_atomic(f"{self.dir}/{MANIFEST}", raw)
        # the marker holds the manifest's sha256, so a changed manifest byte is caught too
        store.write_bytes_atomic(
            f"{self.dir}/{COMPLETE}", complete_marker(self.manifest.version, raw)
        )
        store._discard(f"{self.dir}/{WRITER}")
        pdir = store.partition_dir(self.manifest.asset, self.manifest.partition)
        store.write_bytes_atomic(f"{pdir}/{LATEST}", self.manifest.version.encode())
        store._prune_old_versions(pdir)
        return self.manifest

    def abort(self) -> None:
        """Drop this version's files; used when the gate itself failed."""
        with contextlib.suppress(OSError):
            self.store.fs.delete_dir(self.dir)
