"""Directory sources: every file under the root in canonical order (as git lists a tree),
links never followed, special files refused; the revision is a hash of (path, content
hash) pairs, so the same tree gives the same revision."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from pathlib import Path

from megacpp_pipeline.collect.source import (
    CollectError,
    Entry,
    Listed,
    Scope,
    SourceFiles,
    has_control_chars,
)
from megacpp_pipeline.core.catalog import CollectLimits, SourceSpec
from megacpp_pipeline.core.ledger import DropReason


def _walk(root: Path) -> Iterator[tuple[str, os.DirEntry[str]]]:
    """Files in canonical order (full paths increasing, as git lists a tree): a folder sorts
    as `name/`, so `a.h` comes before everything in `a/`. Dedup relies on this order. A
    stack of listings, not recursion: a hostile tree may be thousands of folders deep."""
    stack = [_listing(root, "")]
    while stack:
        item = next(stack[-1], None)
        if item is None:
            stack.pop()
        elif item[0].endswith("/"):
            stack.append(_listing(root, item[1]))
        else:
            yield item[1], item[2]


def _listing(root: Path, rel_dir: str) -> Iterator[tuple[str, str, os.DirEntry[str]]]:
    try:
        with os.scandir(root / rel_dir if rel_dir else root) as it:
            items = [(e.name + "/" if e.is_dir(follow_symlinks=False) else e.name, e) for e in it]
    except OSError:
        return iter(())
    return (
        (key, f"{rel_dir}/{e.name}" if rel_dir else e.name, e)
        for key, e in sorted(items, key=lambda item: item[0])
    )


def dir_source(spec: SourceSpec, uri: str, scope: Scope, limits: CollectLimits) -> SourceFiles:
    root = Path(uri.removeprefix("file://"))
    if spec.subdir:
        root = root / spec.subdir
    if not root.is_dir():
        raise CollectError(f"source {spec.id!r}: {root} is not a directory")
    scope = Scope(spec.model_copy(update={"subdir": None}), scope.keep_also)

    def entries() -> Iterator[Entry]:
        for rel, e in _walk(root):
            try:
                rel.encode("utf-8")
            except UnicodeEncodeError:
                shown = rel.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
                yield Entry(shown, None, DropReason.UNSAFE_PATH, "file name is not UTF-8")
                continue
            if has_control_chars(rel):
                yield Entry(rel, None, DropReason.UNSAFE_PATH, "control character in file name")
            elif e.is_symlink():
                yield Entry(rel, None, DropReason.SYMLINK, "symlinks are never followed")
            elif not e.is_file(follow_symlinks=False):
                yield Entry(rel, None, DropReason.UNSAFE_PATH, "device, fifo or special file")
            elif (drop := scope.classify(rel)) is not None:
                yield drop
            else:
                size = e.stat(follow_symlinks=False).st_size
                if size > limits.max_file_bytes:
                    yield Entry(rel, None, DropReason.TOO_LARGE, f"{size} bytes")
                    continue
                try:
                    with open(e.path, "rb") as f:
                        yield Entry(rel, f.read(limits.max_file_bytes + 1))
                except OSError as err:
                    yield Entry(rel, None, DropReason.UNREADABLE, str(err))

    # The revision is a tree hash of (path, content hash) pairs: one extra hashing pass,
    # cheap next to the gates (read + sha256 runs at hundreds of MB/s).
    tree = hashlib.sha256()
    for entry in entries():
        digest = hashlib.sha256(entry.content).hexdigest() if entry.content is not None else "-"
        tree.update(f"{entry.path}\x00{digest}\n".encode("utf-8", "backslashreplace"))
    return SourceFiles(revision=tree.hexdigest(), entries=entries)


def dir_listing(spec: SourceSpec, uri: str, scope: Scope, limits: CollectLimits) -> Listed:
    """The wanted files under the root and their sizes, from a directory walk (stat only:
    the revision, a hash of the contents, is left to collection)."""
    root = Path(uri.removeprefix("file://"))
    if spec.subdir:
        root = root / spec.subdir
    if not root.is_dir():
        raise CollectError(f"source {spec.id!r}: {root} is not a directory")
    scope = Scope(spec.model_copy(update={"subdir": None}), scope.keep_also)
    files = size = 0
    for rel, e in _walk(root):
        if e.is_symlink() or not e.is_file(follow_symlinks=False) or has_control_chars(rel):
            continue
        if scope.classify(rel) is None:
            n = e.stat(follow_symlinks=False).st_size
            if n <= limits.max_file_bytes:
                files += 1
                size += n
    return Listed(None, files, size, "directory walk")
