"""Rows picked run by run are exactly Arrow's filter, list columns included."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from megacpp_pipeline.core.row_runs import rows_where


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.lists(st.integers(0, 9), max_size=5)), max_size=40))
def test_rows_where_equals_filter(rows: list[tuple[bool, list[int]]]) -> None:
    mask = np.array([m for m, _ in rows], dtype=bool)
    table = pa.table(
        {
            "n": pa.array(range(len(rows)), pa.int64()),
            "tokens": pa.array([t for _, t in rows], pa.list_(pa.int32())),
            "split": pa.array(["validation" if m else "train" for m in mask], pa.string()),
        }
    )
    assert rows_where(table, mask).equals(table.filter(pa.array(mask, pa.bool_())))


def test_a_mask_of_another_length_is_refused() -> None:
    with pytest.raises(ValueError, match="a mask of 2 rows for a table of 3"):
        rows_where(pa.table({"n": [1, 2, 3]}), np.array([True, False]))
