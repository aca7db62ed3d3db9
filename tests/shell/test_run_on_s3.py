"""`megacpp run --data-dir s3://...` for real: an S3-compatible server on loopback (moto's
server mode), the same catalog run once into a local data dir and once into the bucket. Every
asset version goes to the bucket; the stages that need local files (the tokenizer, the
packed shards the snapshot copies) read checked copies from the cache dir; the promoted
snapshot is uploaded to `<data dir>/snapshots/<id>/`, `_COMPLETE` last, and is the same
snapshot, byte for byte, as the local run's. Run by `make test-slow` and `make test-cluster`;
needs the `cluster` extra."""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pyarrow.fs as pafs
import pytest

from megacpp_pipeline import cli
from megacpp_pipeline.loader import PackedRowsLoader
from megacpp_pipeline.snapshot.layout import SnapshotManifest
from megacpp_pipeline.stages.snapshot import prune_store_snapshots
from megacpp_pipeline.storage.store import COMPLETE, ShardStore
from tests.fixtures.pipeline_corpus import write_catalog
from tests.fixtures.s3_server import CREDENTIALS, NEEDS_S3_SERVER, moto_bucket

pytestmark = NEEDS_S3_SERVER

REPO = Path(__file__).resolve().parents[2]
BUCKET = "megacpp-run"


@pytest.fixture(scope="module")
def endpoint() -> Iterator[str]:
    with moto_bucket(BUCKET) as where:
        yield where


def megacpp_run(
    catalog: Path, data: str, root: Path, cache: str, **more_env: str
) -> subprocess.CompletedProcess:
    env = dict(os.environ, **CREDENTIALS, DAGSTER_HOME=str(root / "dagster_home"), **more_env)
    return subprocess.run(
        [sys.executable, "-m", "assets.cli", "run", "--config", str(catalog),
         "--data-dir", data, "--cache-dir", str(root / cache)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip


@pytest.fixture(scope="module")
def runs(endpoint: str, tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = tmp_path_factory.mktemp("s3run")
    catalog, _ = write_catalog(root)
    local = megacpp_run(catalog, str(root / "local"), root, "cache-local")
    assert local.returncode == 0, local.stderr[-3000:]
    uri = f"s3://{BUCKET}/run?endpoint_override={endpoint}&scheme=http"
    remote = megacpp_run(catalog, uri, root, "cache-s3")
    assert remote.returncode == 0, remote.stderr[-3000:]
    return {
        "local": Path(local.stdout.strip().splitlines()[-1]),
        "remote": remote.stdout.strip().splitlines()[-1],
        "store": ShardStore(uri),
        "root": root,
        "catalog": catalog,
    }


def test_the_run_prints_the_snapshot_in_the_bucket_with_the_local_runs_id(runs: dict) -> None:
    assert runs["remote"].startswith(f"s3://{BUCKET}/run/snapshots/")
    assert runs["remote"].rsplit("/", 1)[1] == runs["local"].name


def test_the_snapshot_in_the_bucket_is_the_local_one_byte_for_byte(runs: dict) -> None:
    store: ShardStore = runs["store"]
    local: Path = runs["local"]
    remote_dir = store.join("snapshots", local.name)
    infos = store.fs.get_file_info(pafs.FileSelector(remote_dir, recursive=True))
    remote = {
        i.path[len(remote_dir) + 1 :]: hashlib.sha256(store.read_bytes(i.path)).hexdigest()
        for i in infos
        if i.type == pafs.FileType.File
    }
    expected = {
        p.relative_to(local).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in local.rglob("*")
        if p.is_file()
    }

    # the manifest (created_at, the engine), its _COMPLETE marker (the manifest's sha256)
    # and the card name when the snapshot was made; report/ is written after promotion
    # and is outside the contract
    def contract(files: dict[str, str]) -> dict[str, str]:
        skip = ("manifest.json", "README.md", COMPLETE)
        return {k: v for k, v in files.items() if k not in skip and not k.startswith("report/")}

    assert {"manifest.json", "README.md", COMPLETE} <= remote.keys()
    assert contract(remote) == contract(expected)
    assert any(k.startswith("train/part-") for k in remote)
    # and the copy in the bucket is whole by its own manifest
    manifest = json.loads(store.read_bytes(f"{remote_dir}/manifest.json"))
    assert manifest["snapshot_id"] == local.name
    assert {f["path"]: f["sha256"] for f in manifest["files"]} == {
        k: v for k, v in remote.items() if k in {f["path"] for f in manifest["files"]}
    }
    assert len(manifest["files"]) == len(contract(remote))


def test_every_asset_version_is_in_the_bucket_and_verifies(runs: dict) -> None:
    store: ShardStore = runs["store"]
    for asset, partition in (
        ("raw_files", "tree"),
        ("tokenized_docs", "repo"),
        ("packed_rows", None),
    ):
        m = store.latest(asset, partition)
        assert store.verify(m) == [], asset
    # the local data dir was never used: nothing but the caches and the instance on disk
    assert {p.name for p in runs["root"].iterdir() if p.is_dir()} <= {
        "cache-local", "cache-s3", "cache-other-host", "corpus_dir", "corpus_git",
        "dagster_home", "local",
    }  # fmt: skip


def test_a_second_run_over_the_bucket_keeps_every_version_whose_inputs_did_not_change(
    runs: dict,
) -> None:
    store: ShardStore = runs["store"]
    kept = [
        ("normalized_files", "tree"),
        ("scrubbed_files", "repo"),
        ("tokenized_docs", "tree"),
        ("deduped_files", None),
        ("packed_rows", None),
        ("snapshot", None),
    ]
    before = {k: store.latest(*k) for k in [("raw_files", "tree"), ("raw_files", "repo"), *kept]}
    again = megacpp_run(runs["catalog"], store.uri, runs["root"], "cache-s3")
    assert again.returncode == 0, again.stderr[-3000:]
    assert again.stdout.strip().splitlines()[-1] == runs["remote"]
    # the directory's tree hash did not move and the git source's commit is pinned: their
    # collected versions stand, and so does everything after them, each version's objects
    # verified in the bucket
    for k, m in before.items():
        assert store.latest(*k).version == m.version, k
        assert store.verify(m) == [], k


def test_the_file_result_cache_is_in_the_bucket_and_a_fresh_host_reuses_it(runs: dict) -> None:
    store: ShardStore = runs["store"]
    entries = store.fs.get_file_info(
        pafs.FileSelector(store.join("file-results", "normalized_files"), recursive=True)
    )
    assert any(i.base_name.endswith(".arrow") for i in entries)
    assert not (runs["root"] / "cache-s3" / "file-results").exists()
    # another run with an empty cache dir, as on another host, every version computed again
    # (else each would stand: its inputs did not change): every file comes from the
    # bucket's cache and the snapshot is the same
    again = megacpp_run(
        runs["catalog"], store.uri, runs["root"], "cache-other-host", MEGACPP_RECOMPUTE="1"
    )
    assert again.returncode == 0, again.stderr[-3000:]
    assert again.stdout.strip().splitlines()[-1] == runs["remote"]
    m = store.latest("normalized_files", "tree")
    assert m.stats["input_files"] > 0 and m.stats["cached_files"] == m.stats["input_files"]


def test_verify_inspect_and_the_loader_read_the_snapshot_by_its_uri(
    runs: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MEGACPP_CACHE_DIR", str(tmp_path / "cache"))
    store: ShardStore = runs["store"]
    uri = runs["remote"] + "?" + store.uri.split("?", 1)[1]  # the endpoint, as given to run
    code, out, err = megacpp(["verify", uri])
    assert code == 0, err
    code, out, _ = megacpp(["inspect", uri])
    assert code == 0 and runs["local"].name in out
    loader = PackedRowsLoader(uri, split="train", batch_size=2, cache_dir=tmp_path / "rows")
    try:
        batch = next(iter(loader))
        assert batch["input_ids"].shape[0] == 2
    finally:
        loader.close()


def test_verify_by_uri_names_a_file_changed_in_the_bucket(runs: dict, tmp_path: Path) -> None:
    store: ShardStore = runs["store"]
    target = f"{store.join('snapshots', runs['local'].name)}/train/part-00000.parquet"
    data = bytearray(store.read_bytes(target))
    data[len(data) // 2] ^= 0x01
    with store.fs.open_output_stream(target) as f:
        f.write(bytes(data))
    uri = runs["remote"] + "?" + store.uri.split("?", 1)[1]
    try:
        code, out, err = megacpp(["verify", uri])
        # named by its place in the bucket, not by the temporary copy verify judged
        assert code == 1 and store.uri_of(target) in err, err
        assert "megacpp-verify-" not in err + out
    finally:
        data[len(data) // 2] ^= 0x01  # put it back for any test after this one
        with store.fs.open_output_stream(target) as f:
            f.write(bytes(data))


def test_the_report_and_the_megatron_export_go_to_the_bucket_too(runs: dict) -> None:
    store: ShardStore = runs["store"]
    snapshot_id = runs["local"].name
    report = store.join("snapshots", snapshot_id, "report", "quality_report.html")
    assert b"<html" in store.read_bytes(report).lower()
    local_export = runs["root"] / "local" / "megatron" / snapshot_id
    expected = {
        p.relative_to(local_export).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in local_export.rglob("*")
        if p.is_file()
    }
    assert {"train.bin", "train.idx"} <= expected.keys()
    export = store.join("megatron", snapshot_id)
    infos = store.fs.get_file_info(pafs.FileSelector(export, recursive=True))
    remote = {
        i.path[len(export) + 1 :]: hashlib.sha256(store.read_bytes(i.path)).hexdigest()
        for i in infos
        if i.type == pafs.FileType.File
    }
    assert remote == expected  # the same export, byte for byte, as the local run's


def test_older_snapshots_in_the_bucket_beyond_keep_go_oldest_first_and_others_stay(
    runs: dict,
) -> None:
    store: ShardStore = runs["store"]
    current_dir = store.join("snapshots", runs["local"].name)
    raw = json.loads(store.read_bytes(f"{current_dir}/manifest.json"))
    current = SnapshotManifest.model_validate(raw)

    def put(snapshot_id: str, created_at: str, *, name: str | None = None, complete: bool = True):
        folder = store.join("snapshots", snapshot_id)
        body = {**raw, "snapshot_id": snapshot_id, "created_at": created_at}
        body["name"] = name or raw["name"]
        store.put_bytes(f"{folder}/manifest.json", json.dumps(body).encode())
        store.put_bytes(f"{folder}/train/part-00000.parquet", b"rows")
        if complete:
            store.put_bytes(f"{folder}/{COMPLETE}", b"done")
        return folder

    oldest = put(f"{current.name}-0000000000000001", "2020-01-01T00:00:00+00:00")
    older = put(f"{current.name}-0000000000000002", "2021-01-01T00:00:00+00:00")
    other = put("othersnap-0000000000000003", "2019-01-01T00:00:00+00:00", name="othersnap")
    partial = put(f"{current.name}-0000000000000004", "2018-01-01T00:00:00+00:00", complete=False)
    try:
        assert prune_store_snapshots(store, current, keep=2) == [oldest]
        assert not store.exists(f"{oldest}/{COMPLETE}")
        assert not store.exists(f"{oldest}/train/part-00000.parquet")
        for kept in (older, other, current_dir):
            assert store.exists(f"{kept}/{COMPLETE}"), kept
        assert store.exists(f"{partial}/manifest.json")  # an upload in flight is not judged
        assert prune_store_snapshots(store, current, keep=1) == [older]
        assert store.exists(f"{current_dir}/{COMPLETE}")
    finally:
        for folder in (oldest, older, other, partial):
            store.delete_dir(folder)


def test_a_uri_without_a_promoted_snapshot_is_one_line(runs: dict) -> None:
    store: ShardStore = runs["store"]
    uri = store.uri_of(store.join("snapshots", "nope")) + "?" + store.uri.split("?", 1)[1]
    code, _, err = megacpp(["inspect", uri])
    assert code == 2 and err.count("\n") == 1 and "cannot read _COMPLETE" in err, err


def test_a_run_puts_back_a_snapshot_object_changed_in_the_bucket(runs: dict) -> None:
    """Nothing changed, but one shard of the uploaded snapshot was altered in the bucket:
    the snapshot does not stand on the local copy alone; the run uploads it again and the
    bucket's copy verifies."""
    store: ShardStore = runs["store"]
    target = f"{store.join('snapshots', runs['local'].name)}/train/part-00000.parquet"
    good = store.read_bytes(target)
    with store.fs.open_output_stream(target) as f:
        f.write(good[:-8] + b"tampered")
    before = store.latest("snapshot")
    again = megacpp_run(runs["catalog"], store.uri, runs["root"], "cache-s3")
    assert again.returncode == 0, again.stderr[-3000:]
    assert again.stdout.strip().splitlines()[-1] == runs["remote"]
    assert store.read_bytes(target) == good
    rebuilt = store.latest("snapshot")
    assert rebuilt.version != before.version
    assert rebuilt.extra["snapshot_id"] == before.extra["snapshot_id"]
    uri = runs["remote"] + "?" + store.uri.split("?", 1)[1]
    code, _, err = megacpp(["verify", uri])
    assert code == 0, err


def megacpp(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main(argv)
    return code, out.getvalue(), err.getvalue()
