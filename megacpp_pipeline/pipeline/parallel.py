"""This host's workers: how many (MEGACPP_WORKERS in the environment the edge hands over,
else every CPU this process may use), what a forked worker must reset, whether this process
may still fork workers that use polars, and what a row's work is proportional to."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Mapping

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

WORKERS_ENV = "MEGACPP_WORKERS"
# a forked worker's process name (`ps`, `top`; a bench counts it as a worker, not as the
# driver that forked it, which is the plan's case: `megacpp run` sizes the sources on workers
# of its own before it forks any run)
WORKER_NAME = "megacpp-worker"
SIZE_COLUMNS = ("text", "content")  # what a row's work is proportional to


class WorkersError(ValueError):
    """A worker count that is not a whole number of at least 1; the message names where it
    was given and what."""


def parse_workers(raw: str, where: str = "") -> int:
    """A worker count as a person gives it (`--workers`, MEGACPP_WORKERS): a whole number,
    at least 1 (1 runs everything in the step's process). Anything else is refused, the
    same way wherever it came from, rather than read as 1."""
    text = raw.strip()
    if not (text.isascii() and text.isdigit()) or int(text) < 1:
        raise WorkersError(f"{where}{raw!r}: a whole number of workers, at least 1")
    return int(text)


def workers_from(environ: Mapping[str, str]) -> int:
    """MEGACPP_WORKERS if set in `environ` (1 turns parallelism off), else the CPUs this
    process may use. The edge (the CLI, the Dagster resource) hands its environment over;
    the library reads none."""
    raw = environ.get(WORKERS_ENV, "").strip()
    if raw:
        return parse_workers(raw, where=f"{WORKERS_ENV}=")
    return cpu_count()


def cpu_count() -> int:
    """The CPUs this process may use (its affinity mask, not the machine's count)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def row_sizes(table: pa.Table) -> np.ndarray:
    for name in SIZE_COLUMNS:
        if name in table.column_names:
            return pc.binary_length(pc.cast(table[name], pa.binary())).to_numpy(
                zero_copy_only=False
            )
    return np.ones(table.num_rows, dtype=np.int64)


def worker_init() -> None:
    # A fork inherits the parent's Python signal handlers (Dagster's defer SIGTERM and
    # SIGINT to a safe point that a worker never reaches): restore the defaults so that
    # terminating the pool really ends its workers.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    name_process(WORKER_NAME)
    end_with_parent()


def name_process(name: str) -> None:
    """This process's name as Linux shows it to `ps` and `top` (at most 15 bytes); where
    /proc cannot be written, the name stays as it was."""
    with contextlib.suppress(OSError), open("/proc/self/comm", "w") as comm:
        comm.write(name)


def end_with_parent(every_s: float = 0.5) -> None:
    """A worker whose parent is gone (killed, or ended without ending its pools: a process
    pool's worker would wait on its task queue forever) ends too, at once and with no
    cleanup, as if killed with it: a daemon thread watches the parent's pid, which changes
    when the worker is handed to another parent."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(every_s)
        os._exit(1)

    threading.Thread(target=watch, name="megacpp-parent-watch", daemon=True).start()


def polars_threads_run() -> bool:
    """Whether polars' thread pool has started in this process. A forked child does not get
    those threads, so its first parallel polars query waits for them forever: fork before
    polars has run a query, or do the work in this process. (Read from the threads' names;
    False where /proc is not there to read.)"""
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return False
    for task in tasks:
        try:
            with open(f"/proc/self/task/{task}/comm") as f:
                name = f.read()
        except OSError:  # the thread ended meanwhile
            continue
        if name.startswith("polars-") and name[7:8].isdigit():
            return True
    return False
