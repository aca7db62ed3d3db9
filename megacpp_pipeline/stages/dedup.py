"""deduped_files: exact (content hash) then near (MinHash LSH over C++ lexical-token
shingles) duplicates across every source, at file level and before any chunking; one
representative per cluster, the earliest in catalog then path order. Each source's kept
rows go to a table of their own (`data:<source>`), so the next per-source stage reads one."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from functools import partial
from typing import Any

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
from megacpp_pipeline.storage.store import Manifest, VersionWriter


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


def _no_shared_hash(ctx: StageContext, stage: Stage, partition: str | None) -> CheckOutcome:
    """Across every source, each content_sha256 is kept at most once, and every input file
    is kept or in the ledger."""
    manifest = ctx.latest(stage.name, None)
    hashes: list[pa.Array] = []
    for name in manifest.data_tables():
        for t in ctx.store.iter_tables(manifest, name, columns=["content_sha256"]):
            hashes.append(t["content_sha256"].combine_chunks())
    all_hashes = pa.chunked_array(hashes, pa.string())
    distinct = len(pc.unique(all_hashes)) if len(all_hashes) else 0
    dropped = manifest.tables["ledger"].rows if "ledger" in manifest.tables else 0
    files_in = int(manifest.stats["input_files"])
    accounted = files_in == manifest.rows + dropped
    passed = distinct == len(all_hashes) and accounted
    return CheckOutcome(
        passed=passed,
        metadata={
            "kept_files": len(all_hashes),
            "distinct_hashes": distinct,
            "dropped": dropped,
            "accounted": accounted,
        },
        description=None
        if passed
        else f"{len(all_hashes) - distinct} kept files share a hash"
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
