"""Scrub: emails, public IPs, keys and tokens, private keys and machine-local paths
replaced by stable placeholders before tokenization; an audit table of salted hashes."""

from collections import Counter

import dagster as dg

from assets.partitions import SOURCES
from assets.shell import (
    CODE_VERSION,
    FileCaching,
    accounting_check,
    file_cache,
    manifest_check,
    partition_of,
    run_file_gate,
    summary_metadata,
    upstream_hashes,
)
from megacpp_pipeline.core.schemas import SCRUBBED_FILES
from megacpp_pipeline.gates import scrub
from resources.pipeline import CatalogResource, ShardStoreResource


@dg.asset(
    partitions_def=SOURCES,
    deps=["licensed_files"],
    group_name="gates",
    kinds={"parquet"},
    owners=["team:data"],
    code_version=CODE_VERSION,
    description="PII and secrets replaced by exact placeholders (<EMAIL>, <IP_ADDRESS>, "
    "<API_KEY>, <PASSWORD>, <PRIVATE_KEY>, <SSH_KEY>, <LOCAL_PATH>); every replacement audited "
    "by a salted hash, never the value.",
)
def scrubbed_files(
    context: dg.AssetExecutionContext, catalog: CatalogResource, store: ShardStoreResource
) -> dg.MaterializeResult:
    cfg = catalog.load().stage_config("scrub", scrub.ScrubConfig)
    st = store.open()
    upstream = st.latest("licensed_files", context.partition_key)
    version = st.begin(
        "scrubbed_files",
        context.partition_key,
        code_version=CODE_VERSION,
        config=cfg,
        run_id=context.run_id,
    )
    samples: list[str] = []

    def gate(table):  # type: ignore[no-untyped-def]
        result = scrub.run(table, cfg)
        if len(samples) < 20:
            samples.append(scrub.markdown_sample(result.kept, cfg))
        return result

    stats = run_file_gate(
        st,
        version,
        st.iter_tables(upstream),
        gate,
        SCRUBBED_FILES,
        side_schemas={"audit": scrub.AUDIT_SCHEMA},
        caching=FileCaching(file_cache(store, "scrub", scrub, cfg), "content_sha256"),
        summarize=lambda r: Counter(f"kind:{k}" for k in r.extra["audit"]["kind"].to_pylist()),
    )
    manifest = version.commit(upstream=upstream_hashes(st, [upstream]), stats=stats)
    return dg.MaterializeResult(
        metadata=summary_metadata(
            st,
            manifest,
            **{k: int(v) for k, v in sorted(stats.items()) if k.startswith("kind:")},
            redacted_sample=dg.MetadataValue.md("\n".join(s for s in samples if s) or "none"),
        )
    )


scrubbed_files_verifies = manifest_check(scrubbed_files, partitioned=True)
scrubbed_files_accounted = accounting_check(scrubbed_files, "licensed_files")


@dg.asset_check(
    asset=scrubbed_files,
    name="no_detector_fires_on_output",
    blocking=True,
    partitions_def=SOURCES,
    description="Re-runs every detector over the scrubbed text: nothing but placeholders.",
)
def no_detector_fires_on_output(
    context: dg.AssetCheckExecutionContext, catalog: CatalogResource, store: ShardStoreResource
) -> dg.AssetCheckResult:
    cfg = catalog.load().stage_config("scrub", scrub.ScrubConfig)
    st = store.open()
    manifest = st.latest("scrubbed_files", partition_of(context))
    residual: list[str] = []
    files = 0
    for t in st.iter_tables(manifest, columns=["source_id", "path", "text"]):
        files += t.num_rows
        hits = scrub.residual_table(t, cfg)
        residual.extend(
            f"{p}: {k} at byte {b}"
            for p, k, b in zip(
                hits["path"].to_pylist(),
                hits["kind"].to_pylist(),
                hits["start_byte"].to_pylist(),
                strict=True,
            )
        )
    return dg.AssetCheckResult(
        passed=not residual,
        metadata={
            "files_rescanned": files,
            "residual_findings": len(residual),
            "first": "; ".join(residual[:5]),
        },
    )
