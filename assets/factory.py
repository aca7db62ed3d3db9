"""The Dagster shell, generated from the stage registry: one asset per stage with its blocking
checks (the standard ones the runner gives every stage plus the stage's own), its code
version, its group and its partitions. An asset body hands the run's partitions to the
library's runner and reports what each partition wrote; a check evaluates every partition of
its run and passes only if all do.

A per-source asset takes every partition of a run at once (single-run backfill policy), so a
run over a thousand sources is one run per stage group, not a thousand; each partition still
gets its own materialization event and metadata in the UI.
"""

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import dagster as dg
from dagster._core.storage.asset_check_execution_record import (
    AssetCheckExecutionRecordStatus,
)

from megacpp_pipeline.core.catalog import Catalog
from megacpp_pipeline.pipeline.checks import VERIFIED, Verified
from megacpp_pipeline.pipeline.registry import (
    Check,
    CheckOutcome,
    Markdown,
    PathValue,
    Registry,
    Stage,
)
from megacpp_pipeline.pipeline.runner import checks_of, run_stage
from resources.pipeline import PipelineResource

# The revision a refresh resolved for a tracked branch, pinned on the run that collects it.
REVISION_TAG = "megacpp/revision"
# A run over a range of sources: every partition of a per-source asset in one run (its
# single-run backfill policy), as `megacpp run` and the nightly cascade launch them.
PARTITION_RANGE_START = "dagster/asset_partition_range_start"
PARTITION_RANGE_END = "dagster/asset_partition_range_end"
# Executors that run every step of a run in the run's own process, one after another: a
# job's `in_process_executor`, and the one `dg.materialize` (execute_in_process) uses.
IN_PROCESS_EXECUTORS = frozenset({dg.in_process_executor.name, "execute_in_process_executor"})


def source_partitions(catalog: Catalog) -> dg.StaticPartitionsDefinition:
    """One partition per operational source."""
    return dg.StaticPartitionsDefinition([s.id for s in catalog.operational])


def dagster_metadata(metadata: Mapping[str, Any]) -> dict[str, Any]:
    """The library's metadata as Dagster's: markdown, paths and JSON typed; numbers stay
    numbers (so the UI plots them across runs)."""
    out: dict[str, Any] = {}
    for key, value in metadata.items():
        if isinstance(value, Markdown):
            out[key] = dg.MetadataValue.md(str(value))
        elif isinstance(value, PathValue):
            out[key] = dg.MetadataValue.path(str(value))
        elif isinstance(value, (dict, list)):
            out[key] = dg.MetadataValue.json(value)
        elif value is None:
            out[key] = "none"
        else:
            out[key] = value
    if "rows" in out:
        out["dagster/row_count"] = out["rows"]
    return out


def build_stage_asset(
    stage: Stage,
    registry: Registry,
    catalog: Catalog,
    sources: dg.PartitionsDefinition,
) -> dg.AssetsDefinition:
    partitioned = stage.per_source

    @dg.asset(
        name=stage.name,
        deps=[dg.AssetKey(up) for up in registry.reads_of(stage)],  # every read, declared
        partitions_def=sources if partitioned else None,
        backfill_policy=dg.BackfillPolicy.single_run() if partitioned else None,
        group_name=stage.group,
        kinds=set(stage.kinds),
        owners=list(stage.owners),
        code_version=registry.code_version(stage, catalog),
        description=stage.description,
    )
    def _asset(
        context: dg.AssetExecutionContext, pipeline: PipelineResource
    ) -> dg.MaterializeResult:
        partitions: list[str | None] = list(context.partition_keys) if partitioned else [None]
        ctx = pipeline.stage_context(
            registry,
            run_id=context.run.run_id,
            pins=_pins(context, partitions),
            log=context.log.info,
            ahead=_ahead(context),
        )
        for out in run_stage(ctx, stage, partitions):
            if partitioned:
                context.add_asset_metadata(
                    dagster_metadata(out.metadata), partition_key=out.partition
                )
            else:
                context.add_asset_metadata(dagster_metadata(out.metadata))
        return dg.MaterializeResult()

    return _asset


def _ahead(context: dg.AssetExecutionContext) -> list[str]:
    """The assets this run materializes, when its steps run one after another in this
    process (`megacpp run`'s runs through `dg.materialize`, a job on the in-process
    executor): a per-file gate then runs the gates ahead of it in its own pass
    (pipeline/file_stage.py). A run whose steps each get a process (the UI's and the
    schedule's, on the multiprocess executor) runs each gate in its own step."""
    if context.job_def.executor_def.name not in IN_PROCESS_EXECUTORS:
        return []
    return [key.to_user_string() for key in context.job_def.asset_layer.selected_asset_keys]


def _pins(context: dg.AssetExecutionContext, partitions: Sequence[str | None]) -> dict[str, str]:
    """A refresh run collects one source at the revision the schedule resolved."""
    revision = context.run.tags.get(REVISION_TAG)
    if revision and len(partitions) == 1 and partitions[0] is not None:
        return {partitions[0]: revision}
    return {}


def build_stage_check(
    stage: Stage, check: Check, registry: Registry, sources: dg.PartitionsDefinition
) -> dg.AssetChecksDefinition:
    partitioned = stage.per_source

    @dg.asset_check(
        asset=stage.name,
        name=check.name,
        blocking=True,
        description=check.description,
        partitions_def=sources if partitioned else None,
    )
    def _check(
        context: dg.AssetCheckExecutionContext, pipeline: PipelineResource
    ) -> dg.AssetCheckResult:
        ctx = pipeline.stage_context(registry, run_id=context.run.run_id, log=context.log.info)
        partitions = _check_partitions(context, ctx.sources()) if partitioned else [None]
        if check.verdicts:
            key = dg.AssetCheckKey(dg.AssetKey(stage.name), check.name)
            ctx = replace(ctx, prior_verdicts=prior_verdicts(context.instance, key, partitions))
        outcomes = [(p, check.evaluate(ctx, stage, p)) for p in partitions]
        return _combined(outcomes)

    return _check


# How many of a check's latest evaluations are searched for the record of each partition.
PRIOR_EVALUATIONS = 20


def prior_verdicts(
    instance: dg.DagsterInstance, key: dg.AssetCheckKey, partitions: Sequence[str | None]
) -> dict[str | None, Verified]:
    """For each partition, the newest record of a pass of this check (what its `verified`
    metadata names) among the check's latest evaluations in this instance that a run made
    (an evaluation reported without a run is no pass of the check): the orchestrator's own
    record, which a writer of the store or the result cache cannot forge. A partition with
    none is absent (its check reads everything)."""
    status = {
        AssetCheckExecutionRecordStatus.SUCCEEDED,
        AssetCheckExecutionRecordStatus.FAILED,
    }
    records = instance.event_log_storage.get_asset_check_execution_history(
        key, limit=PRIOR_EVALUATIONS, status=status
    )
    wanted = set(partitions)
    found: dict[str | None, Verified] = {}
    for record in records:  # newest first
        if not record.run_id:
            continue
        event = record.event.dagster_event if record.event is not None else None
        evaluation = event.event_specific_data if event is not None else None
        value = (getattr(evaluation, "metadata", None) or {}).get(VERIFIED)
        if not isinstance(value, dg.JsonMetadataValue) or not isinstance(value.data, dict):
            continue
        for name, raw in value.data.items():
            partition = name or None
            verified = Verified.from_json(raw, record.run_id)
            if partition in wanted and partition not in found and verified is not None:
                found[partition] = verified
    return found


def _check_partitions(context: dg.AssetCheckExecutionContext, sources: list[str]) -> list[str]:
    if context.has_partition_key or context.has_partition_key_range:
        return list(context.partition_keys)
    return sources  # run outside any partition (e.g. from the check's page): check them all


def _combined(outcomes: list[tuple[str | None, CheckOutcome]]) -> dg.AssetCheckResult:
    """One partition: its result as it is. Several: passed only if every one did; numbers
    summed; the failing partitions named, the first one's problem as the description. What
    each passing partition's content check proved (`verified`) is kept per partition."""
    proved = {
        p or "": o.metadata[VERIFIED]
        for p, o in outcomes
        if o.passed and isinstance(o.metadata.get(VERIFIED), dict)
    }
    outcomes = [
        (p, replace(o, metadata={k: v for k, v in o.metadata.items() if k != VERIFIED}))
        for p, o in outcomes
    ]
    verified = {VERIFIED: dg.MetadataValue.json(proved)} if proved else {}
    if len(outcomes) == 1:
        _, only = outcomes[0]
        return dg.AssetCheckResult(
            passed=only.passed,
            metadata={**dagster_metadata(only.metadata), **verified},
            description=only.description,
        )
    failed = [(p, o) for p, o in outcomes if not o.passed]
    totals: dict[str, float] = {}
    for _, o in outcomes:
        for key, value in o.metadata.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                totals[key] = totals.get(key, 0) + value
    first = failed[0][1].description if failed else None
    return dg.AssetCheckResult(
        passed=not failed,
        metadata={
            **totals,
            "partitions_checked": len(outcomes),
            "partitions_failed": len(failed),
            "failed_partitions": ", ".join(str(p) for p, _ in failed[:20]) or "none",
            **verified,
        },
        description=first or (f"partition {failed[0][0]} failed" if failed else None),
    )


def build_assets(
    registry: Registry, catalog: Catalog
) -> tuple[list[dg.AssetsDefinition], list[dg.AssetChecksDefinition], dg.PartitionsDefinition]:
    """Every stage's asset and checks, in registry order."""
    sources = source_partitions(catalog)
    assets = [build_stage_asset(stage, registry, catalog, sources) for stage in registry]
    checks = [
        build_stage_check(stage, check, registry, sources)
        for stage in registry
        for check in checks_of(stage)
    ]
    return assets, checks, sources
