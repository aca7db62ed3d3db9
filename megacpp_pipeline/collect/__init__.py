"""Collection: read every file of a pinned source at its exact revision, without executing
or extracting anything from it. Git is read at the pinned commit through the git CLI;
archives are checked against their sha256 first and read member by member in memory (never
extracted), so `..`, absolute names, links and device files cannot reach the disk.

Seed rule: the operational slice is pinned; every file seen gets a ledger status.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import stat
import subprocess
import tarfile
import tempfile
import urllib.request
import zipfile
import zlib
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path, PurePosixPath
from typing import IO

import pyarrow as pa

from megacpp_pipeline.core import schemas
from megacpp_pipeline.core.catalog import CollectLimits, SourceSpec
from megacpp_pipeline.core.ledger import LEDGER_SCHEMA, DropReason
from megacpp_pipeline.core.schemas import git_blob_sha

_READ_CHUNK = 1 << 20


class CollectError(Exception):
    """The source as a whole cannot be collected (bad pin, missing commit, sha mismatch)."""


@dataclass(frozen=True)
class Entry:
    """One file seen in a source. `content` is None when the file is dropped."""

    path: str
    content: bytes | None
    reason: DropReason | None = None
    detail: str | None = None


@dataclass(frozen=True)
class SourceFiles:
    revision: str
    entries: Callable[[], Iterator[Entry]]


# --- path rules ---------------------------------------------------------------------------
def glob_to_regex(pattern: str) -> re.Pattern[str]:
    """gitignore-style globs: `**/` spans zero or more folders, `*` and `?` stay in one."""
    out, i = [], 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif pattern[i] == "*":
            out.append("[^/]*")
            i += 1
        elif pattern[i] == "?":
            out.append("[^/]")
            i += 1
        else:
            out.append(re.escape(pattern[i]))
            i += 1
    return re.compile("".join(out) + r"\Z")


class PathFilter:
    def __init__(self, include: list[str], exclude: list[str]) -> None:
        self._include = [glob_to_regex(p) for p in include]
        self._exclude = [glob_to_regex(p) for p in exclude]

    def __call__(self, path: str) -> bool:
        return any(r.match(path) for r in self._include) and not any(
            r.match(path) for r in self._exclude
        )


def safe_relpath(name: str) -> str | None:
    """The normalized relative POSIX path, or None when the name could leave the root."""
    if not name or "\x00" in name:
        return None
    name = name.replace("\\", "/")
    if name.startswith("/") or re.match(r"^[A-Za-z]:", name):
        return None
    parts = [p for p in PurePosixPath(name).parts if p not in ("", ".")]
    if not parts or any(p == ".." for p in parts):
        return None
    return "/".join(parts)


def _has_control_chars(path: str) -> bool:
    return any(ord(c) < 32 or c == "\x7f" for c in path)


def _decode_name(raw: bytes) -> tuple[str, bool]:
    try:
        return raw.decode("utf-8"), True
    except UnicodeDecodeError:
        return raw.decode("utf-8", errors="backslashreplace"), False


class _Scope:
    """Subdir scoping + include/exclude + hostile-name checks shared by every kind."""

    def __init__(self, spec: SourceSpec, keep_also: Callable[[str], bool] | None) -> None:
        self.subdir = spec.subdir.strip("/") + "/" if spec.subdir else ""
        self.wanted = PathFilter(spec.include, spec.exclude)
        self.keep_also = keep_also or (lambda _p: False)

    def relative(self, path: str) -> str | None:
        if not self.subdir:
            return path
        return path[len(self.subdir) :] if path.startswith(self.subdir) else None

    def classify(self, path: str) -> Entry | None:
        """A drop entry when the path is refused or not wanted; None when it is wanted."""
        if _has_control_chars(path):
            return Entry(path, None, DropReason.UNSAFE_PATH, "control character in file name")
        if not (self.wanted(path) or self.keep_also(path)):
            return Entry(path, None, DropReason.NOT_INCLUDED, "outside include/exclude globs")
        return None


# --- git ----------------------------------------------------------------------------------
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


def _git_source(
    spec: SourceSpec, uri: str, cache_dir: Path, scope: _Scope, limits: CollectLimits
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
        wanted: list[tuple[str, str]] = []
        for record in listing.stdout.split(b"\x00"):
            if not record:
                continue
            meta, raw_path = record.split(b"\t", 1)
            mode, kind, obj = meta.decode().split()
            name, ok = _decode_name(raw_path)
            rel = scope.relative(name)
            if rel is None:
                continue
            if not ok:
                yield Entry(rel, None, DropReason.UNSAFE_PATH, "file name is not UTF-8")
            elif kind != "blob":
                yield Entry(rel, None, DropReason.NOT_INCLUDED, f"git {kind} (submodule)")
            elif mode == "120000":
                yield Entry(rel, None, DropReason.SYMLINK, "symlinks are never followed")
            elif (drop := scope.classify(rel)) is not None:
                yield drop
            else:
                wanted.append((rel, obj))
        yield from _git_blobs(repo, wanted, limits)

    return SourceFiles(revision=revision, entries=entries)


def _git_blobs(repo: str, wanted: list[tuple[str, str]], limits: CollectLimits) -> Iterator[Entry]:
    proc = subprocess.Popen(
        ["git", "cat-file", "--batch"], cwd=repo, stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    assert proc.stdin is not None and proc.stdout is not None
    try:
        for rel, obj in wanted:
            proc.stdin.write(obj.encode() + b"\n")
            proc.stdin.flush()
            header = proc.stdout.readline().split()
            size = int(header[2])
            if size > limits.max_file_bytes:
                _skip(proc.stdout, size + 1)
                yield Entry(
                    rel, None, DropReason.TOO_LARGE, f"{size} bytes > {limits.max_file_bytes}"
                )
                continue
            data = proc.stdout.read(size)
            proc.stdout.read(1)
            yield Entry(rel, data)
    finally:
        proc.stdin.close()
        proc.wait()


def _skip(stream: IO[bytes], n: int) -> None:
    while n > 0:
        n -= len(stream.read(min(n, _READ_CHUNK)) or b"x" * n)


# --- archives -----------------------------------------------------------------------------
def fetch_archive(uri: str, sha256: str, cache_dir: Path) -> Path:
    """The local archive file, verified against its pin before anything reads it."""
    if "://" in uri and not uri.startswith("file://"):
        target = cache_dir / "archives" / f"{sha256[:16]}-{Path(uri).name}"
        if not target.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            tmp = target.with_suffix(".tmp")
            with urllib.request.urlopen(uri, timeout=60) as r, tmp.open("wb") as f:
                shutil.copyfileobj(r, f)
            tmp.rename(target)
        path = target
    else:
        path = Path(uri.removeprefix("file://"))
    if not path.is_file():
        raise CollectError(f"{uri}: archive not found")
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_READ_CHUNK):
            h.update(chunk)
    if h.hexdigest() != sha256:
        raise CollectError(
            f"{uri}: sha256 {h.hexdigest()} does not match the pinned {sha256}; refusing it"
        )
    return path


class _Budget:
    def __init__(self, limits: CollectLimits) -> None:
        self.limits = limits
        self.files = 0
        self.bytes = 0

    def refuse(self, size: int) -> str | None:
        if self.files + 1 > self.limits.max_files:
            return f"archive holds more than {self.limits.max_files} files"
        if size > self.limits.max_file_bytes:
            return f"{size} bytes uncompressed > max_file_bytes {self.limits.max_file_bytes}"
        if self.bytes + size > self.limits.max_total_bytes:
            return f"archive exceeds max_total_bytes {self.limits.max_total_bytes} uncompressed"
        return None

    def take(self, size: int) -> None:
        self.files += 1
        self.bytes += size


def _zip_entries(path: Path, scope: _Scope, limits: CollectLimits) -> Iterator[Entry]:
    budget = _Budget(limits)
    with zipfile.ZipFile(path) as zf:
        for info in sorted(zf.infolist(), key=lambda i: i.filename):
            if info.is_dir():
                continue
            rel = safe_relpath(info.filename)
            if rel is None:
                yield Entry(info.filename, None, DropReason.UNSAFE_PATH, "absolute or `..` name")
                continue
            rel2 = scope.relative(rel)
            if rel2 is None:
                continue
            mode = info.external_attr >> 16
            if stat.S_ISLNK(mode):
                yield Entry(rel2, None, DropReason.SYMLINK, "symlinks are never followed")
                continue
            if (drop := scope.classify(rel2)) is not None:
                yield drop
                continue
            ratio = info.file_size / max(info.compress_size, 1)
            if ratio > limits.max_compression_ratio and info.file_size > 1 << 20:
                yield Entry(
                    rel2, None, DropReason.ARCHIVE_LIMIT, f"compression ratio {ratio:.0f} (bomb?)"
                )
                continue
            if (why := budget.refuse(info.file_size)) is not None:
                yield Entry(rel2, None, DropReason.ARCHIVE_LIMIT, why)
                continue
            try:
                with zf.open(info) as f:
                    data = f.read(limits.max_file_bytes + 1)
            except (zipfile.BadZipFile, zlib.error, EOFError, NotImplementedError) as err:
                # one corrupt member (bad CRC: its header lies about size or content, or an
                # unsupported method) is that file's problem, not the whole source's
                yield Entry(rel2, None, DropReason.UNREADABLE, f"corrupt zip member: {err}")
                continue
            if len(data) > limits.max_file_bytes:  # the header lied about the size
                yield Entry(rel2, None, DropReason.ARCHIVE_LIMIT, "larger than its header says")
                continue
            budget.take(len(data))
            yield Entry(rel2, data)


def _open_tar(path: Path) -> tarfile.TarFile:
    name = path.name.lower()
    if name.endswith((".tar.zst", ".tzst", ".tar.zstd")):
        import zstandard

        raw = path.open("rb")
        stream = zstandard.ZstdDecompressor().stream_reader(raw, closefd=True)
        return tarfile.open(fileobj=stream, mode="r|")  # type: ignore[call-overload]
    return tarfile.open(path, mode="r|*")


def _tar_entries(path: Path, scope: _Scope, limits: CollectLimits) -> Iterator[Entry]:
    budget = _Budget(limits)
    with _open_tar(path) as tf:
        for member in tf:
            if member.isdir():
                continue
            rel = safe_relpath(member.name)
            if rel is None:
                yield Entry(member.name, None, DropReason.UNSAFE_PATH, "absolute or `..` name")
                continue
            rel2 = scope.relative(rel)
            if rel2 is None:
                continue
            if member.issym() or member.islnk():
                target = safe_relpath(str(PurePosixPath(rel).parent / member.linkname))
                link_why = "link leaves the root" if target is None else "links are never followed"
                reason = DropReason.UNSAFE_PATH if target is None else DropReason.SYMLINK
                yield Entry(rel2, None, reason, link_why)
                continue
            if not member.isreg():
                yield Entry(rel2, None, DropReason.UNSAFE_PATH, "device, fifo or special file")
                continue
            if (drop := scope.classify(rel2)) is not None:
                yield drop
                continue
            if (why := budget.refuse(member.size)) is not None:
                yield Entry(rel2, None, DropReason.ARCHIVE_LIMIT, why)
                continue
            f = tf.extractfile(member)
            data = f.read(limits.max_file_bytes + 1) if f else b""
            budget.take(len(data))
            yield Entry(rel2, data)


def _archive_source(
    spec: SourceSpec, uri: str, cache_dir: Path, scope: _Scope, limits: CollectLimits
) -> SourceFiles:
    assert spec.sha256 is not None
    path = fetch_archive(uri, spec.sha256, cache_dir)
    name = path.name.lower()
    if name.endswith((".zip", ".whl")):
        reader = _zip_entries
    elif re.search(r"\.(tar|tar\.gz|tgz|tar\.xz|txz|tar\.bz2|tar\.zst|tzst|tar\.zstd)$", name):
        reader = _tar_entries
    else:
        raise CollectError(f"{uri}: unknown archive type (zip, whl, tar, tar.gz/xz/zst)")
    return SourceFiles(
        revision=spec.sha256, entries=lambda: _canonical_order(reader(path, scope, limits))
    )


def _canonical_order(entries: Iterator[Entry]) -> Iterator[Entry]:
    """Archive members in path order, as dedup requires (a tar lists members in whatever
    order it was written). Contents wait in an unlinked temporary file, so memory holds
    only names. A name that occurs twice is ambiguous: every copy is dropped."""
    with tempfile.TemporaryFile(prefix="megacpp-collect-") as spool:
        index: list[tuple[str, int, Entry, int, int]] = []
        for seq, entry in enumerate(entries):
            offset = spool.tell()
            if entry.content is not None:
                spool.write(entry.content)
            size = len(entry.content) if entry.content is not None else -1
            index.append((entry.path, seq, replace(entry, content=None), offset, size))
        index.sort(key=lambda item: (item[0], item[1]))
        names = Counter(path for path, _, e, _, size in index if size >= 0)
        for path, _, entry, offset, size in index:
            if size < 0:
                yield entry
            elif names[path] > 1:
                why = f"{names[path]} members share this name; which one is meant is ambiguous"
                yield Entry(path, None, DropReason.UNSAFE_PATH, why)
            else:
                spool.seek(offset)
                yield replace(entry, content=spool.read(size))


# --- plain directories --------------------------------------------------------------------
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


def _dir_source(spec: SourceSpec, uri: str, scope: _Scope, limits: CollectLimits) -> SourceFiles:
    root = Path(uri.removeprefix("file://"))
    if spec.subdir:
        root = root / spec.subdir
    if not root.is_dir():
        raise CollectError(f"source {spec.id!r}: {root} is not a directory")
    scope = _Scope(spec.model_copy(update={"subdir": None}), scope.keep_also)

    def entries() -> Iterator[Entry]:
        for rel, e in _walk(root):
            try:
                rel.encode("utf-8")
            except UnicodeEncodeError:
                shown = rel.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
                yield Entry(shown, None, DropReason.UNSAFE_PATH, "file name is not UTF-8")
                continue
            if _has_control_chars(rel):
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


# --- entry point --------------------------------------------------------------------------
def open_source(
    spec: SourceSpec,
    uri: str,
    *,
    cache_dir: Path,
    limits: CollectLimits,
    keep_also: Callable[[str], bool] | None = None,
) -> SourceFiles:
    """The pinned revision and a re-iterable stream of every file in the source.

    `keep_also` names extra files to keep besides the include globs (REUSE metadata,
    compile_commands.json): the gates that need them read them from the collected rows.
    """
    scope = _Scope(spec, keep_also)
    if spec.kind == "git":
        return _git_source(spec, uri, cache_dir, scope, limits)
    if spec.kind == "archive":
        return _archive_source(spec, uri, cache_dir, scope, limits)
    if spec.kind == "dir":
        return _dir_source(spec, uri, scope, limits)
    if spec.kind == "jsonl":
        return _jsonl_source(spec, uri, scope)
    raise CollectError(f"source {spec.id!r}: unknown kind {spec.kind!r}")


def _jsonl_source(spec: SourceSpec, uri: str, scope: _Scope) -> SourceFiles:
    from megacpp_pipeline.collect import jsonl_stream

    path = Path(uri.removeprefix("file://"))
    if not path.is_file():
        raise CollectError(f"source {spec.id!r}: {path} not found")
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_READ_CHUNK):
            h.update(chunk)

    def entries() -> Iterator[Entry]:
        rejects: list[jsonl_stream.RecordReject] = []
        for rec in jsonl_stream.iter_records(path, rejects):
            rel = safe_relpath(str(rec["path"]))
            if rel is None:
                yield Entry(str(rec["path"]), None, DropReason.UNSAFE_PATH, "absolute or `..`")
            elif (drop := scope.classify(rel)) is not None:
                yield drop
            else:
                yield Entry(rel, str(rec["content"]).encode("utf-8"))
        for r in rejects:  # a malformed line has no usable path: name it by its line
            yield Entry(f"<line {r.line_no}>", None, DropReason.MALFORMED_RECORD, r.describe(path))

    return SourceFiles(revision=h.hexdigest(), entries=entries)


# --- to Arrow -----------------------------------------------------------------------------
METADATA_FILES = pa.schema(
    [
        pa.field("path", pa.string(), nullable=False),
        pa.field("content", pa.binary(), nullable=False),
    ],
    metadata={"megacpp.table": "metadata_files", "megacpp.schema_version": "1"},
)


@dataclass
class CollectBatch:
    kept: pa.Table  # schemas.RAW_FILES
    ledger: pa.Table  # every file seen in the batch, kept or dropped
    metadata: pa.Table  # METADATA_FILES: REUSE files, compile_commands.json


def collect_batches(
    spec: SourceSpec,
    files: SourceFiles,
    *,
    is_metadata: Callable[[str], bool],
    include: PathFilter | None = None,
    batch_bytes: int = 16 << 20,  # one shard's worth: memory is bounded by shard size
) -> Iterator[CollectBatch]:
    """Bounded Arrow batches of the source's files, with one ledger row per file seen."""
    wanted = include or PathFilter(spec.include, spec.exclude)
    rows: list[Entry] = []
    size = 0
    for entry in files.entries():
        rows.append(entry)
        size += len(entry.content or b"")
        if size >= batch_bytes or len(rows) >= 5000:
            yield _batch(spec, files.revision, rows, is_metadata, wanted)
            rows, size = [], 0
    if rows:
        yield _batch(spec, files.revision, rows, is_metadata, wanted)


def _batch(
    spec: SourceSpec,
    revision: str,
    entries: list[Entry],
    is_metadata: Callable[[str], bool],
    wanted: PathFilter,
) -> CollectBatch:
    kept = [e for e in entries if e.content is not None and wanted(e.path)]
    meta = [
        e for e in entries if e.content is not None and not wanted(e.path) and is_metadata(e.path)
    ]
    contents = [e.content or b"" for e in kept]
    kept_table = pa.table(
        {
            "source_id": pa.array([spec.id] * len(kept), pa.string()),
            "path": pa.array([e.path for e in kept], pa.string()),
            "revision": pa.array([revision] * len(kept), pa.string()),
            "blob_sha": pa.array([git_blob_sha(c) for c in contents], pa.string()),
            "size": pa.array([len(c) for c in contents], pa.int64()),
            "content": pa.array(contents, pa.binary()),
        },
        schema=schemas.RAW_FILES,
    )
    status: list[str] = []
    reasons: list[str | None] = []
    details: list[str | None] = []
    for e in entries:
        if e.content is not None and wanted(e.path):
            status.append("kept")
            reasons.append(None)
            details.append(None)
        else:
            status.append("dropped")
            reasons.append(str(e.reason or DropReason.NOT_INCLUDED))
            details.append(
                e.detail
                if e.content is None
                else "metadata for the license/enrich gates"
                if is_metadata(e.path)
                else e.detail
            )
    n = len(entries)
    ledger_table = pa.table(
        {
            "source_id": pa.array([spec.id] * n, pa.string()),
            "path": pa.array([e.path for e in entries], pa.string()),
            "stage": pa.array([""] * n, pa.string()),
            "status": pa.array(status, pa.string()),
            "reason": pa.array(reasons, pa.string()),
            "detail": pa.array(details, pa.string()),
            "dup_of": pa.nulls(n, pa.string()),
            "license_expression": pa.nulls(n, pa.string()),
        },
        schema=LEDGER_SCHEMA,
    )
    meta_table = pa.table(
        {
            "path": pa.array([e.path for e in meta], pa.string()),
            "content": pa.array([e.content for e in meta], pa.binary()),
        },
        schema=METADATA_FILES,
    )
    return CollectBatch(kept_table, ledger_table, meta_table)
