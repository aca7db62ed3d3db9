"""Repository documents as token streams: each member is its path marker's tokens then the
file's own tokens, members in include order; plus the `document_files` rows that say where
every file sits in its document.

The marker belongs to the member it introduces: a member's `start_token` is where its marker
starts and its `num_tokens` counts marker and file, so the members partition the document
(and `member_starts` is what the packer needs to keep FIM inside one file). Marker tokens
get chunk kind 0 ("other"), which structured FIM never picks as a middle.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from tokenizers import Tokenizer

from megacpp_pipeline.core import schemas
from megacpp_pipeline.corpus.repository.config import DocumentsConfig
from megacpp_pipeline.corpus.repository.grouping import PlannedDocument, plan_documents
from megacpp_pipeline.corpus.repository.includes import IncludeGraph, include_graph

MARKER_KIND = 0  # enrich.CHUNK_KINDS["other"]

DOCUMENT_FILES = pa.schema(
    [
        pa.field("doc_id", pa.int32(), nullable=False),
        pa.field("position", pa.int32(), nullable=False),  # 0-based, in document order
        pa.field("source_id", pa.string(), nullable=False),
        pa.field("path", pa.string(), nullable=False),  # the file, relative to the source root
        pa.field("start_token", pa.int32(), nullable=False),  # where its marker starts
        pa.field("num_tokens", pa.int32(), nullable=False),  # marker + file tokens
    ],
    metadata={"megacpp.table": "document_files", "megacpp.schema_version": "1"},
)

# tokenized_docs rows, one per repository document (path = the members' common directory;
# size, blob_sha and content_sha256 are of the document's text, markers included), plus how
# many files it holds and where each starts (the packer's `member_starts` input).
REPOSITORY_DOCUMENTS = pa.schema(
    [
        *schemas.TOKENIZED_DOCS,
        pa.field("num_files", pa.int32(), nullable=False),
        pa.field("member_starts", pa.list_(pa.int32()), nullable=False),
    ],
    metadata={"megacpp.table": "repository_documents", "megacpp.schema_version": "1"},
)
_OPTIONAL = {f.name for f in schemas.CLASS_FIELDS} | {"scrub_kinds"}
_STREAM = {"token_ids", "chunk_kind"}
_REQUIRED_INPUT = {
    "source_id",
    "path",
    "revision",
    "license_expression",
    "license_source",
    "structure_source",
    "split",
    "token_ids",
    "chunk_kind",
}


class RepositoryInputError(ValueError):
    """One source's file table that repository documents cannot be built from."""


def marker_text(path: str) -> str:
    """`// <path>` and a newline. A character that could end the comment line early or join
    the next line to it (a newline, a backslash before the newline) or any other control
    character is written as %XX; ordinary paths read as they are."""
    if all(" " <= c != "\\" and c != "\x7f" for c in path):
        return f"// {path}\n"
    escaped = "".join(f"%{ord(c):02X}" if c < " " or c in "\\\x7f" else c for c in path)
    return f"// {escaped}\n"


@dataclass
class RepositoryDocuments:
    documents: pa.Table  # REPOSITORY_DOCUMENTS, one row per document
    document_files: pa.Table  # DOCUMENT_FILES; doc_id = the document's row in `documents`
    plans: list[PlannedDocument]
    graph: IncludeGraph
    stats: Counter[str]

    def document_files_from(self, first_doc_id: int) -> pa.Table:
        """document_files with global ids, when `documents` row k becomes first_doc_id + k."""
        ids = pc.add(self.document_files.column("doc_id"), pa.scalar(first_doc_id, pa.int32()))
        return self.document_files.set_column(0, DOCUMENT_FILES.field("doc_id"), ids)

    def broken_edges(self) -> list[tuple[str, str]]:
        """(includer, included) paths that a cycle forced into includer-first order."""
        p = self.graph.paths
        return [(p[a], p[b]) for plan in self.plans for a, b in plan.broken]


def _conjunction(expressions: Sequence[str | None]) -> str | None:
    distinct = sorted({e for e in expressions if e})
    if len(distinct) <= 1:
        return distinct[0] if distinct else None
    return " AND ".join(f"({e})" if " " in e else e for e in distinct)


def _document_row(
    plan: PlannedDocument, rows: list[int], meta: dict[str, list[Any]], text: str
) -> dict[str, Any]:
    """A document's metadata from its members': one licence expression that is the AND of
    theirs; `c` only when every member is C; vendored only when every member is; `build`
    structure only when every member has it; licence sources and scrub kinds as the sorted
    union (sources joined with `+`)."""

    def col(name: str) -> list[Any]:
        return [meta[name][r] for r in rows]

    data = text.encode("utf-8")
    row: dict[str, Any] = {
        "source_id": meta["source_id"][rows[0]],
        "path": plan.label,
        "revision": meta["revision"][rows[0]],
        "blob_sha": schemas.git_blob_sha(data),
        "size": len(data),
        "content_sha256": hashlib.sha256(data).hexdigest(),
        "license_expression": _conjunction(col("license_expression")),
        "license_source": "+".join(sorted(set(col("license_source")))),
        "structure_source": "build" if set(col("structure_source")) == {"build"} else "syntax",
        "split": plan.split,
    }
    if "language" in meta:
        row["language"] = "c" if set(col("language")) == {"c"} else "c++"
    if "vendored" in meta:
        row["vendored"] = all(col("vendored"))
    if "scrub_kinds" in meta:
        row["scrub_kinds"] = sorted({k for kinds in col("scrub_kinds") for k in kinds})
    return row


def _check_input(files: pa.Table) -> None:
    missing = _REQUIRED_INPUT - set(files.column_names)
    if missing:
        raise RepositoryInputError(f"file table lacks columns {sorted(missing)}")
    for name in ("source_id", "revision"):
        values = pc.unique(files.column(name)).to_pylist()
        if len(values) > 1:
            raise RepositoryInputError(
                f"{name}: one source at one revision per call, got {sorted(map(str, values))}"
            )


def _output_schema(files: pa.Table) -> pa.Schema:
    """REPOSITORY_DOCUMENTS without the optional columns the input does not carry."""
    fields = [
        f for f in REPOSITORY_DOCUMENTS if f.name not in _OPTIONAL or f.name in files.schema.names
    ]
    return pa.schema(fields, metadata=REPOSITORY_DOCUMENTS.metadata)


def _list_array(parts: list[np.ndarray], value_type: pa.DataType) -> pa.ListArray:
    offsets = np.zeros(len(parts) + 1, dtype=np.int32)
    np.cumsum([p.size for p in parts], out=offsets[1:])
    values = np.concatenate(parts) if parts else np.zeros(0)
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(values, value_type))


def build_repository_documents(
    files: pa.Table,
    tokenizer: Tokenizer,
    config: DocumentsConfig,
    include_roots: Sequence[str] | None = None,
) -> RepositoryDocuments:
    """One source's kept files (tokenized_docs rows, with `text` when the caller has it;
    otherwise the text is decoded from the tokens) as repository documents.

    `include_roots`: the source's include directories relative to its root (a compile
    database's, when it has one); None means includes.default_include_roots. Only
    `config.max_tokens` is read: choosing the mode is the caller's."""
    _check_input(files)
    schema = _output_schema(files)
    paths: list[str] = files.column("path").to_pylist()
    token_lists = files.column("token_ids").combine_chunks()
    kind_lists = files.column("chunk_kind").combine_chunks()
    tok_offsets = token_lists.offsets.to_numpy()
    n_tok = np.diff(tok_offsets)
    n_kind = np.diff(kind_lists.offsets.to_numpy())
    if not np.array_equal(n_tok, n_kind):
        bad = int(np.flatnonzero(n_tok != n_kind)[0])
        raise RepositoryInputError(f"{paths[bad]}: chunk_kind length differs from token_ids")
    if "text" in files.column_names:
        texts: list[str] = files.column("text").to_pylist()
    else:
        texts = tokenizer.decode_batch(token_lists.to_pylist(), skip_special_tokens=False)
    markers = [marker_text(p) for p in paths]
    marker_ids = [
        np.asarray(e.ids, dtype=np.int32)
        for e in tokenizer.encode_batch_fast(markers, add_special_tokens=False)
    ]
    flat_tokens = token_lists.values.to_numpy(zero_copy_only=False).astype(np.int32)
    flat_kinds = kind_lists.values.to_numpy(zero_copy_only=False).astype(np.uint8)

    graph = include_graph(paths, texts, include_roots)
    member_tokens = [int(n_tok[r]) + marker_ids[r].size for r in graph.rows]
    splits = files.column("split").to_pylist()
    plans = plan_documents(graph, member_tokens, [splits[r] for r in graph.rows], config.max_tokens)
    meta_names = [n for n in schema.names if n in files.column_names and n not in _STREAM]
    meta = {n: files.column(n).to_pylist() for n in meta_names}

    doc_tokens: list[np.ndarray] = []
    doc_kinds: list[np.ndarray] = []
    doc_rows: list[dict[str, Any]] = []
    df: dict[str, list[Any]] = {n: [] for n in DOCUMENT_FILES.names}
    for k, plan in enumerate(plans):
        rows = [graph.rows[m] for m in plan.members]
        tok_parts: list[np.ndarray] = []
        kind_parts: list[np.ndarray] = []
        starts: list[int] = []
        at = 0
        for r in rows:
            lo, hi = tok_offsets[r], tok_offsets[r + 1]
            marker = marker_ids[r]
            tok_parts += [marker, flat_tokens[lo:hi]]
            kind_parts += [np.full(marker.size, MARKER_KIND, np.uint8), flat_kinds[lo:hi]]
            starts.append(at)
            at += marker.size + int(hi - lo)
        df["doc_id"] += [k] * len(rows)
        df["position"] += list(range(len(rows)))
        df["path"] += [paths[r] for r in rows]
        df["start_token"] += starts
        df["num_tokens"] += [member_tokens[m] for m in plan.members]
        doc_tokens.append(np.concatenate(tok_parts))
        doc_kinds.append(np.concatenate(kind_parts))
        row = _document_row(plan, rows, meta, "".join(markers[r] + texts[r] for r in rows))
        row.update(num_tokens=at, num_files=len(rows), member_starts=starts)
        doc_rows.append(row)
    df["source_id"] = [meta["source_id"][0]] * len(df["path"]) if paths else []

    columns = {
        f.name: pa.array([row[f.name] for row in doc_rows], f.type)
        for f in schema
        if f.name not in _STREAM
    }
    columns["token_ids"] = _list_array(doc_tokens, pa.int32())
    columns["chunk_kind"] = _list_array(doc_kinds, pa.uint8())
    documents = pa.table([columns[n] for n in schema.names], schema=schema)
    document_files = pa.table(
        [pa.array(df[f.name], f.type) for f in DOCUMENT_FILES], schema=DOCUMENT_FILES
    )
    stats: Counter[str] = Counter(graph.stats)
    stats["documents"] += len(plans)
    stats["document_tokens"] += int(sum(t.size for t in doc_tokens))
    stats["marker_tokens"] += int(sum(m.size for m in marker_ids))
    stats["oversized_files"] += sum(
        1 for plan in plans if len(plan.members) == 1 and plan.num_tokens > config.max_tokens
    )
    for plan in plans:  # include edges a document keeps (both files in it)
        inside = set(plan.members)
        stats["edges_inside_documents"] += sum(
            1 for m in plan.members for d in graph.deps[m] if d in inside
        )
    stats["broken_edges"] += sum(len(plan.broken) for plan in plans)
    stats["cycle_files"] += sum(len(c) for plan in plans for c in plan.cycles)
    return RepositoryDocuments(documents, document_files, plans, graph, stats)


def file_document_files(documents: pa.Table) -> pa.Table:
    """document_files in file mode: each document is one file at position 0. `documents`
    needs doc_id, source_id, path and num_tokens (the documents table has them)."""
    n = documents.num_rows
    return pa.table(
        [
            documents.column("doc_id").cast(pa.int32()),
            pa.array(np.zeros(n, np.int32), pa.int32()),
            documents.column("source_id"),
            documents.column("path"),
            pa.array(np.zeros(n, np.int32), pa.int32()),
            documents.column("num_tokens").cast(pa.int32()),
        ],
        schema=DOCUMENT_FILES,
    )
