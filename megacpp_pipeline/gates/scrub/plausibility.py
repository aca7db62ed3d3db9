"""Plausibility rules: decides whether a value a pattern matched is a secret or one of the
look-alikes C++ is full of (identifiers, format strings, paths, versions, hash test vectors,
COM interface ids, `#include` lines), and reads the text around a match to tell."""

from __future__ import annotations

import math
import re
from collections import Counter
from typing import TYPE_CHECKING

from megacpp_pipeline.gates.scrub.hits import Kind

if TYPE_CHECKING:
    from megacpp_pipeline.gates.scrub.config import ScrubConfig


def line_bounds(text: str, pos: int) -> tuple[int, int]:
    start = text.rfind("\n", 0, pos) + 1
    end = text.find("\n", pos)
    return start, len(text) if end < 0 else end


_INCLUDE_LINE = re.compile(r"[ \t]*#[ \t]*(?:include|import|include_next)\b")


def on_include_line(text: str, pos: int) -> bool:
    """`#include "mirror/151.101.1.69/x.h"` names a file, not a host or a person."""
    start, _ = line_bounds(text, pos)
    return _INCLUDE_LINE.match(text, start) is not None


def context(
    text: str, start: int, end: int, before: int = 160, after: int = 40, lower: bool = True
) -> str:
    """The value's line plus the previous one (test vectors often label the line above)."""
    line_start, line_end = line_bounds(text, start)
    prev_start = text.rfind("\n", 0, max(line_start - 1, 0)) + 1 if line_start else 0
    lo = max(prev_start, start - before)
    around = text[lo:start] + " " + text[end : min(line_end, end + after)]
    return around.lower() if lower else around


_HASH_WORDS = re.compile(
    r"sha|md5|md4|hash|digest|crc|checksum|hmac|fingerprint|blake|siphash|murmur|fnv|xxh"
    r"|test.?vector|expected|golden|known.?answer"
)
_UUID_WORDS = re.compile(r"uuid|guid|__declspec|midl_interface|clsid|iid_|interface_id")
_HEX = re.compile(r"(?:0x)?[0-9A-Fa-f]{16,}")
_UUID = re.compile(
    r"\{?[0-9A-Fa-f]{8}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{12}\}?"
)


def is_hash_or_uuid(value: str, text: str, start: int, end: int) -> bool:
    """Hash test vectors, CRC tables and COM interface ids are high-entropy but public."""
    if _HEX.fullmatch(value):
        return _HASH_WORDS.search(context(text, start, end)) is not None
    if _UUID.fullmatch(value):
        return _UUID_WORDS.search(context(text, start, end)) is not None
    return False


def _shannon_entropy(value: str) -> float:
    n = len(value)
    return -sum(c / n * math.log2(c / n) for c in Counter(value).values())


WORD_CHAR = re.compile(r"[A-Za-z0-9_]")


def bounded(text: str, start: int, end: int) -> bool:
    """A token glued to identifier characters is part of a longer identifier, not a key."""
    if start > 0 and WORD_CHAR.match(text[start - 1]):
        return False
    return not (end < len(text) and WORD_CHAR.match(text[end]))


_CODE_NAME = re.compile(
    r"[a-z]+(?:_[a-z0-9]+)*|[A-Z]+(?:_[A-Z0-9]+)*|[a-z]+(?:[A-Z][a-z0-9]*)+|(?:[A-Z][a-z0-9]+){2,}"
    r"|[A-Za-z_][\w:.]*(?:\(\)?|->\w+)?"
)
_FORMAT = re.compile(r"%[-+ #0-9.]*[a-zA-Z]|\{\}|\$\{|\{\d+\}|<[A-Za-z_]+>")
_FILE_LIKE = re.compile(r"(?:^[./~]|://)|\.(?:pem|key|json|txt|ya?ml|h|hpp|cpp|crt|cfg|ini|env)$")
_KEY_CHARS = re.compile(r"[A-Za-z0-9+/=_\-.~:]+")


_SNAKE_NAME = re.compile(
    r"[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+|[a-z][a-z0-9]*(?:_[a-z0-9]+)+"
    r"|[A-Za-z][a-z0-9]*(?:-[A-Za-z][a-z0-9]*)+"  # kebab: `Access-Control-Allow-Headers`
)
_VERSION_VALUE = re.compile(r"[vV]?\d+(?:\.\d+)+")


_CODE_WORD = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+")


def _looks_like_code_name(value: str) -> bool:
    """`ApplicationDefaultCredentials`, `HTTPServerConfig`, `kw_static_cast`: letters forming
    words. Random letters-only tokens split into many one- and two-letter camelCase words."""
    if any(c.isdigit() for c in value) or not _CODE_NAME.fullmatch(value):
        return False
    words = _CODE_WORD.findall(value)
    short = sum(len(w) <= 2 for w in words)
    return short <= max(1, len(words) // 4)


def plausible_secret(value: str, kind: Kind, config: ScrubConfig) -> bool:
    """False for values that name something rather than being a secret: identifiers
    (`user_password_field`, `MEGACPP_API_KEY_2`, `kw_static_cast`), format strings, paths."""
    if any(c.isspace() for c in value) or _FORMAT.search(value) or _FILE_LIKE.search(value):
        return False
    if _SNAKE_NAME.fullmatch(value) or _VERSION_VALUE.fullmatch(value):
        return False
    if _looks_like_code_name(value):
        return False
    if kind is Kind.PASSWORD:
        return len(value) >= config.min_password_length
    if len(value) < config.min_key_length or not _KEY_CHARS.fullmatch(value):
        return False
    return _shannon_entropy(value) >= config.min_key_entropy


def folded(text: str) -> str:
    """Lowercase with one character per character, so offsets carry over to `text`."""
    lowered = text.lower()
    if len(lowered) == len(text):
        return lowered
    return "".join(c if len(c.lower()) != 1 else c.lower() for c in text)
