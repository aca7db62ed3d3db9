"""deduped_files: exact (content hash) then near (MinHash LSH over C++ lexical-token
shingles) duplicates across every source, at file level and before any chunking; one
representative per cluster, the earliest in catalog then path order. Each source's kept
rows go to a table of their own (`data:<source>`), so the next per-source stage reads one."""

from __future__ import annotations

import tempfile
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from megacpp_pipeline.core import ledger
from megacpp_pipeline.core.ledger import LEDGER_SCHEMA, DropReason
from megacpp_pipeline.core.schemas import DEDUPED_FILES
from megacpp_pipeline.corpus import dedup
from megacpp_pipeline.pipeline.context import StageContext
from megacpp_pipeline.pipeline.registry import (
    Check,
    CheckOutcome,
    Grain,
    Markdown,
    Materialized,
    Stage,
)
from megacpp_pipeline.pipeline.runner import (
    SOME_FILE_IS_LEFT,
    drop_reasons_table,
    summary_metadata,
)
from megacpp_pipeline.storage.store import Manifest, VersionWriter


def _body(ctx: StageContext, stage: Stage, partition: str | None) -> Materialized:
    assert stage.input is not None
    config = ctx.config(stage)
    upstream = [ctx.latest(stage.input, s) for s in ctx.sources()]
    ctx.cache_dir.mkdir(parents=True, exist_ok=True)
    version = ctx.store.begin(
        stage.name, None, code_version=ctx.code_version(stage), config=config, run_id=ctx.run_id
    )
    with version:  # aborted if anything below raises
        return _decide_and_write(ctx, stage, config, upstream, version)


def _decide_and_write(
    ctx: StageContext,
    stage: Stage,
    config: dedup.DedupConfig,
    upstream: list[Manifest],
    version: VersionWriter,
) -> Materialized:
    extra: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(dir=ctx.cache_dir, prefix="dedup-") as work:
        if ctx.engine.distributed:
            from megacpp_pipeline.pipeline import ray_engine  # the optional extra

            result, extra = ray_engine.find_duplicates(
                ctx, upstream, config, Path(work), version.dir
            )
        else:
            files = sum(m.tables["data"].rows for m in upstream if "data" in m.tables)
            result = dedup.find_duplicates(
                _stream(ctx, upstream),
                config,
                Path(work),
                partitions=dedup.band_partition_count(files, config),
            )
    decisions = result.decisions
    stats: Counter[str] = Counter(result.stats)
    stats["input_files"] = 0
    for m in upstream:
        out = version.table(f"data:{m.partition}", DEDUPED_FILES)
        for t in ctx.store.iter_tables(m):
            out.write(dedup.kept_rows(t, decisions))
            stats["input_files"] += t.num_rows
    stats["dropped_files"] = stats["dropped_exact_duplicate"] + stats["dropped_near_duplicate"]
    stats["kept_files"] = stats["input_files"] - stats["dropped_files"]
    stats["input_bytes"] = stats["bytes"]
    for reason in (DropReason.EXACT_DUPLICATE, DropReason.NEAR_DUPLICATE):
        stats[f"ledger:{reason}"] = stats[f"dropped_{reason}"]
    version.table("ledger", LEDGER_SCHEMA).write(
        ledger.stamp(dedup.ledger_rows(decisions), stage.name)
    )
    version.table("decisions", decisions.schema).write(decisions)
    version.table("clusters", result.clusters.schema).write(result.clusters)
    manifest = version.commit(upstream=ctx.upstream_hashes(upstream), stats=stats, extra=extra)
    meta = summary_metadata(
        ctx.store,
        manifest,
        input_files=stats["input_files"],
        exact_duplicates=int(stats.get("dropped_exact_duplicate", 0)),
        near_duplicates=int(stats.get("dropped_near_duplicate", 0)),
        clusters=int(stats.get("clusters", 0)),
        drop_reasons=drop_reasons_table(stats),
        top_clusters=Markdown(dedup.markdown_top_clusters(result, 10)),
        **{k: extra[k] for k in ("engine_nodes", "sign_tasks", "band_partitions") if k in extra},
    )
    return Materialized(None, meta, stats)


def _stream(ctx: StageContext, manifests: list[Manifest]) -> Iterator[pa.Table]:
    for m in manifests:
        yield from ctx.store.iter_tables(m)


def _no_shared_hash(ctx: StageContext, stage: Stage, partition: str | None) -> CheckOutcome:
    """Across every source, each content_sha256 is kept at most once, and every input file
    is kept or in the ledger."""
    manifest = ctx.store.latest(stage.name, None)
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
    name="deduped_files",
    grain=Grain.GLOBAL,
    group="gates",
    description="Exact (content hash) then near (MinHash LSH over C++ lexical-token shingles) "
    "duplicates across all sources; one representative per cluster by catalog order then path.",
    input="scrubbed_files",
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
