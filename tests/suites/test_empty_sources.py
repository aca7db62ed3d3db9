"""Empty is a normal outcome at every stage: a source with nothing left (nothing collected,
nothing after normalize, every licence denied, everything removed by scrub, every file a
duplicate, everything dropped by enrich) materializes complete zero-row versions whose
checks pass, the snapshot is promoted from the other sources, and the ledger and the quality
report say why the source has no documents. A corpus with nothing left at all fails once,
before promotion, with one line that points at the ledgers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from megacpp_pipeline.stages import default_registry
from megacpp_pipeline.storage.store import ShardStore
from tests.fixtures.empty_sources import EMPTY_AT, write_sources

REPO = Path(__file__).resolve().parents[2]


def _megacpp_run(root: Path, catalog: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "DAGSTER_HOME": str(root / "home")}
    return subprocess.run(
        [sys.executable, "-m", "assets.cli", "run", "--config", str(catalog),
         "--data-dir", str(root / "data"), "--cache-dir", str(root / "cache")],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = tmp_path_factory.mktemp("empties")
    catalog = write_sources(root, ["good", *EMPTY_AT])
    out = _megacpp_run(root, catalog)
    return {"root": root, "out": out}


def _snapshot(run: dict) -> Path:
    assert run["out"].returncode == 0, run["out"].stderr[-3000:]
    return Path(run["out"].stdout.strip().splitlines()[-1])


def test_the_snapshot_is_promoted_from_the_one_source_with_something_left(run: dict) -> None:
    snap = _snapshot(run)
    documents = pq.read_table(snap / "documents.parquet", columns=["source_id"])
    assert set(documents["source_id"].to_pylist()) == {"good"}
    manifest = json.loads((snap / "manifest.json").read_text())
    for source, counts in manifest["ledger"].items():
        assert counts["collected"] == counts["kept"] + counts["dropped"], source


@pytest.mark.parametrize("source", sorted(EMPTY_AT))
def test_a_source_emptied_at_a_stage_has_complete_zero_row_versions_after_it(
    run: dict, source: str
) -> None:
    _snapshot(run)
    stage, _ = EMPTY_AT[source]
    registry = default_registry()
    store = ShardStore(str(run["root"] / "data"))
    after = registry.names()[registry.names().index(stage) :]
    for name in after:
        if not registry.get(name).per_source:
            continue
        manifest = store.latest(name, source)
        assert manifest.rows == 0, (name, source)
        assert not store.verify(manifest), (name, source)
        if registry.get(name).gate is not None:
            stats = manifest.stats
            assert stats["input_files"] == stats["kept_files"] + stats["dropped_files"], name


@pytest.mark.parametrize("source", sorted(EMPTY_AT))
def test_the_ledger_says_where_and_why_each_file_of_an_emptied_source_went(
    run: dict, source: str
) -> None:
    stage, reason = EMPTY_AT[source]
    ledger = pq.read_table(_snapshot(run) / "ledger.parquet").to_pylist()
    rows = [r for r in ledger if r["source_id"] == source]
    assert rows, source
    assert {r["status"] for r in rows} == {"dropped"}
    wanted = [r for r in rows if r["reason"] == reason]
    assert wanted and all(r["stage"] == stage for r in wanted), rows


def test_the_quality_report_lists_every_source_with_its_documents_and_why(run: dict) -> None:
    html = (_snapshot(run) / "report" / "quality_report.html").read_text()
    for source, (_, reason) in EMPTY_AT.items():
        row = next(line for line in html.splitlines() if f"<td>{source}</td>" in line)
        assert "<td>0</td>" in row and reason in row, row


def test_a_corpus_with_nothing_left_fails_once_before_promotion_pointing_at_the_ledgers(
    tmp_path: Path,
) -> None:
    catalog = write_sources(tmp_path, ["nothing_collected", "all_denied"])
    out = _megacpp_run(tmp_path, catalog)
    assert out.returncode == 1
    failed = [line for line in out.stderr.splitlines() if "FAILED" in line]
    assert len(failed) == 1, out.stderr[-3000:]
    assert "nothing left" in failed[0] and "licensed_files: 3 license_denied" in failed[0]
    assert str(tmp_path / "data" / "assets") in failed[0]
    assert not (tmp_path / "data" / "snapshots").exists() or not any(
        (tmp_path / "data" / "snapshots").glob("*/_COMPLETE")
    )
