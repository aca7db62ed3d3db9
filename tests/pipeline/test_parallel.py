"""pipeline/parallel.py: a forked process that must not outlive its parent (a pool worker,
a `megacpp run` stage group, which leads a process group of its own and so escapes a kill
of the command's group) ends soon after the parent is killed outright."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

SCRIPT = """
import os, sys, time
from megacpp_pipeline.pipeline.parallel import end_with_parent

pid = os.fork()
if pid == 0:
    os.setpgid(0, 0)  # as a stage group does: a kill of the parent's group misses it
    if sys.argv[2] == "watch":
        end_with_parent()
    with open(sys.argv[1], "w") as f:
        f.write(str(os.getpid()))
    time.sleep(60)
    os._exit(0)
time.sleep(60)
"""


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def _orphan_lives_s(tmp_path: Path, mode: str) -> float:
    """Seconds the forked child outlived its SIGKILLed parent (at most 3)."""
    marker = tmp_path / f"child-{mode}"
    parent = subprocess.Popen(
        [sys.executable, "-c", SCRIPT, str(marker), mode],
        cwd=Path(__file__).resolve().parents[2],
    )
    try:
        deadline = time.monotonic() + 30
        while not marker.exists() or not marker.read_text():
            assert time.monotonic() < deadline, "the child never started"
            time.sleep(0.05)
        child = int(marker.read_text())
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        killed = time.monotonic()
        while _alive(child) and time.monotonic() - killed < 3.0:
            time.sleep(0.05)
        lived = time.monotonic() - killed
        if _alive(child):
            os.kill(child, signal.SIGKILL)
        return lived
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()


def test_a_process_that_watches_its_parent_ends_when_the_parent_is_killed(
    tmp_path: Path,
) -> None:
    assert _orphan_lives_s(tmp_path, "watch") < 2.0
    assert _orphan_lives_s(tmp_path, "none") >= 3.0  # without the watch it would live on


def _names(job: None, item: int) -> tuple[int, str]:
    return os.getpid(), Path("/proc/self/comm").read_text().strip()


def test_forked_workers_are_named_so_ps_and_the_bench_tell_them_from_their_driver() -> None:
    """Both kinds of pool (a map's own, the light pool) name their workers WORKER_NAME; the
    process that forked them keeps its name."""
    from megacpp_pipeline.pipeline.executor import LocalExecutor
    from megacpp_pipeline.pipeline.parallel import WORKER_NAME

    before = Path("/proc/self/comm").read_text().strip()
    executor = LocalExecutor(2)
    seen = [*executor.map(_names, None, [1, 2, 3]), *executor.map_light(_names, None, [1, 2])]
    assert {pid for pid, _ in seen}.isdisjoint({os.getpid()})
    assert {name for _, name in seen} == {WORKER_NAME}
    assert Path("/proc/self/comm").read_text().strip() == before != WORKER_NAME
