"""The nightly refresh: a schedule (off by default, switchable in the UI) that re-resolves
each operational source's revision — a tracked git branch becomes the commit it points at
now — and launches the per-source collect-to-scrub job once per new `source:revision`; the
`nightly_cascade` automation sensor then brings every downstream asset up to date."""

import dagster as dg

from assets.collect import REVISION_TAG
from assets.partitions import SOURCES
from megacpp_pipeline import collect
from megacpp_pipeline.core.catalog import load_catalog
from resources.pipeline import cache_dir, config_path

PER_SOURCE_HEAD = ["raw_files", "normalized_files", "licensed_files", "scrubbed_files"]

per_source_refresh = dg.define_asset_job(
    "per_source_refresh",
    selection=dg.AssetSelection.assets(*PER_SOURCE_HEAD),
    partitions_def=SOURCES,
    description="Collect, normalize, license and scrub one source at its current revision.",
)


def current_revisions() -> dict[str, str]:
    """source id -> the revision a refresh would collect now."""
    from pathlib import Path

    catalog = load_catalog(config_path())
    out = {}
    for spec in catalog.operational:
        files = collect.open_source(
            spec,
            catalog.resolve_uri(spec),
            cache_dir=Path(cache_dir()),
            limits=catalog.collect,
        )
        out[spec.id] = files.revision
    return out


def _already_processed(instance: dg.DagsterInstance, run_key: str) -> bool:
    runs = instance.get_runs(
        filters=dg.RunsFilter(
            tags={"dagster/run_key": run_key}, statuses=[dg.DagsterRunStatus.SUCCESS]
        ),
        limit=1,
    )
    return bool(runs)


_REFRESH = load_catalog(config_path()).refresh


@dg.schedule(
    name="nightly_refresh",
    cron_schedule=_REFRESH.cron,
    execution_timezone=_REFRESH.timezone,
    job=per_source_refresh,
    default_status=dg.DefaultScheduleStatus.STOPPED,
    description="Nightly: one run per source whose revision changed (run_key source:revision).",
)
def nightly_refresh(context: dg.ScheduleEvaluationContext):  # type: ignore[no-untyped-def]
    for source, revision in current_revisions().items():
        run_key = f"{source}:{revision}"
        if _already_processed(context.instance, run_key):
            continue
        yield dg.RunRequest(
            run_key=run_key,
            partition_key=source,
            tags={REVISION_TAG: revision, "dagster/run_key": run_key},
        )


nightly_cascade = dg.AutomationConditionSensorDefinition(
    "nightly_cascade",
    target=dg.AssetSelection.all() - dg.AssetSelection.assets("source_catalog", *PER_SOURCE_HEAD),
    default_condition=dg.AutomationCondition.eager(),
    use_user_code_server=True,
    default_status=dg.DefaultSensorStatus.STOPPED,
    description="After a refresh run updates a source, materialize what depends on it.",
)
