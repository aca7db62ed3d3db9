"""What a map's forked pool costs the driver: LocalExecutor forks a fresh pool for every map
(the workers inherit the job without pickling), and a fork copies the parent's page tables.
This forks pools of 2 and of 16 workers from a process holding about `--ballast-mb` of Python
objects (a Dagster run's driver holds 300-600 MB), each worker running one trivial task, and
reports the parent's CPU and the wall per map, the median of `--repeat`.

    .venv/bin/python -m bench.bench_fork [--ballast-mb 600] [--workers 2,16]

Why it matters (issue 25): the drivers' CPU grows with the worker count (demo 4x on a 16-core
host: 11.8 CPU s at 2 workers, 20.4 at 16), and a run group makes dozens of maps.
"""

from __future__ import annotations

import argparse
import gc
import json
import multiprocessing
import os
import statistics
import time
from concurrent.futures import ProcessPoolExecutor
from datetime import UTC, datetime
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results"


def _task(x: int) -> int:
    return x


def one_map(workers: int) -> tuple[float, float]:
    """(parent CPU s, wall s) of forking a pool of `workers`, one task each, and joining it,
    frozen first as the executor does (pipeline/executor.py: _start_pool)."""
    gc.freeze()
    try:
        cpu, wall = time.process_time(), time.perf_counter()
        context = multiprocessing.get_context("fork")
        with ProcessPoolExecutor(max_workers=workers, mp_context=context) as pool:
            list(pool.map(_task, range(workers)))
        return time.process_time() - cpu, time.perf_counter() - wall
    finally:
        gc.unfreeze()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--ballast-mb", type=int, default=600)
    parser.add_argument("--workers", default="2,16")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    # many small objects (what a Python heap is) plus a few large buffers, about half each
    half = args.ballast_mb << 19
    ballast = [bytes(1000) for _ in range(half // 1000)] + [bytearray(half)]
    statm = Path(f"/proc/{os.getpid()}/statm").read_text().split()
    rss_mb = int(statm[1]) * os.sysconf("SC_PAGE_SIZE") / 1e6
    runs = {}
    for n in (int(w) for w in args.workers.split(",")):
        cpu, wall = zip(*(one_map(n) for _ in range(args.repeat)), strict=True)
        runs[n] = {
            "parent_cpu_ms_per_map": round(statistics.median(cpu) * 1000, 1),
            "parent_cpu_ms_per_worker": round(statistics.median(cpu) * 1000 / n, 1),
            "wall_ms_per_map": round(statistics.median(wall) * 1000, 1),
        }
        print(f"{n} workers: {runs[n]}")
    result = {
        "ballast_objects": len(ballast),
        "parent_rss_mb": round(rss_mb),
        "cpus": len(os.sched_getaffinity(0)),
        "runs": runs,
        "measured_at": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / f"{datetime.now(UTC):%Y-%m-%d}-fork.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"-> {out}")


if __name__ == "__main__":
    main()
