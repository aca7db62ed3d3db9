"""Slices over a version's shards: every row once, in order, about `task_bytes` each (small
shards joined, a large one cut), or exactly `rows_per_slice` rows; read back by a task."""

from __future__ import annotations

import itertools
from pathlib import Path

import pyarrow as pa
import pytest

from megacpp_pipeline.storage import slices
from megacpp_pipeline.storage.store import ShardStore


def _version(tmp_path: Path, shard_rows: list[int], max_rows: int = 1000):
    store = ShardStore(str(tmp_path / "data"), max_rows_per_shard=max_rows)
    version = store.begin("toy", None, code_version="1")
    table = version.table("data", pa.schema([("n", pa.int64()), ("text", pa.string())]))
    start = 0
    for rows in shard_rows:
        table.write(pa.table({"n": range(start, start + rows), "text": ["x" * 200] * rows}))
        table.flush()
        start += rows
    return store, version.commit(), start


def _rows(store: ShardStore, plan: list[slices.Slice]) -> list[int]:
    return [n for s in plan for n in slices.read(store, s.pieces)["n"].to_pylist()]


@pytest.mark.parametrize("task_bytes", [1, 300, 5_000, 1 << 30])
def test_byte_slices_cover_every_row_once_in_order(tmp_path: Path, task_bytes: int) -> None:
    store, manifest, total = _version(tmp_path, [3, 40, 1, 25])
    plan = slices.plan(store, [(manifest, "data")], task_bytes, first_row=7)
    assert _rows(store, plan) == list(range(total))
    assert [s.first_row for s in plan] == list(
        itertools.accumulate([7] + [s.rows for s in plan[:-1]])
    )
    if task_bytes == 1:
        assert all(s.rows == 1 for s in plan)  # never more slices than rows
    if task_bytes == 1 << 30:
        assert len(plan) == 1 and len(plan[0].pieces) == 4  # small shards joined


def test_row_slices_hold_exactly_their_rows(tmp_path: Path) -> None:
    store, manifest, total = _version(tmp_path, [3, 40, 1, 25])
    plan = slices.plan_rows(store, [(manifest, "data")], 10)
    assert [s.rows for s in plan] == [10] * 6 + [9]
    assert _rows(store, plan) == list(range(total))


def test_an_empty_version_has_no_slice(tmp_path: Path) -> None:
    store, manifest, _ = _version(tmp_path, [])
    assert slices.plan(store, [(manifest, "data")], 100) == []
    assert slices.plan_rows(store, [(manifest, "data")], 100) == []


def test_the_planner_gives_every_worker_a_few_slices_but_never_tiny_ones() -> None:
    assert slices.task_bytes_for(100 << 20, 1, 1 << 20) == 1 << 20
    assert slices.task_bytes_for(100 << 20, 16, 1 << 20) == 1 << 20
    assert slices.task_bytes_for(8 << 20, 16, 1 << 20) == (8 << 20) // 64
    assert slices.task_bytes_for(1 << 10, 16, 1 << 20) == slices.MIN_TASK_BYTES
    assert slices.task_bytes_for(1 << 10, 16, 1) == 1  # the engine's ceiling wins


@pytest.mark.parametrize("task_bytes", [1, 300, 5_000, 1 << 30])
def test_uncut_slices_hold_whole_shards_and_every_row_once(tmp_path: Path, task_bytes: int) -> None:
    store, manifest, total = _version(tmp_path, [3, 40, 1, 25])
    plan = slices.plan(store, [(manifest, "data")], task_bytes, cut=False)
    assert _rows(store, plan) == list(range(total))
    sizes = {s.path: s.rows for s in manifest.tables["data"].shards}
    assert all(p.lo == 0 and p.hi == sizes[p.shard.path] for s in plan for p in s.pieces if p.shard)
    if task_bytes <= 300:
        assert len(plan) == 4  # every shard larger than a task: one slice each
    if task_bytes == 1 << 30:
        assert len(plan) == 1


def test_a_piece_of_a_shard_decodes_only_its_row_groups(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import pyarrow.parquet as pq

    from megacpp_pipeline.storage import store as store_module

    monkeypatch.setattr(store_module, "ROW_GROUP_BYTES", 2_000)  # ~9 rows of ~216 B a group
    store, manifest, total = _version(tmp_path, [100])
    [shard] = manifest.tables["data"].shards
    path = Path(store.version_dir(manifest)) / shard.path
    groups = pq.ParquetFile(path).metadata.num_row_groups
    assert groups >= 10
    whole = store.read_shard(manifest, shard)
    for lo, hi in [(0, 100), (0, 1), (9, 10), (13, 57), (99, 100), (50, 50)]:
        part = store.read_shard(manifest, shard, rows=(lo, hi))
        assert part.equals(whole.slice(lo, hi - lo)), (lo, hi)
    plan = slices.plan(store, [(manifest, "data")], 3_000)  # the shard cut among slices
    assert len(plan) > 3 and _rows(store, plan) == list(range(total))


def test_a_few_column_task_is_a_share_of_the_input_per_worker_never_under_the_ceiling() -> None:
    ceiling = 1 << 20
    assert slices.few_column_task_bytes(4 << 20, 2, ceiling) == ceiling  # small input
    big = 64 << 30
    per_task = slices.few_column_task_bytes(big, 16, ceiling)
    assert per_task == big // (16 * slices.SLICES_PER_WORKER)
    assert slices.few_column_task_bytes(big, 64, ceiling) == per_task // 4  # more workers
