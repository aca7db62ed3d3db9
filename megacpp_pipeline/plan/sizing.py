"""What a plan is sized by, read without collecting any text: each operational source's files
and bytes (collect.list_source: git trees by `ls-tree -l`, archive member lists, directory
walks), what the data dir already holds (a local walk, or an object store's listing for an
`s3://` data dir), the free disk where the run writes, and this host's memory."""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import pyarrow.fs as pafs

from megacpp_pipeline import collect
from megacpp_pipeline.collect import Listed
from megacpp_pipeline.core.catalog import Catalog, SourceSpec
from megacpp_pipeline.snapshot.shard_checks import Mapper, inline
from megacpp_pipeline.storage.filesystem import is_local, resolve

MB = 1e6  # as the bench counts


@dataclass(frozen=True)
class SourceSize:
    source: str
    kind: str
    listed: Listed


def size_sources(catalog: Catalog, cache_dir: Path, mapper: Mapper = inline) -> list[SourceSize]:
    """Every operational source listed, each a task of `mapper` (an executor's map: sources
    are listed side by side): files collection would keep and their bytes."""
    return list(mapper(_size_one, (catalog, cache_dir), list(catalog.operational)))


def _size_one(job: tuple[Catalog, Path], spec: SourceSpec) -> SourceSize:
    catalog, cache_dir = job
    listed = collect.list_source(
        spec,
        catalog.resolve_uri(spec),
        cache_dir=cache_dir,
        limits=catalog.collect,
        max_file_bytes=catalog.file_limit(spec),
    )
    return SourceSize(spec.id, spec.kind, listed)


@dataclass(frozen=True)
class StoreUsage:
    """What a data dir holds now."""

    local: bool
    objects: int
    bytes: int


def store_usage(data_dir: str) -> StoreUsage:
    """Objects and bytes under the data dir: an object store's listing (no object is read),
    or a walk of a local folder (none yet: nothing)."""
    fs, root = resolve(data_dir)
    objects = size = 0
    for info in fs.get_file_info(pafs.FileSelector(root, recursive=True, allow_not_found=True)):
        if info.type == pafs.FileType.File:
            objects += 1
            size += info.size or 0
    return StoreUsage(is_local(fs), objects, size)


def free_disk_mb(path: str | Path) -> float:
    """Free space on the filesystem that holds `path` (or would: its nearest existing
    parent)."""
    p = Path(path).absolute()
    while not p.exists() and p != p.parent:
        p = p.parent
    return shutil.disk_usage(p).free / MB


def host_memory_mb() -> float:
    """This host's memory (MemTotal), in MB."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024 / MB
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / MB
