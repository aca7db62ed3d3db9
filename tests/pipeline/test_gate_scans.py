"""What a gate's own pass inspected, held in the process that commits its version
(pipeline/checks.py, `note_gate_scan`): scrub's check in that process does not run its
detectors again over a shard whose texts hash to the gate's note, and runs them over every
other text: a shard that is not what the gate inspected, rows served from the result cache,
a check in another process. Real runs of the test corpus through scrub."""

from __future__ import annotations

import hashlib
from dataclasses import replace
from pathlib import Path

import pyarrow as pa
import yaml

from megacpp_pipeline.core.schemas import text_sha256
from megacpp_pipeline.pipeline.checks import (
    VERIFIED,
    ShardScan,
    Verified,
    _hashed_rows,
    forget_gate_scans,
    gate_scan,
    note_gate_scan,
)
from megacpp_pipeline.pipeline.context import StageContext
from megacpp_pipeline.pipeline.registry import CheckOutcome
from megacpp_pipeline.stages.decontaminate import RESCAN_CLEAN
from megacpp_pipeline.stages.scrub import NO_DETECTOR_FIRES
from tests.fixtures import benchmark_tasks
from tests.fixtures.pipeline_corpus import write_catalog
from tests.fixtures.scrubbed_versions import SECRET, SOURCE, STAGE, first_text, rewritten
from tests.fixtures.stage_runs import context, evaluate, run_through


def _scrubbed(tmp: Path, workers: int = 1) -> StageContext:
    catalog, _ = write_catalog(tmp / "corpus")
    return run_through(context(tmp, catalog, "first", workers=workers), STAGE)


def _catalog(ctx: StageContext) -> Path:
    return ctx.cache_dir.parent / "corpus" / "sources.yaml"


def _check(ctx: StageContext) -> CheckOutcome:
    return evaluate(ctx, STAGE, NO_DETECTOR_FIRES, SOURCE)


def _version(ctx: StageContext) -> str:
    store = ctx.store
    return store.relative(store.version_dir(store.latest(STAGE, SOURCE)))


def test_the_check_in_the_gate_s_process_reads_none_of_the_texts_it_inspected(
    tmp_path: Path,
) -> None:
    ctx = _scrubbed(tmp_path, workers=2)  # the notes come back from forked workers
    manifest = ctx.store.latest(STAGE, SOURCE)
    notes = gate_scan(manifest, _version(ctx), manifest.code_version)
    assert notes is not None
    assert set(notes) == {s.path for s in manifest.tables["data"].shards}
    assert gate_scan(manifest, _version(ctx), "another code version") is None
    assert gate_scan(manifest, "assets/scrubbed_files/tree/another", manifest.code_version) is None

    outcome = _check(ctx)
    assert outcome.passed, outcome.description
    assert outcome.metadata["files_scanned_by_gate"] == manifest.rows > 0
    assert outcome.metadata["files_rescanned"] == 0
    assert outcome.metadata["files_trusted"] == 0
    assert outcome.metadata[VERIFIED]["version"] == _version(ctx)


def test_without_the_notes_the_check_reads_every_text(tmp_path: Path) -> None:
    ctx = _scrubbed(tmp_path)
    forget_gate_scans()  # as a check run in another process than the gate's
    outcome = _check(ctx)
    assert outcome.passed, outcome.description
    assert outcome.metadata["files_rescanned"] == ctx.store.latest(STAGE, SOURCE).rows
    assert outcome.metadata["files_scanned_by_gate"] == 0


def test_a_shard_that_is_not_what_the_gate_inspected_is_read_and_its_secret_found(
    tmp_path: Path,
) -> None:
    """The gate's notes held for a version whose first shard now holds a secret (as after a
    shard rewritten in place with its manifest and marker): that shard is inspected, the
    others are not."""
    ctx = _scrubbed(tmp_path)
    good = ctx.store.latest(STAGE, SOURCE)
    notes = gate_scan(good, _version(ctx), good.code_version)
    assert notes is not None
    first = good.tables["data"].shards[0].path
    bad = rewritten(ctx, lambda t: first_text(t, SECRET), only=first)
    assert [s.path for s in bad.tables["data"].shards] == list(notes)
    note_gate_scan(ctx.store, bad, notes)

    outcome = _check(ctx)
    assert not outcome.passed
    assert outcome.description is not None and SOURCE in outcome.description
    read = bad.tables["data"].shards[0].rows
    assert outcome.metadata["files_rescanned"] == read
    assert outcome.metadata["files_scanned_by_gate"] == bad.rows - read
    assert VERIFIED not in outcome.metadata


def test_rows_served_from_the_result_cache_are_read_by_the_check(tmp_path: Path) -> None:
    """A second store over the same result cache: every scrub row is served from an entry,
    which vouches for nothing; the check reads every text."""
    first = _scrubbed(tmp_path / "a")
    second = replace(
        context(tmp_path / "b", _catalog(first), "second"),
        cache_dir=first.cache_dir,
    )
    second = run_through(second, STAGE)
    assert second.store.latest(STAGE, SOURCE).stats["cached_files"] > 0
    outcome = _check(second)
    assert outcome.passed, outcome.description
    assert outcome.metadata["files_rescanned"] == second.store.latest(STAGE, SOURCE).rows
    assert outcome.metadata["files_scanned_by_gate"] == 0


def test_a_pass_on_the_notes_is_a_record_the_next_pass_stands_on(tmp_path: Path) -> None:
    ctx = _scrubbed(tmp_path)
    recorded = Verified.from_json(_check(ctx).metadata[VERIFIED], "run-1")
    assert recorded is not None
    forget_gate_scans()
    again = evaluate(
        replace(ctx, prior_verdicts={SOURCE: recorded}), STAGE, NO_DETECTOR_FIRES, SOURCE
    )
    assert again.passed and again.metadata["files_rescanned"] == 0
    assert again.metadata["files_trusted"] == ctx.store.latest(STAGE, SOURCE).rows


def test_notes_are_kept_for_a_partition_s_latest_commit_only(tmp_path: Path) -> None:
    ctx = _scrubbed(tmp_path)
    old = ctx.store.latest(STAGE, SOURCE)
    old_version = _version(ctx)
    newer = rewritten(ctx, lambda t: t)
    note_gate_scan(ctx.store, newer, {})  # a commit that vouched for nothing
    assert gate_scan(old, old_version, old.code_version) is None
    assert gate_scan(newer, _version(ctx), newer.code_version) is None


def test_a_shard_note_vouches_only_for_its_rows_and_only_over_the_same_texts() -> None:
    digests = [text_sha256(t) for t in ("int a;\n", "int b;\n", "int c;\n")]
    scan = ShardScan.of([digests[0], None, digests[2]])
    assert scan.unvouched == (1,)
    assert scan.holds(digests)  # the unvouched row may hold anything: the check reads it
    assert scan.holds([digests[0], text_sha256("anything\n"), digests[2]])
    assert not scan.holds([digests[0], digests[1], text_sha256("int d;\n")])
    assert not scan.holds(digests[:2]) and not scan.holds([*digests, digests[0]])
    assert not ShardScan.of(digests).holds(list(reversed(digests)))


def test_decontamination_s_check_inspects_only_what_its_gate_did_not_match(
    tmp_path: Path,
) -> None:
    """With a benchmark in the catalog, the check in the gate's process lexes no text the
    gate matched nothing in; without the notes it reads every kept text, and agrees."""
    catalog, _ = write_catalog(tmp_path / "corpus")
    tasks = benchmark_tasks.build(n_tasks=20, seed=3)
    (tmp_path / "corpus" / "evals").mkdir()
    bench = benchmark_tasks.write_jsonl(tasks, tmp_path / "corpus" / "evals" / "tasks.jsonl")
    data = yaml.safe_load(catalog.read_text())
    data["benchmarks"] = [{
        "id": "cppeval", "uri": "evals/tasks.jsonl", "format": "jsonl",
        "sha256": hashlib.sha256(bench.read_bytes()).hexdigest(),
        "fields": ["prompt", "canonical_solution", "test"],
    }]  # fmt: skip
    catalog.write_text(yaml.safe_dump(data))
    ctx = run_through(context(tmp_path, catalog, "first"), "decontaminated_files")
    kept = ctx.store.latest("decontaminated_files", None).rows
    outcome = evaluate(ctx, "decontaminated_files", RESCAN_CLEAN)
    assert outcome.passed, outcome.description
    assert (outcome.metadata["files_scanned_by_gate"], outcome.metadata["files_rescanned"]) == (
        kept,
        0,
    )
    forget_gate_scans()
    again = evaluate(ctx, "decontaminated_files", RESCAN_CLEAN)
    assert again.passed and again.metadata["files_rescanned"] == kept


def test_a_note_recorded_at_another_code_version_is_not_used_by_the_check(
    tmp_path: Path,
) -> None:
    ctx = _scrubbed(tmp_path)
    manifest = ctx.store.latest(STAGE, SOURCE)
    notes = gate_scan(manifest, _version(ctx), manifest.code_version)
    assert notes is not None
    note_gate_scan(ctx.store, manifest.model_copy(update={"code_version": "other"}), notes)
    outcome = _check(ctx)
    assert outcome.passed, outcome.description
    assert outcome.metadata["files_scanned_by_gate"] == 0
    assert outcome.metadata["files_rescanned"] == manifest.rows


def test_a_noted_shard_whose_rows_were_reordered_is_inspected_whole(tmp_path: Path) -> None:
    """The same texts in another order are not what the gate noted (the note is over the
    shard's rows in order): every row is inspected."""
    ctx = _scrubbed(tmp_path)
    good = ctx.store.latest(STAGE, SOURCE)
    notes = gate_scan(good, _version(ctx), good.code_version)
    assert notes is not None and good.rows > 1
    moved = rewritten(ctx, lambda t: t.take(list(reversed(range(t.num_rows)))))
    note_gate_scan(ctx.store, moved, notes)
    outcome = _check(ctx)
    assert outcome.passed, outcome.description
    assert outcome.metadata["files_scanned_by_gate"] == 0
    assert outcome.metadata["files_rescanned"] == moved.rows


def test_a_null_text_is_a_problem_even_where_the_gate_noted_an_empty_one() -> None:
    rows = pa.table(
        {"path": ["a.cpp", "b.cpp"], "text": pa.array(["int a;\n", None], pa.string()),
         "content_sha256": [text_sha256("int a;\n"), text_sha256("")]}
    )  # fmt: skip
    note = ShardScan.of([text_sha256("int a;\n"), text_sha256("")])
    problems, inspect, noted = _hashed_rows(rows, None, [(0, 2, note)])
    assert problems == ["b.cpp: its text is null"]
    assert inspect.tolist() == [False, False] and noted.tolist() == [True, False]
