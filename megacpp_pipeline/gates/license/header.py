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


def leading_comments(text: str, limit: int = 4096) -> list[str]:
    """The comments before the first line of code, within the first `limit` characters.
    What follows the first code token (string literals included) is not the header."""
    comments: list[str] = []
    pos = 0
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


def find_spdx_identifiers(text: str, limit: int = 4096) -> list[str]:
    """Every `SPDX-License-Identifier:` value in the leading comment block (REUSE reads the
    head of the file), in order, duplicates removed. Several values apply together (AND)."""
    found: list[str] = []
    for comment in leading_comments(text, limit):
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
