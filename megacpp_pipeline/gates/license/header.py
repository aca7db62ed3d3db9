"""Where a C/C++ file writes its licence: the comments before its first line of code, and the
`SPDX-License-Identifier:` tags in them (REUSE reads the head of a file, not the whole of it).
"""

from __future__ import annotations

import re

# What may precede or hold the licence in a C/C++ file's head: whitespace, comments and
# preprocessor lines (include guards often come before the licence comment). A block
# comment ends at the first `*/` or at the end of the head; it is spelled as character-class
# runs rather than `/\*.*?\*/` because sre scans those in a tight C loop instead of
# trying the terminator after every character (3x faster over the demo corpus).
_BLOCK = r"/\*[^*]*(?:\*+[^*/][^*]*)*(?:\*+/|\*+\Z|\Z)"
_DIRECTIVE = (
    r"\#[ \t]*(?=/[/*])"  # Boost.Preprocessor's `# /* ... */`: a null directive + comment
    r"|\#[^\n]*(?:\\\n[^\n]*)*"
)
# Each match: directives, then a block comment or a whole run of line comments (a licence
# header is one run: sre's cost per match, not its scanning, is what such heads spent their
# time on). The match after the last comment has neither group.
_HEAD_COMMENTS = re.compile(
    rf"(?:\s*(?:{_DIRECTIVE}))*\s*(?:(//[^\n]*(?:\n\s*//[^\n]*)*)|({_BLOCK}))?"
)
_LINE_COMMENT_BREAK = re.compile(r"\n\s*//")  # between two line comments of a run
_SPDX_TAG = re.compile(r"SPDX-License-Identifier\s*:\s*(?P<value>.*)", re.IGNORECASE)


def _head_end(text: str, limit: int) -> int:
    """Where the head read for tags ends: at the end of the line holding character `limit`
    (a tag line is read whole or not at all: `MIT AND GPL-3.0-only` cut after `MIT` would
    pass for MIT), or where that line starts when it runs on for more than a KiB."""
    if len(text) <= limit:
        return len(text)
    newline = text.find("\n", limit, limit + 1024)
    if newline >= 0:
        return newline
    return max(0, text.rfind("\n", 0, limit))


def leading_comments(text: str, limit: int = 4096) -> list[str]:
    """The comments before the first line of code, within the first `limit` characters
    (the line that crosses it read to its end). What follows the first code token (string
    literals included) is not the header."""
    comments: list[str] = []
    pos = 0
    limit = _head_end(text, limit)
    while True:
        match = _HEAD_COMMENTS.match(text, pos, limit)  # as if the text ended at `limit`
        lines, block = match.groups()  # type: ignore[union-attr]  # all of it is optional
        if lines:
            comments += _LINE_COMMENT_BREAK.split(lines[2:])
        elif block:
            comments.append(block[2:].removesuffix("*/"))
        else:
            return comments
        pos = match.end()  # type: ignore[union-attr]


_IGNORE_START, _IGNORE_END = "REUSE-IgnoreStart", "REUSE-IgnoreEnd"


def _without_ignored(text: str, ignoring: bool) -> tuple[str, bool]:
    """`text` without what REUSE says to ignore ("Ignoring parts of a file", REUSE 3.x): from
    each `REUSE-IgnoreStart` to the next `REUSE-IgnoreEnd`, or to the end when none closes
    it (an example tag in a licence header is not the file's licence); `ignoring`: whether
    a block opened before `text` is still open, before and after it."""
    kept: list[str] = []
    pos = 0
    while True:
        if ignoring:
            end = text.find(_IGNORE_END, pos)
            if end < 0:
                return "".join(kept), True
            pos, ignoring = end + len(_IGNORE_END), False
        start = text.find(_IGNORE_START, pos)
        if start < 0:
            kept.append(text[pos:])
            return "".join(kept), False
        kept.append(text[pos:start])
        pos, ignoring = start + len(_IGNORE_START), True


def find_spdx_identifiers(text: str, limit: int = 4096) -> list[str]:
    """Every `SPDX-License-Identifier:` value in the leading comment block (REUSE reads the
    head of the file), in order, duplicates removed, none from a part REUSE ignores.
    Several values apply together (AND)."""
    found: list[str] = []
    ignoring = False  # a block may open in one comment and close in a later one
    for whole in leading_comments(text, limit):
        comment, ignoring = _without_ignored(whole, ignoring)
        for line in comment.splitlines():
            match = _SPDX_TAG.search(line)
            if match is None:
                continue
            value = match.group("value").strip().removesuffix("*/").strip().rstrip("*").strip()
            if value and value not in found:
                found.append(value)
    return found


def comment_text(text: str, limit: int) -> str:
    """The leading comments within `limit` characters, joined and lower-cased (what the
    notice patterns and the gate's quick `in` tests read)."""
    return "\n".join(leading_comments(text, limit)).lower()
