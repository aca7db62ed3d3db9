"""Rows of a table picked by a mask, copied run by run: Arrow's filter copies list columns
(token ids, chunk kinds) element by element, while a run of consecutive rows is one slice
and the concatenation of the runs one memcpy per buffer (10-100x faster on token lists)."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pyarrow as pa


def rows_where(table: pa.Table, mask: npt.NDArray[np.bool_]) -> pa.Table:
    """The rows of `table` where `mask` is true, in order, in buffers of their own."""
    if len(mask) != table.num_rows:
        raise ValueError(f"a mask of {len(mask)} rows for a table of {table.num_rows}")
    if not mask.any():
        return table.slice(0, 0)
    edges = np.flatnonzero(np.diff(np.r_[False, mask, False].astype(np.int8)))
    starts, ends = edges[0::2], edges[1::2]
    parts = [table.slice(int(a), int(b - a)) for a, b in zip(starts, ends, strict=True)]
    return pa.concat_tables(parts).combine_chunks()
