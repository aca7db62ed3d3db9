"""quality_report: one page after promotion — a funnel from collected to kept, licence
decisions, scrub counts, duplicate clusters, chunk-kind coverage, tokens per source and row
utilization — written into the snapshot's report/ folder and shown in the UI."""

from __future__ import annotations

from pathlib import Path

from megacpp_pipeline.pipeline.context import StageContext
from megacpp_pipeline.pipeline.registry import (
    Check,
    CheckOutcome,
    Grain,
    Markdown,
    Materialized,
    PathValue,
    Stage,
)
from megacpp_pipeline.snapshot import report
from megacpp_pipeline.snapshot.layout import REPORT_DIR
from megacpp_pipeline.snapshot.promote import read_manifest
from megacpp_pipeline.stages import names
from megacpp_pipeline.stages.snapshot import (
    snapshot_dir_of,
    summed_stats,
    upload_beside_snapshot,
)


def _render(ctx: StageContext, snap: Path) -> report.ReportResult:
    """The report of the snapshot at `snap` from it and the stages' versions."""
    promoted = ctx.latest(names.SNAPSHOT)
    packed = ctx.latest(names.PACKED_ROWS)
    dedup_manifest = ctx.latest(names.DEDUPED_FILES)
    clusters = dedup_manifest.tables.get("clusters")
    inputs = report.ReportInputs(
        snapshot_dir=snap,
        license_stats=summed_stats(ctx, names.LICENSED_FILES, ""),
        scrub_stats=summed_stats(ctx, names.SCRUBBED_FILES, "kind:"),
        dedup_clusters=ctx.store.read_table(dedup_manifest, "clusters")
        if clusters is not None and clusters.rows
        else None,
        chunk_kind_bytes={
            k.removeprefix("kind_bytes:"): v
            for k, v in summed_stats(ctx, names.ENRICHED_FILES, "kind_bytes:").items()
        },
        packing_telemetry=(packed.extra.get("telemetry") or {}).get("train"),
        stages=ctx.registry.ledger_stages(),
        sources=ctx.sources(),
        benchmarks=promoted.extra.get("benchmarks") or [],
        removals=promoted.extra.get("removals") or {},
        removal_notes=str(promoted.extra.get("removal_notes") or ""),
    )
    return report.render_report(inputs, snap / REPORT_DIR, mapper=ctx.host_executor().map)


def _body(ctx: StageContext, stage: Stage, partition: str | None) -> Materialized:
    snap = snapshot_dir_of(ctx)
    # the page reads the ledger and documents whole (O(files)): in a worker of its own, so
    # the run's process never holds them; its plots are that worker's tasks
    result = ctx.host_executor().run_apart(_render, ctx, snap)
    manifest = read_manifest(snap)
    uri = upload_beside_snapshot(
        ctx, snap / REPORT_DIR, "snapshots", manifest.snapshot_id, REPORT_DIR
    )
    return Materialized(
        None,
        {
            "report": PathValue(str(result.html)),
            **({"report_uri": uri} if uri else {}),
            "snapshot_id": manifest.snapshot_id,
            "summary": Markdown(result.markdown),
            **{k: float(v) for k, v in result.metrics.items()},
        },
    )


def _page_and_plots_exist(ctx: StageContext, stage: Stage, partition: str | None) -> CheckOutcome:
    folder = snapshot_dir_of(ctx) / REPORT_DIR
    missing = [
        name
        for name in [report.REPORT_HTML, *report.PLOT_FILES.values()]
        if not (folder / name).is_file() or (folder / name).stat().st_size == 0
    ]
    return CheckOutcome(
        passed=not missing,
        metadata={"folder": str(folder), "missing": ", ".join(missing) or "none"},
        description=f"{folder}: missing {', '.join(missing)}" if missing else None,
    )


STAGE = Stage(
    name=names.QUALITY_REPORT,
    grain=Grain.GLOBAL,
    group="snapshot",
    description="The quality dashboard of the promoted snapshot: an HTML page with PNG plots "
    "in <snapshot>/report/, and its key numbers as metadata (a time series across runs).",
    input=names.SNAPSHOT,
    reads=(
        names.LICENSED_FILES,
        names.SCRUBBED_FILES,
        names.DEDUPED_FILES,
        names.ENRICHED_FILES,
        names.PACKED_ROWS,
    ),
    code=(report.__name__, __name__),
    body=_body,
    checks=(
        Check(
            "report_page_and_plots_exist",
            "The HTML page and every plot it links to exist and are non-empty.",
            _page_and_plots_exist,
        ),
    ),
    manifest_check=False,
    kinds=("html", "matplotlib"),
)
