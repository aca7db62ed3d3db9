"""Per-file results of the per-source gates, cached by (stage, stage code version, stage
config hash, source, path, everything the gate reads of the row), so a nightly refresh in
which 1% of the files changed recomputes about 1% of the per-file work. A config or code
version change moves the stage to a new namespace: it invalidates exactly that stage's
entries.

An entry is used only once it proves itself: it is readable, it belongs to its keys (each
key is recomputed from the source, path and row digest the entry recorded, and the file at
that key in the input is the one recorded), it was written for this stage's code version,
and each of its parts has the size and sha256 the entry recorded when it was written, and
lists every file it answers for exactly once. An entry that does not is removed with one
warning naming it, and its files are computed again.

Entries are Arrow IPC files (kept rows, ledger rows and side-table rows, each with a `_key`
column) under <root>/<stage>/<namespace>/<source>/, on any pyarrow filesystem: the cache dir
on local disk, or the store's bucket (`file-results/`) when the data dir is an object store,
so every node of a cluster and every later run share one cache. An entry's index object
(its keys, what each key was computed from, its parts' hashes) is written last; on local
disk each object is written to a unique temp name and moved into place, an object store's
PUT is whole already; a crash leaves at worst an unreferenced temp file or parts without an
index, never a half entry (`megacpp cache prune` removes that debris).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import xxhash

from megacpp_pipeline.core.gate import GateResult

KEY = "_key"
log = logging.getLogger(__name__)

# The entry format; part of every namespace, so entries of an older format are never read
# (they sit in namespaces nothing uses any more, which `megacpp cache prune` removes).
FORMAT = "7"
# Columns a cached row takes from the live input row instead of the entry: where the file was
# collected from, which no gate reads. A refresh that moves a source to a new commit reuses
# every unchanged file's results, stamped with the new revision.
CARRIED_LIVE = ("revision",)

_META_FORMAT = b"megacpp.cache.format"
_META_CODE = b"megacpp.cache.code_version"
_META_PARTS = b"megacpp.cache.parts"
_META_CARRIED = b"megacpp.cache.carried"  # a kept part's columns left to the live input
# a kept part's columns whose rows are left to the live input where its mask column
# (`_PARTLY` + name) is true: the text of a gate that changes a few files' text
_META_PARTLY = b"megacpp.cache.partly"
# of those columns, the ones an input column of another name holds: {column: [that input
# column, the column's type]} (normalize's `text`, its input's `content` as it was)
_META_FROM = b"megacpp.cache.from"
_PARTLY = "_carried:"
_MATERIAL = "material"  # what each key is the hash of


class RowKeys(list[str]):
    """The keys of a table's rows (a list of str), carrying what each one is the hash of
    (`material`), which an entry records so that it can prove it belongs to its keys."""

    material: list[str]


def row_keys(table: pa.Table, content_column: str, salt: str = "") -> list[str]:
    """One key per input row: the file's identity, the hash of what the gate reads
    (`content_column`) and a digest of every other column of the row, since a gate's output
    carries the whole row (enrich parses `text`; a row whose text changed under the same
    `content_sha256` is another input). Only CARRIED_LIVE columns are left out."""
    sources = table["source_id"].to_pylist()
    paths = table["path"].to_pylist()
    contents = table[content_column].to_pylist()
    digests = _row_digests(table, [c for c in table.column_names if c not in CARRIED_LIVE])
    keys = RowKeys()
    keys.material = []
    for source, path, content, digest in zip(sources, paths, contents, digests, strict=True):
        material = f"{salt}\0{source}\0{path}\0{content}\0{digest}"
        keys.material.append(material)
        keys.append(_key_of(material))
    return keys


def _key_of(material: str) -> str:
    return hashlib.sha256(material.encode("utf-8", "surrogatepass")).hexdigest()[:32]


def _row_digests(table: pa.Table, columns: Sequence[str]) -> list[str]:
    """xxh3-128 of each row's values in `columns`. Text, binary, fixed-width numbers,
    booleans and lists of numbers or strings are laid out from their Arrow buffers, every
    part behind its length (-1 for a null), and joined into one value per row by Arrow, so
    a row costs one hash call however many columns it has; other columns (structs, nested
    lists) are added through their Python values."""
    digests: list[str] = []
    for batch in table.select(list(columns)).to_batches():
        digests.extend(_batch_digests(batch))
    return digests


def _batch_digests(batch: pa.RecordBatch) -> list[str]:
    parts: list[pa.Array] = []
    small: list[list[object]] = []
    for array in batch.columns:
        laid = _laid_out(array)
        if laid is None:
            small.append(array.to_pylist())
        else:
            parts.extend(laid)
    n = batch.num_rows
    if parts:
        joined = pc.binary_join_element_wise(
            *parts, pa.scalar(b"", pa.large_binary()), null_handling="replace"
        )
        offsets = np.frombuffer(joined.buffers()[1], np.int64)[joined.offset :][: n + 1].tolist()
        data = joined.buffers()[2]
        view = memoryview(data) if data is not None else memoryview(b"")
        rows = [view[a:b] for a, b in itertools.pairwise(offsets)]
    else:
        rows = [memoryview(b"")] * n
    if not small:
        return [xxhash.xxh3_128_hexdigest(row) for row in rows]
    out = []
    for row, values in zip(rows, zip(*small, strict=True), strict=True):
        h = xxhash.xxh3_128(row)
        h.update(repr(values).encode("utf-8", "surrogatepass"))
        out.append(h.hexdigest())
    return out


def _laid_out(array: pa.Array) -> list[pa.Array] | None:
    """A column's rows as large_binary parts, each part behind an 8-byte length (-1 where
    the row is null, the part then empty), or None for a column read through Python values:
    a text or binary value or a fixed-width number is one part; a list of numbers is its
    values' bytes; a list of strings is its strings' lengths (int64), then their bytes. So
    two rows are told apart by every value, count and string boundary."""
    t = array.type
    if pa.types.is_dictionary(t):
        return _laid_out(array.dictionary_decode())
    if pa.types.is_boolean(t):
        return _laid_out(array.cast(pa.uint8()))
    valid = _validity(array)
    if _is_bytes(t):
        offsets = _offsets(array.buffers()[1], _is_large(t), array.offset, len(array))
        return _with_lengths(array.buffers()[2], offsets, valid)
    if pa.types.is_primitive(t):  # fixed-width numbers, timestamps, dates
        width = t.bit_width // 8
        offsets = (np.arange(len(array) + 1, dtype=np.int64) + array.offset) * width
        return _with_lengths(array.buffers()[1], offsets, valid)
    if not _is_flat_list(array):
        return None
    lists = array.offsets.to_numpy().astype(np.int64)  # this slice's, into `values`
    values = array.values
    if _is_bytes(values.type):
        inner = _offsets(values.buffers()[1], _is_large(values.type), values.offset, len(values))
        lengths = pa.py_buffer(np.diff(inner).astype("<i8"))
        return [
            *_with_lengths(lengths, lists * 8, valid),
            *_with_lengths(values.buffers()[2], inner[lists], valid),
        ]
    width = values.type.bit_width // 8
    return _with_lengths(values.buffers()[1], (lists + values.offset) * width, valid)


def _is_large(t: pa.DataType) -> bool:
    return pa.types.is_large_string(t) or pa.types.is_large_binary(t)


def _offsets(buffer: pa.Buffer, large: bool, offset: int, n: int) -> np.ndarray:
    """Rows offset..offset+n of an offsets buffer, as int64 byte positions."""
    raw = np.frombuffer(buffer, np.int64 if large else np.int32)
    return raw[offset : offset + n + 1].astype(np.int64)


def _validity(array: pa.Array) -> np.ndarray | None:
    return array.is_valid().to_numpy(zero_copy_only=False) if array.null_count else None


def _with_lengths(
    data: pa.Buffer | None, offsets: np.ndarray, valid: np.ndarray | None
) -> list[pa.Array]:
    """Two parts per row: the byte length of data[offsets[i]:offsets[i+1]] (-1 for a null
    row) as 8 bytes, then those bytes (nothing for a null row)."""
    n = len(offsets) - 1
    lengths = np.diff(offsets)
    bitmap = None
    if valid is not None:
        lengths[~valid] = -1
        bitmap = pa.array(valid, pa.bool_()).buffers()[1]
    prefix = pa.Array.from_buffers(
        pa.large_binary(),
        n,
        [
            None,
            pa.py_buffer(np.arange(n + 1, dtype=np.int64) * 8),
            pa.py_buffer(lengths.astype("<i8")),
        ],
    )
    body = pa.Array.from_buffers(
        pa.large_binary(),
        n,
        [bitmap, pa.py_buffer(offsets), data if data is not None else pa.py_buffer(b"")],
    )
    return [prefix, body]


def _is_bytes(t: pa.DataType) -> bool:
    return (
        pa.types.is_string(t)
        or pa.types.is_large_string(t)
        or pa.types.is_binary(t)
        or (pa.types.is_large_binary(t))
    )


def _is_flat_list(array: pa.Array) -> bool:
    """A list of fixed-width numbers or of strings, with no null inside any list (chunk
    starts, token ids, chunk names): laid out from its buffers, not through Python values."""
    t = array.type
    if not (pa.types.is_list(t) or pa.types.is_large_list(t)):
        return False
    value = t.value_type
    if not (_is_bytes(value) or (pa.types.is_primitive(value) and not pa.types.is_boolean(value))):
        return False
    return array.values.null_count == 0


class EntryRejected(Exception):
    """A cache entry that cannot prove itself; the message says why."""


class OlderFormat(EntryRejected):
    """An entry written by an older version of this module (it lives in a namespace no run
    reads any more; `megacpp cache prune` removes it)."""


@dataclass
class ProvenEntry:
    """An entry's rows, every one proven: its keys, and its tables by kind."""

    keys: list[str]
    tables: dict[str, pa.Table] = field(default_factory=dict)


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
        self.code_version = code_version
        self.namespace = namespace_of(code_version, salt)
        self.fs = fs or pafs.LocalFileSystem()
        self._local = isinstance(self.fs, pafs.LocalFileSystem)
        base = f"{Path(root).as_posix() if self._local else str(root).rstrip('/')}/{stage}"
        self.dir = f"{base}/{self.namespace}/{source}" if source else f"{base}/{self.namespace}"
        if self._local:
            self.fs.create_dir(self.dir, recursive=True)
        self._index: dict[str, str] | None = None
        self._entries: dict[str, pa.Table] = {}  # entry name -> its index table

    def _load_index(self) -> dict[str, str]:
        if self._index is None:
            index: dict[str, str] = {}
            for name in _index_names(self.fs, self.dir):
                entry = name[: -len(ENTRY_SUFFIX)]
                try:
                    table = read_index(self.fs, f"{self.dir}/{name}", self.code_version)
                except EntryRejected as e:
                    self.discard(entry, str(e))
                    continue
                self._entries[entry] = table
                for key in table[KEY].to_pylist():
                    index.setdefault(key, entry)
            self._index = index
        return self._index

    def lookup(self, keys: list[str]) -> np.ndarray:
        index = self._load_index()
        return np.fromiter((k in index for k in keys), dtype=bool, count=len(keys))

    def fetch_proven(
        self,
        keys: Sequence[str],
        identities: Sequence[tuple[str, str]],
        kinds: Iterable[str],
        carry: Carry | None = None,
        materials: Sequence[str] | None = None,
    ) -> ProvenEntry:
        """The cached rows of `kinds` for those of `keys` whose entries prove themselves
        (`identities[i]`: the (source, path) the input holds at `keys[i]`; `materials[i]`,
        when given, what `keys[i]` is the hash of). An entry that does not is discarded with
        one warning; its keys are left out, to be computed again. A part that left columns
        to the input gets them back from `carry(rows, columns, sources)` (`sources`: the
        input column and type of each one held under another name)."""
        index = self._load_index()
        wanted: dict[str, dict[str, tuple[str, str]]] = {}
        made_of: dict[str, dict[str, str]] = {}
        for i, (key, ident) in enumerate(zip(keys, identities, strict=True)):
            entry = index.get(key)
            if entry is not None:
                wanted.setdefault(entry, {})[key] = ident
                if materials is not None:
                    made_of.setdefault(entry, {})[key] = materials[i]
        kinds = list(kinds)
        out = ProvenEntry(keys=[])
        parts: dict[str, list[pa.Table]] = {kind: [] for kind in kinds}
        for entry, served in sorted(wanted.items()):
            try:
                tables = self._prove(entry, served, made_of.get(entry))
                chosen = pa.array(list(served), pa.string())
                rows = {
                    kind: _restored(tables[kind], chosen, carry, f"{self.dir}/{entry}")
                    for kind in kinds
                    if kind in tables
                }
            except EntryRejected as e:
                self.discard(entry, str(e), files=[f"{s}:{p}" for s, p in served.values()])
                continue
            out.keys.extend(served)
            for kind, t in rows.items():
                parts[kind].append(t)
        # entries that left different columns to the input hold them in another order, and
        # a column from the input may differ in nullability (the caller casts to its schema)
        out.tables = {
            k: pa.concat_tables(
                [t.select(v[0].column_names) for t in v], promote_options="permissive"
            )
            for k, v in parts.items()
            if v
        }
        return out

    def _prove(
        self,
        entry: str,
        served: dict[str, tuple[str, str]],
        materials: Mapping[str, str] | None = None,
    ) -> dict[str, pa.Table]:
        index = self._entries[entry]
        return prove_entry(self.fs, self.dir, entry, index, served, materials)

    def discard(self, entry: str, why: str, files: Sequence[str] = ()) -> None:
        """Remove an entry that failed to prove itself (index first: no reader trusts parts
        without it), with one warning naming it and the files computed again."""
        path = f"{self.dir}/{entry}{ENTRY_SUFFIX}"
        remove_entry(self.fs, self.dir, entry)
        if self._index is not None:
            self._index = {k: e for k, e in self._index.items() if e != entry}
        self._entries.pop(entry, None)
        which = f"; recomputing {len(files)} file(s): {', '.join(files[:3])}" if files else ""
        which += " ..." if len(files) > 3 else ""
        log.warning("%s: result cache entry discarded (%s)%s", path, why, which)

    def put(
        self,
        keys: list[str],
        table_keys: dict[str, list[str]],
        result: GateResult,
        identities: Sequence[tuple[str, str]] | None = None,
        material: Sequence[str] | None = None,
        carried: Sequence[str] = (),
        partly: Mapping[str, pa.ChunkedArray] | None = None,
        renamed: Mapping[str, str] | None = None,
    ) -> None:
        """Store one gate call's outputs; `table_keys[kind]` aligns keys with that table;
        `identities`: each key's (source, path) (default: from the kept and dropped rows);
        `material`: what each key is the hash of (RowKeys.material; without it the entry
        proves its files' identities but not its keys' preimages); `carried`: columns of
        the kept rows that hold their input rows' values, left out of the entry (a hit takes
        them from the input row, whose key covers them); `partly`: columns where the rows a
        mask marks hold their input rows' values, left null in the entry beside the mask;
        `renamed`: of those, the ones an input column of another name holds, by that name."""
        if identities is None:
            ident_of = {
                k: ident
                for kind in ("kept", "dropped")
                for k, ident in zip(
                    table_keys[kind],
                    zip(
                        getattr(result, kind)["source_id"].to_pylist(),
                        getattr(result, kind)["path"].to_pylist(),
                        strict=True,
                    ),
                    strict=True,
                )
            }
            identities = [ident_of[k] for k in keys]
        entry = f"e-{uuid.uuid4().hex[:16]}"
        tables = {"kept": result.kept, "dropped": result.dropped, **result.extra}
        recorded: dict[str, dict[str, object]] = {}
        for kind, table in tables.items():
            if kind == "kept" and (carried or partly):
                table = _leave_to_input(table, carried, partly or {}, renamed or {})
            keyed = table.append_column(KEY, pa.array(table_keys[kind], pa.string()))
            size, sha256 = self._write_table(keyed, f"{self.dir}/{entry}.{kind}{ENTRY_SUFFIX}")
            recorded[kind] = {"bytes": size, "sha256": sha256, "rows": keyed.num_rows}
        # the index is written last: an entry exists only once all its parts do
        index = pa.table(
            {
                KEY: pa.array(keys, pa.string()),
                "source_id": pa.array([s for s, _ in identities], pa.string()),
                "path": pa.array([p for _, p in identities], pa.string()),
                _MATERIAL: pa.array(
                    list(material) if material is not None else [None] * len(keys), pa.string()
                ),
            }
        ).replace_schema_metadata(
            {
                _META_FORMAT: FORMAT.encode(),
                _META_CODE: self.code_version.encode(),
                _META_PARTS: json.dumps(recorded, sort_keys=True).encode(),
            }
        )
        self._write(_ipc_bytes(index), f"{self.dir}/{entry}{ENTRY_SUFFIX}")
        self._entries[entry] = index
        if self._index is not None:
            for key in keys:
                self._index.setdefault(key, entry)

    def _write(self, data: pa.Buffer, path: str) -> None:
        if not self._local:  # an object store's PUT is whole or absent
            with self.fs.open_output_stream(path) as f:
                f.write(data)
            return
        tmp = f"{path}.{uuid.uuid4().hex[:12]}{TMP_SUFFIX}"
        with self.fs.open_output_stream(tmp) as f:
            f.write(data)
        self.fs.move(tmp, path)

    def _write_table(self, table: pa.Table, path: str) -> tuple[int, str]:
        """An entry's part, streamed to its object and hashed as it goes (a part the size
        of a file at the size limit is never a second buffer in memory); (bytes, sha256)."""
        target = path if not self._local else f"{path}.{uuid.uuid4().hex[:12]}{TMP_SUFFIX}"
        with self.fs.open_output_stream(target) as out:
            sink = _HashingSink(out)
            with pa.ipc.new_file(pa.PythonFile(sink, mode="w"), table.schema) as writer:
                writer.write_table(table)
        if self._local:
            self.fs.move(target, path)
        return sink.size, sink.sha256.hexdigest()


# Entries are Arrow IPC files: scratch that is written once and read whole, where parquet's
# encoding and compression cost more than they save (a few ms an entry, and a stage writes
# one entry per shard per source).
ENTRY_SUFFIX = ".arrow"
TMP_SUFFIX = ".tmp"


class _HashingSink:
    """A writable file object that hashes what passes through it to `out`."""

    def __init__(self, out: pa.NativeFile) -> None:
        self.out = out
        self.sha256 = hashlib.sha256()
        self.size = 0
        self.closed = False

    def write(self, data: bytes | memoryview) -> int:
        self.sha256.update(data)
        self.size += len(data)
        self.out.write(data)
        return len(data)

    def flush(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True  # `out` is closed by its owner


def namespace_of(code_version: str, salt: str) -> str:
    return hashlib.sha256(f"{FORMAT}\0{code_version}\0{salt}".encode()).hexdigest()[:16]


def _ipc_bytes(table: pa.Table) -> pa.Buffer:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue()


def _index_names(fs: pafs.FileSystem, directory: str) -> list[str]:
    """The index objects of a folder's entries (`e-<id>.arrow`; parts have a kind too)."""
    selector = pafs.FileSelector(directory, allow_not_found=True)
    return sorted(
        i.base_name
        for i in fs.get_file_info(selector)
        if i.type == pafs.FileType.File
        and i.base_name.startswith("e-")
        and i.base_name.endswith(ENTRY_SUFFIX)
        and i.base_name.count(".") == 1
    )


def _read_whole(fs: pafs.FileSystem, path: str) -> pa.Buffer:
    with fs.open_input_stream(path) as f:
        return f.read_buffer()


def read_index(fs: pafs.FileSystem, path: str, code_version: str | None) -> pa.Table:
    """An entry's index, checked to be readable, of this format and (when given) written by
    this code version; EntryRejected says why not."""
    try:
        table = pa.ipc.open_file(_read_whole(fs, path)).read_all()
    except (OSError, pa.ArrowInvalid) as e:
        raise EntryRejected(f"its index is unreadable: {e}") from e
    meta = table.schema.metadata or {}
    if meta.get(_META_FORMAT) != FORMAT.encode():
        raise OlderFormat("its index is not of the current format")
    written_by = meta.get(_META_CODE, b"").decode()
    if code_version is not None and written_by != code_version:
        raise EntryRejected(f"written by code version {written_by!r}, not {code_version!r}")
    missing = {KEY, "source_id", "path", _MATERIAL} - set(table.column_names)
    if missing or _META_PARTS not in meta:
        raise EntryRejected(f"its index lacks {sorted(missing) or 'its parts'}")
    return table


def prove_entry(
    fs: pafs.FileSystem,
    directory: str,
    entry: str,
    index: pa.Table,
    served: Mapping[str, tuple[str, str]] | None = None,
    materials: Mapping[str, str] | None = None,
) -> dict[str, pa.Table]:
    """Every part of one entry, read once and checked: each key is the hash of what the
    entry recorded for it, and that names the recorded file (and, for `served`, the file the
    input holds at that key); each part has its recorded size and sha256 and only the
    entry's keys, each with its own file; the kept and dropped rows hold every key exactly
    once. EntryRejected says what failed.

    `materials`: what the input's keys are the hashes of (row_keys), for served keys. A
    recorded material equal to it is proven without hashing it again (the key is its hash,
    computed from the input); any other recorded material is hashed. The checks run as
    Arrow operations over the entry's columns, not a Python loop per key."""
    keys = _one(index[KEY])
    n = len(keys)
    if pc.count_distinct(keys).as_py() != n:
        raise EntryRejected("it lists a key twice")
    sources, paths = _one(index["source_id"]), _one(index["path"])
    material = _one(index[_MATERIAL])
    hashed = pc.is_valid(material)  # None: a key not made by row_keys; its file still counts
    if served:
        asked = pa.array(list(served), pa.string())
        at = pc.index_in(asked, value_set=keys)
        if at.null_count:
            missing = asked.filter(pc.is_null(at))[0].as_py()
            raise EntryRejected(f"key {missing} belongs to None, not {served[missing]}")
        wrong = _differing(
            (sources.take(at), pa.array([s for s, _ in served.values()], pa.string())),
            (paths.take(at), pa.array([p for _, p in served.values()], pa.string())),
        )
        if wrong is not None:
            key = asked[wrong].as_py()
            recorded = (sources[at[wrong].as_py()].as_py(), paths[at[wrong].as_py()].as_py())
            raise EntryRejected(f"key {key} belongs to {recorded}, not {served[key]}")
        if materials:
            theirs = pa.array([materials.get(k) for k in served], pa.string())
            same = pc.fill_null(pc.equal(material.take(at), theirs), False)
            matched = np.zeros(n, dtype=bool)
            matched[at.to_numpy(zero_copy_only=False)[_np_bool(same)]] = True
            hashed = pc.and_(hashed, pa.array(~matched))
    check = np.flatnonzero(_np_bool(hashed))
    if len(check):
        for key, recorded, source, path in zip(
            keys.take(check).to_pylist(),
            material.take(check).to_pylist(),
            sources.take(check).to_pylist(),
            paths.take(check).to_pylist(),
            strict=True,
        ):
            if _key_of(recorded) != key or recorded.split("\0")[1:3] != [source, path]:
                raise EntryRejected(f"key {key} is not the hash of what the entry records for it")
    parts = json.loads((index.schema.metadata or {})[_META_PARTS])
    tables: dict[str, pa.Table] = {}
    for kind, want in sorted(parts.items()):
        path = f"{directory}/{entry}.{kind}{ENTRY_SUFFIX}"
        try:
            data = _read_whole(fs, path)
        except FileNotFoundError as e:
            raise EntryRejected(f"its {kind} part is missing") from e
        except OSError as e:
            raise EntryRejected(f"its {kind} part is unreadable: {e}") from e
        digest = hashlib.sha256(memoryview(data)).hexdigest()
        if data.size != want["bytes"] or digest != want["sha256"]:
            raise EntryRejected(
                f"its {kind} part has {data.size} bytes, sha256 {digest[:12]}...; the entry "
                f"recorded {want['bytes']} bytes, sha256 {want['sha256'][:12]}..."
            )
        try:
            table = pa.ipc.open_file(data).read_all()
        except (OSError, pa.ArrowInvalid) as e:
            raise EntryRejected(f"its {kind} part is unreadable: {e}") from e
        if table.num_rows != want["rows"] or KEY not in table.column_names:
            raise EntryRejected(f"its {kind} part does not hold the rows it recorded")
        row_keys_ = _one(table[KEY])
        at = pc.index_in(row_keys_, value_set=keys)
        if "source_id" in table.column_names and "path" in table.column_names:
            wrong = _first_null(at)
            if wrong is None:
                wrong = _differing(
                    (sources.take(at), _one(table["source_id"])),
                    (paths.take(at), _one(table["path"])),
                )
            if wrong is not None:
                ident = (table["source_id"][wrong].as_py(), table["path"][wrong].as_py())
                raise EntryRejected(
                    f"its {kind} part holds a row of {ident} under key {row_keys_[wrong]}"
                )
        elif at.null_count:
            raise EntryRejected(f"its {kind} part holds a key the entry does not list")
        tables[kind] = table
    decided = [_one(tables[kind][KEY]) for kind in ("kept", "dropped") if kind in tables]
    every = pa.concat_arrays(decided) if decided else pa.array([], pa.string())
    if (
        len(every) != n
        or pc.count_distinct(every).as_py() != n
        or pc.index_in(every, value_set=keys).null_count
    ):
        raise EntryRejected("its kept and dropped rows do not decide each of its files once")
    return tables


def _one(column: pa.ChunkedArray | pa.Array) -> pa.Array:
    """A column as one string array (an entry's few key and identity columns: a small copy)."""
    array = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    return array.cast(pa.string()) if array.type != pa.string() else array


def _np_bool(array: pa.Array | pa.ChunkedArray) -> np.ndarray:
    return np.asarray(array.to_numpy(zero_copy_only=False), dtype=bool)


def _first_null(array: pa.Array) -> int | None:
    if not array.null_count:
        return None
    return int(np.flatnonzero(_np_bool(pc.is_null(array)))[0])


def _differing(*pairs: tuple[pa.Array, pa.Array]) -> int | None:
    """The first row where any pair of equally long string arrays differs (a null differs
    from anything), or None."""
    same: pa.Array | None = None
    for mine, theirs in pairs:
        equal = pc.fill_null(pc.equal(mine, theirs), False)
        same = equal if same is None else pc.and_(same, equal)
    if same is None or pc.all(same).as_py() is not False:
        return None
    return int(np.flatnonzero(~_np_bool(same))[0])


def remove_entry(fs: pafs.FileSystem, directory: str, entry: str) -> None:
    """An entry's index, then its parts (whatever of them is there)."""
    try:
        fs.delete_file(f"{directory}/{entry}{ENTRY_SUFFIX}")
    except OSError:
        pass
    try:
        infos = fs.get_file_info(pafs.FileSelector(directory, allow_not_found=True))
    except OSError:
        return
    for info in infos:
        if info.base_name.startswith(f"{entry}."):
            try:
                fs.delete_file(info.path)
            except OSError:
                pass


def cached_gate_call(
    cache: FileResultCache,
    table: pa.Table,
    keys: list[str],
    gate_call: Callable[[pa.Table], GateResult],
    schemas: dict[str, pa.Schema],
    renamed: Mapping[str, str] | None = None,
) -> tuple[GateResult, int]:
    """The gate's result for `table`, computing only the rows whose key is cached in an
    entry that proves itself. `schemas` names every output table ("kept", "dropped", side
    tables) with its schema. Rows come back in input order, so a cached run writes the same
    shards as a cold one; a cached row carries the input's CARRIED_LIVE columns. `renamed`:
    output columns whose rows often hold the bytes of an input column of another name (the
    entry leaves those rows to the input, as it does a column the gate passes through)."""
    renamed = dict(renamed or {})
    identity = list(zip(table["source_id"].to_pylist(), table["path"].to_pylist(), strict=True))
    position = {ident: i for i, ident in enumerate(identity)}
    key_of = dict(zip(identity, keys, strict=True))
    hit_rows = np.flatnonzero(cache.lookup(keys))
    material = getattr(keys, "material", None)
    proven = cache.fetch_proven(
        [keys[i] for i in hit_rows],
        [identity[i] for i in hit_rows],
        schemas,
        carry=lambda rows, columns, sources: _from_input(rows, columns, sources, table, position),
        materials=[material[i] for i in hit_rows] if material is not None else None,
    )
    served = set(proven.keys)
    misses = np.array([i for i, k in enumerate(keys) if k not in served], dtype=np.int64)
    fresh: GateResult | None = None
    if len(misses) == len(keys) and len(keys):
        fresh = gate_call(table)  # nothing cached: the table as it is, no copy of it
    elif len(misses):
        # the misses in input order: a filter keeps the table's chunks, where a take would
        # first concatenate every chunk of the slice's text into one copy
        chosen = np.zeros(len(keys), dtype=bool)
        chosen[misses] = True
        fresh = gate_call(table.filter(pa.array(chosen)))
    fresh_tables: dict[str, pa.Table] = {}
    if fresh is not None:
        fresh_tables = {"kept": fresh.kept, "dropped": fresh.dropped, **fresh.extra}
        carried, partly = _carried(fresh.kept, table, position, renamed)
        cache.put(
            [keys[i] for i in misses],
            {k: _keys(t, key_of) for k, t in fresh_tables.items()},
            fresh,
            identities=[identity[i] for i in misses],
            material=[material[i] for i in misses] if material is not None else None,
            carried=carried,
            partly=partly,
            renamed=renamed,
        )
    live = {c: table[c].to_pylist() for c in CARRIED_LIVE if c in table.column_names}
    out: dict[str, pa.Table] = {}
    in_order_kept = True
    for kind, schema in schemas.items():
        parts = (
            [fresh_tables[kind].select(schema.names).cast(schema)] if kind in fresh_tables else []
        )
        cached = proven.tables.get(kind)
        if cached is not None and cached.num_rows:
            parts.append(_carry_live(cached, live, position).select(schema.names).cast(schema))
        t = pa.concat_tables(parts) if parts else schema.empty_table()
        order = np.array(
            [
                position[ident]
                for ident in zip(t["source_id"].to_pylist(), t["path"].to_pylist(), strict=True)
            ],
            dtype=np.int64,
        )
        in_order = len(order) < 2 or bool(np.all(order[:-1] <= order[1:]))
        out[kind] = t if in_order else t.take(np.argsort(order, kind="stable"))  # no copy
        in_order_kept = in_order_kept and (kind != "kept" or in_order)
    stats: Counter[str] = Counter(fresh.stats) if fresh is not None else Counter()
    result = GateResult(kept=out.pop("kept"), dropped=out.pop("dropped"), stats=stats, extra=out)
    if fresh is not None and not served and in_order_kept:
        # every kept row is the gate's own, in its order: its note of what it inspected
        # stands; a row served from an entry is vouched for by nothing but that entry
        result.scanned_clean = fresh.scanned_clean
    return result, len(served)


def _carry_live(
    cached: pa.Table, live: dict[str, list[object]], position: dict[tuple[str, str], int]
) -> pa.Table:
    """Cached rows with the live input's values of CARRIED_LIVE columns."""
    if not any(c in cached.column_names for c in live):
        return cached
    rows = [
        position[ident]
        for ident in zip(cached["source_id"].to_pylist(), cached["path"].to_pylist(), strict=True)
    ]
    for name, values in live.items():
        if name in cached.column_names:
            i = cached.schema.get_field_index(name)
            column = pa.array([values[r] for r in rows], cached.schema.field(i).type)
            cached = cached.set_column(i, cached.schema.field(i), column)
    return cached


def _input_rows(rows: pa.Table, position: dict[tuple[str, str], int]) -> pa.Array:
    """Where each of `rows` is in the input table (by source and path)."""
    return pa.array(
        [
            position[ident]
            for ident in zip(rows["source_id"].to_pylist(), rows["path"].to_pylist(), strict=True)
        ],
        pa.int64(),
    )


def _leave_to_input(
    table: pa.Table,
    carried: Sequence[str],
    partly: Mapping[str, pa.ChunkedArray],
    renamed: Mapping[str, str],
) -> pa.Table:
    """A kept part without the values its rows' inputs hold: `carried` columns dropped,
    `partly` columns null where their mask is true, the mask beside them; the input column
    and type of each one an input column of another name holds (`renamed`) recorded."""
    sources = {
        name: [renamed[name], str(table.schema.field(name).type)]
        for name in [*carried, *partly]
        if name in renamed
    }
    table = table.drop_columns(list(carried))
    for name, mask in partly.items():
        i = table.schema.get_field_index(name)
        field = table.schema.field(i).with_nullable(True)
        left = pc.if_else(mask, pa.scalar(None, field.type), table[name])
        # if_else keeps the whole values buffer under the nulls: a take writes only the
        # values left in the entry
        left = left.take(pa.array(np.arange(len(left))))
        table = table.set_column(i, field, left).append_column(_PARTLY + name, mask)
    return table.replace_schema_metadata(
        {
            _META_CARRIED: json.dumps(list(carried)).encode(),
            _META_PARTLY: json.dumps(list(partly)).encode(),
            _META_FROM: json.dumps(sources, sort_keys=True).encode(),
        }
    )


# the types a column held under another input column's name may have (the entry names it)
_BYTES_TYPES = {str(t): t for t in (pa.string(), pa.large_string(), pa.binary(), pa.large_binary())}
# an entry's columns left to the input: (rows, columns, {column: (input column, type)})
Carry = Callable[[pa.Table, list[str], Mapping[str, tuple[str, pa.DataType]]], pa.Table]


def _restored(t: pa.Table, chosen: pa.Array, carry: Carry | None, where: str) -> pa.Table:
    """An entry part's rows of the keys `chosen`, with the columns it left to the input."""
    t = t.filter(pc.is_in(t[KEY], value_set=chosen))
    meta = t.schema.metadata or {}
    carried = json.loads(meta.get(_META_CARRIED, b"[]"))
    partly = json.loads(meta.get(_META_PARTLY, b"[]"))
    if not carried and not partly:
        return t
    if carry is None:
        raise ValueError(f"{where}: its rows need the input's")
    sources = _sources(meta)
    t = t.replace_schema_metadata(None)
    if carried:
        t = carry(t, carried, sources)
    if partly:
        t = _filled(t, partly, carry, sources)
    return t


def _sources(meta: Mapping[bytes, bytes]) -> dict[str, tuple[str, pa.DataType]]:
    """An entry part's columns held under another input column's name, with their types."""
    out: dict[str, tuple[str, pa.DataType]] = {}
    for name, (source, type_name) in json.loads(meta.get(_META_FROM, b"{}")).items():
        if type_name not in _BYTES_TYPES:
            raise EntryRejected(f"its column {name!r} names a type {type_name!r}")
        out[name] = (source, _BYTES_TYPES[type_name])
    return out


def _filled(
    t: pa.Table, names: list[str], carry: Carry, sources: Mapping[str, tuple[str, pa.DataType]]
) -> pa.Table:
    """Cached rows with the input's values where each `names` column's mask says so."""
    live = carry(t.select(["source_id", "path"]), names, sources)
    for name in names:
        i = t.schema.get_field_index(name)
        column = pc.if_else(t[_PARTLY + name], live[name], t[name])
        t = t.set_column(i, t.schema.field(i), column).drop_columns([_PARTLY + name])
    return t


def _carried(
    kept: pa.Table,
    table: pa.Table,
    position: dict[tuple[str, str], int],
    renamed: Mapping[str, str],
) -> tuple[list[str], dict[str, pa.ChunkedArray]]:
    """The text and binary columns whose every kept row holds its input row's value (the
    text a gate only looked at): its entry need not hold a second copy of them; and those
    where at least half the rows do (the text of a gate that rewrites a few files), with
    the mask of those rows. The input's value is its column of the same name, or of the
    name `renamed` gives (its bytes: normalize's text is its input's content as it was).
    The rows' identity stays, to prove the entry, and CARRIED_LIVE columns are the input's
    anyway."""
    source = {c: renamed.get(c, c) for c in kept.column_names}
    names = [
        c
        for c in kept.column_names
        if source[c] in table.column_names
        and c not in ("source_id", "path", *CARRIED_LIVE)
        and (c == source[c] or c not in table.column_names)
        and _is_bytes(kept.schema.field(c).type)
        and _is_large(kept.schema.field(c).type) == _is_large(table.schema.field(source[c]).type)
        and (c != source[c] or kept.schema.field(c).type == table.schema.field(c).type)
    ]
    if not names or not kept.num_rows:
        return [], {}
    rows = _input_rows(kept, position).to_numpy()
    if len(rows) == table.num_rows and np.array_equal(rows, np.arange(len(rows))):
        # every row kept in order: a column the gate passed through is the input's own
        # chunks, which Arrow compares by identity without reading them
        def live(c: str) -> pa.ChunkedArray:
            return table[c]
    elif len(rows) < 2 or bool(np.all(rows[:-1] < rows[1:])):
        chosen = np.zeros(table.num_rows, dtype=bool)  # a filter keeps the input's chunks
        chosen[rows] = True
        mask = pa.array(chosen)

        def live(c: str) -> pa.ChunkedArray:
            return table[c].filter(mask)
    else:
        taken = pa.array(rows)

        def live(c: str) -> pa.ChunkedArray:
            return table[c].take(taken)

    whole: list[str] = []
    partly: dict[str, pa.ChunkedArray] = {}
    for c in names:
        values = live(source[c])
        mine = kept[c] if c == source[c] else kept[c].cast(values.type)  # text as its bytes
        if mine.equals(values):
            whole.append(c)
            continue
        same = pc.fill_null(pc.equal(mine, values), False)
        if 2 * (pc.sum(same).as_py() or 0) >= kept.num_rows:
            partly[c] = same
    return whole, partly


def _from_input(
    rows: pa.Table,
    columns: list[str],
    sources: Mapping[str, tuple[str, pa.DataType]],
    table: pa.Table,
    position: dict[tuple[str, str], int],
) -> pa.Table:
    """Cached rows with `columns` taken from their rows of the input table (a column held
    under another input column's name: that column's bytes as the entry's type, checked)."""
    at = _input_rows(rows, position)
    for name in columns:
        if name not in sources:
            rows = rows.append_column(table.schema.field(name), table[name].take(at))
            continue
        source, type_ = sources[name]
        if source not in table.column_names:
            raise EntryRejected(f"its column {name!r} is left to an input column {source!r}")
        try:
            values = table[source].take(at).cast(type_)  # text: valid UTF-8 or rejected
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
            raise EntryRejected(f"its column {name!r} is not its input's {source!r}: {e}") from e
        rows = rows.append_column(pa.field(name, type_), values)
    return rows


def _keys(table: pa.Table, key_of: dict[tuple[str, str], str]) -> list[str]:
    return [
        key_of[ident]
        for ident in zip(table["source_id"].to_pylist(), table["path"].to_pylist(), strict=True)
    ]
