"""raw_files: every file of a source at its pinned revision (git commit, verified archive
sha256, directory tree hash, JSONL export), each one seen in the ledger; the non-corpus
files the later stages read (REUSE metadata, the compile database) in a metadata table. The
one size policy (`max_file_bytes`) is applied here: no later stage sees a larger file."""

from __future__ import annotations

import hashlib
import pickle
import tempfile
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

import pyarrow.compute as pc

from megacpp_pipeline import collect
from megacpp_pipeline.core import ledger
from megacpp_pipeline.core.catalog import Catalog, SourceSpec
from megacpp_pipeline.core.ledger import LEDGER_SCHEMA, DropReason
from megacpp_pipeline.core.schemas import RAW_FILES
from megacpp_pipeline.pipeline import reuse
from megacpp_pipeline.pipeline.context import StageContext
from megacpp_pipeline.pipeline.metadata import drop_reasons_table, summary_metadata
from megacpp_pipeline.pipeline.registry import (
    Check,
    CheckOutcome,
    Grain,
    Materialized,
    Registry,
    Stage,
)
from megacpp_pipeline.snapshot import layout
from megacpp_pipeline.stages import names
from megacpp_pipeline.storage.store import (
    Manifest,
    ShardInfo,
    ShardUploader,
    VersionWriter,
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
class _Source:
    """One source as this run collects it."""

    spec: SourceSpec  # a tracked branch pinned to the commit the run resolved
    uri: str
    max_file_bytes: int
    version_dir: str = ""  # where a directory source's slices write their shards
    inputs: str | None = None  # what its version is a function of, where known (reuse)


@dataclass(frozen=True)
class _Job:
    """What the tasks share (handed to forked workers of this host, never pickled). A walk
    writes each chunk's plan (its file list) into `plans`, a folder of this host's, and a
    later task reads its own slice's chunks back: the driver holds each chunk's count of
    files and bytes, never a file list (at demo 64x the lists were about 40 MB of the
    group's driver)."""

    ctx: StageContext
    stage: Stage
    sources: dict[str, _Source]
    plans: str = ""


@dataclass(frozen=True)
class _Walk:
    """One unit of a directory source's tree (collect.walk_units_of, written to the plans
    folder by `_units_task`), walked by one task and cut into chunks of at most a slice."""

    source: str
    number: int  # its place among the source's units


@dataclass(frozen=True)
class _Planned:
    """A directory slice as its walk planned it."""

    items: tuple[collect.Entry | collect.ToRead, ...]
    metadata: frozenset[str]  # its files the registry keeps as metadata


@dataclass(frozen=True)
class _DirSlice:
    source: str
    index: int  # in the source's slices: names its shards
    chunks: tuple[tuple[int, int], ...]  # (unit, chunk) plans its walks wrote, in order
    revision: str = ""  # the source's, once the digests are in
    lines_sha: str = ""  # the sha256 of this slice's share of the revision (tree_lines)


@dataclass(frozen=True)
class _Whole:
    source: str  # a source read as one stream (git, archive, JSONL) by one task


@dataclass
class _SliceOut:
    shards: list[tuple[str, ShardInfo, WrittenSchema]]
    stats: Counter[str]


def _resolved(ctx: StageContext, source: str) -> _Source:
    cat = ctx.catalog
    spec = cat.source(source)
    pinned = ctx.pins.get(source)
    if spec.track and pinned:
        # the refresh resolved the tracked branch when it launched this run: pin exactly that
        spec = spec.model_copy(update={"revision": pinned, "track": None})
    return _Source(spec, cat.resolve_uri(spec), cat.file_limit(spec))


def _plan_path(job: _Job, source: str, unit: int, chunk: int) -> Path:
    return Path(job.plans) / f"{_plan_name(source)}-{unit:05d}-{chunk:06d}.pickle"


def _unit_path(job: _Job, source: str, unit: int) -> Path:
    return Path(job.plans) / f"{_plan_name(source)}-{unit:05d}.unit.pickle"


def _plan_name(source: str) -> str:
    return hashlib.sha256(source.encode("utf-8", "surrogatepass")).hexdigest()[:24]


def _units_task(job: _Job, sources: tuple[str, ...]) -> list[int]:
    """The directory sources' trees cut into walk units (their folders listed), each unit
    written for the task that walks it; how many units each source has. A run of a large
    folder carries its entries' names, so the listing stays out of the driver."""
    counts = []
    for s in sources:
        units = collect.walk_units_of(job.sources[s].spec, job.sources[s].uri)
        assert units is not None
        for number, unit in enumerate(units):
            _unit_path(job, s, number).write_bytes(
                pickle.dumps(unit, protocol=pickle.HIGHEST_PROTOCOL)
            )
        counts.append(len(units))
    return counts


def _plan(job: _Job, task: _DirSlice) -> _Planned:
    """One slice's plan: its chunks, as its source's walks wrote them, one after another."""
    items: list[collect.Entry | collect.ToRead] = []
    metadata: set[str] = set()
    for unit, chunk in task.chunks:
        planned: _Planned = pickle.loads(_plan_path(job, task.source, unit, chunk).read_bytes())
        items += planned.items
        metadata |= planned.metadata
    return _Planned(tuple(items), frozenset(metadata))


def _first_task(job: _Job, task: _Walk | _Whole) -> list[tuple[int, int]] | Materialized:
    """A unit of a directory source walked (stat only) and cut into chunks of at most a
    slice, each chunk's plan written for the tasks that read it (each chunk's files and
    bytes come back); or a source read as one stream, collected into a version of its own
    and committed."""
    source = job.sources[task.source]
    if isinstance(task, _Whole):
        messages: list[str] = []
        ctx = replace(job.ctx, log=messages.append)
        out = _one_stream(ctx, job.stage, source)
        return replace(out, messages=tuple(messages))
    is_metadata = partial(job.ctx.registry.is_metadata_file, source.spec)
    chunks = collect.slice_source(
        source.spec,
        source.uri,
        max_file_bytes=source.max_file_bytes,
        keep_also=is_metadata,
        unit=pickle.loads(_unit_path(job, task.source, task.number).read_bytes()),
    )
    assert chunks is not None
    sizes: list[tuple[int, int]] = []
    for chunk, items in enumerate(chunks):
        metadata = frozenset(
            x.path for x in items if isinstance(x, collect.ToRead) and is_metadata(x.path)
        )
        _plan_path(job, task.source, task.number, chunk).write_bytes(
            pickle.dumps(_Planned(tuple(items), metadata), protocol=pickle.HIGHEST_PROTOCOL)
        )
        size = sum(x.size for x in items if isinstance(x, collect.ToRead))
        sizes.append((len(items), size))
    return sizes


def _slices_of(source: str, walked: list[list[tuple[int, int]]]) -> list[_DirSlice]:
    """A source's slices from its units' chunks in walk order: consecutive chunks joined
    while they fit in one slice (collect.fits_slice), so a unit's small last chunk shares a
    slice with the next unit's first, and a slice holds more than a slice's worth only when
    one chunk alone does (a walk cuts a chunk after the item that fills it). The same units
    give the same slices, whatever walks them."""
    out: list[_DirSlice] = []
    chunks: list[tuple[int, int]] = []
    files = size = 0
    for unit, sizes in enumerate(walked):
        for chunk, (n, b) in enumerate(sizes):
            if chunks and not collect.fits_slice(size + b, files + n):
                out.append(_DirSlice(source, len(out), tuple(chunks)))
                chunks, files, size = [], 0, 0
            chunks.append((unit, chunk))
            files, size = files + n, size + b
    if chunks:
        out.append(_DirSlice(source, len(out), tuple(chunks)))
    return out


def _lines_path(job: _Job, task: _DirSlice) -> Path:
    return Path(job.plans) / f"{_plan_name(task.source)}-slice-{task.index:06d}.lines"


def _digest_task(job: _Job, task: _DirSlice) -> bytes:
    """A directory slice's share of its revision: its files read and hashed (the lines also
    kept beside the plans, to name a file that changes before the slice is collected)."""
    limit = job.sources[task.source].max_file_bytes
    items = _plan(job, task).items
    lines = collect.tree_lines(collect.read_entry(item, limit) for item in items)
    _lines_path(job, task).write_bytes(lines)
    return lines


def _changed_while_read(job: _Job, task: _DirSlice, lines: bytes) -> str:
    """Which file of the slice the collect pass read otherwise than the digest pass did."""
    before = _lines_path(job, task).read_bytes().split(b"\n")
    for old, new in zip(before, lines.split(b"\n"), strict=False):
        if old != new:
            path = new.split(b"\0", 1)[0].decode("utf-8", "backslashreplace")
            return f"source {task.source!r}: {path} changed while this run collected it"
    return f"source {task.source!r}: its files changed while this run collected them"


def _collect_task(job: _Job, task: _DirSlice) -> _SliceOut:
    """A directory's slice read again and written as one shard per table into its source's
    version. What it read must be what the revision was taken from: a file that changed
    between the two reads fails the source's collection (run again), so a version never
    holds other content than its revision names."""
    source = job.sources[task.source]
    planned = _plan(job, task)
    entries = [collect.read_entry(item, source.max_file_bytes) for item in planned.items]
    digests = collect.entry_digests(entries)  # once, for the revision's lines and the ledger
    lines = collect.tree_lines(entries, digests)
    if hashlib.sha256(lines).hexdigest() != task.lines_sha:
        raise collect.CollectError(
            _changed_while_read(job, task, lines) + " (the revision was taken from other "
            "content than was read); nothing of it is committed: run again"
        )
    batch = collect.collect_slice(
        source.spec, task.revision, entries, planned.metadata.__contains__, digests
    )
    result = _SliceOut([], Counter())
    _count(result.stats, batch)
    uploader = ShardUploader(job.ctx.store, source.version_dir)
    for name, table in (
        (layout.DATA, batch.kept),
        ("ledger", ledger.stamp(batch.ledger, job.stage.name)),
        ("metadata", batch.metadata),
    ):
        if table.num_rows:
            prefix = "part" if name == layout.DATA else name
            shard, written = uploader.write_parquet(f"{prefix}-{task.index:05d}.parquet", table)
            result.shards.append((name, shard, written))
    return result


_TABLES = {layout.DATA: RAW_FILES, "ledger": LEDGER_SCHEMA, "metadata": collect.METADATA_FILES}


def _begin(ctx: StageContext, stage: Stage, spec: SourceSpec) -> VersionWriter:
    version = ctx.store.begin(
        stage.name, spec.id, code_version=ctx.code_version(stage), config=spec, run_id=ctx.run_id
    )
    for name, schema in _TABLES.items():  # all three, even when a source has no such file
        version.table(name, schema)
    return version


def _new_stats() -> Counter[str]:
    return Counter(files_seen=0, kept_files=0, dropped_files=0, kept_bytes=0)


def _one_stream(ctx: StageContext, stage: Stage, source: _Source) -> Materialized:
    """A source read as one stream, in this process."""
    spec = source.spec
    is_metadata = partial(ctx.registry.is_metadata_file, spec)
    files = collect.open_source(
        spec,
        source.uri,
        cache_dir=ctx.cache_dir,
        limits=ctx.catalog.collect,
        max_file_bytes=source.max_file_bytes,
        keep_also=is_metadata,
    )
    version = _begin(ctx, stage, spec)
    stats = _new_stats()
    for batch in collect.collect_batches(spec, files, is_metadata=is_metadata):
        version.table(layout.DATA, RAW_FILES).write(batch.kept)
        version.table("ledger", LEDGER_SCHEMA).write(ledger.stamp(batch.ledger, stage.name))
        version.table("metadata", collect.METADATA_FILES).write(batch.metadata)
        _count(stats, batch)
    return _committed(ctx, stage, source, version, stats, files.revision, source.inputs)


def _committed(
    ctx: StageContext,
    stage: Stage,
    source: _Source,
    version: VersionWriter,
    stats: Counter[str],
    revision: str,
    inputs: str | None = None,
) -> Materialized:
    spec = source.spec
    extra = {"revision": revision, "kind": spec.kind, "uri": source.uri}
    if inputs is not None:
        extra[reuse.INPUTS] = inputs
    manifest = version.commit(stats=stats, extra=extra)
    ctx.log(
        f"{stage.name} [{spec.id}]: {stats['files_seen']} files seen, {stats['kept_files']} kept"
    )
    return Materialized(spec.id, _metadata(ctx, manifest), stats)


def _metadata(ctx: StageContext, manifest: Manifest, **more: Any) -> dict[str, Any]:
    stats = manifest.stats
    return summary_metadata(
        ctx.store,
        manifest,
        revision=str(manifest.extra.get("revision", "")),
        files_seen=int(stats.get("files_seen", 0)),
        kept_bytes=int(stats.get("kept_bytes", 0)),
        drop_reasons=drop_reasons_table(stats),
        **more,
    )


def _pinned_revision(spec: SourceSpec) -> str | None:
    """What names a source's content before anything of it is read: a git source's commit
    (a tracked branch as the run resolved it) or an archive's sha256 (verified when it is
    fetched). None for a directory (its tree hash needs every file) or a JSONL export."""
    if spec.kind == "git":
        return spec.revision
    if spec.kind == "archive":
        return spec.sha256
    return None


def _inputs(ctx: StageContext, stage: Stage, source: str, revision: str) -> str:
    """What a source's version is a function of: its revision (a commit, an archive's
    sha256, a directory's tree hash of every path and content hash), its catalog entry and
    the size policy, this stage's code, and what the stages that ask for metadata files
    would keep (pipeline/reuse.py)."""
    asks = sorted(
        f"{s.name}:{ctx.code_version_unchecked(s)}"
        for s in ctx.registry
        if s.metadata_files is not None
    )
    return reuse.inputs_id(ctx, stage, source, (), salts=(f"revision:{revision}", *asks))


def _standing(ctx: StageContext, stage: Stage, manifest: Manifest) -> Materialized:
    ctx.log(
        f"{stage.name} [{manifest.partition}]: its inputs are those of {manifest.version}, "
        "which stands"
    )
    return Materialized(
        manifest.partition, _metadata(ctx, manifest, reused=True), Counter(manifest.stats)
    )


def _sources_body(
    ctx: StageContext, stage: Stage, partitions: Sequence[str | None]
) -> Iterator[Materialized]:
    """Every source of the run collected by this host's workers (the files are on this host's
    disk, whatever the engine). A directory source: its tree cut into units (folders listed
    by a worker of its own), each walked and cut into chunks by a task, the chunks joined
    into slices here, then a slice to a task, twice (once for its revision, a tree hash that
    every row carries, then for its rows; the shards adopted in slice order, so the version
    is the one a single ordered read gives), unless the version collected from the same
    revision with the same code and config still verifies: that one stands. Any other
    source: whole in one task, beside the walks, unless its commit or archive sha256 names
    the content of a version that stands (nothing fetched or read). Each source's version in
    partition order."""
    sources: dict[str, _Source] = {}
    with ExitStack() as begun:  # a failure drops the directory versions begun here
        plans = begun.enter_context(tempfile.TemporaryDirectory(prefix="megacpp-walks-"))
        done: dict[str, Materialized] = {}
        for partition in partitions:
            assert partition is not None
            source = _resolved(ctx, partition)
            pinned = _pinned_revision(source.spec)
            if pinned is not None:  # a commit or an archive's sha256 names the content
                inputs = _inputs(ctx, stage, partition, pinned)
                source = replace(source, inputs=inputs)
                if (kept := reuse.standing(ctx, stage, partition, inputs)) is not None:
                    done[partition] = _standing(ctx, stage, kept)
                    continue
            sources[partition] = source
        dirs = tuple(s for s in sources if collect.sliced(sources[s].spec))
        job = _Job(replace(ctx, workers=1), stage, sources, plans)
        executor = ctx.host_executor()
        counts = executor.run_apart(_units_task, job, dirs) if dirs else []
        units = dict(zip(dirs, counts, strict=True))
        first: list[_Walk | _Whole] = []
        for s in sources:
            if s not in units:
                first.append(_Whole(s))
            else:
                first += [_Walk(s, n) for n in range(units[s])]
        walked: dict[str, list[list[tuple[int, int]]]] = {s: [] for s in dirs}
        for task, out in zip(first, executor.map(_first_task, job, first), strict=True):
            if isinstance(out, Materialized):
                done[task.source] = out
            else:
                walked[task.source].append(out)  # in unit order: map keeps the items' order
        digests = [d for s, units in walked.items() for d in _slices_of(s, units)]
        trees = {s: hashlib.sha256() for s in dirs}
        shares: list[str] = []  # each slice's lines, by their sha256: the driver keeps no list
        for digest, lines in zip(digests, executor.map(_digest_task, job, digests), strict=True):
            trees[digest.source].update(lines)
            shares.append(hashlib.sha256(lines).hexdigest())
        revisions = {s: tree.hexdigest() for s, tree in trees.items()}
        # a tree whose revision (every path and content hash) was collected before by this
        # code and config: that version stands, and its files are not read again
        trees_inputs = {s: _inputs(ctx, stage, s, revisions[s]) for s in dirs}
        versions: dict[str, VersionWriter] = {}
        for s in dirs:
            if (kept := reuse.standing(ctx, stage, s, trees_inputs[s])) is not None:
                done[s] = _standing(ctx, stage, kept)
                continue
            versions[s] = begun.enter_context(_begin(ctx, stage, sources[s].spec))
            sources[s] = replace(sources[s], version_dir=versions[s].dir)
        slices_todo = [
            replace(d, revision=revisions[d.source], lines_sha=share)
            for d, share in zip(digests, shares, strict=True)
            if d.source in versions
        ]
        stats = {s: _new_stats() for s in versions}
        job = replace(job, sources=dict(sources))
        for task2, out2 in zip(
            slices_todo, executor.map(_collect_task, job, slices_todo), strict=True
        ):
            for name, shard, written in out2.shards:
                versions[task2.source].table(name, _TABLES[name]).adopt(shard, written)
            stats[task2.source].update(out2.stats)
        for s, version in versions.items():
            done[s] = _committed(
                ctx, stage, sources[s], version, stats[s], revisions[s], trees_inputs[s]
            )
    for partition in partitions:
        assert partition is not None
        yield done[partition]


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
    sources_body=_sources_body,
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


def current_revision(
    catalog: Catalog, spec: SourceSpec, cache_dir: Path, registry: Registry | None = None
) -> str:
    """The revision a collection of `spec` would read now (a tracked git branch resolves
    to the commit it points at; other sources to their pin or content hash); CollectError
    when the source cannot be reached. A directory's tree hash covers the metadata files
    `registry`'s stages read (REUSE.toml, LICENSES/) as collection's does, so a change to
    those alone moves it too."""
    files = collect.open_source(
        spec,
        catalog.resolve_uri(spec),
        cache_dir=cache_dir,
        limits=catalog.collect,
        keep_also=partial(registry.is_metadata_file, spec) if registry else None,
        max_file_bytes=catalog.file_limit(spec),
    )
    return files.revision
