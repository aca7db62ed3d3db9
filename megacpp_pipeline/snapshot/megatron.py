"""Megatron-LM's MMIDIDX `.bin`/`.idx` pair: the writer, the snapshot export and our own reader.

Decides how a snapshot becomes Megatron input: one sequence per document, its tokens in piece
order, in the dtype megatron-core itself picks for the vocabulary. Seed rule: promotion must
prove that a consumer nobody here wrote can read the snapshot, so the bytes follow
megatron-core's `indexed_dataset` exactly: magic, version 1, dtype code, sequence count,
document count, int32 sequence lengths, int64 byte pointers, int64 document indices.
"""

from __future__ import annotations

import hashlib
import json
import mmap
import os
import struct
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from megacpp_pipeline.core.errors import FieldedError
from megacpp_pipeline.loader import read_snapshot_manifest, split_shards
from megacpp_pipeline.snapshot import layout
from megacpp_pipeline.snapshot.layout import COMPLETE, MANIFEST, SnapshotManifest
from megacpp_pipeline.snapshot.packed_rows import fixed_list_to_numpy, with_copy_column
from megacpp_pipeline.snapshot.shard_checks import Mapper, file_facts, inline
from megacpp_pipeline.storage.versions import pid_alive, recorded_manifest_sha256, sha256_file

INDEX_MAGIC = b"MMIDIDX\x00\x00"
INDEX_VERSION = 1
_HEADER = struct.Struct("<9sQBQQ")  # magic, version, dtype code, sequences, documents
# megatron.core.datasets.indexed_dataset.DType
DTYPE_CODES: dict[np.dtype[Any], int] = {
    np.dtype(np.uint8): 1,
    np.dtype(np.int8): 2,
    np.dtype(np.int16): 3,
    np.dtype(np.int32): 4,
    np.dtype(np.int64): 5,
    np.dtype(np.float64): 6,
    np.dtype(np.float32): 7,
    np.dtype(np.uint16): 8,
}
_DTYPES_BY_CODE = {code: dtype for dtype, code in DTYPE_CODES.items()}
# megatron-core memory-maps the .bin whole, and a file of zero bytes cannot be mapped: a pair
# without tokens would be refused by the consumer it is written for, so it is never written.
_NO_TOKENS = "no tokens to write: megatron-core cannot memory-map an empty .bin"


class IndexedDatasetFormatError(FieldedError):
    def __init__(self, path: Path, field: str, rule: str) -> None:
        super().__init__(f"{path}: {field}: {rule}")
        self.path = path
        self.field = field
        self.rule = rule


class MegatronExportError(FieldedError):
    def __init__(self, source: Path, field: str, rule: str) -> None:
        super().__init__(f"{source}: {field}: {rule}")
        self.source = source
        self.field = field
        self.rule = rule


@dataclass(frozen=True)
class IndexedDatasetSummary:
    prefix: Path
    dtype: str
    sequences: int
    documents: int
    tokens: int
    bin_bytes: int


def verify_inputs(
    root: Path, manifest: SnapshotManifest, relpaths: Iterable[str], mapper: Mapper = inline
) -> None:
    """The snapshot files an export reads are the promoted bytes: the manifest is the one
    `_COMPLETE` recorded, and each file has the size and sha256 the manifest lists (the
    export memory-maps only some columns, so each file is hashed once up front, a task of
    `mapper` each)."""
    recorded = recorded_manifest_sha256((root / COMPLETE).read_bytes())
    if recorded is not None and sha256_file(root / MANIFEST) != recorded:
        raise MegatronExportError(
            root / MANIFEST, "sha256", f"differs from the one {COMPLETE} recorded"
        )
    entries = {f.path: f for f in manifest.files}
    for rel in relpaths:
        if rel not in entries:
            raise MegatronExportError(root / rel, "files", "not listed in the snapshot manifest")
    for facts in mapper(file_facts, root, list(relpaths)):
        entry = entries[facts.rel]
        if (facts.exists, facts.bytes, facts.sha256) != (
            True,
            entry.bytes,
            entry.sha256,
        ):
            found = f"{facts.bytes} bytes, sha256 {facts.sha256}" if facts.exists else "missing"
            raise MegatronExportError(
                root / facts.rel,
                "sha256",
                f"{found}; the snapshot manifest records {entry.bytes} bytes, sha256 "
                f"{entry.sha256}: the file changed after promotion, so the export is "
                "refused (`megacpp verify --full` names every changed file; re-run the "
                "pipeline to promote the snapshot again)",
            )


def megatron_token_dtype(vocab_size: int | None) -> np.dtype[Any]:
    """The token dtype megatron-core's `DType.optimal_dtype` picks for this vocabulary."""
    if vocab_size is not None and vocab_size < 65500:
        return np.dtype(np.uint16)
    return np.dtype(np.int32)


def _dtype_code(dtype: np.dtype[Any], where: Path) -> int:
    if dtype not in DTYPE_CODES:
        raise MegatronExportError(where, "dtype", f"{dtype} has no Megatron dtype code")
    return DTYPE_CODES[dtype]


def _check_token_range(tokens: np.ndarray, dtype: np.dtype[Any], where: Path, field: str) -> None:
    if not tokens.size or dtype.kind == "f":
        return
    info = np.iinfo(dtype)
    low, high = int(tokens.min()), int(tokens.max())
    if low < info.min or high > info.max:
        raise MegatronExportError(where, field, f"ids span [{low}, {high}], beyond {dtype}")


def _write_index(
    idx_path: Path,
    dtype: np.dtype[Any],
    sequence_lengths: np.ndarray,
    document_indices: np.ndarray,
) -> None:
    lengths = np.ascontiguousarray(sequence_lengths, dtype="<i4")
    pointers = np.zeros(len(lengths), dtype="<i8")
    np.cumsum(lengths[:-1].astype(np.int64) * dtype.itemsize, out=pointers[1:])
    with idx_path.open("wb") as out:
        out.write(
            _HEADER.pack(
                INDEX_MAGIC,
                INDEX_VERSION,
                _dtype_code(dtype, idx_path),
                len(lengths),
                len(document_indices),
            )
        )
        out.write(lengths.tobytes(order="C"))
        out.write(pointers.tobytes(order="C"))
        out.write(np.ascontiguousarray(document_indices, dtype="<i8").tobytes(order="C"))


def _tmp(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    # a killed export leaves its <pid>.tmp behind: remove those of dead processes
    for stale in path.parent.glob(f"{path.name}.*.tmp"):
        pid = stale.name[len(path.name) + 1 : -len(".tmp")]
        if pid.isdigit() and not pid_alive(int(pid)):
            stale.unlink(missing_ok=True)
    return path.with_name(f"{path.name}.{os.getpid()}.tmp")


def _promote(bin_tmp: Path, idx_tmp: Path, prefix: Path) -> None:
    # .bin first: an .idx only ever appears next to the data it describes
    os.replace(bin_tmp, prefix.with_name(prefix.name + ".bin"))
    os.replace(idx_tmp, prefix.with_name(prefix.name + ".idx"))


def write_indexed_dataset(
    prefix: str | os.PathLike[str],
    sequences: Iterable[np.ndarray],
    dtype: np.dtype[Any] | type[np.number[Any]] = np.int32,
) -> IndexedDatasetSummary:
    """Stream sequences (one per document) into `prefix.bin` / `prefix.idx`, atomically."""
    prefix = Path(prefix)
    dtype = np.dtype(dtype)
    _dtype_code(dtype, prefix)
    bin_tmp = _tmp(prefix.with_name(prefix.name + ".bin"))
    idx_tmp = _tmp(prefix.with_name(prefix.name + ".idx"))
    lengths = np.empty(1024, dtype=np.int64)
    count = 0
    try:
        with bin_tmp.open("wb") as out:
            for number, sequence in enumerate(sequences):
                array = np.asarray(sequence)
                _check_token_range(array, dtype, prefix, f"sequence {number}")
                out.write(np.ascontiguousarray(array, dtype=dtype.newbyteorder("<")).tobytes())
                if count == len(lengths):
                    lengths = np.resize(lengths, 2 * count)
                lengths[count] = array.size
                count += 1
        lengths = lengths[:count]
        if not lengths.sum():
            raise MegatronExportError(prefix, "sequences", f"{count} sequences, {_NO_TOKENS}")
        _write_index(idx_tmp, dtype, lengths, np.arange(count + 1, dtype=np.int64))
        _promote(bin_tmp, idx_tmp, prefix)
    finally:
        bin_tmp.unlink(missing_ok=True)
        idx_tmp.unlink(missing_ok=True)
    return IndexedDatasetSummary(
        prefix, dtype.name, count, count, int(lengths.sum()), int(lengths.sum()) * dtype.itemsize
    )


def _exclusive_cumsum(values: np.ndarray) -> np.ndarray:
    out = np.zeros(len(values), dtype=np.int64)
    np.cumsum(values[:-1], out=out[1:])
    return out


def _ranges(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Concatenation of arange(start, start + length) for each pair, without a Python loop."""
    lengths = lengths.astype(np.int64)
    within = np.arange(int(lengths.sum()), dtype=np.int64) - np.repeat(
        _exclusive_cumsum(lengths), lengths
    )
    return np.repeat(starts.astype(np.int64), lengths) + within


def _read_columns(path: Path, wanted: list[str], split: str) -> pa.Table:
    """Only the columns the export reads, of those the file has (a document's path, hashes
    and licence are most of documents.parquet and never needed here), and only the rows of
    `split`, a row group at a time: the other split's rows are never held."""
    parquet = pq.ParquetFile(path, read_dictionary=["split"])
    present = set(parquet.schema_arrow.names)
    columns = [c for c in wanted if c in present]
    parts = [
        t.filter(pc.equal(t["split"], split)).drop_columns(["split"])
        for g in range(parquet.num_row_groups)
        for t in [parquet.read_row_group(g, columns)]
    ]
    schema = parquet.schema_arrow
    empty = pa.schema([schema.field(c) for c in columns if c != "split"]).empty_table()
    return pa.concat_tables([empty, *parts]) if parts else empty


def export_snapshot(
    snapshot_dir: str | os.PathLike[str],
    out_prefix: str | os.PathLike[str],
    split: str = "train",
    dtype: np.dtype[Any] | type[np.number[Any]] | None = None,
    mapper: Mapper = inline,
) -> IndexedDatasetSummary:
    """Write one Megatron sequence per document of `split` and per copy of it in the rows (a
    source weighted above 1 packs some documents more than once; one below 1 leaves some
    out), in doc_id then copy order: the sequences an epoch over the rows trains on. A split
    without documents (a snapshot may have one with no rows) is refused: there is nothing to
    train on and megatron-core cannot open an empty `.bin`.

    Two passes: `pieces.parquet` fixes where every piece lands in the output, then each
    shard's `input_ids` is scattered into the preallocated `.bin` by a task of `mapper` (an
    executor's map on this host: the tasks write disjoint ranges of one local file), so a
    document whose pieces sit in different rows or shards comes out whole without holding
    the corpus in memory.
    """
    root = Path(snapshot_dir)
    prefix = Path(out_prefix)
    manifest = read_snapshot_manifest(root)
    seq_len = manifest.seq_len
    dtype = np.dtype(dtype) if dtype is not None else megatron_token_dtype(manifest.vocab_size)
    _dtype_code(dtype, prefix)
    shards = split_shards(manifest, split, root)
    verify_inputs(root, manifest, [layout.DOCUMENTS, layout.PIECES, *shards], mapper)

    docs = _read_columns(root / layout.DOCUMENTS, ["doc_id", "split", "num_tokens", "draws"], split)
    docs = docs.sort_by("doc_id")
    doc_ids = docs.column("doc_id").to_numpy().astype(np.int64)
    doc_tokens = docs.column("num_tokens").to_numpy().astype(np.int64)
    # a weighted document is packed `draws` times (0: its weight left it out); each copy is
    # a sequence of its own, as an epoch over the rows sees it. Before weights: once each.
    draws = (
        docs.column("draws").to_numpy().astype(np.int64)
        if "draws" in docs.column_names
        else np.ones(len(doc_ids), dtype=np.int64)
    )
    del docs
    pieces = with_copy_column(
        _read_columns(
            root / layout.PIECES,
            ["doc_id", "copy", "piece_index", "pack_id", "row_offset", "length", "split"],
            split,
        )
    )
    # in (doc_id, copy, piece_index) order; each column taken on its own, so no sorted copy
    # of the whole table is ever held beside the columns
    columns = {name: pieces.column(name).to_numpy() for name in pieces.column_names}
    del pieces
    order = np.lexsort((columns["piece_index"], columns["copy"], columns["doc_id"]))
    piece_doc, piece_copy, piece_index, piece_pack, piece_offset, piece_length = (
        columns.pop(name)[order].astype(np.int64)
        for name in ("doc_id", "copy", "piece_index", "pack_id", "row_offset", "length")
    )
    del order
    pieces_path = root / layout.PIECES
    if len(np.unique(doc_ids)) != len(doc_ids):
        raise MegatronExportError(root / layout.DOCUMENTS, "doc_id", "duplicate doc_id")
    # the sequences, in (doc_id, copy) order: every copy of every document of the split
    seq_doc = np.repeat(doc_ids, draws)
    seq_copy = np.arange(len(seq_doc)) - np.repeat(_exclusive_cumsum(draws), draws)
    seq_tokens = np.repeat(doc_tokens, draws)
    seq_key = (seq_doc << 32) | seq_copy
    piece_key = (piece_doc << 32) | piece_copy
    piece_seq = np.searchsorted(seq_key, piece_key)
    known = piece_seq < len(seq_key)
    known[known] = seq_key[piece_seq[known]] == piece_key[known]
    if not known.all():
        doc = int(piece_doc[~known][0])
        raise MegatronExportError(
            pieces_path, f"doc_id {doc}", f"not in {layout.DOCUMENTS}, or a copy beyond its draws"
        )
    first_piece = np.ones(len(piece_doc), dtype=bool)
    first_piece[1:] = piece_key[1:] != piece_key[:-1]
    expected_index = np.arange(len(piece_doc)) - np.maximum.accumulate(
        np.where(first_piece, np.arange(len(piece_doc)), 0)
    )
    if (bad := np.flatnonzero(piece_index != expected_index)).size:
        doc = int(piece_doc[bad[0]])
        raise MegatronExportError(pieces_path, f"doc_id {doc}", "piece_index not 0, 1, 2, ...")
    if (bad := np.flatnonzero((piece_offset < 0) | (piece_offset + piece_length > seq_len))).size:
        doc = int(piece_doc[bad[0]])
        raise MegatronExportError(pieces_path, f"doc_id {doc}", "piece runs outside its row")
    placed_tokens = np.bincount(piece_seq, weights=piece_length, minlength=len(seq_key)).astype(
        np.int64
    )
    if (bad := np.flatnonzero(placed_tokens != seq_tokens)).size:
        doc = int(seq_doc[bad[0]])
        raise MegatronExportError(
            pieces_path,
            f"doc_id {doc}",
            f"pieces hold {int(placed_tokens[bad[0]])} tokens, {layout.DOCUMENTS} says "
            f"{int(seq_tokens[bad[0]])}",
        )
    # pieces are sorted by (doc, copy, piece) and sequences likewise, so each piece's
    # destination is the running total of the lengths before it
    piece_dest = _exclusive_cumsum(piece_length)
    total = int(piece_length.sum())
    if not total:
        raise MegatronExportError(
            root, f"splits.{split}", f"{len(doc_ids)} documents, {_NO_TOKENS}"
        )
    by_pack = np.argsort(piece_pack, kind="stable")
    sorted_pack = piece_pack[by_pack]
    placed = np.zeros(len(piece_pack), dtype=np.int64)

    bin_tmp = _tmp(prefix.with_name(prefix.name + ".bin"))
    idx_tmp = _tmp(prefix.with_name(prefix.name + ".idx"))
    # the .bin is written with pwrite, not through a memory map: dirty mapped pages count in
    # this process' resident set, so a map would hold the whole split's tokens resident
    fd = os.open(bin_tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.ftruncate(fd, total * dtype.itemsize)
        os.close(fd)
        fd = -1
        job = _Scatter(
            root, seq_len, dtype, bin_tmp, sorted_pack, by_pack, piece_offset, piece_length,
            piece_dest,
        )  # fmt: skip
        for chosen in mapper(_scatter_shard, job, list(shards)):
            np.add.at(placed, chosen, 1)
        if (bad := np.flatnonzero(placed != 1)).size:
            doc, pack = int(piece_doc[bad[0]]), int(piece_pack[bad[0]])
            raise MegatronExportError(
                pieces_path,
                f"doc_id {doc}",
                f"row pack_id {pack} found {int(placed[bad[0]])} times in split {split!r}",
            )
        _write_index(idx_tmp, dtype, seq_tokens, np.arange(len(seq_key) + 1, dtype=np.int64))
        _promote(bin_tmp, idx_tmp, prefix)
    finally:
        if fd >= 0:
            os.close(fd)
        bin_tmp.unlink(missing_ok=True)
        idx_tmp.unlink(missing_ok=True)
    return IndexedDatasetSummary(
        prefix, dtype.name, len(seq_key), len(seq_key), total, total * dtype.itemsize
    )


@dataclass(frozen=True)
class _Scatter:
    """What every shard's scatter task needs: where each piece of the split goes."""

    root: Path
    seq_len: int
    dtype: np.dtype[Any]
    bin_path: Path
    sorted_pack: np.ndarray  # piece pack_ids, sorted
    by_pack: np.ndarray  # piece indices in that order
    offset: np.ndarray  # per piece: where in its row it starts
    length: np.ndarray
    dest: np.ndarray  # per piece: where in the .bin (in tokens) it goes


def _scatter_shard(job: _Scatter, relpath: str) -> np.ndarray:
    """One shard's pieces written into the .bin; the pieces it placed (indices)."""
    placed: list[np.ndarray] = []
    parquet = pq.ParquetFile(job.root / relpath, memory_map=True)
    fd = os.open(job.bin_path, os.O_WRONLY)
    try:
        for group in range(parquet.num_row_groups):
            table = parquet.read_row_group(group, columns=["pack_id", "input_ids"])
            rows = table.column("pack_id").to_numpy()
            tokens = fixed_list_to_numpy(table.column("input_ids"), job.seq_len).reshape(-1)
            lo = np.searchsorted(job.sorted_pack, rows, side="left")
            hi = np.searchsorted(job.sorted_pack, rows, side="right")
            if not (hi - lo).any():
                continue
            chosen = job.by_pack[_ranges(lo, hi - lo)]
            row_of_piece = np.repeat(np.arange(len(rows)), hi - lo)
            src = _ranges(row_of_piece * job.seq_len + job.offset[chosen], job.length[chosen])
            values = tokens[src]
            _check_token_range(values, job.dtype, job.root / relpath, "input_ids")
            _write_pieces(fd, values.astype(job.dtype), job.dest[chosen], job.length[chosen])
            placed.append(chosen)
    finally:
        os.close(fd)
    return np.concatenate(placed) if placed else np.empty(0, np.int64)


EXPORTED = "EXPORTED"  # written last into an export folder: what it was made from, its files


def _code() -> str:
    """This module's sha256: the export's format and layout are written here."""
    return hashlib.sha256(Path(__file__).read_bytes()).hexdigest()


def _exported(out: Path, snapshot_id: str, mapper: Mapper) -> bool:
    """Whether `out` holds this snapshot's export by this code: its marker names both and
    every .bin/.idx it lists with its sha256, and no other."""
    try:
        marker = json.loads((out / EXPORTED).read_text())
        files: dict[str, str] = dict(marker["files"])
        if marker["snapshot_id"] != snapshot_id or marker["code"] != _code():
            return False
    except (OSError, ValueError, KeyError, TypeError):
        return False
    present = {p.relative_to(out).as_posix() for p in out.rglob("*") if p.suffix in _EXPORT}
    if present != set(files):
        return False
    return all(
        f.exists and f.sha256 == files[f.rel] for f in mapper(file_facts, out, sorted(files))
    )


_EXPORT = (".bin", ".idx")


def export_once(
    snapshot_dir: str | os.PathLike[str], out_dir: str | os.PathLike[str], mapper: Mapper = inline
) -> bool:
    """Every split with rows exported to `out_dir/<split>`, unless the folder already holds
    this snapshot's export by this code, every file the bytes its marker lists: the
    promotion check exports once and the megatron stage takes that export. True when it
    exported now."""
    root, out = Path(snapshot_dir), Path(out_dir)
    manifest = read_snapshot_manifest(root)
    if _exported(out, manifest.snapshot_id, mapper):
        return False
    out.mkdir(parents=True, exist_ok=True)
    (out / EXPORTED).unlink(missing_ok=True)
    for stale in [p for p in out.rglob("*") if p.suffix in _EXPORT]:
        stale.unlink()
    for split, entry in manifest.splits.items():
        if entry.rows:
            export_snapshot(root, out / split, split=split, mapper=mapper)
    written = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.suffix in _EXPORT)
    files = {f.rel: f.sha256 for f in mapper(file_facts, out, written)}
    marker = {"snapshot_id": manifest.snapshot_id, "code": _code(), "files": files}
    (out / EXPORTED).write_text(json.dumps(marker, indent=2, sort_keys=True) + "\n")
    return True


def _write_pieces(fd: int, values: np.ndarray, dest: np.ndarray, lengths: np.ndarray) -> None:
    """`values` (the pieces' tokens, one after another) written piece by piece at `dest`
    (in tokens) of the open .bin."""
    size = values.dtype.itemsize
    view = np.ascontiguousarray(values).data.cast("B")
    start = 0
    for at, n in zip(dest.tolist(), lengths.tolist(), strict=True):
        chunk, offset = view[start * size : (start + n) * size], at * size
        while chunk:
            written = os.pwrite(fd, chunk, offset)
            chunk, offset = chunk[written:], offset + written
        start += n


class IndexedDatasetReader:
    """Our own reader of an MMIDIDX pair, written from the format, not from megatron-core.

    Every length, pointer and document index is checked against the file sizes when it
    opens, so a truncated or foreign file fails here with the field that is wrong.
    """

    def __init__(self, prefix: str | os.PathLike[str]) -> None:
        self.prefix = Path(prefix)
        self.idx_path = self.prefix.with_name(self.prefix.name + ".idx")
        self.bin_path = self.prefix.with_name(self.prefix.name + ".bin")
        idx = self.idx_path.read_bytes()
        if len(idx) < _HEADER.size:
            raise IndexedDatasetFormatError(self.idx_path, "header", "file is shorter than it")
        magic, version, code, sequences, documents = _HEADER.unpack_from(idx)
        if magic != INDEX_MAGIC:
            raise IndexedDatasetFormatError(self.idx_path, "magic", f"{magic!r} is not MMIDIDX")
        if version != INDEX_VERSION:
            raise IndexedDatasetFormatError(self.idx_path, "version", f"{version} is not 1")
        if code not in _DTYPES_BY_CODE:
            raise IndexedDatasetFormatError(self.idx_path, "dtype code", f"unknown code {code}")
        self.dtype = _DTYPES_BY_CODE[code]
        body = _HEADER.size + sequences * (4 + 8) + documents * 8
        if len(idx) not in (body, body + sequences):  # + one int8 mode each when multimodal
            raise IndexedDatasetFormatError(
                self.idx_path, "size", f"{len(idx)} bytes, counts in the header need {body}"
            )
        offset = _HEADER.size
        self.sequence_lengths = np.frombuffer(idx, "<i4", sequences, offset)
        offset += 4 * sequences
        self.sequence_pointers = np.frombuffer(idx, "<i8", sequences, offset)
        offset += 8 * sequences
        self.document_indices = np.frombuffer(idx, "<i8", documents, offset)

        if (self.sequence_lengths < 0).any():
            raise IndexedDatasetFormatError(self.idx_path, "sequence lengths", "negative length")
        expected = _exclusive_cumsum(self.sequence_lengths.astype(np.int64) * self.dtype.itemsize)
        if not np.array_equal(self.sequence_pointers, expected):
            raise IndexedDatasetFormatError(
                self.idx_path, "sequence pointers", "not the running sum of the lengths"
            )
        di = self.document_indices
        if not len(di) or di[0] != 0 or di[-1] != sequences or (np.diff(di) < 0).any():
            raise IndexedDatasetFormatError(
                self.idx_path, "document indices", f"must rise from 0 to {sequences}"
            )
        self.total_tokens = int(self.sequence_lengths.sum(dtype=np.int64))
        bin_bytes = self.bin_path.stat().st_size
        if bin_bytes != self.total_tokens * self.dtype.itemsize:
            raise IndexedDatasetFormatError(
                self.bin_path,
                "size",
                f"{bin_bytes} bytes, the index describes {self.total_tokens * self.dtype.itemsize}",
            )
        self._file = self.bin_path.open("rb")
        self._data: mmap.mmap | bytes = (
            mmap.mmap(self._file.fileno(), 0, access=mmap.ACCESS_READ) if bin_bytes else b""
        )

    @property
    def document_count(self) -> int:
        return len(self.document_indices) - 1

    def __len__(self) -> int:
        return len(self.sequence_lengths)

    def __getitem__(self, index: int) -> np.ndarray:
        if not -len(self) <= index < len(self):
            raise IndexError(f"sequence {index} of {len(self)}")
        index %= len(self)
        return np.frombuffer(
            self._data,
            self.dtype,
            int(self.sequence_lengths[index]),
            int(self.sequence_pointers[index]),
        )

    def get(self, index: int, offset: int = 0, length: int | None = None) -> np.ndarray:
        """Tokens offset..offset+length of one sequence, as megatron-core's
        `IndexedDataset.get` reads a training sample out of a document; a zero-copy view."""
        if not -len(self) <= index < len(self):
            raise IndexError(f"sequence {index} of {len(self)}")
        index %= len(self)
        size = int(self.sequence_lengths[index])
        if length is None:
            length = size - offset
        if offset < 0 or length < 0 or offset + length > size:
            raise IndexError(f"tokens {offset}..{offset + length} of sequence {index} ({size})")
        start = int(self.sequence_pointers[index]) + offset * self.dtype.itemsize
        return np.frombuffer(self._data, self.dtype, length, start)

    def document(self, index: int) -> np.ndarray:
        lo, hi = int(self.document_indices[index]), int(self.document_indices[index + 1])
        if hi - lo == 1:
            return self[lo]
        return np.concatenate([self[i] for i in range(lo, hi)] or [np.empty(0, self.dtype)])

    def close(self) -> None:
        if isinstance(self._data, mmap.mmap):
            try:
                self._data.close()
            except BufferError:  # arrays handed out still view it; the map dies with them
                pass
        self._file.close()

    def __enter__(self) -> IndexedDatasetReader:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
