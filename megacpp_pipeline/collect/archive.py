"""Archive sources (zip, wheel, tar with gz/xz/bz2/zst): verified against their sha256
before anything reads them, then read member by member in memory, never extracted, so
`..`, absolute names, links and device files cannot reach the disk; bounded against bombs;
members come out in path order whatever order the archive holds them in."""

from __future__ import annotations

import re
import shutil
import stat
import tarfile
import tempfile
import urllib.request
import zipfile
import zlib
from collections import Counter
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path, PurePosixPath
from typing import Self

from megacpp_pipeline.collect.source import (
    CollectError,
    Entry,
    Listed,
    Scope,
    SourceFiles,
    annex_link_key,
    is_utf8,
    link_drop,
    name_of,
    safe_relpath,
    too_large,
)
from megacpp_pipeline.core.catalog import CollectLimits, SourceSpec
from megacpp_pipeline.core.ledger import DropReason
from megacpp_pipeline.storage.versions import sha256_file


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
    actual = sha256_file(path)
    if actual != sha256:
        raise CollectError(
            f"{uri}: sha256 {actual} does not match the pinned {sha256}; refusing it"
        )
    return path


class _Budget:
    def __init__(self, limits: CollectLimits, max_file_bytes: int) -> None:
        self.limits = limits
        self.max_file_bytes = max_file_bytes
        self.files = 0
        self.bytes = 0

    def refuse(self, path: str, size: int) -> Entry | None:
        """The ledger entry when the member would break a bound (read nothing of it then)."""
        if self.files + 1 > self.limits.max_files:
            why = f"archive holds more than collect.max_files {self.limits.max_files} files"
            return Entry(path, None, DropReason.ARCHIVE_LIMIT, why)
        if size > self.max_file_bytes:
            return too_large(path, size, self.max_file_bytes)
        if self.bytes + size > self.limits.max_total_bytes:
            why = (
                f"archive exceeds collect.max_total_bytes {self.limits.max_total_bytes} "
                "uncompressed"
            )
            return Entry(path, None, DropReason.ARCHIVE_LIMIT, why)
        return None

    def take(self, size: int) -> None:
        self.files += 1
        self.bytes += size


def _zip_entries(
    path: Path, scope: Scope, limits: CollectLimits, max_file_bytes: int
) -> Iterator[Entry]:
    budget = _Budget(limits, max_file_bytes)
    try:
        zf = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError) as err:
        raise CollectError(f"{path.name}: not a readable zip archive ({err})") from err
    with zf:
        for info in sorted(zf.infolist(), key=lambda i: i.filename):
            if info.is_dir():
                continue
            rel = safe_relpath(info.filename)
            if rel is None:
                yield Entry(
                    name_of(info.filename), None, DropReason.UNSAFE_PATH, "absolute or `..` name"
                )
                continue
            rel2 = scope.relative(rel)
            if rel2 is None:
                continue
            rel2 = name_of(rel2)
            mode = info.external_attr >> 16
            if stat.S_ISLNK(mode):
                yield link_drop(rel2, _zip_link_target(zf, info))
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
            if (refused := budget.refuse(rel2, info.file_size)) is not None:
                yield refused
                continue
            try:
                with zf.open(info) as f:
                    data = f.read(max_file_bytes + 1)
            except _MEMBER_ERRORS as err:
                # one corrupt member (bad CRC: its header lies about size or content, an
                # unsupported method, a password it needs) is that file's problem, not the
                # whole source's
                yield Entry(rel2, None, DropReason.UNREADABLE, f"corrupt zip member: {err}")
                continue
            if len(data) > max_file_bytes:  # the header lied about the size
                yield Entry(rel2, None, DropReason.ARCHIVE_LIMIT, "larger than its header says")
                continue
            budget.take(len(data))
            yield Entry(rel2, data)


# what reading one zip member may raise: zipfile raises RuntimeError for an encrypted one
_MEMBER_ERRORS = (zipfile.BadZipFile, zlib.error, EOFError, NotImplementedError, RuntimeError)


class _DamagedHeader(tarfile.TarError):
    """A member header that does not parse where the archive has not ended."""


# tarfile's own header errors (not in its stubs): a header that does not parse, one cut short
_HEADER_DAMAGE: tuple[type[Exception], ...] = (
    tarfile.InvalidHeaderError,  # type: ignore[attr-defined]
    tarfile.TruncatedHeaderError,  # type: ignore[attr-defined]
)


_EXTENDED_HEADERS = frozenset(
    {tarfile.XHDTYPE, tarfile.XGLTYPE, tarfile.SOLARIS_XHDTYPE}
    | {tarfile.GNUTYPE_LONGNAME, tarfile.GNUTYPE_LONGLINK}
)
MAX_EXTENDED_HEADER_BYTES = 1 << 20


class _CheckedTarInfo(tarfile.TarInfo):
    """tarfile takes a header that does not parse (a bad checksum, a block cut short) past
    the first member for the archive's end, and stops reading without a word: every member
    after it would be lost silently. Such a header raises here instead. (A block of zeros,
    the archive's proper end, and the end of the data on a member's boundary still end it.)"""

    @classmethod
    def fromtarfile(cls, tarfile_: tarfile.TarFile) -> Self:
        try:
            return super().fromtarfile(tarfile_)
        except _HEADER_DAMAGE as err:
            raise _DamagedHeader(f"the member header at byte {tarfile_.offset}: {err}") from None

    def _proc_member(self, tarfile_: tarfile.TarFile) -> Self:
        # a pax or GNU long-name header is read whole into memory: bounded, or one header
        # claiming gigabytes would take them
        if self.type in _EXTENDED_HEADERS and self.size > MAX_EXTENDED_HEADER_BYTES:
            raise _DamagedHeader(
                f"an extended header of {self.size} bytes at byte {self.offset}: more than "
                f"any member's name and attributes need ({MAX_EXTENDED_HEADER_BYTES})"
            )
        return super()._proc_member(tarfile_)  # type: ignore[misc]


def _stream_errors() -> tuple[type[BaseException], ...]:
    """What reading a damaged or cut-short tar stream raises, whatever its compression."""
    import lzma

    import zstandard

    return (tarfile.TarError, OSError, EOFError, zlib.error, lzma.LZMAError, zstandard.ZstdError)


def _open_tar(path: Path) -> tarfile.TarFile:
    name = path.name.lower()
    if name.endswith((".tar.zst", ".tzst", ".tar.zstd")):
        import zstandard

        raw = path.open("rb")
        stream = zstandard.ZstdDecompressor().stream_reader(raw, closefd=True)
        return tarfile.open(fileobj=stream, mode="r|", tarinfo=_CheckedTarInfo)  # type: ignore[call-overload]
    return tarfile.open(path, mode="r|*", tarinfo=_CheckedTarInfo)


def _tar_members(tf: tarfile.TarFile, path: Path) -> Iterator[tarfile.TarInfo]:
    """The archive's members in order; a damaged or cut-short archive fails naming itself
    and where, rather than ending early (its members past the damage cannot be listed, so
    the ledger could not account for them)."""
    errors = _stream_errors()
    while True:
        try:
            member = tf.next()
        except errors as err:
            raise CollectError(
                f"{path.name}: damaged tar archive ({err}); the members after byte "
                f"{tf.offset} cannot be read"
            ) from err
        if member is None:
            return
        yield member


def _tar_member_bytes(
    tf: tarfile.TarFile, member: tarfile.TarInfo, path: Path, limit: int
) -> bytes:
    try:
        f = tf.extractfile(member)
        return f.read(limit + 1) if f else b""
    except _stream_errors() as err:
        raise CollectError(
            f"{path.name}: damaged tar archive: member {member.name!r} cannot be read ({err})"
        ) from err


def _tar_entries(
    path: Path, scope: Scope, limits: CollectLimits, max_file_bytes: int
) -> Iterator[Entry]:
    budget = _Budget(limits, max_file_bytes)
    try:
        tf = _open_tar(path)
    except _stream_errors() as err:
        raise CollectError(f"{path.name}: not a readable tar archive ({err})") from err
    with tf:
        for member in _tar_members(tf, path):
            if member.isdir():
                continue
            rel = safe_relpath(member.name)
            if rel is None:
                yield Entry(
                    name_of(member.name), None, DropReason.UNSAFE_PATH, "absolute or `..` name"
                )
                continue
            rel2 = scope.relative(rel)
            if rel2 is None:
                continue
            if not is_utf8(rel2):  # tarfile decodes names with surrogateescape
                yield Entry(name_of(rel2), None, DropReason.UNSAFE_PATH, "file name is not UTF-8")
                continue
            rel2 = name_of(rel2)
            if member.issym() and annex_link_key(member.linkname) is not None:
                yield link_drop(rel2, member.linkname)
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
            if (refused := budget.refuse(rel2, member.size)) is not None:
                yield refused
                continue
            data = _tar_member_bytes(tf, member, path, max_file_bytes)
            budget.take(len(data))
            yield Entry(rel2, data)


def archive_source(
    spec: SourceSpec,
    uri: str,
    cache_dir: Path,
    scope: Scope,
    limits: CollectLimits,
    max_file_bytes: int,
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
        revision=spec.sha256,
        entries=lambda: _canonical_order(reader(path, scope, limits, max_file_bytes)),
    )


def _zip_link_target(zf: zipfile.ZipFile, info: zipfile.ZipInfo) -> str | None:
    """A zip symlink's target (its member's bytes), when it is a short path."""
    if info.file_size > 4096:
        return None
    try:
        with zf.open(info) as f:
            return f.read(4096).decode("utf-8", "replace")
    except _MEMBER_ERRORS:
        return None


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
        # every copy counts, read or not: a readable copy beside a too-large one or a link is
        # no more the one meant than either (extraction would keep the last)
        names = Counter(path for path, _, _, _, _ in index)
        for path, _, entry, offset, size in index:
            if size < 0:
                yield entry
            elif names[path] > 1:
                why = f"{names[path]} members share this name; which one is meant is ambiguous"
                yield Entry(path, None, DropReason.UNSAFE_PATH, why)
            else:
                spool.seek(offset)
                yield replace(entry, content=spool.read(size))


def archive_listing(
    spec: SourceSpec,
    uri: str,
    cache_dir: Path,
    scope: Scope,
    limits: CollectLimits,
    max_file_bytes: int,
) -> Listed:
    """The wanted members of the (verified) archive and their sizes, from its member list: a
    zip's central directory, a tar's headers (a compressed tar is decompressed to walk them,
    but no member is kept); the members collection's bounds would refuse are left out."""
    assert spec.sha256 is not None
    path = fetch_archive(uri, spec.sha256, cache_dir)
    budget = _Budget(limits, max_file_bytes)
    members: list[tuple[str, int]] = []
    if path.name.lower().endswith((".zip", ".whl")):
        with zipfile.ZipFile(path) as zf:
            members = [
                (i.filename, i.file_size)
                for i in zf.infolist()
                if not i.is_dir() and not stat.S_ISLNK(i.external_attr >> 16)
            ]
        how = "zip central directory"
    else:
        try:
            tf = _open_tar(path)
        except _stream_errors() as err:
            raise CollectError(f"{path.name}: not a readable tar archive ({err})") from err
        with tf:
            members = [(m.name, m.size) for m in _tar_members(tf, path) if m.isreg()]
        how = "tar member headers"
    for name, n in sorted(members):
        rel = safe_relpath(name)
        rel2 = scope.relative(rel) if rel is not None else None
        if rel2 is not None and scope.classify(rel2) is None and budget.refuse(rel2, n) is None:
            budget.take(n)
    return Listed(spec.sha256, budget.files, budget.bytes, how)
