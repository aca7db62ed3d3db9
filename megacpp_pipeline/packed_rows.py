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
    ],
    metadata={"megacpp.table": "pieces", "megacpp.schema_version": PACKED_SCHEMA_VERSION},
)


def fixed_list_to_numpy(column: pa.ChunkedArray | pa.Array, seq_len: int) -> np.ndarray:
    """[rows, seq_len] view of a fixed_size_list column (zero-copy for a single chunk)."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    values = column.flatten() if column.offset else column.values
    return values.to_numpy(zero_copy_only=False).reshape(-1, seq_len)
