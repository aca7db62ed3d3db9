"""A stage with a per-file gate, on any executor: plan the input's slices (every source's
at once, so a stage over many small sources keeps every worker busy), map one task per
slice that reads its rows from the store, runs the gate (cached per file), and writes its
kept rows, ledger rows and side tables straight into the new version under names unique to
the slice; reduce by adopting those shards in input order and committing. Only shard names,
hashes and counters come back from a task, never text.

A per-source stage commits one version per source, each as soon as its last slice is
back; a corpus-wide gate (decontamination: every source's rows against one index) commits
one version whose `data:<source>` tables keep the sources apart, as its input did.

One pass, several gates: when the same process runs the next per-file gates of the chain
later in the same run (`StageContext.ahead`, Registry.pass_after: normalize through scrub),
each task runs them too, on the rows the gate before kept, and writes each one's shards
into a version of its own, begun now and left uncommitted. The text is read from the store
once per pass instead of once per gate. Each of those stages still runs as its own step
after the blocking checks of the one before: it commits the version waiting for it only
if that version's input is the latest (the version the checks just passed), and its code,
config and everything else its gate read are unchanged; otherwise it drops the version and
runs its gate itself. A check that fails stops the run, and nothing it blocks is committed.

The driver prepares every gate and records what it read and its salt in the version's
inputs. A forked worker inherits those gates; a Ray worker prepares its own (a gate need
not pickle), and refuses to run it unless its salt and reads are the driver's: a request
file edited, or a version committed, while the stage runs would otherwise put content in
the version that its recorded inputs do not say.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import pyarrow as pa

from megacpp_pipeline.core import ledger
from megacpp_pipeline.core.errors import FieldedError
from megacpp_pipeline.core.gate import GateResult
from megacpp_pipeline.pipeline import reuse
from megacpp_pipeline.pipeline.checks import ShardScan, note_gate_scan
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
from megacpp_pipeline.storage.text_refs import TextPlaces
from megacpp_pipeline.storage.versions import config_hash, content_id

# Counters every per-file version carries, zero included: a check never has to guess.
ACCOUNTING_STATS = ("input_files", "kept_files", "dropped_files", "cached_files")


class GateInputsChanged(FieldedError, RuntimeError):
    """A task's gate, prepared where the task runs, is not the one the driver prepared and
    records in the version's inputs (a request file edited, a version committed meanwhile);
    names the stage, the source and what differs."""

    def __init__(self, stage: str, source: str, what: str) -> None:
        super().__init__(
            f"{stage} [{source}]: the gate a task prepared is not the driver's: {what}; "
            "run the stage again"
        )
        self.stage = stage
        self.source = source
        self.what = what


@dataclass(frozen=True)
class Output:
    """Where one source's rows go (a version folder and the table in it), and what the
    driver's gate for it read and its salt, as the version's inputs record them."""

    source: str
    table: str  # "data" in a per-source version, "data:<source>" in a corpus-wide one
    dir: str
    code_version: str
    salt: str = ""
    reads: tuple[str, ...] = ()  # the versions the gate read (`_read_ids`)


@dataclass(frozen=True)
class Link:
    """One gate of a pass: its stage, its context (which reads what the stage declares) and
    where each source's rows go (`outputs`, in the same order for every link)."""

    ctx: StageContext
    stage: Stage
    outputs: tuple[Output, ...]


@dataclass(frozen=True)
class GateJob:
    """What every task of one stage run needs; inherited by forked workers, put into Ray's
    object store once."""

    links: tuple[Link, ...]  # the stage's gate, then the gates run ahead in the same pass
    token: str  # unique per run of the stage: keys the per-process gate memo


@dataclass(frozen=True)
class SliceTask:
    index: int  # the slice's number within its output version: names its shards
    output: int  # into each link's outputs
    pieces: tuple[slices.Piece, ...]


@dataclass
class SliceResult:
    tables: dict[str, tuple[pa.Schema, ShardInfo | None, WrittenSchema | None]]
    stats: Counter[str]
    busy_s: float = 0.0  # this gate's seconds on the slice (the first one's: with the read)
    # (data shard's path in the version, the note of its texts) when the gate inspected
    # kept texts as its content check does (GateResult.scanned_clean)
    note: tuple[str, ShardScan] | None = None


# Per process: each stage's gate and cache for one source, for the job it last ran. The
# driver fills it before a local map forks (workers inherit the compiled gates); a Ray
# worker fills it on its first task of a job.
_PREPARED: dict[tuple[str, str, str], tuple[Any, FileResultCache | None]] = {}


def _prepared(job: GateJob, link: Link, output: Output) -> tuple[Any, FileResultCache | None]:
    key = (job.token, link.stage.name, output.source)
    if key not in _PREPARED:
        if any(k[0] != job.token for k in _PREPARED):
            _PREPARED.clear()  # a new job: the last one's gates are done with
        prepared = _prepare_as_recorded(link, output)
        _PREPARED[key] = (prepared.gate, _cache(link.ctx, link.stage, output, prepared))
    return _PREPARED[key]


def _prepare_as_recorded(link: Link, output: Output) -> PreparedGate:
    """The link's gate for `output`'s source, prepared here; refused unless its salt and
    reads are those the driver recorded."""
    ctx, stage = link.ctx, link.stage
    assert stage.gate is not None
    reading = SourceInputs(ctx, stage, ctx.catalog.source(output.source), ctx.config(stage))
    prepared = stage.gate(reading)
    if prepared.salt != output.salt:
        what = "its salt differs (what it reads besides its input: a request file, the entry)"
        raise GateInputsChanged(stage.name, output.source, what)
    reads = _read_ids(reading.read)
    if reads != output.reads:
        what = f"it read {', '.join(reads) or 'nothing'}, the driver {', '.join(output.reads)}"
        raise GateInputsChanged(stage.name, output.source, what)
    return prepared


def _read_ids(read: Sequence[Manifest]) -> tuple[str, ...]:
    return tuple(f"{m.asset}/{m.partition or '_'}/{m.version}" for m in read)


def _cache(
    ctx: StageContext, stage: Stage, output: Output, prepared: PreparedGate
) -> FileResultCache | None:
    if not prepared.cached:
        return None
    return ctx.file_cache(stage, output.code_version, prepared.salt, output.source)


def gate_slice(job: GateJob, task: SliceTask) -> list[SliceResult]:
    """One slice through the stage's gate, then through each gate ahead on the rows the one
    before it kept; each one's outputs written into its own new version. The slice's text
    is read from the store once, whatever the number of gates."""
    started = time.perf_counter()
    table, places = slices.read_located(job.links[0].ctx.store, task.pieces)
    results: list[SliceResult] = []
    for link in job.links:
        output = link.outputs[task.output]
        gate, cache = _prepared(job, link, output)
        result, stats = gate_table(table, gate, link.stage, cache)
        tables, table, places = _write(link, output, task.index, result, table, places)
        now = time.perf_counter()
        note = _shard_note(result, tables[output.table])
        results.append(SliceResult(tables, stats, now - started, note))
        started = now
    return results


def _shard_note(
    result: GateResult, kept: tuple[pa.Schema, ShardInfo | None, WrittenSchema | None]
) -> tuple[str, ShardScan] | None:
    """The note of the kept rows' shard, when the gate vouched for any text in it."""
    digests, shard = result.scanned_clean, kept[1]
    if digests is None or shard is None or len(digests) != shard.rows:
        return None
    if all(d is None for d in digests):
        return None
    return shard.path, ShardScan.of(digests)


def _write(
    link: Link,
    output: Output,
    index: int,
    result: GateResult,
    source: pa.Table,
    places: TextPlaces,
) -> tuple[
    dict[str, tuple[pa.Schema, ShardInfo | None, WrittenSchema | None]], pa.Table, TextPlaces
]:
    """A gate's result on one slice (`source`, its text held where `places` says) written
    into its version; returns what was written, the kept rows (the next gate's input) and
    where their text is held. A kept row whose text is its input row's is written without
    it, naming where it is held (storage/text_refs.py): the text is written once, by the
    gate that made it."""
    stage = link.stage
    assert stage.schema is not None
    uploader = ShardUploader(link.ctx.store, output.dir)
    outputs = [
        (output.table, result.kept, stage.schema),
        ("ledger", result.dropped, ledger.LEDGER_SCHEMA),
        *((n, t, stage.side_tables.get(n, t.schema)) for n, t in result.extra.items()),
    ]
    tables: dict[str, tuple[pa.Schema, ShardInfo | None, WrittenSchema | None]] = {}
    kept = result.kept
    kept_places = TextPlaces.nowhere(kept.num_rows)
    for name, out, schema in outputs:
        out = conform(out, schema, f"{output.dir}: table {name!r}")
        if name == output.table:
            kept = out
        shard: ShardInfo | None = None
        written: WrittenSchema | None = None
        if out.num_rows:
            prefix = "part" if name == layout.DATA else name.replace(":", "-")
            relpath = f"{prefix}-{index:05d}.parquet"
            if name == output.table:  # the kept rows: their text named where it is held
                shard, written, kept_places = uploader.write_kept(relpath, out, source, places)
            else:
                shard, written = uploader.write_parquet(relpath, out)
        tables[name] = (schema, shard, written)
    return tables, kept, kept_places


@dataclass
class _Pending:
    """A version being filled by tasks: the outputs (sources) it holds, in order."""

    version: VersionWriter
    sources: list[str]
    upstream: list[Manifest]
    extra: dict[str, Any]
    salts: list[str] = field(default_factory=list)  # its gates' (one per source it holds)
    stats: Counter[str] = field(default_factory=Counter)
    tasks_left: int = 0
    nodes: MapStats = field(default_factory=MapStats)  # where this version's tasks ran
    notes: dict[str, ShardScan] = field(default_factory=dict)  # SliceResult.note, by shard


@dataclass
class _Staged:
    """A version a pass wrote ahead of its stage's step, waiting for it: what it was
    computed from, for the step to confirm before it commits it."""

    pending: _Pending
    head: str  # the stage whose pass wrote it
    input_dir: str  # the version of the stage's input it was computed from
    run_id: str | None
    code_version: str
    config_hash: str


# Per process, by the partition's folder in the store: the versions passes wrote ahead.
_STAGED: dict[str, _Staged] = {}


def run_gate_stage(
    ctx: StageContext, stage: Stage, partitions: Sequence[str | None], executor: Executor
) -> Iterator[Materialized]:
    """`stage`'s gate over `partitions` (sources, or [None] for a corpus-wide gate) on
    `executor`; yields each committed partition. A partition a pass already wrote this
    stage's version for is committed first, without running the gate again."""
    assert stage.gate is not None and stage.input is not None
    sources = [p for p in partitions if p] if stage.per_source else ctx.sources()
    if stage.per_source:
        left: list[str] = []
        for source in sources:
            staged = _take_staged(ctx, stage, source)
            if staged is None:
                left.append(source)
            else:
                ctx.log(f"{stage.name} [{source}]: {staged.head}'s pass wrote this version")
                yield _commit(ctx, stage, staged.pending, executor)
        if not left and sources:
            return
        sources = left
    # the head gate of each source, built in the driver: its reads and salt say whether the
    # latest version still stands (pipeline/reuse.py); if not, the map below uses it
    heads: dict[str, tuple[SourceInputs, PreparedGate]] = {}
    for source in sources:
        reading = SourceInputs(ctx, stage, ctx.catalog.source(source), ctx.config(stage))
        heads[source] = (reading, stage.gate(reading))
    for partition in list(sources) if stage.per_source else [None]:
        mine = [partition] if partition else sources
        reads = [ctx.latest(stage.input, s) for s in mine]
        reads += [m for s in mine for m in heads[s][0].read]
        salts = [heads[s][1].salt for s in mine]
        standing = reuse.standing(
            ctx, stage, partition, reuse.inputs_id(ctx, stage, partition, reads, salts)
        )
        if standing is None:
            continue
        where = f" [{partition}]" if partition else ""
        ctx.log(f"{stage.name}{where}: its inputs are those of {standing.version}, which stands")
        yield Materialized(
            partition,
            {**file_stage_metadata(ctx, standing, stage, standing.stats), "reused": True},
            standing.stats,
        )
        sources = [s for s in sources if s not in mine]
    if not sources:
        return
    stages = [stage]
    for name in ctx.registry.pass_after(stage):  # the gates ahead this pass runs too
        if name not in ctx.ahead:
            break
        stages.append(ctx.registry.get(name))
    links: list[Link] = []
    pending: list[list[_Pending]] = [[] for _ in stages]  # per link, its versions
    owner: list[int] = []  # each output's pending version
    inputs: list[tuple[Manifest, str]] = []
    gates: list[list[PreparedGate]] = [[] for _ in stages]
    closing: list[Any] = []  # the map's generator, closed if this fails
    token = ""
    try:
        for k, s in enumerate(stages):
            s_ctx = ctx.for_stage(s)
            code_version = s_ctx.code_version(s)
            config = s_ctx.config(s)
            outputs: list[Output] = []
            for source in sources:
                if k == 0:
                    reading, gate = heads[source]
                else:
                    reading = SourceInputs(s_ctx, s, ctx.catalog.source(source), config)
                    assert s.gate is not None
                    gate = s.gate(reading)  # the driver's copy: what it reads, salt, extras
                versions = pending[k]
                if s.per_source or not versions:
                    partition = source if s.per_source else None
                    if k:  # written ahead: a staged version this partition had goes now
                        _drop_staged(ctx.store.partition_dir(s.name, partition))
                    versions.append(
                        _Pending(s_ctx.begin(s, partition, config), [], [], dict(gate.extra))
                    )
                    token = token or versions[-1].version.dir
                current = versions[-1]
                current.sources.append(source)
                current.salts.append(gate.salt)
                read = list(reading.read)
                if k == 0:
                    upstream = ctx.latest(stage.input, source)
                    read.insert(0, upstream)
                    inputs.append((upstream, ctx.input_table(stage, source)))
                    owner.append(len(versions) - 1)
                for m in read:
                    if all(
                        (m.asset, m.partition, m.version) != (u.asset, u.partition, u.version)
                        for u in current.upstream
                    ):
                        current.upstream.append(m)
                table = layout.data_table(None if s.per_source else source)
                outputs.append(
                    Output(
                        source,
                        table,
                        current.version.dir,
                        code_version,
                        gate.salt,
                        _read_ids(reading.read),
                    )
                )
                gates[k].append(gate)
            links.append(
                Link(replace(s_ctx, log=_ignore, workers=1, ahead=frozenset()), s, tuple(outputs))
            )
        job = GateJob(tuple(links), token)
        if not executor.distributed:  # forked workers inherit the driver's compiled gates
            for link, link_gates in zip(links, gates, strict=True):
                for output, gate in zip(link.outputs, link_gates, strict=True):
                    key = (token, link.stage.name, output.source)
                    _PREPARED[key] = (gate.gate, _cache(link.ctx, link.stage, output, gate))
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
        for versions in pending:  # a gate ahead runs per source: its versions pair with these
            for v, p in enumerate(versions):
                p.tasks_left = numbered[v]
        done = 0
        results = executor.map_timed(gate_slice, job, tasks)
        closing.append(results)
        for task, timed in zip(tasks, results, strict=True):
            v = owner[task.output]
            for versions, s, result in zip(pending, stages, timed.value, strict=True):
                p = versions[v]
                p.nodes.count(timed.node, result.busy_s)
                _adopt(p, s, result)
                p.tasks_left -= 1
            while done < len(pending[0]) and pending[0][done].tasks_left == 0:
                yield _commit(ctx, stage, pending[0][done], executor)
                _stage_ahead(ctx, stages, pending, done)
                done += 1
        while done < len(pending[0]):  # versions with no slice at all (an empty input)
            yield _commit(ctx, stage, pending[0][done], executor)
            _stage_ahead(ctx, stages, pending, done)
            done += 1
    except BaseException:
        for results in closing:  # its workers end now, not when the process exits
            results.close()
        for versions in pending:
            for p in versions:
                if not p.version.closed and p.version.dir not in _staged_dirs():
                    p.version.abort()
        raise
    finally:
        for key in [k for k in _PREPARED if k[0] == token]:
            del _PREPARED[key]


def _stage_ahead(
    ctx: StageContext, stages: list[Stage], pending: list[list[_Pending]], v: int
) -> None:
    """Leave the versions the gates ahead wrote for version `v` to their own steps."""
    for k in range(1, len(stages)):
        s, p = stages[k], pending[k][v]
        partition = p.sources[0]
        _STAGED[ctx.store.partition_dir(s.name, partition)] = _Staged(
            p,
            head=stages[0].name,
            input_dir=pending[k - 1][v].version.dir,
            run_id=ctx.run_id,
            code_version=p.version.manifest.code_version,
            config_hash=p.version.manifest.config_hash or "",
        )


def _staged_dirs() -> set[str]:
    return {staged.pending.version.dir for staged in _STAGED.values()}


def _drop_staged(key: str) -> None:
    staged = _STAGED.pop(key, None)
    if staged is not None and not staged.pending.version.closed:
        staged.pending.version.abort()


def _take_staged(ctx: StageContext, stage: Stage, source: str) -> _Staged | None:
    """The version a pass wrote ahead for `stage` and `source`, if it still stands: computed
    in this run from the input's latest version, at this code and config, from reads that
    are all still the latest, by a gate whose salt is the one it would have now (what it
    reads of the catalog's entry and of its request files). One that does not is dropped
    (the gate runs again)."""
    key = ctx.store.partition_dir(stage.name, source)
    staged = _STAGED.get(key)
    if staged is None:
        return None
    assert stage.input is not None
    p = staged.pending
    upstream = ctx.latest(stage.input, source)
    why = None
    if ctx.store.version_dir(upstream) != staged.input_dir:
        why = "its input has a newer version"
    elif staged.run_id != ctx.run_id:
        why = "another run wrote it"
    elif (staged.code_version, staged.config_hash) != (
        ctx.code_version(stage),
        config_hash(ctx.config(stage)),
    ):
        why = "the stage's code or config changed"
    elif any(
        content_id(ctx.store.latest(m.asset, m.partition)) != content_id(m) for m in p.upstream
    ):
        why = "a version its gate read has a newer one"  # newer and not the same content
    elif p.salts != [_salt_now(ctx, stage, source)]:
        why = "what its gate reads besides its input changed (the source's entry, a request)"
    if why is not None:
        ctx.log(f"{stage.name} [{source}]: the version written ahead is dropped: {why}")
        _drop_staged(key)
        return None
    del _STAGED[key]
    p.upstream.insert(0, upstream)
    return staged


def _salt_now(ctx: StageContext, stage: Stage, source: str) -> str:
    """The salt of `stage`'s gate for `source` prepared now, from the catalog this step
    loaded (a step may see another sources.yaml, or request file, than the pass did)."""
    assert stage.gate is not None
    reading = SourceInputs(ctx, stage, ctx.catalog.source(source), ctx.config(stage))
    return stage.gate(reading).salt


def _adopt(p: _Pending, stage: Stage, result: SliceResult) -> None:
    p.stats.update(result.stats)
    if result.note is not None:
        p.notes[result.note[0]] = result.note[1]
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
    partition = p.sources[0] if stage.per_source else None
    inputs = reuse.inputs_id(ctx, stage, partition, p.upstream, p.salts)
    manifest = p.version.commit(
        upstream=ctx.upstream_hashes(p.upstream),
        stats=stats,
        extra={
            **p.extra,
            **executor.describe(),
            "engine_nodes": p.nodes.figures(),
            reuse.INPUTS: inputs,
        },
    )
    note_gate_scan(ctx.store, manifest, p.notes)
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
        result, hits = cached_gate_call(cache, table, keys, gate, schemas, stage.cache_from)
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
