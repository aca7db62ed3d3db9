"""RE2 programs over a text's UTF-8 bytes, for the scrub gate's rule sets: the Python wrapper
re-encodes the text on every search, so the gate encodes each file once and runs every
program on the same bytes, mapping byte offsets back to characters only for hits."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from re2 import _re2

UNANCHORED = _re2.RE2.Anchor.UNANCHORED
ANCHOR_START = _re2.RE2.Anchor.ANCHOR_START


# A leading lazy `[\w.-]{0,50}?` (gitleaks' identifier prefix) can match nothing, so it never
# decides whether a text matches; dropping it from the probe makes RE2's scan about 1.5x faster
_OPTIONAL_LEAD = re.compile(r"(?P<flags>\(\?[a-z]+\))?\[[^\]]+\]\{0,\d+\}\?")


def probe_pattern(pattern: str) -> str:
    """A necessary condition for `pattern` to match, cheaper to scan for: without a leading
    lazy optional run or a leading `\\b` (neither can make a text match that otherwise
    would not), so RE2 can skip ahead to the first literal."""
    lead = _OPTIONAL_LEAD.match(pattern)
    if lead is not None:
        pattern = (lead.group("flags") or "") + pattern[lead.end() :]
    flags = re.match(r"\(\?[a-z]+\)", pattern)
    head = flags.end() if flags else 0
    if pattern.startswith("\\b", head):
        pattern = pattern[:head] + pattern[head + 2 :]
    return pattern


def _program(pattern: str, never_capture: bool = False) -> Any:
    options = _re2.RE2.Options()
    options.log_errors = False
    options.never_capture = never_capture
    program = _re2.RE2(pattern.encode(), options)
    if not program.ok():
        raise ValueError(program.error())
    return program


class BytesRegex:
    """An RE2 program over UTF-8 bytes (the Python wrapper re-encodes the text on every
    search; the gate encodes each file once and runs every rule on the same bytes), with a
    capture-free probe that answers "any match at all?" before groups are asked for."""

    def __init__(self, pattern: str) -> None:
        self.pattern = pattern
        self.program = _program(pattern)
        self.probe = _program(probe_pattern(pattern), never_capture=True)

    def spans(self, data: bytes) -> Iterator[list[tuple[int, int]]]:
        if not self.search(data):
            return
        pos, end = 0, len(data)
        while pos <= end:
            spans = self.program.Match(UNANCHORED, data, pos, end)
            if spans[0][0] < 0:
                return
            yield spans
            pos = spans[0][1] + (spans[0][1] == spans[0][0])

    def search(self, data: bytes) -> bool:
        return bool(self.probe.Match(UNANCHORED, data, 0, len(data))[0][0] >= 0)


def chars_in(data: bytes, start: int, end: int) -> int:
    """How many characters UTF-8 `data[start:end]` holds (both on character boundaries)."""
    return int(_re2.BytesToCharLen(data, start, end))


class ByteOffsets:
    """UTF-8 byte offsets to str offsets (the identity for ASCII text)."""

    def __init__(self, text: str, data: bytes) -> None:
        self.data = data
        self.ascii = len(data) == len(text)

    def char(self, offset: int) -> int:
        if self.ascii:
            return offset
        return chars_in(self.data, 0, offset)
