"""Collect: the validated catalog, then every file of each operational source at its
pinned revision (one partition per source)."""

from collections import Counter
from pathlib import Path

import dagster as dg
import pyarrow as pa

from assets.partitions import SOURCES
from assets.shell import CODE_VERSION, manifest_check, partition_of, summary_metadata
from megacpp_pipeline import collect
from megacpp_pipeline.core.ledger import LEDGER_SCHEMA, stamp
from megacpp_pipeline.core.schemas import RAW_FILES
from megacpp_pipeline.gates import license
from resources.pipeline import CatalogResource, ShardStoreResource

REVISION_TAG = "megacpp/revision"

CATALOG_SCHEMA = pa.schema(
    [
        pa.field("id", pa.string()),
        pa.field("kind", pa.string()),
        pa.field("uri", pa.string()),
        pa.field("pin", pa.string()),
        pa.field("declared_license", pa.string()),
        pa.field("role", pa.string()),
    ]
)


@dg.asset(
    group_name="collect",
    kinds={"yaml"},
    owners=["team:data"],
    code_version=CODE_VERSION,
    description="sources.yaml validated: every source with its kind, uri, pin, declared "
    "license and role (operational sources are materialized, catalog ones are metadata).",
)
def source_catalog(catalog: CatalogResource, store: ShardStoreResource) -> dg.MaterializeResult:
    cat = catalog.load()
    st = store.open()
    version = st.begin("source_catalog", None, code_version=CODE_VERSION, config=cat)
    rows = [
        {
            "id": s.id,
            "kind": s.kind,
            "uri": cat.resolve_uri(s),
            "pin": s.revision or s.sha256 or (f"track:{s.track}" if s.track else "content-hash"),
            "declared_license": s.declared_license,
            "role": s.role,
        }
        for s in cat.sources
    ]
    version.table("data", CATALOG_SCHEMA).write(pa.Table.from_pylist(rows, schema=CATALOG_SCHEMA))
    manifest = version.commit(extra={"snapshot": cat.snapshot, "seq_len": cat.seq_len})
    return dg.MaterializeResult(
        metadata=summary_metadata(
            st,
            manifest,
            operational=len(cat.operational),
            catalog_only=len(cat.sources) - len(cat.operational),
        )
    )


@dg.asset_check(
    asset=source_catalog, blocking=True, name="operational_sources_pinned_and_resolvable"
)
def operational_sources_pinned(catalog: CatalogResource) -> dg.AssetCheckResult:
    cat = catalog.load()
    problems = []
    for s in cat.operational:
        if s.kind == "git" and not (s.revision or s.track):
            problems.append(f"{s.id}: no revision")
        if s.kind == "archive" and not s.sha256:
            problems.append(f"{s.id}: no sha256")
        uri = cat.resolve_uri(s)
        if "://" not in uri and not Path(uri).exists():
            problems.append(f"{s.id}: {uri} does not exist")
        elif (
            s.kind == "git"
            and s.revision
            and "://" not in uri
            and not collect.commit_exists(uri, s.revision)
        ):  # a local repository: a missing pin stops the run before any source is collected
            problems.append(f"{s.id}: revision {s.revision} does not exist in {uri}")
    return dg.AssetCheckResult(
        passed=not problems,
        metadata={"operational_sources": len(cat.operational), "problems": "; ".join(problems)},
    )


@dg.asset(
    partitions_def=SOURCES,
    deps=[source_catalog],
    group_name="collect",
    kinds={"git", "parquet"},
    owners=["team:data"],
    code_version=CODE_VERSION,
    description="Every file of the source at its pinned revision (git commit, verified "
    "archive sha256 or directory tree hash); every file seen is in the ledger.",
)
def raw_files(
    context: dg.AssetExecutionContext, catalog: CatalogResource, store: ShardStoreResource
) -> dg.MaterializeResult:
    cat = catalog.load()
    spec = cat.source(context.partition_key)
    pinned = context.run.tags.get(REVISION_TAG)
    if spec.track and pinned:
        # the refresh resolved the tracked branch when it launched this run: pin exactly that
        spec = spec.model_copy(update={"revision": pinned, "track": None})
    st = store.open()

    def is_metadata(path: str) -> bool:
        return license.is_reuse_metadata_path(path) or path == spec.compile_commands

    files = collect.open_source(
        spec,
        cat.resolve_uri(spec),
        cache_dir=store.cache(),
        limits=cat.collect,
        keep_also=is_metadata,
    )
    version = st.begin(
        "raw_files", spec.id, code_version=CODE_VERSION, config=spec, run_id=context.run_id
    )
    data = version.table("data", RAW_FILES)
    ledger = version.table("ledger", LEDGER_SCHEMA)
    meta = version.table("metadata", collect.METADATA_FILES)
    stats: Counter[str] = Counter()
    for batch in collect.collect_batches(spec, files, is_metadata=is_metadata):
        data.write(batch.kept)
        ledger.write(stamp(batch.ledger, "raw_files"))
        meta.write(batch.metadata)
        stats["files_seen"] += batch.ledger.num_rows
        stats["kept_files"] += batch.kept.num_rows
        stats["dropped_files"] += batch.ledger.num_rows - batch.kept.num_rows
        stats["kept_bytes"] += int(pa.compute.sum(batch.kept["size"]).as_py() or 0)
        for reason in batch.ledger["reason"].drop_null().to_pylist():
            stats[f"dropped:{reason}"] += 1
        context.log.info(f"{spec.id}: {stats['files_seen']} files seen, {stats['kept_files']} kept")
    manifest = version.commit(
        stats=stats,
        extra={"revision": files.revision, "kind": spec.kind, "uri": cat.resolve_uri(spec)},
    )
    return dg.MaterializeResult(
        metadata=summary_metadata(
            st,
            manifest,
            revision=files.revision,
            files_seen=stats["files_seen"],
            kept_bytes=stats["kept_bytes"],
        )
    )


raw_files_verifies = manifest_check(raw_files, partitioned=True)


@dg.asset_check(
    asset=raw_files, blocking=True, partitions_def=SOURCES, name="every_seen_file_in_ledger"
)
def raw_files_ledger_complete(
    context: dg.AssetCheckExecutionContext, store: ShardStoreResource
) -> dg.AssetCheckResult:
    st = store.open()
    manifest = st.latest("raw_files", partition_of(context))
    ledger = st.read_table(manifest, "ledger") if "ledger" in manifest.tables else None
    seen = ledger.num_rows if ledger is not None else 0
    kept = manifest.rows
    kept_in_ledger = (
        int(pa.compute.sum(pa.compute.equal(ledger["status"], "kept")).as_py() or 0)
        if ledger is not None
        else 0
    )
    revision = manifest.extra.get("revision")
    passed = kept == kept_in_ledger and bool(revision) and seen >= kept
    return dg.AssetCheckResult(
        passed=passed,
        metadata={"files_seen": seen, "kept": kept, "revision": str(revision)},
    )
