"""Git sources: the tree at the pinned commit, read through the git CLI (`ls-tree`, then
`cat-file --batch`), never checked out; a remote is mirrored bare into the cache. Nothing in
the repository runs (no hooks, no filters: blobs are read raw)."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from megacpp_pipeline.collect.source import (
    READ_CHUNK,
    CollectError,
    Entry,
    Listed,
    Scope,
    SourceFiles,
    decode_name,
    link_drop,
    too_large,
)
from megacpp_pipeline.core.catalog import CollectLimits, SourceSpec
from megacpp_pipeline.core.ledger import DropReason


def _git(args: list[str], cwd: str | None = None, **kw: object) -> subprocess.CompletedProcess:
    env = {**os.environ, "GIT_TERMINAL_PROMPT": "0", "GIT_CONFIG_NOSYSTEM": "1"}
    return subprocess.run(
        ["git", *args],
        cwd=cwd,
        capture_output=True,
        env=env,
        check=False,
        **kw,  # type: ignore[call-overload]
    )


def _git_repo(uri: str, cache_dir: Path, source_id: str, revision: str | None) -> str:
    """A local repository holding the pinned commit: the path itself, or a bare mirror."""
    local = uri.removeprefix("file://") if uri.startswith("file://") else uri
    if "://" not in local and Path(local).exists():
        return local
    mirror = cache_dir / "git" / f"{source_id}-{hashlib.sha1(uri.encode()).hexdigest()[:12]}.git"
    if not mirror.exists():
        mirror.parent.mkdir(parents=True, exist_ok=True)
        tmp = mirror.with_suffix(".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        r = _git(["clone", "--bare", "--quiet", uri, str(tmp)])
        if r.returncode != 0:
            raise CollectError(f"{uri}: git clone failed: {r.stderr.decode(errors='replace')}")
        tmp.rename(mirror)
    elif (
        revision is None
        or _git(["cat-file", "-e", f"{revision}^{{commit}}"], str(mirror)).returncode
    ):
        _git(["fetch", "--quiet", "origin", "+refs/heads/*:refs/heads/*"], str(mirror))
    return str(mirror)


def commit_exists(repo: str, revision: str) -> bool:
    """Whether a local repository holds the pinned commit (read-only `git cat-file -e`)."""
    return _git(["cat-file", "-e", f"{revision}^{{commit}}"], repo).returncode == 0


def resolve_branch(uri: str, branch: str) -> str:
    """The commit a tracked branch points at now (pinned into that run's manifest)."""
    r = _git(["ls-remote", uri, f"refs/heads/{branch}"])
    line = r.stdout.decode().split("\n", 1)[0]
    if r.returncode != 0 or not line:
        raise CollectError(f"{uri}: branch {branch!r} not found ({r.stderr.decode().strip()})")
    return line.split()[0]


def git_source(
    spec: SourceSpec,
    uri: str,
    cache_dir: Path,
    scope: Scope,
    limits: CollectLimits,
    max_file_bytes: int,
) -> SourceFiles:
    revision = spec.revision or (resolve_branch(uri, spec.track) if spec.track else None)
    if revision is None:
        raise CollectError(f"source {spec.id!r}: no revision to collect")
    repo = _git_repo(uri, cache_dir, spec.id, revision)
    r = _git(["cat-file", "-e", f"{revision}^{{commit}}"], repo)
    if r.returncode != 0:
        raise CollectError(f"source {spec.id!r}: pinned commit {revision} does not exist in {uri}")

    def entries() -> Iterator[Entry]:
        listing = _git(["ls-tree", "-r", "-z", "--full-tree", revision], repo)
        if listing.returncode != 0:
            raise CollectError(f"source {spec.id!r}: git ls-tree {revision} failed")
        records = []
        for record in listing.stdout.split(b"\x00"):
            if record:
                meta, raw_path = record.split(b"\t", 1)
                name, ok = decode_name(raw_path)
                records.append((name, ok, *meta.decode().split()))
        # in the order of the paths the ledger holds (git's is of the bytes; they differ
        # where a name's bytes are escaped), drops in their places among the blobs
        records.sort(key=lambda r: r[0])
        items: list[Entry | tuple[str, str, bool]] = []  # (path, blob, is a symlink)
        for name, ok, mode, kind, obj in records:
            rel = scope.relative(name)
            if rel is None:
                continue
            if not ok:
                items.append(Entry(rel, None, DropReason.UNSAFE_PATH, "file name is not UTF-8"))
            elif kind != "blob":
                items.append(Entry(rel, None, DropReason.NOT_INCLUDED, f"git {kind} (submodule)"))
            elif mode == "120000":
                items.append((rel, obj, True))  # its target says whether git-annex made it
            elif (drop := scope.classify(rel)) is not None:
                items.append(drop)
            else:
                items.append((rel, obj, False))
        yield from _git_blobs(repo, items, limits, max_file_bytes)

    return SourceFiles(revision=revision, entries=entries)


# A symlink's blob is its target path; longer than this is no link git-annex made.
_LINK_TARGET_BYTES = 4096


def _git_blobs(
    repo: str,
    items: list[Entry | tuple[str, str, bool]],
    limits: CollectLimits,
    max_file_bytes: int,
) -> Iterator[Entry]:
    """`items` in order: a drop entry as it is, a (path, blob, is a symlink) read."""
    proc = subprocess.Popen(
        ["git", "cat-file", "--batch"], cwd=repo, stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    assert proc.stdin is not None and proc.stdout is not None
    try:
        for item in items:
            if isinstance(item, Entry):
                yield item
                continue
            rel, obj, is_link = item
            proc.stdin.write(obj.encode() + b"\n")
            proc.stdin.flush()
            header = proc.stdout.readline().split()
            size = int(header[2])
            if is_link:
                target = proc.stdout.read(size) if size <= _LINK_TARGET_BYTES else None
                if target is None:
                    _skip(proc.stdout, size)
                proc.stdout.read(1)
                yield link_drop(rel, target.decode("utf-8", "replace") if target else None)
                continue
            if size > max_file_bytes:
                _skip(proc.stdout, size + 1)
                yield too_large(rel, size, max_file_bytes)
                continue
            data = proc.stdout.read(size)
            proc.stdout.read(1)
            yield Entry(rel, data)
    finally:
        proc.stdin.close()
        proc.wait()


def _skip(stream: IO[bytes], n: int) -> None:
    while n > 0:
        n -= len(stream.read(min(n, READ_CHUNK)) or b"x" * n)


def git_listing(
    spec: SourceSpec, uri: str, cache_dir: Path, scope: Scope, max_file_bytes: int
) -> Listed:
    """The wanted blobs at the pinned (or tracked) commit and their sizes, from `git ls-tree
    -r -l` alone: no blob is read (a remote is mirrored bare into the cache, as collection
    would)."""
    revision = spec.revision or (resolve_branch(uri, spec.track) if spec.track else None)
    if revision is None:
        raise CollectError(f"source {spec.id!r}: no revision to list")
    repo = _git_repo(uri, cache_dir, spec.id, revision)
    listing = _git(["ls-tree", "-r", "-l", "-z", "--full-tree", revision], repo)
    if listing.returncode != 0:
        raise CollectError(f"source {spec.id!r}: git ls-tree {revision} failed in {uri}")
    files = size = 0
    for record in listing.stdout.split(b"\x00"):
        if not record:
            continue
        meta, raw_path = record.split(b"\t", 1)
        mode, kind, _obj, blob_size = meta.decode().split()
        name, ok = decode_name(raw_path)
        rel = scope.relative(name)
        if rel is None or not ok or kind != "blob" or mode == "120000":
            continue
        if scope.classify(rel) is None and int(blob_size) <= max_file_bytes:
            files += 1
            size += int(blob_size)
    return Listed(revision, files, size, f"git ls-tree -r -l {revision[:12]}")
