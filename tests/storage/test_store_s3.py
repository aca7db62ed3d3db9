"""The shard store on object storage for real: an S3-compatible server on loopback (moto's
server mode on 127.0.0.1, a free port), reached the two ways a deployment names it (the URI's
query and AWS_ENDPOINT_URL), through the whole cycle: write, read, verify, LATEST, prune, and
cleaning after writer processes that claim different hosts. Run by `make test-slow` and
`make test-cluster`; needs the `cluster` extra."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import pyarrow as pa
import pyarrow.fs as pafs
import pytest

from megacpp_pipeline.storage.store import (
    COMPLETE,
    LATEST,
    IncompleteVersionError,
    ShardStore,
    StoreError,
)
from megacpp_pipeline.storage.versions import LEASE_SUFFIX
from tests.fixtures.s3_server import CREDENTIALS, NEEDS_S3_SERVER, moto_bucket
from tests.storage.writer_process import SCHEMA, WriterProcess

pytestmark = NEEDS_S3_SERVER

BUCKET = "megacpp-test"


@dataclass
class S3Server:
    endpoint: str  # host:port

    def uri(self, prefix: str) -> str:
        return f"s3://{BUCKET}/{prefix}?endpoint_override={self.endpoint}&scheme=http"

    def fs(self) -> pafs.S3FileSystem:
        return pafs.S3FileSystem(endpoint_override=self.endpoint, scheme="http")


@pytest.fixture(scope="module")
def s3() -> Iterator[S3Server]:
    with moto_bucket(BUCKET) as endpoint:
        yield S3Server(endpoint)


@pytest.fixture
def prefix() -> str:
    return f"run-{uuid.uuid4().hex[:8]}"


def _table(start: int, n: int) -> pa.Table:
    return pa.table(
        {"path": [f"src/f{i}.cc" for i in range(start, start + n)], "n": list(range(n))},
        schema=SCHEMA,
    )


def _commit(store: ShardStore, rows: int) -> str:
    v = store.begin("raw_files", "demo", code_version="t")
    v.table("data", SCHEMA).write(_table(0, rows))
    return v.commit(stats={"rows": rows}).version


def _names(s3: S3Server, path: str) -> list[str]:
    infos = s3.fs().get_file_info(pafs.FileSelector(path, allow_not_found=True))
    return sorted(i.base_name for i in infos)


def test_write_read_verify_latest_and_prune_on_s3(s3: S3Server, prefix: str) -> None:
    store = ShardStore(s3.uri(prefix), max_rows_per_shard=10, keep_versions=2)
    assert store.fs.type_name == "s3" and not store.is_local
    versions = [_commit(store, rows) for rows in (25, 7, 12)]
    m = store.latest("raw_files", "demo")
    assert m.version == versions[-1] and [s.rows for s in m.tables["data"].shards] == [10, 2]
    assert store.verify(m) == []
    assert store.read_table(m).num_rows == 12
    pdir = f"{BUCKET}/{prefix}/assets/raw_files/demo"
    # pruned to two versions; no lease, no temp object, no directory marker left behind
    assert _names(s3, pdir) == sorted([LATEST, *versions[1:]])
    assert _names(s3, f"{pdir}/{m.version}") == sorted(
        [COMPLETE, "manifest.json", "part-00000.parquet", "part-00001.parquet"]
    )
    # a flipped byte in an object is named by verify
    shard = f"{pdir}/{m.version}/part-00000.parquet"
    with s3.fs().open_input_stream(shard) as f:
        data = bytearray(f.read())
    data[len(data) // 2] ^= 0xFF
    with s3.fs().open_output_stream(shard) as f:
        f.write(bytes(data))
    problems = store.verify(m)
    assert problems and shard in problems[0] and "sha256" in problems[0]


def test_the_endpoint_can_come_from_aws_endpoint_url(
    s3: S3Server, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://{s3.endpoint}")
    store = ShardStore(f"s3://{BUCKET}/{prefix}")
    _commit(store, 4)
    # what the URI-query form sees is the same object
    assert ShardStore(s3.uri(prefix)).latest("raw_files", "demo").rows == 4


def test_a_shard_larger_than_a_multipart_chunk_uploads_and_validates(
    s3: S3Server, prefix: str
) -> None:
    store = ShardStore(s3.uri(prefix), compression="none", max_bytes_per_shard=64 << 20)
    schema = pa.schema([pa.field("blob", pa.binary())])
    v = store.begin("blobs", None, code_version="t")
    v.table("data", schema).write(pa.table({"blob": [os.urandom(1 << 20) for _ in range(12)]}))
    m = v.commit()
    assert m.tables["data"].shards[0].bytes > 12 << 20
    assert store.verify(m) == []


def test_a_reader_never_sees_an_uncommitted_version_on_s3(s3: S3Server, prefix: str) -> None:
    store = ShardStore(s3.uri(prefix), max_rows_per_shard=5, lease_ttl_s=60)
    before = _commit(store, 3)
    v = store.begin("raw_files", "demo", code_version="t")
    v.table("data", SCHEMA).write(_table(0, 12))
    v.table("data", SCHEMA).close()
    v.lease.stop()  # the writer falls silent: a crash without the crash
    with pytest.raises(IncompleteVersionError):
        store.read_manifest(v.dir)
    assert store.latest("raw_files", "demo").version == before
    pdir = store.partition_dir("raw_files", "demo")
    assert store.clean_abandoned(pdir) == []  # its lease still holds
    later = ShardStore(s3.uri(prefix), clock=lambda: datetime.now(UTC) + timedelta(seconds=61))
    assert len(later.clean_abandoned(pdir)) == 1
    assert _names(s3, pdir) == sorted([LATEST, before])
    with pytest.raises(StoreError, match="not committed"):
        v.commit()


def test_writers_on_two_hosts_share_an_s3_store_and_a_dead_ones_version_goes_after_ttl(
    s3: S3Server, prefix: str
) -> None:
    uri, ttl = s3.uri(prefix), 120.0
    a = WriterProcess(uri, "host-a", ttl, env=CREDENTIALS)
    b = WriterProcess(uri, "host-b", ttl, env=CREDENTIALS)
    try:
        a.write()
        b.write()
        assert a.clean() == [] and b.clean() == []
        a.crash()
        assert b.clean() == []
        assert b.commit() == (True, b.version)
        removed = b.clean(skew_s=ttl + 1)
        assert len(removed) == 1 and a.version in removed[0]
    finally:
        a.close()
        b.close()
    store = ShardStore(uri)
    m = store.latest("raw_files", "demo")
    assert m.version == b.version and m.rows == 10 and store.verify(m) == []
    pdir = store.partition_dir("raw_files", "demo")
    assert not any(n.endswith(LEASE_SUFFIX) for n in _names(s3, pdir))
    assert _names(s3, pdir) == sorted([LATEST, b.version])


def test_a_bucket_that_vanished_is_named_with_the_operation_not_taken_for_a_missing_version(
    s3: S3Server,
) -> None:
    """The store's errors on an object store say which bucket and what was being done: a
    bucket deleted mid-run is not "no complete version of asset ...; materialize it first"."""
    bucket = f"vanishing-{uuid.uuid4().hex[:8]}"
    pafs.S3FileSystem(
        endpoint_override=s3.endpoint, scheme="http", allow_bucket_creation=True
    ).create_dir(bucket)
    uri = f"s3://{bucket}/run?endpoint_override={s3.endpoint}&scheme=http"
    store = ShardStore(uri)
    _commit(store, 5)
    m = store.latest("raw_files", "demo")
    pafs.S3FileSystem(
        endpoint_override=s3.endpoint, scheme="http", allow_bucket_deletion=True
    ).delete_dir(bucket)
    with pytest.raises(StoreError) as caught:
        store.latest("raw_files", "demo")
    message = str(caught.value)
    assert f"s3 bucket '{bucket}'" in message and "does not exist" in message, message
    assert "materialize it first" not in message
    with pytest.raises(StoreError, match=f"s3 bucket '{bucket}', key .*: read failed: the buck"):
        list(store.iter_tables(m))
    with pytest.raises(StoreError, match=f"s3 bucket '{bucket}', key .*: write failed"):
        store.put_bytes(f"{bucket}/run/x", b"x")
