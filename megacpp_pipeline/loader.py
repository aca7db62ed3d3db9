"""Static-shape reader of a promoted snapshot's packed rows (DESIGN section 6, issue 8).

Decides what a trainer sees per step: a seeded row-group order, disjoint per-rank slices of
each global batch, one batch of prefetch, and a staged receipt per batch. Seed rule: the
fixed-length row is the performance contract, and parquet decoding alone cannot keep up, so
each row group is decoded once into an uncompressed Arrow IPC file and every batch after
that is a memory-mapped, zero-copy slice of it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import json
import os
import queue
import tempfile
import threading
import time
import weakref
from collections import OrderedDict, deque
from collections.abc import Generator, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from pydantic import BaseModel, ConfigDict

from megacpp_pipeline.packed_rows import (
    OPTIONAL_TOKEN_COLUMNS,
    PACKED_SCHEMA_VERSION,
    REQUIRED_COLUMNS,
    packed_rows_schema,
)

COMPLETE_MARKER = "_COMPLETE"
MANIFEST_NAME = "manifest.json"
CACHE_FORMAT = "rg-ipc-v1"  # bump when the cache layout changes; old entries are then ignored
_OPEN_ROW_GROUPS = 512  # memory maps kept open at once (each holds a file descriptor)


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

    A slotted dataclass, not a pydantic model: one is built per batch on the hot path;
    the summary that leaves the loader (`ReceiptSummary`) is the pydantic edge.
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
    queue_wait_s: float  # time the consumer blocked waiting for this batch
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


class _Part(NamedTuple):  # a NamedTuple: one is built per batch, a frozen dataclass is slower
    shard: int
    row_group: int
    start: int
    stop: int


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


_END = object()
_Batches = Generator[tuple[dict[str, Any], BatchReceipt], None, None]


class _ProducerFailure:
    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


def _put(out: queue.Queue[Any], item: object, stop: threading.Event) -> bool:
    while not stop.is_set():
        try:
            out.put(item, timeout=0.05)
            return True
        except queue.Full:
            continue
    return False


def _run_producer(
    batches: Iterator[tuple[dict[str, Any], BatchReceipt]],
    out: queue.Queue[Any],
    stop: threading.Event,
) -> None:
    # The thread holds the batch generator, never the consumer-side iterator, so dropping
    # the iterator lets its finalizer stop this thread.
    try:
        for item in batches:
            if not _put(out, item, stop):
                return
        _put(out, _END, stop)
    except BaseException as exc:  # crosses the queue and re-raises in the consumer
        _put(out, _ProducerFailure(exc), stop)


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
    # On a warm cache there is nothing to do, and the thread leaves at once rather than
    # waking up for every batch.
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


def _stop_threads(
    stop: threading.Event, out: queue.Queue[Any], threads: tuple[threading.Thread, ...]
) -> None:
    stop.set()
    while True:
        try:
            out.get_nowait()
        except queue.Empty:
            break
    for thread in threads:
        if thread is not threading.current_thread():
            thread.join(timeout=10)


class _EpochIterator:
    """One pass over this rank's batches; counts what the consumer actually received."""

    def __init__(self, loader: PackedRowsLoader, epoch: int, start: int) -> None:
        self._loader = loader
        self._epoch = epoch
        plan = loader._plan_epoch(epoch, start)
        warm_ahead = loader.prefetch and loader.lookahead_row_groups > 0
        progress = _Progress() if warm_ahead else None
        batches = loader._produce(plan, progress)
        self._batches: _Batches | None = None
        self._queue: queue.Queue[Any] | None = None
        self._finalizer: weakref.finalize[Any, Any]
        if loader.prefetch:
            self._queue = queue.Queue(maxsize=1)
            stop = threading.Event()
            name = f"megacpp-loader-{loader.split}-rank{loader.rank}"
            threads = [
                threading.Thread(
                    target=_run_producer, args=(batches, self._queue, stop), name=name, daemon=True
                )
            ]
            if progress is not None:
                threads.append(
                    threading.Thread(
                        target=_run_warmer,
                        args=(
                            loader.cache,
                            loader._warm_targets(plan),
                            progress,
                            loader.lookahead_row_groups,
                            stop,
                        ),
                        name=f"{name}-warmer",
                        daemon=True,
                    )
                )
            self._finalizer = weakref.finalize(
                self, _stop_threads, stop, self._queue, tuple(threads)
            )
            for thread in threads:
                thread.start()
        else:
            self._batches = batches
            self._finalizer = weakref.finalize(self, batches.close)
        self._done = False

    def __iter__(self) -> _EpochIterator:
        return self

    def __next__(self) -> dict[str, Any]:
        if self._done:
            raise StopIteration
        started = time.perf_counter()
        if self._queue is not None:
            item = self._queue.get()
        else:
            assert self._batches is not None
            item = next(self._batches, _END)
        waited = time.perf_counter() - started if self._queue is not None else 0.0
        if item is _END:
            self.close()
            self._loader._epoch_finished(self._epoch)
            raise StopIteration
        if isinstance(item, _ProducerFailure):
            self.close()
            raise item.exc  # keeps the producer's frames in its __traceback__
        batch, receipt = item
        receipt.queue_wait_s = waited
        self._loader._delivered(receipt)
        return batch  # type: ignore[no-any-return]

    def close(self) -> None:
        self._done = True
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
        # per shard: does it lack a requested column (which then gets its default)?
        self._missing = [
            any(name not in shard.columns for name in self.columns) for shard in shards
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
        self.total_rows = int(self._unit_rows.sum())

        self.cache = RowGroupCache(
            Path(cache_dir) if cache_dir is not None else default_cache_dir(), self.seq_len
        )
        self.epoch = 0
        self.batch_index = 0  # batches of `epoch` already delivered to the consumer
        self.receipts: deque[BatchReceipt] = deque(maxlen=receipt_history)
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
        within = np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts)
        positions = np.unique(np.repeat(plan.first_unit, counts) + within)
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

    def _produce(self, plan: _EpochPlan, progress: _Progress | None) -> _Batches:
        # plain Python ints from here: this loop runs once per batch
        shard_of = self._unit_shard[plan.order].tolist()
        group_of = self._unit_group[plan.order].tolist()
        bounds = plan.offsets.tolist()
        batch_index = plan.first_batch
        for start, stop, unit, last in zip(
            plan.starts.tolist(),
            plan.stops.tolist(),
            plan.first_unit.tolist(),
            plan.last_unit.tolist(),
            strict=True,
        ):
            parts = []
            while start < stop:
                end = min(stop, bounds[unit + 1])
                local = start - bounds[unit]
                parts.append(_Part(shard_of[unit], group_of[unit], local, local + end - start))
                start, unit = end, unit + 1
            if progress is not None:
                progress.advance(last)
            yield self._assemble(plan.epoch, batch_index, parts)
            batch_index += 1

    def _assemble(
        self, epoch: int, batch_index: int, parts: list[_Part]
    ) -> tuple[dict[str, Any], BatchReceipt]:
        clock = time.perf_counter
        decode_s = 0.0
        misses = rows = 0
        missing = False
        pieces: list[tuple[dict[str, np.ndarray], int, int]] = []
        started = clock()
        for part in parts:
            views, decoded, missed = self.cache.views(self._shards[part.shard], part.row_group)
            decode_s += decoded
            misses += missed
            missing = missing or self._missing[part.shard]
            pieces.append((views, part.start, part.stop))
            rows += part.stop - part.start
        read_s = clock() - started - decode_s

        started = clock()
        filled: dict[str, np.ndarray] = {}
        if missing:
            for name in self.columns:
                if any(name not in views for views, _, _ in pieces):
                    default = self._defaults[name]
                    filled[name] = np.concatenate(
                        [
                            views[name][lo:hi]
                            if name in views
                            else np.broadcast_to(default, (hi - lo, self.seq_len))
                            for views, lo, hi in pieces
                        ]
                    )
        normalize_s = clock() - started

        started = clock()
        batch: dict[str, Any] = {}
        if len(pieces) == 1:
            views, lo, hi = pieces[0]
            for name in self.columns:
                if name in filled:
                    batch[name] = filled[name]
                else:
                    view = views[name][lo:hi]
                    batch[name] = view.copy() if self.copy else view
        else:
            for name in self.columns:
                batch[name] = filled.get(name)
                if batch[name] is None:
                    batch[name] = np.concatenate([v[name][lo:hi] for v, lo, hi in pieces])
        if self._torch is not None:
            for name, array in batch.items():
                tensor = self._torch.from_numpy(array)
                batch[name] = tensor.pin_memory() if self._pin else tensor
        stage_s = clock() - started

        receipt = BatchReceipt(
            epoch=epoch,
            batch_index=batch_index,
            rank=self.rank,
            shape=(rows, self.seq_len),
            row_groups=len(parts),
            read_s=read_s,
            decode_s=decode_s,
            normalize_s=normalize_s,
            stage_s=stage_s,
            queue_wait_s=0.0,
            cache_misses=misses,
            defaulted_columns=tuple(filled),
        )
        return batch, receipt

    def _delivered(self, receipt: BatchReceipt) -> None:
        self.receipts.append(receipt)
        self.epoch, self.batch_index = receipt.epoch, receipt.batch_index + 1

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

    def receipt_summary(self) -> ReceiptSummary:
        return summarize_receipts(list(self.receipts))

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
