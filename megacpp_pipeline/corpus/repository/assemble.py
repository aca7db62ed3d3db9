"""Repository documents as token streams: each member is its path marker's tokens then the
file's own tokens, members in include order; plus the `document_files` rows that say where
every file sits in its document.

The marker belongs to the member it introduces: a member's `start_token` is where its marker
starts and its `num_tokens` counts marker and file, so the members partition the document
(and `member_starts` is what the packer needs to keep FIM inside one file). Marker tokens
get chunk kind 0 ("other"), which structured FIM never picks as a middle.

A file whose text does not end in a newline is followed by one, the separator, so the next
marker still starts a line of its own (glued to the file's last line it would read as code,
or vanish into a `//` comment the file ends inside). The separator belongs to that member:
its tokens (the newline encoded on its own, chunk kind 0) come after the file's and count
in the member's `num_tokens`. A file that ends in a newline, or is empty, has none, so such
a corpus's documents are what they were before separators.
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

DOCUMENT_FILES = schemas.DOCUMENT_FILES

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


def separator_text(text: str) -> str:
    """The newline a member adds after its file's `text` when the text does not end in one
    (nothing when it does, or is empty). Decided per file, wherever the file sits: the last
    member of a document gets one too, so a member's token count is known from its file
    alone before the documents are planned, and every document ends at a line end."""
    return "\n" if text and not text.endswith("\n") else ""


def split_member(member: str, content_sha256: str) -> tuple[str, str, str]:
    """A member's decoded text as (its marker line, its file's text, its separator), the
    file's sha256 (document_files' content_sha256) telling where the file ends: the text
    alone cannot, since a file `x\n` and a file `x` with its separator read the same. A
    member whose file hashes to neither reading is given the separated one, and its hash
    check then names it."""
    head, newline, rest = member.partition("\n")
    if (
        rest.endswith("\n")
        and separator_text(rest[:-1])
        and hashlib.sha256(rest.encode("utf-8")).hexdigest() != content_sha256
    ):
        return head + newline, rest[:-1], "\n"
    return head + newline, rest, ""


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
    separators = [separator_text(t) for t in texts]
    newline_ids = np.asarray(tokenizer.encode("\n", add_special_tokens=False).ids, np.int32)
    separator_ids = [newline_ids if sep else newline_ids[:0] for sep in separators]
    flat_tokens = token_lists.values.to_numpy(zero_copy_only=False).astype(np.int32)
    flat_kinds = kind_lists.values.to_numpy(zero_copy_only=False).astype(np.uint8)

    graph = include_graph(paths, texts, include_roots)
    member_tokens = [marker_ids[r].size + int(n_tok[r]) + separator_ids[r].size for r in graph.rows]
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
            marker, separator = marker_ids[r], separator_ids[r]
            tok_parts += [marker, flat_tokens[lo:hi], separator]
            kind_parts += [
                np.full(marker.size, MARKER_KIND, np.uint8),
                flat_kinds[lo:hi],
                np.full(separator.size, MARKER_KIND, np.uint8),
            ]
            starts.append(at)
            at += marker.size + int(hi - lo) + separator.size
        df["doc_id"] += [k] * len(rows)
        df["position"] += list(range(len(rows)))
        df["path"] += [paths[r] for r in rows]
        df["content_sha256"] += [meta["content_sha256"][r] for r in rows]
        df["license_expression"] += [meta["license_expression"][r] for r in rows]
        df["start_token"] += starts
        df["num_tokens"] += [member_tokens[m] for m in plan.members]
        doc_tokens.append(np.concatenate(tok_parts))
        doc_kinds.append(np.concatenate(kind_parts))
        text = "".join(markers[r] + texts[r] + separators[r] for r in rows)
        row = _document_row(plan, rows, meta, text)
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
    stats["separator_tokens"] += int(sum(s.size for s in separator_ids))
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
    needs doc_id, source_id, path, content_sha256, license_expression and num_tokens (the
    documents table has them)."""
    n = documents.num_rows
    zeros = pa.array(np.zeros(n, np.int32), pa.int32())
    columns = {
        "doc_id": documents.column("doc_id").cast(pa.int32()),
        "position": zeros,
        "start_token": zeros,
        "num_tokens": documents.column("num_tokens").cast(pa.int32()),
    }
    return pa.table(
        [
            columns[f.name] if f.name in columns else documents.column(f.name)
            for f in DOCUMENT_FILES
        ],
        schema=DOCUMENT_FILES,
    )


def document_files_problems(
    documents: pa.Table,
    document_files: pa.Table,
    kept: dict[str, int] | None,
    first_id: int = 0,
) -> list[str]:
    """What is wrong with documents (doc_id, num_files, num_tokens) + document_files, in
    either mode: every kept file in exactly one document (per source, as many rows as
    `kept` says; None: not counted here), each document's members at positions 0..n-1 whose
    token spans tile the document's own tokens, doc_ids 0..N-1 (`first_id`..: a run of the
    documents, every row of document_files one of theirs)."""
    problems: list[str] = []
    ids = documents["doc_id"].to_numpy()
    if not np.array_equal(ids, np.arange(first_id, first_id + ids.size)):
        span = "0..N-1" if first_id == 0 else f"{first_id}..{first_id}+n-1"
        problems.append(f"documents: doc_ids are not {span} in order")
    listed_per_source = Counter(
        {r["values"]: r["counts"] for r in pc.value_counts(document_files["source_id"]).to_pylist()}
    )
    for source, n in (kept or {}).items():
        if listed_per_source.get(source, 0) != n:
            problems.append(
                f"{source}: {n} kept files but {listed_per_source.get(source, 0)} in documents"
            )
    source = document_files["source_id"]
    if pa.types.is_dictionary(source.type):
        source = source.cast(pa.string())
    keys = pc.binary_join_element_wise(source, document_files["path"], "\0")
    if len(pc.unique(keys)) != document_files.num_rows:
        problems.append("document_files: a file is listed more than once")
    df = document_files.sort_by([("doc_id", "ascending"), ("position", "ascending")])
    doc = df["doc_id"].to_numpy().astype(np.int64) - first_id
    pos = df["position"].to_numpy().astype(np.int64)
    start = df["start_token"].to_numpy().astype(np.int64)
    size = df["num_tokens"].to_numpy().astype(np.int64)
    first = np.r_[True, doc[1:] != doc[:-1]] if doc.size else np.zeros(0, bool)
    first_row = np.maximum.accumulate(np.where(first, np.arange(doc.size), 0))
    bad_pos = np.flatnonzero(pos != np.arange(doc.size) - first_row)
    if bad_pos.size:
        problems.append(f"doc {int(doc[bad_pos[0]]) + first_id}: member positions are not 0..n-1")
    ends = start + size
    expected = np.where(first, 0, np.r_[0, ends[:-1]])
    bad_start = np.flatnonzero(start != expected)
    if bad_start.size:
        r = int(bad_start[0])
        problems.append(
            f"doc {int(doc[r]) + first_id}: member {int(pos[r])} does not start where the last ends"
        )
    members = np.bincount(doc, minlength=ids.size) if doc.size else np.zeros(ids.size, np.int64)
    tokens = np.bincount(doc, weights=size, minlength=ids.size) if doc.size else members
    own_files = documents["num_files"].to_numpy()
    own_tokens = documents["num_tokens"].to_numpy()
    for what, got, want in (("files", members, own_files), ("tokens", tokens, own_tokens)):
        bad = np.flatnonzero(got[: ids.size] != want)
        if bad.size:
            d = int(ids[bad[0]])
            problems.append(
                f"doc {d}: document_files hold {int(got[bad[0]])} {what}, documents say "
                f"{int(want[bad[0]])}"
            )
    return problems
