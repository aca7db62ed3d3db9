"""Keep a long-lived process's memory near what it uses now, not what it once used.

glibc's malloc serves blocks below its mmap threshold from the heap, and raises that
threshold (up to 32 MiB) each time a large mmapped block is freed. A stage that handles
shard-sized arrays and tables then carves them from the heap, where freed holes between
live small objects are rarely handed back: measured on the demo at 16x, the licensed_files
process peaked at 826-977 MB against 717 MB at 4x. With the threshold fixed at 4 MiB
(which also stops the adjustment) every block that large is mapped and unmapped on its
own: 653-667 MB at 16x (587 MB at 4x), for about 15% more time in that stage.

Fixing that threshold also fixes the trim threshold at its default, 128 KiB: each time the
top of the heap held that much free, glibc handed it back, and the next block below the
mmap threshold (a file's bytes, a row's text) took fresh, zeroed pages from the kernel
again. The collect-to-scrub group at 16x took about 910,000 page faults that way, 4.5-6.5
CPU s of kernel time in a group of 30. In the workers, where that churn is, the trim
threshold is fixed at 32 MiB (`keep_heap_top`): at most that much free heap stays with a
worker (a constant, whatever the corpus), the group takes about 300,000 faults and costs
1-3 CPU s less, the workers' peaks unchanged (docs/scaling.md §2). The drivers keep
glibc's 128 KiB: their peak is a target (at demo 64x within 1.1x of 16x), and with 32 MiB
the first group's driver peaked 8 MB higher at 64x. `release_memory` still trims the heap
whole between phases.

Set once per process: `bound_malloc` in the run's processes, the Dagster steps they fork and
each Ray worker that runs a task; `keep_heap_top` in each worker besides. An operator's own
MALLOC_MMAP_THRESHOLD_ or MALLOC_TRIM_THRESHOLD_ wins; other C libraries (musl, macOS) are
left alone.
"""

from __future__ import annotations

import ctypes
import os

import pyarrow as pa

M_MMAP_THRESHOLD = -3  # mallopt's parameter numbers, from glibc's malloc.h
M_TRIM_THRESHOLD = -1
MMAP_THRESHOLD_BYTES = 4 << 20
TRIM_THRESHOLD_BYTES = 32 << 20
ENV = "MALLOC_MMAP_THRESHOLD_"
TRIM_ENV = "MALLOC_TRIM_THRESHOLD_"

_done = False
_kept = False


def bound_malloc() -> bool:
    """Fix glibc's mmap threshold for this process (and the ones it forks later); True when
    set here, False when the operator set it, or the C library is not glibc."""
    global _done
    if _done:
        return False
    _done = True
    return ENV not in os.environ and _mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)


def keep_heap_top() -> bool:
    """Fix glibc's trim threshold for this worker process at TRIM_THRESHOLD_BYTES; True when
    set here, False when the operator set it, or the C library is not glibc."""
    global _kept
    if _kept:
        return False
    _kept = True
    return TRIM_ENV not in os.environ and _mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES)


def _mallopt(param: int, value: int) -> bool:
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):
        return False
    return bool(mallopt(param, value))


def release_memory() -> None:
    """Hand what this process freed back to the system: Arrow's pool keeps freed pages for
    reuse, and glibc keeps the free top of its heaps. Called between the phases of a long
    step (the snapshot's promotion checks), so each starts near what is live, not at the
    high-water mark of the one before: at demo 64x the snapshot's checks peaked at 387 MB
    one after another, 329 MB with this between them."""
    pa.default_memory_pool().release_unused()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass
