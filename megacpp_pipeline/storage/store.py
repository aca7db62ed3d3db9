"""The shard store: every gate writes bounded parquet shards plus a manifest into a new
version folder, and a version exists for readers only once `_COMPLETE` is in it.

Seed rule (protobuf-2gb-wall-and-shards): many files, explicit metadata, completion markers.
The rules hold on object storage as on local disk, with no rename, no directory mtime and no
process id trusted across hosts:
- a version's folder has a unique name (begin time + random), so every shard is written
  straight to its final name; each is read back (size, sha256 of the bytes whose parquet
  metadata was checked before upload) before the manifest may list it;
- `manifest.json`, then `_COMPLETE` (holding the manifest's sha256) are the commit point;
- `LATEST` is written only by the committing writer of that partition, and only forward;
- a writer holds a lease, `<version>.lease` beside the folder (storage/lease.py), put before
  its first object and refreshed by a heartbeat; a version without `_COMPLETE` is removed
  only once its lease is dead (no heartbeat for its TTL, or a gone process of this machine).
A crash at any point leaves the previous version intact and readable.

Layout: <root>/assets/<asset>/<partition or _>/{<version>/{part-*.parquet, manifest.json,
_COMPLETE}, <version>.lease, LATEST}. The root is a local path or any pyarrow filesystem URI
(storage/filesystem.py).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import uuid
import weakref
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import Any
from urllib.parse import quote, unquote

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from pydantic import BaseModel

from megacpp_pipeline.core.kept import Kept
from megacpp_pipeline.snapshot import layout
from megacpp_pipeline.storage import text_refs
from megacpp_pipeline.storage.filesystem import (
    bucket_exists,
    describe,
    is_local,
    needs_directories,
    resolve,
)
from megacpp_pipeline.storage.lease import (
    DEFAULT_TTL_S,
    Lease,
    LeaseKeeper,
    LeaseLostError,
    WriterIdentity,
    new_lease,
    why_dead,
)
from megacpp_pipeline.storage.text_refs import TextPlaces
from megacpp_pipeline.storage.versions import (
    COMPLETE,
    LATEST,
    LEASE_SUFFIX,
    MANIFEST,
    PARQUET_OPTIONS,
    TEXT,
    TEXT_AT,
    UNPARTITIONED,
    Manifest,
    ShardInfo,
    TableInfo,
    TextHolder,
    canonical_json,
    complete_marker,
    config_hash,
    is_version_name,
    lease_name,
    new_version_id,
    recorded_manifest_sha256,
    schema_fingerprint,
    sha256_on,
    tmp_name,
    tmp_owner,
)

__all__ = [
    "COMPLETE",
    "DEFAULT_TTL_S",
    "LATEST",
    "MANIFEST",
    "UNPARTITIONED",
    "IncompleteVersionError",
    "LeaseLostError",
    "Manifest",
    "NoVersionError",
    "ShardInfo",
    "ShardStore",
    "ShardVerificationError",
    "StoreError",
    "TableInfo",
    "VersionWriter",
    "canonical_json",
    "config_hash",
    "schema_fingerprint",
]


class StoreError(Exception):
    """A store operation failed; the message names the path and what was wrong."""


class IncompleteVersionError(StoreError):
    """A reader was pointed at a directory without `_COMPLETE`."""


class NoVersionError(StoreError):
    """An asset partition has no complete version yet (materialize it first)."""


class ShardVerificationError(StoreError):
    """A committed version's object is not what its manifest records (missing, another size,
    another sha256): its bytes changed after the commit, so no gate produced them. The
    message names the version, the object, the expected hash and what to do."""


log = logging.getLogger(__name__)
_CHUNK = 1 << 20
# A version with more bytes than this is re-hashed by the caller's tasks when it gives a
# `Mapper` (an executor's map), a batch of about this many bytes per task: a stage's driver
# never reads a whole corpus version itself. Below it, one process hashes it.
HASH_IN_TASKS_BYTES = 64 << 20
# A shard's rows go in row groups of about this many bytes (in memory), unless its writer
# says otherwise: a task given a few rows of a large shard (slices cut shards larger than a
# task) decodes only the groups those rows are in, not the whole shard once per task.
ROW_GROUP_BYTES = 1 << 20


def logical_bytes(table: pa.Table) -> int:
    """A table's size from its values alone: what row groups and shards are cut by, so the
    same rows make the same files however their buffers are laid out (a column with a
    validity bitmap and one without, a slice of a larger buffer; `nbytes` tells those
    apart, and a cached run would cut its files elsewhere than a cold one)."""
    return sum(_column_bytes(c) for c in table.columns)


def _column_bytes(column: pa.ChunkedArray | pa.Array) -> int:
    t = column.type
    n = len(column)
    if pa.types.is_dictionary(t):
        return _column_bytes(column.cast(t.value_type))
    if (
        pa.types.is_string(t)
        or pa.types.is_large_string(t)
        or pa.types.is_binary(t)
        or pa.types.is_large_binary(t)
    ):
        return int(pc.sum(pc.binary_length(column)).as_py() or 0) + 4 * n
    if pa.types.is_boolean(t):
        return (n + 7) // 8
    if pa.types.is_null(t):
        return 0
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return _column_bytes(pc.list_flatten(column)) + 4 * n
    if pa.types.is_struct(t):
        chunks = column.chunks if isinstance(column, pa.ChunkedArray) else [column]
        return sum(
            _column_bytes(pa.chunked_array([c.field(i) for c in chunks], t.field(i).type))
            for i in range(t.num_fields)
        )
    if pa.types.is_fixed_size_list(t):
        return _column_bytes(pc.list_flatten(column))
    try:
        width = t.bit_width
    except ValueError:  # any other variable-width type (views, maps): its buffers
        return int(column.nbytes)
    return width * n // 8


# (task, job, items) -> each item's result, in order: an executor's map.
Mapper = Callable[[Callable[[Any, Any], Any], Any, list[Any]], Iterator[Any]]
# Manifests of committed versions read for verifying `read_bytes` of their files; a version
# never changes once committed (its id is unique), so this only saves re-reading them.
_MANIFESTS_KEPT = 256
# Manifests read this large are parsed once per process and their bytes: a corpus-wide
# version's manifest (a table per source) is read by every source's step, and parsing it
# costs in proportion to the sources (1-3 ms at 200). Smaller ones parse in microseconds.
_PARSED_FROM_BYTES = 1 << 14
_PARSED_KEPT = 8
# Beside a partition's versions: for each version, markers of the later versions (of other
# assets) whose rows name text its shards hold; pruning keeps it while one is committed.
HOLDS = "_holds"


def _read_rows(parquet: pq.ParquetFile, columns: list[str] | None, lo: int, hi: int) -> pa.Table:
    """Rows [lo, hi) of a parquet file, decoding only the row groups that hold them."""
    meta = parquet.metadata
    groups, first, start = [], None, 0
    for i in range(meta.num_row_groups):
        end = start + meta.row_group(i).num_rows
        if start < hi and end > lo:
            groups.append(i)
            first = start if first is None else first
        start = end
    if not groups:
        return parquet.schema_arrow.empty_table().select(columns or parquet.schema_arrow.names)
    table = parquet.read_row_groups(groups, columns=columns)
    return table.slice(lo - (first or 0), hi - lo)


def _sha256_batch(fs: pafs.FileSystem, paths: list[str]) -> list[str]:
    """A task: the sha256 of each object, in order."""
    return [sha256_on(fs, p) for p in paths]


def _utcnow() -> datetime:
    return datetime.now(UTC)


class ShardStore:
    """A root of versioned asset outputs on a pyarrow filesystem (local path or URI)."""

    def __init__(
        self,
        root: str,
        *,
        max_rows_per_shard: int = 50_000,
        max_bytes_per_shard: int = 16 << 20,
        compression: str = "zstd",
        keep_versions: int = 2,
        filesystem: pafs.FileSystem | None = None,
        lease_ttl_s: float = DEFAULT_TTL_S,
        writer_host: str | None = None,
        clock: Callable[[], datetime] = _utcnow,
    ) -> None:
        """`lease_ttl_s`: how long this store's writers may go without a heartbeat before a
        cleaner on any host may remove their unfinished version. `writer_host`: the host
        name written into leases (default: this machine's). `clock`: UTC now, for leases."""
        if filesystem is not None:  # e.g. a wrapped or mounted filesystem; root is its path
            self.fs, self.root = filesystem, root
        else:
            try:
                self.fs, self.root = resolve(root)
            except ValueError as e:
                raise StoreError(str(e)) from e
        self.uri = root
        self.max_rows_per_shard = max_rows_per_shard
        self.max_bytes_per_shard = max_bytes_per_shard
        self.compression = compression
        self.keep_versions = keep_versions
        self.lease_ttl_s = lease_ttl_s
        self.writer_host = writer_host
        self.clock = clock
        self._local = is_local(self.fs)
        self._dirs = needs_directories(self.fs)
        self._manifests: Kept[str, Manifest] = Kept(_MANIFESTS_KEPT)
        self._parsed: Kept[bytes, Manifest] = Kept(_PARSED_KEPT)  # by the bytes' sha256
        # text holders this process hashed whole for a version that stands (verify_reused)
        self._hashed_holders: set[tuple[str, str]] = set()

    # paths -------------------------------------------------------------------------------
    def join(self, *parts: str) -> str:
        return "/".join((self.root.rstrip("/"), *parts))

    def partition_dir(self, asset: str, partition: str | None) -> str:
        return self.join("assets", asset, partition or UNPARTITIONED)

    def local_path(self, path: str) -> str:
        """The OS path for a store path, for libraries that need one (local roots only)."""
        if not self._local:
            raise StoreError(f"{path}: a local path was asked of a non-local store {self.uri}")
        return path

    @property
    def is_local(self) -> bool:
        return self._local

    # low-level file ops --------------------------------------------------------------------
    def exists(self, path: str) -> bool:
        try:
            return self.fs.get_file_info(path).type != pafs.FileType.NotFound
        except OSError as e:
            raise StoreError(f"{describe(self.fs, path)}: stat failed ({e})") from e

    def read_bytes(self, path: str) -> bytes:
        """The object's bytes. An object a committed version's manifest lists (a shard, an
        artifact) is verified against it as it is read (ShardVerificationError)."""
        listed = self._listed(path)
        if listed is not None:
            return self._read_verified(listed[0], listed[1]).to_pybytes()
        try:
            with self.fs.open_input_stream(path) as f:
                return bytes(f.read())
        except (FileNotFoundError, OSError) as e:
            raise StoreError(f"{describe(self.fs, path)}: read failed ({e})") from e

    def read_bytes_if_exists(self, path: str) -> bytes | None:
        """The object's bytes, or None when there is none (other failures raise OSError)."""
        try:
            with self.fs.open_input_stream(path) as f:
                return bytes(f.read())
        except FileNotFoundError:
            return None
        except OSError:
            if not self.exists(path):
                return None
            raise

    def put_bytes(
        self, path: str, data: bytes, *, owner: str = "store", atomic: bool = True
    ) -> None:
        """A whole object: readers see nothing, or all of `data`. An object store's PUT is
        that already; on local disk the bytes go to a temp file named for `owner` (a
        version id) and are renamed into place, so a crash leaves at worst that temp file,
        which the next cleaner removes once the owner's lease is dead (a temp file of no
        version is never removed by a cleaner). `atomic=False` writes in place on local
        disk too, for objects nobody trusts before the commit point (a manifest without
        `_COMPLETE`) or that are judged by age when unreadable (a lease)."""
        try:
            if not self._local or not atomic:
                with self.fs.open_output_stream(path) as f:
                    f.write(data)
                return
            parent, name = path.rsplit("/", 1)
            tmp = f"{parent}/{tmp_name(name, owner)}"
            try:
                with self.fs.open_output_stream(tmp) as f:
                    f.write(data)
                self.fs.move(tmp, path)
            except OSError:
                self._discard(tmp)
                raise
        except OSError as e:
            raise StoreError(f"{describe(self.fs, path)}: write failed ({e})") from e

    def write_bytes_atomic(self, path: str, data: bytes) -> None:
        """The former name of `put_bytes`."""
        self.put_bytes(path, data)

    def sha256_of(self, path: str) -> str:
        return sha256_on(self.fs, path)

    # local copies, for libraries that need a file (a tokenizer, shards to copy) -------------
    def local_copy(self, path: str, sha256: str, cache_dir: str | Path) -> str:
        """An OS path holding the object at `path`, whose sha256 must be `sha256`: the path
        itself on a local store (hashed first); else a copy under `cache_dir/store-objects/`,
        named by its hash, fetched once (hashed as it streams to a temp name, then renamed
        into place) and hashed again whenever it is handed out. A mismatch raises
        ShardVerificationError (a copy in the cache that changed is fetched again)."""
        listed = self._listed(path)
        expected = listed[1] if listed is not None else None
        if self._local:
            self._check_local_file(Path(path), sha256, expected, what=path)
            return path
        local = Path(cache_dir) / "store-objects" / sha256[:2] / sha256
        if local.exists():
            try:
                self._check_local_file(local, sha256, None, what=path)
                return str(local)
            except ShardVerificationError as e:
                log.warning("%s; fetching it again", e)
                local.unlink(missing_ok=True)
        local.parent.mkdir(parents=True, exist_ok=True)
        tmp = local.with_name(f".{local.name}.{uuid.uuid4().hex}")
        h = hashlib.sha256()
        size = 0
        try:
            with self.fs.open_input_stream(path) as src, tmp.open("wb") as out:
                while chunk := src.read(_CHUNK):
                    h.update(chunk)
                    out.write(chunk)
                    size += len(chunk)
        except FileNotFoundError as e:
            tmp.unlink(missing_ok=True)
            raise self._mismatch(path, expected, sha256, None, None) from e
        except OSError as e:
            tmp.unlink(missing_ok=True)
            raise StoreError(f"{describe(self.fs, path)}: read failed ({e})") from e
        got = h.hexdigest()
        if got != sha256 or (expected is not None and size != expected.bytes):
            tmp.unlink(missing_ok=True)
            raise self._mismatch(path, expected, sha256, size, got)
        os.replace(tmp, local)
        return str(local)

    def _check_local_file(
        self, local: Path, sha256: str, expected: ShardInfo | None, *, what: str
    ) -> None:
        h = hashlib.sha256()
        size = 0
        try:
            with local.open("rb") as f:
                while chunk := f.read(_CHUNK):
                    h.update(chunk)
                    size += len(chunk)
        except FileNotFoundError as e:
            raise self._mismatch(what, expected, sha256, None, None) from e
        except OSError as e:
            raise StoreError(f"{local}: read failed ({e})") from e
        got = h.hexdigest()
        if got != sha256 or (expected is not None and size != expected.bytes):
            raise self._mismatch(what, expected, sha256, size, got)

    def uri_of(self, path: str) -> str:
        """A store path as a URI a person can pass back (`s3://bucket/...`); a local path
        as it is."""
        if self._local or "://" not in self.uri:
            return path
        return f"{self.uri.split('://', 1)[0]}://{path}"

    def local_root(self, cache_dir: str | Path) -> Path:
        """Where stages that build a directory with local-file libraries (the snapshot, the
        Megatron export) build it: the store's root on a local store; else a folder under
        `cache_dir` for this store (the snapshot stage then uploads what it promoted)."""
        if self._local:
            return Path(self.root)
        tag = hashlib.sha256(self.uri.split("?", 1)[0].encode()).hexdigest()[:16]
        return Path(cache_dir) / "store-local" / tag

    def upload_dir(self, local: Path, path: str, *, last: str = COMPLETE) -> list[str]:
        """Every file under `local` put at the same relative path under `path`, `last` after
        all the others (a reader trusts the folder once it is there); the object paths."""
        files = sorted(p for p in local.rglob("*") if p.is_file())
        files.sort(key=lambda p: p.name == last)
        out = []
        for f in files:
            target = f"{path}/{f.relative_to(local).as_posix()}"
            if self._dirs:
                self.fs.create_dir(target.rsplit("/", 1)[0], recursive=True)
            with self.fs.open_output_stream(target) as stream:
                stream.write(f.read_bytes())
            out.append(target)
        return out

    def _discard(self, path: str) -> None:
        with contextlib.suppress(OSError):
            self.fs.delete_file(path)

    def _delete_dir(self, path: str) -> None:
        with contextlib.suppress(OSError):
            self.fs.delete_dir(path)

    def delete_file(self, path: str) -> None:
        """Remove one object of the store; a missing one is not an error."""
        self._discard(path)

    def delete_dir(self, path: str) -> None:
        """Remove a folder of the store and all under it; a missing one is not an error."""
        self._delete_dir(path)

    # writing -------------------------------------------------------------------------------
    def begin(
        self,
        asset: str,
        partition: str | None,
        *,
        code_version: str,
        config: BaseModel | Mapping[str, Any] | None = None,
        run_id: str | None = None,
        mapper: Mapper | None = None,
    ) -> VersionWriter:
        """A new version, leased to this process; it is invisible until `commit()`. Use it
        as a context manager to have a failing gate's version removed at once. The latest
        version of the partition is verified first (`mapper`: see `verify_objects`)."""
        pdir = self.partition_dir(asset, partition)
        self.clean_abandoned(pdir)
        replaced = self._replaced_unsound(asset, partition, mapper)
        now = datetime.now(UTC)
        version = new_version_id(now)
        vdir = f"{pdir}/{version}"
        if self._dirs:
            try:
                self.fs.create_dir(pdir, recursive=True)
            except OSError as e:
                raise StoreError(f"{vdir}: cannot create version directory ({e})") from e
        lease = new_lease(
            version,
            WriterIdentity.of_this_process(self.writer_host),
            now=self.clock(),
            ttl_s=self.lease_ttl_s,
        )
        lease_path = f"{pdir}/{lease_name(version)}"
        keeper = LeaseKeeper(
            lease,
            read=lambda: self.read_bytes_if_exists(lease_path),
            write=lambda data: self.put_bytes(lease_path, data, atomic=False),
            clock=self.clock,
        )
        # the lease before any object of the version: a folder without one is nobody's
        try:
            keeper.put_first()
        except StoreError as e:
            raise StoreError(f"{vdir}: cannot create version directory ({e})") from e
        if self._dirs:
            try:
                self.fs.create_dir(vdir, recursive=True)
            except OSError as e:
                self._discard(lease_path)
                raise StoreError(f"{vdir}: cannot create version directory ({e})") from e
        keeper.start()
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
                extra={"replaced_unverified": replaced} if replaced else {},
            ),
            vdir,
            keeper,
        )

    def _replaced_unsound(
        self, asset: str, partition: str | None, mapper: Mapper | None = None
    ) -> dict[str, str] | None:
        """The partition's newest complete version, when it no longer verifies (an object
        changed after its commit): a new version replaces it, and says so in one warning
        line and in its manifest's `replaced_unverified`. None when there is none or it is
        sound. One listing for the sizes, then one streaming hash per object."""
        try:
            previous = self.latest(asset, partition)
        except StoreError:
            return None  # none yet, or unreadable: the new version's own writes say why
        problem = next(iter(self.verify_objects(previous, mapper)), None)
        if problem is None:
            return None
        where = "" if previous.partition == UNPARTITIONED else f" [{previous.partition}]"
        log.warning(
            "%s%s: replacing version %s, which failed verification (%s)",
            asset,
            where,
            previous.version,
            problem,
        )
        return {"version": previous.version, "problem": problem}

    # cleaning ------------------------------------------------------------------------------
    def clean_abandoned(self, pdir: str) -> list[str]:
        """Remove what dead writers left in a partition folder: versions without
        `_COMPLETE`, their leases and temp files. A version whose lease is alive, whatever
        host holds it, is never touched. Returns what was removed, each with why."""
        removed: list[str] = []
        try:
            entries = self.fs.get_file_info(pafs.FileSelector(pdir, allow_not_found=True))
        except OSError:
            return removed
        dirs = {
            i.base_name
            for i in entries
            if i.type == pafs.FileType.Directory and is_version_name(i.base_name)
        }
        leased = {
            i.base_name[: -len(LEASE_SUFFIX)]
            for i in entries
            if i.type == pafs.FileType.File and i.base_name.endswith(LEASE_SUFFIX)
        }
        here = WriterIdentity.of_this_process(self.writer_host)
        for version in sorted(dirs | leased):
            done = self._clean_version(
                pdir, version, here, has_dir=version in dirs, listed_lease=version in leased
            )
            if done is not None:
                removed.append(f"{pdir}/{version}: {done}")
        # local temp files are named for the version that wrote them: theirs once it is dead
        owners: dict[str, str | None] = {}
        for info in entries:
            owner = tmp_owner(info.base_name) if info.type == pafs.FileType.File else None
            if owner is None:
                continue
            if owner not in owners:
                owners[owner] = self._lease_verdict(pdir, owner, here)[1]
            if owners[owner] is not None:
                self._discard(info.path)
        return removed

    def _clean_version(
        self, pdir: str, version: str, here: WriterIdentity, *, has_dir: bool, listed_lease: bool
    ) -> str | None:
        """What was removed of one version and why; None when it was left alone."""
        vdir = f"{pdir}/{version}"
        if not listed_lease and self.exists(f"{vdir}/{COMPLETE}"):
            return None  # the common case: a committed version, its lease long gone
        # the lease before `_COMPLETE`: a writer removes its lease only after `_COMPLETE`,
        # so "no lease, then no _COMPLETE" can never be a writer that just committed
        lease, why = self._lease_verdict(pdir, version, here)
        if why is None:
            return None
        done = []
        if has_dir and not self.exists(f"{vdir}/{COMPLETE}"):
            self._delete_dir(vdir)
            done.append("unfinished version removed")
        if lease is not None:
            self._discard(f"{pdir}/{lease_name(version)}")
            done.append("lease removed")
        return f"{' and '.join(done)}: {why}" if done else None

    def _lease_verdict(
        self, pdir: str, version: str, here: WriterIdentity
    ) -> tuple[Lease | None, str | None]:
        """The version's lease and why its writer is gone (None: alive, keep everything)."""
        path = f"{pdir}/{lease_name(version)}"
        try:
            raw = self.read_bytes_if_exists(path)
        except OSError:
            return None, None  # cannot tell: keep
        if raw is None:
            return None, "no lease (its writer finished, aborted or was cleaned)"
        stored_at = self.fs.get_file_info(path).mtime
        stored_at = stored_at.astimezone(UTC) if stored_at is not None else None
        try:
            lease = Lease.model_validate_json(raw)
        except ValueError:
            # torn (a crash mid-write on local disk, or read mid-rewrite) or foreign: judged
            # by its age alone, with this store's TTL
            age = (self.clock() - stored_at).total_seconds() if stored_at else 0.0
            return None, (f"unreadable lease {age:.0f} s old" if age > self.lease_ttl_s else None)
        return lease, why_dead(lease, now=self.clock(), here=here, stored_at=stored_at)

    def _clean_abandoned_versions(self, pdir: str) -> None:
        """The former name of `clean_abandoned`."""
        self.clean_abandoned(pdir)

    def _prune_old_versions(self, pdir: str) -> None:
        """Keep the newest `keep_versions` complete versions, and any older one that holds
        text a committed version of another asset names (`hold_text`); the others go."""
        complete = [i for i in self._list_dirs(pdir) if self.exists(f"{i.path}/{COMPLETE}")]
        for info in complete[: max(0, len(complete) - self.keep_versions)]:
            if self._text_held(pdir, info.base_name):
                continue
            # _COMPLETE first, so a half-deleted old version is never readable
            self._discard(f"{info.path}/{COMPLETE}")
            self._delete_dir(info.path)
            self._delete_dir(f"{pdir}/{HOLDS}/{info.base_name}")

    def hold_text(self, vdir: str, manifest: Manifest) -> None:
        """Before `manifest` (of the version in `vdir`) is committed: mark every other
        version whose shards hold text it names, so pruning keeps those while this one is
        there (a marker under the holder's `_holds/<version>/`, named by this version's
        folder). A holder already gone is a StoreError: the version would read nothing."""
        mine = self.relative(vdir)
        holders = {h.dir for s in manifest.all_shards() for h in s.text_from or []} - {mine}
        for d in sorted(holders):
            holder = self.join(d)
            pdir, version = holder.rsplit("/", 1)
            marks = f"{pdir}/{HOLDS}/{version}"
            if self._dirs:
                self.fs.create_dir(marks, recursive=True)
            self.put_bytes(f"{marks}/{quote(mine, safe='')}", b"", atomic=False)
            if not self.exists(f"{holder}/{COMPLETE}"):
                raise StoreError(
                    f"{vdir}: not committed: the text of its rows is held by {holder}, which"
                    " is not a complete version (removed meanwhile?); run the stage again"
                )

    def _text_held(self, pdir: str, version: str) -> bool:
        """Whether a committed version names text this version holds."""
        try:
            marks = self.fs.get_file_info(
                pafs.FileSelector(f"{pdir}/{HOLDS}/{version}", allow_not_found=True)
            )
        except OSError:
            return True  # cannot tell: keep
        return any(
            self.exists(f"{self.join(unquote(m.base_name))}/{COMPLETE}")
            for m in marks
            if m.type == pafs.FileType.File
        )

    def _list_dirs(self, path: str, *, op: str | None = None) -> list[pafs.FileInfo]:
        """Version folders under `path`, oldest first. A listing that fails is [] for
        best-effort callers (pruning), a StoreError naming the operation when `op` says
        what the caller was doing."""
        try:
            infos = self.fs.get_file_info(pafs.FileSelector(path, allow_not_found=True))
        except OSError as e:
            if op is None:
                return []
            raise StoreError(f"{describe(self.fs, path)}: {op} failed ({e})") from e
        return sorted(
            (
                i
                for i in infos
                if i.type == pafs.FileType.Directory and is_version_name(i.base_name)
            ),
            key=lambda i: i.base_name,
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
                i.base_name
                for i in self._list_dirs(pdir, op="list the versions")
                if self.exists(f"{i.path}/{COMPLETE}")
            ]
            if not complete:
                if not bucket_exists(self.fs, pdir):
                    raise StoreError(
                        f"{describe(self.fs, pdir)}: the bucket does not exist (reading the "
                        f"latest version of {asset!r}); was it deleted, or is this the wrong "
                        "endpoint or account?"
                    )
                raise NoVersionError(
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
        """A committed version's manifest, read from the store at every call. A large one is
        parsed once per process and bytes, and the manifest returned is shared by every
        caller that reads those bytes: none may change a manifest it read."""
        if not self.exists(f"{vdir}/{COMPLETE}"):
            raise IncompleteVersionError(f"{vdir}: no {COMPLETE}; not a readable version")
        raw = self.read_bytes(f"{vdir}/{MANIFEST}")
        try:
            if len(raw) < _PARSED_FROM_BYTES:
                return Manifest.model_validate_json(raw)
            key = hashlib.sha256(raw).digest()
            return self._parsed.get(key, lambda: Manifest.model_validate_json(raw))
        except ValueError as e:
            raise StoreError(f"{vdir}/{MANIFEST}: invalid manifest ({e})") from e

    def manifest_sha256(self, manifest: Manifest) -> str:
        return hashlib.sha256(self.read_bytes(self.manifest_path(manifest))).hexdigest()

    def iter_tables(
        self, manifest: Manifest, table: str = layout.DATA, columns: list[str] | None = None
    ) -> Iterator[pa.Table]:
        """One shard at a time, so memory is bounded by the shard size; each shard is
        verified against the manifest (size, sha256) as it is read."""
        info = manifest.tables.get(table)
        if info is None:
            return
        vdir = self.version_dir(manifest)
        for shard in info.shards:
            yield self.read_shard(vdir, shard, columns)

    def read_table(self, manifest: Manifest, table: str = layout.DATA) -> pa.Table:
        """A whole (small) side table; never use this for a corpus table."""
        parts = list(self.iter_tables(manifest, table))
        if not parts:
            raise StoreError(f"{self.version_dir(manifest)}: no table {table!r}")
        return pa.concat_tables(parts)

    # verified reads ------------------------------------------------------------------------
    def read_shard(
        self,
        where: Manifest | str,
        shard: ShardInfo,
        columns: list[str] | None = None,
        rows: tuple[int, int] | None = None,
    ) -> pa.Table:
        """One parquet shard of a committed version (`where`: its manifest, or its version
        folder), read once: its bytes are hashed as they arrive and must be exactly the
        size and sha256 the manifest records (else ShardVerificationError naming the
        version, the shard and the expected hash); the table is then decoded from those
        same bytes in memory (`columns`: only these; `rows`: only rows [lo, hi), decoding
        only the row groups they are in)."""
        return self.read_shard_located(where, shard, columns, rows)[0]

    def read_shard_located(
        self,
        where: Manifest | str,
        shard: ShardInfo,
        columns: list[str] | None = None,
        rows: tuple[int, int] | None = None,
    ) -> tuple[pa.Table, TextPlaces]:
        """`read_shard`, and where each row's text is held (for a gate that keeps it, so
        its version can name that place instead of writing the text again). A shard
        written with text left out (`ShardInfo.text_from`) gets it back here, read from the
        shards that hold it, each verified against its own recorded sha256."""
        vdir = where if isinstance(where, str) else self.version_dir(where)
        lo = rows[0] if rows is not None else 0
        wants_text = columns is None or TEXT in columns
        referred = shard.text_from is not None and wants_text
        own = [*columns, TEXT_AT] if referred and columns is not None else columns
        table = self._decode(vdir, shard, own, rows)
        if not wants_text or TEXT not in table.column_names:
            return table, TextPlaces.nowhere(table.num_rows)
        if not referred:
            if not vdir.startswith(self.root.rstrip("/") + "/"):  # not a version of this store
                return table, TextPlaces.nowhere(table.num_rows)
            me = TextHolder.of(self.relative(vdir), shard)
            return table, TextPlaces.rows_of(me, lo, lo + table.num_rows)
        me = TextHolder.of(self.relative(vdir), shard)
        holders = shard.text_from or []
        try:
            table, at = text_refs.resolve(table, holders, self._holder_text, f"{vdir}/{shard.path}")
        except ValueError as e:
            raise StoreError(str(e)) from e
        whole = sum(h.rows for h in holders)
        own_rows = whole + lo + np.arange(table.num_rows, dtype=np.int64)
        return table, TextPlaces((*holders, me), np.where(at >= 0, at, own_rows))

    def _decode(
        self,
        vdir: str,
        shard: ShardInfo,
        columns: list[str] | None,
        rows: tuple[int, int] | None,
    ) -> pa.Table:
        data = self._read_verified(vdir, shard)
        try:
            if rows is None or rows == (0, shard.rows):
                return pq.read_table(pa.BufferReader(data), columns=columns)
            return _read_rows(pq.ParquetFile(pa.BufferReader(data)), columns, *rows)
        except (OSError, pa.ArrowInvalid) as e:
            raise StoreError(f"{vdir}/{shard.path}: unreadable shard ({e})") from e

    def _holder_text(self, holder: TextHolder, lo: int, hi: int) -> pa.ChunkedArray:
        """Rows [lo, hi) of the text a holder shard holds, its bytes verified."""
        return self._decode(self.join(holder.dir), holder.shard(), [TEXT], (lo, hi))[TEXT]

    def relative(self, path: str) -> str:
        """A store path relative to the root (what a manifest records of another version)."""
        root = self.root.rstrip("/") + "/"
        if not path.startswith(root):
            raise StoreError(f"{path}: not under the store's root {root}")
        return path[len(root) :]

    def read_shard_bytes(self, where: Manifest | str, shard: ShardInfo) -> pa.Buffer:
        """The verified bytes of one object a committed version lists (as `read_shard`)."""
        vdir = where if isinstance(where, str) else self.version_dir(where)
        return self._read_verified(vdir, shard)

    def _read_verified(self, vdir: str, shard: ShardInfo) -> pa.Buffer:
        """One streaming pass: read into a buffer of the recorded size, hashing each chunk
        as it lands; one more byte means the object grew."""
        path = f"{vdir}/{shard.path}"
        h = hashlib.sha256()
        buf = pa.allocate_buffer(shard.bytes)
        view = memoryview(buf)
        got = 0
        try:
            with self.fs.open_input_stream(path) as f:
                while got < shard.bytes:
                    n = f.readinto(view[got : got + _CHUNK])
                    if not n:
                        break
                    h.update(view[got : got + n])
                    got += n
                extra = len(f.read(1)) if got == shard.bytes else 0
        except OSError as e:
            if not bucket_exists(self.fs, path):
                raise StoreError(
                    f"{describe(self.fs, path)}: read failed: the bucket does not exist (was it "
                    "deleted, or is this the wrong endpoint or account?)"
                ) from e
            if isinstance(e, FileNotFoundError) or not self.exists(path):
                raise self._mismatch(path, shard, shard.sha256, None, None) from e
            raise StoreError(f"{describe(self.fs, path)}: read failed ({e})") from e
        if got != shard.bytes or extra:
            raise self._mismatch(path, shard, shard.sha256, got + extra, None)
        digest = h.hexdigest()
        if digest != shard.sha256:
            raise self._mismatch(path, shard, shard.sha256, got, digest)
        return buf

    def _mismatch(
        self,
        path: str,
        shard: ShardInfo | None,
        sha256: str,
        size: int | None,
        got: str | None,
    ) -> ShardVerificationError:
        """The error for an object of a committed version that is not what was recorded."""
        vdir, name = path.rsplit("/", 1)
        if shard is not None and path.endswith("/" + shard.path):
            vdir, name = path[: -len(shard.path) - 1], shard.path
        parts = vdir.rsplit("/", 3)
        asset, partition, version = parts[-3:] if len(parts) == 4 else ("?", "?", vdir)
        if size is None:
            found = "it is missing"
        elif shard is not None and size > shard.bytes:
            found = f"it has more than the recorded {shard.bytes} bytes"
        elif shard is not None and size != shard.bytes:
            found = f"it has {size} bytes, not the recorded {shard.bytes}"
        else:
            found = f"its sha256 is {got}"
        where = "" if partition == UNPARTITIONED else f" [{partition}]"
        return ShardVerificationError(
            f"{self.uri_of(path)}: shard {name} of version {version} of {asset}{where} does not"
            f" match its manifest: {found}; the manifest records sha256 {sha256}. It changed"
            f" after it was committed, so no gate wrote these bytes: re-materialize {asset}"
            f"{where} (megacpp run rebuilds it) instead of reading it"
        )

    def _listed(self, path: str) -> tuple[str, ShardInfo] | None:
        """(version folder, manifest entry) when `path` is an object a committed asset
        version lists; None for anything else (markers, leases, versions being written)."""
        prefix = self.join("assets") + "/"
        if not path.startswith(prefix):
            return None
        parts = path[len(prefix) :].split("/", 3)
        if len(parts) < 4 or not is_version_name(parts[2]) or parts[3] in (MANIFEST, COMPLETE):
            return None
        vdir = path[: len(prefix) + len("/".join(parts[:3]))]
        try:
            manifest = self._manifests.get(vdir, lambda: self.read_manifest(vdir))
        except StoreError:
            return None
        for shard in manifest.all_shards():
            if shard.path == parts[3]:
                return vdir, shard
        return None

    def verify(
        self,
        manifest: Manifest,
        *,
        check_sha256: bool = True,
        mapper: Callable[..., Iterator[Any]] | None = None,
    ) -> list[str]:
        """Every problem with a version on disk, each naming the file; [] when it is sound.
        With `mapper` (an executor's map), the shards are read and hashed in its tasks, a
        batch of shards each."""
        vdir = self.version_dir(manifest)
        problems: list[str] = self._verify_manifest_bytes(vdir)
        checks = [
            (name, info.schema_fingerprint, shard)
            for name, info in manifest.tables.items()
            for shard in info.shards
        ]
        batches = [checks[i : i + _VERIFY_BATCH] for i in range(0, len(checks), _VERIFY_BATCH)]
        job = (self, vdir, check_sha256)
        verified = (
            mapper(_verify_shards, job, batches)
            if mapper is not None
            else (_verify_shards(job, b) for b in batches)
        )
        rows: dict[str, int] = {}
        for batch in verified:
            for name, n, found in batch:
                rows[name] = rows.get(name, 0) + n
                problems.extend(found)
        for name, info in manifest.tables.items():
            total = rows.get(name, 0)
            if total != info.rows and not any(p.startswith(vdir) for p in problems):
                problems.append(f"{vdir}: table {name!r} has {total} rows, manifest {info.rows}")
        for f in manifest.files:
            problems.extend(self._verify_file(f"{vdir}/{f.path}", f, check_sha256))
        problems.extend(self._verify_holders(manifest))
        return problems

    def _verify_holders(self, manifest: Manifest, check_sha256: bool = False) -> list[str]:
        """The shards of other versions that hold text this version's rows name: each there
        at its recorded size (its sha256 is checked whenever the text is read, and here with
        `check_sha256`)."""
        held = {(h.dir, h.path): h for s in manifest.all_shards() for h in s.text_from or []}
        problems: list[str] = []
        for h in held.values():
            path = f"{self.join(h.dir)}/{h.path}"
            if check_sha256 and (path, h.sha256) in self._hashed_holders:
                continue  # every stage after it holds text there too: hashed once a run
            found = self._verify_file(path, h.shard(), check_sha256)
            if check_sha256 and not found:
                self._hashed_holders.add((path, h.sha256))
            problems.extend(f"{p} (it holds text of {self.version_dir(manifest)})" for p in found)
        return problems

    def _verify_shard(
        self, vdir: str, name: str, fingerprint: str, shard: ShardInfo, check_sha256: bool
    ) -> tuple[int, list[str]]:
        """(rows parquet holds, problems) of one listed shard."""
        path = f"{vdir}/{shard.path}"
        problems = self._verify_file(path, shard, check_sha256)
        try:
            meta = pq.read_metadata(path, filesystem=self.fs)
            schema = meta.schema.to_arrow_schema()
        except (OSError, pa.ArrowInvalid) as e:
            return 0, [*problems, f"{path}: not readable parquet ({e})"]
        if meta.num_rows != shard.rows:
            problems.append(f"{path}: {meta.num_rows} rows, manifest says {shard.rows}")
        if schema_fingerprint(schema) != fingerprint:
            problems.append(f"{path}: schema differs from the manifest's table {name!r}")
        return meta.num_rows, problems

    def verify_reused(self, manifest: Manifest, mapper: Mapper | None = None) -> list[str]:
        """`verify_objects`, and the sha256 of every shard of another version that holds
        text it names: a version that stands instead of being computed again is read by
        nobody in that run, so nothing else would check the text it keeps by reference."""
        return self.verify_objects(manifest, mapper) or self._verify_holders(manifest, True)

    def verify_objects(self, manifest: Manifest, mapper: Mapper | None = None) -> list[str]:
        """Every object the version lists that is missing, of another size or another
        sha256 than recorded (one listing, then a streaming hash of each object whose size
        is right: by tasks of `mapper` when those hold more than HASH_IN_TASKS_BYTES); []
        when its bytes are exactly what was committed."""
        vdir = self.version_dir(manifest)
        try:
            infos = self.fs.get_file_info(
                pafs.FileSelector(vdir, recursive=True, allow_not_found=True)
            )
        except OSError as e:
            raise StoreError(f"{describe(self.fs, vdir)}: list failed ({e})") from e
        sizes = {i.path[len(vdir) + 1 :]: i.size for i in infos}
        # the manifest itself first: shards that match an edited manifest prove nothing
        problems = self._verify_manifest_bytes(vdir)
        if problems:
            return problems
        shards = manifest.all_shards()
        whole = [s for s in shards if sizes.get(s.path) == s.bytes]
        digests = dict(
            zip([s.path for s in whole], self._sha256s(vdir, whole, mapper), strict=True)
        )
        for shard in shards:
            path = f"{vdir}/{shard.path}"
            size = sizes.get(shard.path)
            if size is None:
                problems.append(f"{self.uri_of(path)}: missing")
            elif size != shard.bytes:
                problems.append(f"{self.uri_of(path)}: {size} bytes, manifest says {shard.bytes}")
            elif (got := digests[shard.path]) != shard.sha256:
                problems.append(
                    f"{self.uri_of(path)}: sha256 {got[:12]}..., manifest says {shard.sha256}"
                )
        return problems

    def _sha256s(self, vdir: str, shards: list[ShardInfo], mapper: Mapper | None) -> list[str]:
        """The sha256 of each shard's object, in order; by tasks of `mapper`, a batch of
        about HASH_IN_TASKS_BYTES each, when they hold more than one batch."""
        paths = [f"{vdir}/{s.path}" for s in shards]
        if mapper is None or sum(s.bytes for s in shards) <= HASH_IN_TASKS_BYTES:
            return [self.sha256_of(p) for p in paths]
        batches: list[list[str]] = [[]]
        held = 0
        for path, shard in zip(paths, shards, strict=True):
            if batches[-1] and held + shard.bytes > HASH_IN_TASKS_BYTES:
                batches.append([])
                held = 0
            batches[-1].append(path)
            held += shard.bytes
        return [d for batch in mapper(_sha256_batch, self.fs, batches) for d in batch]

    def verify_manifest_bytes(self, vdir: str) -> list[str]:
        """`_verify_manifest_bytes`: the manifest against the sha256 its `_COMPLETE` records."""
        return self._verify_manifest_bytes(vdir)

    def _verify_manifest_bytes(self, vdir: str) -> list[str]:
        """The manifest's sha256 against the one `_COMPLETE` recorded, and the marker's
        version id against the folder's name. A marker that records no sha256 (the earliest
        versions wrote only the id) cannot vouch for its manifest: it is a problem too, so
        such a version is computed again rather than trusted."""
        try:
            marker = self.read_bytes(f"{vdir}/{COMPLETE}")
            recorded = recorded_manifest_sha256(marker)
            actual = hashlib.sha256(self.read_bytes(f"{vdir}/{MANIFEST}")).hexdigest()
            named = marker.decode().split()[:1]
        except (StoreError, UnicodeDecodeError) as e:
            return [f"{vdir}/{MANIFEST}: cannot check against {COMPLETE} ({e})"]
        if named != [vdir.rstrip("/").rsplit("/", 1)[-1]]:
            return [f"{vdir}/{COMPLETE}: names version {named[0] if named else '(none)'!r}"]
        if recorded is None:
            return [f"{vdir}/{COMPLETE}: records no manifest sha256 (an older marker)"]
        if recorded != actual:
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


@dataclass(frozen=True)
class WrittenSchema:
    """What parquet holds of a shard's schema, as a worker reports it to the writer that
    adopts the shard: its column names and fingerprint (a pa.Schema does not survive
    pickling whole: a fixed-size list's element name is lost, and with it the fingerprint)."""

    names: tuple[str, ...]
    fingerprint: str

    @classmethod
    def of(cls, schema: pa.Schema) -> WrittenSchema:
        return cls(tuple(schema.names), schema_fingerprint(schema))


# shards a verifying task reads and hashes
_VERIFY_BATCH = 8


def _verify_shards(
    job: tuple[ShardStore, str, bool], batch: list[tuple[str, str, ShardInfo]]
) -> list[tuple[str, int, list[str]]]:
    store, vdir, check_sha256 = job
    out = []
    for name, fingerprint, shard in batch:
        n, problems = store._verify_shard(vdir, name, fingerprint, shard, check_sha256)
        out.append((name, n, problems))
    return out


class ShardUploader:
    """Puts objects into one version's folder at their final names and reads each back. The
    committing writer uses one, and so may a worker on another host that writes shards of
    the same version for the writer to adopt (it holds no lease: the writer's covers it)."""

    def __init__(self, store: ShardStore, vdir: str) -> None:
        self.store = store
        self.dir = vdir
        self._made_dirs: set[str] = set()  # a worker's folder may not exist yet

    def _ensure_parent(self, path: str) -> None:
        parent = path.rsplit("/", 1)[0]
        if self.store._dirs and parent not in self._made_dirs:
            self.store.fs.create_dir(parent, recursive=True)
            self._made_dirs.add(parent)

    def upload(self, final: str, data: pa.Buffer | bytes) -> tuple[int, str]:
        """Put `data` at its final name, then read it back: the store must hold exactly
        these bytes (size and sha256) before anything lists them."""
        want = hashlib.sha256(data).hexdigest()
        fs = self.store.fs
        try:
            self._ensure_parent(final)
            with fs.open_output_stream(final) as f:
                f.write(data)
            size = fs.get_file_info(final).size
            if size != len(data):
                raise StoreError(f"{final}: uploaded {len(data)} bytes, the store has {size}")
            got = self.store.sha256_of(final)
        except OSError as e:
            self.store._discard(final)
            raise StoreError(f"{describe(fs, final)}: write failed ({e})") from e
        if got != want:
            self.store._discard(final)
            raise StoreError(f"{final}: sha256 read back differs from the bytes written")
        return len(data), want

    def write_parquet(
        self, relpath: str, table: pa.Table, **kwargs: Any
    ) -> tuple[ShardInfo, WrittenSchema]:
        """Encode in memory, check the parquet metadata, upload to the final name, read
        back: a shard is listed only once the store holds exactly the checked bytes. Returns
        the shard and what parquet holds of its schema."""
        final = f"{self.dir}/{relpath}"
        options: dict[str, Any] = {**PARQUET_OPTIONS, "compression": self.store.compression}
        if table.num_rows:
            row_bytes = max(1, logical_bytes(table) // table.num_rows)
            options["row_group_size"] = max(1, ROW_GROUP_BYTES // row_bytes)
        options.update(kwargs)
        sink = pa.BufferOutputStream()
        pq.write_table(table, sink, **options)
        data = sink.getvalue()
        meta = pq.read_metadata(pa.BufferReader(data))
        if meta.num_rows != table.num_rows:
            raise StoreError(f"{final}: wrote {table.num_rows} rows, read back {meta.num_rows}")
        written = meta.schema.to_arrow_schema()
        if written.names != table.schema.names:
            raise StoreError(f"{final}: columns changed on the way to disk")
        size, sha = self.upload(final, data)
        shard = ShardInfo(path=relpath, rows=table.num_rows, bytes=size, sha256=sha)
        return shard, WrittenSchema.of(written)

    def write_kept(
        self, relpath: str, kept: pa.Table, source: pa.Table, places: TextPlaces, **kwargs: Any
    ) -> tuple[ShardInfo, WrittenSchema, TextPlaces]:
        """`write_parquet` for a gate's kept rows of `source` (whose text is held where
        `places` says): a row whose text is its input row's is written without it, naming
        where it is held (storage/text_refs.py). Also returns where the kept rows' text is
        held now, for a gate after this one."""
        if TEXT not in kept.column_names:
            shard, written = self.write_parquet(relpath, kept, **kwargs)
            return shard, written, TextPlaces.nowhere(kept.num_rows)
        out, holders, at = text_refs.by_reference(kept, source, places)
        shard, written = self.write_parquet(relpath, out, **kwargs)
        shard.text_from = holders
        shard.held_bytes = text_refs.held_bytes(holders, at)
        me = TextHolder.of(self.store.relative(self.dir), shard)
        return shard, written, text_refs.after_write(holders, at, me)


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
        table = conform(table, self.schema, f"{self.version.manifest.asset}: table {self.name!r}")
        store = self.version.store
        start = 0
        row_bytes = max(1, logical_bytes(table) // table.num_rows)
        while start < table.num_rows:
            room_bytes = max(0, store.max_bytes_per_shard - self._pending_bytes)
            room = max(
                1, min(store.max_rows_per_shard - self._pending_rows, room_bytes // row_bytes)
            )
            piece = table.slice(start, room)
            self._pending.append(piece)
            self._pending_rows += piece.num_rows
            self._pending_bytes += logical_bytes(piece)
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
        prefix = "part" if self.name == layout.DATA else self.name.replace(":", "-")
        shard = self.version.write_parquet(f"{prefix}-{index:05d}.parquet", table)
        if not self.info.shards and self.version.last_schema is not None:
            # the contract is what parquet holds: fingerprint the schema read back from disk
            self.info.schema_fingerprint = self.version.last_schema.fingerprint
        self.info.shards.append(shard)
        self.info.rows += shard.rows

    def adopt(self, shard: ShardInfo, written: WrittenSchema) -> None:
        """List a shard a worker already put into this version (ShardUploader), after what
        this writer wrote so far: the caller adopts in input order."""
        self.flush()
        names = [*self.schema.names, *([TEXT_AT] if shard.text_from is not None else [])]
        if list(written.names) != names:
            raise StoreError(
                f"{self.version.dir}/{shard.path}: columns {list(written.names)} are not table "
                f"{self.name!r}'s {self.schema.names}"
            )
        if not self.info.shards:
            self.info.schema_fingerprint = written.fingerprint
        self.info.shards.append(shard)
        self.info.rows += shard.rows

    def close(self) -> TableInfo:
        self.flush()
        return self.info


def conform(table: pa.Table, schema: pa.Schema, what: str) -> pa.Table:
    """`table` with exactly `schema`'s columns and types, or a StoreError naming `what`."""
    if table.schema == schema:
        return table
    try:
        return table.select(schema.names).cast(schema)
    except (KeyError, pa.ArrowInvalid, ValueError) as e:
        raise StoreError(f"{what} does not match its declared schema ({e})") from e


class VersionWriter:
    """One new version of one asset partition; invisible to readers until `commit()`."""

    def __init__(
        self, store: ShardStore, manifest: Manifest, vdir: str, keeper: LeaseKeeper
    ) -> None:
        self.store = store
        self.manifest = manifest
        self.dir = vdir
        self.lease = keeper
        self._writers: dict[str, TableWriter] = {}
        self.uploader = ShardUploader(store, vdir)
        self.last_schema: WrittenSchema | None = None
        self.closed = False
        # called with the manifest just before it is written (its tables, stats and extra in)
        self.before_commit: Callable[[Manifest], None] | None = None
        # a writer dropped without commit or abort (its gate raised) stops beating, so its
        # version expires after the TTL like a dead process's
        weakref.finalize(self, keeper.stop)

    def __enter__(self) -> VersionWriter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is not None and not self.closed:
            self.abort()

    def table(self, name: str, schema: pa.Schema) -> TableWriter:
        if name not in self._writers:
            self._writers[name] = TableWriter(self, name, schema)
        return self._writers[name]

    def _check_lease(self) -> None:
        try:
            self.lease.check()
        except LeaseLostError as e:
            raise StoreError(f"{self.dir}: {e}") from e

    def write_parquet(self, relpath: str, table: pa.Table, **kwargs: Any) -> ShardInfo:
        """Encode in memory, check the parquet metadata, upload to the final name, read
        back: a shard is listed only once the store holds exactly the checked bytes."""
        self._check_lease()
        shard, self.last_schema = self.uploader.write_parquet(relpath, table, **kwargs)
        return shard

    def write_file(self, relpath: str, data: bytes) -> ShardInfo:
        """A non-parquet artifact of this version, listed in the manifest's `files`."""
        self._check_lease()
        size, sha = self.uploader.upload(f"{self.dir}/{relpath}", data)
        info = ShardInfo(path=relpath, rows=0, bytes=size, sha256=sha)
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
        """Close every table; confirm the lease and that every listed object is in the
        store; write the manifest, then `_COMPLETE` (the commit point), then move `LATEST`
        forward, then drop the lease."""
        for name, writer in self._writers.items():
            self.manifest.tables[name] = writer.close()
        if upstream:
            self.manifest.upstream.update(upstream)
        if stats:
            self.manifest.stats.update({k: float(v) for k, v in stats.items()})
        if extra:
            self.manifest.extra.update(extra)
        if self.before_commit is not None:
            self.before_commit(self.manifest)
        store, version = self.store, self.manifest.version
        try:
            self.lease.confirm()
        except LeaseLostError as e:
            raise StoreError(f"{self.dir}: not committed: {e}") from e
        missing = self._missing_objects()
        if missing:
            raise StoreError(
                f"{self.dir}: not committed: {missing[0]} (and {len(missing) - 1} more)"
            )
        store.hold_text(self.dir, self.manifest)
        raw = self.manifest.model_dump_json(indent=2).encode()
        store.put_bytes(f"{self.dir}/{MANIFEST}", raw, atomic=False)  # not trusted yet
        # the marker holds the manifest's sha256, so a changed manifest byte is caught too
        store.put_bytes(f"{self.dir}/{COMPLETE}", complete_marker(version, raw), owner=version)
        self.closed = True
        pdir = store.partition_dir(self.manifest.asset, self.manifest.partition)
        if self._latest_is_older(pdir):
            store.put_bytes(f"{pdir}/{LATEST}", version.encode(), owner=version)
        store._discard(f"{pdir}/{lease_name(version)}")
        store._prune_old_versions(pdir)
        return self.manifest

    def _missing_objects(self) -> list[str]:
        """Every object the manifest will list that the store does not hold at its size
        (one listing): a cleaner that wrongly removed this version is caught here."""
        try:
            infos = self.store.fs.get_file_info(
                pafs.FileSelector(self.dir, recursive=True, allow_not_found=True)
            )
        except OSError as e:
            return [f"{self.dir}: cannot list ({e})"]
        sizes = {i.path[len(self.dir) + 1 :]: i.size for i in infos}
        return [
            f"{self.dir}/{s.path}: missing or not {s.bytes} bytes"
            for s in self.manifest.all_shards()
            if sizes.get(s.path) != s.bytes
        ]

    def _latest_is_older(self, pdir: str) -> bool:
        """Whether `LATEST` should move to this version: never back past a newer complete
        version another writer of this partition committed meanwhile."""
        try:
            current = self.store.read_bytes_if_exists(f"{pdir}/{LATEST}")
        except OSError:
            return True
        if current is None:
            return True
        named = current.decode(errors="replace").strip()
        if named <= self.manifest.version or not is_version_name(named):
            return True
        return not self.store.exists(f"{pdir}/{named}/{COMPLETE}")

    def abort(self) -> None:
        """Drop this version's files and its lease; used when the gate itself failed."""
        self.lease.stop()
        self.closed = True
        self.store._delete_dir(self.dir)
        pdir = self.store.partition_dir(self.manifest.asset, self.manifest.partition)
        self.store._discard(f"{pdir}/{lease_name(self.manifest.version)}")
