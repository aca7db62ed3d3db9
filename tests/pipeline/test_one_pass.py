"""Several per-file gates in one pass over the files (pipeline/file_stage.py): when the same
process runs the next gates of the chain later in the run, the first gate's tasks run them
too and write each one's version ahead; each stage's own step commits that version only
after the checks of the stage before it, and only while it still stands. The versions, and
so the snapshot, are the ones the gates give one step at a time."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pyarrow as pa
import pytest

from megacpp_pipeline.pipeline.context import StageContext
from megacpp_pipeline.pipeline.runner import checks_of, run_all, run_stage
from megacpp_pipeline.storage.store import NoVersionError
from tests.fixtures.pipeline_corpus import write_catalog
from tests.fixtures.stage_runs import context, run_through

HEAD = "normalized_files"
AHEAD = ("classified_files", "quality_files", "licensed_files", "removed_files", "scrubbed_files")


@pytest.fixture(scope="module")
def catalog(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path, _ = write_catalog(tmp_path_factory.mktemp("one_pass"))
    return path


def _logged(ctx: StageContext) -> tuple[StageContext, list[str]]:
    lines: list[str] = []
    return replace(ctx, log=lines.append), lines


def _rows(ctx: StageContext, stage: str, partition: str | None) -> dict[str, pa.Table | None]:
    m = ctx.store.latest(stage, partition)
    out: dict[str, pa.Table | None] = {}
    for name, info in m.tables.items():
        out[name] = ctx.store.read_table(m, name) if info.shards else None
    return out


def _versions(ctx: StageContext, stage: str, source: str) -> list[Path]:
    """The version folders of a partition in the (local) store, committed or not."""
    folder = Path(ctx.store.partition_dir(stage, source))
    return sorted(p for p in folder.iterdir() if p.is_dir())


def _materialize(ctx: StageContext, name: str) -> None:
    stage = ctx.registry.get(name)
    for _ in run_stage(ctx, stage, ctx.partitions(stage)):
        pass
    for check in checks_of(stage):
        for partition in ctx.partitions(stage):
            assert check.evaluate(ctx, stage, partition).passed, (name, check.name)


def test_one_pass_gives_every_gate_the_version_and_the_snapshot_it_gives_alone(
    tmp_path: Path, catalog: Path
) -> None:
    one_pass, lines = _logged(context(tmp_path / "pass", catalog, "pass", workers=2))
    run_all(one_pass)  # every stage ahead, each one's checks between
    alone = run_through(context(tmp_path / "alone", catalog, "alone", workers=2), "snapshot")
    for name in AHEAD:
        for source in one_pass.sources():
            assert f"{name} [{source}]: {HEAD}'s pass wrote this version" in lines
    for stage in list(one_pass.registry)[: one_pass.registry.names().index("snapshot")]:
        for partition in one_pass.partitions(stage):
            a = one_pass.store.latest(stage.name, partition)
            b = alone.store.latest(stage.name, partition)
            assert a.stats == b.stats, stage.name
            got, want = _rows(one_pass, stage.name, partition), _rows(alone, stage.name, partition)
            assert got.keys() == want.keys(), stage.name
            for table, rows in got.items():
                other = want[table]
                assert (rows is None and other is None) or (
                    rows is not None and other is not None and rows.equals(other)
                ), (stage.name, partition, table)
    snapshot = one_pass.store.latest("snapshot").extra["snapshot_id"]
    assert snapshot == alone.store.latest("snapshot").extra["snapshot_id"]


def test_a_version_written_ahead_is_committed_only_by_its_own_step(
    tmp_path: Path, catalog: Path
) -> None:
    ctx = context(tmp_path, catalog, "run")
    ctx = run_through(ctx, "raw_files")
    ctx, lines = _logged(replace(ctx, ahead=frozenset(AHEAD)))
    _materialize(ctx, HEAD)
    for name in AHEAD:  # written, not committed: a failed check of the head stops here
        for source in ctx.sources():
            with pytest.raises(NoVersionError):
                ctx.store.latest(name, source)
            (written,) = _versions(ctx, name, source)
            assert not (written / "_COMPLETE").exists() and list(written.glob("part-*.parquet"))
    _materialize(ctx, AHEAD[0])
    for source in ctx.sources():
        assert f"{AHEAD[0]} [{source}]: {HEAD}'s pass wrote this version" in lines
        head = ctx.store.latest(HEAD, source)
        m = ctx.store.latest(AHEAD[0], source)
        assert m.upstream[f"{HEAD}/{source}"] == ctx.store.manifest_sha256(head)
        assert m.run_id == "run"


def test_a_version_written_ahead_of_an_input_that_moved_on_is_dropped_and_run_again(
    tmp_path: Path,
) -> None:
    catalog, _ = write_catalog(tmp_path / "corpus")  # its own: one file changes below
    ctx = run_through(context(tmp_path, catalog, "run"), "raw_files")
    ctx, lines = _logged(replace(ctx, ahead=frozenset(AHEAD)))
    _materialize(ctx, HEAD)
    # a newer input for the directory source, by itself; the git source's input stands
    changed = tmp_path / "corpus" / "corpus_dir" / "src" / "lib1.cc"
    changed.write_text(changed.read_text() + "\nint refreshed_once() { return 1; }\n")
    alone = replace(ctx, ahead=frozenset())
    _materialize(alone, "raw_files")
    _materialize(alone, HEAD)
    _materialize(alone, AHEAD[0])
    assert (
        f"{AHEAD[0]} [tree]: the version written ahead is dropped: its input has a newer version"
    ) in lines
    assert f"{AHEAD[0]} [tree]: {HEAD}'s pass wrote this version" not in lines
    assert f"{AHEAD[0]} [repo]: {HEAD}'s pass wrote this version" in lines
    for source in ctx.sources():
        head = ctx.store.latest(HEAD, source)
        m = ctx.store.latest(AHEAD[0], source)
        assert m.upstream[f"{HEAD}/{source}"] == ctx.store.manifest_sha256(head)
        # a dropped version's folder is gone; the committed one is the only version
        assert [v.name for v in _versions(ctx, AHEAD[0], source)] == [m.version]


def test_another_run_never_commits_a_version_this_run_wrote_ahead(
    tmp_path: Path, catalog: Path
) -> None:
    ctx = run_through(context(tmp_path, catalog, "first"), "raw_files")
    _materialize(replace(ctx, ahead=frozenset(AHEAD)), HEAD)
    later, lines = _logged(replace(ctx, run_id="second"))
    _materialize(later, AHEAD[0])
    for source in ctx.sources():
        assert (
            f"{AHEAD[0]} [{source}]: the version written ahead is dropped: another run wrote it"
        ) in lines
        assert ctx.store.latest(AHEAD[0], source).run_id == "second"


def test_a_pass_stops_before_a_stage_the_run_does_not_run(tmp_path: Path, catalog: Path) -> None:
    ctx = run_through(context(tmp_path, catalog, "run"), "raw_files")
    classified, quality, licensed = AHEAD[:3]
    ctx, lines = _logged(replace(ctx, ahead=frozenset({classified, licensed})))
    for name in (HEAD, classified, quality, licensed):
        _materialize(ctx, name)
    for source in ctx.sources():
        assert f"{classified} [{source}]: {HEAD}'s pass wrote this version" in lines
        # quality is not ahead: its own step runs its gate, and its pass writes licensed
        assert not any(line.startswith(f"{quality} [{source}]: {HEAD}") for line in lines)
        assert f"{licensed} [{source}]: {quality}'s pass wrote this version" in lines


@pytest.mark.parametrize("change", ["request withdrawn", "vendored paths added"])
def test_a_version_written_ahead_by_a_gate_whose_salt_moved_is_dropped_and_run_again(
    tmp_path: Path, change: str
) -> None:
    """What a gate reads besides its input (a request file's entries, the source's entry in
    sources.yaml) is in its salt only: a step that loads them changed since the pass runs
    the gate again instead of committing what the pass wrote with the old ones."""
    catalog, _ = write_catalog(tmp_path / "corpus")
    requests = tmp_path / "corpus" / "requests.jsonl"
    requests.write_text('{"source": "tree", "path": "src/lib1.cc", "reason": "takedown"}\n')
    catalog.write_text(catalog.read_text() + "removals:\n  - file: requests.jsonl\n")
    ctx = run_through(context(tmp_path, catalog, "run"), "raw_files")
    _materialize(replace(ctx, ahead=frozenset(AHEAD)), HEAD)
    if change == "request withdrawn":
        name, source = "removed_files", "tree"
        requests.write_text('{"source": "tree", "path": "no/such/file.cc"}\n')
    else:
        name, source = "classified_files", "repo"
        text = catalog.read_text()
        assert "  - id: repo\n" in text
        catalog.write_text(
            text.replace("  - id: repo\n", "  - id: repo\n    vendored_paths: [include/]\n")
        )
    # each step loads the catalog again, as a Dagster step does
    step, lines = _logged(replace(context(tmp_path, catalog, "run"), ahead=frozenset(AHEAD)))
    for stage in AHEAD[: AHEAD.index(name) + 1]:
        _materialize(step, stage)
    assert (
        f"{name} [{source}]: the version written ahead is dropped: what its gate reads besides "
        "its input changed (the source's entry, a request)"
    ) in lines
    alone = run_through(context(tmp_path / "alone", catalog, "alone"), name)
    got = step.store.read_table(step.store.latest(name, source), "data")
    want = alone.store.read_table(alone.store.latest(name, source), "data")
    assert got.equals(want)
    if change == "request withdrawn":
        assert "src/lib1.cc" in got["path"].to_pylist()
