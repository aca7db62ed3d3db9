"""The packed_rows stage: documents become BOS + tokens + EOS, are cut into pieces of at most
`seq_len`, and the pieces are placed into fixed-length rows (best-fit decreasing over a
bounded window of documents by default). Seed rules: every row starts at a piece start
(BOS-aligned), no target crosses a document boundary, train and validation never share a
row, and the same inputs and seed give byte-identical rows.

Only the placement of pieces into rows is a Python loop (one step per piece); everything per
token -- building the BOS/EOS/FIM stream, cutting, and filling the rows -- is numpy array work.

FIM in repository mode: a document that lists its member files (`member_starts`) gets FIM
per member, each member permuted inside its own span with its own draw, so no prefix, suffix
or middle ever crosses from one file into the next; a document without member_starts is one
member (file mode, unchanged: its draws are keyed by the doc id alone, as before).

pack_id: rows are numbered sequentially per split and block in output order, from the
block's base (block_base: the split's base in PACK_ID_BASE, train from 0, validation from
2**62, plus the block number times 2**32), so an id never depends on the other split or on
another block, and blocks of whole windows can be packed side by side on any worker.

Source weights (`weight:` in sources.yaml): a document of a source of weight w is packed
`document_draws` times: floor(w), plus once more when a seeded uniform of its key (source and
path) falls below frac(w), so each document is drawn w times on average and a source's share
follows its weight. The draw depends on the document alone, never on a window, a block or
an engine; its k-th copy is packed in the k-th pass over the split (`copy` in the pieces), so
two copies never share a window, and so never a row.
"""

from __future__ import annotations

import bisect
import hashlib
import math
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from enum import StrEnum

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pydantic import BaseModel, ConfigDict, Field, computed_field

from megacpp_pipeline.corpus.tokenizer import SpecialIds
from megacpp_pipeline.snapshot import layout
from megacpp_pipeline.snapshot.packed_rows import (
    IGNORE_INDEX,
    PAD_DOC_ID,
    PIECES_SCHEMA,
    packed_rows_schema,
    row_group_rows,
)

SPLITS = layout.SPLITS
PACK_ID_BASE = {"train": 0, "validation": 1 << 62}
BLOCK_SHIFT = 32  # a block's rows are numbered from its base: fewer than 2**32 of them
WEIGHT_STREAM = 3  # the seeded uniform of a weighted draw (streams 0-2 are FIM's)
_MASK64 = np.uint64(0xFFFFFFFFFFFFFFFF)
_INPUT_SCHEMA = pa.schema(
    [
        pa.field("doc_id", pa.int32()),
        pa.field("token_ids", pa.list_(pa.int32())),
        pa.field("chunk_kind", pa.list_(pa.uint8())),
        # optional: token offsets where each member file of a repository document starts
        # (first 0, non-decreasing); null means the whole document is one member
        pa.field("member_starts", pa.list_(pa.int32())),
    ]
)


class PackingPolicy(StrEnum):
    BEST_FIT = "best_fit"  # best-fit decreasing over a bounded window of documents
    PACKED_ROWS = "packed_rows"  # greedy sequential: next piece, or close the row
    SINGLE_DOC = "single_doc"  # one piece per row, padded


class FimMode(StrEnum):
    RANDOM = "random"  # two uniform cut points (at token boundaries) per document
    STRUCTURED = "structured"  # the middle is one whole chunk-kind run, e.g. a function body


class PackingInputError(ValueError):
    """A document table breaks the packer's input contract; names the doc and the column."""


class PackingConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    seq_len: int = Field(default=2048, ge=8)
    policy: PackingPolicy = PackingPolicy.BEST_FIT
    # Documents (per split) packed together; bounds memory to one window, and a wider window
    # leaves fewer partly filled rows at its end.
    window_docs: int = Field(default=1024, ge=1)
    fim_rate: float = Field(default=0.0, ge=0.0, le=1.0)  # train split only
    fim_mode: FimMode = FimMode.RANDOM
    # Chunk kinds a structured middle may be (enrich.CHUNK_KINDS ids; 2 = func_body, so the
    # model learns to write a body between its signature and what follows); empty means any
    # kind except 0 ("other").
    fim_structured_kinds: tuple[int, ...] = (2,)
    seed: int = 0
    # Windows a packing task packs: the unit of parallel packing (a block of this many
    # windows of one split, numbered from its own pack_id base). None: from the split's size
    # alone (`block_windows`), so the blocks are the same on any engine and worker count.
    windows_per_task: int | None = Field(default=None, ge=1)
    packing_telemetry: bool = False
    histogram_bins: int = Field(default=20, ge=1)
    # source id -> its `weight:` from sources.yaml (the catalog fills it in; a source not
    # listed weighs 1.0, so a catalog without weights packs, and versions, as it always did)
    source_weights: dict[str, float] = Field(default_factory=dict)

    def weight(self, source: str) -> float:
        return self.source_weights.get(source, 1.0)


class PackingTelemetry(BaseModel):
    """Additive counters of one packing run (merge() sums them); ratios are derived."""

    model_config = ConfigDict(extra="forbid")

    policy: str
    seq_len: int
    rows: int = 0
    valid_tokens: int = 0
    docs: int = 0
    pieces: int = 0
    cropped_docs: int = 0  # documents cut into more than one piece
    doc_tokens: int = 0  # the documents' own tokens (without BOS/EOS/FIM)
    fim_docs: int = 0  # documents with at least one FIM span
    fim_members: int = 0  # FIM spans: one per FIM document in file mode, per member file else
    # Row-utilization histogram: counts over equal bins of [0, 1] (last bin includes 1.0).
    histogram: list[int] = Field(default_factory=list)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def utilization(self) -> float:
        return self.valid_tokens / (self.rows * self.seq_len) if self.rows else 0.0

    @computed_field  # type: ignore[prop-decorator]
    @property
    def docs_per_row(self) -> float:
        return self.pieces / self.rows if self.rows else 0.0

    @computed_field  # type: ignore[prop-decorator]
    @property
    def avg_doc_tokens(self) -> float:
        return self.doc_tokens / self.docs if self.docs else 0.0

    @computed_field  # type: ignore[prop-decorator]
    @property
    def cropped_doc_frac(self) -> float:
        return self.cropped_docs / self.docs if self.docs else 0.0

    def histogram_edges(self) -> np.ndarray:
        return np.linspace(0.0, 1.0, len(self.histogram) + 1)

    def merge(self, other: PackingTelemetry) -> PackingTelemetry:
        if (self.policy, self.seq_len) != (other.policy, other.seq_len):
            raise ValueError("telemetry of different policies or seq_len does not add up")
        hist = other.histogram if not self.histogram else self.histogram
        if self.histogram and other.histogram:
            hist = [a + b for a, b in zip(self.histogram, other.histogram, strict=True)]
        return PackingTelemetry(
            policy=self.policy,
            seq_len=self.seq_len,
            rows=self.rows + other.rows,
            valid_tokens=self.valid_tokens + other.valid_tokens,
            docs=self.docs + other.docs,
            pieces=self.pieces + other.pieces,
            cropped_docs=self.cropped_docs + other.cropped_docs,
            doc_tokens=self.doc_tokens + other.doc_tokens,
            fim_docs=self.fim_docs + other.fim_docs,
            fim_members=self.fim_members + other.fim_members,
            histogram=list(hist),
        )


@dataclass
class PackedBatch:
    split: str
    rows: pa.Table  # packed_rows_schema(seq_len)
    pieces: pa.Table  # PIECES_SCHEMA
    telemetry: PackingTelemetry | None = None


def _excl_cumsum(x: np.ndarray) -> np.ndarray:
    out = np.zeros(x.size, dtype=np.int64)
    if x.size > 1:
        np.cumsum(x[:-1], out=out[1:])
    return out


def _concat_ranges(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Indices start[0]..start[0]+len[0]-1, start[1]..., as one array (no Python loop)."""
    lengths = lengths.astype(np.int64)
    total = int(lengths.sum())
    return np.arange(total, dtype=np.int64) + np.repeat(
        starts.astype(np.int64) - _excl_cumsum(lengths), lengths
    )


def _uniform(seed: int, doc_ids: np.ndarray, stream: int) -> np.ndarray:
    """splitmix64 of (seed, doc id, stream): a per-document uniform in [0, 1) that does not
    depend on window boundaries or input order."""
    with np.errstate(over="ignore"):
        x = (
            doc_ids.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)
            + np.uint64(
                (seed * 0x632BE59BD9B4E019 + stream * 0xD1B54A32D192ED03) & 0xFFFFFFFFFFFFFFFF
            )
        ) & _MASK64
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        x = x ^ (x >> np.uint64(31))
    return (x >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))


def draw_keys(source_ids: Sequence[str], paths: Sequence[str]) -> np.ndarray:
    """A 64-bit key per document from its source and path: what its weighted draw is seeded
    by. Not the doc_id: doc_ids shift when a refresh adds a file, and a draw must stay with
    its document so a refresh changes the mixture only where the files changed."""
    return np.fromiter(
        (
            int.from_bytes(hashlib.blake2b(f"{s}\0{p}".encode(), digest_size=8).digest(), "little")
            for s, p in zip(source_ids, paths, strict=True)
        ),
        dtype=np.uint64,
        count=len(paths),
    )


def document_draws(keys: np.ndarray, weight: float, seed: int) -> np.ndarray:
    """How many times each document is packed at `weight`: floor(weight), plus one when the
    seeded uniform of its key is below the fractional part (int32, one per key)."""
    if not weight > 0:
        raise ValueError(f"weight {weight}: must be > 0")
    base = math.floor(weight)
    extra = _uniform(seed, keys, WEIGHT_STREAM) < (weight - base)
    return (base + extra).astype(np.int32)


def max_draws(weight: float) -> int:
    """The most copies a document of this weight gets: the passes over its source."""
    return math.ceil(weight)


def _fim_cuts(
    config: PackingConfig,
    doc_ids: np.ndarray,
    n_tok: np.ndarray,
    kinds: np.ndarray,
    tok_offsets: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(is_fim, a, b) per document: the middle is tokens [a, b) of the document."""
    n_docs = doc_ids.size
    is_fim = (_uniform(config.seed, doc_ids, 0) < config.fim_rate) & (n_tok > 0)
    a = n_tok.astype(np.int64).copy()
    b = n_tok.astype(np.int64).copy()
    u1 = _uniform(config.seed, doc_ids, 1)
    u2 = _uniform(config.seed, doc_ids, 2)
    if config.fim_mode == FimMode.RANDOM:
        lo = np.minimum(u1, u2)
        hi = np.maximum(u1, u2)
        a_r = np.minimum((lo * (n_tok + 1)).astype(np.int64), n_tok)
        b_r = np.minimum((hi * (n_tok + 1)).astype(np.int64), n_tok)
        a = np.where(is_fim, a_r, a)
        b = np.where(is_fim, b_r, b)
        return is_fim, a, b
    # Structured: runs of equal chunk kind inside a document; eligible runs are the wanted
    # kinds; one is picked per document by u2. Documents without one get no FIM.
    total = kinds.size
    if total == 0:
        return np.zeros(n_docs, dtype=bool), a, b
    tok_doc = np.repeat(np.arange(n_docs), n_tok)
    change = np.ones(total, dtype=bool)
    change[1:] = (kinds[1:] != kinds[:-1]) | (tok_doc[1:] != tok_doc[:-1])
    run_start = np.flatnonzero(change)
    run_end = np.append(run_start[1:], total)
    run_kind = kinds[run_start]
    if config.fim_structured_kinds:
        eligible = np.isin(run_kind, np.array(config.fim_structured_kinds, dtype=np.uint8))
    else:
        eligible = run_kind != 0
    run_start, run_end = run_start[eligible], run_end[eligible]
    run_doc = tok_doc[run_start]
    per_doc = np.bincount(run_doc, minlength=n_docs)
    first_run = _excl_cumsum(per_doc)
    is_fim &= per_doc > 0
    pick = first_run + np.minimum((u2 * per_doc).astype(np.int64), np.maximum(per_doc - 1, 0))
    pick = np.minimum(pick, max(run_start.size - 1, 0))
    if run_start.size:
        a = np.where(is_fim, run_start[pick] - tok_offsets[:-1], a)
        b = np.where(is_fim, run_end[pick] - tok_offsets[:-1], b)
    return is_fim, a, b


def _fim_bodies(
    tokens: np.ndarray,
    kinds: np.ndarray,
    n_tok: np.ndarray,
    is_fim: np.ndarray,
    a: np.ndarray,
    b: np.ndarray,
    special: SpecialIds,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Document bodies in PSM order for FIM documents (PRE prefix SUF suffix MID middle),
    unchanged for the others; BOS/EOS are added by the row fill. Returns tokens, kinds and
    body lengths. Every document is six (start, length) segments into `tokens` extended by
    the three FIM ids, so one gather builds the whole window."""
    t = tokens.size
    fim_ids = [special.fim_prefix, special.fim_suffix, special.fim_middle]
    ext_tokens = np.concatenate([tokens, np.array(fim_ids, dtype=np.int32)])
    ext_kinds = np.concatenate([kinds, np.zeros(3, dtype=np.uint8)])
    s = _excl_cumsum(n_tok)
    f = is_fim.astype(np.int64)
    n = n_tok.astype(np.int64)
    seg_start = np.stack(
        [
            np.full_like(n, t),  # FIM prefix
            s,  # prefix (the whole document without FIM)
            np.full_like(n, t + 1),  # FIM suffix
            s + b,  # suffix
            np.full_like(n, t + 2),  # FIM middle
            s + a,  # middle
        ],
        axis=1,
    ).ravel()
    seg_len = np.stack([f, a, f, n - b, f, b - a], axis=1).ravel()
    idx = _concat_ranges(seg_start, seg_len)
    return ext_tokens[idx], ext_kinds[idx], n + 3 * f


def _member_spans(
    column: pa.ChunkedArray, doc_ids: np.ndarray, n_tok: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """(draw key, document index, length) of every member of the window's documents, in
    token order; None when no document lists members (file mode). Member i of document d
    draws with key d + i * 2**32, so a document's first member draws as the document would."""
    col = column.combine_chunks()
    if col.null_count == len(col):
        return None
    n_docs = doc_ids.size
    lens = pc.list_value_length(col).fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
    flat_arr = pc.list_flatten(col)
    if flat_arr.null_count:
        first_null = np.flatnonzero(flat_arr.is_null().to_numpy(zero_copy_only=False))[0]
        bad = int(doc_ids[pc.list_parent_indices(col).to_numpy()[first_null]])
        raise PackingInputError(f"doc_id {bad}: member_starts holds a null")
    flat = flat_arr.to_numpy(zero_copy_only=False).astype(np.int64)
    k = np.maximum(lens, 1)
    first = _excl_cumsum(k)
    seg_doc = np.repeat(np.arange(n_docs), k)
    seg_pos = np.arange(seg_doc.size) - first[seg_doc]
    starts = np.zeros(seg_doc.size, dtype=np.int64)
    starts[np.repeat(lens > 0, k)] = flat
    ends = np.empty_like(starts)
    ends[:-1] = starts[1:]
    ends[first + k - 1] = n_tok
    wrong = ((seg_pos == 0) & (starts != 0)) | (ends < starts)
    if wrong.any():
        bad = int(doc_ids[seg_doc[np.flatnonzero(wrong)[0]]])
        raise PackingInputError(
            f"doc_id {bad}: member_starts must start at 0, not decrease and stay within the "
            "document's tokens"
        )
    key = doc_ids.astype(np.uint64)[seg_doc] + (seg_pos.astype(np.uint64) << np.uint64(32))
    return key, seg_doc, ends - starts


def _place_best_fit(lengths: np.ndarray, seq_len: int) -> tuple[np.ndarray, np.ndarray]:
    """Best-fit decreasing: longest piece first, each into the open row whose free space is
    the smallest that still holds it. Returns (row, offset) per piece."""
    order = np.lexsort((np.arange(lengths.size), -lengths))
    row = np.empty(lengths.size, dtype=np.int64)
    offset = np.empty(lengths.size, dtype=np.int64)
    fill: list[int] = []
    # Open rows keyed by free << 32 | row, kept sorted: bisect finds the best fit.
    free_keys: list[int] = []
    for i, length in zip(order.tolist(), lengths[order].tolist(), strict=True):
        pos = bisect.bisect_left(free_keys, length << 32)
        if pos < len(free_keys):
            key = free_keys.pop(pos)
            r = key & 0xFFFFFFFF
            free = (key >> 32) - length
        else:
            r = len(fill)
            fill.append(0)
            free = seq_len - length
        row[i] = r
        offset[i] = fill[r]
        fill[r] += length
        if free > 0:
            bisect.insort(free_keys, (free << 32) | r)
    return row, offset


def _place_sequential(lengths: np.ndarray, seq_len: int) -> tuple[np.ndarray, np.ndarray]:
    row = np.empty(lengths.size, dtype=np.int64)
    offset = np.empty(lengths.size, dtype=np.int64)
    r, fill = -1, seq_len
    for i, length in enumerate(lengths.tolist()):
        if fill + length > seq_len:
            r, fill = r + 1, 0
        row[i] = r
        offset[i] = fill
        fill += length
    return row, offset


def _fixed(values: np.ndarray, arrow_type: pa.DataType, seq_len: int) -> pa.FixedSizeListArray:
    return pa.FixedSizeListArray.from_arrays(pa.array(values, type=arrow_type), seq_len)


def _rows_table(pack_ids: np.ndarray, cols: _RowColumns, seq_len: int) -> pa.Table:
    return pa.Table.from_arrays(
        [
            pa.array(pack_ids, pa.int64()),
            _fixed(cols.input_ids, pa.int32(), seq_len),
            _fixed(cols.target_ids, pa.int32(), seq_len),
            _fixed(cols.loss_mask, pa.uint8(), seq_len),
            _fixed(cols.doc_ids, pa.int32(), seq_len),
            pa.array(cols.valid.astype(np.int32), pa.int32()),
            pa.array(cols.num_docs, pa.int32()),
            _fixed(cols.chunk_kind, pa.uint8(), seq_len),
        ],
        schema=packed_rows_schema(seq_len),
    )


@dataclass
class _Placement:
    """Pieces sorted by (row, offset): where each piece of the window goes."""

    row: np.ndarray
    offset: np.ndarray
    length: np.ndarray
    doc: np.ndarray  # index of the document in the window
    index: np.ndarray  # piece index within its document
    n_rows: int


@dataclass
class _RowColumns:
    input_ids: np.ndarray  # flat [n_rows * seq_len]
    target_ids: np.ndarray
    loss_mask: np.ndarray
    doc_ids: np.ndarray
    chunk_kind: np.ndarray
    valid: np.ndarray  # [n_rows]
    num_docs: np.ndarray


def _fill_rows(
    placed: _Placement,
    body: np.ndarray,
    body_kinds: np.ndarray,
    n_body: np.ndarray,
    doc_ids: np.ndarray,
    seq_len: int,
    special: SpecialIds,
) -> _RowColumns:
    """The token columns of the window's rows, each in one vectorized pass.

    The rows, read in order, are segments -- each row's pieces, then its pad run -- gathered
    from `ext` = body ++ seq_len pads with one index array. Stream position j of a document
    is body[start + j - 1]; j = 0 (BOS) and j = last (EOS) read a neighbour or a pad and are
    overwritten afterwards, which keeps the gather branch-free."""
    n_rows, p_len, p_index = placed.n_rows, placed.length, placed.index
    valid = np.bincount(placed.row, weights=p_len, minlength=n_rows).astype(np.int64)
    num_docs = np.bincount(placed.row, minlength=n_rows).astype(np.int32)
    t = body.size
    ext = np.concatenate([body, np.full(seq_len, special.pad, dtype=np.int32)])
    ext_kinds = np.concatenate([body_kinds, np.zeros(seq_len, dtype=np.uint8)])
    n_seg = p_len.size + n_rows
    seg_pos = np.arange(p_len.size) + placed.row  # each row's pad segment follows its pieces
    pad_pos = np.cumsum(num_docs) + np.arange(n_rows)
    seg_src = np.empty(n_seg, dtype=np.int64)
    seg_len = np.empty(n_seg, dtype=np.int64)
    seg_doc = np.empty(n_seg, dtype=np.int32)
    seg_src[seg_pos] = _excl_cumsum(n_body)[placed.doc] + p_index * seq_len - 1
    seg_len[seg_pos], seg_doc[seg_pos] = p_len, doc_ids[placed.doc]
    seg_src[pad_pos], seg_len[pad_pos], seg_doc[pad_pos] = t, seq_len - valid, PAD_DOC_ID
    idx = _concat_ranges(seg_src, seg_len)
    idx[idx < 0] = t  # the first document's BOS slot
    input_ids = ext[idx]
    chunk_kind = ext_kinds[idx]
    piece_out = _excl_cumsum(seg_len)[seg_pos]
    piece_last = piece_out + p_len - 1
    first = piece_out[p_index == 0]
    eos = piece_last[(p_index + 1) * seq_len >= n_body[placed.doc] + 2]
    input_ids[first], chunk_kind[first] = special.bos, 0
    input_ids[eos], chunk_kind[eos] = special.eos, 0
    row_doc_ids = np.repeat(seg_doc, seg_len)

    target_ids = np.empty(n_rows * seq_len, dtype=np.int32)
    target_ids[:-1] = input_ids[1:]
    target_ids[piece_last] = IGNORE_INDEX  # a piece's last slot has no target
    target_ids[row_doc_ids == PAD_DOC_ID] = IGNORE_INDEX
    return _RowColumns(
        input_ids=input_ids,
        target_ids=target_ids,
        loss_mask=(target_ids != IGNORE_INDEX).view(np.uint8),
        doc_ids=row_doc_ids,
        chunk_kind=chunk_kind,
        valid=valid,
        num_docs=num_docs,
    )


class _SplitPacker:
    """Packs one split's windows; owns that split's pack_id counter."""

    def __init__(
        self, split: str, config: PackingConfig, special: SpecialIds, block: int = 0, copy: int = 0
    ) -> None:
        self.split = split
        self.copy = copy  # which copy of its documents this packer places (the pieces say)
        self.config = config
        self.special = special
        self.next_pack_id = block_base(split, block)
        self.pending: list[pa.Table] = []
        self.pending_docs = 0

    def add(self, table: pa.Table) -> Iterator[PackedBatch]:
        self.pending.append(table)
        self.pending_docs += table.num_rows
        while self.pending_docs >= self.config.window_docs:
            merged = pa.concat_tables(self.pending)
            window = merged.slice(0, self.config.window_docs)
            rest = merged.slice(self.config.window_docs)
            self.pending = [rest] if rest.num_rows else []
            self.pending_docs = rest.num_rows
            yield self.pack_window(window)

    def flush(self) -> Iterator[PackedBatch]:
        if self.pending_docs:
            window = pa.concat_tables(self.pending)
            self.pending, self.pending_docs = [], 0
            yield self.pack_window(window)

    def pack_window(self, window: pa.Table) -> PackedBatch:
        config, seq_len = self.config, self.config.seq_len
        doc_ids = window.column("doc_id").to_numpy().astype(np.int32)
        if doc_ids.size and doc_ids.min() < 0:
            # -1 marks pads in doc_ids; a negative document id would read as padding.
            raise PackingInputError(f"doc_id {int(doc_ids.min())}: document ids must be >= 0")
        token_col = window.column("token_ids").combine_chunks()
        kind_col = window.column("chunk_kind").combine_chunks()
        n_tok = pc.list_value_length(token_col).to_numpy(zero_copy_only=False).astype(np.int64)
        n_kind = pc.list_value_length(kind_col).to_numpy(zero_copy_only=False).astype(np.int64)
        if not np.array_equal(n_tok, n_kind):
            bad = int(doc_ids[np.flatnonzero(n_tok != n_kind)[0]])
            raise PackingInputError(f"doc_id {bad}: chunk_kind length differs from token_ids")
        tokens = pc.list_flatten(token_col).to_numpy(zero_copy_only=False)
        kinds = pc.list_flatten(kind_col).to_numpy(zero_copy_only=False)
        tok_offsets = np.concatenate([[0], np.cumsum(n_tok)])

        members = _member_spans(window.column("member_starts"), doc_ids, n_tok)
        fim_members = 0
        if self.split == "train" and config.fim_rate > 0 and members is None:
            is_fim, a, b = _fim_cuts(config, doc_ids, n_tok, kinds, tok_offsets)
            body, body_kinds, n_body = _fim_bodies(tokens, kinds, n_tok, is_fim, a, b, self.special)
            fim_members = int(is_fim.sum())
        elif self.split == "train" and config.fim_rate > 0 and members is not None:
            # The same two steps over members instead of documents: members partition the
            # window's tokens in order, so their bodies concatenate into the documents'.
            key, m_doc, m_tok = members
            m_offsets = np.concatenate([[0], np.cumsum(m_tok)])
            m_fim, a, b = _fim_cuts(config, key, m_tok, kinds, m_offsets)
            body, body_kinds, m_body = _fim_bodies(tokens, kinds, m_tok, m_fim, a, b, self.special)
            n_body = np.bincount(m_doc, weights=m_body, minlength=n_tok.size).astype(np.int64)
            is_fim = np.bincount(m_doc, weights=m_fim, minlength=n_tok.size) > 0
            fim_members = int(m_fim.sum())
        else:
            is_fim = np.zeros(n_tok.size, dtype=bool)
            body, body_kinds, n_body = tokens, kinds, n_tok
        n_stream = n_body + 2  # BOS + body + EOS

        # Cut each document stream into pieces of at most seq_len.
        n_pieces = -(-n_stream // seq_len)
        piece_doc = np.repeat(np.arange(n_stream.size), n_pieces)
        piece_index = np.arange(piece_doc.size) - np.repeat(_excl_cumsum(n_pieces), n_pieces)
        piece_len = np.minimum(seq_len, n_stream[piece_doc] - piece_index * seq_len)

        if config.policy == PackingPolicy.BEST_FIT:
            row, offset = _place_best_fit(piece_len, seq_len)
        elif config.policy == PackingPolicy.PACKED_ROWS:
            row, offset = _place_sequential(piece_len, seq_len)
        else:
            row, offset = np.arange(piece_len.size), np.zeros(piece_len.size, dtype=np.int64)
        order = np.lexsort((offset, row))
        placed = _Placement(
            row=row[order],
            offset=offset[order],
            length=piece_len[order],
            doc=piece_doc[order],
            index=piece_index[order],
            n_rows=int(row.max()) + 1 if row.size else 0,
        )
        pack_ids = self.next_pack_id + np.arange(placed.n_rows, dtype=np.int64)
        self.next_pack_id += placed.n_rows
        # the rows one row group at a time (the chunks the writer keeps as row groups): a
        # window holding one huge file never has all its rows' temporaries at once
        group = row_group_rows(seq_len)
        first_piece = np.searchsorted(placed.row, np.arange(0, placed.n_rows + group, group))
        chunks, valid = [], []
        for k, r0 in enumerate(range(0, placed.n_rows, group)):
            lo, hi = int(first_piece[k]), int(first_piece[k + 1])
            part = _Placement(
                row=placed.row[lo:hi] - r0,
                offset=placed.offset[lo:hi],
                length=placed.length[lo:hi],
                doc=placed.doc[lo:hi],
                index=placed.index[lo:hi],
                n_rows=min(group, placed.n_rows - r0),
            )
            cols = _fill_rows(part, body, body_kinds, n_body, doc_ids, seq_len, self.special)
            chunks.append(_rows_table(pack_ids[r0 : r0 + part.n_rows], cols, seq_len))
            valid.append(cols.valid)
        rows = pa.concat_tables(chunks) if chunks else packed_rows_schema(seq_len).empty_table()
        pieces = pa.Table.from_arrays(
            [
                pa.array(doc_ids[placed.doc], pa.int32()),
                pa.array(placed.index.astype(np.int32), pa.int32()),
                pa.array(pack_ids[placed.row], pa.int64()),
                pa.array(placed.offset.astype(np.int32), pa.int32()),
                pa.array(placed.length.astype(np.int32), pa.int32()),
                pa.repeat(pa.scalar(self.split, pa.string()), placed.row.size),
                pa.array(np.full(placed.row.size, self.copy, np.int32), pa.int32()),
            ],
            schema=PIECES_SCHEMA,
        )
        telemetry = None
        if config.packing_telemetry:
            valid_tokens = np.concatenate(valid) if valid else np.zeros(0, np.int64)
            utilization = valid_tokens / seq_len
            hist, _ = np.histogram(utilization, bins=config.histogram_bins, range=(0.0, 1.0))
            telemetry = PackingTelemetry(
                policy=str(config.policy),
                seq_len=seq_len,
                rows=placed.n_rows,
                valid_tokens=int(valid_tokens.sum()),
                docs=int(n_tok.size),
                pieces=int(placed.length.size),
                cropped_docs=int((n_pieces > 1).sum()),
                doc_tokens=int(n_tok.sum()),
                fim_docs=int(is_fim.sum()),
                fim_members=fim_members,
                histogram=[int(c) for c in hist],
            )
        return PackedBatch(split=self.split, rows=rows, pieces=pieces, telemetry=telemetry)


def _own_buffers(table: pa.Table) -> pa.Table:
    """`table` in buffers of its own (a slice shares its parent's)."""
    return pa.Table.from_arrays(
        [pa.concat_arrays(column.chunks) for column in table.columns], schema=table.schema
    )


# With windows_per_task unset, a split is cut into about this many blocks (enough for the
# cores of a large host to pack side by side), each of at most MAX_BLOCK_WINDOWS windows (so
# a terabyte's split is tens of thousands of tasks, not hundreds of thousands).
TARGET_BLOCKS = 64
MAX_BLOCK_WINDOWS = 16


def block_windows(config: PackingConfig, documents: int) -> int:
    """Windows per block for a split of `documents` documents: the configured number, else
    the fewest that cut the split into at most TARGET_BLOCKS blocks, capped at
    MAX_BLOCK_WINDOWS. A function of the split's size alone, never of the workers."""
    if config.windows_per_task is not None:
        return config.windows_per_task
    windows = -(-documents // config.window_docs)
    return max(1, min(MAX_BLOCK_WINDOWS, -(-windows // TARGET_BLOCKS)))


def block_base(split: str, block: int) -> int:
    """The first pack_id of a block of one split."""
    return PACK_ID_BASE[split] + (block << BLOCK_SHIFT)


def _columns(table: pa.Table) -> pa.Table:
    """A document table checked and cut to what the packer reads (member_starts null when
    the table has none: one member per document)."""
    missing = {"doc_id", "token_ids", "chunk_kind", "split"} - set(table.column_names)
    if missing:
        raise PackingInputError(f"document table lacks columns {sorted(missing)}")
    unknown = set(pc.unique(table.column("split")).to_pylist()) - set(SPLITS)
    if unknown:
        raise PackingInputError(f"split: unknown values {sorted(map(str, unknown))}")
    if "member_starts" not in table.column_names:
        table = table.append_column(
            "member_starts", pa.nulls(table.num_rows, _INPUT_SCHEMA.field("member_starts").type)
        )
    return table.select(_INPUT_SCHEMA.names).cast(_INPUT_SCHEMA)


def pack(
    docs: Iterable[pa.Table], config: PackingConfig, special: SpecialIds
) -> Iterator[PackedBatch]:
    """Packed rows, one split per batch, one batch per window of `window_docs` documents.

    Each input table has doc_id (int32), token_ids (list<int32>), chunk_kind (list<uint8>)
    and split, and may have member_starts (list<int32>: a repository document's member
    files, for FIM per file; absent or null is one member); documents are taken in input
    order, so the output does not depend on how the input is cut into tables."""
    packers = {split: _SplitPacker(split, config, special) for split in SPLITS}
    for table in docs:
        if table.num_rows == 0:
            continue
        split_col = table.column("split")
        columns = _columns(table)
        # Each run of one split, copied out of the input table when it is only part of it
        # (Arrow's filter/take copy list columns slowly; concatenation is a memcpy): a
        # zero-copy slice would keep the whole input table alive while its run waits for
        # a window, and the validation window fills only every few dozen input tables, so
        # memory would grow with the corpus.
        is_train = pc.equal(split_col, "train").to_numpy(zero_copy_only=False)
        run_starts = np.flatnonzero(np.diff(is_train, prepend=~is_train[:1])).tolist()
        for lo, hi in zip(run_starts, [*run_starts[1:], table.num_rows], strict=True):
            packer = packers["train" if is_train[lo] else "validation"]
            run = columns.slice(lo, hi - lo)
            yield from packer.add(run if hi - lo == table.num_rows else _own_buffers(run))
    for packer in packers.values():
        yield from packer.flush()


def pack_block(
    docs: Iterable[pa.Table],
    split: str,
    block: int,
    config: PackingConfig,
    special: SpecialIds,
    copy: int = 0,
) -> Iterator[PackedBatch]:
    """One block of one split: its documents (all of `split`, in doc order) packed window
    by window, pack_ids from the block's base, their pieces marked as copy `copy`. The
    windows of the whole split, cut into blocks of whole windows (`block_windows`), pack to
    exactly the rows `pack` gives them; only the pack_ids say which block a row came from."""
    packer = _SplitPacker(split, config, special, block, copy)
    for table in docs:
        if table.num_rows == 0:
            continue
        columns = _columns(table)
        if set(pc.unique(table.column("split")).to_pylist()) != {split}:
            raise PackingInputError(f"a {split} block holds documents of another split")
        yield from packer.add(columns)
    yield from packer.flush()


def restore_fim_order(
    stream: np.ndarray, special: SpecialIds, member_starts: Iterable[int] | None = None
) -> np.ndarray:
    """A document's packed stream in reading order: BOS PRE p SUF s MID m EOS becomes
    BOS p m s EOS; a stream without FIM comes back unchanged. For readers that rebuild a
    document from its pieces (the round-trip check). Control ids never come from text, so
    the first SUF and MID are the markers.

    A repository document (FIM per member) needs its `member_starts` (document_files'
    start_token, in position order): where a member's middle ends is not marked in the
    stream, but its length is known from them."""
    stream = np.asarray(stream)
    if member_starts is not None:
        starts = np.asarray(list(member_starts), dtype=np.int64)
        if starts.size > 1:
            return _restore_members(stream, special, starts)
    if stream.size < 5 or stream[1] != special.fim_prefix:
        return stream
    suf = int(np.flatnonzero(stream == special.fim_suffix)[0])
    mid = int(np.flatnonzero(stream == special.fim_middle)[0])
    return np.concatenate(
        [stream[:1], stream[2:suf], stream[mid + 1 : -1], stream[suf + 1 : mid], stream[-1:]]
    )


def _restore_members(stream: np.ndarray, special: SpecialIds, starts: np.ndarray) -> np.ndarray:
    n_fim = int(np.count_nonzero(stream == special.fim_prefix))
    lengths = np.diff(np.append(starts, stream.size - 2 - 3 * n_fim))
    parts = [stream[:1]]
    pos = 1
    for length in lengths.tolist():
        if length > 0 and stream[pos] == special.fim_prefix:
            unit = stream[pos : pos + length + 3]
            suf = int(np.flatnonzero(unit == special.fim_suffix)[0])
            mid = int(np.flatnonzero(unit == special.fim_middle)[0])
            parts += [unit[1:suf], unit[mid + 1 :], unit[suf + 1 : mid]]
            pos += length + 3
        else:
            parts.append(stream[pos : pos + length])
            pos += length
    parts.append(stream[pos:])
    return np.concatenate(parts)


def merge_telemetry(batches: Iterable[PackedBatch]) -> PackingTelemetry | None:
    total: PackingTelemetry | None = None
    for batch in batches:
        if batch.telemetry is not None:
            total = batch.telemetry if total is None else total.merge(batch.telemetry)
    return total
