"""Quality report: one page after promotion — a funnel from collected to kept, licence
decisions, scrub counts, duplicate clusters, chunk-kind coverage, tokens per source and row
utilization — written into the snapshot's report/ folder and shown in the UI."""

from collections import Counter

import dagster as dg

from assets.shell import CODE_VERSION
from assets.snapshot import snapshot, snapshot_dir_of
from megacpp_pipeline.snapshot import report
from megacpp_pipeline.snapshot.promote import REPORT_DIR, read_manifest
from resources.pipeline import CatalogResource, ShardStoreResource


def _summed(st, asset: str, sources: list[str], prefix: str) -> dict[str, float]:  # type: ignore[no-untyped-def]
    total: Counter[str] = Counter()
    for source in sources:
        stats = st.latest(asset, source).stats
        total.update({k: v for k, v in stats.items() if k.startswith(prefix)})
    return dict(total)


@dg.asset(
    deps=[snapshot],
    group_name="snapshot",
    kinds={"html", "matplotlib"},
    owners=["team:data"],
    code_version=CODE_VERSION,
    description="The quality dashboard of the promoted snapshot: an HTML page with PNG plots "
    "in <snapshot>/report/, and its key numbers as metadata (a time series across runs).",
)
def quality_report(catalog: CatalogResource, store: ShardStoreResource) -> dg.MaterializeResult:
    st = store.open()
    sources = [s.id for s in catalog.load().operational]
    snap = snapshot_dir_of(st)
    packed = st.latest("packed_rows", None)
    dedup_manifest = st.latest("deduped_files", None)
    inputs = report.ReportInputs(
        snapshot_dir=snap,
        license_stats=_summed(st, "licensed_files", sources, ""),
        scrub_stats=_summed(st, "scrubbed_files", sources, "kind:"),
        dedup_clusters=st.read_table(dedup_manifest, "clusters")
        if dedup_manifest.tables.get("clusters", None) and dedup_manifest.tables["clusters"].rows
        else None,
        chunk_kind_bytes={
            k.removeprefix("kind_bytes:"): v
            for k, v in _summed(st, "enriched_files", sources, "kind_bytes:").items()
        },
        packing_telemetry=(packed.extra.get("telemetry") or {}).get("train"),
    )
    result = report.render_report(inputs, snap / REPORT_DIR)
    manifest = read_manifest(snap)
    return dg.MaterializeResult(
        metadata={
            "report": dg.MetadataValue.path(str(result.html)),
            "snapshot_id": manifest.snapshot_id,
            "summary": dg.MetadataValue.md(result.markdown),
            **{k: float(v) for k, v in result.metrics.items()},
        }
    )


@dg.asset_check(
    asset=quality_report,
    name="report_page_and_plots_exist",
    blocking=True,
    description="The HTML page and every plot it links to exist and are non-empty.",
)
def report_page_and_plots_exist(store: ShardStoreResource) -> dg.AssetCheckResult:
    folder = snapshot_dir_of(store.open()) / REPORT_DIR
    missing = [
        name
        for name in [report.REPORT_HTML, *report.PLOT_FILES.values()]
        if not (folder / name).is_file() or (folder / name).stat().st_size == 0
    ]
    return dg.AssetCheckResult(
        passed=not missing,
        metadata={"folder": str(folder), "missing": ", ".join(missing) or "none"},
    )
