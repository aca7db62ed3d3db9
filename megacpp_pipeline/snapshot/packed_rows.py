"""The packed-row training contract (DESIGN section 5): one row = one sequence of exactly
`seq_len` tokens. This module owns the schema; writers and readers import it from here.
Seed rule: fixed-length rows are the load-bearing performance decision; optional structure
columns ride in the same fixed shape and default when missing.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

PACKED_SCHEMA_VERSION = "1"
IGNORE_INDEX = -100  # target_ids value where the loss is masked
PAD_DOC_ID = -1

REQUIRED_COLUMNS = (
    "pack_id",
    "input_ids",
    "target_ids",
    "loss_mask",
    "doc_ids",
    "valid_token_count",
    "num_docs",
)
# Optional per-token columns known to this schema version, with their dtype and default.
OPTIONAL_TOKEN_COLUMNS: dict[str, tuple[pa.DataType, int]] = {
    "chunk_kind": (pa.uint8(), 0),
}
TOKEN_COLUMNS = ("input_ids", "target_ids", "loss_mask", "doc_ids", *OPTIONAL_TOKEN_COLUMNS)


# A rows shard is written in row groups of at most this many bytes of token columns, so a
# reader that goes row group by row group (the checks, the export, the loader) holds a
# bounded part of a shard however many rows one window packed (one 64 MiB file: 10,000+).
ROW_GROUP_BYTES = 32 << 20


def row_group_rows(seq_len: int) -> int:
    """Rows per row group of a rows shard: the largest power of two whose token columns fit
    in ROW_GROUP_BYTES (1024 rows at seq_len 2048), at least 1."""
    schema = packed_rows_schema(seq_len)
    widths = [
        seq_len * f.type.value_type.bit_width if pa.types.is_fixed_size_list(f.type)
        else f.type.bit_width
        for f in schema
    ]  # fmt: skip
    per_row = sum(widths) // 8
    rows = max(1, ROW_GROUP_BYTES // per_row)
    return 1 << (rows.bit_length() - 1)


def packed_rows_schema(seq_len: int, *, with_optional: bool = True) -> pa.Schema:
    fields = [
        pa.field("pack_id", pa.int64(), nullable=False),
        pa.field("input_ids", pa.list_(pa.int32(), seq_len), nullable=False),
        pa.field("target_ids", pa.list_(pa.int32(), seq_len), nullable=False),
        pa.field("loss_mask", pa.list_(pa.uint8(), seq_len), nullable=False),
        pa.field("doc_ids", pa.list_(pa.int32(), seq_len), nullable=False),
        pa.field("valid_token_count", pa.int32(), nullable=False),
        pa.field("num_docs", pa.int32(), nullable=False),
    ]
    if with_optional:
        for name, (dtype, _default) in OPTIONAL_TOKEN_COLUMNS.items():
            fields.append(pa.field(name, pa.list_(dtype, seq_len), nullable=False))
    return pa.schema(
        fields,
        metadata={
            "megacpp.table": "packed_rows",
            "megacpp.schema_version": PACKED_SCHEMA_VERSION,
            "megacpp.seq_len": str(seq_len),
        },
    )


# Where each piece of each document sits in the rows: the boundary receipt that the
# round-trip check, the document-consistency check and the Megatron export all read.
PIECES_SCHEMA = pa.schema(
    [
        pa.field("doc_id", pa.int32(), nullable=False),
        pa.field("piece_index", pa.int32(), nullable=False),
        pa.field("pack_id", pa.int64(), nullable=False),
        pa.field("row_offset", pa.int32(), nullable=False),  # first slot of the piece in its row
        pa.field("length", pa.int32(), nullable=False),
        pa.field("split", pa.string(), nullable=False),
        # which copy of its document the piece belongs to: a source weighted above 1 packs a
        # document more than once (corpus/packing.py: document_draws); 0 for the first
        pa.field("copy", pa.int32(), nullable=False),
    ],
    metadata={"megacpp.table": "pieces", "megacpp.schema_version": PACKED_SCHEMA_VERSION},
)


def with_copy_column(pieces: pa.Table) -> pa.Table:
    """A pieces table with its `copy` column: a snapshot from before source weights has none,
    and every piece there is of its document's one copy."""
    if "copy" in pieces.column_names:
        return pieces
    return pieces.append_column(
        PIECES_SCHEMA.field("copy"), pa.array(np.zeros(pieces.num_rows, np.int32), pa.int32())
    )


def fixed_list_to_numpy(column: pa.ChunkedArray | pa.Array, seq_len: int) -> np.ndarray:
    """[rows, seq_len] view of a fixed_size_list column (zero-copy for a single chunk)."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    # the values of this array's rows only: `.values` is the parent's, whatever the slice
    values = column.values.slice(column.offset * seq_len, len(column) * seq_len)
    return values.to_numpy(zero_copy_only=False).reshape(-1, seq_len)


def validate_rows(table: pa.Table, seq_len: int, vocab_size: int) -> list[str]:
    """Every way `table` breaks the packed-row contract, each naming the column; [] if none.

    Checks the schema (required columns, fixed lists of `seq_len`), token ranges, the pad
    suffix (doc_ids -1, loss masked, targets ignored), that loss_mask agrees with target_ids,
    that every counted target is the next input of the same document, num_docs, and that
    pack_id is unique."""
    problems: list[str] = []
    names = set(table.column_names)
    for name in REQUIRED_COLUMNS:
        if name not in names:
            problems.append(f"{name}: required column missing")
    for name in TOKEN_COLUMNS:
        if name in names:
            dtype = table.schema.field(name).type
            if not pa.types.is_fixed_size_list(dtype) or dtype.list_size != seq_len:
                problems.append(f"{name}: expected fixed_size_list of {seq_len}, got {dtype}")
    if problems or table.num_rows == 0:
        return problems

    # in the columns' own dtypes (no int64 copies), and each slot compared with the next
    # through views rather than shifted copies: this runs over every row of a run twice
    n = table.num_rows
    ids = fixed_list_to_numpy(table.column("input_ids"), seq_len)
    tgt = fixed_list_to_numpy(table.column("target_ids"), seq_len)
    mask = fixed_list_to_numpy(table.column("loss_mask"), seq_len)
    docs = fixed_list_to_numpy(table.column("doc_ids"), seq_len)
    valid = table.column("valid_token_count").to_numpy().astype(np.int64)
    num_docs = table.column("num_docs").to_numpy().astype(np.int64)
    pack_ids = table.column("pack_id").to_numpy()

    def report(column: str, bad: np.ndarray, rule: str) -> None:
        if bad.any():
            rows = np.flatnonzero(bad.reshape(n, -1).any(axis=1))
            example = pack_ids[rows[:3]].tolist()
            problems.append(f"{column}: {rule} ({rows.size} rows, e.g. pack_id {example})")

    report("valid_token_count", (valid < 0) | (valid > seq_len), f"outside [0, {seq_len}]")
    valid = np.clip(valid, 0, seq_len)
    is_valid = np.arange(seq_len)[None, :] < valid[:, None]
    pad = ~is_valid
    report("input_ids", is_valid & _outside(ids, vocab_size), f"outside [0, {vocab_size})")
    report("doc_ids", is_valid & (docs < 0), "negative id inside the valid prefix")
    report("doc_ids", pad & (docs != PAD_DOC_ID), f"pad slot not {PAD_DOC_ID}")
    report("loss_mask", _outside(mask, 2), "not 0/1")
    report("loss_mask", pad & (mask != 0), "pad slot counted in the loss")
    counted = mask == 1
    report("target_ids", counted == (tgt == IGNORE_INDEX), "ignore index disagrees with loss_mask")
    report(
        "target_ids",
        counted & _outside(tgt, vocab_size),
        f"counted target outside [0, {vocab_size})",
    )
    # A counted target must be the next slot's input, of the same document, inside the row.
    here, next_valid = counted[:, :-1], is_valid[:, 1:]
    report(
        "target_ids",
        (here & ~next_valid).any(axis=1) | counted[:, -1],
        "counted target past the valid prefix",
    )
    counted_next = here & next_valid
    change = docs[:, 1:] != docs[:, :-1]
    report("target_ids", counted_next & change, "target crosses a document")
    report("target_ids", counted_next & (tgt[:, :-1] != ids[:, 1:]), "target is not the next input")
    runs = is_valid[:, 0].astype(np.int64) + (next_valid & change).sum(axis=1)
    report("num_docs", num_docs != runs, "differs from the document runs in doc_ids")
    if np.unique(pack_ids).size != n:
        problems.append("pack_id: not unique")
    for name, (_dtype, _default) in OPTIONAL_TOKEN_COLUMNS.items():
        if name in names:
            values = fixed_list_to_numpy(table.column(name), seq_len)
            report(name, pad & (values != _default), f"pad slot not {_default}")
    return problems


def _outside(values: np.ndarray, high: int) -> np.ndarray:
    """values < 0 or values >= high, in one pass for integers (a negative one seen unsigned
    is at least 2^(bits-1), above any `high` a column holds)."""
    if values.dtype.kind == "i" and high <= np.iinfo(values.dtype).max:
        return values.view(values.dtype.str.replace("i", "u")) >= high
    if values.dtype.kind == "u":
        return values >= high
    return (values < 0) | (values >= high)
