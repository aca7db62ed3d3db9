"""The static-shape loader reads a promoted snapshot exactly, shuffles and shards
deterministically, resumes exactly, and fails loudly naming the shard."""

from __future__ import annotations

import gc
import hashlib
import importlib.util
import json
import threading
import time
import traceback
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from megacpp_pipeline.loader import (
    CACHE_FORMAT,
    LoaderConfigError,
    LoaderStateError,
    PackedRowsLoader,
    ShardChecksumError,
    ShardSchemaError,
    SnapshotIncompleteError,
    SnapshotManifestError,
)
from megacpp_pipeline.loader.prefetch import CONSUMER_AWAY_S
from megacpp_pipeline.snapshot.packed_rows import TOKEN_COLUMNS, packed_rows_schema
from tests.fixtures.snapshot_fixture import SnapshotFixture, build_snapshot


@pytest.fixture(scope="module")
def snapshot(tmp_path_factory: pytest.TempPathFactory) -> SnapshotFixture:
    return build_snapshot(tmp_path_factory.mktemp("snap") / "snapshot")


@pytest.fixture(scope="module")
def shared_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("cache")


def _pack_ids(loader: PackedRowsLoader) -> list[np.ndarray]:
    return [batch["pack_id"].copy() for batch in loader]


def _loader_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("megacpp-loader-")]


HANG_GUARD_S = 60.0  # only a hung prefetch thread makes a wait this long; no test waits it out


def _take_a_step(loader: PackedRowsLoader) -> bool:
    """A training step as the prefetcher sees one: the consumer stays away longer than
    `CONSUMER_AWAY_S` (a sleep lasts at least what it is asked, so this only bounds the step
    from below and races nothing), then, once the prefetch thread runs, until the thread holds
    the next block ready. True when the thread was running."""
    time.sleep(2 * CONSUMER_AWAY_S)
    return loader.wait_for_prefetch(HANG_GUARD_S)


def test_directory_without_complete_marker_is_not_a_snapshot(tmp_path: Path) -> None:
    fixture = build_snapshot(tmp_path / "half", complete=False)
    with pytest.raises(SnapshotIncompleteError, match="_COMPLETE"):
        PackedRowsLoader(fixture.path, cache_dir=tmp_path / "cache")


def test_batches_have_static_shapes_and_equal_the_rows_written(
    snapshot: SnapshotFixture, shared_cache: Path
) -> None:
    loader = PackedRowsLoader(snapshot.path, batch_size=5, shuffle=False, cache_dir=shared_cache)
    batches = list(loader)
    assert len(batches) == len(loader) == snapshot.splits["train"].columns["pack_id"].size // 5
    for batch in batches:
        for name in TOKEN_COLUMNS:
            assert batch[name].shape == (5, snapshot.seq_len)
            expected = snapshot.rows_by_pack_id("train", batch["pack_id"], name)
            assert batch[name].dtype == expected.dtype
            np.testing.assert_array_equal(batch[name], expected)
        for name in ("valid_token_count", "num_docs"):
            assert batch[name].shape == (5,)
            np.testing.assert_array_equal(
                batch[name], snapshot.rows_by_pack_id("train", batch["pack_id"], name)
            )


def test_one_epoch_without_drop_last_reads_every_row_exactly_once(
    snapshot: SnapshotFixture, shared_cache: Path
) -> None:
    loader = PackedRowsLoader(
        snapshot.path, split="validation", batch_size=4, drop_last=False, cache_dir=shared_cache
    )
    seen = np.concatenate(_pack_ids(loader))
    expected = snapshot.splits["validation"].columns["pack_id"]
    assert sorted(seen.tolist()) == sorted(expected.tolist())


def test_shuffle_is_seeded_and_moves_whole_row_groups(
    snapshot: SnapshotFixture, shared_cache: Path
) -> None:
    def epoch_rows(seed: int, epoch: int = 0) -> np.ndarray:
        loader = PackedRowsLoader(snapshot.path, batch_size=3, seed=seed, cache_dir=shared_cache)
        loader.set_epoch(epoch)
        return np.concatenate(_pack_ids(loader))

    first = epoch_rows(seed=7)
    np.testing.assert_array_equal(first, epoch_rows(seed=7))
    assert not np.array_equal(first, epoch_rows(seed=8))
    assert not np.array_equal(first, epoch_rows(seed=7, epoch=1))

    # rows of a row group stay together, in their stored order
    stored = [
        pq.ParquetFile(snapshot.path / shard).read_row_group(group).column("pack_id").to_pylist()
        for shard in snapshot.splits["train"].shards
        for group in range(pq.ParquetFile(snapshot.path / shard).num_row_groups)
    ]
    stream = first.tolist()
    for group in stored:
        if group[0] in stream and stream.index(group[0]) + len(group) <= len(stream):
            at = stream.index(group[0])
            assert stream[at : at + len(group)] == group


@settings(max_examples=15, deadline=None)
@given(batch_size=st.integers(1, 7), world_size=st.integers(1, 4), drop_last=st.booleans())
def test_ranks_see_disjoint_rows_and_take_equal_steps_when_dropping_last(
    snapshot: SnapshotFixture, shared_cache: Path, batch_size: int, world_size: int, drop_last: bool
) -> None:
    per_rank = []
    for rank in range(world_size):
        loader = PackedRowsLoader(
            snapshot.path,
            batch_size=batch_size,
            rank=rank,
            world_size=world_size,
            drop_last=drop_last,
            prefetch=False,
            cache_dir=shared_cache,
        )
        per_rank.append(np.concatenate([*_pack_ids(loader), np.empty(0, np.int64)]))
        if drop_last:
            assert len(loader) == snapshot.splits["train"].columns["pack_id"].size // (
                batch_size * world_size
            )
    everything = np.concatenate(per_rank)
    assert len(np.unique(everything)) == len(everything)
    if not drop_last:
        assert len(everything) == snapshot.splits["train"].columns["pack_id"].size


@pytest.fixture(scope="module")
def mixed_snapshot(tmp_path_factory: pytest.TempPathFactory) -> tuple[SnapshotFixture, set[int]]:
    """A snapshot whose first shard lacks the optional `chunk_kind` column; and its pack_ids."""
    fixture = build_snapshot(tmp_path_factory.mktemp("mixed") / "snapshot")
    first = fixture.path / fixture.splits["train"].shards[0]
    table = pq.read_table(first).drop_columns(["chunk_kind"])
    pq.write_table(table, first, row_group_size=4)
    return fixture, set(table["pack_id"].to_pylist())


@settings(max_examples=25, deadline=None)
@given(
    batch_size=st.integers(1, 9),
    world_size=st.integers(1, 3),
    rank_draw=st.integers(0, 2),
    copy=st.booleans(),
    prefetch=st.booleans(),
    drop_last=st.booleans(),
    seed=st.integers(0, 3),
)
def test_every_batch_holds_exactly_the_rows_it_names_with_defaults_where_a_shard_lacks_them(
    mixed_snapshot: tuple[SnapshotFixture, set[int]],
    tmp_path_factory: pytest.TempPathFactory,
    batch_size: int,
    world_size: int,
    rank_draw: int,
    copy: bool,
    prefetch: bool,
    drop_last: bool,
    seed: int,
) -> None:
    # batch sizes that do not divide the 4-row row groups make batches straddle row groups
    # and shards, so some batches mix rows that have `chunk_kind` with rows that do not
    snapshot, lacking = mixed_snapshot
    loader = PackedRowsLoader(
        snapshot.path,
        batch_size=batch_size,
        rank=rank_draw % world_size,
        world_size=world_size,
        drop_last=drop_last,
        seed=seed,
        copy=copy,
        prefetch=prefetch,
        cache_dir=snapshot.path.parent / "cache",
    )
    batches = list(loader)
    assert len(batches) == len(loader)
    for batch in batches:
        pack_ids = batch["pack_id"]
        for name in TOKEN_COLUMNS:
            expected = snapshot.rows_by_pack_id("train", pack_ids, name)
            if name == "chunk_kind":
                expected = np.where(np.isin(pack_ids, list(lacking))[:, None], 0, expected)
            np.testing.assert_array_equal(batch[name], expected)
            assert batch[name].flags.c_contiguous
            assert batch[name].flags.writeable or not copy
    receipts = loader.receipts
    assert [r.batch_index for r in receipts] == list(range(len(batches)))
    for receipt, batch in zip(receipts, batches, strict=True):
        lacks = bool(set(batch["pack_id"].tolist()) & lacking)
        assert receipt.defaulted_columns == (("chunk_kind",) if lacks else ())


def test_state_dict_resumes_exactly_where_a_run_stopped(
    snapshot: SnapshotFixture, shared_cache: Path
) -> None:
    def fresh() -> PackedRowsLoader:
        return PackedRowsLoader(snapshot.path, batch_size=3, seed=3, cache_dir=shared_cache)

    reference = fresh()
    uninterrupted = _pack_ids(reference) + _pack_ids(reference)  # two epochs

    for stop_after in (0, 4, len(reference) - 1, len(reference), len(reference) + 2):
        run = fresh()
        received = []
        iterator = iter(run)
        for _ in range(stop_after):
            try:
                received.append(next(iterator)["pack_id"].copy())
            except StopIteration:
                iterator = iter(run)
                received.append(next(iterator)["pack_id"].copy())
        state = run.state_dict()
        run.close()

        resumed = fresh()
        resumed.load_state_dict(state)
        received += _pack_ids(resumed)
        if state["epoch"] == 0:
            received += _pack_ids(resumed)
        assert len(received) == len(uninterrupted)
        for got, want in zip(received, uninterrupted, strict=True):
            np.testing.assert_array_equal(got, want)


def _epoch_as_lists(loader: PackedRowsLoader) -> list[list[int]]:
    """One epoch of this loader as lists of pack_ids, one per batch."""
    return [batch["pack_id"].tolist() for batch in loader]


@settings(max_examples=20, deadline=None)
@given(
    world_size=st.integers(2, 4),
    batch_size=st.integers(1, 7),
    drop_last=st.booleans(),
    prefetch=st.booleans(),
    stops=st.lists(st.integers(0, 40), min_size=4, max_size=4),
    same_stop=st.booleans(),
)
def test_ranks_resumed_each_from_its_own_state_see_what_an_uninterrupted_run_sees(
    snapshot: SnapshotFixture,
    shared_cache: Path,
    world_size: int,
    batch_size: int,
    drop_last: bool,
    prefetch: bool,
    stops: list[int],
    same_stop: bool,
) -> None:
    # each rank stops after its own number of batches (the same for all when checkpoints
    # are synchronous, as in a trainer), possibly in the second epoch
    def fresh(rank: int) -> PackedRowsLoader:
        return PackedRowsLoader(
            snapshot.path,
            batch_size=batch_size,
            seed=11,
            rank=rank,
            world_size=world_size,
            drop_last=drop_last,
            prefetch=prefetch,
            cache_dir=shared_cache,
        )

    uninterrupted, resumed = [], []
    for rank in range(world_size):
        reference = fresh(rank)
        uninterrupted.append([_epoch_as_lists(reference), _epoch_as_lists(reference)])

        run = fresh(rank)
        received = []
        iterator = iter(run)
        for _ in range(min(stops[0] if same_stop else stops[rank], 2 * len(run))):
            batch = next(iterator, None)
            if batch is None:  # the first epoch is over: the trainer starts the second
                iterator = iter(run)
                batch = next(iterator)
            received.append(batch["pack_id"].tolist())
        state = run.state_dict()
        run.close()

        restarted = fresh(rank)
        restarted.load_state_dict(state)
        received += _epoch_as_lists(restarted)  # the rest of the epoch it stopped in
        if state["epoch"] == 0:
            received += _epoch_as_lists(restarted)
        resumed.append([received[: len(run)], received[len(run) :]])

    assert resumed == uninterrupted
    total = snapshot.splits["train"].columns["pack_id"].size
    for epoch in range(2):
        seen = [row for rank in resumed for batch in rank[epoch] for row in batch]
        assert len(seen) == len(set(seen))  # no row reaches two ranks, or one rank twice
        global_batch = batch_size * world_size
        assert len(seen) == (total // global_batch * global_batch if drop_last else total)


def test_a_state_from_another_configuration_is_refused(
    snapshot: SnapshotFixture, shared_cache: Path
) -> None:
    state = PackedRowsLoader(snapshot.path, batch_size=3, cache_dir=shared_cache).state_dict()
    other = PackedRowsLoader(snapshot.path, batch_size=4, cache_dir=shared_cache)
    with pytest.raises(LoaderStateError, match="batch_size"):
        other.load_state_dict(state)


def test_missing_optional_column_gets_its_default(tmp_path: Path) -> None:
    fixture = build_snapshot(tmp_path / "snap", with_chunk_kind=False)
    loader = PackedRowsLoader(fixture.path, batch_size=4, cache_dir=tmp_path / "cache")
    batch = next(iter(loader))
    assert batch["chunk_kind"].shape == (4, fixture.seq_len)
    assert batch["chunk_kind"].dtype == np.uint8
    assert not batch["chunk_kind"].any()
    assert loader.receipts[0].defaulted_columns == ("chunk_kind",)


def _split_without_batches(root: Path, case: str) -> dict[str, Any]:
    """Write a snapshot at `root` where the loader options returned give no batch at all."""
    fixture = build_snapshot(root, docs_per_split={"train": 6, "validation": 0})
    rows = fixture.splits["train"].columns["pack_id"].size
    if case == "a split without shards":
        return {"split": "validation"}
    if case == "a split whose only shard is empty":
        relpath = "validation/part-00000.parquet"
        pq.write_table(packed_rows_schema(fixture.seq_len).empty_table(), root / relpath)
        manifest = json.loads((root / "manifest.json").read_text())
        manifest["splits"]["validation"]["shards"] = [relpath]
        data = (root / relpath).read_bytes()
        entry = {"path": relpath, "sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
        manifest["files"].append(entry)
        (root / "manifest.json").write_text(json.dumps(manifest))
        return {"split": "validation", "verify_sha256": True}
    if case == "fewer rows than one batch":
        return {"batch_size": rows + 1}
    assert case == "a rank past the last row"
    return {"batch_size": rows, "world_size": 2, "rank": 1, "drop_last": False}


@pytest.mark.parametrize("prefetch", [True, False], ids=["prefetch", "inline"])
@pytest.mark.parametrize(
    "case",
    [
        "a split without shards",
        "a split whose only shard is empty",
        "fewer rows than one batch",
        "a rank past the last row",
    ],
)
def test_a_loader_of_length_zero_iterates_nothing_and_still_saves_and_resumes(
    tmp_path: Path, case: str, prefetch: bool
) -> None:
    options = _split_without_batches(tmp_path / "snap", case)

    def fresh() -> PackedRowsLoader:
        return PackedRowsLoader(
            tmp_path / "snap", prefetch=prefetch, cache_dir=tmp_path / "cache", **options
        )

    loader = fresh()
    assert len(loader) == 0
    assert list(loader) == []
    assert loader.receipts == [] and loader.receipt_summary().batches == 0
    state = loader.state_dict()
    assert (state["epoch"], state["batch_index"]) == (1, 0)  # the empty epoch still ends

    resumed = fresh()
    resumed.load_state_dict(state)
    assert list(resumed) == []
    assert (resumed.state_dict()["epoch"], resumed.state_dict()["batch_index"]) == (2, 0)
    with pytest.raises(LoaderStateError, match="batch_index"):
        resumed.load_state_dict({**state, "batch_index": 1})
    assert not any(t.is_alive() for t in _loader_threads())


def _rewrite_first_shard(fixture: SnapshotFixture, table: pa.Table) -> str:
    relpath = fixture.splits["train"].shards[0]
    pq.write_table(table, fixture.path / relpath)
    return relpath


def test_missing_required_column_is_a_hard_error_naming_the_shard(tmp_path: Path) -> None:
    fixture = build_snapshot(tmp_path / "snap")
    relpath = fixture.splits["train"].shards[0]
    table = pq.read_table(fixture.path / relpath).drop_columns(["target_ids"])
    _rewrite_first_shard(fixture, table)
    with pytest.raises(ShardSchemaError, match="target_ids") as excinfo:
        PackedRowsLoader(fixture.path, cache_dir=tmp_path / "cache")
    assert excinfo.value.shard == relpath


def test_token_lists_of_the_wrong_length_are_a_hard_error_naming_the_shard(
    tmp_path: Path,
) -> None:
    fixture = build_snapshot(tmp_path / "snap", seq_len=32)
    relpath = fixture.splits["train"].shards[0]
    table = pq.read_table(fixture.path / relpath)
    short = pa.FixedSizeListArray.from_arrays(pa.array(np.zeros(table.num_rows * 16, np.int32)), 16)
    table = table.set_column(table.schema.get_field_index("input_ids"), "input_ids", short)
    _rewrite_first_shard(fixture, table)
    with pytest.raises(ShardSchemaError, match="input_ids") as excinfo:
        PackedRowsLoader(fixture.path, cache_dir=tmp_path / "cache")
    assert excinfo.value.shard == relpath
    assert "[16]" in excinfo.value.rule


def test_a_manifest_shard_path_that_leaves_the_snapshot_is_refused(tmp_path: Path) -> None:
    fixture = build_snapshot(tmp_path / "snap")
    manifest_path = fixture.path / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["splits"]["train"]["shards"].append("../outside.parquet")
    manifest_path.write_text(json.dumps(manifest))
    with pytest.raises(SnapshotManifestError, match="leaves the snapshot"):
        PackedRowsLoader(fixture.path, cache_dir=tmp_path / "cache")


def test_sha256_verification_catches_one_flipped_byte(tmp_path: Path) -> None:
    fixture = build_snapshot(tmp_path / "snap")
    PackedRowsLoader(fixture.path, verify_sha256=True, cache_dir=tmp_path / "cache")
    shard = fixture.path / fixture.splits["train"].shards[1]
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x01
    shard.write_bytes(bytes(data))
    with pytest.raises(ShardChecksumError) as excinfo:
        PackedRowsLoader(fixture.path, verify_sha256=True, cache_dir=tmp_path / "cache")
    assert excinfo.value.shard == fixture.splits["train"].shards[1]


def test_producer_failure_reraises_in_the_consumer_with_its_traceback(tmp_path: Path) -> None:
    fixture = build_snapshot(tmp_path / "snap", rows_per_shard=64)
    loader = PackedRowsLoader(
        fixture.path, batch_size=2, shuffle=False, cache_dir=tmp_path / "cache"
    )
    shard = fixture.path / fixture.splits["train"].shards[0]
    shard.write_bytes(b"\0" * shard.stat().st_size)  # the shard rots after the loader opened it
    with pytest.raises(pa.ArrowInvalid) as excinfo:
        next(iter(loader))
    frames = [frame.name for frame in traceback.extract_tb(excinfo.tb)]
    assert "_build_block" in frames and "_decode" in frames
    assert not any(t.is_alive() for t in _loader_threads())


def test_batches_built_ahead_before_a_failure_arrive_then_the_error_from_the_thread(
    tmp_path: Path,
) -> None:
    # 64 rows per shard in row groups of 4: the second shard rots, and a consumer whose every
    # step lasts until the prefetch thread has built ahead lets the thread run into it first
    fixture = build_snapshot(tmp_path / "snap", rows_per_shard=64)
    loader = PackedRowsLoader(
        fixture.path,
        batch_size=2,
        shuffle=False,
        cache_dir=tmp_path / "cache",
        lookahead_row_groups=0,
    )
    shard = fixture.path / fixture.splits["train"].shards[1]
    shard.write_bytes(b"\0" * shard.stat().st_size)
    received = []
    with pytest.raises(pa.ArrowInvalid) as excinfo:
        for batch in loader:
            received.append(batch["pack_id"].copy())
            _take_a_step(loader)
    first_shard = pq.read_table(fixture.path / fixture.splits["train"].shards[0])
    np.testing.assert_array_equal(np.concatenate(received), first_shard["pack_id"].to_numpy())
    frames = [frame.name for frame in traceback.extract_tb(excinfo.tb)]
    assert "run_producer" in frames and "_decode" in frames
    assert loader.state_dict()["batch_index"] == len(received)
    assert not any(t.is_alive() for t in _loader_threads())


def test_leaving_the_loop_early_stops_the_prefetch_thread(
    snapshot: SnapshotFixture, shared_cache: Path
) -> None:
    loader = PackedRowsLoader(snapshot.path, batch_size=2, cache_dir=shared_cache)
    for _ in loader:
        if _take_a_step(loader):  # a consumer busy with steps gets batches built on a thread
            assert _loader_threads()
            break
    else:
        pytest.fail("no prefetch thread started in a whole epoch of steps")
    gc.collect()
    assert not any(t.is_alive() for t in _loader_threads())

    with PackedRowsLoader(snapshot.path, batch_size=2, cache_dir=shared_cache) as managed:
        next(iter(managed))
        iterator = iter(managed)  # a second pass replaces (and stops) the first
        next(iterator)
    assert not any(t.is_alive() for t in _loader_threads())


def test_a_consumer_with_steps_gets_the_same_batches_as_one_without(
    snapshot: SnapshotFixture, shared_cache: Path
) -> None:
    def pass_over(prefetch: bool, steps: bool) -> tuple[list[np.ndarray], list[int], int]:
        loader = PackedRowsLoader(
            snapshot.path, batch_size=3, seed=5, prefetch=prefetch, cache_dir=shared_cache
        )
        seen, built_ahead = [], 0
        for batch in loader:
            seen.append(batch["pack_id"].copy())
            if steps:
                built_ahead += _take_a_step(loader)
        return seen, [r.batch_index for r in loader.receipts], built_ahead

    inline, inline_indexes, _ = pass_over(prefetch=False, steps=False)
    ahead, ahead_indexes, built_ahead = pass_over(prefetch=True, steps=True)
    assert built_ahead  # the thread did build blocks while the consumer was away
    assert len(inline) == len(ahead)
    for got, want in zip(ahead, inline, strict=True):
        np.testing.assert_array_equal(got, want)
    assert inline_indexes == ahead_indexes == list(range(len(inline)))


def test_receipts_keep_only_the_last_batches_received(
    snapshot: SnapshotFixture, shared_cache: Path
) -> None:
    loader = PackedRowsLoader(
        snapshot.path, batch_size=1, receipt_history=7, cache_dir=shared_cache
    )
    iterator = iter(loader)
    for _ in range(20):
        next(iterator)
    assert [r.batch_index for r in loader.receipts] == list(range(13, 20))
    assert loader.receipt_summary().batches == 7


def test_receipts_time_each_stage_separately_and_record_the_shape(
    snapshot: SnapshotFixture, tmp_path: Path
) -> None:
    cold = PackedRowsLoader(
        snapshot.path, batch_size=4, cache_dir=tmp_path / "cache", lookahead_row_groups=0
    )
    list(cold)
    summary = cold.receipt_summary()
    assert summary.batches == len(cold)
    assert summary.shapes == [(4, snapshot.seq_len)]
    assert set(summary.stages) == {"read_s", "decode_s", "normalize_s", "stage_s", "queue_wait_s"}
    assert summary.cache_misses > 0 and summary.stages["decode_s"].total_s > 0
    assert all(r.read_s >= 0 and r.stage_s >= 0 and r.queue_wait_s >= 0 for r in cold.receipts)
    assert cold.receipts[0].model_dump()["shape"] == (4, snapshot.seq_len)
    assert "| decode |" in summary.to_markdown()

    warm = PackedRowsLoader(snapshot.path, batch_size=4, cache_dir=tmp_path / "cache")
    list(warm)
    assert warm.receipt_summary().cache_misses == 0
    assert warm.receipt_summary().stages["decode_s"].total_s == 0


def test_each_row_group_is_decoded_once_into_a_cache_keyed_by_shard_sha256(
    snapshot: SnapshotFixture, tmp_path: Path
) -> None:
    loader = PackedRowsLoader(snapshot.path, batch_size=4, cache_dir=tmp_path / "cache")
    loader.warm_cache()
    assert loader.warm_cache() == 0.0
    entries = sorted((tmp_path / "cache" / CACHE_FORMAT).glob("*/rg-*.arrow"))
    row_groups = sum(
        pq.ParquetFile(snapshot.path / s).num_row_groups for s in snapshot.splits["train"].shards
    )
    assert len(entries) == row_groups
    assert not list((tmp_path / "cache").rglob("*.tmp"))
    reader = pa.ipc.open_file(pa.memory_map(str(entries[0])))
    assert reader.schema.field("input_ids").type.list_size == snapshot.seq_len


def test_on_a_cold_cache_the_look_ahead_decodes_each_row_group_once(
    snapshot: SnapshotFixture, tmp_path: Path
) -> None:
    loader = PackedRowsLoader(
        snapshot.path,
        batch_size=4,
        drop_last=False,
        cache_dir=tmp_path / "cache",
        lookahead_row_groups=3,
    )
    batches = list(loader)
    row_groups = sum(
        pq.ParquetFile(snapshot.path / s).num_row_groups for s in snapshot.splits["train"].shards
    )
    assert loader.cache.decoded == row_groups
    assert loader.receipt_summary().cache_misses <= row_groups
    assert len(batches) == len(loader)


def test_without_copy_a_batch_inside_one_row_group_is_a_zero_copy_view(
    snapshot: SnapshotFixture, shared_cache: Path
) -> None:
    # the fixture's row groups hold 4 rows, so unshuffled batches of 4 never straddle two
    loader = PackedRowsLoader(
        snapshot.path, batch_size=4, shuffle=False, copy=False, cache_dir=shared_cache
    )
    batch = next(iter(loader))
    assert not batch["input_ids"].flags.owndata and not batch["input_ids"].flags.writeable
    copied = next(iter(PackedRowsLoader(snapshot.path, batch_size=4, cache_dir=shared_cache)))
    assert copied["input_ids"].flags.owndata and copied["input_ids"].flags.writeable


def test_unknown_columns_and_bad_ranks_are_config_errors(
    snapshot: SnapshotFixture, shared_cache: Path
) -> None:
    with pytest.raises(LoaderConfigError, match="columns"):
        PackedRowsLoader(snapshot.path, columns=["input_ids", "attention_mask"])
    with pytest.raises(LoaderConfigError, match="rank"):
        PackedRowsLoader(snapshot.path, rank=2, world_size=2)


@pytest.mark.skipif(importlib.util.find_spec("torch") is not None, reason="torch is installed")
def test_asking_for_tensors_without_torch_is_a_config_error(snapshot: SnapshotFixture) -> None:
    with pytest.raises(LoaderConfigError, match="torch"):
        PackedRowsLoader(snapshot.path, to_torch=True)


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed")
def test_tensors_carry_the_same_values_as_arrays(
    snapshot: SnapshotFixture, shared_cache: Path
) -> None:
    arrays = next(iter(PackedRowsLoader(snapshot.path, shuffle=False, cache_dir=shared_cache)))
    tensors = next(
        iter(PackedRowsLoader(snapshot.path, shuffle=False, to_torch=True, cache_dir=shared_cache))
    )
    np.testing.assert_array_equal(tensors["input_ids"].numpy(), arrays["input_ids"])


def test_a_negative_seed_or_epoch_is_refused_up_front_naming_it(
    snapshot: SnapshotFixture, shared_cache: Path
) -> None:
    """They failed at the first batch with numpy's "expected non-negative integer"."""
    with pytest.raises(LoaderConfigError, match="'seed'"):
        PackedRowsLoader(snapshot.path, cache_dir=shared_cache, seed=-1)
    loader = PackedRowsLoader(snapshot.path, cache_dir=shared_cache)
    with pytest.raises(LoaderConfigError, match="'epoch'"):
        loader.set_epoch(-1)
    state = {**loader.state_dict(), "epoch": -1}
    with pytest.raises(LoaderStateError, match="'epoch'"):
        loader.load_state_dict(state)
    loader.close()
