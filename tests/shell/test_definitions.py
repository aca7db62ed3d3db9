"""The Dagster shell is generated from the stage registry: every stage is an asset with its
blocking checks, every stage it reads as deps, its grain as partitions, a code version that moves
with its code and config; definitions are built by a function and nothing is read at import.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
import yaml

from assets.defs import build_defs
from assets.runner import run_plan
from megacpp_pipeline.pipeline.runner import checks_of
from megacpp_pipeline.stages import default_registry

REPO = Path(__file__).resolve().parents[2]
DEMO = REPO / "examples" / "demo" / "sources.yaml"


@pytest.fixture(scope="module")
def graph() -> Any:
    return build_defs(DEMO, "/nonexistent-data-dir").resolve_asset_graph()


def test_every_registry_stage_is_an_asset_with_its_checks_deps_and_grain(graph: Any) -> None:
    registry = default_registry()
    assert [k.to_user_string() for k in graph.toposorted_asset_keys] == registry.names()
    for stage in registry:
        node = graph.get(dg.AssetKey(stage.name))
        checks = {c.name for c in graph.asset_check_keys if c.asset_key == node.key}
        blocking = {c.name for c in graph.asset_check_keys if c.asset_key == node.key}
        blocking = {
            c for c in blocking if graph.get_check_spec(dg.AssetCheckKey(node.key, c)).blocking
        }
        assert checks == blocking == {c.name for c in checks_of(stage)}, stage.name
        assert blocking, f"{stage.name} has no blocking check"
        assert node.description == stage.description and node.group_name == stage.group
        parents = {p.to_user_string() for p in node.parent_keys}
        assert parents == set(registry.reads_of(stage)), stage.name
        assert (node.partitions_def is not None) == stage.per_source, stage.name
        if stage.per_source:
            assert node.backfill_policy == dg.BackfillPolicy.single_run(), stage.name
    snapshot = {
        c.name for c in graph.asset_check_keys if c.asset_key.to_user_string() == "snapshot"
    }
    assert len(snapshot) == 11  # ten from verify (the text release too), no removed content


def test_a_per_file_gate_gets_the_two_standard_checks(graph: Any) -> None:
    gates = ["normalized_files", "classified_files", "quality_files", "licensed_files"]
    gates += ["removed_files", "scrubbed_files", "enriched_files"]
    for name in [*gates, "tokenized_docs"]:
        checks = {c.name for c in graph.asset_check_keys if c.asset_key.to_user_string() == name}
        assert {"manifest_verifies_from_disk", "every_input_file_kept_or_in_ledger"} <= checks, name


def test_the_run_plan_is_five_runs_whatever_the_number_of_sources(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "a.hpp").write_text("#pragma once\nint a();\n")
    many = tmp_path / "many.yaml"
    many.write_text(
        "snapshot: many\nsources:\n"
        + "".join(f"  - {{id: s{i:03d}, kind: dir, uri: {tree}}}\n" for i in range(300))
    )
    plans = [run_plan(build_defs(c, tmp_path / "data")) for c in (DEMO, many)]
    assert plans[0] == plans[1]
    assert [g.keys for g in plans[0]] == [
        ("source_catalog",),
        (
            "raw_files",
            "normalized_files",
            "classified_files",
            "quality_files",
            "licensed_files",
            "removed_files",
            "scrubbed_files",
        ),
        ("deduped_files", "decontaminated_files", "tokenizer"),
        ("enriched_files", "tokenized_docs"),
        ("documents", "packed_rows", "snapshot", "megatron_dataset", "quality_report"),
    ]
    assert [g.per_source for g in plans[0]] == [False, True, False, True, False]
    # the library's groups (what `megacpp plan` sizes) are the runs Dagster's graph gives
    assert [set(g.keys) for g in plans[0]] == [set(g) for g in default_registry().run_groups()]


def test_code_version_moves_with_the_stage_config_and_only_that_stage(tmp_path: Path) -> None:
    changed = tmp_path / "sources.yaml"
    data = yaml.safe_load(DEMO.read_text())
    data.setdefault("stages", {})["scrub"] = {"sample_lines": 5}
    changed.write_text(yaml.safe_dump(data))
    before = build_defs(DEMO, tmp_path / "d").resolve_asset_graph()
    after = build_defs(changed, tmp_path / "d").resolve_asset_graph()
    moved = [
        k.to_user_string()
        for k in before.toposorted_asset_keys
        if before.get(k).code_version != after.get(k).code_version
    ]
    assert moved == ["source_catalog", "scrubbed_files"]  # the catalog itself, and scrub


def test_importing_definitions_reads_nothing_and_loading_names_the_bad_field(
    tmp_path: Path,
) -> None:
    bad = tmp_path / "sources.yaml"
    bad.write_text("snapshot: x\nsources:\n  - id: a\n    kind: dir\n    uri: .\n    rol: x\n")
    env = {**os.environ, "MEGACPP_CONFIG": str(bad)}
    imported = subprocess.run(
        [sys.executable, "-c", "import definitions"],
        cwd=REPO, env=env, capture_output=True, text=True,
    )  # fmt: skip
    assert imported.returncode == 0, imported.stderr[-2000:]
    loaded = subprocess.run(
        [sys.executable, "-c", "import definitions; definitions.defs()"],
        cwd=REPO, env=env, capture_output=True, text=True,
    )  # fmt: skip
    assert loaded.returncode != 0
    assert "source 'a': field rol: unknown key" in loaded.stderr


def test_dagster_definitions_validate_passes_on_the_workspace(tmp_path: Path) -> None:
    shutil.copyfile(REPO / "dagster.yaml", tmp_path / "dagster.yaml")
    dagster = Path(sys.executable).parent / "dagster"
    out = subprocess.run(
        [str(dagster), "definitions", "validate", "-w", "workspace.yaml"],
        cwd=REPO,
        env={**os.environ, "MEGACPP_CONFIG": str(DEMO), "DAGSTER_HOME": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, (out.stdout + out.stderr)[-3000:]


@pytest.mark.slow  # a whole run or more; make test-slow
def test_a_run_launched_outside_megacpp_run_forks_its_steps_from_a_preloaded_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # What the UI and the schedule launch: the job's own multiprocess executor. Its steps
    # must fork from a forkserver that imported dagster and the library once, not spawn a
    # fresh interpreter each (~2.2 CPU seconds of imports per step, ~70 steps a run).
    import time

    shutil.copyfile(REPO / "dagster.yaml", tmp_path / "dagster.yaml")
    dagster = Path(sys.executable).parent / "dagster"
    env = {
        **os.environ,
        "MEGACPP_CONFIG": str(DEMO),
        "MEGACPP_DATA_DIR": str(tmp_path / "data"),
        "MEGACPP_CACHE_DIR": str(tmp_path / "cache"),
        "DAGSTER_HOME": str(tmp_path),
    }
    cmd = [str(dagster), "asset", "materialize", "-f", "definitions.py", "--select"]
    proc = subprocess.Popen(
        [*cmd, "source_catalog"], cwd=REPO, env=env, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    seen: set[str] = set()
    while proc.poll() is None:
        for pid in _descendants(proc.pid):
            try:
                seen.add(Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode())
            except OSError:
                pass
        time.sleep(0.05)
    out = proc.stdout.read() if proc.stdout else ""
    assert proc.returncode == 0, out[-3000:]
    # the asset and its two checks, from the run's event log (the console's lines come from
    # several processes at once, and a loaded machine has been seen to lose one)
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path))  # where its event log storage looks
    with dg.DagsterInstance.from_config(str(tmp_path)) as instance:
        (run,) = instance.get_runs()
        done = instance.get_records_for_run(
            run.run_id, of_type=dg.DagsterEventType.STEP_SUCCESS
        ).records
    assert len(done) == 3, out[-3000:]
    assert any("multiprocessing.forkserver" in c for c in seen), seen
    assert not any("spawn_main" in c for c in seen), seen


def _descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            children.setdefault(int(stat[stat.rfind(")") + 2 :].split()[1]), []).append(int(entry))
    out, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def test_a_ui_run_runs_no_more_steps_at_once_than_the_cpus_on_the_local_engine() -> None:
    """The job's executor: as many steps at once as workers were asked, but on the local
    engine never more than this process's CPUs (its pools are capped too); on Ray, as asked."""
    from assets.defs import concurrent_steps
    from megacpp_pipeline.pipeline.parallel import cpu_count

    cpus = cpu_count()
    assert concurrent_steps(cpus + 14, None, None, {}) == cpus
    assert concurrent_steps(None, None, None, {"MEGACPP_WORKERS": str(cpus + 14)}) == cpus
    assert concurrent_steps(1, "local", None, {}) == 1
    assert concurrent_steps(cpus + 14, "ray", None, {}) == cpus + 14
    assert concurrent_steps(None, None, None, {"MEGACPP_ENGINE": "ray"}) == cpus
    assert concurrent_steps(cpus + 14, "no-such-engine", None, {}) == cpus
