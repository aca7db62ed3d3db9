"""Writer leases and the commit point: a version without `_COMPLETE` is removed only once
its writer's lease is dead (no heartbeat for its TTL, whatever host wrote it, or a gone
process of this very machine); a live writer, on any host, is never touched; readers never
see a version without `_COMPLETE`. Writers run as separate processes claiming host names."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pytest

from megacpp_pipeline.storage.lease import (
    Lease,
    LeaseKeeper,
    LeaseLostError,
    WriterIdentity,
    new_lease,
    why_dead,
)
from megacpp_pipeline.storage.store import (
    COMPLETE,
    LATEST,
    IncompleteVersionError,
    ShardStore,
    StoreError,
)
from megacpp_pipeline.storage.versions import lease_name, tmp_name
from tests.storage.writer_process import SCHEMA, WriterProcess

TTL_S = 120.0


def _table(n: int) -> pa.Table:
    return pa.table({"path": [f"src/f{i}.cc" for i in range(n)], "n": list(range(n))}, SCHEMA)


def _commit_version(store: ShardStore, rows: int) -> str:
    v = store.begin("raw_files", "demo", code_version="t")
    v.table("data", SCHEMA).write(_table(rows))
    return v.commit().version


def _ahead(seconds: float) -> Callable[[], datetime]:
    return lambda: datetime.now(UTC) + timedelta(seconds=seconds)


@pytest.fixture
def writers() -> Iterator[list[WriterProcess]]:
    started: list[WriterProcess] = []
    yield started
    for w in started:
        w.close()


def _pdir(root: Path) -> Path:
    return root / "assets" / "raw_files" / "demo"


# the lease record -------------------------------------------------------------------------
def test_the_lease_records_host_pid_start_and_a_heartbeat_that_advances(tmp_path: Path) -> None:
    store = ShardStore(str(tmp_path), writer_host="build-7", lease_ttl_s=30)
    v = store.begin("raw_files", "demo", code_version="t")
    path = _pdir(tmp_path) / lease_name(v.manifest.version)
    first = Lease.model_validate_json(path.read_bytes())
    assert (first.host, first.version, first.ttl_s) == ("build-7", v.manifest.version, 30)
    assert first.pid > 0 and first.started_at == first.heartbeat_at
    assert v.lease.interval_s == 7.5  # a quarter of the TTL
    time.sleep(0.01)
    v.lease.beat()  # what the heartbeat thread does every interval
    second = Lease.model_validate_json(path.read_bytes())
    assert second.heartbeat_at > first.heartbeat_at and second.token == first.token
    v.commit()
    assert not path.exists()  # a committed version needs no lease


def test_a_lease_is_dead_after_its_ttl_from_any_host_and_never_before() -> None:
    here = WriterIdentity.of_this_process("cleaner-host")
    now = datetime.now(UTC)
    other = WriterIdentity("worker-9", "worker-9|boot|ns", 1, None)  # pid 1 lives here too
    lease = Lease(
        version="20260101T000000000000-abcd1234",
        token="t",
        host=other.host,
        machine=other.machine,
        pid=424242,  # no such process here: a pid says nothing about another machine
        started_at=now,
        heartbeat_at=now,
        ttl_s=60,
    )
    assert why_dead(lease, now=now + timedelta(seconds=59), here=here) is None
    why = why_dead(lease, now=now + timedelta(seconds=61), here=here)
    assert why is not None and "no heartbeat for 61 s" in why and "worker-9" in why
    # the store's own time for the object counts when the writer's clock lags behind it
    late_store = now + timedelta(seconds=30)
    assert why_dead(lease, now=now + timedelta(seconds=61), here=here, stored_at=late_store) is None


# dead writers -----------------------------------------------------------------------------
def test_a_dead_remote_writers_version_is_removed_after_its_ttl_and_not_before(
    tmp_path: Path, writers: list[WriterProcess]
) -> None:
    remote = WriterProcess(str(tmp_path), "host-a", TTL_S)
    writers.append(remote)
    remote.write()
    remote.crash()
    vdir = _pdir(tmp_path) / remote.version
    cleaner = ShardStore(str(tmp_path), writer_host="host-b")
    # host-a's pid means nothing on host-b: only the TTL can tell it is dead
    assert cleaner.clean_abandoned(str(_pdir(tmp_path))) == []
    assert vdir.is_dir() and (_pdir(tmp_path) / lease_name(remote.version)).exists()
    later = ShardStore(str(tmp_path), writer_host="host-b", clock=_ahead(TTL_S + 1))
    removed = later.clean_abandoned(str(_pdir(tmp_path)))
    assert len(removed) == 1 and "no heartbeat" in removed[0] and "host-a" in removed[0]
    assert not vdir.exists() and list(_pdir(tmp_path).glob("*.lease")) == []


def test_a_dead_writer_of_this_machine_is_cleaned_at_once_by_the_next_writer(
    tmp_path: Path, writers: list[WriterProcess]
) -> None:
    store = ShardStore(str(tmp_path), writer_host="host-a")
    crashed = WriterProcess(str(tmp_path), "host-a", TTL_S)
    writers.append(crashed)
    crashed.crash()
    _commit_version(store, rows=3)  # its begin cleans: same machine, pid gone, no TTL to wait
    leftovers = [p.name for p in _pdir(tmp_path).iterdir() if p.name.startswith(crashed.version)]
    assert leftovers == []


# live writers -----------------------------------------------------------------------------
def test_a_live_writer_on_another_host_is_never_touched_past_its_ttl(
    tmp_path: Path, writers: list[WriterProcess]
) -> None:
    ttl = 2.0  # beats every 0.5 s
    live = WriterProcess(str(tmp_path), "host-a", ttl)
    writers.append(live)
    cleaner = ShardStore(str(tmp_path), writer_host="host-b")
    local_cleaner = ShardStore(str(tmp_path), writer_host="host-a")  # sees the live pid
    start = time.monotonic()
    while time.monotonic() - start < 2.5 * ttl:  # well past the TTL of its first heartbeat
        assert cleaner.clean_abandoned(str(_pdir(tmp_path))) == []
        assert local_cleaner.clean_abandoned(str(_pdir(tmp_path))) == []
        live.write()
        time.sleep(0.1)
    lease = Lease.model_validate_json((_pdir(tmp_path) / lease_name(live.version)).read_bytes())
    assert (lease.heartbeat_at - lease.started_at).total_seconds() > ttl  # the thread beat
    committed, version = live.commit()
    assert committed, version
    m = cleaner.latest("raw_files", "demo")
    assert m.version == live.version and cleaner.verify(m) == []


def test_two_writers_claiming_different_hosts_never_remove_each_other(
    tmp_path: Path, writers: list[WriterProcess]
) -> None:
    a = WriterProcess(str(tmp_path), "host-a", TTL_S)
    writers.append(a)
    b = WriterProcess(str(tmp_path), "host-b", TTL_S)  # its begin cleaned: a's version stayed
    writers.append(b)
    for _ in range(3):
        a.write()
        b.write()
        assert a.clean() == [] and b.clean() == []
    a.crash()
    # a is dead, but on "another host": b keeps its version until a's lease has expired
    assert b.clean() == []
    assert (_pdir(tmp_path) / a.version).is_dir()
    assert b.commit() == (True, b.version)
    removed = b.clean(skew_s=TTL_S + 1)
    assert len(removed) == 1 and a.version in removed[0] and "host-a" in removed[0]
    store = ShardStore(str(tmp_path))
    m = store.latest("raw_files", "demo")
    assert m.version == b.version and m.rows == 20 and store.verify(m) == []
    assert sorted(p.name for p in _pdir(tmp_path).iterdir()) == sorted([LATEST, b.version])


def test_a_writer_whose_lease_was_judged_dead_refuses_to_commit(
    tmp_path: Path, writers: list[WriterProcess]
) -> None:
    """A writer stalled past its TTL (a paused VM, a partition) finds its version removed:
    it must not write a manifest over the shards a cleaner deleted."""
    stalled = WriterProcess(str(tmp_path), "host-a", TTL_S)
    writers.append(stalled)
    skewed = ShardStore(str(tmp_path), writer_host="host-b", clock=_ahead(TTL_S + 1))
    assert len(skewed.clean_abandoned(str(_pdir(tmp_path)))) == 1
    committed, why = stalled.commit()
    assert not committed and "not committed" in why and "removed" in why
    with pytest.raises(StoreError, match="no complete version"):
        ShardStore(str(tmp_path)).latest("raw_files", "demo")


# the commit point -------------------------------------------------------------------------
def test_a_reader_never_sees_a_version_without_complete(tmp_path: Path) -> None:
    store = ShardStore(str(tmp_path))
    before = _commit_version(store, rows=3)
    v = store.begin("raw_files", "demo", code_version="t")
    v.table("data", SCHEMA).write(_table(9))
    real = store.put_bytes

    def no_complete(path: str, data: bytes, **kw: str) -> None:
        if path.endswith(COMPLETE):
            raise StoreError(f"{path}: the disk filled up")
        real(path, data, **kw)

    store.put_bytes = no_complete  # type: ignore[method-assign]
    with pytest.raises(StoreError, match="disk filled"):
        v.commit()
    store.put_bytes = real  # type: ignore[method-assign]
    assert (Path(v.dir) / "manifest.json").exists()  # everything but the commit point
    with pytest.raises(IncompleteVersionError):
        store.read_manifest(v.dir)
    assert store.latest("raw_files", "demo").version == before
    # even a LATEST that names it is not believed
    (_pdir(tmp_path) / LATEST).write_text(v.manifest.version)
    assert store.latest("raw_files", "demo").version == before


def test_an_incomplete_version_is_removed_once_its_lease_expired_and_kept_while_it_holds(
    tmp_path: Path,
) -> None:
    store = ShardStore(str(tmp_path), lease_ttl_s=TTL_S)
    v = store.begin("raw_files", "demo", code_version="t")
    v.table("data", SCHEMA).write(_table(12))
    v.table("data", SCHEMA).close()
    v.lease.stop()  # the writer falls silent (its process is alive: only the TTL can tell)
    pdir = str(_pdir(tmp_path))
    assert ShardStore(str(tmp_path), clock=_ahead(TTL_S - 5)).clean_abandoned(pdir) == []
    assert Path(v.dir).is_dir()
    removed = ShardStore(str(tmp_path), clock=_ahead(TTL_S + 5)).clean_abandoned(pdir)
    assert len(removed) == 1 and not Path(v.dir).exists()
    assert list(_pdir(tmp_path).iterdir()) == []


def test_latest_moves_only_forward_when_two_writers_commit_out_of_order(tmp_path: Path) -> None:
    store = ShardStore(str(tmp_path), keep_versions=3)
    older = store.begin("raw_files", "demo", code_version="t")
    older.table("data", SCHEMA).write(_table(2))
    newer = store.begin("raw_files", "demo", code_version="t")
    newer.table("data", SCHEMA).write(_table(5))
    newer.commit()
    older.commit()  # complete and readable, but it began first: LATEST stays on the newer
    assert (_pdir(tmp_path) / LATEST).read_text() == newer.manifest.version
    assert store.latest("raw_files", "demo").rows == 5


def test_abort_and_a_failing_block_remove_the_version_and_its_lease(tmp_path: Path) -> None:
    store = ShardStore(str(tmp_path))
    with pytest.raises(ValueError), store.begin("raw_files", "demo", code_version="t") as v:
        v.table("data", SCHEMA).write(_table(7))
        v.table("data", SCHEMA).close()
        raise ValueError("the gate failed")
    assert list(_pdir(tmp_path).iterdir()) == []


def test_temp_files_of_a_dead_writer_are_removed_and_a_live_ones_kept(tmp_path: Path) -> None:
    store = ShardStore(str(tmp_path))
    live = store.begin("raw_files", "demo", code_version="t")
    pdir = _pdir(tmp_path)
    mine = pdir / tmp_name(LATEST, live.manifest.version)
    dead = pdir / tmp_name(LATEST, "20200101T000000000000-deadbeef")
    legacy = pdir / "LATEST.999999-0badc0de.tmp"  # the former pid-named temp file
    for p in (mine, dead, legacy):
        p.write_text("x")
    store.clean_abandoned(str(pdir))
    assert mine.exists() and not dead.exists() and not legacy.exists()
    live.commit()


def test_a_lease_in_the_store_is_plain_json_a_person_can_read(tmp_path: Path) -> None:
    store = ShardStore(str(tmp_path), writer_host="ci-runner")
    v = store.begin("raw_files", "demo", code_version="t")
    raw = json.loads((_pdir(tmp_path) / lease_name(v.manifest.version)).read_text())
    assert {"host", "pid", "started_at", "heartbeat_at", "ttl_s", "version"} <= set(raw)
    v.abort()


# the heartbeat ----------------------------------------------------------------------------
def _keeper(store: dict[str, bytes], fail_writes: list[bool]) -> LeaseKeeper:
    def write(data: bytes) -> None:
        if fail_writes and fail_writes.pop(0):
            raise OSError("503 Slow Down")
        store["lease"] = data

    identity = WriterIdentity.of_this_process("build-7")
    lease = new_lease("20260101T000000000000-abcd1234", identity, now=datetime.now(UTC), ttl_s=8)
    keeper = LeaseKeeper(lease, read=lambda: store.get("lease"), write=write, clock=_ahead(0))
    keeper.put_first()
    return keeper


def test_a_failed_heartbeat_request_is_a_missed_beat_not_a_lost_lease() -> None:
    held: dict[str, bytes] = {}
    keeper = _keeper(held, [False, True])  # the first beat's write fails, the next succeeds
    before = Lease.model_validate_json(held["lease"]).heartbeat_at
    keeper.beat()
    assert Lease.model_validate_json(held["lease"]).heartbeat_at == before
    keeper.check()  # still held: one missed beat is within the TTL
    keeper.beat()
    assert Lease.model_validate_json(held["lease"]).heartbeat_at > before


def test_a_lease_removed_or_rewritten_by_someone_else_is_lost_and_never_recreated() -> None:
    held: dict[str, bytes] = {}
    keeper = _keeper(held, [])
    del held["lease"]  # a cleaner judged it dead and removed it
    keeper.beat()
    assert "lease" not in held
    with pytest.raises(LeaseLostError, match="removed"):
        keeper.check()
    other: dict[str, bytes] = {}
    keeper = _keeper(other, [])
    other["lease"] = _keeper({}, []).lease.model_dump_json().encode()  # another token
    keeper.beat()
    with pytest.raises(LeaseLostError, match="rewritten"):
        keeper.check()
