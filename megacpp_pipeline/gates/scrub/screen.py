"""Decides, in one pass over a text, which finders it needs: every rare detector's triggers and
the vendor rule set's keywords and probes, compiled into one RE2 Set and matched once over the
text's UTF-8 bytes (a Set answers "which of these patterns occur" at the cost of one scan)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from re2 import _re2

# the Set's automaton cache: a few hundred literals and a dozen rule probes fit with room;
# at RE2's default (8 MiB) the cache thrashes and the pass runs twice as slow
SCREEN_MAX_MEM = 32 << 20


class ScreenError(ValueError):
    """A screen pattern RE2 refuses (names the tag it was registered under)."""


@dataclass(frozen=True)
class ScreenEntry:
    tag: str  # what a match means: `det:<detector>`, `kw:<keyword>`, `probe:<rule>`, ...
    pattern: str
    literal: bool = False  # `pattern` is text, not a regex
    ignore_case: bool = False


@dataclass(frozen=True)
class Screened:
    """A text's UTF-8 bytes and the tags whose patterns occur in it."""

    data: bytes
    tags: frozenset[str]


class Screen:
    def __init__(self, entries: Sequence[ScreenEntry]) -> None:
        options = _re2.RE2.Options()
        options.max_mem = SCREEN_MAX_MEM
        options.never_capture = True
        options.log_errors = False
        self._set: Any = _re2.Set(_re2.RE2.Anchor.UNANCHORED, options)
        self._tags: list[str] = []
        for e in entries:
            pattern = e.pattern.encode()
            if e.literal:
                pattern = _re2.RE2.QuoteMeta(pattern)
            if e.ignore_case:
                pattern = b"(?i:" + pattern + b")"
            if self._set.Add(pattern) < 0:
                raise ScreenError(f"screen entry {e.tag!r}: RE2 rejects {e.pattern!r}")
            self._tags.append(e.tag)
        if not self._set.Compile():
            raise ScreenError("screen: RE2 could not compile the pattern set")

    def screen(self, text: str) -> Screened:
        data = text.encode()
        return Screened(data, frozenset(self._tags[i] for i in self._set.Match(data)))
