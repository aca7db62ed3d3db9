"""Directory sources: every file under the root in canonical order (as git lists a tree),
links never followed, special files refused; the revision is a hash of (path, content
hash) pairs, so the same tree gives the same revision."""

from __future__ import annotations

import errno
import hashlib
import os
import stat
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple, cast

from megacpp_pipeline.collect.source import (
    CollectError,
    Entry,
    Listed,
    Scope,
    SourceFiles,
    has_control_chars,
    is_utf8,
    link_drop,
    name_of,
    too_large,
)
from megacpp_pipeline.core.catalog import CollectLimits, SourceSpec
from megacpp_pipeline.core.ledger import DropReason


@dataclass(frozen=True)
class WalkUnit:
    """Consecutive entries of one folder's listing, keys `first`..`last` as the walk sorts
    them (a folder as `name/`; `last` None: to the end), each walked whole. A tree's units
    (`walk_units`), one after another, walk it exactly as one walk of the root does."""

    dir: str = ""  # the folder, relative to the root as the walk names it ("": the root)
    first: str = ""
    last: str | None = None
    # a run of a folder too large for one unit: its entries' names as the folder listed
    # them, so the unit's task looks up its own entries instead of listing the whole folder
    # again (a folder cut into 64 runs would be listed and sorted 64 times)
    names: tuple[str, ...] | None = None

    def holds(self, key: str) -> bool:
        return self.first <= key and (self.last is None or key <= self.last)


# Units a directory source's walk is cut into, where its folders allow: the walk is one
# task per unit (a stat per file: 17 us a file here, so a single 50M-file tree would take
# one process about 14 minutes). Fixed, not the number of workers, so that the same tree
# is cut the same way whatever walks it.
WALK_UNITS = 64
WALK_UNIT_DEPTH = 3  # folders below the root a unit may start in


def walk_units(root: Path, want: int | None = None, depth: int | None = None) -> list[WalkUnit]:
    """The tree under `root` cut into about `want` units in walk order (fewer where its
    folders are few): a folder's listing in consecutive runs, each folder given a share of
    `want` and cut again below, `depth` folders down at most (WALK_UNITS, WALK_UNIT_DEPTH
    when not given). Lists folders, reads no file."""
    want = WALK_UNITS if want is None else want
    depth = WALK_UNIT_DEPTH if depth is None else depth
    if want <= 1 or depth <= 0:
        return [WalkUnit()]
    try:
        units = _units(root, "", want, depth)
    except OSError as err:
        raise CollectError(f"{root}: the source's folder cannot be listed ({err})") from err
    assert units is not None
    return units


def _units(root: Path, rel_dir: str, want: int, depth: int) -> list[WalkUnit] | None:
    """None when `rel_dir` cannot be listed (the walk then meets it and ledgers it)."""
    try:
        listed = list(_listing(root, rel_dir))
    except OSError:
        if not rel_dir:
            raise
        return None
    listing = [(key, rel) for key, rel, _ in listed]
    keys = [key for key, _ in listing]
    if len(keys) >= want:  # runs of about len / want entries
        step = -(-len(keys) // want)
        return [
            WalkUnit(
                rel_dir,
                keys[i],
                keys[min(i + step, len(keys)) - 1],
                tuple(e.name for _, _, e in listed[i : i + step]),
            )
            for i in range(0, len(keys), step)
        ]
    folders = [key for key in keys if key.endswith("/")]
    share = want // max(1, len(folders))
    out: list[WalkUnit] = []
    files: list[str] = []  # a run of entries that are no folder: one unit
    for key, rel in listing:
        if not key.endswith("/"):
            files.append(key)
            continue
        if files:
            out.append(WalkUnit(rel_dir, files[0], files[-1]))
            files = []
        below = _units(root, rel, share, depth - 1) if share > 1 and depth > 1 else None
        out += below if below is not None else [WalkUnit(rel_dir, key, key)]
    if files:
        out.append(WalkUnit(rel_dir, files[0], files[-1]))
    return out


def _walk(
    root: Path, unit: WalkUnit | None = None
) -> Iterator[tuple[str, os.DirEntry[str] | Unlistable]]:
    """Files in canonical order (full ledger paths increasing, as git lists a tree): a folder
    sorts as `name/`, so `a.h` comes before everything in `a/`. Dedup relies on this order. A
    stack of listings, not recursion: a hostile tree may be thousands of folders deep. With
    `unit`, only its entries (each walked whole)."""
    if unit is not None and unit.names is not None:
        top = _named(root, unit.dir, unit.names)
    else:
        try:
            top = _listing(root, unit.dir if unit is not None else "")
        except OSError as err:
            if unit is None or not unit.dir:
                raise CollectError(f"{root}: the source's folder cannot be listed ({err})") from err
            yield unit.dir, Unlistable(err)  # listed when the units were planned, not now
            return
        if unit is not None and (unit.first or unit.last is not None):
            top = (item for item in top if unit.holds(item[0]))
    stack = [top]
    while stack:
        item = next(stack[-1], None)
        if item is None:
            stack.pop()
        elif item[0].endswith("/"):
            try:
                stack.append(_listing(root, item[1]))
            except OSError as err:
                yield item[1], Unlistable(err)
        else:
            yield item[1], item[2]


@dataclass(frozen=True)
class Unlistable:
    """A folder the walk met and could not list: its files cannot be named, so the folder
    itself takes the ledger row that says why they are not collected."""

    error: OSError

    def why(self) -> str:
        return (
            f"folder cannot be listed ({self.error.strerror or self.error}): "
            "the files in it are not collected"
        )


def _listing(root: Path, rel_dir: str) -> Iterator[tuple[str, str, os.DirEntry[str]]]:
    """A folder's entries, sorted; raises OSError when the folder cannot be listed."""
    with os.scandir(root / rel_dir if rel_dir else root) as it:
        # sorted by the name as the ledger spells it (non-UTF-8 bytes and backslashes
        # escaped), so every stream of a source is in the order of its ledger paths
        items = [
            (name_of(e.name) + ("/" if e.is_dir(follow_symlinks=False) else ""), e) for e in it
        ]
    return (
        (key, f"{rel_dir}/{e.name}" if rel_dir else e.name, e)
        for key, e in sorted(items, key=lambda item: item[0])
    )


class _NamedEntry:
    """What the walk asks of an os.DirEntry, for an entry known by name: one lstat."""

    __slots__ = ("_stat", "name", "path")

    def __init__(self, folder: str, name: str, st: os.stat_result) -> None:
        self.name = name
        self.path = os.path.join(folder, name)
        self._stat = st

    def is_dir(self, *, follow_symlinks: bool = True) -> bool:
        assert not follow_symlinks
        return stat.S_ISDIR(self._stat.st_mode)

    def is_file(self, *, follow_symlinks: bool = True) -> bool:
        assert not follow_symlinks
        return stat.S_ISREG(self._stat.st_mode)

    def is_symlink(self) -> bool:
        return stat.S_ISLNK(self._stat.st_mode)

    def stat(self, *, follow_symlinks: bool = True) -> os.stat_result:
        assert not follow_symlinks
        return self._stat


def _named(
    root: Path, rel_dir: str, names: Iterable[str]
) -> Iterator[tuple[str, str, os.DirEntry[str]]]:
    """`_listing` of the entries of a folder named in `names` (one lstat each; a name gone
    since the units were planned is left out, as a listing made now would)."""
    folder = str(root / rel_dir if rel_dir else root)
    items = []
    for name in names:
        try:
            st = os.lstat(os.path.join(folder, name))
        except OSError:
            continue
        entry = _NamedEntry(folder, name, st)
        items.append((name_of(name) + ("/" if entry.is_dir(follow_symlinks=False) else ""), entry))
    return (
        (key, f"{rel_dir}/{e.name}" if rel_dir else e.name, cast("os.DirEntry[str]", e))
        for key, e in sorted(items, key=lambda item: item[0])
    )


def _rooted(spec: SourceSpec, uri: str, scope: Scope) -> tuple[Path, Scope]:
    """The folder a dir source collects (its subdir applied) and the scope relative to it."""
    root = Path(uri.removeprefix("file://"))
    if spec.subdir:
        root = root / spec.subdir
    if not root.is_dir():
        raise CollectError(f"source {spec.id!r}: {root} is not a directory")
    return root, Scope(spec.model_copy(update={"subdir": None}), scope.keep_also)


class ToRead(NamedTuple):
    """A file the walk found wanted and within the size policy: read when collected (a
    tuple: a slice of thousands of them goes to a task and back cheaply)."""

    path: str  # as the ledger spells it
    os_path: str  # where it is (the walk's own name, non-UTF-8 bytes and all)
    size: int  # at the walk: what slices are cut by


def _walked(
    root: Path, scope: Scope, max_file_bytes: int, unit: WalkUnit | None = None
) -> Iterator[Entry | ToRead]:
    """The tree (or one unit of it) in canonical order: a drop decided by the walk (names,
    links, special files, the scope, the size policy) as its Entry, every other file as a
    ToRead."""
    for raw, e in _walk(root, unit):
        rel = name_of(raw)  # os.scandir's name with its non-UTF-8 bytes escaped
        if isinstance(e, Unlistable):
            yield Entry(rel, None, DropReason.UNREADABLE, e.why())
        elif not is_utf8(raw):
            yield Entry(rel, None, DropReason.UNSAFE_PATH, "file name is not UTF-8")
        elif has_control_chars(rel):
            yield Entry(rel, None, DropReason.UNSAFE_PATH, "control character in file name")
        elif e.is_symlink():
            yield link_drop(rel, _link_target(e.path))
        elif not e.is_file(follow_symlinks=False):
            yield Entry(rel, None, DropReason.UNSAFE_PATH, "device, fifo or special file")
        elif (drop := scope.classify(rel)) is not None:
            yield drop
        else:
            size = e.stat(follow_symlinks=False).st_size
            if size > max_file_bytes:
                yield too_large(rel, size, max_file_bytes)
            else:
                yield ToRead(rel, e.path, size)


def read_entry(item: Entry | ToRead, max_file_bytes: int) -> Entry:
    """A walked item as collection sees it: a ToRead read (no more than the limit)."""
    if isinstance(item, Entry):
        return item
    try:
        # the walk saw a regular file; what is there now may be a link (O_NOFOLLOW: it is
        # never followed out of the tree) or a fifo (O_NONBLOCK: opening it cannot hang)
        fd = os.open(item.os_path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as err:
        if err.errno == errno.ELOOP:
            return Entry(item.path, None, DropReason.SYMLINK, "became a link since the walk")
        return Entry(item.path, None, DropReason.UNREADABLE, str(err))
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            why = "became a device, fifo or special file since the walk"
            return Entry(item.path, None, DropReason.UNSAFE_PATH, why)
        try:
            data = _read_at_most(fd, st.st_size, max_file_bytes + 1)
        except OSError as err:
            return Entry(item.path, None, DropReason.UNREADABLE, str(err))
    finally:
        os.close(fd)
    if len(data) > max_file_bytes:  # it grew since the listing
        return too_large(item.path, len(data), max_file_bytes)
    return Entry(item.path, data)


def _read_at_most(fd: int, size: int, limit: int) -> bytes:
    """Up to `limit` bytes of the open file, to its end: one read of the `size` it had (and a
    byte more, to see it grew) and one that finds the end, straight from the descriptor (a
    buffered reader costs as much again as the reads, over tens of thousands of files)."""
    parts: list[bytes] = []
    done, first = 0, min(size + 1, limit)
    while done < limit:
        block = os.read(fd, first - done if done < first else min(1 << 20, limit - done))
        if not block:
            break
        parts.append(block)
        done += len(block)
    return parts[0] if len(parts) == 1 else b"".join(parts)


def _digest(e: Entry) -> str | None:
    return hashlib.sha256(e.content).hexdigest() if e.content is not None else None


def entry_digests(entries: Iterable[Entry]) -> list[str | None]:
    """Each entry's content sha256 (hex); None for a file not read."""
    return [_digest(e) for e in entries]


def tree_lines(entries: Iterable[Entry], digests: Iterable[str | None] | None = None) -> bytes:
    """What the revision hashes of these entries, in order: a directory's revision is the
    sha256 of the concatenation of every slice's lines, the same however it is sliced. A
    file read is its content's sha256; one not read, why (the reason and the detail its
    ledger row gives, a size over the limit say), so the revision moves with the ledger."""
    lines = []
    if digests is None:
        pairs: Iterable[tuple[Entry, str | None]] = ((e, _digest(e)) for e in entries)
    else:
        pairs = zip(entries, digests, strict=True)
    for e, digest in pairs:
        what = digest if digest is not None else f"-{e.reason or ''}\x00{e.detail or ''}"
        lines.append(f"{e.path}\x00{what}\n".encode("utf-8", "backslashreplace"))
    return b"".join(lines)


def dir_source(
    spec: SourceSpec, uri: str, scope: Scope, limits: CollectLimits, max_file_bytes: int
) -> SourceFiles:
    root, scope = _rooted(spec, uri, scope)

    def entries() -> Iterator[Entry]:
        for item in _walked(root, scope, max_file_bytes):
            yield read_entry(item, max_file_bytes)

    # The revision is a tree hash of (path, content hash) pairs: one extra hashing pass,
    # cheap next to the gates (read + sha256 runs at hundreds of MB/s).
    tree = hashlib.sha256()
    for entry in entries():
        tree.update(tree_lines((entry,)))
    return SourceFiles(revision=tree.hexdigest(), entries=entries)


# A slice of a directory source: about one shard of rows (collect_batches' batch size)
SLICE_BYTES = 16 << 20
SLICE_FILES = 5000


def dir_slices(
    spec: SourceSpec, uri: str, scope: Scope, max_file_bytes: int, unit: WalkUnit | None = None
) -> list[tuple[Entry | ToRead, ...]]:
    """The walk (of `unit`, or of the whole tree) cut into consecutive slices of about
    SLICE_BYTES (by the sizes the walk saw) or SLICE_FILES items: the same slices whatever
    runs them. Empty for an empty tree. The list holds every path it walked (about 100
    bytes a file in the process that plans them)."""
    root, scope = _rooted(spec, uri, scope)
    out: list[tuple[Entry | ToRead, ...]] = []
    items: list[Entry | ToRead] = []
    size = 0
    for item in _walked(root, scope, max_file_bytes, unit):
        items.append(item)
        size += item.size if isinstance(item, ToRead) else 0
        if full_slice(size, len(items)):
            out.append(tuple(items))
            items, size = [], 0
    if items:
        out.append(tuple(items))
    return out


def full_slice(size: int, files: int) -> bool:
    """Whether a slice of `files` walked items of `size` bytes is cut here."""
    return size >= SLICE_BYTES or files >= SLICE_FILES


def fits_slice(size: int, files: int) -> bool:
    """Whether `files` walked items of `size` bytes fit in one slice."""
    return size <= SLICE_BYTES and files <= SLICE_FILES


def dir_units(spec: SourceSpec, uri: str, scope: Scope) -> list[WalkUnit]:
    """A directory source's tree cut into walk units (`walk_units`)."""
    root, _ = _rooted(spec, uri, scope)
    return walk_units(root)


def _link_target(path: str) -> str | None:
    try:
        return os.fsencode(os.readlink(path)).decode("utf-8", "replace")
    except OSError:
        return None


def dir_listing(spec: SourceSpec, uri: str, scope: Scope, max_file_bytes: int) -> Listed:
    """The wanted files under the root and their sizes, from a directory walk (stat only:
    the revision, a hash of the contents, is left to collection)."""
    root, scope = _rooted(spec, uri, scope)
    files = size = 0
    for raw, e in _walk(root):
        rel = name_of(raw)
        if isinstance(e, Unlistable) or not is_utf8(raw) or has_control_chars(rel):
            continue
        if e.is_symlink() or not e.is_file(follow_symlinks=False):
            continue
        if scope.classify(rel) is None:
            n = e.stat(follow_symlinks=False).st_size
            if n <= max_file_bytes:
                files += 1
                size += n
    return Listed(None, files, size, "directory walk")
