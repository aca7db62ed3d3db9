"""The nightly refresh: a schedule (off by default, switchable in the UI) that re-resolves
each operational source's revision (a tracked git branch becomes the commit it points at
now) and launches the registry's refresh head (collect up to the first corpus-wide stage)
once per new `source:revision`; the `nightly_cascade` automation sensor then brings every
downstream asset up to date."""

from pathlib import Path
from typing import Any

import dagster as dg

from assets.factory import REVISION_TAG
from megacpp_pipeline.core.catalog import Catalog
from megacpp_pipeline.pipeline.registry import Registry
from megacpp_pipeline.stages.collect import current_revisions


def _already_processed(instance: dg.DagsterInstance, run_key: str) -> bool:
    runs = instance.get_runs(
        filters=dg.RunsFilter(
            tags={"dagster/run_key": run_key}, statuses=[dg.DagsterRunStatus.SUCCESS]
        ),
        limit=1,
    )
    return bool(runs)


def build_refresh(
    registry: Registry,
    catalog: Catalog,
    sources: dg.PartitionsDefinition,
    cache_dir: Path,
) -> tuple[Any, dg.ScheduleDefinition, dg.SensorDefinition]:
    head = registry.refresh_head()
    job = dg.define_asset_job(
        "per_source_refresh",
        selection=dg.AssetSelection.assets(*head),
        description=f"{', '.join(head)} for one source at its current revision.",
    )

    @dg.schedule(
        name="nightly_refresh",
        cron_schedule=catalog.refresh.cron,
        execution_timezone=catalog.refresh.timezone,
        job=job,
        default_status=dg.DefaultScheduleStatus.STOPPED,
        description="Nightly: one run per source whose revision changed (run_key source:revision).",
    )
    def nightly_refresh(context: dg.ScheduleEvaluationContext):  # type: ignore[no-untyped-def]
        for source, revision in current_revisions(catalog, cache_dir).items():
            run_key = f"{source}:{revision}"
            if _already_processed(context.instance, run_key):
                continue
            yield dg.RunRequest(
                run_key=run_key,
                partition_key=source,
                tags={REVISION_TAG: revision, "dagster/run_key": run_key},
            )

    cascade = dg.AutomationConditionSensorDefinition(
        "nightly_cascade",
        target=dg.AssetSelection.all() - dg.AssetSelection.assets(registry.names()[0], *head),
        default_condition=dg.AutomationCondition.eager(),
        use_user_code_server=True,
        default_status=dg.DefaultSensorStatus.STOPPED,
        description="After a refresh run updates a source, materialize what depends on it.",
    )
    return job, nightly_refresh, cascade
