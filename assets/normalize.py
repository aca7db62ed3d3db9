"""Normalize: decode to UTF-8 with newlines normalized, and drop binaries, oversized,
minified, generated and non-C++ files (cheap filters before anything expensive)."""

import dagster as dg

from assets.partitions import SOURCES
from assets.shell import (
    CODE_VERSION,
    FileCaching,
    accounting_check,
    file_cache,
    manifest_check,
    run_file_gate,
    summary_metadata,
    upstream_hashes,
)
from megacpp_pipeline.core.schemas import NORMALIZED_FILES
from megacpp_pipeline.gates import normalize
from resources.pipeline import CatalogResource, ShardStoreResource


@dg.asset(
    partitions_def=SOURCES,
    deps=["raw_files"],
    group_name="gates",
    kinds={"parquet"},
    owners=["team:data"],
    code_version=CODE_VERSION,
    description="UTF-8, LF-normalized C/C++ text with its original encoding recorded; binaries,"
    " oversized, minified/data-like, generated and non-C++ files dropped with a reason.",
)
def normalized_files(
    context: dg.AssetExecutionContext, catalog: CatalogResource, store: ShardStoreResource
) -> dg.MaterializeResult:
    cfg = catalog.load().stage_config("normalize", normalize.NormalizeConfig)
    st = store.open()
    upstream = st.latest("raw_files", context.partition_key)
    version = st.begin(
        "normalized_files",
        context.partition_key,
        code_version=CODE_VERSION,
        config=cfg,
        run_id=context.run_id,
    )
    stats = run_file_gate(
        st,
        version,
        st.iter_tables(upstream),
        lambda t: normalize.run(t, cfg),
        NORMALIZED_FILES,
        caching=FileCaching(file_cache(store, "normalize", normalize, cfg), "blob_sha"),
    )
    manifest = version.commit(upstream=upstream_hashes(st, [upstream]), stats=stats)
    return dg.MaterializeResult(
        metadata=summary_metadata(
            st,
            manifest,
            **{k: int(v) for k, v in sorted(stats.items()) if k.startswith("ledger:")},
        )
    )


normalized_files_verifies = manifest_check(normalized_files, partitioned=True)
normalized_files_accounted = accounting_check(normalized_files, "raw_files")
