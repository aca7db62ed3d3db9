"""Per-file gates on every core. A shard's table is cut into byte-balanced row slices, forked
worker processes run each slice through the same gate, and the parts come back in input
order and merge into one GateResult: the same rows in the same order with the same summed
stats as the serial call, because every per-file gate decides each row on its own.

Workers are forked per call so the gate (often a closure over its config) and the table are
inherited, not pickled; only the results travel back. Small tables run inline: below
`min_bytes` a fork costs more than it saves.
"""

from __future__ import annotations

import itertools
import multiprocessing
import os
import signal
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from multiprocessing.pool import Pool
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from megacpp_pipeline.core.gate import GateResult

Gate = Callable[[pa.Table], GateResult]
WORKERS_ENV = "MEGACPP_WORKERS"
SIZE_COLUMNS = ("text", "content")  # what a row's work is proportional to

# Set in the parent right before the fork; the children read them, never the parent.
_GATE: Gate | None = None
_TABLE: pa.Table | None = None


def default_workers() -> int:
    """MEGACPP_WORKERS if set (1 turns parallelism off), else the CPUs this process may use."""
    raw = os.environ.get(WORKERS_ENV, "").strip()
    if raw:
        try:
            return max(1, int(raw))
        except ValueError as e:
            raise ValueError(f"{WORKERS_ENV}={raw!r}: expected a whole number of workers") from e
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


def slice_bounds(sizes: np.ndarray, parts: int) -> list[tuple[int, int]]:
    """Contiguous [lo, hi) row ranges of about equal bytes, none empty."""
    n = len(sizes)
    parts = max(1, min(parts, n))
    cum = np.cumsum(sizes, dtype=np.int64)
    total = int(cum[-1]) if n else 0
    cuts = [0]
    for k in range(1, parts):
        cut = int(np.searchsorted(cum, total * k / parts, side="left")) + 1
        if cuts[-1] < cut < n:
            cuts.append(cut)
    cuts.append(n)
    return [(lo, hi) for lo, hi in itertools.pairwise(cuts) if hi > lo]


def worker_init() -> None:
    # A fork inherits the parent's Python signal handlers (Dagster's defer SIGTERM and
    # SIGINT to a safe point that a worker never reaches): restore the defaults so that
    # terminating the pool really ends its workers.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _run_slice(bounds: tuple[int, int]) -> GateResult:
    assert _GATE is not None and _TABLE is not None, "worker started without a fork"
    lo, hi = bounds
    return _GATE(_TABLE.slice(lo, hi - lo))


def merge(parts: list[GateResult]) -> GateResult:
    """Concatenate parts in order; stats add up; side tables concatenate by name."""
    stats: Counter[str] = Counter()
    extra: dict[str, list[pa.Table]] = {}
    for part in parts:
        stats.update(part.stats)
        for name, table in part.extra.items():
            extra.setdefault(name, []).append(table)
    return GateResult(
        kept=pa.concat_tables([p.kept for p in parts]),
        dropped=pa.concat_tables([p.dropped for p in parts]),
        stats=stats,
        extra={name: pa.concat_tables(tables) for name, tables in extra.items()},
    )


class ParallelGate:
    """`gate` over forked workers; a drop-in for the gate itself (same result, same order).

    A worker's exception is raised here with its own type and message, so a gate error
    still names the file it concerns.
    """

    def __init__(
        self,
        gate: Gate,
        workers: int | None = None,
        *,
        min_bytes: int = 2 << 20,
        slices_per_worker: int = 4,
    ) -> None:
        self.gate = gate
        self.workers = default_workers() if workers is None else max(1, workers)
        self.min_bytes = min_bytes
        self.slices_per_worker = slices_per_worker

    def __call__(self, table: pa.Table) -> GateResult:
        if self.workers < 2 or table.num_rows < 2 or "fork" not in _start_methods():
            return self.gate(table)
        sizes = row_sizes(table)
        if int(sizes.sum()) < self.min_bytes:
            return self.gate(table)
        bounds = slice_bounds(sizes, self.workers * self.slices_per_worker)
        global _GATE, _TABLE
        _GATE, _TABLE = self.gate, table
        try:
            with forked_pool(min(self.workers, len(bounds))) as pool:
                parts = pool.map(_run_slice, bounds, chunksize=1)
        finally:
            _GATE, _TABLE = None, None
        return merge(parts)


@contextmanager
def forked_pool(workers: int) -> Iterator[Pool]:
    """A pool of forked workers (they inherit what the parent set up, nothing is pickled
    but arguments and results) that ends with the block: closed when it completes, so the
    workers finish and exit on their own, terminated when it raises."""
    pool = multiprocessing.get_context("fork").Pool(workers, initializer=worker_init)
    try:
        yield pool
        pool.close()
    except BaseException:
        pool.terminate()
        raise
    finally:
        pool.join()


def _start_methods() -> list[str]:
    return multiprocessing.get_all_start_methods()


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


def parallel(gate: Gate, workers: int | None = None, **kwargs: Any) -> Gate:
    """The gate itself when there is one worker, else a ParallelGate around it."""
    n = default_workers() if workers is None else workers
    return gate if n < 2 else ParallelGate(gate, n, **kwargs)
