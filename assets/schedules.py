"""The nightly refresh: a schedule (off by default, switchable in the UI) that re-resolves
each operational source's revision (a tracked git branch becomes the commit it points at
now) and launches the registry's refresh head (collect up to the first corpus-wide stage)
once per new `source:revision`; the `nightly_cascade` sensor then brings everything
downstream up to date, a run group at a time, the way `megacpp run` does.

The cascade waits while any run of the instance is queued or in progress (a refresh, a
cascade step, a `megacpp run`), then launches the first run group after the refresh head
that is older than an upstream stage, every source of a per-source group in one run: so no
corpus-wide stage ever reads a refresh half done, and the snapshot is promoted from one
consistent state. An automation condition per asset (`eager`) cannot promise that: it
launches assets of different partitionings as separate runs that race each other. Each
launch's run key names the group and the upstream materializations it answers, so a failed
step is not relaunched until something upstream changes."""

from pathlib import Path
from typing import Any

import dagster as dg

from assets.factory import PARTITION_RANGE_END, PARTITION_RANGE_START, REVISION_TAG
from megacpp_pipeline.core.catalog import Catalog
from megacpp_pipeline.pipeline.registry import Registry
from megacpp_pipeline.pipeline.runner import checks_of
from megacpp_pipeline.stages.collect import current_revisions

# a run of the instance that is not finished yet: the cascade launches nothing meanwhile
_UNFINISHED = [
    dg.DagsterRunStatus.QUEUED,
    dg.DagsterRunStatus.NOT_STARTED,
    dg.DagsterRunStatus.STARTING,
    dg.DagsterRunStatus.STARTED,
    dg.DagsterRunStatus.CANCELING,
]


def _already_requested(instance: dg.DagsterInstance, run_key: str) -> bool:
    """A run for this source:revision succeeded, or is queued or running: requesting it
    again would collect the same commit twice (a one-minute cron ticks faster than a run)."""
    runs = instance.get_runs(
        filters=dg.RunsFilter(
            tags={"dagster/run_key": run_key},
            statuses=[dg.DagsterRunStatus.SUCCESS, *_UNFINISHED],
        ),
        limit=1,
    )
    return bool(runs)


def _latest(instance: dg.DagsterInstance, name: str) -> float | None:
    """When the asset (any partition) was last materialized."""
    event = instance.get_latest_materialization_event(dg.AssetKey(name))
    return event.timestamp if event is not None else None


def _stale_group(
    instance: dg.DagsterInstance, registry: Registry, groups: list[tuple[str, ...]]
) -> tuple[tuple[str, ...], float] | None:
    """The first group with a stage older than one of its upstream stages (or never
    materialized), and the newest upstream materialization it is behind; None when every
    group is up to date, or when a group's inputs from before it were never materialized
    (nothing to cascade from yet)."""
    when: dict[str, float | None] = {}

    def latest(name: str) -> float | None:
        if name not in when:
            when[name] = _latest(instance, name)
        return when[name]

    for group in groups:
        behind: list[float] = []
        for name in group:
            upstream = registry.get(name).upstream
            if any(latest(up) is None for up in upstream if up not in group):
                return None
            mine = latest(name)
            ups = [t for up in upstream if (t := latest(up)) is not None]
            if mine is None or any(t > mine for t in ups):
                behind.append(max(ups, default=0.0))
        if behind:
            return group, max(behind)
    return None


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
        for source, revision in current_revisions(catalog, cache_dir, registry).items():
            run_key = f"{source}:{revision}"
            if _already_requested(context.instance, run_key):
                continue
            yield dg.RunRequest(
                run_key=run_key,
                partition_key=source,
                tags={REVISION_TAG: revision, "dagster/run_key": run_key},
            )

    # the run groups after the refresh head, in order (the catalog's group is not refreshed)
    groups = [g for g in registry.run_groups() if not set(g) & {registry.names()[0], *head}]
    keys = [s.id for s in catalog.operational]

    @dg.sensor(
        name="nightly_cascade",
        target=dg.AssetSelection.assets(*(name for g in groups for name in g)),
        minimum_interval_seconds=30,
        default_status=dg.DefaultSensorStatus.STOPPED,
        description="After a refresh run updates a source, materialize what depends on it: "
        "one run group at a time, once no run is in progress.",
    )
    def nightly_cascade(context: dg.SensorEvaluationContext):  # type: ignore[no-untyped-def]
        instance = context.instance
        if instance.get_runs(filters=dg.RunsFilter(statuses=_UNFINISHED), limit=1):
            return dg.SkipReason("a run is queued or in progress: waiting for it")
        stale = _stale_group(instance, registry, groups)
        if stale is None:
            return dg.SkipReason(
                "every stage after the refresh head is up to date (or has no input yet)"
            )
        group, behind = stale
        stages = [registry.get(name) for name in group]
        tags = {"megacpp/cascade": ", ".join(group)}
        if stages[0].per_source:  # every source in one run, as `megacpp run` does
            tags |= {PARTITION_RANGE_START: keys[0], PARTITION_RANGE_END: keys[-1]}
        return dg.RunRequest(
            run_key=f"cascade:{group[0]}:{behind:.6f}",
            asset_selection=[dg.AssetKey(name) for name in group],
            asset_check_keys=[
                dg.AssetCheckKey(dg.AssetKey(s.name), check.name)
                for s in stages
                for check in checks_of(s)
            ],
            tags=tags,
        )

    return job, nightly_refresh, nightly_cascade
