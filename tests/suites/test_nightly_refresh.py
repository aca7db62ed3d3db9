"""The nightly refresh when a tracked branch really moves: each tick resolves the branch to
the commit it points at now and requests that commit once; the run collects the commit the
tick resolved (pinned on the run), even if the branch has moved again by the time it runs;
the versions the store keeps stay readable and a commit collected once is not requested
again."""

from __future__ import annotations

from pathlib import Path

import dagster as dg
import pyarrow.parquet as pq
import pytest

from assets.defs import build_defs
from assets.factory import PARTITION_RANGE_END, PARTITION_RANGE_START, REVISION_TAG
from megacpp_pipeline.pipeline.runner import checks_of
from megacpp_pipeline.stages import default_registry
from megacpp_pipeline.storage.store import ShardStore
from tests.fixtures.hostile.cases import _git

HEADER_V1 = "#pragma once\n// SPDX-License-Identifier: MIT\nint answer() { return 42; }\n"
HEADER_V2 = "#pragma once\n// SPDX-License-Identifier: MIT\nint answer() { return 43; }\n"
NEW_FILE = "#pragma once\n// SPDX-License-Identifier: MIT\nstruct Added { int v = 1; };\n"
LATER_FILE = "#pragma once\n// SPDX-License-Identifier: MIT\nstruct Later { int w = 2; };\n"


def commit(repo: Path, files: dict[str, str], message: str) -> str:
    for rel, text in files.items():
        (repo / rel).write_text(text)
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", message)
    return _git(repo, "rev-parse", "HEAD")


class Nightly:
    """One catalog tracking `main` of a local repository (plus `extra` lines of yaml), its
    Dagster definitions and a persistent instance: tick the schedule and the cascade, run
    what they requested as the daemon would."""

    def __init__(self, root: Path, extra: str = "") -> None:
        self.repo = root / "upstream"
        self.repo.mkdir()
        _git(self.repo, "init", "-q", "-b", "main")
        self.data = root / "data"
        self.cache = root / "cache"
        self.catalog = root / "sources.yaml"
        self.catalog.write_text(
            "snapshot: nightly\nseq_len: 256\n"
            "refresh:\n  cron: '30 3 * * *'\n"
            f"sources:\n  - id: upstream\n    kind: git\n    uri: {self.repo}\n    track: main\n"
            + extra
        )
        (root / "home").mkdir()
        self.instance = dg.DagsterInstance.local_temp(tempdir=str(root / "home"))
        self.reload()

    def reload(self) -> None:
        """The definitions from the catalog as it is now, as a reload of the code location
        builds them."""
        self.defs = build_defs(self.catalog, self.data, cache_dir=self.cache)
        self.schedule = self.defs.get_schedule_def("nightly_refresh")
        self.sensor = self.defs.get_sensor_def("nightly_cascade")
        self.job = self.defs.resolve_job_def("per_source_refresh")

    def tick(self) -> list[dg.RunRequest]:
        context = dg.build_schedule_context(
            instance=self.instance, repository_def=self.defs.get_repository_def()
        )
        return list(self.schedule.evaluate_tick(context).run_requests or [])

    def run(self, request: dg.RunRequest) -> None:
        result = self.job.execute_in_process(
            partition_key=request.partition_key, tags=request.tags, instance=self.instance
        )
        assert result.success

    def cascade_tick(self) -> tuple[str | None, list[dg.RunRequest]]:
        context = dg.build_sensor_context(
            instance=self.instance, repository_def=self.defs.get_repository_def()
        )
        result = self.sensor.evaluate_tick(context)
        return result.skip_message, list(result.run_requests or [])

    def launch(self, request: dg.RunRequest) -> dg.ExecuteInProcessResult:
        """The cascade's request run as the daemon runs it: its assets and checks, its tags
        (the run key among them)."""
        return dg.materialize(
            [*(self.defs.assets or []), *(self.defs.asset_checks or [])],  # type: ignore[list-item]
            selection=dg.AssetSelection.assets(*(request.asset_selection or []))
            | dg.AssetSelection.checks(*(request.asset_check_keys or [])),
            instance=self.instance,
            resources=self.defs.resources,
            tags=request.tags,
            raise_on_error=False,
        )

    def cascade(self) -> str:
        """Every group the cascade launches, run one after another until it launches none;
        its last skip message."""
        while True:
            skip, requests = self.cascade_tick()
            if not requests:
                return str(skip)
            (request,) = requests
            assert self.launch(request).success, request.asset_selection

    def promoted(self) -> Path:
        """The snapshot the latest snapshot version promoted."""
        return Path(ShardStore(str(self.data)).latest("snapshot").extra["snapshot_dir"])

    def collected(self) -> tuple[str, dict[str, str]]:
        """The latest raw_files version of the source: its revision and its files."""
        store = ShardStore(str(self.data))
        manifest = store.latest("raw_files", "upstream")
        table = store.read_table(manifest)
        files = dict(
            zip(
                table["path"].to_pylist(),
                [c.decode() for c in table["content"].to_pylist()],
                strict=True,
            )
        )
        return str(manifest.extra["revision"]), files


@pytest.fixture
def nightly(tmp_path: Path) -> Nightly:
    return Nightly(tmp_path)


def test_a_branch_that_moved_is_collected_at_its_new_commit_once(nightly: Nightly) -> None:
    first = commit(nightly.repo, {"answer.hpp": HEADER_V1}, "first")
    (request,) = nightly.tick()
    assert request.run_key.startswith(f"upstream:{first}:") and request.tags[REVISION_TAG] == first
    nightly.run(request)
    assert nightly.collected() == (first, {"answer.hpp": HEADER_V1})
    assert nightly.tick() == []  # nothing moved: nothing to do

    moved = commit(nightly.repo, {"answer.hpp": HEADER_V2, "added.hpp": NEW_FILE}, "moved")
    (request,) = nightly.tick()
    assert request.run_key.startswith(f"upstream:{moved}:") and request.tags[REVISION_TAG] == moved
    # the branch moves again before the requested run starts: the run still collects the
    # commit its tick resolved, and the next tick asks for the newer one
    later = commit(nightly.repo, {"later.hpp": LATER_FILE}, "later")
    nightly.run(request)
    assert nightly.collected() == (moved, {"answer.hpp": HEADER_V2, "added.hpp": NEW_FILE})
    (request,) = nightly.tick()
    assert request.run_key.startswith(f"upstream:{later}:")
    nightly.run(request)
    revision, files = nightly.collected()
    assert revision == later and set(files) == {"answer.hpp", "added.hpp", "later.hpp"}
    assert nightly.tick() == []

    # the versions the store keeps are the latest commits, in order, each complete and sound
    store = ShardStore(str(nightly.data))
    complete = sorted((nightly.data / "assets/raw_files/upstream").glob("*/_COMPLETE"))
    versions = [store.read_manifest(str(marker.parent)) for marker in complete]
    revisions = [m.extra["revision"] for m in versions]
    assert len(revisions) >= 2 and revisions == [first, moved, later][-len(revisions) :]
    assert all(store.verify(m) == [] for m in versions)


@pytest.mark.slow  # a whole run or more; make test-slow
def test_a_group_whose_blocking_check_failed_waits_for_a_new_input_before_it_runs_again(
    tmp_path: Path,
) -> None:
    """A takedown of the whole source leaves dedup nothing: its `some_file_is_left` check
    fails after deduped_files was written. The cascade does not launch that group again on
    the same inputs, tick after tick; a new commit collected is a new input."""
    nightly = Nightly(tmp_path, extra="removals:\n  - {source: upstream, reason: takedown}\n")
    commit(nightly.repo, {"answer.hpp": HEADER_V1}, "first")
    (refresh,) = nightly.tick()
    nightly.run(refresh)
    _, (request,) = nightly.cascade_tick()
    failed = nightly.launch(request)
    assert not failed.success
    assert [c.check_name for c in failed.get_asset_check_evaluations() if not c.passed] == [
        "some_file_is_left"
    ]
    for _ in range(2):
        skip, requests = nightly.cascade_tick()
        assert requests == [], "launched again on the inputs its last run failed on"
        assert f"run {failed.run_id}" in str(skip)

    commit(nightly.repo, {"added.hpp": NEW_FILE}, "moved")
    (refresh,) = nightly.tick()
    nightly.run(refresh)
    _, (again,) = nightly.cascade_tick()
    assert again.asset_selection == request.asset_selection and again.run_key != request.run_key


def test_the_cascade_does_not_read_a_refreshed_version_whose_blocking_check_failed(
    tmp_path: Path,
) -> None:
    """A byte of the refreshed scrubbed_files flips after its run; checked again, its
    `manifest_verifies_from_disk` fails. Dedup is behind it, but the cascade does not
    launch dedup on that version: it names the check."""
    nightly = Nightly(tmp_path)
    commit(nightly.repo, {"answer.hpp": HEADER_V1}, "first")
    (refresh,) = nightly.tick()
    nightly.run(refresh)
    store = ShardStore(str(nightly.data))
    manifest = store.latest("scrubbed_files", "upstream")
    shard = Path(store.version_dir(manifest)) / manifest.tables["data"].shards[0].path
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    checks = checks_of(default_registry().get("scrubbed_files"))
    checked = dg.materialize(
        [*(nightly.defs.assets or []), *(nightly.defs.asset_checks or [])],  # type: ignore[list-item]
        selection=dg.AssetSelection.checks(
            *(dg.AssetCheckKey(dg.AssetKey("scrubbed_files"), c.name) for c in checks)
        ),
        instance=nightly.instance,
        resources=nightly.defs.resources,
        tags={PARTITION_RANGE_START: "upstream", PARTITION_RANGE_END: "upstream"},
        raise_on_error=False,
    )
    assert "manifest_verifies_from_disk" in {
        c.check_name for c in checked.get_asset_check_evaluations() if not c.passed
    }
    skip, requests = nightly.cascade_tick()
    assert requests == [], "dedup launched on a version whose blocking check failed"
    assert f"scrubbed_files's check manifest_verifies_from_disk failed in run {checked.run_id}" in (
        str(skip)
    )


@pytest.mark.slow  # a whole run or more; make test-slow
def test_a_removal_added_to_the_catalog_reaches_the_next_snapshot_through_the_nightly_path(
    tmp_path: Path,
) -> None:
    """Nothing upstream moves; sources.yaml gains a removal. The schedule refreshes the
    source again (the head's code version moved) and the cascade carries it down to a new
    snapshot without the file."""
    nightly = Nightly(tmp_path)
    revision = commit(nightly.repo, {"answer.hpp": HEADER_V1, "added.hpp": NEW_FILE}, "first")
    (refresh,) = nightly.tick()
    nightly.run(refresh)
    assert "up to date" in nightly.cascade()
    first = nightly.promoted()
    ledger = pq.read_table(first / "ledger.parquet").to_pylist()
    assert {r["path"]: r["status"] for r in ledger} == {"answer.hpp": "kept", "added.hpp": "kept"}

    with nightly.catalog.open("a") as f:
        f.write("removals:\n  - {source: upstream, path: added.hpp, reason: takedown}\n")
    nightly.reload()
    (refresh,) = nightly.tick()
    assert refresh.tags[REVISION_TAG] == revision
    nightly.run(refresh)
    assert "up to date" in nightly.cascade()
    second = nightly.promoted()
    assert second != first
    ledger = pq.read_table(second / "ledger.parquet").to_pylist()
    removed = [(r["path"], r["status"], r["reason"]) for r in ledger if r["path"] == "added.hpp"]
    assert removed == [("added.hpp", "dropped", "removed_on_request")]
    assert nightly.tick() == [] and "up to date" in nightly.cascade()
