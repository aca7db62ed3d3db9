"""Dedup: exact then MinHash-LSH near duplicates across every source, at file level and
before any chunking, so a repeated file is judged as a file with its provenance."""

import tempfile
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import dagster as dg
import pyarrow as pa
import pyarrow.compute as pc

from assets.shell import CODE_VERSION, manifest_check, summary_metadata, upstream_hashes
from megacpp_pipeline.core.ledger import LEDGER_SCHEMA, stamp
from megacpp_pipeline.core.schemas import DEDUPED_FILES
from megacpp_pipeline.corpus import dedup
from megacpp_pipeline.storage.store import Manifest, ShardStore
from resources.pipeline import CatalogResource, ShardStoreResource


def _sources_in_order(catalog: CatalogResource, st: ShardStore) -> list[Manifest]:
    """Every operational source's scrubbed_files, read from disk (never all in memory)."""
    return [st.latest("scrubbed_files", s.id) for s in catalog.load().operational]


def _stream(st: ShardStore, manifests: list[Manifest]) -> Iterator[pa.Table]:
    for m in manifests:
        yield from st.iter_tables(m)


@dg.asset(
    deps=["scrubbed_files"],
    group_name="gates",
    kinds={"parquet", "polars"},
    owners=["team:data"],
    code_version=CODE_VERSION,
    description="Exact (content hash) then near (MinHash LSH over C++ lexical-token shingles) "
    "duplicates across all sources; one representative per cluster by catalog order then path.",
)
def deduped_files(
    context: dg.AssetExecutionContext, catalog: CatalogResource, store: ShardStoreResource
) -> dg.MaterializeResult:
    cfg = catalog.load().stage_config("dedup", dedup.DedupConfig)
    st = store.open()
    upstream = _sources_in_order(catalog, st)
    with tempfile.TemporaryDirectory(dir=store.cache(), prefix="dedup-") as work:
        result = dedup.find_duplicates(_stream(st, upstream), cfg, Path(work))
    decisions = result.decisions
    version = st.begin(
        "deduped_files", None, code_version=CODE_VERSION, config=cfg, run_id=context.run_id
    )
    stats: Counter[str] = Counter(result.stats)
    for m in upstream:
        out = version.table(f"data:{m.partition}", DEDUPED_FILES)
        for t in st.iter_tables(m):
            out.write(dedup.kept_rows(t, decisions))
            stats["input_files"] += t.num_rows
    stats["dropped_files"] = stats["dropped_exact_duplicate"] + stats["dropped_near_duplicate"]
    version.table("ledger", LEDGER_SCHEMA).write(
        stamp(dedup.ledger_rows(decisions), "deduped_files")
    )
    version.table("decisions", decisions.schema).write(decisions)
    version.table("clusters", result.clusters.schema).write(result.clusters)
    manifest = version.commit(upstream=upstream_hashes(st, upstream), stats=stats)
    return dg.MaterializeResult(
        metadata=summary_metadata(
            st,
            manifest,
            exact_duplicates=int(stats.get("dropped_exact_duplicate", 0)),
            near_duplicates=int(stats.get("dropped_near_duplicate", 0)),
            clusters=int(stats.get("clusters", 0)),
            top_clusters=dg.MetadataValue.md(dedup.markdown_top_clusters(result, 10)),
        )
    )


deduped_files_verifies = manifest_check(deduped_files, partitioned=False)


@dg.asset_check(
    asset=deduped_files,
    name="no_two_kept_files_share_a_hash",
    blocking=True,
    description="Across every source, each content_sha256 is kept at most once, and every "
    "input file is kept or in the ledger.",
)
def no_two_kept_files_share_a_hash(store: ShardStoreResource) -> dg.AssetCheckResult:
    st = store.open()
    manifest = st.latest("deduped_files", None)
    hashes: list[pa.Array] = []
    for name in manifest.data_tables():
        for t in st.iter_tables(manifest, name, columns=["content_sha256"]):
            hashes.append(t["content_sha256"].combine_chunks())
    all_hashes = (
        pa.chunked_array(hashes, pa.string()) if hashes else pa.chunked_array([], pa.string())
    )
    distinct = len(pc.unique(all_hashes)) if len(all_hashes) else 0
    dropped = manifest.tables["ledger"].rows if "ledger" in manifest.tables else 0
    accounted = int(manifest.stats.get("input_files", -1)) == manifest.rows + dropped
    return dg.AssetCheckResult(
        passed=distinct == len(all_hashes) and accounted,
        metadata={
            "kept_files": len(all_hashes),
            "distinct_hashes": distinct,
            "dropped": dropped,
            "accounted": accounted,
        },
    )
