"""The map side of every stage: a version's rows cut into slices of about `task_bytes` of
parquet, each slice the input of one task. A slice is a list of row ranges of the input's
shards in stream order (small shards are joined, a large one is cut), so output shards
stay near `task_bytes` whatever the input's shards were. Planning reads manifests only;
a task reads its own rows from the store."""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.parquet as pq

from megacpp_pipeline.storage import text_refs
from megacpp_pipeline.storage.store import Manifest, ShardInfo, ShardStore, StoreError
from megacpp_pipeline.storage.text_refs import TextPlaces

# Slices per worker the planner aims for when a version is small: enough for the workers
# to even out, never below MIN_TASK_BYTES of parquet a task (a task has fixed costs).
SLICES_PER_WORKER = 4
MIN_TASK_BYTES = 64 << 10


@dataclass(frozen=True)
class Piece:
    """Rows [lo, hi) of one shard of a committed version (its folder and manifest entry,
    so the task that reads it checks the bytes against the recorded size and sha256); a
    shard outside any version (a test's, a work file) has no entry and is read as it is."""

    vdir: str
    shard: ShardInfo | None
    lo: int
    hi: int
    file: str = ""  # the path of a shard with no entry

    @property
    def path(self) -> str:
        return f"{self.vdir}/{self.shard.path}" if self.shard is not None else self.file

    @property
    def rows(self) -> int:
        return self.hi - self.lo


@dataclass(frozen=True)
class Slice:
    """One task's input: pieces in stream order, and where its first row sits in the
    stream the plan covered (doc ids and ranks count from there)."""

    pieces: tuple[Piece, ...]
    first_row: int

    @property
    def rows(self) -> int:
        return sum(p.rows for p in self.pieces)


def weight(shard: ShardInfo) -> int:
    """What a task that reads a shard's rows reads: its bytes, and the bytes of the text it
    names in earlier versions' shards (text written once), so a slice of a version that
    holds little of its text is sized by the text it carries, not by its few columns."""
    return shard.bytes + (shard.held_bytes or 0)


def task_bytes_for(total_bytes: int, workers: int, ceiling: int) -> int:
    """Parquet bytes per task: `ceiling` (the engine's task_bytes), or less when the input
    is too small to give every worker SLICES_PER_WORKER tasks."""
    if workers < 2:
        return ceiling
    share = total_bytes // (workers * SLICES_PER_WORKER)
    return min(ceiling, max(MIN_TASK_BYTES, share))


def few_column_task_bytes(total_bytes: int, workers: int, ceiling: int) -> int:
    """Parquet bytes per task for a task that decodes a few small columns and writes one
    object per output partition (a check's shuffle): SLICES_PER_WORKER tasks a worker, none
    smaller than `ceiling`, so the tasks (and the objects they write) grow with the workers,
    not with the corpus's bytes."""
    return max(ceiling, total_bytes // (max(1, workers) * SLICES_PER_WORKER))


def plan(
    store: ShardStore,
    tables: Iterable[tuple[Manifest, str]],
    task_bytes: int,
    *,
    first_row: int = 0,
    cut: bool = True,
) -> list[Slice]:
    """Slices over the shards of `tables` ((version, table name), in stream order), about
    `task_bytes` each, none empty. One plan never joins two tables' rows in one slice:
    call it per table when outputs must not mix (a source's rows stay its own). With `cut`
    off a shard is never split among slices (a task that writes nothing, a check, need not
    bound its output, and each shard is then decoded once)."""
    out: list[Slice] = []
    pieces: list[Piece] = []
    size = 0.0
    start = first_row
    row = first_row
    for manifest, table in tables:
        info = manifest.tables.get(table)
        if info is None:
            continue
        vdir = store.version_dir(manifest)
        for shard in info.shards:
            if shard.rows == 0:
                continue
            if not cut:
                pieces.append(Piece(vdir, shard, 0, shard.rows))
                size += weight(shard)
                row += shard.rows
                if size >= task_bytes:
                    out.append(Slice(tuple(pieces), start))
                    pieces, size, start = [], 0.0, row
                continue
            row_bytes = max(1.0, weight(shard) / shard.rows)
            lo = 0
            while lo < shard.rows:
                room = (
                    max(1, math.floor((task_bytes - size) / row_bytes)) if row_bytes else shard.rows
                )
                hi = min(shard.rows, lo + room)
                pieces.append(Piece(vdir, shard, lo, hi))
                size += (hi - lo) * row_bytes
                row += hi - lo
                lo = hi
                if size >= task_bytes:
                    out.append(Slice(tuple(pieces), start))
                    pieces, size, start = [], 0.0, row
    if pieces:
        out.append(Slice(tuple(pieces), start))
    return out


def plan_rows(
    store: ShardStore, tables: Iterable[tuple[Manifest, str]], rows_per_slice: int
) -> list[Slice]:
    """Slices of exactly `rows_per_slice` rows over `tables` in stream order (the last one
    shorter): where a unit of work is a number of rows, not of bytes (packing windows)."""
    out: list[Slice] = []
    pieces: list[Piece] = []
    start = row = 0
    for manifest, table in tables:
        info = manifest.tables.get(table)
        if info is None:
            continue
        vdir = store.version_dir(manifest)
        for shard in info.shards:
            lo = 0
            while lo < shard.rows:
                hi = min(shard.rows, lo + rows_per_slice - (row - start))
                pieces.append(Piece(vdir, shard, lo, hi))
                row += hi - lo
                lo = hi
                if row - start == rows_per_slice:
                    out.append(Slice(tuple(pieces), start))
                    pieces, start = [], row
    if pieces:
        out.append(Slice(tuple(pieces), start))
    return out


def total_bytes(tables: Iterable[tuple[Manifest, str]]) -> int:
    return sum(
        weight(s) for m, t in tables if (info := m.tables.get(t)) is not None for s in info.shards
    )


def read(store: ShardStore, pieces: Sequence[Piece], columns: list[str] | None = None) -> pa.Table:
    """A slice's rows, read from the store by the task that works on them."""
    return read_located(store, pieces, columns)[0]


def read_each(
    store: ShardStore, pieces: Sequence[Piece], columns: list[str] | None = None
) -> Iterator[pa.Table]:
    """A slice's rows shard by shard (a task that streams holds one shard at a time)."""
    for table, _ in read_each_located(store, pieces, columns):
        yield table


def read_located(
    store: ShardStore, pieces: Sequence[Piece], columns: list[str] | None = None
) -> tuple[pa.Table, TextPlaces]:
    """`read`, and where each row's text is held (a gate that keeps the text names it)."""
    parts = list(read_each_located(store, pieces, columns))
    if not parts:
        raise StoreError("a slice with no rows was planned")
    if len(parts) == 1:
        return parts[0]
    return pa.concat_tables(t for t, _ in parts), text_refs.concat([p for _, p in parts])


def read_each_located(
    store: ShardStore, pieces: Sequence[Piece], columns: list[str] | None = None
) -> Iterator[tuple[pa.Table, TextPlaces]]:
    for path, group in itertools.groupby(pieces, key=lambda p: p.path):
        first, *rest = list(group)
        lo = min(p.lo for p in (first, *rest))
        if first.shard is not None:  # verified as it is read (ShardVerificationError)
            # only the row groups this task's rows are in are decoded (a large shard is
            # cut among several tasks)
            hi = max(p.hi for p in (first, *rest))
            shard, places = store.read_shard_located(first.vdir, first.shard, columns, (lo, hi))
        else:
            lo = 0
            try:
                shard = pq.read_table(path, filesystem=store.fs, columns=columns)
            except (OSError, pa.ArrowInvalid) as e:
                raise StoreError(f"{path}: unreadable shard ({e})") from e
            places = TextPlaces.nowhere(shard.num_rows)
        for p in (first, *rest):
            yield shard.slice(p.lo - lo, p.rows), places.slice(p.lo - lo, p.rows)
