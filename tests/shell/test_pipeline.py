"""The whole DAG through `megacpp run` on a small corpus written in the test: a promoted
snapshot that verifies from disk, a ledger that accounts for every file with the right
reason, and a corrupted shard that stops everything downstream."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tests.fixtures.pipeline_corpus import write_catalog

REPO = Path(__file__).resolve().parents[2]
MEGACPP = [sys.executable, "-m", "assets.cli"]


def _run(args: list[str], env: dict[str, str], timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*MEGACPP, *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout
    )


@pytest.fixture(scope="module")
def pipeline_run(tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = tmp_path_factory.mktemp("pipeline")
    catalog, expect = write_catalog(root)
    env = {
        **os.environ,
        "DAGSTER_HOME": str(root / "dagster_home"),
        "MEGACPP_CACHE_DIR": str(root / "cache"),
    }
    out = _run(["run", "--config", str(catalog), "--data-dir", str(root / "data")], env)
    return {"root": root, "catalog": catalog, "expect": expect, "env": env, "out": out}


def test_run_exits_zero_and_prints_the_promoted_snapshot_last(pipeline_run: dict) -> None:
    out = pipeline_run["out"]
    assert out.returncode == 0, out.stderr[-4000:]
    snap = Path(out.stdout.strip().splitlines()[-1])
    assert (snap / "_COMPLETE").exists()
    assert snap.parent == pipeline_run["root"] / "data" / "snapshots"
    for name in ("manifest.json", "tokenizer.json", "documents.parquet", "ledger.parquet"):
        assert (snap / name).is_file()
    assert list((snap / "train").glob("part-*.parquet"))


def test_the_run_is_five_dagster_runs_recorded_in_the_instance_with_every_partition(
    pipeline_run: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    import dagster as dg

    home = Path(pipeline_run["env"]["DAGSTER_HOME"])
    assert (home / "dagster.yaml").exists()
    monkeypatch.setenv("DAGSTER_HOME", str(home))  # as every Dagster process opens it
    instance = dg.DagsterInstance.get()
    runs = instance.get_runs()
    assert len(runs) == 5 and all(r.status == dg.DagsterRunStatus.SUCCESS for r in runs)
    assert "5 Dagster runs recorded" in pipeline_run["out"].stderr
    for asset in ("raw_files", "scrubbed_files", "tokenized_docs"):
        partitions = instance.get_materialized_partitions(dg.AssetKey(asset))
        assert partitions == {"tree", "repo"}, asset
    event = instance.get_latest_materialization_event(dg.AssetKey("deduped_files"))
    assert event is not None and event.asset_materialization is not None


def test_the_gates_after_normalize_run_in_its_pass_and_each_commits_in_its_own_step(
    pipeline_run: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    import dagster as dg

    monkeypatch.setenv("DAGSTER_HOME", pipeline_run["env"]["DAGSTER_HOME"])
    instance = dg.DagsterInstance.get()
    logged = {e.user_message for run in instance.get_runs() for e in instance.all_logs(run.run_id)}
    for stage in ("classified_files", "quality_files", "removed_files", "scrubbed_files"):
        for source in ("tree", "repo"):
            assert f"{stage} [{source}]: normalized_files's pass wrote this version" in logged
    for asset in ("classified_files", "scrubbed_files"):  # each its own materialization
        assert instance.get_materialized_partitions(dg.AssetKey(asset)) == {"tree", "repo"}


def _snapshot(pipeline_run: dict) -> Path:
    return Path(pipeline_run["out"].stdout.strip().splitlines()[-1])


def test_every_file_has_the_decision_its_case_demands(pipeline_run: dict) -> None:
    ledger = pq.read_table(_snapshot(pipeline_run) / "ledger.parquet").to_pylist()
    got = {(r["source_id"], r["path"]): r for r in ledger}
    for key, want in pipeline_run["expect"].items():
        assert key in got, f"{key} is not in the ledger"
        row = got[key]
        if want == "kept":
            assert row["status"] == "kept", (key, row)
        else:
            assert (row["status"], row["reason"]) == ("dropped", want), (key, row)
    assert ("repo", "include/late.hpp") not in got  # after the pinned commit
    dup = got[("repo", "third_party/lib1/container.hpp")]
    assert dup["dup_of"] == "tree:include/lib1/container.hpp"


def test_ledger_accounts_for_every_collected_file(pipeline_run: dict) -> None:
    manifest = json.loads((_snapshot(pipeline_run) / "manifest.json").read_text())
    for source, counts in manifest["ledger"].items():
        assert counts["collected"] == counts["kept"] + counts["dropped"], source
    assert manifest["ledger"]["tree"]["collected"] == 25


def test_author_email_is_scrubbed_before_tokenization(pipeline_run: dict) -> None:
    from tokenizers import Tokenizer

    snap = _snapshot(pipeline_run)
    tok = Tokenizer.from_file(str(snap / "tokenizer.json"))
    text = "".join(
        tok.decode(row, skip_special_tokens=False)
        for part in sorted(snap.glob("*/part-*.parquet"))
        for row in pq.read_table(part, columns=["input_ids"])["input_ids"].to_pylist()
    )
    assert "jane.roe@corp-mail.net" not in text
    assert "// Author: Jane Roe <<EMAIL>>" in text


def test_verify_passes_and_names_a_flipped_byte(pipeline_run: dict, tmp_path: Path) -> None:
    import shutil

    snap = _snapshot(pipeline_run)
    ok = _run(["verify", str(snap)], pipeline_run["env"])
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "FAIL" not in ok.stdout
    copy = tmp_path / snap.name
    shutil.copytree(snap, copy)
    shard = sorted((copy / "train").glob("*.parquet"))[0]
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x01
    shard.write_bytes(bytes(data))
    bad = _run(["verify", str(copy)], pipeline_run["env"])
    assert bad.returncode == 1
    assert str(shard) in bad.stdout + bad.stderr


def test_inspect_prints_the_manifest_summary(pipeline_run: dict) -> None:
    out = _run(["inspect", str(_snapshot(pipeline_run))], pipeline_run["env"])
    assert out.returncode == 0 and "documents" in out.stdout and "train" in out.stdout


def test_a_corrupted_shard_fails_its_check_and_nothing_downstream_runs(
    pipeline_run: dict,
) -> None:
    import dagster as dg

    from assets.defs import build_defs
    from megacpp_pipeline.storage.store import ShardStore

    assert pipeline_run["out"].returncode == 0
    root = pipeline_run["root"]
    defs = build_defs(pipeline_run["catalog"], root / "data", cache_dir=root / "cache")
    st = ShardStore(str(root / "data"))
    m = st.latest("raw_files", "tree")
    before = st.latest("normalized_files", "tree").version
    shard = Path(st.version_dir(m)) / m.tables["data"].shards[0].path
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    result = dg.materialize(
        [*defs.assets, *defs.asset_checks],  # type: ignore[list-item]
        selection=dg.AssetSelection.checks_for_assets("raw_files")
        | dg.AssetSelection.assets("normalized_files"),
        partition_key="tree",
        instance=dg.DagsterInstance.ephemeral(),
        resources=defs.resources,
        raise_on_error=False,
    )
    failed = {
        e.check_name: e.description for e in result.get_asset_check_evaluations() if not e.passed
    }
    assert str(shard) in (failed.get("manifest_verifies_from_disk") or ""), failed
    assert result.get_asset_materialization_events() == []
    assert st.latest("normalized_files", "tree").version == before


def test_the_console_is_the_plain_progress_view_without_dagster_debug_lines(
    pipeline_run: dict,
) -> None:
    err = pipeline_run["out"].stderr
    assert "DEBUG" not in err and "STEP_START" not in err
    lines = err.strip().splitlines()
    assert sum(line.startswith("-> ") for line in lines) == 5  # one per Dagster run
    assert any(line.startswith("stage ") and "top drop reasons" in line for line in lines)
    assert len(lines) < 50  # one screen
