"""The shard store: bounded shards, validated uploads, _COMPLETE last, corruption found."""

from __future__ import annotations

import json
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
