"""The shard store's own cost: begin + shard writes + commit per version, on local disk and
(with --s3) on an S3-compatible server on loopback (moto's ThreadedMotoServer; needs the
`cluster` extra).

Two shapes, each timed over `--versions` fresh versions of one partition:
  tiny   one 10-row shard: the fixed cost of a version (lease, manifest, _COMPLETE, LATEST,
         cleaning and pruning), which is what thousands of small partitions pay
  bulk   `--shards` shards of `--rows` rows of C++-like text (about 1 KiB a row): per-shard
         cost (write, read-back validation, sha256)
Usage: .venv/bin/python -m bench.bench_store [--versions 20] [--shards 4] [--rows 2000] [--s3]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import socket
import statistics
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pyarrow as pa

from megacpp_pipeline.storage.store import ShardStore

SCHEMA = pa.schema([pa.field("path", pa.string()), pa.field("content", pa.string())])
SNIPPET = (
    "template <typename T> struct node_{i} {{ T value; node_{i}* next = nullptr;\n"
    "  int weight() const {{ return {i} * static_cast<int>(sizeof(T)); }} }};\n"
)


def _rows(start: int, n: int) -> pa.Table:
    # a digest per line keeps zstd from shrinking a shard to nothing (real code compresses ~4x)
    content = [
        "".join(
            SNIPPET.format(i=f"{start + i}_{hashlib.sha1(f'{i}.{k}'.encode()).hexdigest()[:12]}")
            for k in range(7)
        )
        for i in range(n)
    ]
    paths = [f"include/lib/node_{start + i}.hpp" for i in range(n)]
    return pa.table({"path": paths, "content": content}, schema=SCHEMA)


def _time_versions(store: ShardStore, shape: str, versions: int, shards: int, rows: int) -> dict:
    per_version = []
    table = _rows(0, rows)
    for _ in range(versions):
        t0 = time.perf_counter()
        v = store.begin("bench_asset", shape, code_version="bench")
        out = v.table("data", SCHEMA)
        if shape == "tiny":
            out.write(_rows(0, 10))
        else:
            for _ in range(shards):
                out.write(table)
        v.commit()
        per_version.append(time.perf_counter() - t0)
    n_shards = 1 if shape == "tiny" else shards
    median = statistics.median(per_version)
    m = store.latest("bench_asset", shape)
    return {
        "shape": shape,
        "versions": versions,
        "shards_per_version": n_shards,
        "shard_bytes": m.tables["data"].shards[0].bytes,
        "median_version_ms": round(median * 1e3, 2),
        "median_shard_ms": round(median * 1e3 / n_shards, 2),
        "verify_ok": store.verify(m) == [],
    }


@contextmanager
def _moto_s3() -> Iterator[str]:
    from moto.server import ThreadedMotoServer

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    try:
        import pyarrow.fs as pafs

        endpoint = f"127.0.0.1:{port}"
        fs = pafs.S3FileSystem(
            endpoint_override=endpoint, scheme="http", allow_bucket_creation=True
        )
        fs.create_dir("bench-bucket")
        yield f"s3://bench-bucket/store?endpoint_override={endpoint}&scheme=http"
    finally:
        server.stop()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--versions", type=int, default=20)
    ap.add_argument("--shards", type=int, default=4)
    ap.add_argument("--rows", type=int, default=2000)
    ap.add_argument("--s3", action="store_true", help="also on moto S3 on loopback")
    ap.add_argument("--json", help="write the results here too")
    args = ap.parse_args(argv)
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        store = ShardStore(tmp, max_rows_per_shard=args.rows, max_bytes_per_shard=1 << 30)
        for shape in ("tiny", "bulk"):
            r = _time_versions(store, shape, args.versions, args.shards, args.rows)
            results.append({"fs": "local", **r})
            print(json.dumps(results[-1]), flush=True)
    if args.s3:
        with _moto_s3() as uri:
            store = ShardStore(uri, max_rows_per_shard=args.rows, max_bytes_per_shard=1 << 30)
            for shape in ("tiny", "bulk"):
                versions = max(3, args.versions // 4)
                r = _time_versions(store, shape, versions, args.shards, args.rows)
                results.append({"fs": "moto-s3", **r})
                print(json.dumps(results[-1]), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
