"""Streams of Arrow tables sorted by a key, for assembling and checking a snapshot's single
files (documents, pieces, document_files, the ledger) a chunk at a time: memory follows a
chunk, never the corpus. A cursor hands out the rows up to a key; two sorted streams merge
into one; rows are regrouped into row groups of a fixed size, so a file's bytes never depend
on how its input happened to be cut (slices vary with the number of workers)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from megacpp_pipeline.storage.versions import PARQUET_OPTIONS, TMP_SUFFIX, tmp_name

# rows per row group of a snapshot's metadata files (documents, pieces, ledger, files)
ROW_GROUP_ROWS = 64 * 1024


def concat(tables: list[pa.Table]) -> pa.Table:
    """Tables of one stream as one, not copied; a column not null in one shard and nullable
    in another (versions written by different sources' runs) is nullable in the result."""
    return pa.concat_tables(tables, promote_options="default")


class Cursor:
    """The rows of a stream sorted by `key`, handed out up to a key value at a time."""

    def __init__(self, tables: Iterable[pa.Table], key: str, schema: pa.Schema) -> None:
        self._tables = iter(tables)
        self.key = key
        self.schema = schema
        self._buffer: list[pa.Table] = []
        self._done = False

    def _pull(self) -> bool:
        for table in self._tables:
            if table.num_rows:
                self._buffer.append(table)
                return True
        self._done = True
        return False

    def _last_key(self) -> Any:
        return self._buffer[-1][self.key][-1].as_py()

    def upto(self, value: Any) -> pa.Table:
        """Every remaining row whose key is at most `value`, in stream order."""
        while not self._done and (not self._buffer or self._last_key() <= value):
            self._pull()
        if not self._buffer:
            return self.schema.empty_table()
        table = concat(self._buffer)
        cut = int(pc.sum(pc.less_equal(table[self.key], pa.scalar(value))).as_py() or 0)
        rest = table.slice(cut)
        self._buffer = [rest] if rest.num_rows else []
        return table.slice(0, cut)

    def rest(self) -> Iterator[pa.Table]:
        """Every row not handed out yet."""
        yield from self._buffer
        self._buffer = []
        yield from (t for t in self._tables if t.num_rows)
        self._done = True


def merge(
    a: Iterable[pa.Table], b: Iterable[pa.Table], key: str, schema: pa.Schema
) -> Iterator[pa.Table]:
    """Two streams sorted by `key` as one sorted stream; a key's rows keep their order (a
    document's pieces stay in piece order), and where a key is in both, `a`'s rows come
    first (a document's earlier copy before its later one)."""
    left, right = Cursor(a, key, schema), Cursor(b, key, schema)
    while True:
        left._pull() if not left._buffer and not left._done else None
        right._pull() if not right._buffer and not right._done else None
        if not left._buffer and not right._buffer:
            return
        bounds = [c._last_key() for c in (left, right) if c._buffer and not c._done]
        if not bounds:  # both streams exhausted: what is buffered is all there is
            yield _sorted(pa.concat_tables([*left._buffer, *right._buffer]), key)
            return
        bound = min(bounds)
        part = pa.concat_tables([left.upto(bound), right.upto(bound)])
        if part.num_rows:
            yield _sorted(part, key)


def _sorted(table: pa.Table, key: str) -> pa.Table:
    order = pc.sort_indices(table, sort_keys=[(key, "ascending")])  # stable
    return table.take(order)


def rebatch(tables: Iterable[pa.Table], rows: int = ROW_GROUP_ROWS) -> Iterator[pa.Table]:
    """The same rows in tables of exactly `rows` rows (the last one shorter)."""
    pending: list[pa.Table] = []
    count = 0
    for table in tables:
        while table.num_rows:
            take = min(rows - count, table.num_rows)
            pending.append(table.slice(0, take))
            count += take
            table = table.slice(take)
            if count == rows:
                yield pa.concat_tables(pending).combine_chunks()
                pending, count = [], 0
    if pending:
        yield pa.concat_tables(pending).combine_chunks()


def coalesce(tables: Iterable[pa.Table], rows: int = ROW_GROUP_ROWS) -> Iterator[pa.Table]:
    """The same rows in the same order, consecutive tables put together (not copied) until
    they hold at least `rows` rows: what a stream of small shards costs per table (a cast,
    a lookup, a cursor step) is then paid once per row group's worth, not per shard."""
    pending: list[pa.Table] = []
    count = 0
    for table in tables:
        if not table.num_rows:
            continue
        pending.append(table)
        count += table.num_rows
        if count >= rows:
            yield pending[0] if len(pending) == 1 else concat(pending)
            pending, count = [], 0
    if pending:
        yield pending[0] if len(pending) == 1 else concat(pending)


# the owner a single file's temp name carries (versions.tmp_name)
_OWNER = "snapshot"


def remove_temps(path: Path) -> None:
    """The temp files a writer of `path` killed before it finished left behind."""
    for stale in path.parent.glob(f"{path.name}.{_OWNER}-*{TMP_SUFFIX}"):
        stale.unlink(missing_ok=True)


class StreamWriter:
    """A parquet file written chunk by chunk in row groups of exactly `rows` rows (the last
    shorter), as every parquet file is (PARQUET_OPTIONS), to a temp name renamed into place
    by `close()`."""

    def __init__(self, path: Path, schema: pa.Schema, rows: int = ROW_GROUP_ROWS) -> None:
        self.path = path
        self.schema = schema
        self.rows = rows
        self.written = 0
        self._tmp = path.with_name(tmp_name(path.name, _OWNER))
        self._writer = pq.ParquetWriter(self._tmp, schema, **PARQUET_OPTIONS)
        self._pending: list[pa.Table] = []
        self._count = 0

    def add(self, table: pa.Table) -> None:
        if not table.num_rows:
            return
        self._pending.append(table.select(self.schema.names).cast(self.schema))
        self._count += table.num_rows
        if self._count >= self.rows:
            batches = list(rebatch(self._pending, self.rows))
            keep = batches.pop() if len(batches[-1]) < self.rows else None
            for batch in batches:
                self._write(batch)
            self._pending = [keep] if keep is not None else []
            self._count = keep.num_rows if keep is not None else 0

    def _write(self, batch: pa.Table) -> None:
        self._writer.write_table(batch, row_group_size=self.rows)
        self.written += batch.num_rows

    def close(self) -> int:
        """Flush, read the footer back (its row count must match), rename into place."""
        try:
            for batch in rebatch(self._pending, self.rows):
                self._write(batch)
            if not self.written:
                self._writer.write_table(self.schema.empty_table())
            self._writer.close()
            if pq.read_metadata(self._tmp).num_rows != self.written:
                raise OSError(
                    f"{self.path}: wrote {self.written} rows, read back a different count"
                )
            self._tmp.replace(self.path)
        finally:
            self._tmp.unlink(missing_ok=True)
        return self.written

    def abort(self) -> None:
        self._writer.close()
        self._tmp.unlink(missing_ok=True)


def write_stream(
    tables: Iterable[pa.Table], path: Path, schema: pa.Schema, rows: int = ROW_GROUP_ROWS
) -> int:
    """`tables` (of `schema`) written to `path` in row groups of `rows` rows; the rows."""
    writer = StreamWriter(path, schema, rows)
    try:
        for table in tables:
            writer.add(table)
    except BaseException:
        writer.abort()
        raise
    return writer.close()


class OutOfOrderError(ValueError):
    """A stream that must come sorted did not (in_order)."""


def in_order(tables: Iterable[pa.Table], key: str, what: str) -> Iterator[pa.Table]:
    """`tables` as they are, refused (OutOfOrderError naming `what`) where `key` decreases:
    the streams a snapshot is assembled from must come sorted."""
    last: Any = None
    for table in tables:
        if not table.num_rows:
            continue
        keys = table[key].to_numpy(zero_copy_only=False)
        if (len(keys) > 1 and (keys[1:] < keys[:-1]).any()) or (
            last is not None and keys[0] < last
        ):
            raise OutOfOrderError(f"{what}: rows are not in {key} order")
        last = keys[-1]
        yield table


def read_back(path: Path, columns: list[str] | None = None) -> Iterator[pa.Table]:
    """A parquet file row group by row group (what StreamWriter wrote, chunk by chunk)."""
    parquet = pq.ParquetFile(path)
    for group in range(parquet.num_row_groups):
        yield parquet.read_row_group(group, columns=columns)


def group_counts(doc: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(distinct docs in order, rows per doc, sum of `values` per doc) of a doc-sorted run."""
    if len(doc) == 0:
        return doc, np.zeros(0, np.int64), np.zeros(0, np.int64)
    first = np.r_[True, doc[1:] != doc[:-1]]
    starts = np.flatnonzero(first)
    counts = np.diff(np.r_[starts, len(doc)])
    sums = np.add.reduceat(values.astype(np.int64), starts)
    return doc[starts], counts, sums
