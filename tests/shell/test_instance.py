"""`megacpp run` opens its Dagster instance under a lock: runs that start at once on a fresh
DAGSTER_HOME each create the instance's SQLite schema otherwise, and alembic then refuses
with "more than one head" (two `megacpp run` on one data dir at once hit it)."""

from __future__ import annotations

import multiprocessing
import os
from pathlib import Path
from typing import Any

from assets.runner import open_instance


def _open(home: str, barrier: Any, out: Any) -> None:
    os.environ["DAGSTER_HOME"] = home
    barrier.wait()
    try:
        instance = open_instance()
        out.put(("ok", len(instance.get_runs())))
    except Exception as e:  # reported to the test, which names it
        out.put((type(e).__name__, str(e)[:300]))


def test_runs_starting_at_once_on_a_fresh_home_all_open_the_instance(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("fork")  # each opens the instance itself, as a run does
    n = 6
    barrier, out = ctx.Barrier(n), ctx.Queue()
    procs = [ctx.Process(target=_open, args=(str(tmp_path), barrier, out)) for _ in range(n)]
    for p in procs:
        p.start()
    results = [out.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(timeout=60)
    assert results == [("ok", 0)] * n, results
    assert (tmp_path / "dagster.yaml").read_bytes() == (
        Path(__file__).resolve().parents[2] / "dagster.yaml"
    ).read_bytes()
