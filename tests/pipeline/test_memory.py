"""bound_malloc for real, in fresh interpreters: after a large block has been freed (which
raises glibc's dynamic mmap threshold), shard-sized blocks freed between live small objects
go back to the system only when the threshold is fixed; and in a worker a block freed at the
top of the heap stays there for the next one, instead of being handed back and faulted in
again."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

PROGRAM = """
import sys
from megacpp_pipeline.pipeline.memory import bound_malloc
if sys.argv[1] == "bound":
    assert bound_malloc()
page = 4096
def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * page
big = bytearray(24 << 20); big[::page] = b"x" * len(big[::page]); del big  # threshold -> 24 MiB
blocks, small = [], []
for i in range(40):
    b = bytearray(5 << 20)
    b[::page] = b"y" * len(b[::page])  # touch every page
    blocks.append(b)
    small.append(bytearray(200))  # a live small object after each block
before = rss()
del blocks
print(before - rss())
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc")
@pytest.mark.parametrize("mode", ["bound", "default"])
def test_freed_shard_sized_blocks_go_back_only_with_the_threshold_fixed(mode: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    out = subprocess.run(
        [sys.executable, "-c", PROGRAM, mode], env=env, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    released = int(out.stdout)
    if mode == "bound":
        assert released > 150 << 20  # most of the 200 MiB
    else:
        assert released < 50 << 20  # held in the heap between the small objects


CHURN_PROGRAM = """
import resource, sys
from megacpp_pipeline.pipeline.memory import bound_malloc, keep_heap_top
assert bound_malloc()
if sys.argv[1] == "worker":
    assert keep_heap_top()
page = 4096
def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
keep = bytearray(100)
before = faults()
for i in range(100):  # a 2 MiB block (a file's bytes, say), touched and freed, 100 times
    b = bytearray(2 << 20)
    b[::page] = b"z" * len(b[::page])
    del b
print(faults() - before)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc")
@pytest.mark.parametrize("process", ["worker", "driver"])
def test_a_block_freed_at_a_workers_heap_top_is_reused_not_faulted_in_again(
    process: str,
) -> None:
    # with the mmap threshold fixed, glibc's own trim threshold (128 KiB, which fixing the
    # one fixes the other at) hands each freed block back and faults the next one in again;
    # a driver keeps it (its peak is a target), a worker keeps 32 MiB of its heap's top
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    out = subprocess.run(
        [sys.executable, "-c", CHURN_PROGRAM, process], env=env, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    faults = int(out.stdout)
    pages = (2 << 20) // 4096
    if process == "worker":
        assert faults < 5 * pages  # the first block's pages, then the same ones again
    else:
        assert faults > 50 * pages  # each block's pages zeroed afresh


@pytest.mark.parametrize(
    ("setting", "function"),
    [("MALLOC_MMAP_THRESHOLD_", "bound_malloc"), ("MALLOC_TRIM_THRESHOLD_", "keep_heap_top")],
)
def test_an_operators_own_threshold_is_left_alone(setting: str, function: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    code = f"from megacpp_pipeline.pipeline.memory import {function}; print({function}())"
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert run.stdout.strip() == "True", run.stderr
    env[setting] = "131072"
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert run.stdout.strip() == "False", run.stderr


RELEASE_PROGRAM = """
import sys
import numpy as np
import pyarrow as pa
from megacpp_pipeline.pipeline.memory import release_memory
def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096
arrays, live = [], []
for i in range(64):  # 2 MiB buffers from Arrow's pool, a small live one after each
    arrays.append(pa.array(np.arange(1 << 18, dtype=np.int64)).take(pa.array(np.arange(1 << 18))))
    live.append(pa.array([i]))
before = rss()
del arrays
if sys.argv[1] == "release":
    release_memory()
print(before - rss())
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="resident set from /proc")
def test_release_memory_hands_arrow_s_freed_pages_back() -> None:
    # freed Arrow buffers stay in the process (its pool keeps them for reuse) until released
    def returned(mode: str) -> int:
        out = subprocess.run(
            [sys.executable, "-c", RELEASE_PROGRAM, mode], capture_output=True, text=True
        )
        assert out.returncode == 0, out.stderr
        return int(out.stdout)

    assert returned("keep") < 16 << 20
    assert returned("release") > 96 << 20
