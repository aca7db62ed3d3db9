"""documents: what a training document is, and its global doc_id. In file mode (the default)
each kept file is one document; in repository mode (`stages: {documents: {mode: repository}}`)
a source's kept files are concatenated in #include order, each after a `// <path>` marker
line, split along directories past `max_tokens` (corpus/repository). Either way every kept
file gets a `document_files` row saying which document holds it, at which position and
token span, so a file stays traceable whatever a document is.

doc_ids run in catalog order, then document order within a source (path order in file mode:
the ids file-level snapshots always had). Each source's documents of each split go to a table
of their own (`data:<source>:<split>`, the token streams the packer reads split by split).
File mode is one task per slice of the tokenized files, each numbering its documents from the
slice's first row; repository mode is one task per source (its include graph needs all of its
files), after a first map that counts each source's documents so ids stay 0..N-1.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from megacpp_pipeline.core.identity import NONE, Sums, added, identity_sums
from megacpp_pipeline.core.row_runs import rows_where
from megacpp_pipeline.core.schemas import DOCUMENT_FILES, DOCUMENT_TOKENS, DOCUMENTS
from megacpp_pipeline.corpus import repository
from megacpp_pipeline.corpus.repository import DocumentMode, DocumentsConfig
from megacpp_pipeline.gates.build_context import LOCAL_PATH
from megacpp_pipeline.pipeline.context import StageContext
from megacpp_pipeline.pipeline.executor import Executor, ending
from megacpp_pipeline.pipeline.metadata import summary_metadata
from megacpp_pipeline.pipeline.registry import Check, CheckOutcome, Grain, Materialized, Stage
from megacpp_pipeline.snapshot import layout
from megacpp_pipeline.stages import names
from megacpp_pipeline.stages.tokenize import load_artifact
from megacpp_pipeline.storage import slices
from megacpp_pipeline.storage.store import (
    Manifest,
    ShardInfo,
    ShardStore,
    ShardUploader,
    VersionWriter,
    WrittenSchema,
)

# include statistics a repository build counts, summed over sources into the version's stats
_INCLUDE_STATS = (
    "marker_tokens",
    "oversized_files",
    "edges_inside_documents",
    "broken_edges",
    "cycle_files",
)


def file_documents(table: pa.Table, first_doc_id: int) -> pa.Table:
    """tokenized_docs rows as one-file documents numbered from `first_doc_id`."""
    n = table.num_rows
    offsets = pa.array(np.arange(n + 1, dtype=np.int32))
    extra = {
        "doc_id": pa.array(np.arange(first_doc_id, first_doc_id + n, dtype=np.int32)),
        "num_files": pa.array(np.ones(n, np.int32)),
        "member_starts": pa.ListArray.from_arrays(offsets, pa.array(np.zeros(n, np.int32))),
    }
    return _as_document_tokens(table, extra)


def _as_document_tokens(table: pa.Table, extra: dict[str, pa.Array]) -> pa.Table:
    missing = [
        f.name for f in DOCUMENT_TOKENS if f.name not in extra and f.name not in table.schema.names
    ]
    if missing:
        raise ValueError(f"tokenized_docs rows lack columns {missing} the documents need")
    columns = [extra[f.name] if f.name in extra else table.column(f.name) for f in DOCUMENT_TOKENS]
    return pa.table(columns, schema=DOCUMENT_TOKENS)


def include_roots(ctx: StageContext, source: str) -> list[str] | None:
    """The source's include directories from its compile database (what enrich recorded per
    file, most used first, then the source root), or None when it has none (then
    corpus/repository's usual include/, src/ and root)."""
    counts: Counter[str] = Counter()
    manifest = ctx.latest(names.ENRICHED_FILES, source)
    for t in ctx.store.iter_tables(manifest, columns=["build_context"]):
        for context in t["build_context"].to_pylist():
            for root in (context or {}).get("include_roots") or ():
                if root != LOCAL_PATH:
                    counts[root] += 1
    if not counts:
        return None
    ranked = sorted(counts, key=lambda r: (-counts[r], r))
    return [*ranked, *([""] if "" not in counts else [])]


def _texts(ctx: StageContext, source: str, paths: Sequence[str]) -> pa.Array:
    """The enriched text of each path (what was tokenized), for include scanning: reading
    it is cheaper than decoding the tokens back."""
    wanted = set(paths)
    text: dict[str, str] = {}
    manifest = ctx.latest(names.ENRICHED_FILES, source)
    for t in ctx.store.iter_tables(manifest, columns=["path", "text"]):
        for p, s in zip(t["path"].to_pylist(), t["text"].to_pylist(), strict=True):
            if p in wanted:
                text[p] = s
    return pa.array([text[p] for p in paths], pa.string())


SPLITS = layout.SPLITS
FILES_TABLE = "document_files"


def split_table(source: str, split: str) -> str:
    """The documents version's table of one source's documents of one split (the packer
    reads a split's tables without touching the other's)."""
    return layout.data_table(f"{source}:{split}")


def split_tables(manifest: Manifest, sources: Sequence[str], split: str) -> list[str]:
    """A split's tables in catalog order: the split's documents in doc_id order."""
    return [t for s in sources if (t := split_table(s, split)) in manifest.tables]


@dataclass(frozen=True)
class _Job:
    ctx: StageContext
    config: DocumentsConfig
    out_dir: str
    first_ids: Mapping[str, int] = field(default_factory=dict)  # repository mode, per source


@dataclass(frozen=True)
class _FileSlice:
    index: int
    source: str
    pieces: tuple[slices.Piece, ...]
    first_doc: int


@dataclass
class _Written:
    """A task's shards and what it counted: documents per length, the build's stats."""

    shards: list[tuple[str, pa.Schema, ShardInfo, WrittenSchema]]
    lengths: dict[int, int]
    stats: Counter[str]
    broken: list[str] = field(default_factory=list)


def _shard_name(table: str, task: int) -> str:
    """The shard of `table` that task number `task` writes: a task's documents and its
    document_files rows share the number (the check pairs them by it, `_task_of`)."""
    return f"{table.replace(':', '-')}-{task:05d}.parquet"


def _task_of(shard: ShardInfo) -> int:
    return int(shard.path.removesuffix(".parquet").rsplit("-", 1)[1])


def _write(job: _Job, index: int, source: str, docs: pa.Table, files: pa.Table) -> _Written:
    uploader = ShardUploader(job.ctx.store, job.out_dir)
    shards = []
    split = docs["split"]
    for name in SPLITS:
        part = rows_where(docs, pc.equal(split, name).to_numpy(zero_copy_only=False))
        if part.num_rows:
            table = split_table(source, name)
            shard, written = uploader.write_parquet(_shard_name(table, index), part)
            shards.append((table, DOCUMENT_TOKENS, shard, written))
    if files.num_rows:
        shard, written = uploader.write_parquet(_shard_name(FILES_TABLE, index), files)
        shards.append((FILES_TABLE, DOCUMENT_FILES, shard, written))
    return _Written(shards, repository.length_counts(docs["num_tokens"]), Counter())


def _file_task(job: _Job, task: _FileSlice) -> _Written:
    """A slice of one source's tokenized files as one-file documents."""
    table = slices.read(job.ctx.store, task.pieces)
    docs = file_documents(table, task.first_doc)
    out = _write(job, task.index, task.source, docs, repository.file_document_files(docs))
    out.stats["input_files"] = table.num_rows
    return out


def _build(job: _Job, source: str) -> repository.RepositoryDocuments:
    ctx = job.ctx
    m = ctx.latest(names.TOKENIZED_DOCS, source)
    files = pa.concat_tables(list(ctx.store.iter_tables(m)))
    files = files.append_column("text", _texts(ctx, source, files["path"].to_pylist()))
    tok = load_artifact(ctx)[0]
    return repository.build_repository_documents(files, tok, job.config, include_roots(ctx, source))


def _count_task(job: _Job, source: str) -> int:
    """How many repository documents a source makes (the ids of the next source start
    after them)."""
    return (
        _build(job, source).documents.num_rows
        if job.ctx.latest(names.TOKENIZED_DOCS, source).rows
        else 0
    )


def _repository_task(job: _Job, task: tuple[int, str]) -> _Written:
    """One source's kept files as repository documents, numbered from its first id."""
    index, source = task
    first = job.first_ids[source]
    if job.ctx.latest(names.TOKENIZED_DOCS, source).rows == 0:
        return _Written([], {}, Counter())
    built = _build(job, source)
    ids = pa.array(np.arange(first, first + built.documents.num_rows, dtype=np.int32))
    docs = _as_document_tokens(built.documents, {"doc_id": ids})
    out = _write(job, index, source, docs, built.document_files_from(first))
    out.stats.update({k: int(built.stats[k]) for k in _INCLUDE_STATS})
    for k in ("directives", "edges", "external"):  # #include lines, resolved, not found
        out.stats[f"include_{k}"] += int(built.stats.get(k, 0))
    out.stats["input_files"] = int(pc.sum(built.documents["num_files"]).as_py() or 0)
    out.broken = [f"{source}: {a} includes {b}" for a, b in built.broken_edges()]
    return out


def _body(ctx: StageContext, stage: Stage, partition: str | None) -> Materialized:
    assert stage.input is not None
    config: DocumentsConfig = ctx.config(stage)
    sources = ctx.sources()
    upstream = [ctx.latest(stage.input, s) for s in sources]
    executor = ctx.executor()
    version = ctx.begin(stage, None, config)
    with version:
        job = _Job(replace(ctx, log=_ignore), config, version.dir)
        results: Iterator[_Written]
        if config.mode is DocumentMode.REPOSITORY:
            counts = list(executor.map(_count_task, job, sources))
            firsts = np.concatenate([[0], np.cumsum(counts)]).astype(int).tolist()
            job = replace(job, first_ids=dict(zip(sources, firsts, strict=False)))
            results = executor.map(_repository_task, job, list(enumerate(sources)))
        else:
            results = executor.map(_file_task, job, _file_plan(ctx, upstream, executor.workers))
        for s in sources:  # every table exists, even with no document in it
            for split in SPLITS:
                version.table(split_table(s, split), DOCUMENT_TOKENS)
        version.table("document_files", DOCUMENT_FILES)
        stats: Counter[str] = Counter(
            dict.fromkeys(("input_files", "documents", *_INCLUDE_STATS), 0)
        )
        lengths: Counter[int] = Counter()
        broken: list[str] = []
        with ending(results):  # a failure here ends the tasks before the version is aborted
            for out in results:
                for table, schema, shard, written in out.shards:
                    version.table(table, schema).adopt(shard, written)
                stats.update(out.stats)
                lengths.update(out.lengths)
                broken += out.broken
        return _commit(ctx, stage, config, version, upstream, stats, lengths, broken, executor)


def _file_plan(ctx: StageContext, upstream: list[Manifest], workers: int) -> list[_FileSlice]:
    """Every source's tokenized files as slices, each with the doc_id of its first file
    (catalog order, then path: the ids file-level snapshots always had)."""
    inputs = [(m, layout.DATA) for m in upstream]
    task_bytes = slices.task_bytes_for(slices.total_bytes(inputs), workers, ctx.engine.task_bytes)
    plan: list[_FileSlice] = []
    first = 0
    for m, table in inputs:
        for s in slices.plan(ctx.store, [(m, table)], task_bytes, first_row=first):
            plan.append(_FileSlice(len(plan), str(m.partition), s.pieces, s.first_row))
            first += s.rows
    return plan


def _commit(
    ctx: StageContext,
    stage: Stage,
    config: DocumentsConfig,
    version: VersionWriter,
    upstream: list[Manifest],
    stats: Counter[str],
    lengths: Counter[int],
    broken: list[str],
    executor: Executor,
) -> Materialized:
    dist = repository.distribution_of_counts(dict(lengths))
    stats["documents"] = dist.documents
    stats["kept_files"] = stats["input_files"]  # every file is in a document
    stats["dropped_files"] = 0
    extra: dict[str, Any] = {
        "mode": str(config.mode),
        "lengths": dist.model_dump(),
        **executor.describe(),
        "engine_nodes": executor.stats.figures(),
    }
    if broken:  # a cycle forced these includers before what they include
        extra["broken_includes"] = broken[:200]
    manifest = version.commit(upstream=ctx.upstream_hashes(upstream), stats=stats, extra=extra)
    meta: dict[str, Any] = {
        "mode": str(config.mode),
        "files": int(stats["input_files"]),
        "documents": int(stats["documents"]),
        "files_per_document": round(stats["input_files"] / max(1, stats["documents"]), 2),
        "tokens_p50": dist.p50,
        "tokens_p90": dist.p90,
        "tokens_max": dist.max,
    }
    if config.mode is DocumentMode.REPOSITORY:
        meta.update(
            max_tokens=config.max_tokens,
            include_edges_inside_documents=int(stats["edges_inside_documents"]),
            include_cycles_broken=int(stats["broken_edges"]),
            marker_tokens=int(stats["marker_tokens"]),
        )
    ctx.log(
        f"{stage.name}: {stats['input_files']} files in {stats['documents']} documents"
        f" ({config.mode} mode)"
    )
    return Materialized(None, summary_metadata(ctx.store, manifest, **meta), stats)


def _ignore(message: str) -> None:
    pass


def documents_stream(ctx: StageContext) -> Iterator[pa.Table]:
    """Every document's metadata (DOCUMENTS, no tokens) in doc_id order, a table per task of
    the stage: its shards of both splits read (and verified), merged and cast by a forked
    worker of this host, a few tasks ahead of the consumer (ids run in catalog order, then
    in task order within a source)."""
    manifest = ctx.latest(names.DOCUMENTS)
    job = _CheckJob(ctx.store, ctx.store.version_dir(manifest))
    yield from ctx.host_executor().stream(_documents_task, job, _split_shards(ctx, manifest))


def _split_shards(
    ctx: StageContext, manifest: Manifest
) -> list[tuple[tuple[ShardInfo, ...], tuple[ShardInfo, ...]]]:
    """Per task of the stage, in doc_id order: its train shards and its validation shards."""
    out = []
    for source in ctx.sources():
        by_task: dict[int, tuple[list[ShardInfo], list[ShardInfo]]] = {}
        for k, split in enumerate(SPLITS):
            table = manifest.tables.get(split_table(source, split))
            for shard in table.shards if table is not None else []:
                by_task.setdefault(_task_of(shard), ([], []))[k].append(shard)
        out += [(tuple(a), tuple(b)) for _, (a, b) in sorted(by_task.items())]
    return out


def _documents_task(
    job: _CheckJob, shards: tuple[tuple[ShardInfo, ...], tuple[ShardInfo, ...]]
) -> pa.Table:
    """One task's documents of both splits, in doc_id order (their ids are distinct)."""
    tables = [
        job.store.read_shard(job.vdir, s, DOCUMENTS.names).cast(DOCUMENTS)
        for part in shards
        for s in part
    ]
    table = pa.concat_tables([DOCUMENTS.empty_table(), *tables])
    return table.take(pc.sort_indices(table, sort_keys=[("doc_id", "ascending")]))


def documents_table(ctx: StageContext, columns: list[str] | None = None) -> pa.Table:
    """Every document's metadata (DOCUMENTS, no tokens; or only `columns`), in doc_id
    order."""
    manifest = ctx.latest(names.DOCUMENTS)
    wanted = columns or DOCUMENTS.names
    schema = pa.schema([DOCUMENTS.field(n) for n in wanted])
    parts = [
        t.select(wanted).cast(schema)
        for name in manifest.data_tables()
        for t in ctx.store.iter_tables(manifest, name, columns=wanted)
    ]
    return pa.concat_tables([schema.empty_table(), *parts]).sort_by("doc_id")


def document_files_table(ctx: StageContext, columns: list[str] | None = None) -> pa.Table:
    manifest = ctx.latest(names.DOCUMENTS)
    wanted = columns or DOCUMENT_FILES.names
    schema = pa.schema([DOCUMENT_FILES.field(n) for n in wanted])
    parts = ctx.store.iter_tables(manifest, "document_files", columns=wanted)
    return pa.concat_tables([schema.empty_table(), *parts]).sort_by(
        [("doc_id", "ascending"), ("position", "ascending")]
    )


# What the check compares, per document and per file (no hashes, no licences).
_DOC_COLUMNS = ["doc_id", "num_files", "num_tokens"]
_FILE_COLUMNS = ["doc_id", "position", "source_id", "path", "start_token", "num_tokens"]


@dataclass(frozen=True)
class _CheckJob:
    store: ShardStore
    vdir: str


@dataclass
class _Proved:
    """One task's documents as the check saw them: their doc_ids first..first+count-1 (or
    count 0), its files per source, the sums of its files' identity hashes, and what is
    wrong."""

    first: int
    count: int
    files: Counter[str]
    sums: Sums
    problems: list[str]


def _check_task(
    job: _CheckJob, shards: tuple[tuple[ShardInfo, ...], tuple[ShardInfo, ...]]
) -> _Proved:
    """The documents one task of the stage wrote (every split) against its document_files."""
    doc_shards, file_shards = shards
    docs = pa.concat_tables(
        [pa.schema([DOCUMENTS.field(c) for c in _DOC_COLUMNS]).empty_table()]
        + [job.store.read_shard(job.vdir, s, _DOC_COLUMNS) for s in doc_shards]
    ).sort_by("doc_id")
    files = pa.concat_tables(
        [pa.schema([DOCUMENT_FILES.field(c) for c in _FILE_COLUMNS]).empty_table()]
        + [job.store.read_shard(job.vdir, s, _FILE_COLUMNS) for s in file_shards]
    )
    first = int(docs["doc_id"][0].as_py()) if docs.num_rows else 0
    ids = files["doc_id"].to_numpy()
    outside = np.flatnonzero((ids < first) | (ids >= first + docs.num_rows))
    problems = []
    if outside.size:
        row = int(outside[0])
        problems.append(
            f"{FILES_TABLE}: {files['source_id'][row]}:{files['path'][row]} is in doc "
            f"{int(ids[row])}, which is not among the documents written with it "
            f"({first}..{first + docs.num_rows - 1})"
        )
        files = files.take(np.flatnonzero((ids >= first) & (ids < first + docs.num_rows)))
    problems += repository.document_files_problems(docs, files, None, first_id=first)
    sources = files["source_id"].to_pylist()
    return _Proved(
        first,
        docs.num_rows,
        Counter(sources),
        identity_sums(sources, files["path"].to_pylist()),
        problems,
    )


def _kept_task(job: _CheckJob, pieces: tuple[slices.Piece, ...]) -> tuple[int, tuple[int, int]]:
    rows = slices.read(job.store, pieces, ["source_id", "path"])
    return rows.num_rows, identity_sums(rows["source_id"].to_pylist(), rows["path"].to_pylist())


def _every_file_in_one_document(
    ctx: StageContext, stage: Stage, partition: str | None
) -> CheckOutcome:
    """Proved a task's output at a time, on the run's executor: the documents each task of
    the stage wrote, against the document_files rows it wrote with them; the driver keeps
    only a few numbers per task. The tasks' doc_id runs must tile 0..N-1; per source as many
    files as tokenized_docs kept, and the same files (equal identity-hash sums over both:
    tokenized_docs holds each file once, so no file is listed twice)."""
    assert stage.input is not None
    manifest = ctx.latest(stage.name)
    vdir = ctx.store.version_dir(manifest)
    by_task: dict[int, tuple[list[ShardInfo], list[ShardInfo]]] = {}
    for name, table in manifest.tables.items():
        if name == FILES_TABLE or name in manifest.data_tables():
            for shard in table.shards:
                by_task.setdefault(_task_of(shard), ([], []))[name == FILES_TABLE].append(shard)
    executor = ctx.executor()
    job = _CheckJob(ctx.store, vdir)
    tasks = [(tuple(d), tuple(f)) for _, (d, f) in sorted(by_task.items())]
    problems: list[str] = []
    files: Counter[str] = Counter()
    sums = NONE
    runs = []
    for proved in executor.map_light(_check_task, job, tasks):
        problems += proved.problems
        files.update(proved.files)
        sums = added([sums, proved.sums])
        if proved.count:
            runs.append((proved.first, proved.count))
    documents = 0
    for first, count in sorted(runs):
        if first != documents:
            problems.append(
                f"documents: doc_ids are not 0..N-1 (the next after {documents - 1} is {first})"
            )
        documents = max(documents, first + count)
    kept_sums = NONE
    kept = {s: ctx.latest(stage.input, s) for s in ctx.sources()}
    inputs = [(m, layout.DATA) for m in kept.values()]
    task_bytes = slices.few_column_task_bytes(
        slices.total_bytes(inputs), executor.workers, ctx.engine.task_bytes
    )
    plan = [p.pieces for p in slices.plan(ctx.store, inputs, task_bytes, cut=False)]
    for _, part in executor.map_light(_kept_task, job, plan):
        kept_sums = added([kept_sums, part])
    miscounted = [s for s, m in kept.items() if files.get(s, 0) != m.rows]
    for source in miscounted:
        problems.append(
            f"{source}: {kept[source].rows} kept files but {files.get(source, 0)} in documents"
        )
    if not miscounted and kept_sums != sums:
        problems.append(
            f"{FILES_TABLE}: as many files per source as {stage.input} kept, but not the same"
            " files (one listed twice, or one that was not kept)"
        )
    return CheckOutcome(
        passed=not problems,
        metadata={
            "documents": documents,
            "files": sum(files.values()),
            "tasks": len(tasks),
            "problems": "; ".join(problems[:5]) or "none",
        },
        description=problems[0] if problems else None,
    )


STAGE = Stage(
    name=names.DOCUMENTS,
    grain=Grain.GLOBAL,
    group="tokens",
    description="What a training document is and its doc_id: one kept file (file mode), or a "
    "source's files concatenated in #include order after `// <path>` markers (repository "
    "mode); document_files says where every kept file sits.",
    input=names.TOKENIZED_DOCS,
    reads=(names.TOKENIZER, names.ENRICHED_FILES),
    config_key="documents",
    config=DocumentsConfig,
    code=(repository.__name__, __name__),
    schema=DOCUMENT_TOKENS,
    side_tables={"document_files": DOCUMENT_FILES},
    body=_body,
    reusable=True,
    checks=(
        Check(
            "every_kept_file_in_one_document",
            "Every file tokenized_docs kept is in exactly one document; each document's "
            "members sit at positions 0..n-1 and their token spans tile it; doc_ids are 0..N-1.",
            _every_file_in_one_document,
        ),
    ),
)
