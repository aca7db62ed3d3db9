"""Per-file results of the per-source gates, cached by (stage, stage code version, stage
config hash, source, path, input content hash), so a nightly refresh in which 1% of the files
changed recomputes about 1% of the per-file work. A config or code-version change moves the
stage to a new namespace: it invalidates exactly that stage's entries.

Entries are Arrow IPC files (kept rows, ledger rows and side-table rows, each with a `_key`
column) under <root>/<stage>/<namespace>/<source>/, on any pyarrow filesystem: the cache dir
on local disk, or the store's bucket (`file-results/`) when the data dir is an object store,
so every node of a cluster and every later run share one cache. An entry's index object is
written last; on local disk each object is written to a unique temp name and moved into
place, an object store's PUT is whole already; a crash leaves at worst an unreferenced temp
file or parts without an index, never a half entry.
"""

from __future__ import annotations

import hashlib
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs

from megacpp_pipeline.core.gate import GateResult

KEY = "_key"


def row_keys(table: pa.Table, content_column: str, salt: str = "") -> list[str]:
    """One key per input row: the file's identity plus the hash of what the gate reads."""
    out = []
    for source, path, content in zip(
        table["source_id"].to_pylist(),
        table["path"].to_pylist(),
        table[content_column].to_pylist(),
        strict=True,
    ):
        digest = hashlib.sha256(f"{salt}\0{source}\0{path}\0{content}".encode()).hexdigest()
        out.append(digest[:32])
    return out


class FileResultCache:
    """One stage's entries under one code version and salt; with `source`, only that
    source's entries (a stage's cache is read source by source, so loading the index of one
    never reads the entries of thousands of others). `root` is a path on `fs` (default: the
    local disk)."""

    def __init__(
        self,
        root: Path | str,
        stage: str,
        code_version: str,
        salt: str,
        *,
        source: str | None = None,
        fs: pafs.FileSystem | None = None,
    ) -> None:
        namespace = hashlib.sha256(f"{code_version}\0{salt}".encode()).hexdigest()[:16]
        self.fs = fs or pafs.LocalFileSystem()
        self._local = isinstance(self.fs, pafs.LocalFileSystem)
        base = f"{Path(root).as_posix() if self._local else str(root).rstrip('/')}/{stage}"
        self.dir = f"{base}/{namespace}/{source}" if source else f"{base}/{namespace}"
        if self._local:
            self.fs.create_dir(self.dir, recursive=True)
        self._index: dict[str, str] | None = None

    def _load_index(self) -> dict[str, str]:
        if self._index is None:
            index: dict[str, str] = {}
            selector = pafs.FileSelector(self.dir, allow_not_found=True)
            names = sorted(
                i.base_name
                for i in self.fs.get_file_info(selector)
                if i.type == pafs.FileType.File
                and i.base_name.startswith("e-")
                and i.base_name.endswith(_SUFFIX)
            )
            for name in names:
                if name.count(".") != 1:
                    continue  # a part; only an entry's index file (written last) counts
                try:
                    keys = _read(self.fs, f"{self.dir}/{name}")[KEY].to_pylist()
                except (OSError, pa.ArrowInvalid):
                    continue  # an unreadable entry is a miss, never an error
                for key in keys:
                    index.setdefault(key, name.split(".")[0])
            self._index = index
        return self._index

    def lookup(self, keys: list[str]) -> np.ndarray:
        index = self._load_index()
        return np.fromiter((k in index for k in keys), dtype=bool, count=len(keys))

    def fetch(self, keys: list[str], kind: str) -> pa.Table | None:
        """Cached rows of `kind` (kept, dropped or a side table) for these keys."""
        index = self._load_index()
        parts = sorted({f"{self.dir}/{index[k]}.{kind}{_SUFFIX}" for k in keys})
        wanted = pa.array(keys, pa.string())
        tables = []
        for part, info in zip(parts, self.fs.get_file_info(parts), strict=True):
            if info.type == pafs.FileType.File:
                t = _read(self.fs, part)
                tables.append(t.filter(pc.is_in(t[KEY], value_set=wanted)))
        if not tables:
            return None
        return pa.concat_tables(tables)

    def put(self, keys: list[str], table_keys: dict[str, list[str]], result: GateResult) -> None:
        """Store one gate call's outputs; `table_keys[kind]` aligns keys with that table."""
        entry = f"e-{uuid.uuid4().hex[:16]}"
        tables = {"kept": result.kept, "dropped": result.dropped, **result.extra}
        for kind, table in tables.items():
            keyed = table.append_column(KEY, pa.array(table_keys[kind], pa.string()))
            self._write(keyed, f"{self.dir}/{entry}.{kind}{_SUFFIX}")
        # the index file is written last: an entry exists only once all its parts do
        self._write(pa.table({KEY: pa.array(keys, pa.string())}), f"{self.dir}/{entry}{_SUFFIX}")
        if self._index is not None:
            for key in keys:
                self._index.setdefault(key, entry)

    def _write(self, table: pa.Table, path: str) -> None:
        sink = pa.BufferOutputStream()
        with pa.ipc.new_file(sink, table.schema) as writer:
            writer.write_table(table)
        data = sink.getvalue()
        if not self._local:  # an object store's PUT is whole or absent
            with self.fs.open_output_stream(path) as f:
                f.write(data)
            return
        tmp = f"{path}.{uuid.uuid4().hex[:12]}.tmp"
        with self.fs.open_output_stream(tmp) as f:
            f.write(data)
        self.fs.move(tmp, path)


# Entries are Arrow IPC files: scratch that is written once and read whole, where parquet's
# encoding and compression cost more than they save (a few ms an entry, and a stage writes
# one entry per shard per source).
_SUFFIX = ".arrow"


def _read(fs: pafs.FileSystem, path: str) -> pa.Table:
    with fs.open_input_file(path) as source:
        return pa.ipc.open_file(source).read_all()


def cached_gate_call(
    cache: FileResultCache,
    table: pa.Table,
    keys: list[str],
    gate_call: Callable[[pa.Table], GateResult],
    schemas: dict[str, pa.Schema],
) -> tuple[GateResult, int]:
    """The gate's result for `table`, computing only the rows whose key is not cached.
    `schemas` names every output table ("kept", "dropped", side tables) with its schema.
    Rows come back in input order, so a cached run writes the same shards as a cold one."""
    hits = cache.lookup(keys)
    misses = np.flatnonzero(~hits)
    identity = list(zip(table["source_id"].to_pylist(), table["path"].to_pylist(), strict=True))
    position = {ident: i for i, ident in enumerate(identity)}
    key_of = dict(zip(identity, keys, strict=True))
    fresh = gate_call(table.take(misses)) if len(misses) else None
    fresh_tables: dict[str, pa.Table] = {}
    if fresh is not None:
        fresh_tables = {"kept": fresh.kept, "dropped": fresh.dropped, **fresh.extra}
        cache.put(
            [keys[i] for i in misses], {k: _keys(t, key_of) for k, t in fresh_tables.items()}, fresh
        )
    hit_keys = [k for k, h in zip(keys, hits, strict=True) if h]
    out: dict[str, pa.Table] = {}
    for kind, schema in schemas.items():
        parts = (
            [fresh_tables[kind].select(schema.names).cast(schema)] if kind in fresh_tables else []
        )
        if hit_keys:
            cached = cache.fetch(hit_keys, kind)
            if cached is not None and cached.num_rows:
                parts.append(cached.select(schema.names).cast(schema))
        t = pa.concat_tables(parts) if parts else schema.empty_table()
        order = np.array(
            [
                position[ident]
                for ident in zip(t["source_id"].to_pylist(), t["path"].to_pylist(), strict=True)
            ],
            dtype=np.int64,
        )
        out[kind] = t.take(np.argsort(order, kind="stable")) if len(order) else t
    stats: Counter[str] = Counter(fresh.stats) if fresh is not None else Counter()
    result = GateResult(kept=out.pop("kept"), dropped=out.pop("dropped"), stats=stats, extra=out)
    return result, int(hits.sum())


def _keys(table: pa.Table, key_of: dict[tuple[str, str], str]) -> list[str]:
    return [
        key_of[ident]
        for ident in zip(table["source_id"].to_pylist(), table["path"].to_pylist(), strict=True)
    ]
