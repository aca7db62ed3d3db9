"""The result cache as an operator checks it (`megacpp cache verify`) and trims it (`megacpp
cache prune`): every entry proven exactly as a run proves it before use; what a crash left
(parts without an index, temp files) and what no current code version reads any more (a
stage's namespaces of older code or config) found and, when pruning, removed."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field

import pyarrow.fs as pafs

from megacpp_pipeline.storage.file_cache import (
    ENTRY_SUFFIX,
    KEY,
    TMP_SUFFIX,
    EntryRejected,
    OlderFormat,
    prove_entry,
    read_index,
    remove_entry,
)

# Debris younger than this may belong to a writer still at work (its index comes last).
DEBRIS_MIN_AGE_S = 3600.0


@dataclass
class CacheAudit:
    root: str
    entries: int = 0  # entries that proved themselves
    files: int = 0  # files those entries answer for
    broken: list[tuple[str, str]] = field(default_factory=list)  # (index path, why)
    debris: list[tuple[str, float]] = field(default_factory=list)  # (path, age in seconds)
    stale: list[tuple[str, str]] = field(default_factory=list)  # (namespace folder, why)


def _children(fs: pafs.FileSystem, path: str) -> list[pafs.FileInfo]:
    try:
        return sorted(
            fs.get_file_info(pafs.FileSelector(path, allow_not_found=True)),
            key=lambda i: i.base_name,
        )
    except OSError:
        return []


def _folders(fs: pafs.FileSystem, path: str) -> list[pafs.FileInfo]:
    return [i for i in _children(fs, path) if i.type == pafs.FileType.Directory]


def audit(
    fs: pafs.FileSystem,
    root: str,
    *,
    current: Mapping[str, set[str]] | None = None,
    now: float | None = None,
) -> CacheAudit:
    """Every entry under `root` (<stage>/<namespace>/<source>/) proven; with `current`
    (stage -> the code versions its sources use now), the namespaces nothing reads."""
    now = time.time() if now is None else now
    out = CacheAudit(root)
    for stage in _folders(fs, root):
        for namespace in _folders(fs, stage.path):
            code_versions: set[str] = set()
            legacy = [0]
            for source in _folders(fs, namespace.path):
                _audit_folder(fs, source.path, out, code_versions, legacy, now)
            if legacy[0] and not code_versions:
                out.stale.append((namespace.path, "entries of an older format, which no run reads"))
            elif current is not None:
                why = _stale(stage.base_name, code_versions, current)
                if why:
                    out.stale.append((namespace.path, why))
    return out


def _stale(stage: str, code_versions: set[str], current: Mapping[str, set[str]]) -> str | None:
    if stage not in current:
        return f"no per-file stage {stage!r} in the registry"
    old = code_versions - current[stage]
    if code_versions and not code_versions & current[stage]:
        return f"written by code version {', '.join(sorted(old))}; {stage} is now at " + (
            ", ".join(sorted(current[stage])) or "none"
        )
    return None


def _audit_folder(
    fs: pafs.FileSystem,
    folder: str,
    out: CacheAudit,
    code_versions: set[str],
    legacy: list[int],
    now: float,
) -> None:
    infos = [i for i in _children(fs, folder) if i.type == pafs.FileType.File]
    names = {i.base_name for i in infos}
    for info in infos:
        name = info.base_name
        age = now - info.mtime.timestamp() if info.mtime is not None else now
        if name.endswith(TMP_SUFFIX):
            out.debris.append((info.path, age))
            continue
        if not (name.startswith("e-") and name.endswith(ENTRY_SUFFIX)):
            continue
        entry = name.split(".", 1)[0]
        if name.count(".") != 1:  # a part: debris unless its index is there
            if f"{entry}{ENTRY_SUFFIX}" not in names:
                out.debris.append((info.path, age))
            continue
        try:
            index = read_index(fs, info.path, None)
            prove_entry(fs, folder, entry, index)
        except OlderFormat:
            legacy[0] += 1
            continue
        except EntryRejected as e:
            out.broken.append((info.path, str(e)))
            continue
        code = (index.schema.metadata or {}).get(b"megacpp.cache.code_version", b"").decode()
        code_versions.add(code)
        out.entries += 1
        out.files += len(index[KEY])


def prune(
    fs: pafs.FileSystem,
    found: CacheAudit,
    *,
    min_age_s: float = DEBRIS_MIN_AGE_S,
    dry_run: bool = False,
) -> list[str]:
    """Remove the broken entries, the stale namespaces and debris older than `min_age_s`;
    each removed path with why (nothing is removed with `dry_run`)."""
    removed: list[str] = []
    for path, why in found.broken:
        folder, name = path.rsplit("/", 1)
        if not dry_run:
            remove_entry(fs, folder, name.split(".", 1)[0])
        removed.append(f"{path}: {why}")
    for folder, why in found.stale:
        if not dry_run:
            try:
                fs.delete_dir(folder)
            except OSError:
                continue
        removed.append(f"{folder}/: {why}")
    for path, age in found.debris:
        if age < min_age_s:
            continue
        if not dry_run:
            try:
                fs.delete_file(path)
            except OSError:
                continue
        removed.append(f"{path}: left by a writer that did not finish ({age / 3600:.1f} h old)")
    return removed
