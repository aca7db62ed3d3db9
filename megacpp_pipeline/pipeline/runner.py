"""Running stages without Dagster: each stage over its partitions on the run's executor (a
per-file gate as map tasks over its input's slices, pipeline/file_stage.py; any other stage
its own body, which maps its own tasks), and every stage's blocking checks right after it.

Empty is a normal outcome: a source with no input rows still writes a complete version
whose stats say 0 files in, 0 kept, 0 dropped, and its checks pass.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from megacpp_pipeline.pipeline import progress, reuse
from megacpp_pipeline.pipeline.checks import CheckFailed, checks_of
from megacpp_pipeline.pipeline.context import StageContext
from megacpp_pipeline.pipeline.file_stage import run_gate_stage
from megacpp_pipeline.pipeline.memory import bound_malloc
from megacpp_pipeline.pipeline.metadata import summary_metadata
from megacpp_pipeline.pipeline.registry import Body, Materialized, Stage

__all__ = ["CheckFailed", "checks_of", "run_all", "run_stage"]


def run_stage(
    ctx: StageContext, stage: Stage, partitions: Sequence[str | None]
) -> Iterator[Materialized]:
    """Materialize `stage` for each partition (a source id, or None for a global stage),
    yielding what each one reports, in partition order."""
    bound_malloc()
    ctx = ctx.for_stage(stage)  # it reads only what it declares
    started = time.monotonic()
    progress.emit(progress.StageStarted(stage.name, len(partitions)))
    executor = ctx.executor()
    done: Iterable[Materialized]
    if stage.gate is not None:
        done = run_gate_stage(ctx, stage, partitions, executor)
    elif stage.sources_body is not None:
        done = stage.sources_body(ctx, stage, partitions)
    elif stage.per_source and len(partitions) > 1:
        # many sources' own bodies (collection) side by side, a source to a forked worker of
        # this host whatever the engine: they read this host's files (git mirrors, archives,
        # directories), and the driver's process only adopts what each one reports
        job = _BodyJob(replace(ctx, workers=1), stage)
        done = ctx.host_executor().map(_run_body, job, partitions)
    else:
        done = (_body_or_standing(ctx, stage, partition) for partition in partitions)
    for out in done:
        for message in out.messages:
            ctx.log(message)
        progress.emit(progress.partition_done(stage.name, out.partition, out.stats))
        yield out
    progress.emit(progress.StageDone(stage.name, time.monotonic() - started))


def _body_or_standing(ctx: StageContext, stage: Stage, partition: str | None) -> Materialized:
    """The stage's body for `partition`, unless it may be reused and its latest version was
    computed from the inputs it would read now (pipeline/reuse.py)."""
    assert stage.body is not None
    if not stage.reusable:
        return stage.body(ctx, stage, partition)
    inputs = reuse.body_inputs(ctx, stage, partition)
    if inputs is None:
        return stage.body(ctx, stage, partition)
    standing = reuse.standing(ctx, stage, partition, inputs)
    if standing is None:
        return stage.body(replace(ctx, inputs={partition: inputs}), stage, partition)
    beside: Mapping[str, Any] = {}
    if stage.still_whole is not None:
        whole = stage.still_whole(ctx, standing)
        if whole is None:
            ctx.log(f"{stage.name}: what {standing.version} promoted is not whole; made again")
            return stage.body(replace(ctx, inputs={partition: inputs}), stage, partition)
        beside = whole
    where = f" [{partition}]" if partition else ""
    ctx.log(f"{stage.name}{where}: its inputs are those of {standing.version}, which stands")
    metadata = {**summary_metadata(ctx.store, standing), **beside, "reused": True}
    return Materialized(partition, metadata, standing.stats)


@dataclass(frozen=True)
class _BodyJob:
    ctx: StageContext
    stage: Stage


def _run_body(job: _BodyJob, partition: str | None) -> Materialized:
    body: Body | None = job.stage.body
    assert body is not None
    messages: list[str] = []
    out = body(replace(job.ctx, log=messages.append), job.stage, partition)
    return replace(out, messages=tuple(messages))


def run_all(ctx: StageContext, *, checks: bool = True) -> None:
    """Every stage in registry order over every partition, each stage's blocking checks
    right after it (the same work `megacpp run` has Dagster do, without Dagster)."""
    ctx = replace(ctx, ahead=frozenset(ctx.registry.names()))  # all of them, in this process
    for stage in ctx.registry:
        partitions = ctx.partitions(stage)
        for _ in run_stage(ctx, stage, partitions):
            pass
        if not checks:
            continue
        for check in checks_of(stage):
            for partition in partitions:
                outcome = check.evaluate(ctx, stage, partition)
                if not outcome.passed:
                    raise CheckFailed(
                        f"asset {stage.name} check {check.name} failed: {outcome.description}"
                    )
