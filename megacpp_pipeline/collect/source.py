"""What every kind of source yields: one `Entry` per file seen (its content, or the reason
it is dropped), under the same path rules (subdir scoping, include/exclude globs, names that
could leave the root or carry control characters are refused)."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import PurePosixPath

from megacpp_pipeline.core.catalog import SourceSpec
from megacpp_pipeline.core.ledger import DropReason

READ_CHUNK = 1 << 20


class CollectError(Exception):
    """The source as a whole cannot be collected (bad pin, missing commit, sha mismatch)."""


@dataclass(frozen=True)
class Entry:
    """One file seen in a source. `content` is None when the file is dropped.
    `metadata_only`: not a file of the source but what the source says of one (a JSONL
    record's licence), handed to the gates with the metadata and never in the ledger."""

    path: str
    content: bytes | None
    reason: DropReason | None = None
    detail: str | None = None
    metadata_only: bool = False


# Where a JSONL record's `license` travels to the licence gate: a metadata row named by the
# record's path under this prefix (absolute, so no file of a source can have the name).
RECORD_LICENSE_PREFIX = "/record-license/"


def record_license_path(rel: str) -> str:
    return RECORD_LICENSE_PREFIX + rel


def is_record_license_path(path: str) -> bool:
    return path.startswith(RECORD_LICENSE_PREFIX)


@dataclass(frozen=True)
class Listed:
    """A source's wanted files by count and bytes, listed without reading any of them (what
    `megacpp plan` sizes a run by), and how they were listed."""

    revision: str | None  # None where naming it needs the content (a dir's tree hash)
    files: int
    bytes: int
    how: str


@dataclass(frozen=True)
class SourceFiles:
    revision: str
    entries: Callable[[], Iterator[Entry]]


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
    """Whether a path matches one of the include globs and none of the exclude globs; each
    list is one regex (an alternation), so a path costs two matches however many globs."""

    def __init__(self, include: list[str], exclude: list[str]) -> None:
        self._include = _any_of(include)
        self._exclude = _any_of(exclude)

    def __call__(self, path: str) -> bool:
        return (
            self._include is not None
            and self._include.match(path) is not None
            and (self._exclude is None or self._exclude.match(path) is None)
        )


def _any_of(globs: list[str]) -> re.Pattern[str] | None:
    if not globs:
        return None
    return re.compile("|".join(f"(?:{glob_to_regex(g).pattern})" for g in globs))


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


_CONTROL_CHARS = re.compile("[\x00-\x1f\x7f]")


def has_control_chars(path: str) -> bool:
    """A C0 control character or DEL in the name (one regex search: it runs twice for every
    file a listing sees, the pre-flight plan's included)."""
    return _CONTROL_CHARS.search(path) is not None


def escape_name(raw: bytes) -> str:
    """A file name as the ledger and every table hold it: the name itself when it is UTF-8
    and holds no backslash; else with `\\\\` for each backslash and `\\xNN` for each byte that
    is not UTF-8. No two names meet (a name that is not UTF-8 and one literally spelled with
    its escapes stay apart), and `unescape_name` gives the bytes back."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    if text is not None and "\\" not in text:
        return text
    out = []
    for ch in raw.decode("utf-8", "surrogateescape"):
        if ch == "\\":
            out.append("\\\\")
        elif "\udc80" <= ch <= "\udcff":  # a byte that is not part of any UTF-8 character
            out.append(f"\\x{ord(ch) - 0xDC00:02x}")
        else:
            out.append(ch)
    return "".join(out)


def unescape_name(name: str) -> bytes:
    """The bytes of the file name `escape_name` turned into `name`."""
    if "\\" not in name:
        return name.encode("utf-8")
    out = bytearray()
    i = 0
    while i < len(name):
        if name.startswith("\\\\", i):
            out += b"\\"
            i += 2
        elif name.startswith("\\x", i):
            out.append(int(name[i + 2 : i + 4], 16))
            i += 4
        else:
            out += name[i].encode("utf-8")
            i += 1
    return bytes(out)


def is_utf8(path: str) -> bool:
    """Whether a name Python decoded with surrogateescape was UTF-8 on disk."""
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def name_of(path: str) -> str:
    """`escape_name` of a name Python decoded with surrogateescape (os.scandir, tarfile)."""
    return escape_name(path.encode("utf-8", "surrogateescape"))


def decode_name(raw: bytes) -> tuple[str, bool]:
    """The escaped name, and whether the raw name was UTF-8."""
    try:
        raw.decode("utf-8")
        valid = True
    except UnicodeDecodeError:
        valid = False
    return escape_name(raw), valid


def too_large(path: str, size: int, max_file_bytes: int) -> Entry:
    """The ledger entry of a file over the size policy, read no further than the limit."""
    return Entry(
        path,
        None,
        DropReason.TOO_LARGE,
        f"{size} bytes > max_file_bytes {max_file_bytes} (sources.yaml: max_file_bytes, "
        "or the source's own max_file_bytes)",
    )


# Git-annex keeps a file's content out of the repository: a symlink into
# .git/annex/objects/ (locked files) names the key in its target.
_ANNEX_LINK = re.compile(r"(?:^|/)\.git/annex/objects/(?:[^/]+/)*([^/]+)\Z")


def annex_link_key(target: str) -> str | None:
    """The git-annex key a symlink's target names, or None for any other link."""
    m = _ANNEX_LINK.search(target)
    return m.group(1) if m else None


def link_drop(path: str, target: str | None) -> Entry:
    """The ledger entry of a symlink: a git-annex link names the content it stands for."""
    key = annex_link_key(target) if target is not None else None
    if key is not None:
        return Entry(
            path,
            None,
            DropReason.POINTER_FILE,
            f"git-annex link to {key}: the content lives in git-annex storage, not here",
        )
    return Entry(path, None, DropReason.SYMLINK, "symlinks are never followed")


class Scope:
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
        if has_control_chars(path):
            return Entry(path, None, DropReason.UNSAFE_PATH, "control character in file name")
        if "\\" in path:  # escaped: the name held a backslash (its non-UTF-8 bytes are refused)
            return Entry(
                path,
                None,
                DropReason.UNSAFE_PATH,
                "backslash in file name (a path separator where the corpus may be unpacked)",
            )
        if not (self.wanted(path) or self.keep_also(path)):
            return Entry(path, None, DropReason.NOT_INCLUDED, "outside include/exclude globs")
        return None
