"""Promotion: a snapshot directory is built beside its final place and renamed into it, so
no reader ever sees half of one; `_COMPLETE` is written last and its absence means "not a
snapshot". The snapshot id is a hash of the content, so the same inputs, config and code give
the same id (seed: a snapshot either survives promotion checks or it does not).

What a snapshot holds and what each file is called: snapshot/layout.py (DESIGN section 4).
"""

from __future__ import annotations

import hashlib
import json
import os
import resource
import shutil
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeAlias

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from megacpp_pipeline.core.ledger import LEDGER_SCHEMA
from megacpp_pipeline.core.schemas import DOCUMENT_FILES, DOCUMENTS
from megacpp_pipeline.corpus.repository import file_document_files
from megacpp_pipeline.snapshot import layout
from megacpp_pipeline.snapshot.card import CardInputs, render_card
from megacpp_pipeline.snapshot.layout import (
    COMPLETE,
    MANIFEST,
    SPLITS,
    FileEntry,
    SnapshotManifest,
    SourceEntry,
    SplitEntry,
    snapshot_id_of,
)
from megacpp_pipeline.snapshot.packed_rows import PIECES_SCHEMA, with_copy_column
from megacpp_pipeline.snapshot.shard_checks import Mapper, file_facts, inline
from megacpp_pipeline.snapshot.streams import (
    Cursor,
    StreamWriter,
    coalesce,
    group_counts,
    in_order,
    remove_temps,
    write_stream,
)
from megacpp_pipeline.storage.versions import (
    complete_marker,
    pid_alive,
    sha256_file,
    write_parquet_atomic,
)

if TYPE_CHECKING:
    from megacpp_pipeline.storage.store import ShardStore

_CHUNK = 1 << 20


class SnapshotError(Exception):
    """A snapshot could not be built or read; the message names the file and the rule."""


class SnapshotConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    # Round-trip every document up to this many; above it, a seeded sample of this size.
    round_trip_sample: int = Field(default=5000, ge=1)
    smoke_batches: int = Field(default=4, ge=1)
    smoke_batch_size: int = Field(default=8, ge=1)
    seed: int = 0
    keep_snapshots: int = Field(default=3, ge=1)
    # write the text release (snapshot/text_release.py) into the snapshot's text/ folder,
    # checked with the rest before promotion
    text: bool = False
    # documents the text_release check re-tokenizes (a seeded sample; all of them when fewer)
    text_sample: int = Field(default=1000, ge=1)


@dataclass(frozen=True)
class ShardSource:
    """A packed-row shard in the store: copied into the snapshot by a task that checks the
    bytes it reads against the size and sha256 its version recorded."""

    fs: pafs.FileSystem
    path: str
    sha256: str
    bytes: int


@dataclass(frozen=True)
class _Copied:
    entry: FileEntry
    tokens: int


def _copy_shard(work: Path, item: tuple[ShardSource | Path, str]) -> _Copied:
    """One rows shard into the build: read once, hashed while it is written, checked
    against what its version recorded; its rows and valid tokens counted."""
    source, rel = item
    fs, path = (
        (source.fs, source.path)
        if isinstance(source, ShardSource)
        else (pafs.LocalFileSystem(), str(source))
    )
    digest = hashlib.sha256()
    size = 0
    dest = work / rel
    with fs.open_input_stream(path) as src, open(dest, "wb") as out:
        while chunk := src.read(_CHUNK):
            digest.update(chunk)
            out.write(chunk)
            size += len(chunk)
    sha = digest.hexdigest()
    if isinstance(source, ShardSource) and (sha, size) != (source.sha256, source.bytes):
        raise SnapshotError(
            f"{path}: {size} bytes with sha256 {sha[:12]}..., its version recorded "
            f"{source.bytes} bytes with sha256 {source.sha256[:12]}...: not copied into a snapshot"
        )
    meta = pq.read_metadata(dest)
    col = pq.read_table(dest, columns=["valid_token_count"])
    tokens = int(pa.compute.sum(col["valid_token_count"]).as_py() or 0)
    return _Copied(FileEntry(path=rel, sha256=sha, bytes=size, rows=meta.num_rows), tokens)


# A table stream of a snapshot's parts: tables (a list is read again by each writer that
# needs it) or a function that opens the stream afresh, so the single files can be written
# by forked workers at once, each reading what it needs itself
Stream: TypeAlias = pa.Table | Sequence[pa.Table] | Callable[[], Iterable[pa.Table]]


def open_stream(stream: Stream) -> Iterable[pa.Table]:
    """A part's tables, opened afresh when it is a function."""
    if callable(stream):
        return stream()
    return [stream] if isinstance(stream, pa.Table) else stream


@dataclass
class SnapshotParts:
    """Everything a snapshot is made of, as streams each single-file writer opens."""

    name: str
    seq_len: int
    vocab_size: int
    tokenizer_json: bytes
    tokenizer_info: dict[str, Any]
    rows: dict[str, list[ShardSource | Path]]  # split -> packed-row shards, in order
    # schemas.DOCUMENTS rows in doc_id order (metadata only)
    documents: Stream
    # PIECES_SCHEMA rows in (doc_id, copy, piece_index) order (no `copy`: every piece is of
    # its document's one copy)
    pieces: Stream
    # the final ledger (final_ledger / final_ledger_chunks): every collected file, source by
    # source in collection order
    ledger: Stream
    ledger_stages: list[str]  # the stages that write ledgers, collect first (the registry's)
    inputs: dict[str, str]
    code_version: str
    config_hash: str
    sources: dict[str, SourceEntry] = field(default_factory=dict)  # with their revisions
    # schemas.DOCUMENT_FILES rows in (doc_id, position) order; None: file mode, one file per
    # document (derived from the documents)
    document_files: Stream | None = None
    document_mode: str = "file"
    engine: dict[str, Any] = field(default_factory=lambda: {"engine": "local"})  # ran the gates
    tokenizer_policy: dict[str, Any] = field(default_factory=dict)  # the tokenizer stage's
    draw_seed: int = 0  # the packer's seed, which the weighted draws used


def _write_parquet(table: pa.Table, path: Path) -> None:
    try:
        write_parquet_atomic(table, path)
    except OSError as e:
        raise SnapshotError(f"{path}: did not read back ({e})") from e


# documents.parquet: the documents stage's rows, `num_tokens` (the text's own tokens) as
# `text_tokens`, then what the pieces hold of each copy: how many, and its packed tokens (BOS,
# text, EOS, FIM sentinels; every copy is packed the same), and `draws`, the copies of it in
# the rows (0 for a document its source's weight left out)
# (nullable: the file keeps what the documents stage had, nothing is refused here)
_DOCUMENTS = pa.schema([f.with_nullable(True) for f in DOCUMENTS])
SNAPSHOT_DOCUMENTS = pa.schema(
    [
        *(f.with_name("text_tokens") if f.name == "num_tokens" else f for f in _DOCUMENTS),
        pa.field("num_pieces", pa.int32(), nullable=False),
        pa.field("num_tokens", pa.int32(), nullable=False),
        pa.field("draws", pa.int32(), nullable=False),
    ],
    metadata={"megacpp.table": "snapshot_documents", "megacpp.schema_version": "3"},
)


@dataclass
class Mixture:
    """What the documents and their draws add up to, counted while documents.parquet is
    written: per split its documents and the copies packed (`sequences`), per source the
    same (the manifest's splits and sources)."""

    split_documents: Counter[str] = field(default_factory=Counter)
    split_sequences: Counter[str] = field(default_factory=Counter)
    source_documents: Counter[str] = field(default_factory=Counter)
    source_sequences: Counter[str] = field(default_factory=Counter)

    def count(self, chunk: pa.Table, draws: np.ndarray) -> None:
        for key, documents, sequences in (
            ("split", self.split_documents, self.split_sequences),
            ("source_id", self.source_documents, self.source_sequences),
        ):
            codes = pc.dictionary_encode(chunk[key].combine_chunks())
            at = codes.indices.to_numpy(zero_copy_only=False)
            labels = codes.dictionary.to_pylist()
            docs = np.bincount(at, minlength=len(labels))
            copies = np.bincount(at, weights=draws, minlength=len(labels))
            for label, n, m in zip(labels, docs.tolist(), copies.tolist(), strict=True):
                documents[label] += int(n)
                sequences[label] += int(m)


def _per_document(held: pa.Table, ids: np.ndarray) -> tuple[np.ndarray, ...]:
    """For documents `ids` (sorted), from their pieces in (doc_id, copy, piece_index) order:
    the pieces and tokens of one copy (copy 0) and the copies packed; 0 where none."""
    doc = held["doc_id"].to_numpy()
    copy = held["copy"].to_numpy()
    first = copy == 0
    one, count, tokens = group_counts(doc[first], held["length"].to_numpy()[first])
    # a copy starts where the doc_id or the copy changes: a document's copies are counted
    starts = np.r_[True, (doc[1:] != doc[:-1]) | (copy[1:] != copy[:-1])][: len(doc)]
    drawn, draws, _ = group_counts(doc[starts], np.zeros(int(starts.sum()), np.int64))
    return _at(one, count, ids), _at(one, tokens, ids), _at(drawn, draws, ids)


def _at(keys: np.ndarray, values: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """values[k] for each id that is keys[k] (keys sorted), 0 for an id not among them."""
    out = np.zeros(len(ids), np.int32)
    if len(keys):
        at = np.minimum(np.searchsorted(keys, ids), len(keys) - 1)
        found = keys[at] == ids
        out[found] = values[at][found]
    return out


# what documents.parquet needs of each piece: its document, copy and packed length
_PIECE_COUNTS = pa.schema([PIECES_SCHEMA.field(n) for n in ("doc_id", "copy", "length")])


def _pieces(parts: SnapshotParts, schema: pa.Schema) -> Iterator[pa.Table]:
    for table in coalesce(open_stream(parts.pieces)):
        yield with_copy_column(table).select(schema.names).cast(schema)


def _write_documents(path: Path, parts: SnapshotParts, mixture: Mixture) -> int:
    """documents.parquet, a chunk of documents at a time, each document with the count and
    tokens of its pieces (those up to the chunk's last doc_id: both streams come in doc_id
    order, a document's copies one after the other) and its draws. The documents written."""
    cursor = Cursor(in_order(_pieces(parts, _PIECE_COUNTS), "doc_id", "pieces"), "doc_id",
                    _PIECE_COUNTS)  # fmt: skip
    writer = StreamWriter(path, SNAPSHOT_DOCUMENTS)
    try:
        for chunk in in_order(coalesce(open_stream(parts.documents)), "doc_id", "documents"):
            chunk = chunk.select(_DOCUMENTS.names).cast(_DOCUMENTS)
            held = cursor.upto(chunk["doc_id"][-1].as_py())
            num_pieces, num_tokens, draws = _per_document(held, chunk["doc_id"].to_numpy())
            writer.add(
                chunk.rename_columns(SNAPSHOT_DOCUMENTS.names[: chunk.num_columns])
                .append_column("num_pieces", pa.array(num_pieces, pa.int32()))
                .append_column("num_tokens", pa.array(num_tokens, pa.int32()))
                .append_column("draws", pa.array(draws, pa.int32()))
            )
            mixture.count(chunk, draws)
    except BaseException:
        writer.abort()
        raise
    return writer.close()


def _document_files(parts: SnapshotParts) -> Iterable[pa.Table]:
    """The document_files rows: the documents stage's, or in file mode one per document."""
    if parts.document_files is not None:
        return coalesce(open_stream(parts.document_files))
    return (
        file_document_files(chunk.select(DOCUMENTS.names).cast(_DOCUMENTS))
        for chunk in coalesce(open_stream(parts.documents))
    )


@dataclass(frozen=True)
class _Written:
    """A single file written by `_write_single`: its entry, the CPU seconds of the process
    that wrote it, and what it counted on the way."""

    entry: FileEntry
    cpu_s: float
    mixture: Mixture | None = None
    summary: dict[str, Counter[str]] | None = None


# the snapshot's single files, the longest to write first (each is one task), and the order
# the manifest lists them in
SINGLE_FILES = (layout.LEDGER, layout.DOCUMENTS, layout.PIECES, layout.DOCUMENT_FILES)
_LISTED = (layout.DOCUMENTS, layout.PIECES, layout.DOCUMENT_FILES, layout.LEDGER)


def own_cpu_s() -> float:
    """This process's own CPU seconds (user and system; not its children's)."""
    me = resource.getrusage(resource.RUSAGE_SELF)
    return me.ru_utime + me.ru_stime


def _write_single(job: tuple[Path, SnapshotParts], rel: str) -> _Written:
    """One single file of the snapshot written into the build `work`, hashed, its rows
    counted: each opens the streams it needs itself, so the four run side by side."""
    work, parts = job
    start = own_cpu_s()
    path = work / rel
    remove_temps(path)  # a writer of this file killed before (this task runs again)
    mixture: Mixture | None = None
    summary: dict[str, Counter[str]] | None = None
    if rel == layout.DOCUMENTS:
        mixture = Mixture()
        rows = _write_documents(path, parts, mixture)
    elif rel == layout.PIECES:
        pieces = in_order(_pieces(parts, PIECES_SCHEMA), "doc_id", "pieces")
        rows = write_stream(
            pieces, path, PIECES_SCHEMA
        )  # those of no document too: verify names them
    elif rel == layout.DOCUMENT_FILES:
        files = in_order(_document_files(parts), "doc_id", layout.DOCUMENT_FILES)
        rows = write_stream(files, path, DOCUMENT_FILES)
    elif rel == layout.LEDGER:
        summary = {}
        rows = write_stream(_summed(open_stream(parts.ledger), summary), path, LEDGER_SCHEMA)
    else:
        raise ValueError(f"{rel}: not a single file of a snapshot")
    entry = FileEntry(path=rel, sha256=sha256_file(path), bytes=path.stat().st_size, rows=rows)
    return _Written(entry, own_cpu_s() - start, mixture, summary)


def _summed(ledger: Iterable[pa.Table], summary: dict[str, Counter[str]]) -> Iterator[pa.Table]:
    """The final ledger's chunks as they are, counted per source on the way: collected,
    kept, dropped (the manifest's ledger summary)."""
    for chunk in ledger:
        pairs = chunk.select(["source_id", "status"]).group_by(["source_id", "status"])
        for row in pairs.aggregate([([], "count_all")]).to_pylist():
            counts = summary.setdefault(row["source_id"], Counter(collected=0, kept=0, dropped=0))
            counts["collected"] += row["count_all"]
            counts[row["status"]] += row["count_all"]
        yield chunk


def final_ledger(
    ledger_parts: Iterable[pa.Table], document_files: pa.Table, collected_stage: str
) -> pa.Table:
    """One row per collected file: kept (it is in a document: document_files.parquet) or
    dropped at the stage that dropped it, with the reason and dup_of. The collect ledger
    (`collected_stage`'s) lists every file seen; later stages list only their drops, and the
    first drop counts. In memory: final_ledger_chunks does the same a chunk at a time."""
    rows = [_ledger_rows(t) for t in ledger_parts if t.num_rows]
    if not rows:
        return LEDGER_SCHEMA.empty_table()
    everything = pa.concat_tables(rows)
    first = pc.equal(everything["stage"], collected_stage).fill_null(False)
    return _joined(everything.filter(first), everything.filter(pc.invert(first)), document_files)


@dataclass
class SourceLedgers:
    """One source's ledgers for final_ledger_chunks, each sorted by path (the canonical
    order every stage keeps): the collect ledger, the later stages' (in stage order), and
    the source's document_files rows."""

    collected: Iterable[pa.Table]
    later: list[Iterable[pa.Table]]
    files: Iterable[pa.Table]


def final_ledger_chunks(sources: Iterable[SourceLedgers]) -> Iterator[pa.Table]:
    """final_ledger a chunk of the collect ledger at a time: each later stage's and the
    document files' rows up to the chunk's last path are taken from cursors, so memory
    follows a chunk, not the corpus (every stream is in path order within its source)."""
    for source in sources:
        later = [Cursor(coalesce(s), "path", LEDGER_SCHEMA) for s in source.later]
        files = Cursor(coalesce(source.files), "path", DOCUMENT_FILES)
        for chunk in in_order(coalesce(source.collected), "path", "the collect ledger"):
            last = chunk["path"][-1].as_py()
            drops = [_ledger_rows(d) for c in later if (d := c.upto(last)).num_rows]
            later_rows = pa.concat_tables([LEDGER_SCHEMA.empty_table(), *drops])
            yield _joined(_ledger_rows(chunk), later_rows, files.upto(last), one_source=True)


def _ledger_rows(table: pa.Table) -> pa.Table:
    return table.select(LEDGER_SCHEMA.names).cast(LEDGER_SCHEMA)


def _file_keys(table: pa.Table) -> pa.Array:
    """One key per row: its source and path (a path's bytes never hold NUL)."""
    source = table["source_id"]
    if pa.types.is_dictionary(source.type):
        source = source.cast(pa.string())
    return pc.binary_join_element_wise(source, table["path"], "\0").combine_chunks()


def _path_keys(table: pa.Table) -> pa.Array:
    """One key per row of one source's rows: its path."""
    return table["path"].combine_chunks()


def _joined(
    collected: pa.Table, later: pa.Table, document_files: pa.Table, one_source: bool = False
) -> pa.Table:
    """The collect ledger's rows (LEDGER_SCHEMA) with each file's first later drop (stage
    order: `later` in that order) and whether a document holds it: Arrow hash lookups
    (`index_in` finds a key's first row), the collected rows' order kept. `one_source`: every
    row is of one source, so a file is known by its path alone."""
    key = _path_keys if one_source else _file_keys
    keys = key(collected)
    drop = pc.index_in(keys, value_set=key(later))  # null: no later drop
    doc = pc.index_in(keys, value_set=key(document_files))  # null: in no document

    def dropped_as(name: str) -> pa.ChunkedArray:
        return later[name].take(drop)

    has_drop = pc.is_valid(drop)
    kept = pc.equal(collected["status"], "kept").fill_null(False)
    status = pc.if_else(
        pc.or_(has_drop, pc.and_(kept, pc.is_null(doc))), "dropped", collected["status"]
    )
    reason = pc.coalesce(dropped_as("reason"), collected["reason"])
    # a collected file that reached no document and no drop row: say so instead of hiding it
    unaccounted = pc.and_(
        pc.and_(pc.equal(status, "dropped"), pc.is_null(reason)), pc.invert(has_drop)
    )
    columns = {
        "stage": pc.if_else(
            has_drop, dropped_as("stage"), pc.if_else(kept, "snapshot", collected["stage"])
        ),
        "status": status,
        "reason": pc.if_else(unaccounted.fill_null(False), "unaccounted", reason),
        "detail": pc.coalesce(dropped_as("detail"), collected["detail"]),
        "dup_of": pc.coalesce(dropped_as("dup_of"), collected["dup_of"]),
        "license_expression": pc.coalesce(
            document_files["license_expression"].take(doc), dropped_as("license_expression")
        ),
    }
    out = pa.table(
        [columns.get(name, collected[name]) for name in LEDGER_SCHEMA.names],
        names=LEDGER_SCHEMA.names,
    )
    return out.cast(LEDGER_SCHEMA)


def sources_with_mixture(
    sources: dict[str, SourceEntry], mixture: Mixture
) -> dict[str, SourceEntry]:
    """Each source's entry with its documents and the copies of them packed."""
    return {
        sid: entry.model_copy(
            update={
                "documents": mixture.source_documents[sid],
                "sequences": mixture.source_sequences[sid],
            }
        )
        for sid, entry in sources.items()
    }


def ledger_summary(ledger: pa.Table) -> dict[str, dict[str, int]]:
    df = pl.DataFrame(ledger)
    summary: dict[str, dict[str, int]] = {}
    for row in (
        df.group_by("source_id")
        .agg(
            pl.len().alias("collected"),
            (pl.col("status") == "kept").sum().alias("kept"),
            (pl.col("status") == "dropped").sum().alias("dropped"),
        )
        .sort("source_id")
        .iter_rows(named=True)
    ):
        summary[row["source_id"]] = {
            "collected": int(row["collected"]),
            "kept": int(row["kept"]),
            "dropped": int(row["dropped"]),
        }
    return summary


def build_snapshot(
    root: Path,
    parts: SnapshotParts,
    keep: int = 3,
    gate: Callable[[Path], list[str]] | None = None,
    card: Callable[[Path, SnapshotManifest], str] | None = None,
    mapper: Mapper = inline,
    figures: dict[str, float] | None = None,
) -> Path:
    """Write the snapshot under `root/snapshots/`, atomically; returns its directory.

    `card` writes the dataset card (README.md) from the finished files and manifest (a
    card from those alone when None). `gate` runs the promotion checks on the finished
    build directory (it already has its
    `_COMPLETE`, so real consumers can open it there) and returns failures; any failure
    removes the build and raises, so a snapshot that fails a check is never promoted. The
    single files (documents, pieces, document_files, the ledger) are written side by side
    and the rows shards copied, hashed and counted, by tasks of `mapper` (an executor's map
    on this host); `figures`, when given, gets each single file's writer's CPU seconds (its
    own process's: the largest single-process steps of a snapshot)."""
    snapshots = root / "snapshots"
    snapshots.mkdir(parents=True, exist_ok=True)
    _clean_stale(snapshots)
    work = snapshots / f".building-{os.getpid()}-{uuid.uuid4().hex[:12]}"
    work.mkdir()
    try:
        (work / layout.TOKENIZER).write_bytes(parts.tokenizer_json)
        files = [
            FileEntry(
                path=layout.TOKENIZER, sha256=sha256_file(work / layout.TOKENIZER),
                bytes=len(parts.tokenizer_json),
            )
        ]  # fmt: skip
        # the single files, each written by a task of its own that reads its streams itself
        written = {w.entry.path: w for w in mapper(_write_single, (work, parts), SINGLE_FILES)}
        files += [written[rel].entry for rel in _LISTED]
        mixture = written[layout.DOCUMENTS].mixture or Mixture()
        summary = written[layout.LEDGER].summary or {}
        documents = written[layout.DOCUMENTS].entry.rows or 0
        if figures is not None:
            figures.update({rel: w.cpu_s for rel, w in written.items()})

        splits: dict[str, SplitEntry] = {}
        copies = [
            (src, layout.shard(split, i))
            for split in SPLITS
            for i, src in enumerate(parts.rows.get(split, []))
        ]
        for split in SPLITS:
            (work / split).mkdir()
        copied = {c.entry.path: c for c in mapper(_copy_shard, work, copies)}
        for split in SPLITS:
            shards = [rel for _, rel in copies if rel.startswith(f"{split}/")]
            files.extend(copied[rel].entry for rel in shards)
            splits[split] = SplitEntry(
                rows=sum(copied[rel].entry.rows or 0 for rel in shards),
                documents=mixture.split_documents[split],
                tokens=sum(copied[rel].tokens for rel in shards),
                shards=shards,
                sequences=mixture.split_sequences[split],
            )

        snapshot_id = snapshot_id_of(
            parts.name, files, parts.code_version, parts.config_hash, parts.seq_len
        )
        manifest = SnapshotManifest(
            snapshot_id=snapshot_id,
            name=parts.name,
            created_at=datetime.now(UTC).isoformat(),
            code_version=parts.code_version,
            config_hash=parts.config_hash,
            seq_len=parts.seq_len,
            vocab_size=parts.vocab_size,
            tokenizer=parts.tokenizer_info,
            tokenizer_policy=parts.tokenizer_policy,
            splits=splits,
            documents=documents,
            document_mode=parts.document_mode,
            draw_seed=parts.draw_seed,
            engine=parts.engine,
            ledger={s: dict(c) for s, c in sorted(summary.items())},
            ledger_stages=parts.ledger_stages,
            sources=sources_with_mixture(parts.sources, mixture),
            inputs=parts.inputs,
            files=files,
        )
        raw = manifest.model_dump_json(indent=2).encode()
        (work / MANIFEST).write_bytes(raw)
        # the dataset card describes the contract and is not in its file list (see card.py)
        (work / layout.CARD).write_text(
            card(work, manifest) if card is not None else render_card(work, manifest, CardInputs()),
            encoding="utf-8",
        )
        # the marker holds the manifest's sha256, so a changed manifest byte is caught too
        (work / COMPLETE).write_bytes(complete_marker(snapshot_id, raw))
        if gate is not None:
            failures = gate(work)
            if failures:
                raise SnapshotError("promotion refused: " + "; ".join(failures))
        final = snapshots / snapshot_id
        if (final / COMPLETE).exists():
            if _holds(final, files, mapper):
                # the same rows are already promoted: keep their files (a trainer may be
                # reading them), take this build's manifest, card and text release
                _take_descriptions(final, work, {f.path for f in files}, mapper)
                _discard_build(work)
                return final
            # a folder of this id whose files are no longer those bytes: ours replaces it
            _discard_build(final)
        if final.exists() and not (final / COMPLETE).exists():
            shutil.rmtree(final)  # an unfinished leftover without _COMPLETE
        try:
            os.replace(work, final)
        except OSError:
            if not (final / COMPLETE).exists():
                raise
            # a concurrent run promoted the same content meanwhile: keep it, drop ours
            _discard_build(work)
            return final
        _prune(snapshots, parts.name, keep, final)
        return final
    except BaseException:
        _discard_build(work)
        raise


def folder_files(folder: Path) -> set[str]:
    """Every file of a snapshot folder by its relative path, the report aside (it is
    rendered again after every promotion)."""
    out = set()
    for p in folder.rglob("*"):
        rel = p.relative_to(folder).as_posix()
        if p.is_file() and not rel.startswith(f"{layout.REPORT_DIR}/"):
            out.add(rel)
    return out


def unlisted_facts(folder: Path, listed: Iterable[str], mapper: Mapper) -> dict[str, str]:
    """rel -> sha256 of the folder's files its manifest does not list, the report aside:
    the manifest, its marker, the card and the text release."""
    rest = sorted(folder_files(folder) - set(listed))
    return {f.rel: f.sha256 for f in mapper(file_facts, folder, rest)}


def _holds(folder: Path, files: Sequence[FileEntry], mapper: Mapper) -> bool:
    """Every file of `files` is in `folder` with its size and sha256."""
    want = {f.path: f for f in files}
    return all(
        got.exists and (got.bytes, got.sha256) == (want[got.rel].bytes, want[got.rel].sha256)
        for got in mapper(file_facts, folder, list(want))
    )


def _take_descriptions(final: Path, build: Path, listed: set[str], mapper: Mapper) -> None:
    """The promoted folder `final`, whose listed files hold, made to say what `build` says:
    its other files (the manifest, the card, the text release) replaced where their bytes
    differ and removed where the build has none, the marker taken away first and written
    last, so the folder is never whole with a manifest its marker does not name."""
    theirs = unlisted_facts(final, listed, mapper)
    ours = unlisted_facts(build, listed, mapper)
    if theirs == ours:
        return
    (final / COMPLETE).unlink(missing_ok=True)
    for rel in sorted(set(theirs) - set(ours)):
        (final / rel).unlink(missing_ok=True)
    for rel, sha in sorted(ours.items()):
        if rel != COMPLETE and theirs.get(rel) != sha:
            (final / rel).parent.mkdir(parents=True, exist_ok=True)
            temporary = final / f"{rel}.{uuid.uuid4().hex}.tmp"
            shutil.copyfile(build / rel, temporary)
            os.replace(temporary, final / rel)
    shutil.copyfile(build / COMPLETE, final / COMPLETE)


def _discard_build(work: Path) -> None:
    """A build directory removed, `_COMPLETE` first: one half removed (its process killed
    meanwhile) is never taken for a snapshot."""
    (work / COMPLETE).unlink(missing_ok=True)
    shutil.rmtree(work, ignore_errors=True)


def _clean_stale(snapshots: Path) -> None:
    """Build directories of a dead run (killed between mkdir and rename) go away."""
    for d in snapshots.glob(".building-*"):
        parts = d.name.split("-")  # .building-<pid>-<id>
        if len(parts) == 3 and parts[1].isdigit() and not pid_alive(int(parts[1])):
            _discard_build(d)
            continue
        try:
            age = datetime.now(UTC).timestamp() - d.stat().st_mtime
        except OSError:
            continue
        if age > 3600 or not any(d.iterdir()):
            _discard_build(d)


def _prune(snapshots: Path, name: str, keep: int, current: Path) -> None:
    done = sorted(
        (d for d in snapshots.glob(f"{name}-*") if (d / COMPLETE).exists() and d != current),
        key=lambda d: (d / COMPLETE).stat().st_mtime,
    )
    for d in done[: max(0, len(done) - (keep - 1))]:
        (d / COMPLETE).unlink(missing_ok=True)  # unreadable first, then gone
        shutil.rmtree(d, ignore_errors=True)


def read_manifest(snapshot_dir: Path) -> SnapshotManifest:
    """The snapshot's manifest; SnapshotError (one line) for a folder that is not a
    promoted snapshot (saying what it is when it can tell) or whose manifest is unreadable."""
    if (why := not_a_snapshot(snapshot_dir)) is not None:
        raise SnapshotError(why)
    try:
        return SnapshotManifest.model_validate_json((snapshot_dir / MANIFEST).read_bytes())
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(x) for x in first["loc"]) or "(the manifest)"
        raise SnapshotError(
            f"{snapshot_dir / MANIFEST}: not a valid snapshot manifest ({e.error_count()} "
            f"problems; first: {where}: {first['msg']})"
        ) from e
    except (OSError, ValueError) as e:
        line = str(e).splitlines()[0]
        raise SnapshotError(f"{snapshot_dir / MANIFEST}: unreadable manifest ({line})") from e


def not_a_snapshot(snapshot_dir: Path) -> str | None:
    """Why a folder is not a promoted snapshot at all (one line), or None when it claims to
    be one: no folder, no `_COMPLETE`, or an asset version of the store."""
    if not snapshot_dir.is_dir():
        return f"{snapshot_dir}: no such directory; not a snapshot"
    if not (snapshot_dir / COMPLETE).exists():
        return (
            f"{snapshot_dir}: no {COMPLETE}; not a snapshot (a promoted snapshot is a folder "
            "under <data dir>/snapshots/; megacpp run prints its path last)"
        )
    try:
        data = json.loads((snapshot_dir / MANIFEST).read_bytes())
    except (OSError, ValueError):
        return None  # a damaged snapshot: the checks name what is wrong
    if isinstance(data, dict) and {"asset", "partition", "version"} <= data.keys():
        part = "" if data["partition"] == "_" else f" [{data['partition']}]"
        return (
            f"{snapshot_dir}: an asset version of {data['asset']}{part} (version "
            f"{data['version']}), not a snapshot: a promoted snapshot is a folder under "
            "<data dir>/snapshots/ (megacpp run prints its path last); the store checks asset "
            "versions itself (each asset's manifest_verifies_from_disk check)"
        )
    return None


def promoted_in_store(store: ShardStore, name: str) -> list[tuple[str, SnapshotManifest]]:
    """Every whole snapshot named `name` in the store's snapshots/ (a local data dir's or a
    bucket's), oldest first by the `created_at` its manifest records (an object store has no
    trustworthy folder times), as (its folder in the store, its manifest). A folder without
    `_COMPLETE` (being uploaded or removed) or with an unreadable manifest is not one."""
    found: list[tuple[str, str, SnapshotManifest]] = []
    root = store.join("snapshots")
    for info in store.fs.get_file_info(pafs.FileSelector(root, allow_not_found=True)):
        if info.type != pafs.FileType.Directory or not info.base_name.startswith(f"{name}-"):
            continue
        raw = store.read_bytes_if_exists(f"{info.path}/{MANIFEST}")
        if raw is None or not store.exists(f"{info.path}/{COMPLETE}"):
            continue
        try:
            manifest = SnapshotManifest.model_validate_json(raw)
        except ValueError:
            continue
        if manifest.name == name:
            found.append((manifest.created_at, info.path, manifest))
    found.sort(key=lambda item: (item[0], item[1]))
    return [(path, manifest) for _, path, manifest in found]


def latest_snapshot(root: Path, name: str | None = None) -> Path | None:
    snaps = root / "snapshots"
    if not snaps.is_dir():
        return None
    # a promotion being built (.building-*) holds _COMPLETE while its gate runs: not a snapshot
    done = [
        d
        for d in snaps.iterdir()
        if d.is_dir()
        and not d.name.startswith(".")
        and (d / COMPLETE).exists()
        and (name is None or d.name.startswith(name))
    ]
    return max(done, key=lambda d: (d / COMPLETE).stat().st_mtime) if done else None


def manifest_summary(manifest: SnapshotManifest) -> str:
    lines = [
        f"snapshot   {manifest.snapshot_id}",
        f"created    {manifest.created_at}",
        f"seq_len    {manifest.seq_len}   vocab {manifest.vocab_size}"
        f"   tokenizer sha256 {str(manifest.tokenizer.get('sha256', ''))[:16]}",
        f"documents  {manifest.documents}",
    ]
    for split, s in manifest.splits.items():
        lines.append(
            f"{split:<10} {s.rows} rows, {s.documents} documents, {s.tokens} tokens, "
            f"{len(s.shards)} shards"
        )
    lines.append("ledger     source: collected = kept + dropped")
    for source, c in manifest.ledger.items():
        lines.append(f"  {source:<16} {c['collected']} = {c['kept']} + {c['dropped']}")
    lines.append(f"files      {len(manifest.files)}, {sum(f.bytes for f in manifest.files)} bytes")
    return "\n".join(lines)


def manifest_json(manifest: SnapshotManifest) -> str:
    return json.dumps(manifest.model_dump(mode="json"), indent=2)
