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
    """One file seen in a source. `content` is None when the file is dropped."""

    path: str
    content: bytes | None
    reason: DropReason | None = None
    detail: str | None = None


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


def has_control_chars(path: str) -> bool:
    return any(ord(c) < 32 or c == "\x7f" for c in path)


def decode_name(raw: bytes) -> tuple[str, bool]:
    try:
        return raw.decode("utf-8"), True
    except UnicodeDecodeError:
        return raw.decode("utf-8", errors="backslashreplace"), False


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
        if not (self.wanted(path) or self.keep_also(path)):
            return Entry(path, None, DropReason.NOT_INCLUDED, "outside include/exclude globs")
        return None
