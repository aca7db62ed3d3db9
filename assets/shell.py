"""What every gate asset does the same way: read the upstream manifest, stream its shards
through a library gate, write kept rows, ledger rows and side tables as a new version,
report summary metadata, and verify the written manifest from disk in a blocking check."""

import hashlib
import inspect
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import dagster as dg
import pyarrow as pa

from megacpp_pipeline.core import ledger as ledger_mod
from megacpp_pipeline.core.gate import GateResult
from megacpp_pipeline.pipeline.parallel import parallel
from megacpp_pipeline.storage.file_cache import FileResultCache, cached_gate_call, row_keys
from megacpp_pipeline.storage.store import Manifest, ShardStore, VersionWriter, config_hash
from resources.pipeline import ShardStoreResource

CODE_VERSION = "1"


def partition_of(context: dg.AssetExecutionContext | dg.AssetCheckExecutionContext) -> str | None:
    try:
        return context.partition_key if context.has_partition_key else None  # type: ignore[union-attr]
    except (AttributeError, dg.DagsterInvariantViolationError):
        tags = context.run.tags if hasattr(context, "run") else {}
        return tags.get("dagster/partition")


def upstream_hashes(store: ShardStore, manifests: Iterable[Manifest]) -> dict[str, str]:
    return {f"{m.asset}/{m.partition}": store.manifest_sha256(m) for m in manifests}


@dataclass
class FileCaching:
    """Where per-file results of a gate are cached, and what a row's key hashes: the
    column holding the input's content hash, and a salt for inputs outside the row (the
    declared licence and REUSE files, the tokenizer, the compile database)."""

    cache: FileResultCache
    content_column: str
    salt: str = ""


def file_cache(
    store: ShardStoreResource, stage: str, gate_module: ModuleType, config: Any, salt: str = ""
) -> FileResultCache:
    """The stage's cache namespace: its gate module's source hash (the stage code version)
    and its config hash, so changing either invalidates exactly this stage."""
    return FileResultCache(
        store.cache() / "file-results",
        stage,
        gate_code_version(gate_module),
        config_hash(config) + salt,
    )


def gate_code_version(module: ModuleType) -> str:
    return hashlib.sha256(inspect.getsource(module).encode()).hexdigest()[:12]


def run_file_gate(
    store: ShardStore,
    version: VersionWriter,
    shards: Iterable[pa.Table],
    gate: Callable[[pa.Table], GateResult],
    out_schema: pa.Schema,
    side_schemas: Mapping[str, pa.Schema] | None = None,
    caching: FileCaching | None = None,
    summarize: Callable[[GateResult], Counter[str]] | None = None,
    workers: int | None = None,
) -> Counter[str]:
    """Stream shard by shard; memory is bounded by one shard plus the gate's output. With
    `caching`, only files whose key is not cached go through the gate; `summarize` then
    recomputes the gate's UI counters from the whole output (cached rows included), since a
    gate's own stats only cover the files it saw. The gate runs on `workers` forked
    processes (default: MEGACPP_WORKERS, else every CPU) with the serial call's result."""
    gate = parallel(gate, workers)
    data = version.table("data", out_schema)
    drops = version.table("ledger", ledger_mod.LEDGER_SCHEMA)
    stats: Counter[str] = Counter()
    schemas = {"kept": out_schema, "dropped": ledger_mod.LEDGER_SCHEMA, **(side_schemas or {})}
    for table in shards:
        stats["input_files"] += table.num_rows
        if caching is not None:
            keys = row_keys(table, caching.content_column, caching.salt)
            result, hits = cached_gate_call(caching.cache, table, keys, gate, schemas)
            stats["cached_files"] += hits
        else:
            result = gate(table)
        data.write(result.kept)
        drops.write(ledger_mod.stamp(result.dropped, version.manifest.asset))
        shard_stats = result.stats
        if summarize is not None:
            summary = summarize(result)
            families = {k.split(":", 1)[0] for k in summary}
            shard_stats = Counter(
                {k: v for k, v in shard_stats.items() if k.split(":", 1)[0] not in families}
            )
            shard_stats.update(summary)
        stats.update(shard_stats)
        stats["kept_files"] += result.kept.num_rows
        stats["dropped_files"] += result.dropped.num_rows
        for reason in result.dropped["reason"].drop_null().to_pylist():
            stats[f"ledger:{reason}"] += 1
        for name, side in result.extra.items():
            schema = (side_schemas or {}).get(name, side.schema)
            version.table(name, schema).write(side)
    return stats


def summary_metadata(store: ShardStore, manifest: Manifest, **extra: Any) -> dict[str, Any]:
    data = [s for name in manifest.data_tables() for s in manifest.tables[name].shards]
    meta: dict[str, Any] = {
        "dagster/row_count": manifest.rows,
        "shards": len(data),
        "bytes": sum(s.bytes for s in data),
        "dropped_files": int(manifest.stats.get("dropped_files", 0)),
        "manifest": dg.MetadataValue.path(store.manifest_path(manifest)),
        "version": manifest.version,
    }
    meta.update(extra)
    return meta


def manifest_check(
    asset: dg.AssetsDefinition,
    *,
    partitioned: bool,
    description: str | None = None,
) -> dg.AssetChecksDefinition:
    """Blocking: the latest version re-read from disk has every shard, sha256, row count
    and schema its manifest claims."""
    from assets.partitions import SOURCES

    @dg.asset_check(
        asset=asset,
        name="manifest_verifies_from_disk",
        blocking=True,
        description=description
        or "Every shard listed in the manifest exists on disk with "
        "its sha256, row count and schema.",
        partitions_def=SOURCES if partitioned else None,
    )
    def _check(
        context: dg.AssetCheckExecutionContext, store: ShardStoreResource
    ) -> dg.AssetCheckResult:
        st = store.open()
        manifest = st.latest(asset.key.path[-1], partition_of(context))
        problems = st.verify(manifest, check_sha256=True)
        return dg.AssetCheckResult(
            passed=not problems,
            metadata={
                "shards_verified": len(manifest.all_shards()),
                "rows": manifest.rows,
                "problems": dg.MetadataValue.md(
                    "\n".join(f"- {p}" for p in problems[:50]) or "none"
                ),
            },
            description=problems[0] if problems else None,
        )

    return _check


def accounting_check(asset: dg.AssetsDefinition, upstream: str) -> dg.AssetChecksDefinition:
    return accounting_check_from(asset, upstream, table=None)


def accounting_check_from(
    asset: dg.AssetsDefinition, upstream: str, *, table: str | None
) -> dg.AssetChecksDefinition:
    """Blocking: every file the upstream version kept is either kept here or in this
    version's ledger with a reason (nothing disappears silently)."""
    from assets.partitions import SOURCES

    name = asset.key.path[-1]

    @dg.asset_check(
        asset=asset,
        name="every_input_file_kept_or_in_ledger",
        blocking=True,
        partitions_def=SOURCES,
        description=f"{upstream} rows == {name} rows + {name} ledger rows",
    )
    def _check(
        context: dg.AssetCheckExecutionContext, store: ShardStoreResource
    ) -> dg.AssetCheckResult:
        st = store.open()
        partition = partition_of(context)
        manifest = st.latest(name, partition)
        up = st.latest(upstream, None if table else partition)
        consumed = manifest.upstream.get(f"{up.asset}/{up.partition}") == st.manifest_sha256(up)
        up_table = up.tables.get(table.format(p=partition)) if table else None
        up_rows = (up_table.rows if up_table else 0) if table else up.rows
        before = int(manifest.stats.get("input_files", -1))
        dropped = manifest.tables["ledger"].rows if "ledger" in manifest.tables else 0
        passed = before == manifest.rows + dropped and (not consumed or before == up_rows)
        return dg.AssetCheckResult(
            passed=passed,
            metadata={"input_files": before, "kept": manifest.rows, "dropped": dropped},
            description=None
            if passed
            else f"{before} files in, {manifest.rows} kept + {dropped} in the ledger",
        )

    return _check
