"""The ray engine for per-file stages: one Ray task per slice of an input shard, on any node.

A task gets the slice's address (the input version's folder, a shard name, a row range), not
its text: it reads the rows from the store, runs the stage's gate on them (cached per file
like the local engine), and puts the kept rows, ledger rows and side tables straight into
the new version's folder under names that are unique per slice (`part-<slice>.parquet`), so
a retried task rewrites the same objects. Only those shards' names, sizes and sha256, the
counters and where and how long the task ran come back. The driver (the Dagster step)
adopts the shards in input order and commits: the version lists the same rows in the same
order as a local run, so every stage after it, and the snapshot, come out the same.

Every partition's tasks are submitted before the first is collected, so a stage over many
small sources keeps the whole cluster busy; results are still committed source by source in
catalog order. A task whose worker or node dies is retried by Ray (`max_retries`); a task
that raises (a gate error naming a file) fails the step.
"""

from __future__ import annotations

import itertools
import math
import os
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from megacpp_pipeline.core import ledger
from megacpp_pipeline.corpus import dedup, minhash
from megacpp_pipeline.pipeline.context import SourceInputs, StageContext
from megacpp_pipeline.pipeline.engine import Engine
from megacpp_pipeline.pipeline.memory import bound_malloc
from megacpp_pipeline.pipeline.parallel import default_workers
from megacpp_pipeline.pipeline.registry import Materialized, Stage
from megacpp_pipeline.pipeline.runner import ACCOUNTING_STATS, file_stage_metadata, gate_table
from megacpp_pipeline.storage.file_cache import FileResultCache
from megacpp_pipeline.storage.store import (
    Manifest,
    ShardInfo,
    ShardStore,
    ShardUploader,
    StoreError,
    VersionWriter,
    conform,
)

try:
    import ray
except ImportError as e:  # the `ray` extra is optional
    raise ImportError("the ray engine needs Ray: pip install -e '.[ray]' (ray==2.60.0)") from e

TASK_RETRIES = 3  # a task whose worker or node died runs again elsewhere, this many times


def connect(engine: Engine) -> None:
    """Join the engine's cluster once per process; with no address (and no RAY_ADDRESS), a
    local Ray instance sized to this machine, on loopback."""
    if ray.is_initialized():
        return
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    kwargs: dict[str, Any] = {"log_to_driver": False, "configure_logging": False}
    if engine.address:
        ray.init(address=engine.address, **kwargs)
    else:
        # Ray otherwise resolves the host's own address, which a sandboxed or firewalled
        # host may not route back to itself; a local instance needs nothing beyond loopback.
        ray.init(
            num_cpus=default_workers(),
            include_dashboard=False,
            _node_ip_address="127.0.0.1",
            **kwargs,
        )


def release() -> None:
    """Leave the cluster (a local instance ends with it), e.g. before this process forks."""
    if ray.is_initialized():
        ray.shutdown()


@dataclass(frozen=True)
class FileJob:
    """What every task of one (stage, source) version needs; put into Ray's store once."""

    ctx: StageContext
    stage: str
    source: str
    code_version: str
    input_dir: str  # the input version's folder in the store
    output_dir: str  # the new version's folder


@dataclass
class SliceResult:
    index: int
    tables: dict[str, tuple[pa.Schema, ShardInfo | None, pa.Schema | None]]
    stats: Counter[str]
    node: str
    busy_s: float


@dataclass
class NodeWork:
    tasks: int = 0
    busy_s: float = 0.0
    slices: list[int] = field(default_factory=list)


# per worker process: the gate prepared for the job it last ran (a job's tasks share it)
_PREPARED: dict[str, tuple[Any, Stage, FileResultCache]] = {}


def _prepared(job: FileJob) -> tuple[Any, Stage, FileResultCache]:
    bound_malloc()  # once per worker process
    if job.output_dir not in _PREPARED:
        _PREPARED.clear()
        ctx = job.ctx
        stage = ctx.registry.get(job.stage)
        assert stage.gate is not None
        spec = ctx.catalog.source(job.source)
        prepared = stage.gate(SourceInputs(ctx, stage, spec, ctx.config(stage)))
        cache = ctx.file_cache(stage, job.code_version, prepared.salt, job.source)
        _PREPARED[job.output_dir] = (prepared.gate, stage, cache)
    return _PREPARED[job.output_dir]


@ray.remote(max_retries=TASK_RETRIES, num_cpus=1)
def _file_task(job: FileJob, index: int, shard: str, lo: int, hi: int) -> SliceResult:
    started = time.perf_counter()
    gate, stage, cache = _prepared(job)
    assert stage.schema is not None
    store = job.ctx.store
    path = f"{job.input_dir}/{shard}"
    try:
        table = pq.read_table(path, filesystem=store.fs).slice(lo, hi - lo)
    except (OSError, pa.ArrowInvalid) as e:
        raise StoreError(f"{path}: unreadable shard ({e})") from e
    result, stats = gate_table(table, gate, stage, cache)
    outputs = [
        ("data", result.kept, stage.schema),
        ("ledger", result.dropped, ledger.LEDGER_SCHEMA),
        *((n, t, stage.side_tables.get(n, t.schema)) for n, t in result.extra.items()),
    ]
    uploader = ShardUploader(store, job.output_dir)
    tables: dict[str, tuple[pa.Schema, ShardInfo | None, pa.Schema | None]] = {}
    for name, out, schema in outputs:
        out = conform(out, schema, f"{job.output_dir}: table {name!r}")
        info: ShardInfo | None = None
        written: pa.Schema | None = None
        if out.num_rows:
            prefix = "part" if name == "data" else name.replace(":", "-")
            info, written = uploader.write_parquet(f"{prefix}-{index:05d}.parquet", out)
        tables[name] = (schema, info, written)
    node = ray.get_runtime_context().get_node_id()
    return SliceResult(index, tables, stats, node, time.perf_counter() - started)


def slices(rows: int, nbytes: int, task_bytes: int) -> list[tuple[int, int]]:
    """Row ranges of one shard, about `task_bytes` of it each, none empty."""
    if rows == 0:
        return []
    parts = max(1, min(rows, math.ceil(nbytes / max(1, task_bytes))))
    cuts = [round(rows * k / parts) for k in range(parts + 1)]
    return [(lo, hi) for lo, hi in itertools.pairwise(cuts) if hi > lo]


@dataclass
class _Pending:
    source: str
    stage: Stage
    version: VersionWriter
    upstream: list[Any]
    extra: dict[str, Any]
    refs: list[Any]


def _submit(ctx: StageContext, stage: Stage, source: str) -> _Pending:
    assert stage.gate is not None and stage.input is not None and stage.schema is not None
    spec = ctx.catalog.source(source)
    config = ctx.config(stage)
    upstream = ctx.latest(stage.input, source)
    inputs = SourceInputs(ctx, stage, spec, config)
    prepared = stage.gate(inputs)  # the driver's copy: what it reads, its salt and extras
    code_version = ctx.code_version(stage)
    version = ctx.store.begin(
        stage.name, source, code_version=code_version, config=config, run_id=ctx.run_id
    )
    job = FileJob(
        ctx=replace(ctx, log=_ignore, workers=1),
        stage=stage.name,
        source=source,
        code_version=code_version,
        input_dir=ctx.store.version_dir(upstream),
        output_dir=version.dir,
    )
    job_ref = ray.put(job)
    refs = []
    info = upstream.tables.get(ctx.input_table(stage, source))
    index = 0
    for shard in info.shards if info is not None else []:
        for lo, hi in slices(shard.rows, shard.bytes, ctx.engine.task_bytes):
            refs.append(_file_task.remote(job_ref, index, shard.path, lo, hi))
            index += 1
    return _Pending(source, stage, version, [upstream, *inputs.read], dict(prepared.extra), refs)


def _ignore(message: str) -> None:
    pass


def _collect(ctx: StageContext, pending: _Pending) -> Materialized:
    stage, version = pending.stage, pending.version
    assert stage.schema is not None
    stats: Counter[str] = Counter(dict.fromkeys((*ACCOUNTING_STATS, "input_bytes"), 0))
    version.table("data", stage.schema)  # both exist even when no slice wrote a row
    version.table("ledger", ledger.LEDGER_SCHEMA)
    nodes: dict[str, NodeWork] = {}
    try:
        results: list[SliceResult] = ray.get(pending.refs)
        for res in sorted(results, key=lambda r: r.index):
            stats.update(res.stats)
            for name, (schema, shard, written) in res.tables.items():
                writer = version.table(name, schema)
                if shard is not None and written is not None:
                    writer.adopt(shard, written)
            _count(nodes, res.node, res.busy_s)
        node_figures = _node_figures(nodes)
        manifest = version.commit(
            upstream=ctx.upstream_hashes(pending.upstream),
            stats=stats,
            extra={**pending.extra, **ctx.engine.describe(), "engine_nodes": node_figures},
        )
    except BaseException:
        version.abort()
        raise
    ctx.log(
        f"{stage.name} [{pending.source}]: {stats['input_files']} files in, "
        f"{stats['kept_files']} kept, {stats['dropped_files']} dropped "
        f"({len(pending.refs)} ray tasks on {len(nodes)} nodes)"
    )
    metadata = dict(file_stage_metadata(ctx, manifest, stage, stats))
    metadata["engine_nodes"] = node_figures
    return Materialized(pending.source, metadata, stats)


def run_file_partitions(
    ctx: StageContext, stage: Stage, partitions: Sequence[str | None]
) -> Iterator[Materialized]:
    """A per-file stage over `partitions` on the cluster, yielded in partition order."""
    connect(ctx.engine)
    pending: list[_Pending] = []
    try:
        for source in partitions:
            assert source is not None
            pending.append(_submit(ctx, stage, source))
        while pending:
            first = pending.pop(0)
            yield _collect(ctx, first)  # a failed collect aborts its own version
    finally:
        for p in pending:  # not committed: the run failed or stopped early
            for ref in p.refs:
                ray.cancel(ref)
            p.version.abort()


# --- dedup: signatures per slice of a shard, candidates per band partition -----------------


@dataclass(frozen=True)
class SignJob:
    """What every signing task of one dedup version needs; put into Ray's store once."""

    store: ShardStore
    config: dedup.DedupConfig
    work_dir: str  # `<dedup version>/_work` in the store, removed before the commit
    partitions: int  # band rows are split by band_hash % partitions


@dataclass
class SignResult:
    index: int
    docs: int
    shingles: int
    runs: list[tuple[str, str, str]]  # (source, first path, last path) of each source run
    partitions: list[int]  # the band partitions this slice wrote rows to
    stats: Counter[str]
    node: str
    busy_s: float


def _work_name(kind: str, index: int, suffix: str) -> str:
    return f"{kind}/part-{index:05d}.{suffix}"


def _source_runs(table: pa.Table) -> list[tuple[str, str, str]]:
    sources = table["source_id"].to_pylist()
    paths = table["path"].to_pylist()
    runs: list[tuple[str, str, str]] = []
    for i, source in enumerate(sources):
        if not runs or runs[-1][0] != source:
            runs.append((source, paths[i], paths[i]))
        else:
            runs[-1] = (source, runs[-1][1], paths[i])
    return runs


@ray.remote(max_retries=TASK_RETRIES, num_cpus=1)
def _sign_task(
    job: SignJob, index: int, shard_no: int, path: str, lo: int, hi: int, first_doc: int
) -> SignResult:
    started = time.perf_counter()
    bound_malloc()
    store = job.store
    try:
        table = pq.read_table(path, filesystem=store.fs).slice(lo, hi - lo)
    except (OSError, pa.ArrowInvalid) as e:
        raise StoreError(f"{path}: unreadable shard ({e})") from e
    dedup.check_columns(table, shard_no)
    dedup.StreamOrder().check(table["source_id"], table["path"])  # inside the slice
    stats: Counter[str] = Counter()
    signed = list(dedup.sign_table(table, job.config, first_doc, 0, stats))
    uploader = ShardUploader(store, job.work_dir)
    out = f"{job.work_dir}/"
    docs = pa.concat_tables([s.docs for s in signed]) if signed else None
    if docs is not None:
        uploader.write_parquet(_work_name("docs", index, "parquet"), docs)
        sig = b"".join(s.sig.tobytes() for s in signed)
        uploader.upload(out + _work_name("sig", index, "u64"), sig)
        if job.config.verify_candidates:
            shingles = b"".join(s.shingles.tobytes() for s in signed)
            uploader.upload(out + _work_name("shingles", index, "u64"), shingles)
    written: list[int] = []
    bands = [s.bands for s in signed if s.bands is not None]
    if bands:
        for p, rows in dedup.band_partitions(pa.concat_tables(bands), job.partitions):
            uploader.write_parquet(f"bands/p={p:04d}/part-{index:05d}.parquet", rows)
            written.append(p)
    return SignResult(
        index=index,
        docs=table.num_rows,
        shingles=sum(len(s.shingles) for s in signed),
        runs=_source_runs(table),
        partitions=written,
        stats=stats,
        node=ray.get_runtime_context().get_node_id(),
        busy_s=time.perf_counter() - started,
    )


@ray.remote(max_retries=TASK_RETRIES, num_cpus=1)
def _band_task(
    store: ShardStore, folder: str, reps: minhash.I64
) -> tuple[minhash.I64, minhash.I64, str, float]:
    """The candidate pairs of one band partition: its buckets never meet another's."""
    started = time.perf_counter()
    infos = store.fs.get_file_info(pafs.FileSelector(folder))
    files = sorted(i.path for i in infos if i.path.endswith(".parquet"))
    rows = pa.concat_tables(pq.read_table(f, filesystem=store.fs) for f in files)
    frame = pl.from_arrow(rows)
    assert isinstance(frame, pl.DataFrame)
    u, v = dedup.candidate_pairs(frame.lazy(), reps)
    return u, v, ray.get_runtime_context().get_node_id(), time.perf_counter() - started


def find_duplicates(
    ctx: StageContext,
    upstream: Sequence[Manifest],
    config: dedup.DedupConfig,
    work: Path,
    version_dir: str,
) -> tuple[dedup.DedupResult, dict[str, Any]]:
    """dedup.find_duplicates on the cluster, with the same decisions: one task signs each
    slice of an input shard and writes its docs rows, signatures and band rows (split by
    band hash) under `<version_dir>/_work`; one task per band partition returns its
    candidate pairs (integers); the driver fetches the docs rows and signatures into `work`
    and runs the exact groups, the similarity check and union-find over integer ids."""
    connect(ctx.engine)
    store = ctx.store
    work_dir = f"{version_dir}/_work"
    input_rows = sum(m.tables["data"].rows for m in upstream if "data" in m.tables)
    # bounded band rows per partition, and at least one partition per CPU of the cluster
    cpus = int(ray.cluster_resources().get("CPU", 1))
    partitions = dedup.band_partition_count(input_rows, config, at_least=cpus)
    job = ray.put(SignJob(store, config, work_dir, partitions))
    refs: list[Any] = []
    first_doc = shard_no = 0
    for m in upstream:
        info = m.tables.get("data")
        for shard in info.shards if info is not None else []:
            path = f"{store.version_dir(m)}/{shard.path}"
            for lo, hi in slices(shard.rows, shard.bytes, ctx.engine.task_bytes):
                refs.append(_sign_task.remote(job, len(refs), shard_no, path, lo, hi, first_doc))
                first_doc += hi - lo
            shard_no += 1
    nodes: dict[str, NodeWork] = {}
    try:
        signed: list[SignResult] = sorted(ray.get(refs), key=lambda r: r.index)
        order = dedup.StreamOrder()
        stats: Counter[str] = Counter(shards=shard_no)
        for res in signed:
            for source, first, last in res.runs:  # the slices' boundaries, in stream order
                paths = [first] if first == last else [first, last]
                order.check(pa.chunked_array([[source] * len(paths)]), pa.chunked_array([paths]))
            stats.update(res.stats)
            _count(nodes, res.node, res.busy_s)
        n_docs = _fetch_work(store, work_dir, signed, config, dedup.Workdir(work))
        written = sorted({p for res in signed for p in res.partitions})

        def candidates(reps: minhash.I64) -> tuple[minhash.I64, minhash.I64]:
            reps_ref = ray.put(reps)
            band_refs = [
                _band_task.remote(store, f"{work_dir}/bands/p={p:04d}", reps_ref) for p in written
            ]
            parts = []
            for u, v, node, busy in ray.get(band_refs):
                parts.append((u, v))
                _count(nodes, node, busy)
            return dedup.merge_pairs(parts, n_docs)

        result = dedup.decide(dedup.Workdir(work), config, n_docs, stats, candidates)
    finally:
        for ref in refs:
            ray.cancel(ref)
        store.delete_dir(work_dir)
    extra = {
        **ctx.engine.describe(),
        "engine_nodes": _node_figures(nodes),
        "sign_tasks": len(refs),
        "band_partitions": partitions,
    }
    return result, extra


def _count(nodes: dict[str, NodeWork], node: str, busy_s: float) -> None:
    work = nodes.setdefault(node, NodeWork())
    work.tasks += 1
    work.busy_s += busy_s


def _node_figures(nodes: dict[str, NodeWork]) -> dict[str, dict[str, Any]]:
    return {
        node[:12]: {"tasks": w.tasks, "busy_s": round(w.busy_s, 3)}
        for node, w in sorted(nodes.items())
    }


def _fetch_work(
    store: ShardStore,
    work_dir: str,
    signed: list[SignResult],
    config: dedup.DedupConfig,
    work: dedup.Workdir,
) -> int:
    """The slices' docs rows (shingle offsets made global) and signatures, in doc order, into
    the driver's local workdir: per-file metadata and 2 KiB a file, never text."""
    work.reset()
    n_docs = shingle_base = 0
    with open(work.signatures, "wb") as sig_out, open(work.shingles, "wb") as shingle_out:
        for res in signed:
            if not res.docs:
                continue
            docs = pq.read_table(
                f"{work_dir}/{_work_name('docs', res.index, 'parquet')}", filesystem=store.fs
            )
            offsets = pc.add(docs["shingle_offset"], shingle_base)
            docs = docs.set_column(
                docs.schema.get_field_index("shingle_offset"), "shingle_offset", offsets
            )
            pq.write_table(docs, work.docs / f"part-{res.index:05d}.parquet")
            _copy_object(store, f"{work_dir}/{_work_name('sig', res.index, 'u64')}", sig_out)
            if config.verify_candidates:
                _copy_object(
                    store, f"{work_dir}/{_work_name('shingles', res.index, 'u64')}", shingle_out
                )
            n_docs += res.docs
            shingle_base += res.shingles
    return n_docs


def _copy_object(store: ShardStore, path: str, out: Any) -> None:
    with store.fs.open_input_stream(path) as f:
        while chunk := f.read(8 << 20):
            out.write(chunk)
