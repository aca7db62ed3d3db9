"""The shard store: bounded shards, validated uploads, _COMPLETE last, corruption found."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
import textwrap
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from megacpp_pipeline.storage.store import (
    COMPLETE,
    IncompleteVersionError,
    ShardStore,
    ShardVerificationError,
    StoreError,
)

SCHEMA = pa.schema([pa.field("path", pa.string()), pa.field("n", pa.int64())])


def _table(start: int, n: int) -> pa.Table:
    return pa.table(
        {"path": [f"src/f{i}.cc" for i in range(start, start + n)], "n": list(range(n))},
        schema=SCHEMA,
    )


def _write_version(store: ShardStore, rows: int = 25) -> None:
    v = store.begin("raw_files", "demo", code_version="t")
    v.table("data", SCHEMA).write(_table(0, rows))
    v.commit(stats={"rows": rows})


def test_shards_are_bounded_by_rows_and_listed_with_sha256(tmp_path: Path) -> None:
    store = ShardStore(str(tmp_path), max_rows_per_shard=10)
    _write_version(store, rows=25)
    m = store.latest("raw_files", "demo")
    assert [s.rows for s in m.tables["data"].shards] == [10, 10, 5]
    assert m.rows == 25
    assert store.verify(m) == []
    vdir = Path(store.version_dir(m))
    assert (vdir / COMPLETE).exists() and (vdir / "manifest.json").exists()
    assert not list(vdir.glob("*.tmp"))


def test_shards_are_bounded_by_bytes(tmp_path: Path) -> None:
    store = ShardStore(str(tmp_path), max_rows_per_shard=10_000, max_bytes_per_shard=2_000)
    _write_version(store, rows=500)
    m = store.latest("raw_files", "demo")
    assert len(m.tables["data"].shards) > 3
    assert sum(s.rows for s in m.tables["data"].shards) == 500


def test_reader_refuses_a_version_without_complete(tmp_path: Path) -> None:
    store = ShardStore(str(tmp_path))
    v = store.begin("raw_files", "demo", code_version="t")
    v.table("data", SCHEMA).write(_table(0, 3))
    v.table("data", SCHEMA).close()
    with pytest.raises(IncompleteVersionError):
        store.read_manifest(v.dir)
    with pytest.raises(StoreError, match="no complete version"):
        store.latest("raw_files", "demo")


def test_flipped_byte_in_a_shard_is_named_by_verify(tmp_path: Path) -> None:
    store = ShardStore(str(tmp_path))
    _write_version(store)
    m = store.latest("raw_files", "demo")
    shard = Path(store.version_dir(m)) / m.tables["data"].shards[0].path
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    problems = store.verify(m)
    assert problems and str(shard) in problems[0] and "sha256" in problems[0]


def test_missing_shard_and_wrong_row_count_are_reported(tmp_path: Path) -> None:
    store = ShardStore(str(tmp_path), max_rows_per_shard=10)
    _write_version(store, rows=20)
    m = store.latest("raw_files", "demo")
    vdir = Path(store.version_dir(m))
    (vdir / m.tables["data"].shards[1].path).unlink()
    assert any("missing" in p for p in store.verify(m))


def test_rematerializing_writes_a_new_version_and_latest_follows(tmp_path: Path) -> None:
    store = ShardStore(str(tmp_path))
    _write_version(store, rows=5)
    first = store.latest("raw_files", "demo")
    _write_version(store, rows=7)
    second = store.latest("raw_files", "demo")
    assert second.version != first.version and second.rows == 7


def test_old_versions_are_pruned_to_keep_versions(tmp_path: Path) -> None:
    store = ShardStore(str(tmp_path), keep_versions=2)
    for rows in (1, 2, 3, 4):
        _write_version(store, rows=rows)
    pdir = Path(store.partition_dir("raw_files", "demo"))
    versions = [p for p in pdir.iterdir() if p.is_dir()]
    assert len(versions) == 2
    assert store.latest("raw_files", "demo").rows == 4


def test_table_that_does_not_match_its_schema_is_refused(tmp_path: Path) -> None:
    store = ShardStore(str(tmp_path))
    v = store.begin("raw_files", "demo", code_version="t")
    with pytest.raises(StoreError, match="declared schema"):
        v.table("data", SCHEMA).write(pa.table({"other": [1]}))


_CRASHER = textwrap.dedent(
    """
    import os, sys
    import pyarrow as pa
    from megacpp_pipeline.storage import store as s
    root, crash_at = sys.argv[1], sys.argv[2]
    st = s.ShardStore(root, max_rows_per_shard=5)
    schema = pa.schema([pa.field("path", pa.string()), pa.field("n", pa.int64())])
    v = st.begin("raw_files", "demo", code_version="t")
    v.table("data", schema).write(pa.table({"path": [str(i) for i in range(12)],
                                            "n": list(range(12))}, schema=schema))
    real = st.put_bytes
    def crashing(path, data, **kw):
        if path.endswith(crash_at):
            os._exit(9)  # a hard crash: no cleanup, no finally
        real(path, data, **kw)
    st.put_bytes = crashing
    v.commit()
    """
)


@pytest.mark.parametrize("crash_at", ["manifest.json", "_COMPLETE", "LATEST"])
def test_a_crash_at_any_point_leaves_no_readable_half_version(
    tmp_path: Path, crash_at: str
) -> None:
    store = ShardStore(str(tmp_path))
    _write_version(store, rows=3)
    before = store.latest("raw_files", "demo")
    proc = subprocess.run(
        [sys.executable, "-c", _CRASHER, str(tmp_path), crash_at],
        cwd=Path(__file__).resolve().parents[2],
        capture_output=True,
        check=False,
    )
    assert proc.returncode == 9, proc.stderr.decode()
    after = store.latest("raw_files", "demo")
    if crash_at == "LATEST":
        # _COMPLETE was written, so the new version is whole and readable: latest may be it
        assert after.rows in (3, 12)
    else:
        assert after.version == before.version and after.rows == 3
    assert store.verify(after) == []
    # every directory a reader accepts verifies; the half one is invisible
    pdir = Path(store.partition_dir("raw_files", "demo"))
    for vdir in (p for p in pdir.iterdir() if p.is_dir()):
        if (vdir / COMPLETE).exists():
            assert store.verify(store.read_manifest(str(vdir))) == []
        else:
            with pytest.raises(IncompleteVersionError):
                store.read_manifest(str(vdir))
    # the next writer cleans what the dead one left behind: its half version, its lease
    # (its process is gone from this machine, so no TTL need pass) and its temp files
    _write_version(store, rows=4)
    leftovers = [p for p in pdir.iterdir() if p.is_dir() and not (p / COMPLETE).exists()]
    assert leftovers == []
    assert list(pdir.glob("*.lease")) == [] and list(tmp_path.rglob("*.tmp")) == []


def test_manifest_records_schema_fingerprint_and_stats(tmp_path: Path) -> None:
    store = ShardStore(str(tmp_path))
    _write_version(store, rows=4)
    m = store.latest("raw_files", "demo")
    raw = json.loads(Path(store.manifest_path(m)).read_text())
    assert raw["schema_version"] == 1
    assert raw["tables"]["data"]["schema_fingerprint"]
    assert raw["stats"]["rows"] == 4.0
    shard = Path(store.version_dir(m)) / m.tables["data"].shards[0].path
    assert pq.read_table(shard).num_rows == 4


def test_unwritable_data_dir_is_a_clear_error_and_the_previous_version_stays(
    tmp_path: Path,
) -> None:
    store = ShardStore(str(tmp_path))
    _write_version(store, rows=3)
    pdir = Path(store.partition_dir("raw_files", "demo"))
    blocker = tmp_path / "assets" / "raw_files" / "other"
    blocker.write_text("a file where a directory must go")  # root ignores chmod; this cannot
    with pytest.raises(StoreError, match="cannot create"):
        store.begin("raw_files", "other", code_version="t")
    assert store.latest("raw_files", "demo").rows == 3 and pdir.is_dir()


# verified reads ------------------------------------------------------------------------------
def _edit_shard_in_place(store: ShardStore, shard_path: Path) -> None:
    """What a careless hand does: a valid parquet file with one value changed, written over
    the committed shard (the manifest still records the old bytes)."""
    table = pq.read_table(shard_path)
    paths = table["path"].to_pylist()
    paths[0] = paths[0] + "  // appended"
    pq.write_table(table.set_column(0, "path", pa.array(paths, pa.string())), shard_path)


def test_a_shard_edited_after_its_commit_fails_the_read_naming_version_shard_and_hash(
    tmp_path: Path,
) -> None:
    store = ShardStore(str(tmp_path), max_rows_per_shard=10)
    _write_version(store, rows=25)
    m = store.latest("raw_files", "demo")
    shard = m.tables["data"].shards[1]
    _edit_shard_in_place(store, Path(store.version_dir(m)) / shard.path)
    with pytest.raises(ShardVerificationError) as caught:
        list(store.iter_tables(m))
    message = str(caught.value)
    assert m.version in message and shard.path in message and shard.sha256 in message
    assert "raw_files [demo]" in message and "re-materialize" in message
    with pytest.raises(ShardVerificationError):
        store.read_table(m)
    with pytest.raises(ShardVerificationError):
        store.read_shard(m, shard, columns=["n"])  # a column the edit did not touch


def test_a_flipped_bit_of_the_same_size_fails_the_read(tmp_path: Path) -> None:
    store = ShardStore(str(tmp_path))
    _write_version(store, rows=25)
    m = store.latest("raw_files", "demo")
    shard = m.tables["data"].shards[0]
    path = Path(store.version_dir(m)) / shard.path
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    with pytest.raises(
        ShardVerificationError, match=f"its sha256 is .*records sha256 {shard.sha256}"
    ):
        next(store.iter_tables(m))
    path.unlink()
    with pytest.raises(ShardVerificationError, match="it is missing"):
        next(store.iter_tables(m))


def test_read_shard_decodes_only_the_asked_columns_of_the_verified_bytes(tmp_path: Path) -> None:
    store = ShardStore(str(tmp_path), max_rows_per_shard=10)
    _write_version(store, rows=25)
    m = store.latest("raw_files", "demo")
    vdir = store.version_dir(m)
    parts = [store.read_shard(vdir, s, columns=["n"]) for s in m.tables["data"].shards]
    assert [p.column_names for p in parts] == [["n"]] * 3
    assert sum(p.num_rows for p in parts) == 25
    assert pa.concat_tables(store.iter_tables(m)).equals(_table(0, 25))


def test_read_bytes_and_local_copy_verify_a_file_the_manifest_lists(tmp_path: Path) -> None:
    store = ShardStore(str(tmp_path))
    v = store.begin("tokenizer", None, code_version="t")
    info = v.write_file("tokenizer.json", b'{"model": "bpe"}')
    m = v.commit()
    path = f"{store.version_dir(m)}/tokenizer.json"
    assert store.read_bytes(path) == b'{"model": "bpe"}'
    assert store.local_copy(path, info.sha256, tmp_path / "cache") == path
    Path(path).write_bytes(b'{"model": "bpf"}')  # same size, other bytes
    with pytest.raises(ShardVerificationError, match=info.sha256):
        store.read_bytes(path)
    with pytest.raises(ShardVerificationError, match=info.sha256):
        store.local_copy(path, info.sha256, tmp_path / "cache")
    # the version's own markers and the partition's LATEST are not manifest entries
    assert store.read_bytes(store.manifest_path(m)).startswith(b"{")
    pdir = store.partition_dir("tokenizer", None)
    assert store.read_bytes(f"{pdir}/LATEST").decode() == m.version


def test_a_copy_fetched_from_a_non_local_store_is_checked_each_time_it_is_handed_out(
    tmp_path: Path,
) -> None:
    import pyarrow.fs as pafs

    remote = pafs.SubTreeFileSystem(str(tmp_path / "bucket"), pafs.LocalFileSystem())
    (tmp_path / "bucket").mkdir()
    store = ShardStore("data", filesystem=remote)
    v = store.begin("tokenizer", None, code_version="t")
    info = v.write_file("tokenizer.json", b"x" * 5000)
    m = v.commit()
    path = f"{store.version_dir(m)}/tokenizer.json"
    copy = Path(store.local_copy(path, info.sha256, tmp_path / "cache"))
    assert copy.read_bytes() == b"x" * 5000 and copy.is_relative_to(tmp_path / "cache")
    copy.write_bytes(b"y" * 5000)  # the cached copy changed: it is fetched again
    assert Path(store.local_copy(path, info.sha256, tmp_path / "cache")).read_bytes() == (
        b"x" * 5000
    )
    (tmp_path / "bucket" / path).write_bytes(b"z" * 5000)  # the store's object changed
    copy.unlink()
    with pytest.raises(ShardVerificationError, match=info.sha256):
        store.local_copy(path, info.sha256, tmp_path / "cache")
    assert not any(p.is_file() for p in (tmp_path / "cache").rglob("*"))


def test_a_new_version_says_which_version_it_replaces_when_that_one_failed_verification(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = ShardStore(str(tmp_path))
    _write_version(store, rows=5)
    sound = store.latest("raw_files", "demo")
    with caplog.at_level("WARNING", logger="megacpp_pipeline"):
        _write_version(store, rows=5)
    assert caplog.records == []
    assert "replaced_unverified" not in store.latest("raw_files", "demo").extra
    assert store.latest("raw_files", "demo").version != sound.version
    edited = store.latest("raw_files", "demo")
    shard = edited.tables["data"].shards[0]
    _edit_shard_in_place(store, Path(store.version_dir(edited)) / shard.path)
    with caplog.at_level("WARNING", logger="megacpp_pipeline"):
        _write_version(store, rows=5)
    [record] = caplog.records
    line = record.getMessage()
    assert "\n" not in line and edited.version in line and shard.path in line
    assert line.startswith("raw_files [demo]: replacing version") and "failed verification" in line
    replaced = store.latest("raw_files", "demo").extra["replaced_unverified"]
    assert replaced["version"] == edited.version and shard.path in replaced["problem"]


def test_a_large_previous_version_is_hashed_by_the_callers_tasks_and_an_edit_still_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from megacpp_pipeline.pipeline.executor import LocalExecutor
    from megacpp_pipeline.storage import store as store_module

    monkeypatch.setattr(store_module, "HASH_IN_TASKS_BYTES", 1)  # every shard its own batch
    store = ShardStore(str(tmp_path), max_rows_per_shard=10)
    _write_version(store, rows=25)
    m = store.latest("raw_files", "demo")
    batches: list[list[str]] = []

    def mapper(task, job, items):  # type: ignore[no-untyped-def]
        batches.extend(items)
        return LocalExecutor(2).map(task, job, items)  # forked workers hash them

    assert store.verify_objects(m, mapper) == []
    assert [len(b) for b in batches] == [1, 1, 1]
    shard = m.tables["data"].shards[1]
    path = Path(store.version_dir(m)) / shard.path
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF  # the same size: only its hash tells
    path.write_bytes(bytes(data))
    [problem] = store.verify_objects(m, mapper)
    assert shard.path in problem and f"manifest says {shard.sha256}" in problem
    v = store.begin("raw_files", "demo", code_version="t", mapper=mapper)
    v.table("data", SCHEMA).write(_table(0, 5))
    v.commit(stats={"rows": 5})
    replaced = store.latest("raw_files", "demo").extra["replaced_unverified"]
    assert replaced["version"] == m.version and shard.path in replaced["problem"]


@pytest.mark.parametrize("edit", ["manifest", "old marker", "marker of another version"])
def test_a_version_whose_manifest_its_marker_does_not_vouch_for_fails_verify_objects(
    tmp_path: Path, edit: str
) -> None:
    """verify_objects (what decides whether a version stands in a later run) checked only
    the objects the manifest lists: a manifest edited with its shards, or a marker in the
    older one-token form, let an edited record be reused and reported as checked."""
    store = ShardStore(str(tmp_path))
    _write_version(store)
    m = store.latest("raw_files", "demo")
    vdir = Path(store.version_dir(m))
    assert store.verify_objects(m) == []
    marker = (vdir / COMPLETE).read_text()
    if edit == "manifest":
        raw = json.loads((vdir / "manifest.json").read_text())
        raw["extra"]["revision"] = "forged"
        (vdir / "manifest.json").write_text(json.dumps(raw))
        expected = "sha256 differs"
    elif edit == "old marker":
        (vdir / COMPLETE).write_text(marker.split()[0] + "\n")
        expected = "records no manifest sha256"
    else:
        (vdir / COMPLETE).write_text("v-other " + marker.split()[1] + "\n")
        expected = "names version 'v-other'"
    [problem] = store.verify_objects(m)
    assert expected in problem


def test_a_large_manifest_is_parsed_once_per_bytes_and_a_changed_one_is_read_again(
    tmp_path: Path,
) -> None:
    """A corpus-wide version's manifest (a table per source) is read by every source's step:
    parsed once per process and bytes. Its bytes are still read at every call, so a manifest
    changed on disk is the one returned; a small manifest is parsed at each read."""
    store = ShardStore(str(tmp_path), max_rows_per_shard=1)
    v = store.begin("deduped_files", None, code_version="t")
    for source in range(120):  # about 40 KB of manifest: a table per source
        v.table(f"data:s{source:03d}", SCHEMA).write(_table(source, 1))
    v.commit()
    first = store.latest("deduped_files")
    path = Path(store.manifest_path(first))
    assert path.stat().st_size > 16384
    assert store.latest("deduped_files") is first
    assert ShardStore(str(tmp_path)).latest("deduped_files") is not first  # another store
    edited = json.loads(path.read_text())
    edited["stats"] = {"edited": 1.0}
    path.write_text(json.dumps(edited))
    again = store.latest("deduped_files")
    assert again is not first and again.stats == {"edited": 1.0} and first.stats == {}
    path.write_text("{")
    with pytest.raises(StoreError, match="invalid manifest"):
        store.latest("deduped_files")
    # a store with manifests kept still pickles (a check's job sent to a light pool or a Ray
    # task), and arrives without them
    sent = pickle.loads(pickle.dumps(store))
    assert len(sent._parsed) == 0 and len(store._parsed) > 0
    _write_version(store, rows=3)
    small = store.latest("raw_files", "demo")
    assert store.latest("raw_files", "demo") is not small
    assert store.latest("raw_files", "demo") == small
