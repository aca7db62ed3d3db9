"""The row-group cache: each parquet row group decoded once into an uncompressed Arrow IPC
file keyed by its shard's sha256, then read back memory-mapped as numpy views. Seed rule:
parquet decoding alone cannot keep up with a trainer, so every batch is a slice of a map."""

from __future__ import annotations

import os
import tempfile
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from megacpp_pipeline.loader.errors import ShardSchemaError
from megacpp_pipeline.loader.manifest import Shard

CACHE_FORMAT = "rg-ipc-v1"  # bump when the cache layout changes; old entries are then ignored
_OPEN_ROW_GROUPS = 512  # memory maps kept open at once (each holds a file descriptor)


def default_cache_dir() -> Path:
    user = os.getuid() if hasattr(os, "getuid") else os.getlogin()
    return Path(tempfile.gettempdir()) / f"megacpp-rowgroup-cache-{user}"


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

    def entry_path(self, shard: Shard, row_group: int) -> Path:
        return self.cache_dir / CACHE_FORMAT / shard.sha256 / f"rg-{row_group:05d}.arrow"

    def ensure(self, shard: Shard, row_group: int) -> tuple[float, bool]:
        """Decode the row group unless it is cached; seconds spent (or waited), was it missing?

        Safe from several threads: one decodes, the others wait for it.
        """
        path = self.entry_path(shard, row_group)
        if path.is_file():
            return 0.0, False
        with self._lock:
            event = self._decoding.get(path)
            # another thread may have finished it between the check above and this lock:
            # its entry is in place before its event leaves `_decoding`, so look again
            if event is None and path.is_file():
                return 0.0, False
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

    def is_open(self, shard: Shard, row_group: int) -> bool:
        """Is the row group mapped in this process already (no decode, no file check needed)?"""
        with self._lock:
            return (shard.sha256, row_group) in self._open

    def all_open(self, keys: Sequence[tuple[str, int]]) -> bool:
        """Are all these (shard sha256, row group) mapped already?"""
        with self._lock:
            return all(key in self._open for key in keys)

    def views(self, shard: Shard, row_group: int) -> tuple[dict[str, np.ndarray], float, bool]:
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

    def _decode(self, shard: Shard, row_group: int, path: Path) -> None:
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

    def _numpy(self, shard: Shard, name: str, column: pa.Array) -> np.ndarray:
        if column.null_count:
            raise ShardSchemaError(shard.relpath, name, f"{column.null_count} null values")
        if isinstance(column, pa.FixedSizeListArray):
            values = column.values.slice(column.offset * self.seq_len, len(column) * self.seq_len)
            return values.to_numpy(zero_copy_only=True).reshape(-1, self.seq_len)
        return column.to_numpy(zero_copy_only=True)
