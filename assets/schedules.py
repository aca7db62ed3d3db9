"""The nightly refresh: a schedule (off by default, switchable in the UI) that re-resolves
each operational source's revision (a tracked git branch becomes the commit it points at
now) and launches the registry's refresh head (collect up to the first corpus-wide stage)
once per new `source:revision:code` (the head's code versions: an edit of sources.yaml such
as a new `removals:` entry, or of a gate's config, is a new run too); the
`nightly_cascade` sensor then brings everything downstream up to date, a run group at a
time, the way `megacpp run` does.

The cascade waits while any run of the instance is queued or in progress (a refresh, a
cascade step, a `megacpp run`), then launches the first run group after the refresh head
that is older than an upstream stage or was last materialized at another code version,
every source of a per-source group in one run: so no corpus-wide stage ever reads a
refresh half done, and the snapshot is promoted from one consistent state. An automation
condition per asset (`eager`) cannot promise that: it launches assets of different
partitionings as separate runs that race each other. A group is not launched on a version
whose blocking check did not pass (the skip message names the check), as a run stops at
such a check. Each launch's run key names the group, the materializations of the stages
outside it that it reads and its own code versions, so a run of it that failed (a step or
a blocking check) is not launched again until one of those changes."""

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import dagster as dg
from dagster._utils.schedules import is_valid_cron_string  # what the schedule itself checks

from assets.factory import PARTITION_RANGE_END, PARTITION_RANGE_START, REVISION_TAG
from megacpp_pipeline.collect.source import CollectError
from megacpp_pipeline.core.catalog import Catalog, CatalogError
from megacpp_pipeline.pipeline.registry import Registry
from megacpp_pipeline.pipeline.runner import checks_of
from megacpp_pipeline.stages.collect import current_revision

# a run of the instance that is not finished yet: the cascade launches nothing meanwhile
_UNFINISHED = [
    dg.DagsterRunStatus.QUEUED,
    dg.DagsterRunStatus.NOT_STARTED,
    dg.DagsterRunStatus.STARTING,
    dg.DagsterRunStatus.STARTED,
    dg.DagsterRunStatus.CANCELING,
]
# the tag the daemon gives a run it launched for a request's run key
RUN_KEY_TAG = "dagster/run_key"
# the tag Dagster gives a materialization: the code version of the asset that wrote it
CODE_VERSION_TAG = "dagster/code_version"
# on the refresh's runs: the sources its tick could not resolve, each with the cause
UNREACHABLE_TAG = "megacpp/unreachable_sources"
_TAG_CHARS = 1000  # of the causes: a tag to read on the run's page, not a log


def _already_requested(instance: dg.DagsterInstance, run_key: str) -> bool:
    """A run for this source:revision:code succeeded, or is queued or running: requesting
    it again would collect the same commit twice (a one-minute cron ticks faster than a
    run)."""
    runs = instance.get_runs(
        filters=dg.RunsFilter(
            tags={RUN_KEY_TAG: run_key},
            statuses=[dg.DagsterRunStatus.SUCCESS, *_UNFINISHED],
        ),
        limit=1,
    )
    return bool(runs)


@dataclass(frozen=True)
class _Latest:
    """An asset's latest materialization (any partition): its place in the event log, which
    orders events as they were written, the run that wrote it and the code version it was
    written at."""

    storage_id: int
    run_id: str
    code_version: str | None


def _latest(instance: dg.DagsterInstance, names: list[str]) -> dict[str, _Latest | None]:
    """Each asset's latest materialization, None for one never materialized."""
    out: dict[str, _Latest | None] = dict.fromkeys(names)
    for record in instance.get_asset_records([dg.AssetKey(n) for n in names]):
        event = record.asset_entry.last_materialization_record
        if event is not None:
            name = record.asset_entry.asset_key.to_user_string()
            written = event.event_log_entry.asset_materialization
            code = written.tags.get(CODE_VERSION_TAG) if written and written.tags else None
            out[name] = _Latest(event.storage_id, event.run_id, code)
    return out


def _outside_inputs(registry: Registry, group: tuple[str, ...]) -> tuple[str, ...]:
    """The stages a group reads that it does not materialize itself: what a run of it
    answers (its run key), whatever it wrote of its own before failing."""
    return tuple(
        dict.fromkeys(
            up for name in group for up in registry.reads_of(registry.get(name)) if up not in group
        )
    )


@dataclass(frozen=True)
class _Stale:
    """A group to launch, the latest materializations of the stages outside it that it
    reads, and the code versions its stages run at now."""

    group: tuple[str, ...]
    inputs: dict[str, _Latest]
    code_versions: dict[str, str]


def _stale_group(
    latest: dict[str, _Latest | None],
    registry: Registry,
    groups: list[tuple[str, ...]],
    code_versions: dict[str, str],
) -> _Stale | None:
    """The first group with a stage older than one of the stages it reads, never
    materialized, or last materialized at another code version (its code, its config or
    the part of sources.yaml it reads changed); None when every group is up to date, or
    when a group's inputs from before it were never materialized (nothing to cascade from
    yet). A group that reads nothing (the catalog's) is stale only once it was
    materialized: the first run makes it, a later edit of sources.yaml refreshes it."""
    for group in groups:
        outside = _outside_inputs(registry, group)
        inputs = {up: u for up in outside if (u := latest[up]) is not None}
        if len(inputs) < len(outside):
            return None
        reads = any(registry.reads_of(registry.get(name)) for name in group)
        if not reads and any(latest[name] is None for name in group):
            continue
        for name in group:
            mine = latest[name]
            ups = [u for up in registry.reads_of(registry.get(name)) if (u := latest[up])]
            if (
                mine is None
                or mine.code_version != code_versions[name]
                or any(u.storage_id > mine.storage_id for u in ups)
            ):
                return _Stale(group, inputs, {n: code_versions[n] for n in group})
    return None


def _cascade_key(stale: _Stale) -> str:
    """The group, the materializations of the stages outside it that it reads and its code
    versions: the same for every tick until one of those moves, so a run of it that failed
    halfway (its first stage written, a later one or a check failed) is not taken for new
    work."""
    parts = [f"{name}={u.storage_id}" for name, u in stale.inputs.items()]
    parts += [f"{name}@{code}" for name, code in stale.code_versions.items()]
    return f"cascade:{stale.group[0]}:{_digest(parts)}"


def _digest(parts: Iterable[str]) -> str:
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]


def _last_run(instance: dg.DagsterInstance, run_key: str) -> dg.DagsterRun | None:
    """The last run with this key (ended: the cascade launches nothing while one runs).
    One that failed is not launched again on the same inputs; nor is one that succeeded
    and left its group behind (written at a code version other than the definitions the
    sensor was loaded with: sources.yaml edited and the code location not reloaded), which
    the daemon would not launch again under the same key anyway."""
    runs = instance.get_runs(filters=dg.RunsFilter(tags={RUN_KEY_TAG: run_key}), limit=1)
    return runs[0] if runs else None


def _checks_not_passed(
    instance: dg.DagsterInstance, registry: Registry, inputs: dict[str, _Latest]
) -> list[str]:
    """The blocking checks of the stages outside a group that did not pass on the versions
    it would read: the latest evaluation failed, or the run that wrote the version ended
    before evaluating it. One line each, naming the stage, the check and the run."""
    keys = [
        dg.AssetCheckKey(dg.AssetKey(name), check.name)
        for name in inputs
        for check in checks_of(registry.get(name))
    ]
    records = instance.event_log_storage.get_latest_asset_check_execution_by_key(keys)
    out = []
    for key in keys:
        record = records.get(key)
        if record is None:  # never run (a version reported from outside Dagster's runs)
            continue
        name = key.asset_key.to_user_string()
        evaluation = record.event.asset_check_evaluation if record.event else None
        if evaluation is not None and not evaluation.passed:
            why = f": {evaluation.description}" if evaluation.description else ""
            out.append(f"{name}'s check {key.name} failed in run {record.run_id}{why}")
        elif evaluation is None and record.run_id == inputs[name].run_id:
            out.append(f"{name}'s check {key.name} never finished in run {record.run_id}")
    return out


def checked_cron(catalog: Catalog, origin: str) -> str:
    """`refresh.cron` when Dagster can schedule it; else the CatalogError a bad catalog
    field gives (the catalog model checks only that it has five fields: the library does not
    import Dagster, whose cron reading is the one that counts)."""
    cron = catalog.refresh.cron
    if not is_valid_cron_string(cron):
        raise CatalogError(
            f"{origin}: field refresh.cron: {cron!r} is not a schedule Dagster can run "
            "(minute hour day-of-month month day-of-week, e.g. '0 2 * * *')"
        )
    return cron


def build_refresh(
    registry: Registry,
    catalog: Catalog,
    sources: dg.PartitionsDefinition,
    cache_dir: Path,
    origin: str = "sources.yaml",
) -> tuple[Any, dg.ScheduleDefinition, dg.SensorDefinition]:
    """The refresh job, its schedule and the cascade sensor; a `refresh.cron` Dagster cannot
    run fails here, naming the field of `origin` (the catalog's path)."""
    head = registry.refresh_head()
    code_versions = {s.name: registry.code_version(s, catalog) for s in registry}
    head_code = _digest(code_versions[name] for name in head)
    job = dg.define_asset_job(
        "per_source_refresh",
        selection=dg.AssetSelection.assets(*head),
        description=f"{', '.join(head)} for one source at its current revision.",
    )

    @dg.schedule(
        name="nightly_refresh",
        cron_schedule=checked_cron(catalog, origin),
        execution_timezone=catalog.refresh.timezone,
        job=job,
        default_status=dg.DefaultScheduleStatus.STOPPED,
        description="Nightly: one run per source whose revision or whose refresh stages' code "
        "changed (run_key source:revision:code).",
    )
    def nightly_refresh(context: dg.ScheduleEvaluationContext):  # type: ignore[no-untyped-def]
        due: list[tuple[str, str, str]] = []  # source, revision, run key
        unreachable: list[str] = []  # one source that cannot be resolved stops no other
        for spec in catalog.operational:
            try:
                revision = current_revision(catalog, spec, cache_dir, registry)
            except (CollectError, OSError) as e:
                cause = f"{type(e).__name__}: {' '.join(str(e).split())}"  # git's, on one line
                unreachable.append(f"{spec.id} ({cause})")
                context.log.warning(f"source {spec.id} not refreshed: {cause}")
                continue
            run_key = f"{spec.id}:{revision}:{head_code}"
            if not _already_requested(context.instance, run_key):
                due.append((spec.id, revision, run_key))
        # a schedule's run requests carry no message: a tag on each names what was left out
        left_out = {UNREACHABLE_TAG: "; ".join(unreachable)[:_TAG_CHARS]} if unreachable else {}
        if due:
            return [
                dg.RunRequest(
                    run_key=run_key,
                    partition_key=source,
                    tags={REVISION_TAG: revision, RUN_KEY_TAG: run_key, **left_out},
                )
                for source, revision, run_key in due
            ]
        if unreachable:
            return dg.SkipReason(
                f"not refreshed, unreachable: {'; '.join(unreachable)}; every other source "
                "is requested already"
            )
        return dg.SkipReason("every source's revision is requested already")

    # the run groups but the refresh head, in order: the catalog's first, so an edit of
    # sources.yaml shows in its asset (the refresh runs read the catalog itself)
    groups = [g for g in registry.run_groups() if not set(g) & set(head)]
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
        latest = _latest(instance, registry.names())
        stale = _stale_group(latest, registry, groups, code_versions)
        if stale is None:
            return dg.SkipReason(
                "every stage after the refresh head is up to date (or has no input yet)"
            )
        group, run_key = stale.group, _cascade_key(stale)
        not_passed = _checks_not_passed(instance, registry, stale.inputs)
        if not_passed:  # a blocking check stops what reads the version, in the cascade too
            return dg.SkipReason(
                f"{', '.join(group)}: not launched on versions whose blocking checks did not "
                f"pass: {'; '.join(not_passed)}"
            )
        last = _last_run(instance, run_key)
        if last is not None:
            return dg.SkipReason(
                f"{', '.join(group)}: its last run on these inputs (run {last.run_id}) "
                f"ended {last.status.value}; not launched again until a stage it reads or "
                "its code version changes"
            )
        stages = [registry.get(name) for name in group]
        tags = {"megacpp/cascade": ", ".join(group), RUN_KEY_TAG: run_key}
        if stages[0].per_source:  # every source in one run, as `megacpp run` does
            tags |= {PARTITION_RANGE_START: keys[0], PARTITION_RANGE_END: keys[-1]}
        return dg.RunRequest(
            run_key=run_key,
            asset_selection=[dg.AssetKey(name) for name in group],
            asset_check_keys=[
                dg.AssetCheckKey(dg.AssetKey(s.name), check.name)
                for s in stages
                for check in checks_of(s)
            ],
            tags=tags,
        )

    return job, nightly_refresh, nightly_cascade
