"""Collection: read every file of a pinned source at its exact revision, without executing
or extracting anything from it. Git is read at the pinned commit through the git CLI;
archives are checked against their sha256 first and read member by member in memory (never
extracted), so `..`, absolute names, links and device files cannot reach the disk.

Seed rule: the operational slice is pinned; every file seen gets a ledger status.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

from megacpp_pipeline.collect.archive import archive_listing, archive_source, fetch_archive
from megacpp_pipeline.collect.directory import (
    ToRead,
    WalkUnit,
    dir_listing,
    dir_slices,
    dir_source,
    dir_units,
    entry_digests,
    fits_slice,
    read_entry,
    tree_lines,
)
from megacpp_pipeline.collect.git import commit_exists, git_listing, git_source, resolve_branch
from megacpp_pipeline.collect.source import (
    CollectError,
    Entry,
    Listed,
    PathFilter,
    Scope,
    SourceFiles,
    glob_to_regex,
    record_license_path,
    safe_relpath,
    too_large,
    unescape_name,
)
from megacpp_pipeline.core import schemas
from megacpp_pipeline.core.catalog import DEFAULT_MAX_FILE_BYTES, CollectLimits, SourceSpec
from megacpp_pipeline.core.ledger import LEDGER_SCHEMA, DropReason
from megacpp_pipeline.core.schemas import git_blob_sha
from megacpp_pipeline.storage.versions import sha256_file

__all__ = [
    "METADATA_FILES",
    "CollectBatch",
    "CollectError",
    "Entry",
    "Listed",
    "PathFilter",
    "SourceFiles",
    "ToRead",
    "WalkUnit",
    "collect_batches",
    "collect_slice",
    "commit_exists",
    "entry_digests",
    "fetch_archive",
    "fits_slice",
    "glob_to_regex",
    "list_source",
    "max_record_bytes",
    "open_source",
    "read_entry",
    "record_license_path",
    "resolve_branch",
    "safe_relpath",
    "slice_source",
    "sliced",
    "tree_lines",
    "unescape_name",
    "walk_units_of",
]


def open_source(
    spec: SourceSpec,
    uri: str,
    *,
    cache_dir: Path,
    limits: CollectLimits,
    max_file_bytes: int = DEFAULT_MAX_FILE_BYTES,
    keep_also: Callable[[str], bool] | None = None,
) -> SourceFiles:
    """The pinned revision and a re-iterable stream of every file in the source.

    `max_file_bytes`: the size policy for this source (Catalog.file_limit); a larger file is
    refused (TOO_LARGE, naming the setting) before more than that is read of it.
    `keep_also` names extra files to keep besides the include globs (REUSE metadata,
    compile_commands.json): the gates that need them read them from the collected rows.
    """
    scope = Scope(spec, keep_also)
    if spec.kind == "git":
        return git_source(spec, uri, cache_dir, scope, limits, max_file_bytes)
    if spec.kind == "archive":
        return archive_source(spec, uri, cache_dir, scope, limits, max_file_bytes)
    if spec.kind == "dir":
        return dir_source(spec, uri, scope, limits, max_file_bytes)
    if spec.kind == "jsonl":
        return _jsonl_source(spec, uri, scope, max_file_bytes)
    raise CollectError(f"source {spec.id!r}: unknown kind {spec.kind!r}")


def sliced(spec: SourceSpec) -> bool:
    """Whether the source's files are read in slices side by side (`slice_source`), not as
    one stream."""
    return spec.kind == "dir"


def walk_units_of(spec: SourceSpec, uri: str) -> list[WalkUnit] | None:
    """A directory source's tree cut into units that tasks walk side by side (folders listed,
    no file read); None for the kinds read as one stream (git, archives, JSONL)."""
    if not sliced(spec):
        return None
    return dir_units(spec, uri, Scope(spec, None))


def slice_source(
    spec: SourceSpec,
    uri: str,
    *,
    max_file_bytes: int = DEFAULT_MAX_FILE_BYTES,
    keep_also: Callable[[str], bool] | None = None,
    unit: WalkUnit | None = None,
) -> list[tuple[Entry | ToRead, ...]] | None:
    """A directory source's walk (of one of its `walk_units_of`, or of the whole tree) cut
    into slices that tasks read side by side (its revision is then the sha256 of their
    `tree_lines` in order); None for the kinds read as one stream (git, archives, JSONL)."""
    if not sliced(spec):
        return None
    return dir_slices(spec, uri, Scope(spec, keep_also), max_file_bytes, unit)


def list_source(
    spec: SourceSpec,
    uri: str,
    *,
    cache_dir: Path,
    limits: CollectLimits,
    max_file_bytes: int = DEFAULT_MAX_FILE_BYTES,
) -> Listed:
    """How many files of the source collection would keep, and their bytes, without reading
    any file (git: `ls-tree -l`; an archive: its member list; a directory: a walk; JSONL: its
    records counted by line, its size as their bytes). `max_file_bytes`: the source's size
    policy (Catalog.file_limit), as collection applies it."""
    scope = Scope(spec, None)
    if spec.kind == "git":
        return git_listing(spec, uri, cache_dir, scope, max_file_bytes)
    if spec.kind == "archive":
        return archive_listing(spec, uri, cache_dir, scope, limits, max_file_bytes)
    if spec.kind == "dir":
        return dir_listing(spec, uri, scope, max_file_bytes)
    if spec.kind == "jsonl":
        path = _jsonl_export(spec, uri)
        lines = 0
        with path.open("rb") as f:
            while chunk := f.read(1 << 20):
                lines += chunk.count(b"\n")
        return Listed(None, lines, path.stat().st_size, "JSONL lines and file size")
    raise CollectError(f"source {spec.id!r}: unknown kind {spec.kind!r}")


def max_record_bytes(max_file_bytes: int) -> int:
    """The longest JSONL line worth reading for files up to `max_file_bytes`: JSON may spell
    each byte as a six-character escape, and the record has its other fields. Past it the
    content is over the size policy however it is spelled, so the line is rejected unread."""
    return 6 * max_file_bytes + (64 << 10)


def _jsonl_export(spec: SourceSpec, uri: str) -> Path:
    """The export file a jsonl source names, refused when missing or compressed."""
    from megacpp_pipeline.collect.jsonl_stream import reader

    path = Path(uri.removeprefix("file://"))
    if not path.is_file():
        raise CollectError(f"source {spec.id!r}: {path} not found")
    with path.open("rb") as f:
        if problem := reader.compression_problem(path, f.read(reader.MAGIC_BYTES)):
            raise CollectError(f"source {spec.id!r}: {problem}")
    return path


def _jsonl_source(spec: SourceSpec, uri: str, scope: Scope, max_file_bytes: int) -> SourceFiles:
    from megacpp_pipeline.collect.jsonl_stream import reader

    path = _jsonl_export(spec, uri)

    def entry(rec: dict[str, object]) -> Entry:
        rel = safe_relpath(str(rec["path"]))
        if rel is None:
            return Entry(str(rec["path"]), None, DropReason.UNSAFE_PATH, "absolute or `..`")
        if (drop := scope.classify(rel)) is not None:
            return drop
        if (size := len(content := str(rec["content"]).encode("utf-8"))) > max_file_bytes:
            return too_large(rel, size, max_file_bytes)
        return Entry(rel, content)

    def named(meant: str | None, line_no: int) -> str:
        return f"<line {line_no}>" if meant is None else safe_relpath(meant) or meant

    def entries() -> Iterator[Entry]:
        # Every source's files come out in path order (what the later stages and the
        # snapshot's ledger merge keep), whatever order the export's lines are in: a first
        # pass keeps each record's path and where its line is, a second reads them in path
        # order (a line at a time: memory follows the number of records, not their text).
        # The export is pinned (its sha256 is the revision): a last line without a newline
        # is a record like any other.
        rejects: list[reader.RecordReject] = []
        found: list[tuple[str, int, tuple[int, int] | reader.RecordReject]] = [
            (named(str(rec["path"]), int(rec["line_no"])), int(rec["line_no"]), (at, size))
            for rec, at, size in reader.iter_located_records(
                path, rejects, max_line_bytes=max_record_bytes(max_file_bytes), at_rest=True
            )
        ]
        # a malformed line is named by the path its record meant, else by its line
        found += [(named(r.path, r.line_no), r.line_no, r) for r in rejects]
        found.sort(key=lambda item: (item[0], item[1]))
        # two records naming one path (`src/a.h` and `./src/a.h`, or a malformed record
        # meaning it): which is meant is ambiguous, as for an archive's repeated member;
        # every copy is dropped, each with its line
        copies = Counter(n for n, _, _ in found)
        with open(path, "rb") as f:
            for name, line_no, where in found:
                if isinstance(where, reader.RecordReject):
                    yield Entry(name, None, DropReason.MALFORMED_RECORD, where.describe(path))
                elif copies[name] > 1:
                    why = (
                        f"line {line_no}: {copies[name]} records share this path; which one is "
                        "meant is ambiguous"
                    )
                    yield Entry(name, None, DropReason.UNSAFE_PATH, why)
                else:
                    record = reader.record_at(f, *where, line_no)
                    got = entry(record)
                    yield got
                    declared = record["license"]
                    if got.content is not None and isinstance(declared, str):
                        # what the record says the file's licence is, for the licence gate
                        yield Entry(
                            record_license_path(got.path),
                            declared.encode("utf-8"),
                            metadata_only=True,
                        )

    return SourceFiles(revision=sha256_file(path), entries=entries)


# --- to Arrow -----------------------------------------------------------------------------
METADATA_FILES = pa.schema(
    [
        pa.field("path", pa.string(), nullable=False),
        pa.field("content", pa.binary(), nullable=False),
    ],
    metadata={"megacpp.table": "metadata_files", "megacpp.schema_version": "1"},
)


@dataclass
class CollectBatch:
    kept: pa.Table  # schemas.RAW_FILES
    ledger: pa.Table  # every file seen in the batch, kept or dropped
    metadata: pa.Table  # METADATA_FILES: REUSE files, compile_commands.json


def collect_batches(
    spec: SourceSpec,
    files: SourceFiles,
    *,
    is_metadata: Callable[[str], bool],
    include: PathFilter | None = None,
    batch_bytes: int = 16 << 20,  # one shard's worth: memory is bounded by shard size
) -> Iterator[CollectBatch]:
    """Bounded Arrow batches of the source's files, with one ledger row per file seen."""
    wanted = include or PathFilter(spec.include, spec.exclude)
    rows: list[Entry] = []
    size = 0
    for entry in files.entries():
        rows.append(entry)
        size += len(entry.content or b"")
        if size >= batch_bytes or len(rows) >= 5000:
            yield _batch(spec, files.revision, rows, is_metadata, wanted)
            rows, size = [], 0
    if rows:
        yield _batch(spec, files.revision, rows, is_metadata, wanted)


def collect_slice(
    spec: SourceSpec,
    revision: str,
    entries: list[Entry],
    is_metadata: Callable[[str], bool],
    digests: Sequence[str | None] | None = None,
) -> CollectBatch:
    """One slice's files as one batch (a slice is cut to about a batch's size); `digests`,
    each read file's sha256 where the caller has it (entry_digests), are not computed again."""
    wanted = PathFilter(spec.include, spec.exclude)
    return _batch(spec, revision, entries, is_metadata, wanted, digests)


def _batch(
    spec: SourceSpec,
    revision: str,
    entries: list[Entry],
    is_metadata: Callable[[str], bool],
    wanted: PathFilter,
    digests: Sequence[str | None] | None = None,
) -> CollectBatch:
    said = [e for e in entries if e.metadata_only]  # what the source says of its files
    if said:
        if digests is not None:
            digests = [d for d, e in zip(digests, entries, strict=True) if not e.metadata_only]
        entries = [e for e in entries if not e.metadata_only]
    is_kept = [e.content is not None and wanted(e.path) for e in entries]
    kept = [e for e, k in zip(entries, is_kept, strict=True) if k]
    meta = said + [
        e
        for e, k in zip(entries, is_kept, strict=True)
        if not k and e.content is not None and is_metadata(e.path)
    ]
    contents = [e.content or b"" for e in kept]
    kept_table = pa.table(
        {
            "source_id": pa.array([spec.id] * len(kept), pa.string()),
            "path": pa.array([e.path for e in kept], pa.string()),
            "revision": pa.array([revision] * len(kept), pa.string()),
            "blob_sha": pa.array([git_blob_sha(c) for c in contents], pa.string()),
            "size": pa.array([len(c) for c in contents], pa.int64()),
            "content": pa.array(contents, pa.binary()),
        },
        schema=schemas.RAW_FILES,
    )
    status: list[str] = []
    reasons: list[str | None] = []
    details: list[str | None] = []
    for e, k in zip(entries, is_kept, strict=True):
        if k:
            status.append("kept")
            reasons.append(None)
            details.append(None)
        else:
            status.append("dropped")
            reasons.append(str(e.reason or DropReason.NOT_INCLUDED))
            details.append(
                e.detail
                if e.content is None
                else "metadata for the license/enrich gates"
                if is_metadata(e.path)
                else e.detail
            )
    n = len(entries)
    ledger_table = pa.table(
        {
            "source_id": pa.array([spec.id] * n, pa.string()),
            "path": pa.array([e.path for e in entries], pa.string()),
            "stage": pa.array([""] * n, pa.string()),
            "status": pa.array(status, pa.string()),
            "reason": pa.array(reasons, pa.string()),
            "detail": pa.array(details, pa.string()),
            "dup_of": pa.nulls(n, pa.string()),
            "license_expression": pa.nulls(n, pa.string()),
            "sha256": pa.array(
                list(digests) if digests is not None else entry_digests(entries), pa.string()
            ),
        },
        schema=LEDGER_SCHEMA,
    )
    meta_table = pa.table(
        {
            "path": pa.array([e.path for e in meta], pa.string()),
            "content": pa.array([e.content for e in meta], pa.binary()),
        },
        schema=METADATA_FILES,
    )
    return CollectBatch(kept_table, ledger_table, meta_table)
