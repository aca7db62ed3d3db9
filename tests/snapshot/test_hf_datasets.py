"""Hugging Face `datasets`, a consumer nobody here wrote, reads a split's shards with the
fixed row shape and exactly the values our loader hands out."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from megacpp_pipeline.loader import PackedRowsLoader
from megacpp_pipeline.snapshot.packed_rows import REQUIRED_COLUMNS, TOKEN_COLUMNS
from tests.fixtures.snapshot_fixture import build_snapshot

datasets = pytest.importorskip("datasets", reason="datasets is a dev dependency")


@pytest.mark.parametrize("split", ["train", "validation"])
def test_load_dataset_parquet_reads_rows_of_seq_len_equal_to_the_loader(
    tmp_path: Path, split: str
) -> None:
    fixture = build_snapshot(tmp_path / "snap")
    shards = [str(fixture.path / s) for s in fixture.splits[split].shards]
    dataset = datasets.load_dataset(
        "parquet", data_files={split: shards}, split=split, cache_dir=str(tmp_path / "hf")
    )
    assert set(REQUIRED_COLUMNS) <= set(dataset.column_names)
    table = dataset.with_format("numpy")[:]

    loader = PackedRowsLoader(
        fixture.path,
        split=split,
        batch_size=1,
        shuffle=False,
        drop_last=False,
        prefetch=False,
        cache_dir=tmp_path / "cache",
    )
    rows = list(loader)
    assert len(dataset) == len(rows) == loader.total_rows
    ours = {name: np.concatenate([row[name] for row in rows]) for name in loader.columns}

    for name in TOKEN_COLUMNS:
        hf = np.asarray(table[name])
        assert hf.shape == (len(dataset), fixture.seq_len), name
        np.testing.assert_array_equal(hf, ours[name])
    for name in ("pack_id", "valid_token_count", "num_docs"):
        np.testing.assert_array_equal(np.asarray(table[name]), ours[name])
