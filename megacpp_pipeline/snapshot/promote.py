"""Promotion: a snapshot directory is built beside its final place and renamed into it, so
no reader ever sees half of one; `_COMPLETE` is written last and its absence means "not a
snapshot". The snapshot id is a hash of the content, so the same inputs, config and code give
the same id (seed: a snapshot either survives promotion checks or it does not).

Layout (DESIGN section 4): manifest.json, tokenizer.json, documents.parquet,
document_files.parquet, pieces.parquet, ledger.parquet, train/part-*.parquet,
validation/part-*.parquet, README.md (the dataset card), _COMPLETE.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import polars as pl
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from pydantic import BaseModel, ConfigDict, Field

from megacpp_pipeline.core.ledger import LEDGER_SCHEMA
from megacpp_pipeline.corpus.repository import file_document_files
from megacpp_pipeline.snapshot.card import CARD, CardInputs, render_card
from megacpp_pipeline.snapshot.document_files import DOCUMENT_FILES_PARQUET
from megacpp_pipeline.snapshot.packed_rows import (
    PACKED_SCHEMA_VERSION,
    PIECES_SCHEMA,
    with_copy_column,
)
from megacpp_pipeline.snapshot.shard_checks import Mapper, inline
from megacpp_pipeline.storage.versions import (
    COMPLETE,
    MANIFEST,
    complete_marker,
    pid_alive,
    recorded_manifest_sha256,
    sha256_file,
    write_parquet_atomic,
)

if TYPE_CHECKING:
    from megacpp_pipeline.storage.store import ShardStore

# 2: document_files.parquet and document_mode (repository documents)
# 3: source weights: pieces.copy, documents.draws, sources' weight, documents and sequences,
#    splits' sequences, draw_seed; tokenizer_policy
SNAPSHOT_SCHEMA_VERSION = 3
SPLITS = ("train", "validation")
# The quality report is derived after promotion and is not part of the training contract:
# it lives in this folder, outside the manifest's file list.
REPORT_DIR = "report"
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


class FileEntry(BaseModel):
    model_config = ConfigDict(extra="forbid")
    path: str
    sha256: str
    bytes: int
    rows: int | None = None


class SplitEntry(BaseModel):
    model_config = ConfigDict(extra="forbid")
    rows: int
    documents: int
    tokens: int  # valid (non-pad) tokens in the split's rows
    shards: list[str]
    # document copies packed into the rows (the sum of the documents' draws): what an epoch
    # over the rows trains on and what the Megatron export holds; None before source weights
    # (then every document once: `documents`)
    sequences: int | None = None


class SourceEntry(BaseModel):
    """A source as this snapshot collected it: what kind, at which revision, and its share of
    the mixture: its weight, its documents and the copies of them packed (`sequences`)."""

    model_config = ConfigDict(extra="forbid")
    kind: str
    revision: str
    declared_license: str | None = None
    weight: float = 1.0
    documents: int | None = None
    sequences: int | None = None


class SnapshotManifest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    schema_version: int = SNAPSHOT_SCHEMA_VERSION
    packed_schema_version: str = PACKED_SCHEMA_VERSION
    snapshot_id: str
    name: str
    created_at: str
    code_version: str
    config_hash: str
    seq_len: int
    vocab_size: int
    tokenizer: dict[str, Any]
    # where the tokenizer came from: mode (reuse | train | pinned), decision (reused |
    # trained | pinned), from_snapshot, reason; the card and `megacpp diff` say it
    tokenizer_policy: dict[str, Any] = Field(default_factory=dict)
    splits: dict[str, SplitEntry]
    documents: int
    # what a document is: "file" (one kept file) or "repository" (a source's files in
    # #include order, each after a `// <path>` line); document_files.parquet lists the files
    document_mode: str = "file"
    # the seed of the weighted draws (corpus/packing.py: document_draws), with each source's
    # weight: verify recomputes every document's draws from them
    draw_seed: int = 0
    # where the run that promoted it ran its per-file stages (pipeline/engine.py); not part
    # of the content: the same files give the same snapshot id on any engine
    engine: dict[str, Any] = Field(default_factory=lambda: {"engine": "local"})
    ledger: dict[str, dict[str, int]]  # source -> {collected, kept, dropped}
    ledger_stages: list[str] = Field(default_factory=list)  # the pipeline's stages, in order
    sources: dict[str, SourceEntry] = Field(default_factory=dict)  # every operational source
    inputs: dict[str, str]  # upstream asset manifests' sha256
    files: list[FileEntry]  # every file but manifest.json and _COMPLETE


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


@dataclass
class SnapshotParts:
    """Everything a snapshot is made of, as streams the builder consumes once."""

    name: str
    seq_len: int
    vocab_size: int
    tokenizer_json: bytes
    tokenizer_info: dict[str, Any]
    rows: dict[str, list[ShardSource | Path]]  # split -> packed-row shards, in order
    documents: pa.Table  # schemas.DOCUMENTS rows, all of them (metadata only: small)
    pieces: Iterable[pa.Table]
    ledger: Iterable[pa.Table]  # ledger rows of every stage, in `ledger_stages` order
    ledger_stages: list[str]  # the stages that write ledgers, collect first (the registry's)
    inputs: dict[str, str]
    code_version: str
    config_hash: str
    sources: dict[str, SourceEntry] = field(default_factory=dict)  # with their revisions
    # schemas.DOCUMENT_FILES rows; None: file mode, one file per document (derived)
    document_files: pa.Table | None = None
    document_mode: str = "file"
    engine: dict[str, Any] = field(default_factory=lambda: {"engine": "local"})  # ran the gates
    tokenizer_policy: dict[str, Any] = field(default_factory=dict)  # the tokenizer stage's
    draw_seed: int = 0  # the packer's seed, which the weighted draws used


def _write_parquet(table: pa.Table, path: Path) -> None:
    try:
        write_parquet_atomic(table, path)
    except OSError as e:
        raise SnapshotError(f"{path}: did not read back ({e})") from e


def final_ledger(
    ledger_parts: Iterable[pa.Table], document_files: pa.Table, collected_stage: str
) -> pa.Table:
    """One row per collected file: kept (it is in a document: document_files.parquet) or
    dropped at the stage that dropped it, with the reason and dup_of. The collect ledger
    (`collected_stage`'s) lists every file seen; later stages list only their drops, and the
    first drop counts."""
    frames = [pl.DataFrame(t) for t in ledger_parts if t.num_rows]
    if not frames:
        return LEDGER_SCHEMA.empty_table()
    everything = pl.concat(frames, how="vertical_relaxed")
    collected = everything.filter(pl.col("stage") == collected_stage)
    later = everything.filter(pl.col("stage") != collected_stage).unique(
        subset=["source_id", "path"], keep="first", maintain_order=True
    )
    docs = pl.DataFrame(
        document_files.select(["source_id", "path", "license_expression"])
    ).with_columns(pl.lit(True).alias("in_documents"))
    merged = (
        collected.join(later, on=["source_id", "path"], how="left", suffix="_later")
        .join(docs, on=["source_id", "path"], how="left", suffix="_doc")
        .with_columns(
            pl.when(pl.col("stage_later").is_not_null())
            .then(pl.col("stage_later"))
            .when(pl.col("status") == "kept")
            .then(pl.lit("snapshot"))
            .otherwise(pl.col("stage"))
            .alias("stage"),
            pl.when(pl.col("stage_later").is_not_null())
            .then(pl.lit("dropped"))
            .when((pl.col("status") == "kept") & pl.col("in_documents").is_null())
            .then(pl.lit("dropped"))
            .otherwise(pl.col("status"))
            .alias("status"),
            pl.coalesce("reason_later", "reason").alias("reason"),
            pl.coalesce("detail_later", "detail").alias("detail"),
            pl.coalesce("dup_of_later", "dup_of").alias("dup_of"),
            pl.coalesce("license_expression_doc", "license_expression_later").alias(
                "license_expression"
            ),
        )
    )
    # a collected file that reached no document and no drop row: say so instead of hiding it
    merged = merged.with_columns(
        pl.when(
            (pl.col("status") == "dropped")
            & pl.col("reason").is_null()
            & pl.col("stage_later").is_null()
        )
        .then(pl.lit("unaccounted"))
        .otherwise(pl.col("reason"))
        .alias("reason")
    )
    out = merged.select(LEDGER_SCHEMA.names).to_arrow()
    return out.cast(LEDGER_SCHEMA)


def documents_with_draws(documents: pa.Table, pieces: pa.Table) -> pa.Table:
    """documents.parquet: the documents stage's rows, each with how it was packed: `draws`
    (the copies of it in the rows; 0 for a document its source's weight left out),
    `num_pieces` and `num_tokens` of one copy (BOS + text + EOS and FIM sentinels, what the
    copy's pieces hold; every copy is packed the same), and `text_tokens`, what the tokenizer
    gave for the text alone."""
    frame = pl.DataFrame(pieces.select(["doc_id", "copy", "length"]))
    copies = frame.group_by("doc_id").agg(pl.col("copy").n_unique().cast(pl.Int32).alias("draws"))
    first = (
        frame.filter(pl.col("copy") == 0)
        .group_by("doc_id")
        .agg(
            pl.len().cast(pl.Int32).alias("num_pieces"),
            pl.col("length").sum().cast(pl.Int32).alias("num_tokens"),
        )
    )
    return (
        pl.DataFrame(documents)
        .rename({"num_tokens": "text_tokens"})
        .join(first, on="doc_id", how="left")
        .join(copies, on="doc_id", how="left")
        .with_columns(
            pl.col("num_pieces").fill_null(0),
            pl.col("num_tokens").fill_null(0),
            pl.col("draws").fill_null(0),
        )
        .sort("doc_id")
        .to_arrow()
    )


def sources_with_mixture(
    sources: dict[str, SourceEntry], documents: pa.Table
) -> dict[str, SourceEntry]:
    """Each source's entry with its documents and the copies of them packed."""
    frame = pl.DataFrame(documents.select(["source_id", "draws"]))
    counts = {
        row["source_id"]: (int(row["documents"]), int(row["sequences"]))
        for row in frame.group_by("source_id")
        .agg(pl.len().alias("documents"), pl.col("draws").sum().alias("sequences"))
        .iter_rows(named=True)
    }
    out = {}
    for sid, entry in sources.items():
        documents_of, sequences = counts.get(sid, (0, 0))
        out[sid] = entry.model_copy(update={"documents": documents_of, "sequences": sequences})
    return out


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
) -> Path:
    """Write the snapshot under `root/snapshots/`, atomically; returns its directory.

    `card` writes the dataset card (README.md) from the finished files and manifest (a
    card from those alone when None). `gate` runs the promotion checks on the finished
    build directory (it already has its
    `_COMPLETE`, so real consumers can open it there) and returns failures; any failure
    removes the build and raises, so a snapshot that fails a check is never promoted. The
    rows shards are copied, hashed and counted by tasks of `mapper` (an executor's map on
    this host)."""
    snapshots = root / "snapshots"
    snapshots.mkdir(parents=True, exist_ok=True)
    _clean_stale(snapshots)
    work = snapshots / f".building-{os.getpid()}-{uuid.uuid4().hex[:12]}"
    work.mkdir()
    try:
        files: list[FileEntry] = []

        def add(rel: str, rows: int | None = None) -> None:
            p = work / rel
            files.append(
                FileEntry(path=rel, sha256=sha256_file(p), bytes=p.stat().st_size, rows=rows)
            )

        (work / "tokenizer.json").write_bytes(parts.tokenizer_json)
        add("tokenizer.json")

        pieces = pa.concat_tables(
            [PIECES_SCHEMA.empty_table()]
            + [with_copy_column(t).select(PIECES_SCHEMA.names).cast(PIECES_SCHEMA)
               for t in parts.pieces]
        )  # fmt: skip
        pieces = pieces.sort_by(
            [("doc_id", "ascending"), ("copy", "ascending"), ("piece_index", "ascending")]
        )
        documents = documents_with_draws(parts.documents, pieces)
        _write_parquet(documents, work / "documents.parquet")
        add("documents.parquet", documents.num_rows)
        _write_parquet(pieces, work / "pieces.parquet")
        add("pieces.parquet", pieces.num_rows)
        document_files = (
            parts.document_files
            if parts.document_files is not None
            else file_document_files(parts.documents)
        ).sort_by([("doc_id", "ascending"), ("position", "ascending")])
        _write_parquet(document_files, work / DOCUMENT_FILES_PARQUET)
        add(DOCUMENT_FILES_PARQUET, document_files.num_rows)
        ledger = final_ledger(parts.ledger, document_files, parts.ledger_stages[0])
        _write_parquet(ledger, work / "ledger.parquet")
        add("ledger.parquet", ledger.num_rows)

        splits: dict[str, SplitEntry] = {}
        copies = [
            (src, f"{split}/part-{i:05d}.parquet")
            for split in SPLITS
            for i, src in enumerate(parts.rows.get(split, []))
        ]
        for split in SPLITS:
            (work / split).mkdir()
        copied = {c.entry.path: c for c in mapper(_copy_shard, work, copies)}
        for split in SPLITS:
            shards = [rel for _, rel in copies if rel.startswith(f"{split}/")]
            files.extend(copied[rel].entry for rel in shards)
            in_split = pa.compute.equal(documents["split"], split)
            split_docs = int(pa.compute.sum(in_split).as_py() or 0)
            draws = pa.compute.filter(documents["draws"], in_split)
            splits[split] = SplitEntry(
                rows=sum(copied[rel].entry.rows or 0 for rel in shards),
                documents=split_docs,
                tokens=sum(copied[rel].tokens for rel in shards),
                shards=shards,
                sequences=int(pa.compute.sum(draws).as_py() or 0),
            )

        content = hashlib.sha256()
        for f in sorted(files, key=lambda f: f.path):
            content.update(f"{f.path}\0{f.sha256}\n".encode())
        content.update(f"{parts.code_version}\0{parts.config_hash}\0{parts.seq_len}".encode())
        snapshot_id = f"{parts.name}-{content.hexdigest()[:16]}"
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
            documents=documents.num_rows,
            document_mode=parts.document_mode,
            draw_seed=parts.draw_seed,
            engine=parts.engine,
            ledger=ledger_summary(ledger),
            ledger_stages=parts.ledger_stages,
            sources=sources_with_mixture(parts.sources, documents),
            inputs=parts.inputs,
            files=files,
        )
        raw = manifest.model_dump_json(indent=2).encode()
        (work / MANIFEST).write_bytes(raw)
        # the dataset card describes the contract and is not in its file list (see card.py)
        (work / CARD).write_text(
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
            # the same content is already promoted: keep the existing one, drop ours
            shutil.rmtree(work)
            return final
        if final.exists() and not (final / COMPLETE).exists():
            shutil.rmtree(final)  # an unfinished leftover without _COMPLETE
        try:
            os.replace(work, final)
        except OSError:
            if not (final / COMPLETE).exists():
                raise
            # a concurrent run promoted the same content meanwhile: keep it, drop ours
            shutil.rmtree(work)
            return final
        _prune(snapshots, parts.name, keep, final)
        return final
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise


def _clean_stale(snapshots: Path) -> None:
    """Build directories of a dead run (killed between mkdir and rename) go away."""
    for d in snapshots.glob(".building-*"):
        parts = d.name.split("-")  # .building-<pid>-<id>
        if len(parts) == 3 and parts[1].isdigit() and not pid_alive(int(parts[1])):
            shutil.rmtree(d, ignore_errors=True)
            continue
        try:
            age = datetime.now(UTC).timestamp() - d.stat().st_mtime
        except OSError:
            continue
        if age > 3600 or not any(d.iterdir()):
            shutil.rmtree(d, ignore_errors=True)


def manifest_sha256_recorded(snapshot_dir: Path) -> str | None:
    """The manifest sha256 `_COMPLETE` holds (None for a marker written before it did)."""
    return recorded_manifest_sha256((snapshot_dir / COMPLETE).read_bytes())


def _prune(snapshots: Path, name: str, keep: int, current: Path) -> None:
    done = sorted(
        (d for d in snapshots.glob(f"{name}-*") if (d / COMPLETE).exists() and d != current),
        key=lambda d: (d / COMPLETE).stat().st_mtime,
    )
    for d in done[: max(0, len(done) - (keep - 1))]:
        (d / COMPLETE).unlink(missing_ok=True)  # unreadable first, then gone
        shutil.rmtree(d, ignore_errors=True)


def read_manifest(snapshot_dir: Path) -> SnapshotManifest:
    if not (snapshot_dir / COMPLETE).exists():
        raise SnapshotError(f"{snapshot_dir}: no {COMPLETE}; not a snapshot")
    try:
        return SnapshotManifest.model_validate_json((snapshot_dir / MANIFEST).read_bytes())
    except (OSError, ValueError) as e:
        raise SnapshotError(f"{snapshot_dir / MANIFEST}: unreadable manifest ({e})") from e


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
