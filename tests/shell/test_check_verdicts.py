"""A content check stands on its earlier passes as the Dagster instance recorded them
(assets/factory.py, `prior_verdicts`): three `megacpp run --stop-after scrubbed_files` over
the test corpus in one instance. The first runs no detector over a text its gate inspected in
the same process (every scrubbed text), and reads every one to hash it; the second, over the
same versions, reads none; the third, after one file changed, inspects that file's text only.
An evaluation reported without a run is never stood on."""

from __future__ import annotations

from pathlib import Path

import dagster as dg
import pytest

from assets.factory import prior_verdicts
from megacpp_pipeline.pipeline.checks import VERIFIED
from tests.fixtures.verdict_runs import KEY
from tests.fixtures.verdict_runs import three_runs as run_three


@pytest.fixture(scope="module")
def three_runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict[str, object]]]:
    root = tmp_path_factory.mktemp("verdicts")
    return root, run_three(root)


def test_the_first_run_stands_on_its_gate_s_pass_and_records_both_sources(
    three_runs: tuple,
) -> None:
    _, passes = three_runs
    assert len(passes) == 3
    first = passes[0]
    assert first["files_scanned_by_gate"] > 0
    assert first["files_rescanned"] == 0 and first["files_trusted"] == 0
    assert set(first[VERIFIED]) == {"tree", "repo"}


def test_the_second_run_over_the_same_versions_reads_no_text(three_runs: tuple) -> None:
    _, (first, second, _) = three_runs
    assert second["files_rescanned"] == 0
    assert second["files_trusted"] == first["files_scanned_by_gate"]
    assert second[VERIFIED] == first[VERIFIED]


def test_after_one_file_changed_only_its_text_is_read(three_runs: tuple) -> None:
    _, (first, _, third) = three_runs
    assert third["files_rescanned"] == 1
    assert third["files_trusted"] == first["files_scanned_by_gate"] - 1
    assert third["files_scanned_by_gate"] == 0  # its other rows came from the result cache
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
