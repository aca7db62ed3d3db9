"""Durable writes for the converter's commit steps: a file replaced atomically with its
directory entry synced, and appends synced, so that a crash leaves on disk either the old
bytes or the new ones, never a part, and nothing the resume state counts is lost.
"""

from __future__ import annotations

import os
from pathlib import Path


def fsync_dir(directory: Path) -> None:
    """Make a rename or a new file in `directory` survive a crash."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_file(path: Path) -> None:
    """Flush a file another writer (pyarrow) wrote, before it is renamed into place."""
    with open(path, "rb") as f:
        os.fsync(f.fileno())


def write_atomic(path: Path, data: bytes) -> None:
    """`path` holds its old bytes or all of `data`. The scratch file is `<name>.tmp`, which a
    resume deletes (output.py) when a crash left it behind."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


def append_synced(path: Path, data: bytes) -> None:
    """Append `data` and fsync it, so it is on disk before the state that counts it."""
    with open(path, "ab") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
