"""Keep a long-lived process's memory near what it uses now, not what it once used.

glibc's malloc serves blocks below its mmap threshold from the heap, and raises that
threshold (up to 32 MiB) each time a large mmapped block is freed. A stage that handles
shard-sized arrays and tables then carves them from the heap, where freed holes between
live small objects are rarely handed back: measured on the demo at 16x, the licensed_files
process peaked at 826-977 MB against 717 MB at 4x. With the threshold fixed at 4 MiB
(which also stops the adjustment) every block that large is mapped and unmapped on its
own: 653-667 MB at 16x (587 MB at 4x), for about 15% more time in that stage.

Set once per process: the run's processes, the Dagster steps they fork, and each Ray worker
that runs a task. An operator's own MALLOC_MMAP_THRESHOLD_ wins; other C libraries (musl,
macOS) are left alone.
"""

from __future__ import annotations

import ctypes
import os

import pyarrow as pa

M_MMAP_THRESHOLD = -3  # mallopt's parameter number, from glibc's malloc.h
MMAP_THRESHOLD_BYTES = 4 << 20
ENV = "MALLOC_MMAP_THRESHOLD_"

_done = False


def bound_malloc() -> bool:
    """Fix glibc's mmap threshold for this process (and the ones it forks later); True when
    set here, False when the operator set it, or the C library is not glibc."""
    global _done
    if _done:
        return False
    _done = True
    if ENV in os.environ:
        return False
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):
        return False
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES))


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
