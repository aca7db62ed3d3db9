"""The nightly refresh: a tracked branch resolves to its commit, each new source:revision
gets one run request, a processed revision is not requested again, and all of it is off
until a person switches it on."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import dagster as dg

from assets.defs import build_defs
from megacpp_pipeline.pipeline.runner import checks_of
from megacpp_pipeline.stages import default_registry
from tests.fixtures.git_repo import git as _git


def _refresh_run(
    instance: dg.DagsterInstance, run_id: str, tags: dict[str, str], status: dg.DagsterRunStatus
) -> None:
    """A per-source refresh run the instance has seen, as the daemon would have launched it."""
    instance.add_run(
        dg.DagsterRun(job_name="per_source_refresh", run_id=run_id, tags=tags, status=status)
    )


def _nightly(catalog: Path, tmp_path: Path) -> tuple[Any, Any, dg.DagsterInstance, Any]:
    """The definitions over `catalog`, their nightly schedule, a temporary instance, the
    repository a tick is evaluated against."""
    defs = build_defs(catalog, tmp_path / "data", cache_dir=tmp_path / "c")
    (tmp_path / "home").mkdir()
    instance = dg.DagsterInstance.local_temp(tempdir=str(tmp_path / "home"))
    return defs, defs.get_schedule_def("nightly_refresh"), instance, defs.get_repository_def()


def test_nightly_refresh_requests_one_run_per_new_source_revision(tmp_path: Path) -> None:
    repo = tmp_path / "upstream"
    repo.mkdir()
    _git(repo, "init", "-q", "-b", "main")
    (repo / "a.hpp").write_text("#pragma once\nint answer() { return 42; }\n")
    _git(repo, "add", ".")
    _git(repo, "commit", "-q", "-m", "one")
    head = _git(repo, "rev-parse", "HEAD")
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "b.hpp").write_text("#pragma once\nint other() { return 7; }\n")
    catalog = tmp_path / "sources.yaml"
    catalog.write_text(
        "snapshot: nightly\n"
        "refresh:\n  cron: '30 3 * * *'\n"
        "sources:\n"
        f"  - id: upstream\n    kind: git\n    uri: {repo}\n    track: main\n"
        f"  - id: tree\n    kind: dir\n    uri: {tree}\n"
    )
    defs, sched, instance, repo = _nightly(catalog, tmp_path)
    ticks = sched.evaluate_tick(dg.build_schedule_context(instance=instance, repository_def=repo))
    first = [
        (r.partition_key, r.run_key, r.tags.get("megacpp/revision")) for r in ticks.run_requests
    ]
    # the key: the source, its revision and the code versions of the stages the run computes
    assert first[0][::2] == ("upstream", head)
    assert str(first[0][1]).startswith(f"upstream:{head}:")
    assert first[1][0] == "tree" and str(first[1][1]).startswith("tree:")
    # the first source's run succeeded: it is not requested again
    _refresh_run(instance, "r1", {"dagster/run_key": str(first[0][1])}, dg.DagsterRunStatus.SUCCESS)
    again = sched.evaluate_tick(dg.build_schedule_context(instance=instance, repository_def=repo))
    assert [r.run_key for r in again.run_requests] == [first[1][1]]
    # the second source's run is running (a one-minute cron ticks faster than a refresh):
    # it is not requested again either
    _refresh_run(instance, "r2", {"dagster/run_key": str(first[1][1])}, dg.DagsterRunStatus.STARTED)
    third = sched.evaluate_tick(dg.build_schedule_context(instance=instance, repository_def=repo))
    assert list(third.run_requests or []) == []
    assert (sched.cron_schedule, sched.execution_timezone) == ("30 3 * * *", "UTC")
    sensor = defs.get_sensor_def("nightly_cascade")
    assert "STOPPED" in str(sched.default_status) and "STOPPED" in str(sensor.default_status)
    job = defs.resolve_job_def("per_source_refresh")
    assert sched.job_name == job.name
    selected = {k.to_user_string() for k in job.asset_layer.selected_asset_keys}
    assert selected == set(default_registry().refresh_head())


def test_a_directorys_revision_moves_when_only_its_reuse_metadata_changes(tmp_path: Path) -> None:
    """REUSE.toml is outside the include globs but collection keeps it (the licence gate
    reads it): a tree whose licensing alone changed is refreshed. It moved only when the
    file came or went, as an excluded file's ledger row does."""
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "b.hpp").write_text("#pragma once\nint other() { return 7; }\n")
    catalog = tmp_path / "sources.yaml"
    catalog.write_text(
        f"snapshot: nightly\nsources:\n  - id: tree\n    kind: dir\n    uri: {tree}\n"
    )
    _, sched, instance, repo = _nightly(catalog, tmp_path)

    def key() -> str:
        tick = sched.evaluate_tick(
            dg.build_schedule_context(instance=instance, repository_def=repo)
        )
        return str([r.run_key for r in tick.run_requests or []])

    reuse = 'version = 1\n[[annotations]]\npath = "**"\nSPDX-License-Identifier = "{}"\n'
    (tree / "REUSE.toml").write_text(reuse.format("MIT"))
    (tree / "notes.txt").write_text("not collected: outside the globs, not metadata\n")
    before = key()
    (tree / "REUSE.toml").write_text(reuse.format("Apache-2.0"))
    after = key()
    assert after != before
    # a file the globs leave out counts by its ledger row (its name), not its content
    (tree / "notes.txt").write_text("edited, still not collected\n")
    assert key() == after


class Cascade:
    """The nightly cascade over two directory sources, on a temporary instance whose
    materializations and runs the test reports itself (one event per partition, as a run
    writes them)."""

    def __init__(self, tmp_path: Path) -> None:
        tree = tmp_path / "tree"
        tree.mkdir()
        (tree / "a.hpp").write_text("#pragma once\nint a();\n")
        self.root = tmp_path
        self.catalog = tmp_path / "sources.yaml"
        self.catalog.write_text(
            f"snapshot: c\nsources:\n  - {{id: s1, kind: dir, uri: {tree}}}\n"
            f"  - {{id: s2, kind: dir, uri: {tree}}}\n"
        )
        self.edit("")
        (tmp_path / "home").mkdir()
        self.instance = dg.DagsterInstance.local_temp(tempdir=str(tmp_path / "home"))
        self.registry = default_registry()

    def edit(self, lines: str) -> None:
        """`lines` added to sources.yaml, and the definitions built again from it (as a
        reload of the code location builds them)."""
        self.catalog.write_text(self.catalog.read_text() + lines)
        self.defs = build_defs(self.catalog, self.root / "data", cache_dir=self.root / "c")
        self.sensor = self.defs.get_sensor_def("nightly_cascade")

    def tick(self) -> tuple[str | None, list[dg.RunRequest]]:
        context = dg.build_sensor_context(
            instance=self.instance, repository_def=self.defs.get_repository_def()
        )
        result = self.sensor.evaluate_tick(context)
        return result.skip_message, list(result.run_requests or [])

    def materialize(self, *names: str, code_version: str | None = None) -> None:
        """Each stage as a run writes it: every partition, tagged with its asset's code
        version (or `code_version`)."""
        for name in names:
            partitions = ["s1", "s2"] if self.registry.get(name).per_source else [None]
            key = dg.AssetKey(name)
            code = code_version or self.defs.resolve_assets_def(key).code_versions_by_key[key]
            for p in partitions:
                self.instance.report_runless_asset_event(
                    dg.AssetMaterialization(
                        asset_key=name, partition=p, tags={"dagster/code_version": str(code)}
                    )
                )

    def ran(self, run_id: str, request: dg.RunRequest, status: dg.DagsterRunStatus) -> None:
        """A run the daemon launched for `request` (it carries the request's run key)."""
        self.instance.add_run(
            dg.DagsterRun(job_name="__ASSET_JOB", run_id=run_id, tags=request.tags, status=status)
        )


def selected(request: dg.RunRequest) -> list[str]:
    return [k.to_user_string() for k in request.asset_selection or []]


def test_the_cascade_launches_one_stale_run_group_at_a_time_and_waits_for_runs(
    tmp_path: Path,
) -> None:
    cascade = Cascade(tmp_path)
    tick, materialize, registry = cascade.tick, cascade.materialize, cascade.registry

    skip, requests = tick()
    assert requests == [] and "no input yet" in str(skip)  # nothing was ever collected
    materialize(*registry.names())  # a whole run, stage after stage
    skip, requests = tick()
    assert requests == [] and "up to date" in str(skip)

    materialize("raw_files", "scrubbed_files")  # a refresh of the head
    _, (request,) = tick()
    assert selected(request) == ["deduped_files", "decontaminated_files", "tokenizer"]
    assert request.asset_check_keys  # each stage's blocking checks run with it
    cascade.instance.add_run(
        dg.DagsterRun(job_name="__ASSET_JOB", run_id="r1", status=dg.DagsterRunStatus.STARTED)
    )
    skip, requests = tick()
    assert requests == [] and "in progress" in str(skip)
    cascade.instance.delete_run("r1")  # it ended

    materialize("deduped_files", "decontaminated_files", "tokenizer")
    _, (request,) = tick()
    assert selected(request) == ["enriched_files", "tokenized_docs"]
    ranged = ("dagster/asset_partition_range_start", "dagster/asset_partition_range_end")
    assert tuple(request.tags[k] for k in ranged) == ("s1", "s2")  # every source in one run
    materialize("enriched_files", "tokenized_docs")
    _, (request,) = tick()
    assert selected(request)[0] == "documents"
    materialize(*registry.run_groups()[-1])
    assert tick()[1] == []


def test_a_group_whose_run_failed_is_not_launched_again_until_a_stage_it_reads_changes(
    tmp_path: Path,
) -> None:
    cascade = Cascade(tmp_path)
    cascade.materialize(*cascade.registry.names())
    cascade.materialize("scrubbed_files")  # a refresh
    _, (request,) = cascade.tick()
    assert selected(request) == ["deduped_files", "decontaminated_files", "tokenizer"]
    # its run wrote deduped_files, whose blocking check then failed: the rest was skipped
    cascade.materialize("deduped_files")
    cascade.ran("r1", request, dg.DagsterRunStatus.FAILURE)
    for _ in range(2):  # every tick after, not only the next
        skip, requests = cascade.tick()
        assert requests == [], "a failed group is launched again on the same inputs"
        assert "run r1" in str(skip) and "FAILURE" in str(skip)
        assert "deduped_files, decontaminated_files, tokenizer" in str(skip)

    cascade.materialize("scrubbed_files")  # the next refresh: something it reads changed
    _, (again,) = cascade.tick()
    assert selected(again) == selected(request) and again.run_key != request.run_key


def test_a_group_is_not_launched_on_a_version_whose_blocking_check_failed(
    tmp_path: Path,
) -> None:
    cascade = Cascade(tmp_path)
    cascade.materialize(*cascade.registry.names())
    cascade.materialize("scrubbed_files")  # a refresh, then its group's run
    cascade.materialize("deduped_files", "decontaminated_files", "tokenizer")
    check = checks_of(cascade.registry.get("tokenizer"))[0].name
    cascade.instance.report_runless_asset_event(
        dg.AssetCheckEvaluation(
            asset_key=dg.AssetKey("tokenizer"),
            check_name=check,
            passed=False,
            description="vocabulary of 3 ids",
        )
    )
    skip, requests = cascade.tick()
    assert requests == [], "enrich/tokenize launched on a tokenizer whose check failed"
    assert f"tokenizer's check {check} failed" in str(skip)
    assert "vocabulary of 3 ids" in str(skip) and "enriched_files, tokenized_docs" in str(skip)

    cascade.instance.report_runless_asset_event(  # checked again, it passes
        dg.AssetCheckEvaluation(asset_key=dg.AssetKey("tokenizer"), check_name=check, passed=True)
    )
    _, (request,) = cascade.tick()
    assert selected(request) == ["enriched_files", "tokenized_docs"]


def test_the_cascade_launches_a_group_whose_config_changed_though_nothing_it_reads_did(
    tmp_path: Path,
) -> None:
    cascade = Cascade(tmp_path)
    cascade.materialize(*cascade.registry.names())
    assert "up to date" in str(cascade.tick()[0])
    cascade.edit("stages:\n  dedup: {threshold: 0.9}\n")  # deduped_files' code version moves
    _, (request,) = cascade.tick()  # the catalog's asset first: it records sources.yaml
    assert selected(request) == ["source_catalog"] and request.asset_check_keys
    cascade.materialize("source_catalog")
    _, (request,) = cascade.tick()
    assert selected(request) == ["deduped_files", "decontaminated_files", "tokenizer"]
    cascade.materialize("deduped_files", "decontaminated_files", "tokenizer")
    _, (request,) = cascade.tick()  # and on down the line, as after a refresh
    assert selected(request) == ["enriched_files", "tokenized_docs"]


def test_a_catalog_edit_refreshes_the_catalogs_asset_once_it_was_ever_materialized(
    tmp_path: Path,
) -> None:
    """The UI showed source_catalog stale after every edit of sources.yaml: no nightly run
    materialized it."""
    cascade = Cascade(tmp_path)
    cascade.materialize(*cascade.registry.names())
    cascade.edit("  - {id: s3, kind: dir, uri: " + str(tmp_path / "tree") + "}\n")
    _, (request,) = cascade.tick()
    assert selected(request) == ["source_catalog"]
    cascade.materialize("source_catalog")
    skip, requests = cascade.tick()
    assert "source_catalog" not in " ".join(k for r in requests for k in selected(r))
    (tmp_path / "fresh").mkdir()
    fresh = Cascade(tmp_path / "fresh")  # never materialized: the first run makes it
    skip, requests = fresh.tick()
    assert requests == [] and "no input yet" in str(skip)


def test_an_edit_of_the_catalog_the_refresh_stages_read_is_a_new_refresh_of_the_same_revision(
    tmp_path: Path,
) -> None:
    """A removal added to sources.yaml changes removed_files' code version: the schedule
    asks for the source again at the revision it already collected, once."""
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "a.hpp").write_text("#pragma once\nint a();\n")
    catalog = tmp_path / "sources.yaml"
    catalog.write_text(f"snapshot: n\nsources:\n  - {{id: tree, kind: dir, uri: {tree}}}\n")
    _, sched, instance, repo = _nightly(catalog, tmp_path)

    def tick() -> list[dg.RunRequest]:
        context = dg.build_schedule_context(instance=instance, repository_def=repo)
        return list(sched.evaluate_tick(context).run_requests or [])

    (first,) = tick()
    _refresh_run(instance, "r1", first.tags, dg.DagsterRunStatus.SUCCESS)
    assert tick() == []
    catalog.write_text(
        catalog.read_text() + "removals:\n  - {source: tree, path: a.hpp, reason: takedown}\n"
    )
    defs = build_defs(catalog, tmp_path / "data", cache_dir=tmp_path / "c")  # reloaded
    sched, repo = defs.get_schedule_def("nightly_refresh"), defs.get_repository_def()
    (again,) = tick()
    assert again.tags["megacpp/revision"] == first.tags["megacpp/revision"]
    assert again.run_key != first.run_key


def test_a_source_that_cannot_be_reached_is_named_and_the_others_are_still_refreshed(
    tmp_path: Path,
) -> None:
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "b.hpp").write_text("#pragma once\nint other() { return 7; }\n")
    catalog = tmp_path / "sources.yaml"
    catalog.write_text(
        "snapshot: nightly\nsources:\n"
        f"  - id: gone\n    kind: git\n    uri: {tmp_path / 'no-such-repo'}\n    track: main\n"
        f"  - id: tree\n    kind: dir\n    uri: {tree}\n"
    )
    _, sched, instance, repo = _nightly(catalog, tmp_path)
    tick = sched.evaluate_tick(dg.build_schedule_context(instance=instance, repository_def=repo))
    (request,) = tick.run_requests or []
    assert request.partition_key == "tree"
    left_out = request.tags["megacpp/unreachable_sources"]
    assert left_out.startswith("gone (CollectError: ") and "no-such-repo" in left_out
    assert "\n" not in left_out  # git's message on one line

    _refresh_run(instance, "r1", request.tags, dg.DagsterRunStatus.SUCCESS)
    tick = sched.evaluate_tick(dg.build_schedule_context(instance=instance, repository_def=repo))
    assert not tick.run_requests
    assert "unreachable: gone (CollectError: " in str(tick.skip_message)
