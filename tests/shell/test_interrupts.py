"""SIGINT and SIGTERM to `megacpp run`, as an operator sends them: Ctrl-C at a terminal (the
whole foreground process group), or a signal to the command's own process alone. The run stops
with one line naming the stage and saying that a re-run resumes; no traceback reaches the
console; no process of the run is left and nothing in the data dir changes after the command
exits; a re-run gives the snapshot an uninterrupted run gives."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from tests.fixtures.run_helpers import (
    REPO,
    RUN_TIMEOUT,
    Baseline,
    baseline,
    completed_snapshot,
    new_workspace,
    run,
    snapshot_files,
)

# the line `megacpp run` prints when a per-source stage group starts (plain console)
GROUP_STARTED = "-> raw_files"


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Baseline:
    return baseline(tmp_path_factory)


def _tree(root: Path) -> dict[str, tuple[int, int]]:
    return {
        str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns)
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def _processes_naming(text: str) -> list[str]:
    """Live processes whose command line names `text` (the workspace: every process of a
    run, forked or not, carries its data dir or its DAGSTER_HOME)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if text in cmdline and state != "Z":
            found.append(f"{entry}: {cmdline}")
    return found


def _interrupt(ws_root: Path, args: list[str], env: dict[str, str], how: str) -> tuple[int, str]:
    """Start `megacpp run` in a session of its own, signal it once its per-source stage
    group has started, and return its exit code and stderr."""
    proc = subprocess.Popen(
        args,
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    assert proc.stderr is not None
    lines: list[str] = []
    try:
        for line in proc.stderr:
            lines.append(line)
            if GROUP_STARTED in line:
                break
        time.sleep(0.3)  # the group's process has forked and is in its first stage
        if how == "ctrl-c":  # a terminal signals the whole foreground process group
            os.killpg(proc.pid, signal.SIGINT)
        else:
            os.kill(proc.pid, signal.SIGINT if how == "sigint" else signal.SIGTERM)
        rest = threading.Thread(target=lambda: lines.extend(proc.stderr or []))
        rest.start()
        code = proc.wait(timeout=RUN_TIMEOUT)
        rest.join(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return code, "".join(lines)


@pytest.mark.parametrize(
    ("how", "code"),
    [  # the default suite keeps one way in; the slow suite runs all three
        pytest.param("ctrl-c", 130, marks=pytest.mark.slow),
        ("sigint", 130),
        pytest.param("sigterm", 143, marks=pytest.mark.slow),
    ],
    ids=["ctrl-c-to-the-group", "sigint-to-the-command", "sigterm-to-the-command"],
)
def test_an_interrupted_run_stops_everything_says_so_in_one_line_and_a_rerun_resumes(
    base: Baseline, tmp_path: Path, how: str, code: int
) -> None:
    ws = new_workspace(tmp_path / "ws", base.catalog)
    got, stderr = _interrupt(ws.root, ws.run_args(), ws.env, how)
    after_exit = _tree(ws.data)
    assert got == code, stderr
    assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr, stderr
    last = stderr.strip().splitlines()[-1]
    name = "SIGTERM" if how == "sigterm" else "SIGINT"
    assert last.startswith(f"megacpp run: interrupted by {name} while "), stderr
    assert " was running;" in last and "Run the same command again to resume" in last, last
    # nothing of the run is left, and nothing writes after the command exited
    assert _processes_naming(str(ws.root)) == []
    time.sleep(2.0)
    assert _tree(ws.data) == after_exit
    snap = completed_snapshot(run(ws))
    assert snapshot_files(snap) == snapshot_files(base.snapshot)
