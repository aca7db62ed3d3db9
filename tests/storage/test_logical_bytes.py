"""Shards and row groups are cut by the rows' values, not by how their buffers are laid out:
the same rows write the same bytes whether they come from a gate, a cache hit or a slice."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from megacpp_pipeline.storage.store import ShardStore, ShardUploader, logical_bytes


def _texts(n: int) -> pa.Table:
    texts = [f"int f{i}() {{ return {i}; }}\n" * (1 + i % 50) for i in range(n)]
    table = pa.table({"path": [f"src/f{i}.cc" for i in range(n)], "text": texts})
    # bytes per row just under a whole number, where `nbytes` moved by a validity bitmap
    # (an eighth of a byte a row) cut the row groups one row apart
    texts[-1] += "x" * (-table.nbytes % n - 1)
    return pa.table({"path": [f"src/f{i}.cc" for i in range(n)], "text": texts})


def _other_layouts(table: pa.Table) -> list[pa.Table]:
    """The same rows: text with a validity bitmap (as an if_else leaves it), a slice of a
    larger table, many chunks."""
    with_bitmap = pc.if_else(
        pa.array([True] * table.num_rows), table["text"], pa.scalar(None, pa.string())
    )
    bigger = pa.concat_tables([table, table]).combine_chunks()
    return [
        table.set_column(1, pa.field("text", pa.string()), with_bitmap),
        bigger.slice(table.num_rows, table.num_rows),
        pa.Table.from_batches(table.to_batches(max_chunksize=7)),
    ]


def test_logical_bytes_are_the_values_not_the_buffers() -> None:
    table = _texts(300)
    assert table["text"].chunk(0).buffers()[0] is None
    for other in _other_layouts(table):
        assert other.equals(table)
        assert logical_bytes(other) == logical_bytes(table)
    assert logical_bytes(table.slice(0, 0)) == 0
    assert logical_bytes(table.slice(0, 10)) < logical_bytes(table)


def test_the_same_rows_write_the_same_shard_bytes_in_any_layout(tmp_path: Path) -> None:
    store = ShardStore(str(tmp_path))
    table = _texts(4000)  # several row groups of ROW_GROUP_BYTES
    written = []
    for i, t in enumerate([table, *_other_layouts(table)]):
        uploader = ShardUploader(store, str(tmp_path / f"v{i}"))
        shard, _ = uploader.write_parquet("part-00000.parquet", t)
        written.append(shard.sha256)
        (path,) = tmp_path.rglob(f"v{i}/part-00000.parquet")
        assert pq.read_metadata(path).num_row_groups > 1
    assert len(set(written)) == 1
