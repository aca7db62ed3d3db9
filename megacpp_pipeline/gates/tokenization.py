"""The tokenized_docs gate: token ids per document, a per-token chunk kind from one offline
alignment of the enrichment spans, and a deterministic train/validation split. Seed rules:
decode(encode(text)) == text for every kept document (failures are dropped and named), and
structure reaches the tokens through offsets, never through a per-token Python loop.

Alignment: enrichment spans are UTF-8 byte offsets. Instead of the encodings' character
offsets (which the fast encoder does not give), the gate uses the fact that a byte-level BPE
token always stands for the same bytes: a vocab-sized table of token byte lengths, cumulated
per document, gives every token's byte offset directly (exact even where a token splits a
multibyte character, where character offsets are ambiguous). A per-document check that the
token bytes add up to the text's bytes guards the table. Which encoder produces the ids
(tokenizers or the fast one, same ids) is corpus/encoders.py's decision.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import Counter
from collections.abc import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pydantic import BaseModel, ConfigDict, Field
from tokenizers import Tokenizer

from megacpp_pipeline.core import schemas
from megacpp_pipeline.core.catalog import SplitConfig
from megacpp_pipeline.core.gate import GateResult
from megacpp_pipeline.core.ledger import DropReason, drops, empty_ledger
from megacpp_pipeline.corpus.encoders import (
    EncoderMode,
    TokenEncoder,
    TokenizerNotByteLevelError,
    select_encoder,
)
from megacpp_pipeline.snapshot import layout

__all__ = ["TokenizeConfig", "TokenizerNotByteLevelError", "assign_split", "run"]

SPLITS = layout.SPLITS


class TokenizeConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    # Bytes of text encoded at once: the ids of one batch are what costs memory.
    batch_bytes: int = Field(default=1024 * 1024, ge=1)
    # auto: the fast encoder (tiktoken over the same artifact) when it reproduces the
    # artifact and agrees with tokenizers on the load sample, else tokenizers with a
    # warning; tokenizers: always the reference; fast: the fast one or an error saying why.
    # The ids are the same either way.
    encoder: EncoderMode = EncoderMode.AUTO


def assign_split(
    source_ids: list[str] | pa.Array | pa.ChunkedArray,
    paths: list[str] | pa.Array | pa.ChunkedArray,
    split: SplitConfig,
) -> list[str]:
    """`validation` when hash(salt, source id, path) falls under the fraction, else `train`."""
    if not isinstance(source_ids, list):
        source_ids = source_ids.to_pylist()
    if not isinstance(paths, list):
        paths = paths.to_pylist()
    threshold = int(split.validation_fraction * (1 << 64))
    key = split.salt.encode("utf-8")[:64]
    out = []
    for source_id, path in zip(source_ids, paths, strict=True):
        digest = hashlib.blake2b(f"{source_id}\0{path}".encode(), digest_size=8, key=key).digest()
        out.append("validation" if int.from_bytes(digest, "little") < threshold else "train")
    return out


def align_chunk_kinds(
    token_doc: np.ndarray,
    token_start: np.ndarray,
    doc_base: np.ndarray,
    doc_bytes: np.ndarray,
    chunks: pa.Table,
) -> np.ndarray:
    """Per-token chunk kind: the kind of the span holding the token's first byte (0 outside).

    `token_start` is each token's byte offset in its document; `chunks` holds the
    documents' chunk_starts/chunk_ends/chunk_kinds list columns. Everything is lifted into one
    global byte space (doc_base + offset) so one pass serves the whole batch: a token belongs
    to the last span starting at or before its first byte, and has that span's kind when
    it starts before the span's end.
    """
    starts_col = chunks.column("chunk_starts").combine_chunks()
    span_doc = pc.list_parent_indices(starts_col).to_numpy()
    span_start = pc.list_flatten(starts_col).to_numpy().astype(np.int64)
    span_end = pc.list_flatten(chunks.column("chunk_ends").combine_chunks()).to_numpy()
    span_kind = pc.list_flatten(chunks.column("chunk_kinds").combine_chunks()).to_numpy()
    if span_start.size == 0:
        return np.zeros(token_start.size, dtype=np.uint8)
    # A span reaching past its text must not claim the next document's tokens.
    span_end = np.minimum(span_end.astype(np.int64), doc_bytes[span_doc])
    g_span_start = span_start + doc_base[span_doc]
    g_span_end = span_end + doc_base[span_doc]
    g_token = token_start + doc_base[token_doc]
    if _ascending(g_token) and _ascending(g_span_start):
        # Spans are far fewer than tokens: place each span among the tokens (S log T), then
        # lay out the runs (span j owns the tokens up to the next span's first one, and
        # gives its kind to those before its end).
        first = np.searchsorted(g_token, g_span_start, side="left")
        stop = np.searchsorted(g_token, g_span_end, side="left")
        owned_to = np.append(first[1:], g_token.size)
        kind_to = np.clip(stop, first, owned_to)
        values = np.zeros(2 * span_kind.size + 1, dtype=np.uint8)
        values[1::2] = span_kind
        lengths = np.empty(values.size, dtype=np.int64)
        lengths[0] = first[0]
        lengths[1::2] = kind_to - first
        lengths[2::2] = owned_to - kind_to
        return np.repeat(values, lengths)
    # Out of order (a document whose tokens overrun its text, dropped anyway): per token.
    j = np.searchsorted(g_span_start, g_token, side="right") - 1
    jc = np.maximum(j, 0)
    inside = (j >= 0) & (g_token < g_span_end[jc])
    return np.where(inside, span_kind[jc], 0).astype(np.uint8)


def _ascending(values: np.ndarray) -> bool:
    return bool(values.size < 2 or (values[1:] >= values[:-1]).all())


def _utf8_buffer(column: pa.ChunkedArray | pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """A string column's UTF-8 bytes as one buffer, and each row's start (n + 1 offsets)."""
    arr = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    if arr.type != pa.large_string():
        arr = arr.cast(pa.large_string())
    buffers = arr.buffers()
    offsets = np.frombuffer(buffers[1], dtype=np.int64)[arr.offset : arr.offset + len(arr) + 1]
    data = (
        np.frombuffer(buffers[2], dtype=np.uint8)
        if buffers[2] is not None
        else np.zeros(0, dtype=np.uint8)
    )
    return data[offsets[0] : offsets[-1]], offsets - offsets[0]


# Above this many tokens in one batch (only a file of several MB makes that many), tokens
# are aligned a document and a block at a time: the batch-wide arrays of the vectorized
# path cost ~40 bytes per token at once.
BLOCK_TOKENS = 1 << 22


def _align_by_blocks(
    flat: np.ndarray,
    offsets: np.ndarray,
    byte_len: np.ndarray,
    doc_bytes: np.ndarray,
    chunks: pa.Table,
) -> tuple[np.ndarray, np.ndarray]:
    """What `align_chunk_kinds` gives (each token's chunk kind) and the bytes each
    document's tokens cover, one document at a time and BLOCK_TOKENS tokens at a time,
    so the memory beyond the ids is a few bytes per token."""
    kinds = np.zeros(flat.size, np.uint8)
    covered = np.zeros(len(offsets) - 1, np.int64)
    starts_col = chunks.column("chunk_starts").combine_chunks()
    span_offsets = starts_col.offsets.to_numpy()
    span_start = starts_col.values.to_numpy().astype(np.int64)
    span_end = chunks.column("chunk_ends").combine_chunks().values.to_numpy().astype(np.int64)
    span_kind = chunks.column("chunk_kinds").combine_chunks().values.to_numpy()
    for doc in range(len(offsets) - 1):
        s_lo, s_hi = int(span_offsets[doc]), int(span_offsets[doc + 1])
        d_start = span_start[s_lo:s_hi]
        d_end = np.minimum(span_end[s_lo:s_hi], doc_bytes[doc])
        d_kind = span_kind[s_lo:s_hi]
        carry = 0
        for lo in range(int(offsets[doc]), int(offsets[doc + 1]), BLOCK_TOKENS):
            hi = min(int(offsets[doc + 1]), lo + BLOCK_TOKENS)
            token_len = byte_len[flat[lo:hi]].astype(np.int64)
            token_start = np.cumsum(token_len)
            token_start -= token_len
            token_start += carry
            carry += int(token_len.sum())
            if d_start.size:
                j = np.searchsorted(d_start, token_start, side="right") - 1
                jc = np.maximum(j, 0)
                inside = (j >= 0) & (token_start < d_end[jc])
                kinds[lo:hi] = np.where(inside, d_kind[jc], 0)
        covered[doc] = carry
    return kinds, covered


# A document longer than this (characters) is encoded a piece at a time when the tokenizer
# allows it (`splits_exactly`): the Encoding of a whole file costs ~40 bytes of memory per
# byte of text, so a file at the size policy's limit would otherwise need gigabytes.
PIECE_CHARS = 1 << 20
# A newline with a non-space character before and after it: a byte-level pre-tokenizer
# always makes that newline a token of its own (whitespace tokens never take a non-space
# character, other tokens never a newline), so encoding the pieces gives exactly the ids of
# encoding the whole. Whitespace before it would not do: at a piece's end `\s+(?!\S)` takes
# " \n" (or "\r\n") whole, where the whole text has " " then "\n".
_PIECE_CUT = re.compile(r"(?<=\S)\n(?=\S)")


def splits_exactly(tokenizer: Tokenizer) -> bool:
    """Whether encoding a text cut after `\\n` between non-space characters gives the same
    ids as encoding it whole: no normalizer, a ByteLevel pre-tokenizer with its regex and
    no prefix space, no added token holding a newline."""
    doc = json.loads(tokenizer.to_str())
    pre = doc.get("pre_tokenizer") or {}
    return (
        doc.get("normalizer") is None
        and pre.get("type") == "ByteLevel"
        and bool(pre.get("use_regex", True))
        and not pre.get("add_prefix_space", False)
        and all("\n" not in t.content for t in tokenizer.get_added_tokens_decoder().values())
    )


def text_pieces(text: str, size: int) -> Iterator[str]:
    """`text` cut into pieces of at most about `size` characters, each cut after a newline
    between non-space characters (a piece runs longer only where there is none)."""
    lo = 0
    while len(text) - lo > size:
        cut = -1
        for m in _PIECE_CUT.finditer(text, lo + size // 2, lo + size):
            cut = m.end()
        if cut < 0:
            later = _PIECE_CUT.search(text, lo + size)
            cut = later.end() if later else len(text)
        yield text[lo:cut]
        lo = cut
    if lo < len(text):
        yield text[lo:]


def _encode(encoder: TokenEncoder, texts: list[str]) -> pa.ListArray:
    """Every text's ids; a text longer than PIECE_CHARS a piece at a time when the artifact
    allows it (splits_exactly): the same ids, in a fraction of the memory."""
    long = [i for i, t in enumerate(texts) if len(t) > PIECE_CHARS]
    if not long or not splits_exactly(encoder.reference):
        return encoder.encode(texts)
    per_doc: list[np.ndarray] = []
    short = encoder.encode([t if len(t) <= PIECE_CHARS else "" for t in texts])
    for i, text in enumerate(texts):
        if len(text) <= PIECE_CHARS:
            per_doc.append(short[i].values.to_numpy(zero_copy_only=False))
            continue
        parts = [
            encoder.encode([piece])[0].values.to_numpy(zero_copy_only=False)
            for piece in text_pieces(text, PIECE_CHARS)
        ]
        per_doc.append(np.concatenate(parts) if parts else np.zeros(0, np.int32))
    offsets = np.zeros(len(texts) + 1, np.int32)
    np.cumsum([len(a) for a in per_doc], out=offsets[1:])
    values = pa.array(np.concatenate(per_doc).astype(np.int32), pa.int32())
    return pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), values)


def _tokenize_batch(table: pa.Table, encoder: TokenEncoder, split: SplitConfig) -> GateResult:
    stats: Counter[str] = Counter()
    texts: list[str] = table.column("text").to_pylist()
    text_bytes, text_offsets = _utf8_buffer(table.column("text"))
    ids_arr = _encode(encoder, texts)
    flat = ids_arr.values.to_numpy()
    offsets = ids_arr.offsets.to_numpy()
    n_tokens = np.diff(offsets)
    doc_bytes = np.diff(text_offsets)

    if flat.size > BLOCK_TOKENS:  # a file near the size limit: bounded, block by block
        kinds, covered = _align_by_blocks(flat, offsets, encoder.byte_len, doc_bytes, table)
    else:
        token_doc = np.repeat(np.arange(len(texts)), n_tokens)
        token_len = encoder.byte_len[flat]
        # Exclusive cumulative bytes over the batch's tokens: a token's byte offset inside
        # its document, and the bytes each document's tokens add up to (must equal the
        # text's own byte length for the alignment to be trusted).
        cum = np.zeros(flat.size + 1, dtype=np.int64)
        np.cumsum(token_len, out=cum[1:])
        token_start = cum[:-1] - cum[offsets[:-1]][token_doc]
        covered = cum[offsets[1:]] - cum[offsets[:-1]]
        doc_base = text_offsets[:-1]
        kinds = align_chunk_kinds(token_doc, token_start, doc_base, doc_bytes, table)

    differs_at = encoder.round_trip_failures(texts, text_bytes, text_offsets, ids_arr)
    suspect = (n_tokens == 0) | (covered != doc_bytes)
    suspect[list(differs_at)] = True
    reasons: list[DropReason] = []
    details: list[str] = []
    dropped_rows: list[int] = []
    keep = np.ones(len(texts), dtype=bool)
    source_ids = table.column("source_id")
    paths = table.column("path")
    for i in np.flatnonzero(suspect).tolist():
        reason: DropReason | None = None
        if n_tokens[i] == 0:
            reason, detail = DropReason.EMPTY_AFTER_TOKENIZE, "no tokens"
        elif i in differs_at:
            reason = DropReason.ROUND_TRIP_FAILED
            detail = f"decode(encode(text)) != text from character {differs_at[i]}"
        elif covered[i] != doc_bytes[i]:
            reason = DropReason.ROUND_TRIP_FAILED
            detail = f"token bytes cover {covered[i]} of {doc_bytes[i]} text bytes"
        if reason is not None:
            keep[i] = False
            dropped_rows.append(i)
            reasons.append(reason)
            details.append(f"{source_ids[i].as_py()}:{paths[i].as_py()}: {detail}")
            stats[f"dropped_{reason}"] += 1

    kinds_arr = pa.ListArray.from_arrays(ids_arr.offsets, pa.array(kinds, pa.uint8()))
    kept_src, kept_ids, kept_kinds = table, ids_arr, kinds_arr
    if not keep.all():  # Arrow's filter copies list columns slowly; the usual case skips it
        mask = pa.array(keep)
        kept_src, kept_ids, kept_kinds = (
            table.filter(mask),
            ids_arr.filter(mask),
            kinds_arr.filter(mask),
        )
    columns = {
        "source_id": kept_src.column("source_id"),
        "path": kept_src.column("path"),
        "revision": kept_src.column("revision"),
        "blob_sha": kept_src.column("blob_sha"),
        "size": kept_src.column("size"),
        "content_sha256": kept_src.column("content_sha256"),
        "license_expression": kept_src.column("license_expression"),
        "license_source": kept_src.column("license_source"),
        "structure_source": kept_src.column("structure_source"),
        "split": pa.array(
            assign_split(kept_src.column("source_id"), kept_src.column("path"), split),
            pa.string(),
        ),
        "num_tokens": pa.array(n_tokens[keep].astype(np.int32), pa.int32()),
        "token_ids": kept_ids,
        "chunk_kind": kept_kinds,
    }
    # what earlier stages decided of the file (language, vendored, what scrub replaced)
    # rides along when they ran
    carried = [*schemas.CLASS_FIELDS, schemas.TOKENIZED_DOCS.field("scrub_kinds")]
    columns.update(
        {f.name: kept_src.column(f.name) for f in carried if f.name in kept_src.column_names}
    )
    fields = [f for f in schemas.TOKENIZED_DOCS if f.name in columns]
    kept = pa.table(
        [columns[f.name] for f in fields],
        schema=pa.schema(fields, metadata=schemas.TOKENIZED_DOCS.metadata),
    )
    dropped = (
        drops(
            [source_ids[i].as_py() for i in dropped_rows],
            [paths[i].as_py() for i in dropped_rows],
            reasons,
            details,
        )
        if dropped_rows
        else empty_ledger()
    )
    stats["docs_in"] += len(texts)
    stats["docs_kept"] += int(keep.sum())
    stats["bytes_in"] += int(doc_bytes.sum())
    stats["tokens_kept"] += int(n_tokens[keep].sum())
    for name in SPLITS:
        stats[f"docs_{name}"] += int(pc.sum(pc.equal(kept.column("split"), name)).as_py() or 0)
    return GateResult(kept=kept, dropped=dropped, stats=stats)


def _byte_batches(table: pa.Table, batch_bytes: int) -> list[tuple[int, int]]:
    sizes = pc.binary_length(table.column("text")).to_numpy().astype(np.int64)
    bounds: list[tuple[int, int]] = []
    start, acc = 0, 0
    for i, size in enumerate(sizes.tolist()):
        acc += size
        if acc >= batch_bytes:
            bounds.append((start, i + 1))
            start, acc = i + 1, 0
    if start < len(sizes):
        bounds.append((start, len(sizes)))
    return bounds


def run(
    table: pa.Table,
    tokenizer: Tokenizer | TokenEncoder,
    config: TokenizeConfig,
    split: SplitConfig,
) -> GateResult:
    """schemas.ENRICHED_FILES rows in, schemas.TOKENIZED_DOCS rows out (no BOS/EOS here), each
    labelled train or validation by `split`.
    `tokenizer` is the artifact (the encoder is then chosen per `config.encoder`, once per
    artifact) or an encoder already chosen (the stage's, built once per source)."""
    encoder = (
        tokenizer
        if isinstance(tokenizer, TokenEncoder)
        else select_encoder(tokenizer, config.encoder)
    )
    parts = [
        _tokenize_batch(table.slice(lo, hi - lo), encoder, split)
        for lo, hi in _byte_batches(table, config.batch_bytes)
    ]
    if not parts:
        return GateResult(kept=schemas.TOKENIZED_DOCS.empty_table())
    stats: Counter[str] = Counter()
    for part in parts:
        stats.update(part.stats)
    return GateResult(
        kept=pa.concat_tables([p.kept for p in parts]),
        dropped=pa.concat_tables([p.dropped for p in parts]),
        stats=stats,
    )
