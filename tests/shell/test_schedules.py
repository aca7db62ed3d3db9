"""The nightly refresh: a tracked branch resolves to its commit, each new source:revision
gets one run request, a processed revision is not requested again, and all of it is off
until a person switches it on."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

_PROBE = """
import json, sys
import dagster as dg
import definitions
from assets import schedules
sched = definitions.defs.get_schedule_def("nightly_refresh")
instance = dg.DagsterInstance.local_temp()
repo = definitions.defs.get_repository_def()
ctx = dg.build_schedule_context(instance=instance, repository_def=repo)
first = [(r.partition_key, r.run_key, r.tags.get("megacpp/revision"))
         for r in sched.evaluate_tick(ctx).run_requests]
# pretend the first source's run succeeded: it must not be requested again
key = first[0][1]
instance.add_run(dg.DagsterRun(job_name="per_source_refresh", run_id="r1",
                               tags={"dagster/run_key": key},
                               status=dg.DagsterRunStatus.SUCCESS))
ctx2 = dg.build_schedule_context(instance=instance, repository_def=repo)
second = [r.run_key for r in sched.evaluate_tick(ctx2).run_requests]
sensor = definitions.defs.get_sensor_def("nightly_cascade")
print(json.dumps({
    "first": first, "second": second,
    "cron": sched.cron_schedule, "tz": sched.execution_timezone,
    "schedule_default": str(sched.default_status), "sensor_default": str(sensor.default_status),
    "job": sched.job_name,
}))
"""


def _git(repo: Path, *args: str) -> str:
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@example.com",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@example.com",
    }
    return subprocess.run(
        ["git", *args], cwd=repo, env=env, check=True, capture_output=True, text=True
    ).stdout.strip()


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
    env = {**os.environ, "MEGACPP_CONFIG": str(catalog), "MEGACPP_CACHE_DIR": str(tmp_path / "c")}
    out = subprocess.run(
        [sys.executable, "-c", _PROBE], cwd=REPO, env=env, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["first"][0] == ["upstream", f"upstream:{head}", head]
    assert got["first"][1][0] == "tree" and got["first"][1][1].startswith("tree:")
    assert got["second"] == [got["first"][1][1]]
    assert (got["cron"], got["tz"]) == ("30 3 * * *", "UTC")
    assert "STOPPED" in got["schedule_default"] and "STOPPED" in got["sensor_default"]
    assert got["job"] == "per_source_refresh"
