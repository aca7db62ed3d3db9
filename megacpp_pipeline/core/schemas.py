"""Every table the pipeline writes, declared once (schemas are data, versioned).

Per-file tables grow stage by stage: each gate's output is its input's schema plus the
columns that gate decides. `text` always holds the current text of the file and
`content_sha256` always the sha256 of that text's UTF-8 bytes.
"""

from __future__ import annotations

import hashlib

import numpy as np
import pyarrow as pa

SCHEMA_VERSION = "1"


def _schema(name: str, fields: list[pa.Field]) -> pa.Schema:
    metadata = {"megacpp.table": name, "megacpp.schema_version": SCHEMA_VERSION}
    return pa.schema(fields, metadata=metadata)


_KEY = [
    pa.field("source_id", pa.string(), nullable=False),
    pa.field("path", pa.string(), nullable=False),  # POSIX, relative to the source root
    # git commit / archive sha256 / dir tree hash / jsonl file sha256
    pa.field("revision", pa.string(), nullable=False),
    pa.field("blob_sha", pa.string(), nullable=False),  # git blob id of the raw bytes (sha1)
    pa.field("size", pa.int64(), nullable=False),  # raw bytes
]

# source_catalog: one row per source of sources.yaml, operational or not
SOURCE_CATALOG = _schema(
    "source_catalog",
    [
        pa.field("id", pa.string()),
        pa.field("kind", pa.string()),
        pa.field("uri", pa.string()),
        pa.field("pin", pa.string()),
        pa.field("declared_license", pa.string()),
        pa.field("role", pa.string()),
    ],
)

RAW_FILES = _schema("raw_files", [*_KEY, pa.field("content", pa.binary(), nullable=False)])

_TEXT = [
    pa.field("encoding", pa.string(), nullable=False),  # original encoding, e.g. utf-8, utf-8-sig
    pa.field("text", pa.string(), nullable=False),
    pa.field("content_sha256", pa.string(), nullable=False),
]
NORMALIZED_FILES = _schema("normalized_files", [*_KEY, *_TEXT])

# what the file is: decided right after normalize, carried by every later per-file table
CLASS_FIELDS = [
    pa.field("language", pa.string(), nullable=False),  # "c++" | "c"
    pa.field("vendored", pa.bool_(), nullable=False),  # a copy of another project's code
]
_CLASS = CLASS_FIELDS
CLASSIFIED_FILES = _schema("classified_files", [*_KEY, *_TEXT, *_CLASS])

_LICENSE = [
    pa.field("license_expression", pa.string()),  # normalized SPDX expression
    # file | reuse | notice-text | record | repo-declared | none
    pa.field("license_source", pa.string(), nullable=False),
    pa.field("license_decision", pa.string(), nullable=False),  # allowed|denied|invalid|unknown
    pa.field("license_detail", pa.string()),  # which notice matched, deprecated ids, ...
]
LICENSE_FIELDS = _LICENSE
LICENSED_FILES = _schema("licensed_files", [*_KEY, *_TEXT, *_CLASS, *_LICENSE])

_SCRUB = [
    pa.field("scrub_replacements", pa.int32(), nullable=False),
    pa.field("scrub_kinds", pa.list_(pa.string()), nullable=False),  # what was replaced
]
SCRUB_FIELDS = _SCRUB
SCRUBBED_FILES = _schema("scrubbed_files", [*_KEY, *_TEXT, *_CLASS, *_LICENSE, *_SCRUB])

DEDUPED_FILES = _schema("deduped_files", [*_KEY, *_TEXT, *_CLASS, *_LICENSE, *_SCRUB])

BUILD_CONTEXT = pa.struct(
    [
        pa.field("compiler_family", pa.string()),  # gcc|clang|msvc|unknown
        pa.field("language_standard", pa.string()),  # e.g. c++17
        pa.field("defines", pa.list_(pa.string())),  # NAME or NAME=VALUE
        pa.field("include_roots", pa.list_(pa.string())),  # relative to the source root
        pa.field("tu_path", pa.string()),  # normalized translation-unit path
    ]
)
_ENRICH = [
    pa.field("chunk_starts", pa.list_(pa.int32()), nullable=False),  # byte offsets in text
    pa.field("chunk_ends", pa.list_(pa.int32()), nullable=False),
    pa.field("chunk_kinds", pa.list_(pa.uint8()), nullable=False),  # enrich.CHUNK_KINDS ids
    pa.field("chunk_depths", pa.list_(pa.uint16()), nullable=False),
    pa.field("chunk_names", pa.list_(pa.string()), nullable=False),
    pa.field("parse_error_ratio", pa.float32(), nullable=False),
    pa.field("n_functions", pa.int32(), nullable=False),
    pa.field("n_classes", pa.int32(), nullable=False),
    pa.field("comment_ratio", pa.float32(), nullable=False),
    pa.field("max_nesting", pa.int32(), nullable=False),
    pa.field("structure_source", pa.string(), nullable=False),  # syntax|build
    pa.field("build_context", BUILD_CONTEXT),
]
ENRICH_FIELDS = _ENRICH
ENRICHED_FILES = _schema("enriched_files", [*_KEY, *_TEXT, *_CLASS, *_LICENSE, *_SCRUB, *_ENRICH])

TOKENIZED_DOCS = _schema(
    "tokenized_docs",
    [
        *_KEY,
        pa.field("content_sha256", pa.string(), nullable=False),
        *_CLASS,
        pa.field("license_expression", pa.string()),
        pa.field("license_source", pa.string(), nullable=False),
        pa.field("scrub_kinds", pa.list_(pa.string()), nullable=False),
        pa.field("structure_source", pa.string(), nullable=False),
        pa.field("split", pa.string(), nullable=False),  # train|validation
        pa.field("num_tokens", pa.int32(), nullable=False),
        pa.field("token_ids", pa.list_(pa.int32()), nullable=False),
        pa.field("chunk_kind", pa.list_(pa.uint8()), nullable=False),  # per token
    ],
)


# The documents stage's training documents, one row per document, doc_id in catalog then
# document order: a kept file (file mode) or a source's files in #include order (repository
# mode; path is then the members' common directory, and size/blob_sha/content_sha256 are of
# the document's text, path markers included). The snapshot's documents.parquet is these
# columns plus num_pieces and the packed num_tokens.
DOCUMENTS = pa.schema(
    [
        pa.field("doc_id", pa.int32(), nullable=False),
        pa.field("source_id", pa.string(), nullable=False),
        pa.field("path", pa.string(), nullable=False),
        pa.field("revision", pa.string(), nullable=False),
        pa.field("blob_sha", pa.string(), nullable=False),
        pa.field("content_sha256", pa.string(), nullable=False),
        *_CLASS,
        pa.field("license_expression", pa.string()),
        pa.field("license_source", pa.string(), nullable=False),
        pa.field("scrub_kinds", pa.list_(pa.string()), nullable=False),  # replaced in it
        pa.field("structure_source", pa.string(), nullable=False),
        pa.field("split", pa.string(), nullable=False),
        pa.field("num_files", pa.int32(), nullable=False),  # 1 in file mode
        pa.field("num_tokens", pa.int32(), nullable=False),  # the document's own tokens
    ],
    metadata={"megacpp.table": "documents", "megacpp.schema_version": "1"},
)

# DOCUMENTS with the token streams the packer reads: where each member file starts (token
# offsets; [0] for a one-file document) and the ids and chunk kinds of the whole document.
DOCUMENT_TOKENS = _schema(
    "document_tokens",
    [
        *DOCUMENTS,
        pa.field("member_starts", pa.list_(pa.int32()), nullable=False),
        pa.field("token_ids", pa.list_(pa.int32()), nullable=False),
        pa.field("chunk_kind", pa.list_(pa.uint8()), nullable=False),
    ],
)

# Where every kept file sits: its document and position there, and the token span it holds
# in the document (in repository mode its path marker included, and the separator newline
# after a file that does not end in one: corpus/repository/assemble.py). One row per kept
# file in both modes, so a file stays traceable whatever a document is.
DOCUMENT_FILES = pa.schema(
    [
        pa.field("doc_id", pa.int32(), nullable=False),
        pa.field("position", pa.int32(), nullable=False),  # 0-based, in document order
        pa.field("source_id", pa.string(), nullable=False),
        pa.field("path", pa.string(), nullable=False),  # the file, relative to the source root
        pa.field("content_sha256", pa.string(), nullable=False),  # the file's own text
        pa.field("license_expression", pa.string()),  # the file's own licence
        pa.field("start_token", pa.int32(), nullable=False),  # where its marker starts
        pa.field("num_tokens", pa.int32(), nullable=False),  # marker + file (+ separator)
    ],
    metadata={"megacpp.table": "document_files", "megacpp.schema_version": "1"},
)


def extend(
    table: pa.Table,
    columns: dict[str, pa.Array | pa.ChunkedArray],
    fields: list[pa.Field],
    name: str,
) -> pa.Table:
    """`table` with a gate's own columns set: a field already there is replaced in place,
    the others appended in `fields` order; the result is labelled table `name`. Every column
    the gate does not decide passes through, so it works on whatever earlier stages added
    (its stage's schema says what)."""
    out = table.replace_schema_metadata(
        {"megacpp.table": name, "megacpp.schema_version": SCHEMA_VERSION}
    )
    for f in fields:
        column = columns[f.name]
        if column.type != f.type:
            column = column.cast(f.type)
        if f.name in out.column_names:
            out = out.set_column(out.schema.get_field_index(f.name), f, column)
        else:
            out = out.append_column(f, column)
    return out


def git_blob_sha(content: bytes) -> str:
    """The id git gives these bytes as a blob, so dir/archive files compare with git ones."""
    h = hashlib.sha1(b"blob %d\0" % len(content))
    h.update(content)
    return h.hexdigest()


def text_sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


class TextLayoutError(ValueError):
    """A text column stored in a layout other than the schema's (a string or binary array
    of offsets and bytes): its buffers would be read as something else."""


_TEXT_LAYOUTS = (pa.string(), pa.large_string(), pa.binary(), pa.large_binary())


def text_digests(texts: pa.ChunkedArray | pa.Array) -> list[str]:
    """The hex sha256 of each text's UTF-8 bytes (a null as the empty text), hashed where
    Arrow holds them (no copy of the texts). A column of another layout (a view, a
    dictionary, nulls only: a shard's writer chose it, not the schema) is a TextLayoutError,
    never read through buffers that mean something else there."""
    chunks = texts.chunks if isinstance(texts, pa.ChunkedArray) else [texts]
    sha256 = hashlib.sha256
    out: list[str] = []
    for chunk in chunks:
        if chunk.type not in _TEXT_LAYOUTS:
            raise TextLayoutError(
                f"its text is stored as {chunk.type}, not as the schema's string: refused"
            )
        if len(chunk) == 0:
            continue
        wide = pa.types.is_large_string(chunk.type) or pa.types.is_large_binary(chunk.type)
        offsets = np.frombuffer(chunk.buffers()[1], np.int64 if wide else np.int32)
        bounds = offsets[chunk.offset : chunk.offset + len(chunk) + 1]
        starts, ends = bounds[:-1].copy(), bounds[1:]
        if chunk.null_count:  # a null slot's offsets may span bytes: it hashes as ""
            nulls = np.asarray(chunk.is_null().to_numpy(zero_copy_only=False), dtype=bool)
            starts[nulls] = ends[nulls]
        data = memoryview(chunk.buffers()[2] or b"")
        out += [
            sha256(data[a:b]).hexdigest()
            for a, b in zip(starts.tolist(), ends.tolist(), strict=True)
        ]
    return out
