"""Same inputs, same config, same code: two `megacpp run`s from clean state (separate data dirs
and Dagster instances) write byte-identical files, and their snapshot manifests differ only in
the keys that name a moment or a run."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fixtures.run_helpers import (
    RUN_IDENTITY_KEYS,
    Baseline,
    clean_runs,
    diff_keys,
    snapshot_files,
    store_files,
)


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Baseline, Path]:
    first, second = clean_runs(tmp_path_factory)
    return first, second.snapshot


def test_two_clean_runs_write_byte_identical_asset_versions(
    two_runs: tuple[Baseline, Path],
) -> None:
    first, second = two_runs
    a, b = store_files(first.ws.data), store_files(second.parent.parent)
    assert a.keys() == b.keys()
    differing = sorted(k for k in a if a[k] != b[k])
    assert differing == [], differing
    # every gate's shards are compared, by table and shard index
    for asset in ("raw_files", "scrubbed_files", "deduped_files", "tokenized_docs"):
        assert any(k.startswith(f"{asset}/") for k in a), asset
    assert "tokenizer/_/tokenizer.json" in a and "documents/_/document_files[0]" in a


def test_two_clean_runs_promote_byte_identical_snapshots(two_runs: tuple[Baseline, Path]) -> None:
    first, second = two_runs
    assert first.snapshot.name == second.name  # the id is a hash of the content
    marker = [(s / "_COMPLETE").read_text().split()[0] for s in (first.snapshot, second)]
    assert marker == [first.snapshot.name] * 2
    a, b = snapshot_files(first.snapshot), snapshot_files(second)
    assert {"tokenizer.json", "documents.parquet", "ledger.parquet", "pieces.parquet"} <= set(a)
    assert any(k.startswith("train/") for k in a) and any(k.startswith("validation/") for k in a)
    assert a == b


def test_snapshot_manifests_differ_only_in_timestamps_and_run_identity(
    two_runs: tuple[Baseline, Path],
) -> None:
    import json

    first, second = two_runs
    a = json.loads((first.snapshot / "manifest.json").read_text())
    b = json.loads((second / "manifest.json").read_text())
    differing = diff_keys(a, b)
    # created_at is the promotion time; inputs are the sha256 of the upstream asset versions'
    # manifests, which hold those versions' ids (time + random) and Dagster run ids
    assert differing, "two runs cannot share a promotion time"
    assert "created_at" in differing
    assert all(key.split(".")[0] in RUN_IDENTITY_KEYS for key in differing), differing
