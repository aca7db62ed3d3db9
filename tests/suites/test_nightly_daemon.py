"""The nightly refresh fired for real: `dagster-daemon` runs against a temporary instance with
the nightly schedule (on a one-minute cron) and the cascade sensor switched on the way an
operator does (`dagster schedule start`, `dagster sensor start`), over a local git source
that tracks `main`. After the branch moves, a real tick launches the refresh of that source,
the cascade brings everything downstream up to date, a new snapshot is promoted, and
`megacpp diff` against the previous one says the source moved, which files changed, and that
the tokenizer was kept. A later tick with nothing new launches nothing."""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import dagster as dg
import pytest

from megacpp_pipeline.snapshot.diff import diff_snapshots, render_markdown
from megacpp_pipeline.snapshot.promote import read_manifest
from megacpp_pipeline.storage.store import ShardStore
from tests.fixtures.git_repo import git as _git

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
TIMEOUT_S = 900  # from the branch moving to the new snapshot promoted

HEADER = """\
#pragma once
// SPDX-License-Identifier: MIT
#include <cstddef>
#include <vector>

namespace nightly {{

/// A small ring buffer of {noun}s; the {n}th of the family.
template <class T>
class Ring{n} {{
 public:
  explicit Ring{n}(std::size_t capacity) : items_(capacity) {{}}
  std::size_t capacity() const noexcept {{ return items_.size(); }}
  void push(const T& value) {{
    items_[head_] = value;
    head_ = (head_ + 1) % items_.size();
  }}
  const T& at(std::size_t i) const {{ return items_[(head_ + i) % items_.size()]; }}

 private:
  std::vector<T> items_;
  std::size_t head_ = 0;
}};

inline int {noun}_sum(const Ring{n}<int>& r) {{
  int total = {n};
  for (std::size_t i = 0; i < r.capacity(); ++i) total += r.at(i) * {n};
  return total;
}}

}}  // namespace nightly
"""
NOUNS = ["sample", "packet", "frame", "event", "record", "token", "reading", "message"]


def commit(repo: Path, files: dict[str, str], message: str) -> str:
    for rel, text in files.items():
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_text(text)
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", message)
    return _git(repo, "rev-parse", "HEAD")


@dataclass
class Deployment:
    """A catalog tracking `main` of a local repository, a data dir, and a Dagster instance
    of its own, reached the way `dagster dev` reaches them (workspace.yaml, environment)."""

    root: Path
    repo: Path
    data: Path
    home: Path
    env: dict[str, str]

    def cli(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*args], cwd=REPO, env=self.env, capture_output=True, text=True, timeout=timeout
        )

    def instance(self) -> dg.DagsterInstance:
        return dg.DagsterInstance.get()  # DAGSTER_HOME is the deployment's (the fixture)

    def snapshot(self) -> Path | None:
        store = ShardStore(str(self.data))
        if not store.has_version("snapshot"):
            return None
        return Path(store.latest("snapshot", None).extra["snapshot_dir"])


@pytest.fixture
def deployment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Deployment:
    repo = tmp_path / "upstream"
    repo.mkdir()
    _git(repo, "init", "-q", "-b", "main")
    files = {f"include/ring{i}.hpp": HEADER.format(n=i, noun=NOUNS[i]) for i in range(6)}
    commit(repo, files, "first")
    catalog = tmp_path / "sources.yaml"
    catalog.write_text(
        "snapshot: nightly\nseq_len: 256\n"
        "refresh:\n  cron: '* * * * *'\n"
        f"sources:\n  - id: upstream\n    kind: git\n    uri: {repo}\n    track: main\n"
        "    declared_license: MIT\n"
        "split:\n  validation_fraction: 0.2\n"
        "stages:\n  tokenizer:\n    vocab_size: 320\n    min_frequency: 1\n"
    )
    home = tmp_path / "home"
    home.mkdir()
    shutil.copyfile(REPO / "dagster.yaml", home / "dagster.yaml")
    env = {
        **os.environ,
        "DAGSTER_HOME": str(home),
        "MEGACPP_CONFIG": str(catalog),
        "MEGACPP_DATA_DIR": str(tmp_path / "data"),
        "MEGACPP_CACHE_DIR": str(tmp_path / "cache"),
        "MEGACPP_WORKERS": "2",
        "PYTHONWARNINGS": "ignore",
    }
    # this process reads the same instance (the repo's event log storage wants DAGSTER_HOME)
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    return Deployment(tmp_path, repo, tmp_path / "data", home, env)


@pytest.fixture
def daemon(deployment: Deployment) -> Iterator[subprocess.Popen[bytes]]:
    """`dagster-daemon run` on the deployment's instance and workspace, stopped after."""
    log = (deployment.root / "daemon.log").open("wb")
    proc = subprocess.Popen(
        [str(BIN / "dagster-daemon"), "run", "-w", "workspace.yaml"],
        cwd=REPO,
        env=deployment.env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # its own process group: stopped with every child it started
    )
    try:
        yield proc
    finally:
        # the daemon, its code server and the runs it launched share its process group
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        log.close()


def _wait(what: str, done: callable, timeout_s: float, deployment: Deployment) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if done():
            return
        time.sleep(5)
    tail = (deployment.root / "daemon.log").read_text(errors="replace")[-4000:]
    raise AssertionError(f"timed out waiting for {what}; the daemon's log ends:\n{tail}")


def _schedule_ticks(instance: dg.DagsterInstance) -> list:
    (state,) = [
        s for s in instance.all_instigator_state() if s.instigator_name == "nightly_refresh"
    ]
    return list(instance.get_ticks(state.instigator_origin_id, state.selector_id, limit=50))


@pytest.mark.slow
def test_a_real_tick_refreshes_and_promotes_a_snapshot_that_keeps_the_tokenizer(
    deployment: Deployment, daemon: subprocess.Popen[bytes]
) -> None:
    # the snapshot the nightly refresh will be compared with: a whole run at the first commit
    first_run = deployment.cli(
        str(BIN / "megacpp"), "run", "--config", deployment.env["MEGACPP_CONFIG"],
        "--data-dir", str(deployment.data), "--cache-dir", deployment.env["MEGACPP_CACHE_DIR"],
    )  # fmt: skip
    assert first_run.returncode == 0, first_run.stderr[-3000:]
    first = deployment.snapshot()
    assert first is not None
    first_revision = _git(deployment.repo, "rev-parse", "HEAD")

    # upstream moves: one header changes, one is added
    changed = HEADER.format(n=2, noun=NOUNS[2]).replace("total = 2;", "total = 20;")
    moved = commit(
        deployment.repo,
        {"include/ring2.hpp": changed, "include/ring7.hpp": HEADER.format(n=7, noun=NOUNS[7])},
        "moved",
    )
    for kind, name in (("schedule", "nightly_refresh"), ("sensor", "nightly_cascade")):
        out = deployment.cli(str(BIN / "dagster"), kind, "start", name, "-w", "workspace.yaml")
        assert out.returncode == 0, out.stdout + out.stderr

    def promoted() -> bool:
        assert daemon.poll() is None, "the daemon exited"
        latest = deployment.snapshot()
        return latest is not None and latest != first and (latest / "_COMPLETE").exists()

    _wait("the refreshed snapshot", promoted, TIMEOUT_S, deployment)
    second = deployment.snapshot()
    assert second is not None
    instance = deployment.instance()
    refresh_runs = instance.get_runs(filters=dg.RunsFilter(tags={"megacpp/revision": moved}))
    assert [r.status for r in refresh_runs] == [dg.DagsterRunStatus.SUCCESS]
    assert refresh_runs[0].tags.get("dagster/schedule_name") == "nightly_refresh"
    # the cascade started after the refresh ended, one run group at a time, never beside it
    cascade = sorted(
        (instance.get_run_stats(r.run_id) for r in instance.get_runs()
         if r.tags.get("dagster/sensor_name") == "nightly_cascade"),
        key=lambda stats: stats.start_time or 0,
    )  # fmt: skip
    refreshed = instance.get_run_stats(refresh_runs[0].run_id)
    assert len(cascade) == 3  # dedup .. tokenizer, enrich + tokenize, documents .. report
    assert cascade[0].start_time > refreshed.end_time
    assert all(a.end_time <= b.start_time for a, b in itertools.pairwise(cascade))

    manifest = read_manifest(second)
    assert manifest.sources["upstream"].revision == moved
    text = render_markdown(diff_snapshots(first, second))
    assert f"| upstream | `{first_revision}` | `{moved}` |" in text
    assert "upstream added: `include/ring7.hpp`" in text
    assert "upstream changed: `include/ring2.hpp`" in text
    assert f"Tokenizer changed: no (kept from `{first.name}` (mode reuse))." in text
    assert manifest.tokenizer_policy["decision"] == "reused"

    # nothing new upstream: the next tick launches nothing, and nothing cascades
    def settled() -> bool:
        return all(r.is_finished for r in instance.get_runs())

    _wait("the cascade's runs to finish", settled, 300, deployment)
    runs_before = len(instance.get_runs())
    since = time.time()

    def skipped_tick() -> bool:
        ticks = [t for t in _schedule_ticks(instance) if t.timestamp > since]
        return any(t.status.value == "SKIPPED" for t in ticks)

    _wait("a schedule tick after the refresh", skipped_tick, 180, deployment)
    time.sleep(45)  # a cascade sensor tick or two after it
    assert len(instance.get_runs()) == runs_before
    assert deployment.snapshot() == second
