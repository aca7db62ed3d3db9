"""raw_files: every file of a source at its pinned revision (git commit, verified archive
sha256, directory tree hash, JSONL export), each one seen in the ledger; the non-corpus
files the later stages read (REUSE metadata, the compile database) in a metadata table. The
one size policy (`max_file_bytes`) is applied here: no later stage sees a larger file."""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import pyarrow.compute as pc

from megacpp_pipeline import collect
from megacpp_pipeline.core import ledger
from megacpp_pipeline.core.catalog import Catalog, SourceSpec
from megacpp_pipeline.core.ledger import LEDGER_SCHEMA, DropReason
from megacpp_pipeline.core.schemas import RAW_FILES
from megacpp_pipeline.pipeline.context import StageContext
from megacpp_pipeline.pipeline.metadata import drop_reasons_table, summary_metadata
from megacpp_pipeline.pipeline.registry import Check, CheckOutcome, Grain, Materialized, Stage
from megacpp_pipeline.snapshot import layout
from megacpp_pipeline.stages import names
from megacpp_pipeline.storage.store import (
    ShardInfo,
    ShardStore,
    ShardUploader,
    TableWriter,
    WrittenSchema,
)


def _count(stats: Counter[str], batch: collect.CollectBatch) -> None:
    stats["files_seen"] += batch.ledger.num_rows
    stats["kept_files"] += batch.kept.num_rows
    stats["dropped_files"] += batch.ledger.num_rows - batch.kept.num_rows
    stats["kept_bytes"] += int(pc.sum(batch.kept["size"]).as_py() or 0)
    for reason in batch.ledger["reason"].drop_null().to_pylist():
        stats[f"ledger:{reason}"] += 1


@dataclass(frozen=True)
class _DirJob:
    """What a task reading a directory source's slice needs (all of it picklable)."""

    store: ShardStore
    spec: SourceSpec
    stage: str
    version_dir: str
    max_file_bytes: int


@dataclass(frozen=True)
class _DirSlice:
    index: int
    revision: str
    items: tuple[collect.Entry | collect.ToRead, ...]
    metadata: frozenset[str]  # the slice's files the registry keeps as metadata


@dataclass
class _SliceOut:
    shards: list[tuple[str, ShardInfo, WrittenSchema]]
    stats: Counter[str]


def _digest_task(job: _DirJob, items: tuple[collect.Entry | collect.ToRead, ...]) -> bytes:
    """A slice's share of the directory's revision: its files read and hashed."""
    return collect.tree_lines(collect.read_entry(item, job.max_file_bytes) for item in items)


def _collect_task(job: _DirJob, task: _DirSlice) -> _SliceOut:
    """A slice's files read again and written as one shard per table into the version."""
    entries = [collect.read_entry(item, job.max_file_bytes) for item in task.items]
    batch = collect.collect_slice(job.spec, task.revision, entries, task.metadata.__contains__)
    out = _SliceOut([], Counter())
    _count(out.stats, batch)
    uploader = ShardUploader(job.store, job.version_dir)
    for name, table in (
        (layout.DATA, batch.kept),
        ("ledger", ledger.stamp(batch.ledger, job.stage)),
        ("metadata", batch.metadata),
    ):
        if table.num_rows:
            prefix = "part" if name == layout.DATA else name
            shard, written = uploader.write_parquet(f"{prefix}-{task.index:05d}.parquet", table)
            out.shards.append((name, shard, written))
    return out


def _collect_slices(
    ctx: StageContext,
    job: _DirJob,
    slices: list[tuple[collect.Entry | collect.ToRead, ...]],
    is_metadata: Callable[[str], bool],
    tables: dict[str, TableWriter],
    stats: Counter[str],
) -> str:
    """A directory source read by this host's workers, a slice each, twice (once for the
    revision, a tree hash that every row carries, then to write the rows), the shards
    adopted in slice order: the same version as one process reading the tree in order.
    The revision."""
    executor = ctx.host_executor()  # the tree is on this host's disk
    tree = hashlib.sha256()
    for lines in executor.map(_digest_task, job, slices):
        tree.update(lines)
    revision = tree.hexdigest()
    tasks = [
        _DirSlice(
            i,
            revision,
            items,
            frozenset(
                x.path for x in items if isinstance(x, collect.ToRead) and is_metadata(x.path)
            ),
        )
        for i, items in enumerate(slices)
    ]
    for out in executor.map(_collect_task, job, tasks):
        for name, shard, written in out.shards:
            tables[name].adopt(shard, written)
        stats.update(out.stats)
    return revision


def _body(ctx: StageContext, stage: Stage, source: str | None) -> Materialized:
    assert source is not None
    cat = ctx.catalog
    spec = cat.source(source)
    pinned = ctx.pins.get(source)
    if spec.track and pinned:
        # the refresh resolved the tracked branch when it launched this run: pin exactly that
        spec = spec.model_copy(update={"revision": pinned, "track": None})
    is_metadata = partial(ctx.registry.is_metadata_file, spec)
    uri = cat.resolve_uri(spec)
    max_file_bytes = cat.file_limit(spec)
    version = ctx.store.begin(
        stage.name, spec.id, code_version=ctx.code_version(stage), config=spec, run_id=ctx.run_id
    )
    tables = {
        layout.DATA: version.table(layout.DATA, RAW_FILES),
        "ledger": version.table("ledger", LEDGER_SCHEMA),
        "metadata": version.table("metadata", collect.METADATA_FILES),
    }
    stats: Counter[str] = Counter(files_seen=0, kept_files=0, dropped_files=0, kept_bytes=0)
    slices = collect.slice_source(spec, uri, max_file_bytes=max_file_bytes, keep_also=is_metadata)
    if slices is not None:
        job = _DirJob(ctx.store, spec, stage.name, version.dir, max_file_bytes)
        revision = _collect_slices(ctx, job, slices, is_metadata, tables, stats)
    else:
        files = collect.open_source(
            spec,
            uri,
            cache_dir=ctx.cache_dir,
            limits=cat.collect,
            max_file_bytes=max_file_bytes,
            keep_also=is_metadata,
        )
        revision = files.revision
        for batch in collect.collect_batches(spec, files, is_metadata=is_metadata):
            tables[layout.DATA].write(batch.kept)
            tables["ledger"].write(ledger.stamp(batch.ledger, stage.name))
            tables["metadata"].write(batch.metadata)
            _count(stats, batch)
    manifest = version.commit(
        stats=stats, extra={"revision": revision, "kind": spec.kind, "uri": uri}
    )
    ctx.log(
        f"{stage.name} [{source}]: {stats['files_seen']} files seen, {stats['kept_files']} kept"
    )
    meta_out = summary_metadata(
        ctx.store,
        manifest,
        revision=revision,
        files_seen=stats["files_seen"],
        kept_bytes=stats["kept_bytes"],
        drop_reasons=drop_reasons_table(stats),
    )
    return Materialized(source, meta_out, stats)


def _every_seen_file_in_ledger(ctx: StageContext, stage: Stage, source: str | None) -> CheckOutcome:
    manifest = ctx.latest(stage.name, source)
    seen = kept_in_ledger = 0
    for t in ctx.store.iter_tables(manifest, "ledger", columns=["status"]):
        seen += t.num_rows
        kept_in_ledger += int(pc.sum(pc.equal(t["status"], "kept")).as_py() or 0)
    revision = manifest.extra.get("revision")
    passed = manifest.rows == kept_in_ledger and bool(revision) and seen >= manifest.rows
    return CheckOutcome(
        passed=passed,
        metadata={"files_seen": seen, "kept": manifest.rows, "revision": str(revision)},
        description=None
        if passed
        else f"{source}: {manifest.rows} rows kept but {kept_in_ledger} kept in the ledger"
        + ("" if revision else "; no revision recorded"),
    )


STAGE = Stage(
    name=names.RAW_FILES,
    grain=Grain.PER_SOURCE,
    group="collect",
    description="Every file of the source at its pinned revision (git commit, verified archive "
    "sha256 or directory tree hash); every file seen is in the ledger.",
    reads=(names.SOURCE_CATALOG,),
    code=(collect.__name__, __name__),
    schema=RAW_FILES,
    # the one size policy is applied here, before a file is read past it
    version_data=lambda catalog: {"max_file_bytes": catalog.size_policy()},
    drop_reasons=(
        DropReason.NOT_INCLUDED,
        DropReason.UNSAFE_PATH,
        DropReason.SYMLINK,
        DropReason.POINTER_FILE,
        DropReason.ARCHIVE_LIMIT,
        DropReason.UNREADABLE,
        DropReason.TOO_LARGE,
        DropReason.MALFORMED_RECORD,
    ),
    writes_ledger=True,
    body=_body,
    checks=(
        Check(
            "every_seen_file_in_ledger",
            "Every file seen in the source has a ledger row; the kept ones are the data rows; "
            "the revision is recorded.",
            _every_seen_file_in_ledger,
        ),
    ),
    kinds=("git", "parquet"),
)


def current_revisions(catalog: Catalog, cache_dir: Path) -> dict[str, str]:
    """source id -> the revision a collection would read now (a tracked git branch
    resolves to the commit it points at; other sources to their pin or content hash)."""
    out = {}
    for spec in catalog.operational:
        files = collect.open_source(
            spec,
            catalog.resolve_uri(spec),
            cache_dir=cache_dir,
            limits=catalog.collect,
            max_file_bytes=catalog.file_limit(spec),
        )
        out[spec.id] = files.revision
    return out
