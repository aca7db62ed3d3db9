"""A stage with a per-file gate, on any executor: plan the input's slices (every source's
at once, so a stage over many small sources keeps every worker busy), map one task per
slice that reads its rows from the store, runs the gate (cached per file), and writes its
kept rows, ledger rows and side tables straight into the new version under names unique to
the slice; reduce by adopting those shards in input order and committing. Only shard names,
hashes and counters come back from a task, never text.

A per-source stage commits one version per source, each as soon as its last slice is
back; a corpus-wide gate (decontamination: every source's rows against one index) commits
one version whose `data:<source>` tables keep the sources apart, as its input did.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import pyarrow as pa

from megacpp_pipeline.core import ledger
from megacpp_pipeline.core.gate import GateResult
from megacpp_pipeline.pipeline.context import SourceInputs, StageContext
from megacpp_pipeline.pipeline.executor import Executor, MapStats
from megacpp_pipeline.pipeline.metadata import file_stage_metadata
from megacpp_pipeline.pipeline.parallel import row_sizes
from megacpp_pipeline.pipeline.registry import Materialized, PreparedGate, Stage
from megacpp_pipeline.snapshot import layout
from megacpp_pipeline.storage import slices
from megacpp_pipeline.storage.file_cache import FileResultCache, cached_gate_call, row_keys
from megacpp_pipeline.storage.store import (
    Manifest,
    ShardInfo,
    ShardUploader,
    VersionWriter,
    WrittenSchema,
    conform,
)

# Counters every per-file version carries, zero included: a check never has to guess.
ACCOUNTING_STATS = ("input_files", "kept_files", "dropped_files", "cached_files")


@dataclass(frozen=True)
class Output:
    """Where one source's rows go: a version folder and the table in it."""

    source: str
    table: str  # "data" in a per-source version, "data:<source>" in a corpus-wide one
    dir: str
    code_version: str


@dataclass(frozen=True)
class GateJob:
    """What every task of one stage run needs; inherited by forked workers, put into Ray's
    object store once."""

    ctx: StageContext
    stage: Stage
    outputs: tuple[Output, ...]
    token: str  # unique per run of the stage: keys the per-process gate memo


@dataclass(frozen=True)
class SliceTask:
    index: int  # the slice's number within its output version: names its shards
    output: int  # into GateJob.outputs
    pieces: tuple[slices.Piece, ...]


@dataclass
class SliceResult:
    tables: dict[str, tuple[pa.Schema, ShardInfo | None, WrittenSchema | None]]
    stats: Counter[str]


# Per process: each source's gate and cache for the job it last ran. The driver fills it
# before a local map forks (workers inherit the compiled gates); a Ray worker fills it on
# its first task of a job.
_PREPARED: dict[tuple[str, str], tuple[Any, FileResultCache]] = {}


def _prepared(job: GateJob, output: Output) -> tuple[Any, FileResultCache]:
    key = (job.token, output.source)
    if key not in _PREPARED:
        if any(k[0] != job.token for k in _PREPARED):
            _PREPARED.clear()  # a new job: the last one's gates are done with
        ctx, stage = job.ctx, job.stage
        prepared = prepare_gate(ctx, stage, output.source)
        _PREPARED[key] = (prepared.gate, _cache(ctx, stage, output, prepared))
    return _PREPARED[key]


def prepare_gate(ctx: StageContext, stage: Stage, source: str) -> PreparedGate:
    assert stage.gate is not None
    return stage.gate(SourceInputs(ctx, stage, ctx.catalog.source(source), ctx.config(stage)))


def _cache(
    ctx: StageContext, stage: Stage, output: Output, prepared: PreparedGate
) -> FileResultCache:
    return ctx.file_cache(stage, output.code_version, prepared.salt, output.source)


def gate_slice(job: GateJob, task: SliceTask) -> SliceResult:
    """One slice through the stage's gate; its outputs written into the new version."""
    ctx, stage = job.ctx, job.stage
    assert stage.schema is not None
    output = job.outputs[task.output]
    gate, cache = _prepared(job, output)
    table = slices.read(ctx.store, task.pieces)
    result, stats = gate_table(table, gate, stage, cache)
    uploader = ShardUploader(ctx.store, output.dir)
    outputs = [
        (output.table, result.kept, stage.schema),
        ("ledger", result.dropped, ledger.LEDGER_SCHEMA),
        *((n, t, stage.side_tables.get(n, t.schema)) for n, t in result.extra.items()),
    ]
    tables: dict[str, tuple[pa.Schema, ShardInfo | None, WrittenSchema | None]] = {}
    for name, out, schema in outputs:
        out = conform(out, schema, f"{output.dir}: table {name!r}")
        shard: ShardInfo | None = None
        written: WrittenSchema | None = None
        if out.num_rows:
            prefix = "part" if name == layout.DATA else name.replace(":", "-")
            shard, written = uploader.write_parquet(f"{prefix}-{task.index:05d}.parquet", out)
        tables[name] = (schema, shard, written)
    return SliceResult(tables, stats)


@dataclass
class _Pending:
    """A version being filled by tasks: the outputs (sources) it holds, in order."""

    version: VersionWriter
    sources: list[str]
    upstream: list[Manifest]
    extra: dict[str, Any]
    stats: Counter[str] = field(default_factory=Counter)
    tasks_left: int = 0
    nodes: MapStats = field(default_factory=MapStats)  # where this version's tasks ran


def run_gate_stage(
    ctx: StageContext, stage: Stage, partitions: Sequence[str | None], executor: Executor
) -> Iterator[Materialized]:
    """`stage`'s gate over `partitions` (sources, or [None] for a corpus-wide gate) on
    `executor`; yields each committed partition in order."""
    assert stage.gate is not None and stage.input is not None
    sources = [p for p in partitions if p] if stage.per_source else ctx.sources()
    code_version = ctx.code_version(stage)
    config = ctx.config(stage)
    pending: list[_Pending] = []
    outputs: list[Output] = []
    owner: list[int] = []  # each output's pending version
    inputs: list[tuple[Manifest, str]] = []
    gates: list[PreparedGate] = []
    closing: list[Any] = []  # the map's generator, closed if this fails
    token = ""
    try:
        for source in sources:
            upstream = ctx.latest(stage.input, source)
            reading = SourceInputs(ctx, stage, ctx.catalog.source(source), config)
            gate = stage.gate(reading)  # the driver's copy: what it reads, salt and extras
            if stage.per_source or not pending:
                partition = source if stage.per_source else None
                version = ctx.begin(stage, partition, config)
                pending.append(_Pending(version, [], [], dict(gate.extra)))
                token = token or version.dir
            current = pending[-1]
            current.sources.append(source)
            for m in [upstream, *reading.read]:
                if all(
                    (m.asset, m.partition, m.version) != (u.asset, u.partition, u.version)
                    for u in current.upstream
                ):
                    current.upstream.append(m)
            table = layout.data_table(None if stage.per_source else source)
            outputs.append(Output(source, table, current.version.dir, code_version))
            owner.append(len(pending) - 1)
            inputs.append((upstream, ctx.input_table(stage, source)))
            gates.append(gate)
        job = GateJob(replace(ctx, log=_ignore, workers=1), stage, tuple(outputs), token)
        if not executor.distributed:  # forked workers inherit the driver's compiled gates
            for output, gate in zip(outputs, gates, strict=True):
                _PREPARED[(token, output.source)] = (gate.gate, _cache(ctx, stage, output, gate))
        task_bytes = slices.task_bytes_for(
            slices.total_bytes(inputs), executor.workers, ctx.engine.task_bytes
        )
        tasks: list[SliceTask] = []
        numbered: Counter[int] = Counter()  # slices per version so far: names their shards
        for n, table_of_source in enumerate(inputs):
            v = owner[n]
            for piece_list in slices.plan(ctx.store, [table_of_source], task_bytes):
                tasks.append(SliceTask(numbered[v], n, piece_list.pieces))
                numbered[v] += 1
        for v, p in enumerate(pending):
            p.tasks_left = numbered[v]
        done = 0
        results = executor.map_timed(gate_slice, job, tasks)
        closing.append(results)
        for task, timed in zip(tasks, results, strict=True):
            p = pending[owner[task.output]]
            p.nodes.count(timed.node, timed.busy_s)
            _adopt(p, stage, timed.value)
            p.tasks_left -= 1
            while done < len(pending) and pending[done].tasks_left == 0:
                yield _commit(ctx, stage, pending[done], executor)
                done += 1
        while done < len(pending):  # versions with no slice at all (an empty input)
            yield _commit(ctx, stage, pending[done], executor)
            done += 1
    except BaseException:
        for results in closing:  # its workers end now, not when the process exits
            results.close()
        for p in pending:
            if not p.version.closed:
                p.version.abort()
        raise
    finally:
        for key in [k for k in _PREPARED if k[0] == token]:
            del _PREPARED[key]


def _adopt(p: _Pending, stage: Stage, result: SliceResult) -> None:
    p.stats.update(result.stats)
    for name, (schema, shard, written) in result.tables.items():
        writer = p.version.table(name, schema)
        if shard is not None and written is not None:
            writer.adopt(shard, written)


def _commit(ctx: StageContext, stage: Stage, p: _Pending, executor: Executor) -> Materialized:
    assert stage.schema is not None
    stats: Counter[str] = Counter(dict.fromkeys((*ACCOUNTING_STATS, "input_bytes"), 0))
    stats.update(p.stats)
    for source in p.sources:  # every table exists even when no slice wrote a row
        p.version.table(layout.data_table(None if stage.per_source else source), stage.schema)
    p.version.table("ledger", ledger.LEDGER_SCHEMA)
    manifest = p.version.commit(
        upstream=ctx.upstream_hashes(p.upstream),
        stats=stats,
        extra={**p.extra, **executor.describe(), "engine_nodes": p.nodes.figures()},
    )
    partition = p.sources[0] if stage.per_source else None
    where = f" [{partition}]" if partition else ""
    ctx.log(
        f"{stage.name}{where}: {stats['input_files']} files in, {stats['kept_files']} kept,"
        f" {stats['dropped_files']} dropped"
    )
    return Materialized(partition, file_stage_metadata(ctx, manifest, stage, stats), stats)


def gate_table(
    table: pa.Table,
    gate: Callable[[pa.Table], GateResult],
    stage: Stage,
    cache: FileResultCache | None = None,
) -> tuple[GateResult, Counter[str]]:
    """One shard (or slice of one) through the gate: the result with its ledger rows stamped
    with the stage, and the shard's counters. A reason the stage does not declare is an
    error: a typo cannot invent a drop reason."""
    assert stage.schema is not None and stage.content_column is not None
    stats: Counter[str] = Counter(dict.fromkeys((*ACCOUNTING_STATS, "input_bytes"), 0))
    stats["input_files"] += table.num_rows
    stats["input_bytes"] += int(row_sizes(table).sum())
    if cache is not None:
        schemas = {"kept": stage.schema, "dropped": ledger.LEDGER_SCHEMA, **stage.side_tables}
        keys = row_keys(table, stage.content_column)
        result, hits = cached_gate_call(cache, table, keys, gate, schemas)
        stats["cached_files"] += hits
    else:
        result = gate(table)
    stats.update(_shard_stats(result, stage))
    stats["kept_files"] += result.kept.num_rows
    stats["dropped_files"] += result.dropped.num_rows
    for reason in result.dropped["reason"].drop_null().to_pylist():
        if reason not in stage.drop_reasons:
            raise ValueError(
                f"stage {stage.name!r}: the gate dropped a file with reason {reason!r},"
                f" which the stage does not declare ({', '.join(stage.drop_reasons)})"
            )
        stats[f"ledger:{reason}"] += 1
    return replace(result, dropped=ledger.stamp(result.dropped, stage.name)), stats


def _shard_stats(result: GateResult, stage: Stage) -> Counter[str]:
    if stage.summarize is None:
        return result.stats
    summary = stage.summarize(result)
    families = {k.split(":", 1)[0] for k in summary}
    own = Counter({k: v for k, v in result.stats.items() if k.split(":", 1)[0] not in families})
    own.update(summary)
    return own


def _ignore(message: str) -> None:
    pass
