"""The snapshot's Dagster checks after a promotion: the checks bound to the manifest's files
report what the promotion proved while the manifest is byte for byte the one it checked
(file_checksums re-hashes every listed file each time, so a changed shard still fails);
a changed manifest or snapshot config runs every check again, and a wrong fact then fails."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow as pa
import pytest

from megacpp_pipeline.pipeline.context import StageContext
from megacpp_pipeline.pipeline.executor import LocalExecutor
from megacpp_pipeline.pipeline.parallel import polars_threads_run
from megacpp_pipeline.pipeline.registry import CheckOutcome
from megacpp_pipeline.pipeline.runner import checks_of, run_all, run_stage
from megacpp_pipeline.snapshot import verify
from megacpp_pipeline.snapshot.layout import MANIFEST
from megacpp_pipeline.snapshot.promote import SINGLE_FILES, SnapshotConfig
from megacpp_pipeline.stages import names
from megacpp_pipeline.stages import snapshot as snapshot_stage
from megacpp_pipeline.stages.snapshot import (
    _CheckApart,
    _checks_apart,
    snapshot_dir_of,
)
from tests.fixtures.pipeline_corpus import write_catalog
from tests.fixtures.stage_runs import context


def _context(tmp_path: Path, catalog: Path, run: str) -> StageContext:
    return context(tmp_path, catalog, run)


@pytest.fixture(scope="module")
def promoted(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    tmp = tmp_path_factory.mktemp("snapshot-checks")
    catalog, _ = write_catalog(tmp)
    run_all(_context(tmp, catalog, "first"))  # every stage, every blocking check
    return tmp, catalog


def _checks(ctx: StageContext) -> dict[str, CheckOutcome]:
    stage = ctx.registry.get(names.SNAPSHOT)
    return {c.name: c.evaluate(ctx, stage, None) for c in checks_of(stage)}


def test_manifest_bound_checks_report_the_promotion_and_the_rest_run_again(
    promoted: tuple[Path, Path],
) -> None:
    ctx = _context(*promoted, "checks")
    outcomes = _checks(ctx)
    assert all(o.passed for o in outcomes.values()), outcomes
    for name in verify.ALL_CHECKS:
        reported = "checked" in outcomes[name].metadata
        assert reported == (name in verify.MANIFEST_BOUND), name
    # the promotion's metrics come with the outcome: the dashboards' series do not change
    assert outcomes["token_range_and_pads"].metadata["rows"] > 0
    assert outcomes["document_consistency"].metadata["documents"] > 0
    assert outcomes["file_checksums"].metadata["files"] > 0


def test_a_changed_shard_fails_file_checksums(promoted: tuple[Path, Path], tmp_path: Path) -> None:
    ctx = _context(*promoted, "shard")
    shard = sorted((snapshot_dir_of(ctx) / "train").glob("*.parquet"))[0]
    original = shard.read_bytes()
    try:
        shard.write_bytes(original[:-9] + bytes(b ^ 0xFF for b in original[-9:-8]) + original[-8:])
        outcome = _checks(ctx)["file_checksums"]
        assert not outcome.passed
        assert f"{shard}: sha256 mismatch" in str(outcome.description)
    finally:
        shard.write_bytes(original)
    assert _checks(ctx)["file_checksums"].passed


def test_a_changed_manifest_runs_every_check_again(promoted: tuple[Path, Path]) -> None:
    ctx = _context(*promoted, "manifest")
    manifest = snapshot_dir_of(ctx) / MANIFEST
    original = manifest.read_bytes()
    try:
        data = json.loads(original)
        data["vocab_size"] = 3  # every id of the rows is now out of range
        manifest.write_text(json.dumps(data, indent=2))
        outcomes = _checks(ctx)
        assert not any("checked" in o.metadata for o in outcomes.values())
        assert not outcomes["token_range_and_pads"].passed
        assert "input_ids outside [0, 3)" in str(outcomes["token_range_and_pads"].description)
    finally:
        manifest.write_bytes(original)
    assert "checked" in _checks(ctx)["token_range_and_pads"].metadata


def test_another_snapshot_config_runs_every_check_again(promoted: tuple[Path, Path]) -> None:
    tmp, catalog = promoted
    text = catalog.read_text()
    assert text.count("  snapshot:\n") == 1 and "round_trip_sample" not in text
    changed = catalog.with_name("sources-sample.yaml")
    changed.write_text(text.replace("  snapshot:\n", "  snapshot:\n    round_trip_sample: 3\n"))
    outcomes = _checks(_context(tmp, changed, "config"))
    assert all(o.passed for o in outcomes.values())
    assert not any("checked" in o.metadata for o in outcomes.values())


def test_a_repeated_run_keeps_the_promoted_snapshot_and_its_record_holds(
    promoted: tuple[Path, Path],
) -> None:
    tmp, catalog = promoted
    ctx = _context(tmp, catalog, "again")
    before = snapshot_dir_of(ctx)
    made = (before / MANIFEST).read_bytes()
    run_all(ctx)  # the same content: the snapshot promoted first is kept, manifest and all
    assert snapshot_dir_of(ctx) == before and (before / MANIFEST).read_bytes() == made
    outcomes = _checks(ctx)
    assert all(o.passed for o in outcomes.values())
    assert {n for n, o in outcomes.items() if "checked" in o.metadata} == set(verify.MANIFEST_BOUND)


def test_no_check_reads_a_provenance_field(promoted: tuple[Path, Path], tmp_path: Path) -> None:
    import shutil

    from megacpp_pipeline.snapshot.promote import SnapshotConfig, read_manifest

    ctx = _context(*promoted, "provenance")
    snap = tmp_path / "copy"
    shutil.copytree(snapshot_dir_of(ctx), snap)
    original = read_manifest(snap)
    changed = original.model_copy(
        update={"created_at": "1970-01-01T00:00:00", "engine": {"engine": "elsewhere"},
                "inputs": {}, "tokenizer_policy": {"mode": "other"}}
    )  # fmt: skip
    assert verify.same_checked_facts(original, changed)
    assert not verify.same_checked_facts(original, changed.model_copy(update={"draw_seed": 7}))
    config = SnapshotConfig()
    before = {n: verify.run_check(n, snap, config) for n in verify.MANIFEST_BOUND}
    (snap / MANIFEST).write_text(changed.model_dump_json(indent=2))
    for name in verify.MANIFEST_BOUND:
        after = verify.run_check(name, snap, config)
        assert (after.passed, after.metrics, after.problems) == (
            before[name].passed,
            before[name].metrics,
            before[name].problems,
        ), name


@pytest.mark.timeout(300)
def test_the_snapshot_steps_run_apart_even_after_polars_started_in_the_driver(
    promoted: tuple[Path, Path],
) -> None:
    """The single files' writers, the promotion checks and the card's diff run in forked
    workers of their own. A driver whose polars thread pool has started (a run's process has
    run other stages) must still get their results: a forked child that ran a polars query
    would wait forever, so none of them may use polars. Each step's CPU is recorded."""
    frame = pl.DataFrame({"k": [i % 7 for i in range(200_000)], "v": range(200_000)})
    assert frame.group_by("k").agg(pl.col("v").sum()).height == 7
    assert polars_threads_run()
    tmp, catalog = promoted
    previous = snapshot_dir_of(_context(tmp, catalog, "before"))
    # another snapshot config: a snapshot of another id, so the card's diff runs too
    changed = catalog.with_name("sources-apart.yaml")
    changed.write_text(
        catalog.read_text().replace("  snapshot:\n", "  snapshot:\n    round_trip_sample: 7\n")
    )
    ctx = context(tmp, changed, "apart", workers=2)
    stage = ctx.registry.get(names.SNAPSHOT)
    for _ in run_stage(ctx, stage, [None]):
        pass
    assert snapshot_dir_of(ctx) != previous
    steps = ctx.latest(names.SNAPSHOT, None).extra["single_process_steps_cpu_s"]
    assert {f"write {f}" for f in SINGLE_FILES} <= set(steps)
    assert {f"check {c}" for c in verify.ALL_CHECKS} | {"diff"} <= set(steps)
    outcomes = _checks(ctx)  # those the promotion did not record run apart again
    assert all(o.passed for o in outcomes.values()), outcomes


class _Recording(LocalExecutor):
    """The host's executor, noting the width of every light map and the task it maps."""

    def __init__(self, workers: int) -> None:
        super().__init__(workers, cap=False)
        self.maps: list[tuple[int, str]] = []

    def map_light(self, task: Any, job: Any, items: Any) -> Any:
        self.maps.append((self.workers, getattr(task, "__qualname__", "?")))
        return super().map_light(task, job, items)


def test_every_promotion_check_maps_its_shards_on_the_whole_host(
    promoted: tuple[Path, Path], tmp_path: Path
) -> None:
    """The checks run one after another in one process apart, each one's per-shard tasks on
    a pool as wide as the host: side by side, each had ceil(W / 10) workers, and the longest
    check's shards ran on a sliver of the host while the short checks' shares sat idle."""
    ctx = _context(*promoted, "width")
    snap = snapshot_dir_of(ctx)
    host = _Recording(3)
    job = _CheckApart(snap, SnapshotConfig(), tmp_path / "megatron", host)
    done = _checks_apart(job, tuple(verify.ALL_CHECKS))
    assert [o.name for o, _ in done] == list(verify.ALL_CHECKS)
    assert all(o.passed for o, _ in done), [o.problems for o, _ in done if not o.passed]
    assert all(cpu_s >= 0 for _, cpu_s in done)
    assert host.maps and {width for width, _ in host.maps} == {3}
    # the checks that rescan rows and documents mapped their shards
    assert len(host.maps) >= 4, host.maps


def test_a_removal_entry_that_removed_nothing_is_named_and_the_check_still_passes(
    tmp_path: Path,
) -> None:
    """A takedown spelled otherwise than the path it means removes nothing: the file may be
    gone upstream, so the check passes, but its outcome names every such entry."""
    catalog, _ = write_catalog(tmp_path)
    catalog.write_text(
        catalog.read_text()
        + "removals:\n  - source: tree\n    path: src/lib1.cc\n"
        + "  - source: tree\n    path: src/no_such_file.cc\n"
    )
    ctx = _context(tmp_path, catalog, "run")
    run_all(ctx)
    outcome = _checks(ctx)["no_removed_content_in_snapshot"]
    assert outcome.passed
    assert outcome.metadata["removed_files"] == 1
    assert outcome.metadata["entries_that_removed_nothing"] == 1
    assert "src/no_such_file.cc" in outcome.metadata["idle_entries"]
    assert "src/lib1.cc" not in outcome.metadata["idle_entries"]


def test_read_ahead_gives_every_shard_in_order_a_few_small_shards_a_task(
    promoted: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Small shards are read several to a task (a later stage's ledger shard holds tens of
    rows): the rows, their order and their columns are those of the shards one by one."""
    ctx = _context(*promoted, "read-ahead")
    versions = [
        (ctx.latest(name, source), "ledger")
        for name in ctx.registry.ledger_stages()
        for source in (ctx.sources() if ctx.registry.get(name).per_source else [None])
    ]
    one_by_one = [
        ctx.store.read_shard(ctx.store.version_dir(m), shard, None)
        for m, table in versions
        if table in m.tables
        for shard in m.tables[table].shards
    ]
    assert len(one_by_one) > 3
    monkeypatch.setattr(snapshot_stage, "READ_BATCH_SHARDS", 2)
    batched = list(snapshot_stage.read_ahead(ctx, versions))
    assert len(batched) < len(one_by_one)
    want = pa.concat_tables(one_by_one, promote_options="permissive").to_pylist()
    got = pa.concat_tables(batched, promote_options="permissive").to_pylist()
    assert got == want
