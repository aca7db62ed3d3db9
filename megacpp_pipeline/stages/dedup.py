"""deduped_files: exact (content hash) then near (MinHash LSH over C++ lexical-token
shingles) duplicates across every source, at file level and before any chunking; one
representative per cluster, the earliest in catalog then path order. Each source's kept
rows go to a table of their own (`data:<source>`), so the next per-source stage reads one."""

from __future__ import annotations

import uuid
from collections import Counter
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from megacpp_pipeline.core.ledger import LEDGER_SCHEMA, DropReason
from megacpp_pipeline.core.schemas import DEDUPED_FILES
from megacpp_pipeline.corpus import dedup
from megacpp_pipeline.pipeline.checks import SOME_FILE_IS_LEFT
from megacpp_pipeline.pipeline.context import StageContext
from megacpp_pipeline.pipeline.executor import Executor
from megacpp_pipeline.pipeline.metadata import drop_reasons_table, summary_metadata
from megacpp_pipeline.pipeline.registry import (
    Check,
    CheckOutcome,
    Grain,
    Markdown,
    Materialized,
    Stage,
)
from megacpp_pipeline.snapshot import layout
from megacpp_pipeline.stages import names
from megacpp_pipeline.storage import slices
from megacpp_pipeline.storage.store import Manifest, ShardStore, VersionWriter


def _body(ctx: StageContext, stage: Stage, partition: str | None) -> Materialized:
    assert stage.input is not None
    config = ctx.config(stage)
    upstream = [ctx.latest(stage.input, s) for s in ctx.sources()]
    executor = ctx.executor()
    code_version = ctx.code_version(stage)
    version = ctx.begin(stage, None, config)
    with version:  # aborted if anything below raises
        plan, n_docs = _plan(ctx, upstream, executor.workers)
        outcome = dedup.deduplicate(
            ctx.store,
            executor.map,
            executor.workers,
            plan,
            n_docs,
            config,
            version.dir,
            shards=sum(
                len(m.tables[layout.DATA].shards) for m in upstream if layout.DATA in m.tables
            ),
            open_cache=partial(_open_cache, replace(ctx, log=_ignore), stage, code_version),
            ledger_stage=stage.name,
            clear=executor.map_light,
        )
        return _write(ctx, stage, upstream, version, outcome, executor, len(plan))


def _plan(
    ctx: StageContext, upstream: list[Manifest], workers: int
) -> tuple[list[dedup.SliceOfSource], int]:
    """Every source's kept files as slices in canonical order (a slice never mixes two
    sources), each with the doc_index of its first file."""
    inputs = [(m, layout.DATA) for m in upstream]
    task_bytes = slices.task_bytes_for(slices.total_bytes(inputs), workers, ctx.engine.task_bytes)
    plan: list[dedup.SliceOfSource] = []
    first = 0
    for m, table in inputs:
        for s in slices.plan(ctx.store, [(m, table)], task_bytes, first_row=first):
            plan.append(dedup.SliceOfSource(len(plan), str(m.partition), s.pieces, s.first_row))
            first += s.rows
    return plan, first


def _open_cache(ctx: StageContext, stage: Stage, code_version: str, source: str) -> Any:
    return ctx.file_cache(stage, code_version, "", source)


def _ignore(message: str) -> None:
    pass


def _write(
    ctx: StageContext,
    stage: Stage,
    upstream: list[Manifest],
    version: VersionWriter,
    outcome: dedup.DedupOutcome,
    executor: Executor,
    tasks: int,
) -> Materialized:
    for m in upstream:  # every source's table exists, even with no file kept
        version.table(layout.data_table(m.partition), DEDUPED_FILES)
    version.table("ledger", LEDGER_SCHEMA)
    version.table("decisions", dedup.DECISIONS_SCHEMA)
    for applied in outcome.applied:  # in input order
        for name, (schema, shard, written) in applied.shards.items():
            version.table(name, schema).adopt(shard, written)
    version.table("clusters", dedup.CLUSTERS_SCHEMA).write(outcome.clusters)
    stats: Counter[str] = Counter(outcome.stats)
    stats["input_files"] = int(stats["files"])
    stats["dropped_files"] = stats["dropped_exact_duplicate"] + stats["dropped_near_duplicate"]
    stats["kept_files"] = stats["input_files"] - stats["dropped_files"]
    stats["input_bytes"] = stats["bytes"]
    for reason in (DropReason.EXACT_DUPLICATE, DropReason.NEAR_DUPLICATE):
        stats[f"ledger:{reason}"] = stats[f"dropped_{reason}"]
    extra: dict[str, Any] = {
        **executor.describe(),
        "engine_nodes": executor.stats.figures(),
        "sign_tasks": tasks,
        "band_partitions": outcome.partitions,
    }
    manifest = version.commit(upstream=ctx.upstream_hashes(upstream), stats=stats, extra=extra)
    meta = summary_metadata(
        ctx.store,
        manifest,
        input_files=stats["input_files"],
        exact_duplicates=int(stats.get("dropped_exact_duplicate", 0)),
        near_duplicates=int(stats.get("dropped_near_duplicate", 0)),
        clusters=int(stats.get("clusters", 0)),
        drop_reasons=drop_reasons_table(stats),
        top_clusters=Markdown(
            dedup.markdown_top_clusters(
                outcome.clusters,
                int(stats["dropped_exact_duplicate"]),
                int(stats["dropped_near_duplicate"]),
                10,
            )
        ),
        engine_nodes=extra["engine_nodes"],
        sign_tasks=tasks,
        band_partitions=outcome.partitions,
    )
    return Materialized(None, meta, stats)


# Kept hashes per shuffle partition of the check: a partition's are counted by one task.
_HASHES_PER_PARTITION = 1_000_000


@dataclass(frozen=True)
class _HashJob:
    store: ShardStore
    area: dedup.WorkArea
    partitions: int


def _bucket_hashes(job: _HashJob, task: tuple[int, tuple[slices.Piece, ...]]) -> int:
    """One slice's kept hashes, written to the shuffle partition each one's leading hex
    digits choose; how many there were."""
    index, pieces = task
    hashes = slices.read(job.store, pieces, ["content_sha256"])["content_sha256"]
    bucket = np.fromiter(
        (int(h[:8], 16) % job.partitions for h in hashes.to_pylist()), np.int64, len(hashes)
    )
    for b in np.unique(bucket).tolist():
        rows = pa.table({"h": hashes.filter(pa.array(bucket == b))})
        job.area.write_table(f"p={b:04d}/part-{index:06d}.parquet", rows)
    return len(hashes)


def _count_distinct(job: _HashJob, b: int) -> tuple[int, int, str | None]:
    """(hashes, distinct hashes, one that is kept twice) of one shuffle partition."""
    table = job.area.tables_under(f"p={b:04d}")
    if table is None:
        return 0, 0, None
    counts = pc.value_counts(table["h"])
    twice = pc.filter(counts, pc.greater(counts.field("counts"), 1))
    return table.num_rows, len(counts), twice[0]["values"].as_py() if len(twice) else None


def _no_shared_hash(ctx: StageContext, stage: Stage, partition: str | None) -> CheckOutcome:
    """Across every source, each content_sha256 is kept at most once, and every input file
    is kept or in the ledger. The kept hashes are shuffled by their leading digits into
    partitions of at most about a million, each counted by one task: the driver holds three
    numbers per partition."""
    manifest = ctx.latest(stage.name, None)
    executor = ctx.executor()
    inputs = [(manifest, name) for name in manifest.data_tables()]
    task_bytes = slices.few_column_task_bytes(
        slices.total_bytes(inputs), executor.workers, ctx.engine.task_bytes
    )
    plan = list(enumerate(s.pieces for s in slices.plan(ctx.store, inputs, task_bytes, cut=False)))
    # at most about a million hashes a partition, and two at least where two workers run, so
    # no count runs in this process (a local map of one item runs inline); the shuffle writes
    # at most tasks x partitions objects, the tasks a few per worker
    parts = max(min(2, executor.workers), -(-manifest.rows // _HASHES_PER_PARTITION))
    # the store's scratch folder: removed when the check ends, whatever its outcome
    area = dedup.WorkArea(
        ctx.store.fs, ctx.store.join("scratch", f"{stage.name}-{uuid.uuid4().hex}")
    )
    job = _HashJob(ctx.store, area, parts)
    try:
        kept = sum(executor.map_light(_bucket_hashes, job, plan))
        counted = list(executor.map_light(_count_distinct, job, list(range(parts))))
    finally:
        area.remove()
    distinct = sum(d for _, d, _ in counted)
    twice = next((h for _, _, h in counted if h is not None), None)
    dropped = manifest.tables["ledger"].rows if "ledger" in manifest.tables else 0
    files_in = int(manifest.stats["input_files"])
    accounted = files_in == manifest.rows + dropped
    passed = distinct == kept == sum(n for n, _, _ in counted) and accounted
    return CheckOutcome(
        passed=passed,
        metadata={
            "kept_files": kept,
            "distinct_hashes": distinct,
            "dropped": dropped,
            "accounted": accounted,
            "partitions": parts,
        },
        description=None
        if passed
        else f"{kept - distinct} kept files share a hash (one is {twice})"
        if accounted
        else f"{files_in} files in, {manifest.rows} kept + {dropped} in the ledger",
    )


STAGE = Stage(
    name=names.DEDUPED_FILES,
    grain=Grain.GLOBAL,
    group="gates",
    description="Exact (content hash) then near (MinHash LSH over C++ lexical-token shingles) "
    "duplicates across all sources; one representative per cluster by catalog order then path.",
    input=names.SCRUBBED_FILES,
    config_key="dedup",
    config=dedup.DedupConfig,
    code=(dedup.__name__, __name__),
    schema=DEDUPED_FILES,
    drop_reasons=(DropReason.EXACT_DUPLICATE, DropReason.NEAR_DUPLICATE),
    writes_ledger=True,
    body=_body,
    reusable=True,
    checks=(
        SOME_FILE_IS_LEFT,
        Check(
            "no_two_kept_files_share_a_hash",
            "Across every source, each content_sha256 is kept at most once, and every input "
            "file is kept or in the ledger.",
            _no_shared_hash,
        ),
    ),
    kinds=("parquet", "polars"),
)
