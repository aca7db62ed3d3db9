"""Per-file gates on forked workers give the serial call's result: same kept rows in the same
order, same ledger, same stats; a worker's error still names its file."""

from __future__ import annotations

import itertools
import os
import re
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pytest

from megacpp_pipeline.core.gate import GateResult
from megacpp_pipeline.gates import enrich, normalize
from megacpp_pipeline.pipeline import parallel
from megacpp_pipeline.pipeline.parallel import ParallelGate, default_workers, slice_bounds
from tests.gates.test_normalize import HEADER, raw_table


def _corpus(n: int) -> dict[str, bytes]:
    """Real-looking headers of varied size, with files every normalize rule drops mixed in."""
    files: dict[str, bytes] = {}
    for i in range(n):
        body = HEADER.replace("span", f"span{i}") * (1 + i % 7)
        files[f"include/example/span{i}.hpp"] = body.encode()
        if i % 9 == 0:
            files[f"include/example/blob{i}.h"] = b"\x00\x01binary" * 40
        if i % 11 == 0:
            files[f"include/example/gen{i}.pb.h"] = b"// generated\nint x;\n"
        if i % 13 == 0:
            files[f"docs/readme{i}.txt"] = b"not c++\n"
    return files


def _same(a: GateResult, b: GateResult) -> None:
    assert a.kept.equals(b.kept)
    assert a.dropped.equals(b.dropped)
    assert a.stats == b.stats
    assert a.extra.keys() == b.extra.keys()
    for name in a.extra:
        assert a.extra[name].equals(b.extra[name])


def test_normalize_on_two_workers_equals_the_serial_call():
    table = raw_table(_corpus(300))
    cfg = normalize.NormalizeConfig()
    serial = normalize.run(table, cfg)
    forked = ParallelGate(lambda t: normalize.run(t, cfg), 2, min_bytes=0)(table)
    assert serial.dropped.num_rows > 0 and serial.kept.num_rows > 200
    _same(serial, forked)


def test_enrich_on_two_workers_equals_the_serial_call():
    norm = normalize.run(raw_table(_corpus(120)), normalize.NormalizeConfig()).kept
    n = norm.num_rows
    table = norm.append_column("license_expression", pa.array(["MIT"] * n))
    for name, value in (
        ("license_source", "file"),
        ("license_decision", "allowed"),
        ("license_detail", None),
    ):
        table = table.append_column(name, pa.array([value] * n, pa.string()))
    table = table.append_column("scrub_replacements", pa.array([0] * n, pa.int32()))
    cfg = enrich.EnrichConfig()
    serial = enrich.run(table, cfg, None)
    forked = ParallelGate(lambda t: enrich.run(t, cfg, None), 2, min_bytes=0)(table)
    assert serial.kept.num_rows == n
    _same(serial, forked)


def test_a_worker_error_is_raised_with_its_type_and_message():
    table = raw_table(_corpus(40))
    bad_path = table["path"][25].as_py()

    def gate(t: pa.Table) -> GateResult:
        if bad_path in t["path"].to_pylist():
            raise ValueError(f"{bad_path}: refused by the test gate")
        return GateResult(kept=t)

    with pytest.raises(ValueError, match=re.escape(f"{bad_path}: refused by the test gate")):
        ParallelGate(gate, 2, min_bytes=0)(table)


def test_small_tables_and_one_worker_run_inline():
    table = raw_table(_corpus(5))
    pid = os.getpid()
    seen: list[int] = []

    def gate(t: pa.Table) -> GateResult:
        seen.append(os.getpid())  # only the parent's list sees inline calls
        return GateResult(kept=t)

    ParallelGate(gate, 2)(table)  # far below the default 2 MiB threshold
    ParallelGate(gate, 1, min_bytes=0)(table)
    assert seen == [pid, pid]
    assert parallel.parallel(gate, 1) is gate


@pytest.mark.parametrize("parts", [1, 2, 3, 8, 50])
def test_slices_cover_every_row_once_in_order_and_balance_bytes(parts):
    rng = np.random.default_rng(parts)
    sizes = rng.integers(1, 10_000, size=37)
    bounds = slice_bounds(sizes, parts)
    assert bounds[0][0] == 0 and bounds[-1][1] == len(sizes)
    assert all(hi > lo for lo, hi in bounds)
    assert all(a[1] == b[0] for a, b in itertools.pairwise(bounds))
    assert len(bounds) <= min(parts, len(sizes))
    if parts == 2:
        first = sizes[: bounds[0][1]].sum()
        assert abs(first - sizes.sum() / 2) <= sizes.max()


def test_workers_come_from_the_environment(monkeypatch):
    monkeypatch.setenv("MEGACPP_WORKERS", "3")
    assert default_workers() == 3
    monkeypatch.setenv("MEGACPP_WORKERS", "0")
    assert default_workers() == 1
    monkeypatch.setenv("MEGACPP_WORKERS", "many")
    with pytest.raises(ValueError, match="MEGACPP_WORKERS='many'"):
        default_workers()


def test_workers_end_even_when_the_parent_defers_sigterm_as_dagster_does():
    # Dagster's run process defers SIGTERM/SIGINT; forked workers inherit that. A pool that
    # ends its workers by signal (terminate) then hung forever in a real run.
    script = """
import signal, sys
import pyarrow as pa
from megacpp_pipeline.core.gate import GateResult
from megacpp_pipeline.pipeline.parallel import ParallelGate
signal.signal(signal.SIGTERM, lambda *a: None)
signal.signal(signal.SIGINT, lambda *a: None)
table = pa.table({"text": ["int x;\\n" * 1000] * 64})
for _ in range(5):
    ParallelGate(lambda t: GateResult(kept=t), 2, min_bytes=0)(table)
def bad(t):
    raise RuntimeError("a.hpp: refused")
try:
    ParallelGate(bad, 2, min_bytes=0)(table)
except RuntimeError as e:
    print("raised:", e)
"""
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True
    )
    assert out.stdout.strip() == "raised: a.hpp: refused"


def test_polars_threads_are_seen_once_a_query_ran_and_not_before():
    # a fresh interpreter: this test process has run polars queries already
    script = (
        "import polars as pl\n"
        "from megacpp_pipeline.pipeline.parallel import polars_threads_run\n"
        "before = polars_threads_run()\n"
        "pl.DataFrame({'a': [1, 2, 2]}).group_by('a').len()\n"
        "print(before, polars_threads_run())\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=120
    )
    assert out.stdout.split() == ["False", "True"]
