"""Static-shape reader of a promoted snapshot's packed rows (DESIGN section 6, issue 8).

Decides what a trainer sees per step: a seeded row-group order, disjoint per-rank slices of
each global batch, a block of batches built ahead while the trainer is busy, and a staged
receipt per batch. Seed rule: the fixed-length row is the performance contract, and parquet
decoding alone cannot keep up, so each row group is decoded once into an uncompressed Arrow
IPC file and every batch after that is a slice of it, memory-mapped.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import itertools
import json
import os
import tempfile
import threading
import time
import weakref
from collections import OrderedDict, deque
from collections.abc import Generator, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from pydantic import BaseModel, ConfigDict

from megacpp_pipeline.snapshot.packed_rows import (
    OPTIONAL_TOKEN_COLUMNS,
    PACKED_SCHEMA_VERSION,
    REQUIRED_COLUMNS,
    packed_rows_schema,
)

COMPLETE_MARKER = "_COMPLETE"
MANIFEST_NAME = "manifest.json"
CACHE_FORMAT = "rg-ipc-v1"  # bump when the cache layout changes; old entries are then ignored
_OPEN_ROW_GROUPS = 512  # memory maps kept open at once (each holds a file descriptor)
# Batches are built and handed over in blocks: one hand-off between threads costs two
# thread switches (tens of microseconds), as much as building a whole 8 x 2048 batch. A
# block holds up to _BLOCK_BYTES of batches (at most _BLOCK_BATCHES): larger blocks keep more
# freshly written memory alive at once, and copying into memory that is no longer in the
# CPU cache costs more than the hand-offs saved. Blocks start at one batch and double, so
# the first batch of a pass is not held back.
_BLOCK_BYTES = 512 << 10
_BLOCK_BATCHES = 64
_CONSUMER_AWAY_S = 0.001  # a consumer gone this long is busy with a step: see _Prefetcher
_CHUNK_BATCHES = 4096  # batches laid out per numpy pass: bounds the plain lists on long epochs


class LoaderError(Exception):
    """Base of every error the loader raises on purpose."""


class SnapshotIncompleteError(LoaderError):
    def __init__(self, snapshot_dir: Path, missing: str) -> None:
        super().__init__(f"{snapshot_dir}: not a promoted snapshot ({missing} is missing)")
        self.snapshot_dir = snapshot_dir
        self.missing = missing


class SnapshotManifestError(LoaderError):
    def __init__(self, manifest: Path, field: str, rule: str) -> None:
        super().__init__(f"{manifest}: field {field!r}: {rule}")
        self.manifest = manifest
        self.field = field
        self.rule = rule


class ShardChecksumError(LoaderError):
    def __init__(self, shard: str, expected: str | None, actual: str) -> None:
        super().__init__(f"{shard}: sha256 {actual} does not match the manifest's {expected}")
        self.shard = shard
        self.expected = expected
        self.actual = actual


class ShardSchemaError(LoaderError):
    def __init__(self, shard: str, column: str, rule: str) -> None:
        super().__init__(f"{shard}: column {column!r}: {rule}")
        self.shard = shard
        self.column = column
        self.rule = rule


class LoaderConfigError(LoaderError):
    def __init__(self, field: str, rule: str) -> None:
        super().__init__(f"loader option {field!r}: {rule}")
        self.field = field
        self.rule = rule


class LoaderStateError(LoaderError):
    def __init__(self, field: str, expected: object, found: object) -> None:
        super().__init__(f"state_dict field {field!r} is {found!r}, this loader has {expected!r}")
        self.field = field
        self.expected = expected
        self.found = found


@dataclass(slots=True)
class BatchReceipt:
    """Where one batch's time went. Every stage is its own field; nothing is lumped.

    A slotted dataclass, not a pydantic model; the hot path does not even build these: it
    keeps each block's timings as columns (`_Block`), and `PackedRowsLoader.receipts` turns
    the delivered batches into receipts when asked. The summary that leaves the loader
    (`ReceiptSummary`) is the pydantic edge.
    """

    epoch: int
    batch_index: int
    rank: int
    shape: tuple[int, int]  # (rows, seq_len) of every token column
    row_groups: int  # row groups the batch was cut from
    read_s: float  # open the cached IPC row groups, zero-copy numpy views
    decode_s: float  # parquet -> uncompressed Arrow IPC, only on a cache miss
    normalize_s: float  # defaults for missing optional columns
    stage_s: float  # copy into owned contiguous arrays (and tensors when asked)
    # the trainer's stall in next() for this batch: waiting for the prefetch thread, or
    # building the block itself when none was ready; 0 without prefetch (all of it is stages)
    queue_wait_s: float
    cache_misses: int
    defaulted_columns: tuple[str, ...]

    def model_dump(self) -> dict[str, Any]:
        """Same spelling as the pydantic models, so callers treat every receipt alike."""
        return dataclasses.asdict(self)


_TIMED_FIELDS = ("read_s", "decode_s", "normalize_s", "stage_s", "queue_wait_s")


class StageSummary(BaseModel):
    model_config = ConfigDict(extra="forbid")

    total_s: float
    mean_ms: float
    p50_ms: float
    p95_ms: float
    max_ms: float


class ReceiptSummary(BaseModel):
    model_config = ConfigDict(extra="forbid")

    batches: int
    rows: int
    tokens: int
    shapes: list[tuple[int, int]]  # distinct batch shapes seen; one entry = static shapes
    cache_misses: int
    stages: dict[str, StageSummary]

    def to_markdown(self) -> str:
        lines = [
            f"batches {self.batches}, rows {self.rows}, tokens {self.tokens}, "
            f"shapes {self.shapes}, cache misses {self.cache_misses}",
            "",
            "| stage | total s | mean ms | p50 ms | p95 ms | max ms |",
            "|---|---|---|---|---|---|",
        ]
        for name, s in self.stages.items():
            lines.append(
                f"| {name.removesuffix('_s')} | {s.total_s:.3f} | {s.mean_ms:.3f} | "
                f"{s.p50_ms:.3f} | {s.p95_ms:.3f} | {s.max_ms:.3f} |"
            )
        return "\n".join(lines)


def summarize_receipts(receipts: Sequence[BatchReceipt]) -> ReceiptSummary:
    stages = {}
    for name in _TIMED_FIELDS:
        values = np.array([getattr(r, name) for r in receipts], dtype=np.float64)
        if not len(values):
            values = np.zeros(1)
        stages[name] = StageSummary(
            total_s=float(values.sum()),
            mean_ms=float(values.mean() * 1e3),
            p50_ms=float(np.percentile(values, 50) * 1e3),
            p95_ms=float(np.percentile(values, 95) * 1e3),
            max_ms=float(values.max() * 1e3),
        )
    return ReceiptSummary(
        batches=len(receipts),
        rows=sum(r.shape[0] for r in receipts),
        tokens=sum(r.shape[0] * r.shape[1] for r in receipts),
        shapes=sorted({r.shape for r in receipts}),
        cache_misses=sum(r.cache_misses for r in receipts),
        stages=stages,
    )


def read_snapshot_manifest(snapshot_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """The manifest of a promoted snapshot; refuses a directory without `_COMPLETE`."""
    root = Path(snapshot_dir)
    if not (root / COMPLETE_MARKER).is_file():
        raise SnapshotIncompleteError(root, COMPLETE_MARKER)
    manifest_path = root / MANIFEST_NAME
    if not manifest_path.is_file():
        raise SnapshotIncompleteError(root, MANIFEST_NAME)
    try:
        manifest = json.loads(manifest_path.read_text())
    except json.JSONDecodeError as exc:
        raise SnapshotManifestError(manifest_path, "<document>", f"not JSON: {exc}") from exc
    for key, kind in (("seq_len", int), ("splits", dict), ("files", list)):
        if not isinstance(manifest.get(key), kind):
            raise SnapshotManifestError(manifest_path, key, f"missing or not a {kind.__name__}")
    return dict(manifest)


def split_shards(manifest: dict[str, Any], split: str, snapshot_dir: Path) -> list[str]:
    """The split's shard paths from the manifest, each checked to stay inside the snapshot."""
    manifest_path = snapshot_dir / MANIFEST_NAME
    splits = manifest["splits"]
    if split not in splits:
        raise SnapshotManifestError(
            manifest_path, f"splits.{split}", f"no such split (has {sorted(splits)})"
        )
    shards = splits[split].get("shards")
    if not isinstance(shards, list) or not all(isinstance(s, str) for s in shards):
        raise SnapshotManifestError(manifest_path, f"splits.{split}.shards", "not a list of paths")
    root = snapshot_dir.resolve()
    for relpath in shards:
        if not (root / relpath).resolve().is_relative_to(root):
            raise SnapshotManifestError(manifest_path, relpath, "shard path leaves the snapshot")
    return list(shards)


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while block := handle.read(1 << 22):
            digest.update(block)
    return digest.hexdigest()


def verify_files_sha256(snapshot_dir: Path, manifest: dict[str, Any], paths: Sequence[str]) -> None:
    """Each path's bytes hash to what the manifest's `files` list says, or ShardChecksumError."""
    listed = {entry.get("path"): entry for entry in manifest["files"] if isinstance(entry, dict)}
    for relpath in paths:
        expected = listed.get(relpath, {}).get("sha256")
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


def default_cache_dir() -> Path:
    user = os.getuid() if hasattr(os, "getuid") else os.getlogin()
    return Path(tempfile.gettempdir()) / f"megacpp-rowgroup-cache-{user}"


@dataclass(frozen=True)
class _Shard:
    relpath: str
    path: Path
    sha256: str
    columns: tuple[str, ...]  # schema-known columns present in the shard
    row_group_rows: tuple[int, ...]


class RowGroupCache:
    """Row groups decoded once into uncompressed Arrow IPC files, read back memory-mapped.

    Keyed by the shard's sha256 from the manifest, so every loader, rank and run reading the
    same bytes shares one entry; files are written to a temporary name and renamed into
    place, so a concurrent reader never sees half a file.
    """

    def __init__(self, cache_dir: Path, seq_len: int) -> None:
        self.cache_dir = cache_dir
        self.seq_len = seq_len
        self.decoded = 0  # row groups this process decoded (foreground and look-ahead)
        self.decode_s = 0.0
        self._open: OrderedDict[tuple[str, int], dict[str, np.ndarray]] = OrderedDict()
        self._lock = threading.Lock()
        self._decoding: dict[Path, threading.Event] = {}

    def entry_path(self, shard: _Shard, row_group: int) -> Path:
        return self.cache_dir / CACHE_FORMAT / shard.sha256 / f"rg-{row_group:05d}.arrow"

    def ensure(self, shard: _Shard, row_group: int) -> tuple[float, bool]:
        """Decode the row group unless it is cached; seconds spent (or waited), was it missing?

        Safe from several threads: one decodes, the others wait for it.
        """
        path = self.entry_path(shard, row_group)
        if path.is_file():
            return 0.0, False
        with self._lock:
            event = self._decoding.get(path)
            owner = event is None
            if event is None:
                event = self._decoding[path] = threading.Event()
        started = time.perf_counter()
        if owner:
            try:
                self._decode(shard, row_group, path)
            finally:
                with self._lock:
                    del self._decoding[path]
                event.set()
        else:
            event.wait()
        return time.perf_counter() - started, True

    def is_open(self, shard: _Shard, row_group: int) -> bool:
        """Is the row group mapped in this process already (no decode, no file check needed)?"""
        with self._lock:
            return (shard.sha256, row_group) in self._open

    def all_open(self, keys: Sequence[tuple[str, int]]) -> bool:
        """Are all these (shard sha256, row group) mapped already?"""
        with self._lock:
            return all(key in self._open for key in keys)

    def views(self, shard: _Shard, row_group: int) -> tuple[dict[str, np.ndarray], float, bool]:
        """numpy views of one row group's columns, seconds spent decoding, cache miss?"""
        key = (shard.sha256, row_group)
        with self._lock:
            cached = self._open.get(key)
            if cached is not None:
                self._open.move_to_end(key)
                return cached, 0.0, False
        decode_s, miss = self.ensure(shard, row_group)
        path = self.entry_path(shard, row_group)
        batch = self._map(path)
        if batch is None or tuple(batch.schema.names) != shard.columns:
            started = time.perf_counter()
            self._decode(shard, row_group, path)  # stale, foreign or failed entry: rebuild it
            decode_s, miss = decode_s + time.perf_counter() - started, True
            batch = self._map(path)
            assert batch is not None
        if batch.num_rows != shard.row_group_rows[row_group]:
            raise ShardSchemaError(
                shard.relpath,
                "<row group>",
                f"row group {row_group} has {batch.num_rows} rows in the cache, "
                f"{shard.row_group_rows[row_group]} in the shard",
            )
        views = {
            name: self._numpy(shard, name, batch.column(i))
            for i, name in enumerate(batch.schema.names)
        }
        with self._lock:
            self._open[key] = views
            if len(self._open) > _OPEN_ROW_GROUPS:
                self._open.popitem(last=False)
        return views, decode_s, miss

    def close(self) -> None:
        with self._lock:
            self._open.clear()

    @staticmethod
    def _map(path: Path) -> pa.RecordBatch | None:
        try:
            reader = pa.ipc.open_file(pa.memory_map(str(path), "r"))
            if reader.num_record_batches != 1:
                return None
            return reader.get_batch(0)
        except (pa.ArrowInvalid, OSError):  # truncated or foreign file: the caller rebuilds
            return None

    def _decode(self, shard: _Shard, row_group: int, path: Path) -> None:
        started = time.perf_counter()
        table = pq.ParquetFile(shard.path, memory_map=True).read_row_group(
            row_group, columns=list(shard.columns)
        )
        batch = table.combine_chunks().to_batches()
        record = batch[0] if batch else pa.RecordBatch.from_pylist([], schema=table.schema)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        try:
            with (
                pa.OSFile(str(tmp), "wb") as sink,
                pa.ipc.new_file(sink, record.schema) as writer,
            ):
                writer.write_batch(record)
            os.replace(tmp, path)
            with self._lock:
                self.decoded += 1
                self.decode_s += time.perf_counter() - started
        finally:
            tmp.unlink(missing_ok=True)

    def _numpy(self, shard: _Shard, name: str, column: pa.Array) -> np.ndarray:
        if column.null_count:
            raise ShardSchemaError(shard.relpath, name, f"{column.null_count} null values")
        if isinstance(column, pa.FixedSizeListArray):
            values = column.values.slice(column.offset * self.seq_len, len(column) * self.seq_len)
            return values.to_numpy(zero_copy_only=True).reshape(-1, self.seq_len)
        return column.to_numpy(zero_copy_only=True)


def _layout(column: pa.DataType, seq_len: int) -> tuple[np.dtype[Any], tuple[int, ...]]:
    """numpy dtype and per-row shape of a packed-row column."""
    if pa.types.is_fixed_size_list(column):
        return np.dtype(column.value_type.to_pandas_dtype()), (seq_len,)
    return np.dtype(column.to_pandas_dtype()), ()


@dataclass(frozen=True)
class _EpochPlan:
    """This rank's batches of one epoch as row ranges of the shuffled row-group stream."""

    epoch: int
    first_batch: int
    order: np.ndarray  # plan position -> row-group unit
    offsets: np.ndarray  # first stream row of each plan position, plus the total
    starts: np.ndarray  # per batch: first stream row
    stops: np.ndarray
    first_unit: np.ndarray  # per batch: plan positions it spans
    last_unit: np.ndarray


def _within(counts: np.ndarray) -> np.ndarray:
    """0, 1, ..., count - 1 for each count, concatenated."""
    return np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts)


def _block_edges(batches: int, largest: int) -> np.ndarray:
    """First batch of every block, plus the end: blocks of 1, 2, 4, ... then `largest`."""
    ramp = [0]
    while ramp[-1] < batches and 1 << (len(ramp) - 1) < largest:
        ramp.append(ramp[-1] + (1 << (len(ramp) - 1)))
    rest = np.arange(ramp[-1] + largest, batches, largest)
    return np.unique(np.minimum(np.concatenate([ramp, rest, [batches]]), batches))


@dataclass(slots=True)
class _Layout:
    """Where the rows of a stretch of blocks come from, as plain lists: the producer's inner
    loop reads them once per batch. A run is the rows of one batch inside one row group; a
    batch is one run unless it straddles row groups."""

    first_batch: int  # counted from the plan's first batch
    block_edges: list[int]  # first batch of each block (from first_batch), plus the end
    batch_runs: list[int]  # first run of each batch, plus the end
    batch_plain: list[bool]  # one run and no defaulted column: a slice of one row group
    batch_rows: list[int]
    batch_row_groups: list[int]
    batch_defaulted: list[tuple[str, ...]] | None  # None: no batch has a defaulted column
    run_unit: list[int]  # plan position the run reads
    run_shard: list[int]
    run_group: list[int]
    run_lo: list[int]  # rows lo..hi of that row group
    run_hi: list[int]
    run_row: list[int]  # the batch row it starts at


@dataclass(slots=True, eq=False)
class _Block:
    """Consecutive batches handed to the consumer at once, with their timings as columns
    (one entry per batch, never an object per batch). `delivered` counts the batches the
    consumer has taken, so receipts and the resume position only ever describe batches a
    trainer actually received."""

    epoch: int
    first_batch: int
    rows: list[int]
    row_groups: list[int]
    read_s: list[float]
    decode_s: list[float]
    normalize_s: list[float]
    stage_s: list[float]
    cache_misses: list[int]
    defaulted: list[tuple[str, ...]] | None
    queue_wait_s: float = 0.0  # the consumer's wait, charged to the block's first batch
    delivered: int = 0


_END = object()
_Item = Any  # tuple[list[batch], _Block], _END or _ProducerFailure
_Blocks = Generator[tuple[list[Any], _Block], None, None]


class _ProducerFailure:
    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


class _Prefetcher:
    """Blocks in order, built ahead by a background thread while the consumer is busy, or
    by the consumer itself when none is ready and the thread is not in the middle of one.

    Building a block is mostly Python, which holds the GIL, so a consumer that comes
    straight back for more gains nothing from a thread: sleeping and being woken by it costs
    two thread switches, as much as building a small block. So the thread starts only once
    the consumer has stayed away (a training step, which is what prefetch is for), and
    then keeps `depth` blocks ready; a consumer that finds none ready and the thread idle
    builds the next one itself.
    Order: only the holder of `_building` advances the generator, and the thread files its
    block in `_ready` before letting go, so a block the consumer builds is always the next.
    """

    def __init__(self, blocks: _Blocks, depth: int, name: str) -> None:
        self._blocks = blocks
        self._depth = depth
        # started by the first `get` after the consumer stayed away
        self._thread = threading.Thread(target=self.run_producer, name=name, daemon=True)
        self._ready: deque[_Item] = deque()
        self._building = threading.Lock()
        self._changed = threading.Condition()
        self._finished = False  # the generator ended or failed; nothing more to build
        self._consumer_seen = 0.0  # when the consumer last asked for a block
        self._away = 0  # consecutive asks after the consumer stayed away
        self.stop = threading.Event()

    def _advance(self) -> _Item:
        # only with `_building` held
        if self._finished:
            return _END
        try:
            return next(self._blocks)
        except StopIteration:
            self._finished = True
            return _END
        except BaseException:
            self._finished = True
            raise

    def get(self) -> _Item:
        """The next item: taken from `_ready`, built here, or waited for."""
        now = time.perf_counter()
        seen, self._consumer_seen = self._consumer_seen, now
        if self._thread.ident is None:
            # twice in a row: one long gap may just be this process losing its core
            self._away = self._away + 1 if seen and now - seen > _CONSUMER_AWAY_S else 0
            if self._away < 2:
                return self._advance()  # no other thread touches the generator yet
            self._thread.start()
        with self._changed:
            if self._ready:
                item = self._ready.popleft()
                self._changed.notify_all()
                return item
        if self._building.acquire(blocking=False):
            try:
                with self._changed:  # the thread may have filed one just before letting go
                    if self._ready:
                        item = self._ready.popleft()
                        self._changed.notify_all()
                        return item
                return self._advance()
            finally:
                self._building.release()
        with self._changed:
            while not self._ready:
                self._changed.wait()
            item = self._ready.popleft()
            self._changed.notify_all()
            return item

    def run_producer(self) -> None:
        """The background thread: keep `depth` blocks ready until the end or `stop`."""
        # The thread holds this object, never the consumer-side iterator, so dropping the
        # iterator lets its finalizer stop the thread.
        while not self.stop.is_set():
            with self._changed:
                while len(self._ready) >= self._depth and not self.stop.is_set():
                    self._changed.wait(0.05)
            # a consumer back within the grace builds the next block itself (see above)
            away = time.perf_counter() - self._consumer_seen
            if away < _CONSUMER_AWAY_S:
                if self.stop.wait(2 * _CONSUMER_AWAY_S - away):
                    return
                continue
            with self._building:
                if self._finished:
                    return
                try:
                    item = self._advance()
                except BaseException as exc:  # crosses to the consumer, which re-raises it
                    item = _ProducerFailure(exc)
                with self._changed:
                    self._ready.append(item)
                    self._changed.notify_all()

    def close(self, warmer: threading.Thread | None) -> None:
        self.stop.set()
        with self._changed:
            self._ready.clear()
            self._changed.notify_all()
        if threading.current_thread() is self._thread:
            return  # collected on the producer thread: it stops on its own, mid-block or not
        me = threading.current_thread()
        for thread in [t for t in (self._thread, warmer) if t is not None and t is not me]:
            if thread.ident is not None:  # started
                thread.join(timeout=10)
        if self._building.acquire(timeout=10):
            try:
                self._finished = True
                self._blocks.close()
            finally:
                self._building.release()


class _Progress:
    """The plan position the producer has reached, so the warmer stays a bounded way ahead."""

    def __init__(self) -> None:
        self.position = -1
        self.changed = threading.Condition()

    def advance(self, position: int) -> None:
        with self.changed:
            self.position = position
            self.changed.notify_all()


def _run_warmer(
    cache: RowGroupCache,
    targets: list[tuple[_Shard, int, int]],
    progress: _Progress,
    lookahead: int,
    stop: threading.Event,
) -> None:
    # Decoding happens in pyarrow with the GIL released, so on a cold cache the next row
    # groups are decoded on another core while the trainer works through the current one.
    targets = [t for t in targets if not cache.entry_path(t[0], t[1]).is_file()]
    for shard, group, position in targets:
        with progress.changed:
            while not stop.is_set() and position > progress.position + lookahead:
                progress.changed.wait(0.1)
        if stop.is_set():
            return
        try:
            cache.ensure(shard, group)
        except Exception:  # the producer meets the same error on its own path and reports it
            return


class _EpochIterator:
    """One pass over this rank's batches; counts what the consumer actually received."""

    def __init__(self, loader: PackedRowsLoader, epoch: int, start: int) -> None:
        self._loader = loader
        self._epoch = epoch
        plan = loader._plan_epoch(epoch, start)
        # On a warm loader every row group is already mapped: no warmer thread, no waking
        # it for each row group.
        targets = []
        if loader.prefetch and not loader.cache.all_open(loader._unit_keys):
            targets = [t for t in loader._warm_targets(plan) if not loader.cache.is_open(*t[:2])]
        progress = _Progress() if targets and loader.lookahead_row_groups > 0 else None
        blocks = loader._blocks(plan, progress)
        self._blocks: _Blocks | None = None
        self._prefetcher: _Prefetcher | None = None
        self._finalizer: weakref.finalize[Any, Any]
        # the block being handed out; an empty one until the first arrives
        self._batches: list[Any] = []
        self._block = _Block(epoch, start, [], [], [], [], [], [], [], None)
        self._at = 0
        if loader.prefetch:
            name = f"megacpp-loader-{loader.split}-rank{loader.rank}"
            self._prefetcher = prefetcher = _Prefetcher(blocks, depth=1, name=name)
            warmer = None
            if progress is not None:  # row groups to decode: start decoding ahead at once
                warmer = threading.Thread(
                    target=_run_warmer,
                    args=(
                        loader.cache,
                        targets,
                        progress,
                        loader.lookahead_row_groups,
                        prefetcher.stop,
                    ),
                    name=f"{name}-warmer",
                    daemon=True,
                )
                warmer.start()
            self._finalizer = weakref.finalize(self, prefetcher.close, warmer)
        else:
            self._blocks = blocks
            self._finalizer = weakref.finalize(self, blocks.close)
        self._done = False

    def __iter__(self) -> _EpochIterator:
        return self

    def __next__(self) -> dict[str, Any]:
        # the per-batch path: a list index and three counters
        at = self._at
        batches = self._batches
        if at < len(batches):
            batch = batches[at]
            batches[at] = None  # the trainer holds it now; the loader lets go
            self._at = self._block.delivered = at + 1
            self._loader.batch_index += 1
            return batch  # type: ignore[no-any-return]
        return self._next_block()

    def _next_block(self) -> dict[str, Any]:
        if self._done:
            raise StopIteration
        started = time.perf_counter()
        try:
            if self._prefetcher is not None:
                item = self._prefetcher.get()
            else:
                assert self._blocks is not None
                item = next(self._blocks, _END)
        except BaseException:  # raised while this thread built the block itself
            self.close()
            raise
        # the trainer's stall for this block, whether it waited for the thread or built it
        wait_s = time.perf_counter() - started if self._prefetcher is not None else 0.0
        if item is _END:
            self.close()
            self._loader._epoch_finished(self._epoch)
            raise StopIteration
        if isinstance(item, _ProducerFailure):
            self.close()
            raise item.exc  # keeps the producer's frames in its __traceback__
        self._batches, self._block = item
        self._block.queue_wait_s = wait_s
        self._at = 0
        self._loader._log_block(self._block)
        return self.__next__()

    def close(self) -> None:
        self._done = True
        self._batches = []
        self._finalizer()


class PackedRowsLoader:
    """Iterable over static-shape batches of one split of a promoted snapshot.

    Iterating once is one epoch; iterating again continues with the next epoch. Each batch
    is a dict column -> array: `[batch, seq_len]` for token columns, `[batch]` for per-row
    ones. Ranks cut disjoint slices out of each global batch of `batch_size * world_size`
    rows, so every rank takes the same number of steps (with `drop_last=False` the last
    batch may be short, and some ranks may have no last batch at all).

    Options the signature does not explain: `columns` restricts what each batch carries
    (all schema-known columns by default); `copy=False` hands out read-only views into the
    memory-mapped cache when a batch lies inside one row group (a copy otherwise);
    `cache_dir` holds the decoded row groups, shared by every loader and rank on the
    machine (default: a per-user directory under the system temp dir; nothing evicts it);
    `lookahead_row_groups` is how far ahead of the producer a second thread decodes on a
    cold cache; `receipt_history` bounds how many per-batch receipts are kept.

    With `prefetch`, batches are built in blocks (`_BLOCK_BYTES`) by a background thread
    while the trainer is busy with a step, one block ahead; a trainer that asks again at
    once (a benchmark loop) builds the next block itself, which is faster than waiting for
    a thread under the GIL. Either way the batches, their order and the resume position are
    the same; an error met while building surfaces at the batch where it happened, with the
    traceback of where it was raised.
    """

    def __init__(
        self,
        snapshot_dir: str | os.PathLike[str],
        split: str = "train",
        batch_size: int = 8,
        shuffle: bool = True,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
        drop_last: bool = True,
        verify_sha256: bool = False,
        prefetch: bool = True,
        to_torch: bool = False,
        cache_dir: str | os.PathLike[str] | None = None,
        columns: Sequence[str] | None = None,
        copy: bool = True,
        receipt_history: int = 10_000,
        lookahead_row_groups: int = 4,
    ) -> None:
        if batch_size < 1:
            raise LoaderConfigError("batch_size", "must be at least 1")
        if world_size < 1 or not 0 <= rank < world_size:
            raise LoaderConfigError("rank", f"need 0 <= rank < world_size, got {rank}/{world_size}")
        self.snapshot_dir = Path(snapshot_dir)
        self.manifest = read_snapshot_manifest(self.snapshot_dir)
        manifest_path = self.snapshot_dir / MANIFEST_NAME
        self.seq_len = int(self.manifest["seq_len"])
        self.split = split
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.seed = seed
        self.rank = rank
        self.world_size = world_size
        self.drop_last = drop_last
        self.prefetch = prefetch
        self.lookahead_row_groups = lookahead_row_groups  # decoded ahead on a cold cache
        self.copy = copy or to_torch  # tensors need owned, writable memory
        self._torch: Any = None
        self._pin = False
        if to_torch:
            try:
                self._torch = importlib.import_module("torch")
            except ImportError as exc:
                raise LoaderConfigError("to_torch", "torch is not installed") from exc
            self._pin = bool(self._torch.cuda.is_available())

        known = list(packed_rows_schema(self.seq_len).names)
        self.columns = tuple(columns) if columns is not None else tuple(known)
        for name in self.columns:
            if name not in known:
                raise LoaderConfigError("columns", f"{name!r} is not a packed-row column")
        self._defaults = {
            name: np.full(self.seq_len, default, dtype=dtype.to_pandas_dtype())
            for name, (dtype, default) in OPTIONAL_TOKEN_COLUMNS.items()
        }

        relpaths = split_shards(self.manifest, split, self.snapshot_dir)
        if verify_sha256:
            verify_files_sha256(self.snapshot_dir, self.manifest, relpaths)
        sha_by_path = {
            e.get("path"): e.get("sha256") for e in self.manifest["files"] if isinstance(e, dict)
        }
        shards = []
        for relpath in relpaths:
            path = self.snapshot_dir / relpath
            if not path.is_file():
                raise SnapshotManifestError(manifest_path, relpath, "listed shard does not exist")
            metadata = pq.ParquetFile(path).metadata
            present = check_packed_schema(relpath, metadata.schema.to_arrow_schema(), self.seq_len)
            sha256 = sha_by_path.get(relpath) or file_sha256(path)
            rows = tuple(metadata.row_group(i).num_rows for i in range(metadata.num_row_groups))
            shards.append(_Shard(relpath, path, sha256, tuple(present), rows))
        self._shards = shards
        # per shard: the requested columns it lacks, which then get their defaults
        self._defaulted = [
            tuple(name for name in self.columns if name not in shard.columns) for shard in shards
        ]
        unit_shard, unit_group, unit_rows = [], [], []
        for index, shard in enumerate(shards):
            for group, group_rows in enumerate(shard.row_group_rows):
                if group_rows:
                    unit_shard.append(index)
                    unit_group.append(group)
                    unit_rows.append(group_rows)
        self._unit_shard = np.array(unit_shard, dtype=np.int64)
        self._unit_group = np.array(unit_group, dtype=np.int64)
        self._unit_rows = np.array(unit_rows, dtype=np.int64)
        self._unit_keys = [
            (shards[shard].sha256, group)
            for shard, group in zip(unit_shard, unit_group, strict=True)
        ]
        self.total_rows = int(self._unit_rows.sum())

        self.cache = RowGroupCache(
            Path(cache_dir) if cache_dir is not None else default_cache_dir(), self.seq_len
        )
        schema = packed_rows_schema(self.seq_len)
        self._layouts = [_layout(schema.field(name).type, self.seq_len) for name in self.columns]
        row_bytes = sum(dtype.itemsize * int(np.prod(tail)) for dtype, tail in self._layouts)
        self._block_batches = max(
            1, min(_BLOCK_BATCHES, _BLOCK_BYTES // max(1, row_bytes * batch_size))
        )
        self.epoch = 0
        self.batch_index = 0  # batches of `epoch` already delivered to the consumer
        self.receipt_history = receipt_history
        # blocks the consumer has taken batches from, oldest first; `receipts` reads them
        self._receipt_blocks: deque[_Block] = deque()
        self._receipts_logged = 0  # delivered batches in every logged block but the last
        self._active: weakref.ReferenceType[_EpochIterator] | None = None

    # -- iteration ---------------------------------------------------------------------------

    def __len__(self) -> int:
        """Batches this rank receives per epoch."""
        global_batch = self.batch_size * self.world_size
        full, rest = divmod(self.total_rows, global_batch)
        if self.drop_last:
            return full
        return full + (1 if rest > self.rank * self.batch_size else 0)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        self._close_active()
        iterator = _EpochIterator(self, self.epoch, self.batch_index)
        self._active = weakref.ref(iterator)
        return iterator

    def set_epoch(self, epoch: int) -> None:
        self._close_active()
        self.epoch, self.batch_index = epoch, 0

    def row_group_order(self, epoch: int) -> np.ndarray:
        """Indices of the split's row groups in the order this epoch reads them."""
        if not self.shuffle:
            return np.arange(len(self._unit_rows))
        return np.random.default_rng([self.seed, epoch]).permutation(len(self._unit_rows))

    def _plan_epoch(self, epoch: int, first_batch: int) -> _EpochPlan:
        order = self.row_group_order(epoch)
        offsets = np.concatenate([[0], np.cumsum(self._unit_rows[order])])
        starts = (
            np.arange(first_batch, len(self), dtype=np.int64) * self.batch_size * self.world_size
            + self.rank * self.batch_size
        )
        stops = np.minimum(starts + self.batch_size, self.total_rows)
        return _EpochPlan(
            epoch=epoch,
            first_batch=first_batch,
            order=order,
            offsets=offsets,
            starts=starts,
            stops=stops,
            first_unit=np.searchsorted(offsets, starts, side="right") - 1,
            last_unit=np.searchsorted(offsets, stops - 1, side="right") - 1,
        )

    def _warm_targets(self, plan: _EpochPlan) -> list[tuple[_Shard, int, int]]:
        """(shard, row group, plan position) of every row group this rank reads, in order."""
        counts = plan.last_unit - plan.first_unit + 1
        positions = np.unique(np.repeat(plan.first_unit, counts) + _within(counts))
        chosen = plan.order[positions]
        return [
            (self._shards[shard], group, position)
            for shard, group, position in zip(
                self._unit_shard[chosen].tolist(),
                self._unit_group[chosen].tolist(),
                positions.tolist(),
                strict=True,
            )
        ]

    def _blocks(self, plan: _EpochPlan, progress: _Progress | None) -> _Blocks:
        """This rank's batches of the plan, in blocks of 1, 2, 4, ... up to `_block_batches`.

        If building a block fails, the batches completed before the failure are handed out
        first and the error follows them.
        """
        edges = _block_edges(len(plan.starts), self._block_batches)
        # blocks are laid out a chunk at a time, so a long epoch never becomes long lists
        chunk_edges = edges[:: max(1, _CHUNK_BATCHES // self._block_batches)].tolist()
        if chunk_edges[-1] != edges[-1]:
            chunk_edges.append(int(edges[-1]))
        for lo, hi in itertools.pairwise(chunk_edges):
            layout = self._lay_out(plan, edges[(edges >= lo) & (edges <= hi)])
            for index in range(len(layout.block_edges) - 1):
                batches, block, error = self._build_block(plan, layout, index, progress)
                if batches:
                    yield batches, block
                if error is not None:
                    raise error

    def _lay_out(self, plan: _EpochPlan, edges: np.ndarray) -> _Layout:
        """The runs of the batches between `edges`, found with numpy for all of them at once."""
        first_batch, end_batch = int(edges[0]), int(edges[-1])
        batches = slice(first_batch, end_batch)
        starts, stops = plan.starts[batches], plan.stops[batches]
        first, last = plan.first_unit[batches], plan.last_unit[batches]
        counts = last - first + 1  # row groups per batch
        run_batch = np.repeat(np.arange(len(starts)), counts)
        unit = np.repeat(first, counts) + _within(counts)
        base = plan.offsets[unit]
        lo = np.maximum(starts[run_batch], base) - base
        hi = np.minimum(stops[run_batch], plan.offsets[unit + 1]) - base
        batch_runs = np.concatenate([[0], np.cumsum(counts)])
        run_row = np.concatenate([[0], np.cumsum(hi - lo)])[:-1]
        run_row -= run_row[batch_runs[:-1]][run_batch]
        defaulted = None
        if any(self._defaulted):
            shards = self._unit_shard[plan.order].tolist()
            defaulted = []
            for a, b in zip(first.tolist(), last.tolist(), strict=True):
                lacking = {n for u in range(a, b + 1) for n in self._defaulted[shards[u]]}
                defaulted.append(tuple(n for n in self.columns if n in lacking))
        units = plan.order[unit]
        plain = counts == 1
        if defaulted is not None:
            plain &= np.array([not d for d in defaulted], dtype=bool)
        return _Layout(
            first_batch=first_batch,
            block_edges=(edges - first_batch).tolist(),
            batch_runs=batch_runs.tolist(),
            batch_plain=plain.tolist(),
            batch_rows=(stops - starts).tolist(),
            batch_row_groups=counts.tolist(),
            batch_defaulted=defaulted,
            run_unit=unit.tolist(),
            run_shard=self._unit_shard[units].tolist(),
            run_group=self._unit_group[units].tolist(),
            run_lo=lo.tolist(),
            run_hi=hi.tolist(),
            run_row=run_row.tolist(),
        )

    def _build_block(
        self, plan: _EpochPlan, layout: _Layout, index: int, progress: _Progress | None
    ) -> tuple[list[dict[str, Any]], _Block, Exception | None]:
        """One block of batches: a slice of the mapped row group, copied unless `copy=False`,
        for a batch inside one row group (nearly all of them); a fresh buffer filled run by
        run for one that straddles row groups or lacks a column. Also returns the error that
        stopped it early, if any: the batches before it are complete."""
        clock = time.perf_counter
        first, end = layout.block_edges[index], layout.block_edges[index + 1]
        count = end - first
        block = _Block(
            epoch=plan.epoch,
            first_batch=plan.first_batch + layout.first_batch + first,
            rows=layout.batch_rows[first:end],
            row_groups=layout.batch_row_groups[first:end],
            read_s=[0.0] * count,
            decode_s=[0.0] * count,
            normalize_s=[0.0] * count,
            stage_s=[0.0] * count,
            cache_misses=[0] * count,
            defaulted=layout.batch_defaulted[first:end] if layout.batch_defaulted else None,
        )
        copy, to_tensors, columns = self.copy, self._torch is not None, self.columns
        # plain Python locals from here: the loop runs once per batch
        plain, batch_runs = layout.batch_plain, layout.batch_runs
        run_unit, run_lo, run_hi = layout.run_unit, layout.run_lo, layout.run_hi
        read_s, decode_s, stage_s = block.read_s, block.decode_s, block.stage_s
        single = columns[0] if len(columns) == 1 else None
        batches: list[dict[str, Any]] = []
        open_unit = -1
        named: list[tuple[str, np.ndarray]] = []
        array = np.empty(0)
        for k in range(count):
            batch = first + k
            try:
                if not plain[batch]:
                    started = clock()
                    out = self._filled(plan, layout, batch, block, k, progress)
                    open_unit = -1
                else:
                    run = batch_runs[batch]
                    if run_unit[run] != open_unit:
                        started = clock()
                        views, decoded, missed = self.cache.views(
                            self._shards[layout.run_shard[run]], layout.run_group[run]
                        )
                        read_s[k] = clock() - started - decoded
                        decode_s[k] = decoded
                        block.cache_misses[k] = int(missed)
                        named = [(name, views[name]) for name in columns]
                        array = named[0][1]
                        open_unit = run_unit[run]
                        if progress is not None:
                            progress.advance(open_unit)
                    lo, hi = run_lo[run], run_hi[run]
                    started = clock()
                    if single is not None:
                        out = {single: array[lo:hi].copy() if copy else array[lo:hi]}
                    elif copy:
                        out = {name: source[lo:hi].copy() for name, source in named}
                    else:
                        out = {name: source[lo:hi] for name, source in named}
                if to_tensors:
                    out = self._tensors(out)
                stage_s[k] += clock() - started
            except Exception as exc:
                return batches, block, exc
            batches.append(out)
        return batches, block, None

    def _filled(
        self,
        plan: _EpochPlan,
        layout: _Layout,
        batch: int,
        block: _Block,
        k: int,
        progress: _Progress | None,
    ) -> dict[str, np.ndarray]:
        """A batch copied run by run into fresh arrays, defaults where a shard lacks a column.

        The read, decode and default-fill time go to their own receipt fields; the caller
        counts the whole call as staging, so those are taken back out here.
        """
        clock = time.perf_counter
        rows = layout.batch_rows[batch]
        out = {
            name: np.empty((rows, *tail), dtype)
            for name, (dtype, tail) in zip(self.columns, self._layouts, strict=True)
        }
        for run in range(layout.batch_runs[batch], layout.batch_runs[batch + 1]):
            lo, hi = layout.run_lo[run], layout.run_hi[run]
            started = clock()
            views, decode_s, missed = self.cache.views(
                self._shards[layout.run_shard[run]], layout.run_group[run]
            )
            read_s = clock() - started
            block.read_s[k] += read_s - decode_s
            block.decode_s[k] += decode_s
            block.cache_misses[k] += missed
            block.stage_s[k] -= read_s
            if progress is not None:
                progress.advance(layout.run_unit[run])
            into = slice(layout.run_row[run], layout.run_row[run] + hi - lo)
            for name, array in out.items():
                source = views.get(name)
                if source is None:
                    started = clock()
                    array[into] = self._defaults[name]
                    filling = clock() - started
                    block.normalize_s[k] += filling
                    block.stage_s[k] -= filling
                else:
                    array[into] = source[lo:hi]
        return out

    def _tensors(self, batch: dict[str, Any]) -> dict[str, Any]:
        tensors = {name: self._torch.from_numpy(array) for name, array in batch.items()}
        if self._pin:
            tensors = {name: tensor.pin_memory() for name, tensor in tensors.items()}
        return tensors

    def _log_block(self, block: _Block) -> None:
        """The consumer started on `block`: it is where the run stands, and its receipts count."""
        self.epoch, self.batch_index = block.epoch, block.first_batch
        log = self._receipt_blocks
        if log:
            self._receipts_logged += log[-1].delivered
        log.append(block)
        while len(log) > 1 and self._receipts_logged - log[0].delivered >= self.receipt_history:
            self._receipts_logged -= log.popleft().delivered

    def _epoch_finished(self, epoch: int) -> None:
        self.epoch, self.batch_index = epoch + 1, 0

    # -- resume --------------------------------------------------------------------------------

    def _identity(self) -> dict[str, Any]:
        return {
            "snapshot_id": self.manifest.get("snapshot_id"),
            "split": self.split,
            "seed": self.seed,
            "shuffle": self.shuffle,
            "batch_size": self.batch_size,
            "world_size": self.world_size,
            "rank": self.rank,
            "drop_last": self.drop_last,
            "total_rows": self.total_rows,
        }

    def state_dict(self) -> dict[str, Any]:
        """Where the consumer stands: batches already received, not batches prefetched."""
        return {
            "format": PACKED_SCHEMA_VERSION,
            **self._identity(),
            "epoch": self.epoch,
            "batch_index": self.batch_index,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for key, expected in self._identity().items():
            if state.get(key) != expected:
                raise LoaderStateError(key, expected, state.get(key))
        batch_index = int(state["batch_index"])
        if not 0 <= batch_index <= len(self):
            raise LoaderStateError("batch_index", f"0..{len(self)}", batch_index)
        self._close_active()
        self.epoch, self.batch_index = int(state["epoch"]), batch_index

    # -- receipts, cache, lifetime -----------------------------------------------------------

    @property
    def receipts(self) -> list[BatchReceipt]:
        """Receipts of the last `receipt_history` batches the consumer received, oldest first."""
        out = []
        for block in self._receipt_blocks:
            for k in range(block.delivered):
                out.append(
                    BatchReceipt(
                        epoch=block.epoch,
                        batch_index=block.first_batch + k,
                        rank=self.rank,
                        shape=(block.rows[k], self.seq_len),
                        row_groups=block.row_groups[k],
                        read_s=block.read_s[k],
                        decode_s=block.decode_s[k],
                        normalize_s=block.normalize_s[k],
                        stage_s=block.stage_s[k],
                        queue_wait_s=block.queue_wait_s if k == 0 else 0.0,
                        cache_misses=block.cache_misses[k],
                        defaulted_columns=block.defaulted[k] if block.defaulted else (),
                    )
                )
        return out[len(out) - self.receipt_history :] if self.receipt_history else []

    def receipt_summary(self) -> ReceiptSummary:
        return summarize_receipts(self.receipts)

    def warm_cache(self) -> float:
        """Decode every row group of this split into the cache now; returns seconds spent."""
        spent = 0.0
        for shard in self._shards:
            for group, rows in enumerate(shard.row_group_rows):
                if rows:
                    spent += self.cache.views(shard, group)[1]
        return spent

    def _close_active(self) -> None:
        active = self._active() if self._active is not None else None
        if active is not None:
            active.close()
        self._active = None

    def close(self) -> None:
        self._close_active()
        self.cache.close()

    def __enter__(self) -> PackedRowsLoader:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __del__(self) -> None:
        if getattr(self, "_active", None) is not None:
            self._close_active()
