"""documents: what a training document is, and its global doc_id. In file mode (the default)
each kept file is one document; in repository mode (`stages: {documents: {mode: repository}}`)
a source's kept files are concatenated in #include order, each after a `// <path>` marker
line, split along directories past `max_tokens` (corpus/repository). Either way every kept
file gets a `document_files` row saying which document holds it, at which position and
token span, so a file stays traceable whatever a document is.

doc_ids run in catalog order, then document order within a source (path order in file mode:
the ids file-level snapshots always had). Each source's documents go to a table of their own
(`data:<source>`, the token streams the packer reads). File mode streams shard by shard;
repository mode holds one source's token streams at a time (its include graph needs them all).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from megacpp_pipeline.core.schemas import DOCUMENT_FILES, DOCUMENT_TOKENS, DOCUMENTS
from megacpp_pipeline.corpus import repository
from megacpp_pipeline.corpus.repository import DocumentMode, DocumentsConfig
from megacpp_pipeline.gates.build_context import LOCAL_PATH
from megacpp_pipeline.pipeline.context import StageContext
from megacpp_pipeline.pipeline.registry import Check, CheckOutcome, Grain, Materialized, Stage
from megacpp_pipeline.pipeline.runner import summary_metadata
from megacpp_pipeline.stages.tokenize import load_artifact

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
    manifest = ctx.store.latest("enriched_files", source)
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
    manifest = ctx.store.latest("enriched_files", source)
    for t in ctx.store.iter_tables(manifest, columns=["path", "text"]):
        for p, s in zip(t["path"].to_pylist(), t["text"].to_pylist(), strict=True):
            if p in wanted:
                text[p] = s
    return pa.array([text[p] for p in paths], pa.string())


def _body(ctx: StageContext, stage: Stage, partition: str | None) -> Materialized:
    assert stage.input is not None
    config: DocumentsConfig = ctx.config(stage)
    upstream = [ctx.latest(stage.input, s) for s in ctx.sources()]
    version = ctx.store.begin(
        stage.name, None, code_version=ctx.code_version(stage), config=config, run_id=ctx.run_id
    )
    files_out = version.table("document_files", DOCUMENT_FILES)
    stats: Counter[str] = Counter(dict.fromkeys(("input_files", "documents", *_INCLUDE_STATS), 0))
    lengths: list[np.ndarray] = []
    broken: list[str] = []
    tok = load_artifact(ctx)[0] if config.mode is DocumentMode.REPOSITORY else None
    next_id = 0
    for m in upstream:
        out = version.table(f"data:{m.partition}", DOCUMENT_TOKENS)
        tables: Iterator[pa.Table] = ctx.store.iter_tables(m)
        if tok is None:
            for t in tables:
                docs = file_documents(t, next_id)
                out.write(docs)
                files_out.write(repository.file_document_files(docs))
                next_id += docs.num_rows
                stats["input_files"] += t.num_rows
                lengths.append(t["num_tokens"].to_numpy())
            continue
        files = pa.concat_tables(list(tables)) if m.rows else None
        if files is None or files.num_rows == 0:
            continue
        source = str(m.partition)
        files = files.append_column("text", _texts(ctx, source, files["path"].to_pylist()))
        built = repository.build_repository_documents(
            files, tok, config, include_roots(ctx, source)
        )
        n = built.documents.num_rows
        ids = pa.array(np.arange(next_id, next_id + n, dtype=np.int32))
        out.write(_as_document_tokens(built.documents, {"doc_id": ids}))
        files_out.write(built.document_files_from(next_id))
        next_id += n
        stats["input_files"] += files.num_rows
        lengths.append(built.documents["num_tokens"].to_numpy())
        stats.update({k: int(built.stats[k]) for k in _INCLUDE_STATS})
        for k in ("directives", "edges", "external"):  # #include lines, resolved, not found
            stats[f"include_{k}"] += int(built.stats.get(k, 0))
        broken += [f"{source}: {a} includes {b}" for a, b in built.broken_edges()]
    stats["documents"] = next_id
    stats["kept_files"] = stats["input_files"]  # every file is in a document
    stats["dropped_files"] = 0
    dist = repository.length_distribution(np.concatenate(lengths) if lengths else [])
    extra: dict[str, Any] = {"mode": str(config.mode), "lengths": dist.model_dump()}
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


def documents_table(ctx: StageContext) -> pa.Table:
    """Every document's metadata (DOCUMENTS, no tokens), in doc_id order."""
    manifest = ctx.latest("documents")
    parts = [
        t
        for name in manifest.data_tables()
        for t in ctx.store.iter_tables(manifest, name, columns=DOCUMENTS.names)
    ]
    return pa.concat_tables([DOCUMENTS.empty_table(), *(t.cast(DOCUMENTS) for t in parts)])


def document_files_table(ctx: StageContext) -> pa.Table:
    manifest = ctx.latest("documents")
    return pa.concat_tables(
        [DOCUMENT_FILES.empty_table(), *ctx.store.iter_tables(manifest, "document_files")]
    )


def _every_file_in_one_document(
    ctx: StageContext, stage: Stage, partition: str | None
) -> CheckOutcome:
    kept = {s: ctx.latest(stage.input or "", s).rows for s in ctx.sources()}
    documents = documents_table(ctx)
    files = document_files_table(ctx)
    problems = repository.document_files_problems(documents, files, kept)
    return CheckOutcome(
        passed=not problems,
        metadata={
            "documents": documents.num_rows,
            "files": files.num_rows,
            "problems": "; ".join(problems[:5]) or "none",
        },
        description=problems[0] if problems else None,
    )


STAGE = Stage(
    name="documents",
    grain=Grain.GLOBAL,
    group="tokens",
    description="What a training document is and its doc_id: one kept file (file mode), or a "
    "source's files concatenated in #include order after `// <path>` markers (repository "
    "mode); document_files says where every kept file sits.",
    input="tokenized_docs",
    reads=("tokenizer", "enriched_files"),
    config_key="documents",
    config=DocumentsConfig,
    code=(repository.__name__, __name__),
    schema=DOCUMENT_TOKENS,
    side_tables={"document_files": DOCUMENT_FILES},
    body=_body,
    checks=(
        Check(
            "every_kept_file_in_one_document",
            "Every file tokenized_docs kept is in exactly one document; each document's "
            "members sit at positions 0..n-1 and their token spans tile it; doc_ids are 0..N-1.",
            _every_file_in_one_document,
        ),
    ),
)
