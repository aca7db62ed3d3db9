"""One `megacpp run` as a subprocess on a fresh data dir and DAGSTER_HOME, timed, with the
memory of its process tree sampled from /proc and each sample charged to the stage group
named by the CLI's last progress line (`-> asset, ... [partition]`) on stderr.

`megacpp run` runs each stage group (and source) as one Dagster run in a forked process of
its own, as Dagster's multiprocess executor runs steps, and the per-file gates fork workers
of their own. A sample is the proportional set size (PSS) summed over the tree, so pages the
forks share are counted once; a group's peak is the largest sample while it ran, and the
group's process also reports its own high-water mark (VmHWM, which counts the pages it
inherited from the parent at fork). The whole run's peak is the largest sample.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import resource
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from megacpp_pipeline.pipeline.parallel import WORKER_NAME
from megacpp_pipeline.pipeline.ray_holder import PROCESS_NAME as HOLDER_NAME

REPO = Path(__file__).resolve().parent.parent
_STARTED = re.compile(r"^-> (?P<label>.+?)(?: \[(?P<partition>[^\]]+)\])?$")
_OK = re.compile(r"^\s+ok in (?P<seconds>[0-9.]+)s(?:, peak RSS (?P<rss>[0-9.]+) MB)?$")
_PAGE = os.sysconf("SC_PAGE_SIZE")
# Between two samples in which the run's tree kept at most this many cores busy, the run was
# serial: one core, and the sampling's jitter (CPU time is counted in clock ticks)
SERIAL_CORES = 1.25
_TICK = os.sysconf("SC_CLK_TCK")


@dataclass
class StageGroup:
    """One stage group (e.g. `enriched_files`), over all its partitions."""

    name: str
    seconds: float = 0.0  # sum of the CLI's "ok in" over partitions
    cpu_s: float = 0.0  # CPU seconds (all threads, user + system) while it ran, sampled
    # CPU seconds of the run's driver processes themselves (`megacpp run` and the Dagster run
    # it forks per group), not of the workers or Ray processes those start: the serial part
    driver_cpu_s: float = 0.0
    runs: int = 0
    peak_rss_mb: float = 0.0  # sampled PSS of the whole process tree while it ran
    process_peak_rss_mb: float = 0.0  # the group's own process' high-water mark (VmHWM)
    # the largest resident set (RSS) of any one process of the tree while the group ran:
    # the Dagster run's process, a forked worker, a Ray worker or Ray's own daemons
    largest_process_mb: float = 0.0
    largest_process: str = ""  # that process' command name
    partitions: dict[str, float] = field(default_factory=dict)  # partition -> seconds
    serial_s: float = 0.0  # of its wall, the seconds that were serial (serial_seconds)


@dataclass
class EndToEnd:
    label: str
    returncode: int | None  # None: killed at the time limit
    wall_s: float
    cpu_s: float  # CPU seconds of the run's process tree, user + system
    peak_rss_mb: float
    driver_cpu_s: float
    stages: list[StageGroup]
    snapshot: str | None
    tokens_out: int | None
    documents: int | None
    ledger: dict[str, dict[str, int]] | None
    samples: int
    log: str  # the run's stderr, kept on disk
    error: str | None = None
    # of the wall, the seconds that were serial, before and between the groups too
    serial_s: float = 0.0
    timeline: str | None = None  # per sample "seconds cores group", kept on disk

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Sample:
    """The run's tree at one sample: seconds since the start, its CPU seconds so far, and
    the stage group then running (None: before or between groups)."""

    t: float
    cpu_s: float
    group: str | None


def serial_seconds(
    samples: Sequence[Sample], cores: float = SERIAL_CORES
) -> dict[str | None, float]:
    """Per group (None: outside every group), the wall seconds between consecutive samples
    in which the tree kept at most `cores` busy: what more workers would not shorten (a
    driver working alone, a last straggling task, a fork, a wait on the disk). The interval
    before a sample counts to the group running at that sample."""
    out: dict[str | None, float] = {}
    for before, now in itertools.pairwise(samples):
        dt = now.t - before.t
        if dt > 0 and (now.cpu_s - before.cpu_s) / dt <= cores:
            out[now.group] = out.get(now.group, 0.0) + dt
    return out


def write_timeline(path: Path, samples: Sequence[Sample]) -> None:
    """One line a sample: seconds since the start, cores kept busy since the sample before,
    the group running ("-": none)."""
    lines = []
    for before, now in itertools.pairwise(samples):
        dt = now.t - before.t
        busy = (now.cpu_s - before.cpu_s) / dt if dt > 0 else 0.0
        lines.append(f"{now.t:.2f} {busy:.2f} {now.group or '-'}\n")
    path.write_text("".join(lines))


def _children(pid: int) -> list[int]:
    out: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                out += [int(c) for c in f.read().split()]
        except OSError:
            continue
    return out


def _rss_bytes(pid: int) -> int:
    """Proportional set size: a page shared by k processes counts 1/k in each, so the sum
    over a tree of forked processes is the memory the tree really holds (plain RSS would
    count every copy-on-write page once per child). Falls back to RSS without smaps."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, IndexError, ValueError):
        return 0


def process_tree(root: int) -> list[int]:
    """`root` and all its live descendants, each once."""
    out, stack, seen = [], [root], set()
    while stack:
        pid = stack.pop()
        if pid in seen:
            continue
        seen.add(pid)
        out.append(pid)
        stack += _children(pid)
    return out


def process_rss_bytes(pid: int) -> int:
    """Plain resident bytes of one process (pages it shares count in full)."""
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, IndexError, ValueError):
        return 0


def process_name(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return "?"


def largest_process(root: int) -> tuple[int, int]:
    """(pid, RSS bytes) of the tree's process with the largest resident set."""
    best = (root, 0)
    for pid in process_tree(root):
        rss = process_rss_bytes(pid)
        if rss > best[1]:
            best = (pid, rss)
    return best


def tree_rss_bytes(root: int) -> int:
    """Resident bytes (PSS) of `root` and all its descendants."""
    return sum(_rss_bytes(pid) for pid in process_tree(root))


def own_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of `pid` itself (all its threads), not of its children."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return 0.0
    return sum(int(x) for x in fields[11:13]) / _TICK


def driver_pids(root: int) -> list[int]:
    """The run's driver processes: `megacpp run` itself and the runs it forks (its direct
    children); their children are workers, Ray's processes and Dagster's helpers. The
    process `megacpp run --engine ray` forks to hold its local Ray instance (named
    ray_holder.PROCESS_NAME) runs no stage: it is counted with Ray's processes; the workers
    it forks itself to size the sources before any run (parallel.WORKER_NAME) are workers."""
    return [root, *(pid for pid in _children(root) if _comm(pid) not in _NOT_DRIVERS)]


_NOT_DRIVERS = (HOLDER_NAME, WORKER_NAME)


def _comm(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return ""


def _times(pid: int) -> tuple[int, float, float] | None:
    """(parent pid, own CPU seconds, CPU seconds of its reaped children) of a live process."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    own = (int(fields[11]) + int(fields[12])) / _TICK
    reaped = (int(fields[13]) + int(fields[14])) / _TICK
    return int(fields[1]), own, reaped


class TreeCPU:
    """CPU seconds a process tree has used, kept per process between samples, so the time of
    a process that dies where no process of the tree reaps it (Ray's workers and daemons,
    ended with their raylet) stays counted, where a sum over the live tree would lose it.

    A process' own time counts as it is seen. When a parent reaps children, its count of
    reaped time jumps by theirs; only what the samples did not already see of them is added
    (the last sample of every child that left since, descendants first so a process that
    reaped its own children just before exiting hands their seen time on). A process that
    leaves the tree but still runs (its parent died; it was adopted outside) is followed on
    its own and never handed on. Not seen: what a process does between its last sample and
    its exit where no process of the tree reaps it."""

    def __init__(self, root: int) -> None:
        self.root = root
        self.total = 0.0
        self._seen: dict[int, tuple[int, float, float]] = {}  # pid -> its last _times
        self._adopted: dict[int, float] = {}  # left the tree alive: pid -> own seconds seen
        self._carry: dict[int, float] = {}  # seen seconds of children reaped, not yet jumped

    def sample(self) -> float:
        live: dict[int, tuple[int, float, float]] = {}
        for pid in process_tree(self.root):  # parents before their children
            got = _times(pid)
            if got is not None:
                live[pid] = got
        for pid, was in list(self._adopted.items()):
            got = _times(pid)
            if got is None or pid in live:
                del self._adopted[pid]
            else:
                self.total += max(0.0, got[1] - was)
                self._adopted[pid] = max(was, got[1])
        # children reaped since the last sample: their seen seconds, per the parent that
        # reaped them (a parent's count may show the jump now or, reaped between reading the
        # parent and the child, at the next sample: kept one sample, then dropped)
        reaped_by: dict[int, float] = {}
        for pid in reversed(self._seen):  # descendants before their ancestors
            if pid in live:
                continue
            parent, own, reaped = self._seen[pid]
            got = _times(pid)
            if got is not None:  # alive outside the tree: followed on its own
                self.total += max(0.0, got[1] - own)
                self._adopted[pid] = max(own, got[1])
                continue
            seen = own + reaped + reaped_by.pop(pid, 0.0) + self._carry.pop(pid, 0.0)
            reaped_by[parent] = reaped_by.get(parent, 0.0) + seen
        carry, self._carry = self._carry, {}
        for pid, (parent, own, reaped) in live.items():
            _, was_own, was_reaped = self._seen.get(pid, (parent, 0.0, 0.0))
            self.total += max(0.0, own - was_own)
            jump = max(0.0, reaped - was_reaped)
            known, before = reaped_by.pop(pid, 0.0), carry.pop(pid, 0.0)
            self.total += max(0.0, jump - before - known)
            left = known - max(0.0, jump - before)  # of this sample's, not in the jump yet
            if left > 0:
                self._carry[pid] = left
        self._seen = live
        return self.total


def high_water_bytes(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def run(
    catalog: Path,
    work: Path,
    label: str,
    *,
    timeout_s: float,
    interval_s: float = 0.2,
    wrap: list[str] | None = None,
    args: list[str] | None = None,
    repo: Path = REPO,
    workers: int | None = None,
) -> EndToEnd:
    """`megacpp run --config catalog [args]` under work/ (data, dagster_home, cache all
    fresh), from the checkout `repo` (another commit's, to measure a baseline beside), with
    MEGACPP_WORKERS=`workers` when given."""
    work.mkdir(parents=True, exist_ok=True)
    env = {
        **os.environ,
        "DAGSTER_HOME": str(work / "dagster_home"),
        "MEGACPP_CACHE_DIR": str(work / "cache"),
        "PYTHONWARNINGS": "ignore",
    }
    if workers is not None:
        env["MEGACPP_WORKERS"] = str(workers)
    log_path = work / "megacpp-run.log"
    # wrap: interpreter options before the module, e.g. ["-m", "pyinstrument", ...]
    cmd = [sys.executable, *(wrap or []), "-m", "assets.cli", "run"]
    cmd += ["--config", str(catalog)]
    cmd += ["--data-dir", str(work / "data"), *(args or [])]
    stages: dict[str, StageGroup] = {}
    current: list[str | None] = [None]
    current_partition: list[str | None] = [None]

    started = time.monotonic()
    timeline = [Sample(0.0, 0.0, None)]
    reaped_before = resource.getrusage(resource.RUSAGE_CHILDREN)
    with log_path.open("w") as log:
        proc = subprocess.Popen(
            cmd,
            cwd=repo,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,  # one process group: a time limit stops all of it
        )
        stdout_lines: list[str] = []

        def read_stderr() -> None:
            assert proc.stderr is not None
            for line in proc.stderr:
                log.write(line)
                log.flush()  # so the log can be followed while the run goes on
                line = line.rstrip("\n")
                if m := _STARTED.match(line):
                    name = m.group("label")
                    current[0], current_partition[0] = name, m.group("partition")
                    stages.setdefault(name, StageGroup(name)).runs += 1
                elif (m := _OK.match(line)) and current[0]:
                    group = stages[current[0]]
                    group.seconds += float(m.group("seconds"))
                    if m.group("rss"):
                        group.process_peak_rss_mb = max(  # MB of 10^6 bytes, as printed
                            group.process_peak_rss_mb, float(m.group("rss"))
                        )
                    group.partitions[current_partition[0] or "_"] = float(m.group("seconds"))

        def read_stdout() -> None:
            assert proc.stdout is not None
            stdout_lines.extend(proc.stdout)

        readers = [threading.Thread(target=read_stderr), threading.Thread(target=read_stdout)]
        for t in readers:
            t.start()
        peak_tree = hwm = samples = 0
        cpu = 0.0
        tree_cpu = TreeCPU(proc.pid)
        driver_seen: dict[int, float] = {}  # own CPU seconds last seen per driver process
        returncode: int | None = None
        while True:
            returncode = proc.poll()
            if returncode is not None:
                break
            if time.monotonic() - started > timeout_s:
                os.killpg(proc.pid, signal.SIGKILL)  # our own child's group only
                proc.wait()
                returncode = None
                break
            rss = tree_rss_bytes(proc.pid)
            hwm = max(hwm, high_water_bytes(proc.pid))
            peak_tree = max(peak_tree, rss)
            now_cpu = max(cpu, tree_cpu.sample())
            timeline.append(Sample(time.monotonic() - started, now_cpu, current[0]))
            driver_delta = 0.0
            for pid in driver_pids(proc.pid):
                own = own_cpu_seconds(pid)
                driver_delta += max(0.0, own - driver_seen.get(pid, 0.0))
                driver_seen[pid] = max(own, driver_seen.get(pid, 0.0))
            samples += 1
            if current[0]:
                group = stages[current[0]]
                group.peak_rss_mb = max(group.peak_rss_mb, rss / 1e6)
                pid, one = largest_process(proc.pid)
                if one / 1e6 > group.largest_process_mb:
                    group.largest_process_mb = one / 1e6
                    group.largest_process = process_name(pid)
                group.cpu_s += now_cpu - cpu
                group.driver_cpu_s += driver_delta
            cpu = now_cpu
            time.sleep(interval_s)
        wall = time.monotonic() - started
        for t in readers:
            t.join()

    # Exact once the tree has exited: every descendant was reaped into the run's process,
    # and that process into this one (the per-group figures above are sampled).
    reaped = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = max(
        cpu,
        reaped.ru_utime + reaped.ru_stime - reaped_before.ru_utime - reaped_before.ru_stime,
    )
    serial = serial_seconds(timeline)
    for name, group in stages.items():
        group.serial_s = serial.get(name, 0.0)
    write_timeline(work / "timeline.tsv", timeline)
    out = EndToEnd(
        label=label,
        returncode=returncode,
        wall_s=wall,
        cpu_s=cpu,
        peak_rss_mb=max(peak_tree, hwm) / 1e6,
        driver_cpu_s=sum(driver_seen.values()),
        stages=list(stages.values()),
        snapshot=None,
        tokens_out=None,
        documents=None,
        ledger=None,
        samples=samples,
        log=str(log_path),
        serial_s=sum(serial.values()),
        timeline=str(work / "timeline.tsv"),
    )
    if returncode is None:
        out.error = f"stopped at the {timeout_s:.0f} s limit during {current[0]!r}"
    elif returncode != 0:
        tail = log_path.read_text().strip().splitlines()[-3:]
        out.error = " | ".join(tail)
    else:
        snapshot = Path(stdout_lines[-1].strip())
        manifest = json.loads((snapshot / "manifest.json").read_text())
        out.snapshot = str(snapshot)
        out.tokens_out = sum(s["tokens"] for s in manifest["splits"].values())
        out.documents = manifest["documents"]
        out.ledger = manifest["ledger"]
    return out
