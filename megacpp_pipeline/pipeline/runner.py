"""Running a stage without Dagster: a per-file stage streams each source's input shard by
shard through its gate (cached per file, on every core) and writes kept rows, ledger rows
and side tables as a new version; any other stage runs its own body. Also the standard
blocking checks every stage gets from the registry: its version verifies from disk, and for
a per-file stage every input file is kept or in its ledger.

Empty is a normal outcome: a source with no input rows still writes a complete version
whose stats say 0 files in, 0 kept, 0 dropped, and its checks pass.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import replace
from typing import Any

import pyarrow as pa

from megacpp_pipeline.core import ledger
from megacpp_pipeline.core.gate import GateResult
from megacpp_pipeline.pipeline import progress
from megacpp_pipeline.pipeline.context import SourceInputs, StageContext
from megacpp_pipeline.pipeline.memory import bound_malloc
from megacpp_pipeline.pipeline.parallel import default_workers, forked_pool, parallel, row_sizes
from megacpp_pipeline.pipeline.registry import (
    Body,
    Check,
    CheckOutcome,
    Markdown,
    Materialized,
    PathValue,
    Stage,
)
from megacpp_pipeline.storage.file_cache import FileResultCache, cached_gate_call, row_keys
from megacpp_pipeline.storage.store import Manifest, ShardStore, VersionWriter

# Counters every per-file version carries, zero included: a check never has to guess.
ACCOUNTING_STATS = ("input_files", "kept_files", "dropped_files", "cached_files")


def run_stage(
    ctx: StageContext, stage: Stage, partitions: Sequence[str | None]
) -> Iterator[Materialized]:
    """Materialize `stage` for each partition (a source id, or None for a global stage),
    yielding what each one reports, in partition order. Many sources of a per-source stage
    run on every core, a source to a forked worker (each source's gate then runs inline);
    a few sources run one after the other, each on every core shard by shard."""
    bound_malloc()
    body = stage.body or run_file_partition
    workers = ctx.workers if ctx.workers is not None else default_workers()
    started = time.monotonic()
    progress.emit(progress.StageStarted(stage.name, len(partitions)))
    done: Iterable[Materialized]
    if ctx.engine.distributed and stage.body is None and partitions:
        from megacpp_pipeline.pipeline import ray_engine  # the optional extra

        done = ray_engine.run_file_partitions(ctx, stage, partitions)
    elif stage.per_source and workers > 1 and len(partitions) >= SOURCES_PER_WORKER * workers:
        done = _run_sources_forked(ctx, stage, body, partitions, workers)
    else:
        done = (body(ctx, stage, partition) for partition in partitions)
    for out in done:
        progress.emit(progress.partition_done(stage.name, out.partition, out.stats))
        yield out
    progress.emit(progress.StageDone(stage.name, time.monotonic() - started))


# Below this many sources per worker, one source at a time on every core is as fast.
SOURCES_PER_WORKER = 4
_JOB: tuple[StageContext, Stage, Body] | None = None  # set in the parent right before a fork


def _run_sources_forked(
    ctx: StageContext, stage: Stage, body: Body, partitions: Sequence[str | None], workers: int
) -> Iterator[Materialized]:
    global _JOB
    _JOB = (replace(ctx, workers=1), stage, body)
    try:
        with forked_pool(workers) as pool:
            for done, messages in pool.imap(_run_one_source, partitions, chunksize=1):
                for message in messages:
                    ctx.log(message)
                yield done
    finally:
        _JOB = None


def _run_one_source(partition: str | None) -> tuple[Materialized, list[str]]:
    assert _JOB is not None, "worker started without a fork"
    ctx, stage, body = _JOB
    messages: list[str] = []
    return body(replace(ctx, log=messages.append), stage, partition), messages


# per-file stages ------------------------------------------------------------------------
def run_file_partition(ctx: StageContext, stage: Stage, source: str | None) -> Materialized:
    assert source is not None and stage.gate is not None and stage.input is not None
    assert stage.schema is not None and stage.content_column is not None
    spec = ctx.catalog.source(source)
    config = ctx.config(stage)
    upstream = ctx.latest(stage.input, source)
    inputs = SourceInputs(ctx, stage, spec, config)
    prepared = stage.gate(inputs)
    code_version = ctx.code_version(stage)
    cache = ctx.file_cache(stage, code_version, prepared.salt, source)
    version = ctx.store.begin(
        stage.name, source, code_version=code_version, config=config, run_id=ctx.run_id
    )
    stats = run_file_gate(
        version,
        ctx.store.iter_tables(upstream, ctx.input_table(stage, source)),
        prepared.gate,
        stage,
        cache=cache,
        workers=stage.workers if stage.workers is not None else ctx.workers,
    )
    manifest = version.commit(
        upstream=ctx.upstream_hashes([upstream, *inputs.read]),
        stats=stats,
        extra={**prepared.extra, **ctx.engine.describe()},
    )
    ctx.log(
        f"{stage.name} [{source}]: {stats['input_files']} files in, {stats['kept_files']} kept,"
        f" {stats['dropped_files']} dropped"
    )
    return Materialized(source, file_stage_metadata(ctx, manifest, stage, stats), stats)


def run_file_gate(
    version: VersionWriter,
    shards: Iterable[pa.Table],
    gate: Callable[[pa.Table], GateResult],
    stage: Stage,
    *,
    cache: FileResultCache | None = None,
    workers: int | None = None,
) -> Counter[str]:
    """Stream shard by shard; memory is bounded by one shard plus the gate's output. With a
    `cache`, only files whose key is not cached go through the gate, and `stage.summarize`
    recomputes the gate's UI counters over the whole output. The gate runs on `workers`
    forked processes (default: MEGACPP_WORKERS, else every CPU), same result as serial.
    A reason the stage does not declare is an error: a typo cannot invent a drop reason."""
    assert stage.schema is not None and stage.content_column is not None
    gate = parallel(gate, workers)
    data = version.table("data", stage.schema)
    drops = version.table("ledger", ledger.LEDGER_SCHEMA)
    stats: Counter[str] = Counter(dict.fromkeys((*ACCOUNTING_STATS, "input_bytes"), 0))
    for table in shards:
        result, shard_stats = gate_table(table, gate, stage, cache)
        stats.update(shard_stats)
        data.write(result.kept)
        drops.write(result.dropped)
        for name, side in result.extra.items():
            version.table(name, stage.side_tables.get(name, side.schema)).write(side)
    return stats


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


# what the UI shows ------------------------------------------------------------------------
def summary_metadata(store: ShardStore, manifest: Manifest, **extra: Any) -> dict[str, Any]:
    data = [s for name in manifest.data_tables() for s in manifest.tables[name].shards]
    meta: dict[str, Any] = {
        "rows": manifest.rows,
        "shards": len(data),
        "bytes": sum(s.bytes for s in data),
        "dropped_files": int(manifest.stats.get("dropped_files", 0)),
        "manifest": PathValue(store.manifest_path(manifest)),
        "version": manifest.version,
    }
    meta.update(extra)
    return meta


def drop_reasons_table(stats: Mapping[str, float]) -> Markdown:
    """The stage's drops by reason, most first, as a markdown table."""
    rows = sorted(
        ((k.removeprefix("ledger:"), int(v)) for k, v in stats.items() if k.startswith("ledger:")),
        key=lambda kv: (-kv[1], kv[0]),
    )
    if not rows:
        return Markdown("no file dropped")
    return Markdown(
        "\n".join(["| reason | files |", "|---|---:|", *(f"| {r} | {n} |" for r, n in rows)])
    )


def file_stage_metadata(
    ctx: StageContext, manifest: Manifest, stage: Stage, stats: Mapping[str, float]
) -> dict[str, Any]:
    extra: dict[str, Any] = {
        "input_files": int(stats["input_files"]),
        "cached_files": int(stats["cached_files"]),
        "drop_reasons": drop_reasons_table(stats),
    }
    if stage.report is not None:
        extra.update(stage.report(ctx, manifest, stats))
    return summary_metadata(ctx.store, manifest, **extra)


# the standard checks ----------------------------------------------------------------------
def standard_checks(stage: Stage) -> tuple[Check, ...]:
    """What the registry gives every stage: its version verifies from disk (when it writes
    one), and for a per-file stage, every input file is kept or in its ledger."""
    checks: list[Check] = []
    if stage.manifest_check:
        checks.append(MANIFEST_VERIFIES)
    if stage.gate is not None:
        checks.append(EVERY_INPUT_ACCOUNTED)
    return tuple(checks)


def _manifest_verifies(ctx: StageContext, stage: Stage, partition: str | None) -> CheckOutcome:
    manifest = ctx.store.latest(stage.name, partition)
    problems = ctx.store.verify(manifest, check_sha256=True)
    return CheckOutcome(
        passed=not problems,
        metadata={
            "shards_verified": len(manifest.all_shards()),
            "rows": manifest.rows,
            "problems": Markdown("\n".join(f"- {p}" for p in problems[:50]) or "none"),
        },
        description=problems[0] if problems else None,
    )


MANIFEST_VERIFIES = Check(
    "manifest_verifies_from_disk",
    "Every shard listed in the manifest exists on disk with its sha256, row count and schema.",
    _manifest_verifies,
)


def _every_input_accounted(ctx: StageContext, stage: Stage, source: str | None) -> CheckOutcome:
    """The version's own counts add up (in == kept + ledger), and when it consumed the
    latest upstream version, `in` is that version's row count for this source."""
    assert source is not None and stage.input is not None
    manifest = ctx.store.latest(stage.name, source)
    up = ctx.latest(stage.input, source)
    table = up.tables.get(ctx.input_table(stage, source))
    up_rows = table.rows if table is not None else 0
    consumed = manifest.upstream.get(f"{up.asset}/{up.partition}") == ctx.store.manifest_sha256(up)
    files_in = int(manifest.stats["input_files"])
    dropped = manifest.tables["ledger"].rows if "ledger" in manifest.tables else 0
    passed = files_in == manifest.rows + dropped and (not consumed or files_in == up_rows)
    return CheckOutcome(
        passed=passed,
        metadata={"input_files": files_in, "kept": manifest.rows, "dropped": dropped},
        description=None
        if passed
        else f"{source}: {files_in} files in, {manifest.rows} kept + {dropped} in the ledger"
        + ("" if files_in == up_rows or not consumed else f"; {stage.input} holds {up_rows}"),
    )


EVERY_INPUT_ACCOUNTED = Check(
    "every_input_file_kept_or_in_ledger",
    "Every file the input version holds for this source is kept here or in this version's "
    "ledger with a reason (nothing disappears silently).",
    _every_input_accounted,
)


def checks_of(stage: Stage) -> tuple[Check, ...]:
    return standard_checks(stage) + stage.checks


class CheckFailed(Exception):
    """A blocking check failed; the message names the stage, the check and the problem."""


def run_all(ctx: StageContext, *, checks: bool = True) -> None:
    """Every stage in registry order over every partition, each stage's blocking checks
    right after it (the same work `megacpp run` has Dagster do, without Dagster)."""
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


def corpus_funnel(
    ctx: StageContext, upto: str | None = None
) -> tuple[int, list[tuple[str, str, int]]]:
    """Files collected over every source, and the drops of every ledger stage (up to and
    including `upto`) by reason, from the versions' stats alone (no ledger is read)."""
    collected = 0
    drops: list[tuple[str, str, int]] = []
    for name in ctx.registry.ledger_stages():
        stage = ctx.registry.get(name)
        partitions = ctx.partitions(stage)
        counts: Counter[str] = Counter()
        for partition in partitions:
            if not ctx.store.has_version(name, partition):
                continue
            stats = ctx.store.latest(name, partition).stats
            if name == ctx.registry.ledger_stages()[0]:
                collected += int(stats.get("files_seen", 0))
            counts.update({k: int(v) for k, v in stats.items() if k.startswith("ledger:")})
        drops += [(name, k.removeprefix("ledger:"), n) for k, n in sorted(counts.items()) if n]
        if name == upto:
            break
    return collected, drops


def nothing_left(ctx: StageContext, upto: str) -> str:
    """The one line that says a corpus has nothing left, where it went, and where to read
    the ledgers."""
    collected, drops = corpus_funnel(ctx, upto)
    where = "; ".join(f"{stage}: {n} {reason}" for stage, reason, n in drops) or "none dropped"
    return (
        f"nothing left to promote: none of the {collected} collected files is left after "
        f"{upto} ({where}); every file's reason is in the ledgers under "
        f"{ctx.store.join('assets')}/<stage>/<source>/"
    )


def _some_file_is_left(ctx: StageContext, stage: Stage, partition: str | None) -> CheckOutcome:
    manifest = ctx.store.latest(stage.name, None)
    return CheckOutcome(
        passed=manifest.rows > 0,
        metadata={"files_left": manifest.rows},
        description=None if manifest.rows else nothing_left(ctx, stage.name),
    )


SOME_FILE_IS_LEFT = Check(
    "some_file_is_left",
    "The corpus still holds at least one file; with none, the run stops here with the reason "
    "of every drop instead of training a tokenizer or packing rows on nothing.",
    _some_file_is_left,
)
