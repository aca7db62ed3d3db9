"""The promotion checks, runnable from disk alone (no Dagster): file sha256s, the packed-row
schema contract, token ranges, document consistency, round-trip decode, ledger
completeness, a consumer smoke read through the loader and a Megatron read-back.

Seed rule: schema-valid parquet is not enough; promotion must prove one real downstream
consumer read. `megacpp verify` runs the from-disk checks; the snapshot asset runs all.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import tempfile
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from megacpp_pipeline.core.identity import Sums, added
from megacpp_pipeline.loader.errors import LoaderError
from megacpp_pipeline.snapshot import layout
from megacpp_pipeline.snapshot.card import card_problems
from megacpp_pipeline.snapshot.document_files import (
    read_document_files,
)
from megacpp_pipeline.snapshot.fetch import SnapshotFetchError, local_snapshot
from megacpp_pipeline.snapshot.layout import (
    CARD,
    COMPLETE,
    MANIFEST,
    REPORT_DIR,
    SnapshotManifest,
    snapshot_id_of,
)
from megacpp_pipeline.snapshot.megatron import IndexedDatasetFormatError, MegatronExportError
from megacpp_pipeline.snapshot.packed_rows import (
    OPTIONAL_TOKEN_COLUMNS,
    REQUIRED_COLUMNS,
    packed_rows_schema,
    with_copy_column,
)
from megacpp_pipeline.snapshot.promote import (
    SnapshotConfig,
    SnapshotError,
    manifest_summary,
    not_a_snapshot,
    read_manifest,
)
from megacpp_pipeline.snapshot.shard_checks import (
    DOCUMENT_FAULTS,
    DOCUMENT_FILES_FAULT,
    MAX_PROBLEMS,
    DocumentsJob,
    DrawJob,
    Mapper,
    PlacedPieces,
    RoundTripJob,
    RoundTripShard,
    document_windows,
    documents_window,
    draw_items,
    draw_problems_in,
    file_facts,
    inline,
    ledger_groups,
    ledger_kept,
    round_trip_shard,
    row_problems,
    token_problems,
)
from megacpp_pipeline.snapshot.streams import read_back
from megacpp_pipeline.snapshot.text_release import (
    TEXT_DIR,
    ReleaseConfig,
    TextReleaseError,
    check_release,
    write_release,
)
from megacpp_pipeline.snapshot.texts import document_texts, file_texts, packed_doc_ids
from megacpp_pipeline.storage.versions import recorded_manifest_sha256, sha256_file


@dataclass
class CheckOutcome:
    name: str
    passed: bool
    metrics: dict[str, Any] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    def fail(self, problem: str) -> None:
        self.passed = False
        if len(self.problems) < 50:
            self.problems.append(problem)


def _shards(snap: Path, manifest: SnapshotManifest) -> list[tuple[str, Path]]:
    return [(split, snap / rel) for split, s in manifest.splits.items() for rel in s.shards]


def check_files(snap: Path, manifest: SnapshotManifest, mapper: Mapper = inline) -> CheckOutcome:
    """Every listed file exists with its bytes and sha256; nothing unlisted lies around;
    the snapshot id is the one its listed files, code version, config and row length give,
    and the one its marker names. Each file is read and hashed in a task of `mapper`."""
    out = CheckOutcome("file_checksums", True)
    listed = {f.path for f in manifest.files}
    marker = (snap / COMPLETE).read_bytes()
    recorded = recorded_manifest_sha256(marker)
    if recorded is None:  # a one-token marker vouches for no manifest: nothing is checked
        out.fail(f"{snap / COMPLETE}: records no manifest sha256 (an older marker)")
    elif sha256_file(snap / MANIFEST) != recorded:
        out.fail(f"{snap / MANIFEST}: sha256 differs from the one {COMPLETE} recorded")
    named = marker.decode(errors="replace").split()[:1]
    if named != [manifest.snapshot_id]:
        out.fail(
            f"{snap / COMPLETE}: names {named[0] if named else 'nothing'}, "
            f"the manifest {manifest.snapshot_id}"
        )
    content_id = snapshot_id_of(
        manifest.name,
        manifest.files,
        manifest.code_version,
        manifest.config_hash,
        manifest.seq_len,
    )
    if content_id != manifest.snapshot_id:
        out.fail(
            f"{snap / MANIFEST}: snapshot_id {manifest.snapshot_id} does not name its content "
            f"(its files, code version, config and seq_len give {content_id})"
        )
    entries = {f.path: f for f in manifest.files}
    for facts in mapper(file_facts, snap, [f.path for f in manifest.files]):
        f, p = entries[facts.rel], snap / facts.rel
        if not facts.exists:
            out.fail(f"{p}: missing")
        elif facts.bytes != f.bytes:
            out.fail(f"{p}: {facts.bytes} bytes, manifest says {f.bytes}")
        elif facts.sha256 != f.sha256:
            out.fail(f"{p}: sha256 mismatch")
    for p in snap.rglob("*"):
        rel = p.relative_to(snap).as_posix()
        if rel.startswith((f"{REPORT_DIR}/", f"{TEXT_DIR}/")):  # derived, with their own
            continue
        if p.is_file() and rel not in listed and rel not in (MANIFEST, COMPLETE, CARD):
            out.fail(f"{p}: not listed in the manifest")
    out.metrics["files"] = len(manifest.files)
    return out


def check_schema(snap: Path, manifest: SnapshotManifest) -> CheckOutcome:
    """The seven required columns with their exact Arrow types at length seq_len; optional
    columns only if this schema version knows them."""
    out = CheckOutcome("schema_contract", True)
    expected = packed_rows_schema(manifest.seq_len)
    for _split, path in _shards(snap, manifest):
        try:
            schema = pq.read_schema(path)
        except (OSError, pa.ArrowInvalid) as e:
            out.fail(f"{path}: not readable parquet ({e})")
            continue
        for name in REQUIRED_COLUMNS:
            if name not in schema.names:
                out.fail(f"{path}: required column {name!r} missing")
            elif schema.field(name).type != expected.field(name).type:
                out.fail(
                    f"{path}: column {name!r} is {schema.field(name).type}, "
                    f"contract says {expected.field(name).type}"
                )
        for name in schema.names:
            if name in REQUIRED_COLUMNS:
                continue
            if name not in OPTIONAL_TOKEN_COLUMNS:
                out.fail(f"{path}: column {name!r} is not known to the schema version")
            elif schema.field(name).type != expected.field(name).type:
                out.fail(f"{path}: optional column {name!r} has type {schema.field(name).type}")
    out.metrics["shards"] = len(_shards(snap, manifest))
    return out


def check_token_ranges(
    snap: Path, manifest: SnapshotManifest, mapper: Mapper = inline
) -> CheckOutcome:
    """Every id in [0, vocab_size); targets in range or ignored; pads only after
    valid_token_count (there: loss masked, doc_ids -1). A task of `mapper` per shard."""
    out = CheckOutcome("token_range_and_pads", True)
    vocab, seq = manifest.vocab_size, manifest.seq_len
    rows = 0
    paths = [path for _split, path in _shards(snap, manifest)]
    for n, problems in mapper(token_problems, (vocab, seq), paths):
        rows += n
        for problem in problems:
            out.fail(problem)
    out.metrics.update(rows=rows, vocab_size=vocab)
    return out


def draw_problems(snap: Path, manifest: SnapshotManifest, mapper: Mapper = inline) -> list[str]:
    """Documents whose copies in the rows are not the draws their source's weight and the
    snapshot's draw seed give (corpus/packing.py: document_draws): a task of `mapper` per
    part of documents.parquet (a draw is keyed by the document's source and path alone)."""
    path = snap / layout.DOCUMENTS
    job = DrawJob(path, {s: e.weight for s, e in manifest.sources.items()}, manifest.draw_seed)
    out: list[str] = []
    for found in mapper(draw_problems_in, job, draw_items(path)):
        out += found[: 5 - len(out)]
    return out


def check_documents(
    snap: Path, manifest: SnapshotManifest, mapper: Mapper = inline
) -> CheckOutcome:
    """doc_ids in the rows agree with pieces.parquet and documents.parquet; every copy of
    every document has all its pieces, in order, and a document has exactly the copies its
    source's weight draws; no target crosses a document boundary; every kept file is in one
    document, its members' token spans tiling it (document_files.parquet).

    A task of `mapper` per window of documents.parquet checks its documents against their
    pieces and files; here only a few numbers per window are kept: the files per source,
    which must be the ledger's kept files per source, and the sums of their identity hashes,
    which must be the ledger's kept files' (so no file is listed twice)."""
    out = CheckOutcome("document_consistency", True)
    present = pq.read_schema(snap / layout.DOCUMENTS).names
    wanted = ["doc_id", "split", "num_pieces", "num_files", "text_tokens", "draws"]
    documents = snap / layout.DOCUMENTS
    rows_of_documents = pq.ParquetFile(documents).metadata.num_rows
    job = DocumentsJob(snap, tuple(c for c in wanted if c in present), rows_of_documents)
    if "draws" in present and manifest.schema_version >= 3:
        for problem in draw_problems(snap, manifest, mapper):
            out.fail(problem)
    files: Counter[str] = Counter()
    sums: list[Sums] = []
    faults: dict[str, list[str]] = {k: [] for k in (DOCUMENT_FILES_FAULT, *DOCUMENT_FAULTS)}
    figures: Counter[str] = Counter()
    for window in mapper(documents_window, job, document_windows(documents)):
        files.update(window.files)
        sums.append(window.sums)
        figures.update(documents=window.count, sequences=window.sequences, pieces=window.pieces)
        for kind, problems in window.problems.items():  # the first few of each kind
            faults[kind] += problems[: MAX_PROBLEMS - len(faults[kind])]
    kept = {src: counts["kept"] for src, counts in manifest.ledger.items()}
    # every source either side: a document of a source the ledger does not know is a file
    # that nothing accounts for
    for source in sorted(set(kept) | set(files)):
        n = kept.get(source, 0)
        if files.get(source, 0) != n:
            out.fail(
                f"{layout.DOCUMENT_FILES}: {source}: {n} kept files but {files.get(source, 0)}"
                " in documents"
            )
    ledger = snap / layout.LEDGER
    if ledger.exists() and "path" in pq.read_schema(ledger).names:
        ledger_files: Counter[str] = Counter()
        ledger_sums: list[Sums] = []
        for per_source, part in mapper(ledger_kept, ledger, ledger_groups(ledger)):
            ledger_files.update(per_source)
            ledger_sums.append(part)
        if ledger_files == files and added(ledger_sums) != added(sums):
            out.fail(
                f"{layout.DOCUMENT_FILES}: as many files per source as {layout.LEDGER} keeps,"
                " but not the same files (one listed twice, or one that was not kept)"
            )
    for problems in faults.values():
        for problem in problems:
            out.fail(problem)
    # every row against the pieces that say what it holds, a shard at a time and vectorized
    # (a frame per pack_id would cost a few KB for each row of the snapshot)
    placed = pq.read_table(
        snap / layout.PIECES, columns=["pack_id", "doc_id", "row_offset", "length", "split"]
    )
    split_codes = pc.dictionary_encode(placed["split"]).combine_chunks()
    pack = placed["pack_id"].to_numpy()
    offset = placed["row_offset"].to_numpy().astype(np.int64)
    by_place = np.lexsort([offset, pack])
    job_rows = PlacedPieces(
        seq_len=manifest.seq_len,
        pack=pack[by_place],
        doc=placed["doc_id"].to_numpy().astype(np.int32)[by_place],
        offset=offset[by_place],
        length=placed["length"].to_numpy().astype(np.int64)[by_place],
        split=split_codes.indices.to_numpy().astype(np.int8)[by_place],
        splits=tuple(split_codes.dictionary.to_pylist()),
    )
    del placed, pack, offset, by_place
    rows = 0
    for n, problems in mapper(row_problems, job_rows, _shards(snap, manifest)):
        rows += n
        for problem in problems:
            out.fail(problem)
    out.metrics.update(
        documents=figures["documents"],
        sequences=figures["sequences"],
        files=sum(files.values()),
        pieces=figures["pieces"],
        rows=rows,
    )
    return out


def check_round_trip(
    snap: Path, manifest: SnapshotManifest, sample: int, seed: int = 0, mapper: Mapper = inline
) -> CheckOutcome:
    """Rebuild documents from their pieces, strip BOS/EOS, decode with the snapshot's own
    tokenizer.json: the sha256 must equal the scrubbed text's (content_sha256). A task of
    `mapper` per rows shard rebuilds and decodes the sampled documents whose pieces all lie
    in it (every one, when a packing window is a shard); any other is rebuilt here."""
    out = CheckOutcome("round_trip_decode", True)
    # here once, so a tokenizer that is not the manifest's is one problem, not one a shard;
    # only its bytes: the tasks parse it (read_artifact, checking them again)
    sha256, tokenizer = str(manifest.tokenizer.get("sha256", "")), snap / layout.TOKENIZER
    actual = sha256_file(tokenizer) if tokenizer.is_file() else "missing"
    if actual != sha256:
        out.fail(f"{tokenizer}: sha256 mismatch: the manifest's {sha256}, the file's {actual}; "
                 "nothing is decoded with it")  # fmt: skip
        return out
    # the documents in the rows (a source's weight may draw one 0 times: it has no pieces)
    ids = np.asarray(packed_doc_ids(snap), np.int64)
    if len(ids) > sample:  # the sample chosen from the ids alone; its rows read after
        ids = np.sort(np.random.default_rng(seed).choice(ids, size=sample, replace=False))
    chosen = pa.array(ids, pa.int32())
    docs = _documents_of(snap, chosen, ["doc_id", "path", "content_sha256"])
    doc_ids = docs["doc_id"].to_pylist()
    sha_by_doc = dict(zip(doc_ids, docs["content_sha256"].to_pylist(), strict=True))
    path_by_doc = dict(zip(doc_ids, docs["path"].to_pylist(), strict=True))
    checked = 0
    tasks, elsewhere = _round_trip_tasks(snap, manifest, sha_by_doc, path_by_doc)
    special = manifest.tokenizer.get("special_tokens", {})
    job = RoundTripJob(
        snap,
        manifest.seq_len,
        int(special.get("<|bos|>", 0)),
        int(special.get("<|eos|>", 1)),
        sha256,
    )
    for n, problems, unresolved in mapper(round_trip_shard, job, tasks):
        checked += n
        elsewhere += unresolved
        for problem in problems:
            out.fail(problem)
    for doc in document_texts(snap, manifest, elsewhere) if elsewhere else ():
        if doc.text is None:
            out.fail(f"doc {doc.doc_id} ({path_by_doc[doc.doc_id]}): {doc.problem}")
            continue
        checked += 1
        if hashlib.sha256(doc.text.encode("utf-8")).hexdigest() != sha_by_doc[doc.doc_id]:
            where = f"doc {doc.doc_id} ({path_by_doc[doc.doc_id]})"
            out.fail(f"{where}: decoded text differs from the source")
    files_checked = 0
    if manifest.document_mode != "file":  # each member file's own text, cut from its document
        files = read_document_files(snap, ["doc_id", "position", "content_sha256"])
        want = {
            (d, p): sha
            for d, p, sha in zip(*(files[c].to_pylist() for c in files.column_names), strict=True)
            if d in sha_by_doc
        }
        for f in file_texts(snap, manifest, sha_by_doc):
            files_checked += 1
            if hashlib.sha256(f.text.encode("utf-8")).hexdigest() != want[(f.doc_id, f.position)]:
                out.fail(f"doc {f.doc_id} ({f.source_id}/{f.path}): the file's text differs")
    out.metrics.update(
        documents_checked=checked,
        files_checked=files_checked,
        sampled=len(sha_by_doc) < manifest.documents,
    )
    return out


def _documents_of(snap: Path, doc_ids: pa.Array, columns: list[str]) -> pa.Table:
    """The rows of documents.parquet whose doc_id is in `doc_ids`, a row group at a time: a
    group's other columns are decoded only when it holds one of them, and only those rows
    are kept (a filter on the whole file decodes every path and hash first)."""
    parquet = pq.ParquetFile(snap / layout.DOCUMENTS)
    parts = []
    for group in range(parquet.num_row_groups):
        ids = parquet.read_row_group(group, columns=["doc_id"])["doc_id"]
        rows = pc.indices_nonzero(pc.is_in(ids, doc_ids))
        if len(rows):
            parts.append(parquet.read_row_group(group, columns=columns).take(rows))
    return pa.concat_tables(parts) if parts else parquet.schema_arrow.empty_table().select(columns)


def _round_trip_tasks(
    snap: Path,
    manifest: SnapshotManifest,
    sha_by_doc: dict[int, str],
    path_by_doc: dict[int, str],
) -> tuple[list[RoundTripShard], list[int]]:
    """The sampled documents' pieces grouped by the rows shard that holds them (a shard's
    pack_ids from its footer statistics), and the documents whose pieces span shards or
    rows no shard holds (rebuilt by the driver's own reader)."""
    wanted = pa.array(sorted(sha_by_doc), pa.int32())
    # a weighted document packed more than once has identical copies: its first one will do
    pieces = with_copy_column(
        pq.read_table(snap / layout.PIECES, filters=pc.field("doc_id").isin(wanted))
    )
    pieces = pieces.filter(
        pc.and_(pc.is_in(pieces["doc_id"], wanted), pc.equal(pieces["copy"], 0))
    ).sort_by([("doc_id", "ascending"), ("piece_index", "ascending")])
    pack = pieces["pack_id"].to_numpy()
    doc = pieces["doc_id"].to_numpy().astype(np.int64)
    shard_of = np.full(len(pack), -1, dtype=np.int64)
    claims = np.zeros(len(pack), dtype=np.int64)  # shards whose pack_id range holds it
    rels = [rel for s in manifest.splits.values() for rel in s.shards]
    for i, rel in enumerate(rels):
        lo, hi = _pack_id_range(snap / rel)
        if lo is None:
            claims += 2  # no statistics: nothing is known of where its rows are
            continue
        inside = (pack >= lo) & (pack <= hi)
        shard_of[inside] = i
        claims += inside
    shard_of[claims != 1] = -1
    first = np.r_[True, doc[1:] != doc[:-1]] if len(doc) else np.zeros(0, bool)
    group = np.cumsum(first) - 1
    ones = np.ones(len(doc), dtype=bool)
    if len(doc):
        lowest = np.minimum.reduceat(shard_of, np.flatnonzero(first))
        highest = np.maximum.reduceat(shard_of, np.flatnonzero(first))
        ones = (lowest[group] == highest[group]) & (shard_of >= 0)
    elsewhere = sorted({int(d) for d in doc[~ones]} | (set(sha_by_doc) - set(doc.tolist())))
    members = _member_starts(snap, manifest) if manifest.document_mode != "file" else {}
    tasks = []
    for i, rel in enumerate(rels):
        mine = np.flatnonzero(ones & (shard_of == i))
        if not len(mine):
            continue
        docs_here = {int(d) for d in doc[mine]}
        tasks.append(
            RoundTripShard(
                rel,
                doc[mine],
                pieces["piece_index"].to_numpy()[mine],
                pack[mine],
                pieces["row_offset"].to_numpy()[mine],
                pieces["length"].to_numpy()[mine],
                {d: members[d] for d in docs_here if d in members},
                {d: sha_by_doc[d] for d in docs_here},
                {d: path_by_doc[d] for d in docs_here},
            )
        )
    return tasks, elsewhere


def _pack_id_range(path: Path) -> tuple[int | None, int | None]:
    """The lowest and highest pack_id of a rows shard, from its footer's statistics."""
    meta = pq.read_metadata(path)
    column = meta.schema.names.index("pack_id")
    lows, highs = [], []
    for g in range(meta.num_row_groups):
        stats = meta.row_group(g).column(column).statistics
        if stats is None or not stats.has_min_max:
            return None, None
        lows.append(stats.min)
        highs.append(stats.max)
    return (min(lows), max(highs)) if lows else (None, None)


def _member_starts(snap: Path, manifest: SnapshotManifest) -> dict[int, list[int]]:
    files = read_document_files(snap, ["doc_id", "position", "start_token"])
    out: dict[int, list[int]] = {}
    for d, _, start in sorted(
        zip(*(files[c].to_pylist() for c in files.column_names), strict=True)
    ):
        out.setdefault(d, []).append(start)
    return out


def check_ledger(snap: Path, manifest: SnapshotManifest) -> CheckOutcome:
    """Per source: collected == kept + dropped, kept == the files in documents (document_files
    .parquet), nothing unaccounted. Counted a row group at a time."""
    out = CheckOutcome("ledger_completeness", True)
    figures: dict[str, Counter[str]] = {}  # per source: collected, kept, dropped, no reason
    for ledger in read_back(snap / layout.LEDGER, ["source_id", "status", "reason"]):
        dropped = pc.equal(ledger["status"], "dropped")
        # dropped without a reason, or any row a stage marked unaccounted
        reason = ledger["reason"]
        no_reason = pc.or_kleene(
            pc.equal(reason, "unaccounted"), pc.and_(dropped, pc.is_null(reason))
        )
        for name, where in (
            ("collected", None),
            ("kept", pc.equal(ledger["status"], "kept")),
            ("dropped", dropped),
            ("no_reason", pc.fill_null(no_reason, False)),
        ):
            rows = ledger["source_id"] if where is None else ledger["source_id"].filter(where)
            for row in pc.value_counts(rows).to_pylist():
                figures.setdefault(row["values"], Counter())[name] += row["counts"]
    listed_files: Counter[str] = Counter()
    files_path = snap / layout.DOCUMENT_FILES
    files = (
        read_back(files_path, ["source_id"])
        if files_path.exists()
        else [read_document_files(snap, ["source_id"])]
    )
    for part in files:
        for row in pc.value_counts(part["source_id"]).to_pylist():
            listed_files[row["values"]] += row["counts"]
    for src, row in figures.items():
        if row["collected"] != row["kept"] + row["dropped"]:
            out.fail(f"{layout.LEDGER}: {src}: collected {row['collected']} != kept + dropped")
        if row["kept"] != listed_files[src]:
            out.fail(
                f"{layout.LEDGER}: {src}: {row['kept']} kept but {listed_files[src]} files"
                f" in {layout.DOCUMENT_FILES}"
            )
        if row["no_reason"]:
            out.fail(f"{layout.LEDGER}: {src}: {row['no_reason']} files dropped without a reason")
        listed = manifest.ledger.get(src)
        if listed and listed != {k: row[k] for k in ("collected", "kept", "dropped")}:
            out.fail(f"{layout.MANIFEST}: ledger summary for {src} disagrees with {layout.LEDGER}")
    total = Counter[str]()
    for row in figures.values():
        total.update(row)
    out.metrics.update(collected=total["collected"], kept=total["kept"], dropped=total["dropped"])
    return out


def check_consumer_smoke(snap: Path, config: SnapshotConfig) -> CheckOutcome:
    """A real consumer read: the loader gives static-shape batches with sane receipts."""
    from megacpp_pipeline.loader import PackedRowsLoader

    out = CheckOutcome("consumer_smoke_read", True)
    manifest = read_manifest(snap)
    with tempfile.TemporaryDirectory(prefix="megacpp-smoke-") as cache:
        for split, entry in manifest.splits.items():
            if entry.rows == 0:
                continue
            batch_size = min(config.smoke_batch_size, entry.rows)
            loader = PackedRowsLoader(
                snap, split=split, batch_size=batch_size, seed=config.seed, cache_dir=cache
            )
            shapes = set()
            batches = 0
            try:
                for batch in loader:
                    shapes.add(tuple(batch["input_ids"].shape))
                    if batch["input_ids"].dtype != np.int32:
                        out.fail(f"{split}: input_ids dtype {batch['input_ids'].dtype}")
                    batches += 1
                    if batches >= config.smoke_batches:
                        break
            finally:
                loader.close()
            if shapes != {(batch_size, manifest.seq_len)}:
                out.fail(f"{split}: batch shapes {sorted(shapes)}, want one static shape")
            for rec in list(loader.receipts)[:batches]:
                fields = rec.model_dump()
                timings = [v for k, v in fields.items() if k.endswith("_s")]
                if any((not isinstance(v, float)) or v < 0 for v in timings):
                    out.fail(f"{split}: a receipt has a negative or missing timing: {fields}")
            out.metrics[f"{split}_batches"] = batches
    return out


def check_megatron(
    snap: Path, mapper: Mapper = inline, export_to: Path | None = None
) -> CheckOutcome:
    """The .bin/.idx export read back by an independent reader: same documents and tokens
    (splits without rows have no export: see megatron.export_snapshot). With `export_to`,
    the export is made there once (megatron.export_once) and kept for the megatron stage;
    else in a temporary folder."""
    from megacpp_pipeline.snapshot import megatron

    out = CheckOutcome("megatron_read_back", True)
    manifest = read_manifest(snap)
    with tempfile.TemporaryDirectory(prefix="megacpp-megatron-") as tmp:
        where = export_to or Path(tmp)
        megatron.export_once(snap, where, mapper)
        for split, entry in manifest.splits.items():
            if entry.rows == 0:
                continue
            prefix = where / split
            reader = megatron.IndexedDatasetReader(prefix)
            # the reader checked at open that every pointer is the running sum of the
            # lengths and that the .bin holds exactly their total: no pass per document
            docs, tokens = len(reader), reader.total_tokens
            # every copy of a weighted document is a sequence (before weights: each once)
            want = entry.sequences if entry.sequences is not None else entry.documents
            if docs != want:
                out.fail(f"{prefix}.idx: {docs} sequences, snapshot {split} packs {want}")
            if tokens != entry.tokens:
                out.fail(f"{prefix}.bin: {tokens} tokens, snapshot {split} has {entry.tokens}")
            out.metrics[f"{split}_documents"] = docs
            out.metrics[f"{split}_tokens"] = tokens
    return out


def check_text_release(
    snap: Path, release: Path | None, sample: int, seed: int = 0
) -> CheckOutcome:
    """A text release (the snapshot's own `text/`, or one given) is whole and re-tokenizes
    to the snapshot's tokens (snapshot/text_release.py); a snapshot without one passes."""
    out = CheckOutcome("text_release", True)
    folder = release if release is not None else snap / TEXT_DIR
    if release is None and not (folder / COMPLETE).exists():
        out.metrics["released"] = "no"
        return out
    found = check_release(folder, snap, sample=sample, seed=seed)
    for problem in found.problems:
        out.fail(problem)
    out.metrics.update(
        released="yes", documents_checked=found.documents_checked, files_checked=found.files_checked
    )
    return out


def check_card(snap: Path, manifest: SnapshotManifest) -> CheckOutcome:
    """README.md is there, in the dataset-card format, and its figures are the manifest's."""
    out = CheckOutcome("dataset_card", True)
    for problem in card_problems(snap, manifest):
        out.fail(problem)
    return out


FROM_DISK: dict[
    str, Callable[[Path, SnapshotManifest, SnapshotConfig, bool, Mapper], CheckOutcome]
] = {
    "file_checksums": lambda s, m, c, full, mapper: check_files(s, m, mapper),
    "schema_contract": lambda s, m, c, full, mapper: check_schema(s, m),
    "token_range_and_pads": lambda s, m, c, full, mapper: check_token_ranges(s, m, mapper),
    "document_consistency": lambda s, m, c, full, mapper: check_documents(s, m, mapper),
    "round_trip_decode": lambda s, m, c, full, mapper: check_round_trip(
        s, m, m.documents if full else c.round_trip_sample, c.seed, mapper
    ),
    "ledger_completeness": lambda s, m, c, full, mapper: check_ledger(s, m),
    "dataset_card": lambda s, m, c, full, mapper: check_card(s, m),
    "text_release": lambda s, m, c, full, mapper: check_text_release(
        s, None, m.documents if full else c.text_sample, c.seed
    ),
}


ALL_CHECKS = [*FROM_DISK, "consumer_smoke_read", "megatron_read_back"]

# The checks whose every input is the manifest, a file it lists (with that file's sha256) or
# the snapshot stage's config: over the same manifest bytes and config they can only give
# what they gave before. A promoted snapshot's Dagster checks report what its promotion
# recorded for these (stages/snapshot.py) while file_checksums, always run again, proves
# the files are still the listed bytes. The others read what the manifest does not cover
# (the card, the text release, the Megatron export) or prove a read in the final place.
MANIFEST_BOUND = (
    "schema_contract",
    "token_range_and_pads",
    "document_consistency",
    "round_trip_decode",
    "ledger_completeness",
)
# Manifest fields that say when and from which upstream versions a snapshot was made, read
# by no check: two manifests that differ only in them get the same outcome from each check.
PROVENANCE = frozenset({"created_at", "engine", "inputs", "tokenizer_policy"})


def same_checked_facts(a: SnapshotManifest, b: SnapshotManifest) -> bool:
    """Whether every check reads the same facts from `a` as from `b`."""
    return a.model_dump(exclude=set(PROVENANCE)) == b.model_dump(exclude=set(PROVENANCE))


def run_check(
    name: str,
    snap: Path,
    config: SnapshotConfig,
    full: bool = False,
    mapper: Mapper = inline,
    megatron_dir: Path | None = None,
) -> CheckOutcome:
    """One promotion check; an exception becomes a failed outcome naming the snapshot. The
    per-shard work runs as tasks of `mapper` (an executor's map; default: this process)."""
    try:
        if name == "consumer_smoke_read":
            return check_consumer_smoke(snap, config)
        if name == "megatron_read_back":
            return check_megatron(snap, mapper, megatron_dir)
        manifest = read_manifest(snap)
        return FROM_DISK[name](snap, manifest, config, full, mapper)
    except Exception as e:  # a check that crashes is a failed check, reported as such
        return CheckOutcome(name, False, problems=[f"{snap}: {type(e).__name__}: {e}"])


def verify_snapshot(
    snap: Path, config: SnapshotConfig | None = None, full: bool = False, mapper: Mapper = inline
) -> list[CheckOutcome]:
    config = config or SnapshotConfig()
    return [run_check(name, snap, config, full, mapper) for name in FROM_DISK]


def _table(outcomes: list[CheckOutcome]) -> str:
    width = max(len(o.name) for o in outcomes)
    lines = []
    for o in outcomes:
        metrics = ", ".join(f"{k}={v}" for k, v in o.metrics.items())
        lines.append(f"{'PASS' if o.passed else 'FAIL'}  {o.name:<{width}}  {metrics}")
        lines.extend(f"      - {p}" for p in o.problems[:10])
    return "\n".join(lines)


def _cmd_verify(args: argparse.Namespace) -> int:
    # a snapshot by URI is judged on a copy fetched now, never on an earlier cached one
    with tempfile.TemporaryDirectory(prefix="megacpp-verify-") as fresh:
        snap = local_snapshot(args.snapshot_dir, fresh)
        if (why := not_a_snapshot(snap)) is not None:  # one line, not every check failing
            raise SnapshotError(why)
        outcomes = verify_snapshot(snap, full=args.full)
        if args.text is not None:  # a release written elsewhere (megacpp export-text)
            config = SnapshotConfig()
            sample = read_manifest(snap).documents if args.full else config.text_sample
            outcomes.append(check_text_release(snap, Path(args.text), sample, config.seed))
    given = str(args.snapshot_dir)
    if "://" in given:  # name files by their place in the store, not the temporary copy
        where = given.split("?", 1)[0].rstrip("/")
        for o in outcomes:
            o.problems = [p.replace(str(snap), where) for p in o.problems]
    print(_table(outcomes))
    failed = [o for o in outcomes if not o.passed]
    if failed:
        first = failed[0]
        problem = first.problems[0].splitlines()[0]  # one line, even for a parser's message
        print(f"megacpp verify: FAILED {first.name}: {problem}", file=sys.stderr)
        return 1
    return 0


# What the snapshot commands raise about the snapshot they were given: one line naming the
# file, field and rule, exit 2 (the format of megacpp_pipeline.cli for its known errors).
_SNAPSHOT_ERRORS = (
    SnapshotError,
    TextReleaseError,
    SnapshotFetchError,
    LoaderError,
    MegatronExportError,
    IndexedDatasetFormatError,
)


def _one_line_errors(
    command: Callable[[argparse.Namespace], int],
) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        try:
            return command(args)
        except _SNAPSHOT_ERRORS as e:
            print(f"megacpp {args.command}: {type(e).__name__}: {e}", file=sys.stderr)
            return 2

    return run


def with_one_line_errors(
    register: Callable[[argparse.ArgumentParser], None],
) -> Callable[[argparse.ArgumentParser], None]:
    """A snapshot command whose errors about its snapshot are one line (exit 2)."""

    def wrapped(p: argparse.ArgumentParser) -> None:
        register(p)
        p.set_defaults(func=_one_line_errors(p.get_default("func")))

    return wrapped


def _cmd_inspect(args: argparse.Namespace) -> int:
    print(manifest_summary(read_manifest(local_snapshot(args.snapshot_dir))))
    return 0


def _cmd_export(args: argparse.Namespace) -> int:
    from megacpp_pipeline.snapshot import megatron

    snap = local_snapshot(args.snapshot_dir)
    read_manifest(snap)
    for split in args.split:
        prefix = Path(f"{args.out}_{split}" if len(args.split) > 1 else args.out)
        summary = megatron.export_snapshot(snap, prefix, split=split)
        print(f"{prefix}.bin/.idx: {summary}")
    return 0


def _register_verify(p: argparse.ArgumentParser) -> None:
    p.description = "re-run the promotion checks and every file's sha256 from disk alone"
    p.add_argument("snapshot_dir")
    p.add_argument(
        "--full", action="store_true", help="round-trip (and re-tokenize) every document"
    )
    p.add_argument(
        "--text",
        default=None,
        metavar="DIR",
        help="also check a text release written by export-text: whole, of this snapshot, and "
        "its texts re-tokenized give the snapshot's tokens (the snapshot's own text/ is "
        "always checked)",
    )
    p.set_defaults(func=_one_line_errors(_cmd_verify))


def _register_inspect(p: argparse.ArgumentParser) -> None:
    p.description = "print the snapshot manifest's summary"
    p.add_argument("snapshot_dir")
    p.set_defaults(func=_one_line_errors(_cmd_inspect))


def _register_export(p: argparse.ArgumentParser) -> None:
    p.description = "write a Megatron MMIDIDX .bin/.idx pair, one sequence per document"
    p.add_argument("snapshot_dir")
    p.add_argument("--out", required=True, help="output prefix")
    p.add_argument("--split", nargs="+", default=["train"], choices=list(layout.SPLITS))
    p.set_defaults(func=_one_line_errors(_cmd_export))


def _cmd_export_text(args: argparse.Namespace) -> int:
    snap = local_snapshot(args.snapshot_dir)
    config = ReleaseConfig(max_rows=args.max_rows, max_bytes=args.max_bytes)
    release = write_release(snap, Path(args.out), config)
    for split, entry in release.splits.items():
        print(
            f"{split:<10} {entry.documents} documents, {entry.text_bytes} bytes of text, "
            f"{len(entry.shards)} shards"
        )
    if release.not_in_rows:
        print(f"not in the rows (their source's weight drew them 0 times): {release.not_in_rows}")
    print(Path(args.out))
    return 0


def _register_export_text(p: argparse.ArgumentParser) -> None:
    p.description = (
        "write every document in the snapshot's rows as text with its metadata (source, path, "
        "revision, licence, language, scrub kinds, split, doc id): parquet shards per split, a "
        f"manifest and {COMPLETE}; datasets.load_dataset('parquet', data_dir=OUT) reads it"
    )
    p.add_argument("snapshot_dir")
    p.add_argument("--out", required=True, help="a new folder")
    p.add_argument("--max-rows", type=int, default=ReleaseConfig().max_rows, help="per shard")
    p.add_argument(
        "--max-bytes", type=int, default=ReleaseConfig().max_bytes, help="of text per shard"
    )
    p.set_defaults(func=_one_line_errors(_cmd_export_text))


COMMANDS: dict[str, Callable[[argparse.ArgumentParser], None]] = {
    "verify": _register_verify,
    "export-text": _register_export_text,
    "inspect": _register_inspect,
    "export-megatron": _register_export,
}
