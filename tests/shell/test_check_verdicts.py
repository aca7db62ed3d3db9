"""A content check stands on its earlier passes as the Dagster instance recorded them
(assets/factory.py, `prior_verdicts`): three `megacpp run --stop-after scrubbed_files` over
the test corpus in one instance. The first reads every scrubbed text; the second, over the
same versions, reads none; the third, after one file changed, reads that file's text only.
An evaluation reported without a run is never stood on."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import dagster as dg
import pytest
from dagster._core.storage.asset_check_execution_record import (
    AssetCheckExecutionRecordStatus,
)

from assets.factory import prior_verdicts
from megacpp_pipeline.pipeline.checks import VERIFIED
from megacpp_pipeline.stages.scrub import NO_DETECTOR_FIRES
from tests.fixtures.pipeline_corpus import write_catalog

REPO = Path(__file__).resolve().parents[2]
KEY = dg.AssetCheckKey(dg.AssetKey("scrubbed_files"), NO_DETECTOR_FIRES)
CHANGED = "include/lib1/container.hpp"


def _run(root: Path, catalog: Path) -> None:
    env = {
        **os.environ,
        "DAGSTER_HOME": str(root / "dagster_home"),
        "MEGACPP_CACHE_DIR": str(root / "cache"),
    }
    args = ["run", "--config", str(catalog), "--data-dir", str(root / "data")]
    out = subprocess.run(
        [sys.executable, "-m", "assets.cli", *args, "--stop-after", "scrubbed_files"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-4000:]


def _metadata(record: object) -> dict[str, object]:
    event = record.event.dagster_event  # type: ignore[attr-defined]
    return {
        k: getattr(v, "value", getattr(v, "text", getattr(v, "data", v)))
        for k, v in event.event_specific_data.metadata.items()
    }


@pytest.fixture(scope="module")
def three_runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict[str, object]]]:
    root = tmp_path_factory.mktemp("verdicts")
    catalog, _ = write_catalog(root / "corpus")
    _run(root, catalog)
    _run(root, catalog)
    changed = root / "corpus" / "corpus_dir" / CHANGED
    changed.write_text(changed.read_text() + "\nint one_more_line() { return 1; }\n")
    _run(root, catalog)
    os.environ["DAGSTER_HOME"] = str(root / "dagster_home")
    try:
        instance = dg.DagsterInstance.get()
        records = instance.event_log_storage.get_asset_check_execution_history(
            KEY, limit=10, status={AssetCheckExecutionRecordStatus.SUCCEEDED}
        )
        done = [_metadata(r) for r in records if r.event is not None and r.run_id]
    finally:
        del os.environ["DAGSTER_HOME"]
    return root, list(reversed(done))  # oldest first


def test_the_first_run_reads_every_text_and_records_both_sources(three_runs: tuple) -> None:
    _, passes = three_runs
    assert len(passes) == 3
    first = passes[0]
    assert first["files_rescanned"] > 0 and first["files_trusted"] == 0
    assert set(first[VERIFIED]) == {"tree", "repo"}


def test_the_second_run_over_the_same_versions_reads_no_text(three_runs: tuple) -> None:
    _, (first, second, _) = three_runs
    assert second["files_rescanned"] == 0
    assert second["files_trusted"] == first["files_rescanned"]
    assert second[VERIFIED] == first[VERIFIED]


def test_after_one_file_changed_only_its_text_is_read(three_runs: tuple) -> None:
    _, (first, _, third) = three_runs
    assert third["files_rescanned"] == 1
    assert third["files_trusted"] == first["files_rescanned"] - 1
    assert third[VERIFIED]["repo"] == first[VERIFIED]["repo"]
    assert third[VERIFIED]["tree"]["version"] != first[VERIFIED]["tree"]["version"]


def test_an_evaluation_reported_without_a_run_is_not_stood_on(tmp_path: Path) -> None:
    instance = dg.DagsterInstance.ephemeral(tempdir=str(tmp_path))
    record = {"version": "v", "manifest_sha256": "0" * 64, "fingerprint": "f" * 32}
    instance.report_runless_asset_event(
        dg.AssetCheckEvaluation(
            asset_key=KEY.asset_key,
            check_name=KEY.name,
            passed=True,
            metadata={VERIFIED: dg.MetadataValue.json({"tree": record})},
        )
    )
    assert prior_verdicts(instance, KEY, ["tree"]) == {}
