"""Tokens of issuers no rule names, by the shape issuers share: a short prefix, a separator and
a long random tail (`gsk_…`, `r8_…`, `key-…`, `NRAK-…`, `123456:AA…`), found where a token can
be told from a name (a literal's edge, a key-value's value, a comment), never a bare word in
code; digests, numbers, UUIDs and identifiers are kept."""

from __future__ import annotations

import functools
import itertools
import re
from collections.abc import Iterator

from megacpp_pipeline.gates.scrub.plausibility import identifier_like, shannon_entropy
from megacpp_pipeline.gates.scrub.re2_bytes import ANCHOR_START, ByteOffsets, BytesRegex

_PREFIXED_TOKEN = BytesRegex(
    # unbounded loops keep RE2's automaton small; _prefixed_token checks the lengths
    r"(?:^|[\s\"'`=:(,{\[])(?P<token>[A-Za-z0-9]+(?:[_.\-][A-Za-z0-9]+)*"
    # (only files the screen's strict tail probe passed get here)
    r"[_.:\-][A-Za-z0-9]+(?:[_\-][A-Za-z0-9]+)*)"
    r"(?:[\s\"'`;,)}\]]|\\[nr]|$)"
)
# what the screen looks for before the token regex runs at all: some separator followed by a
# tail that could pass _random_tail (digits and both cases in any order, letters flipping
# case in short runs, or 32 hex digits); far rarer in C++ than the token regex's matches
_ANY = "[A-Za-z0-9]*"
_TAIL_SCREEN = "|".join(
    [
        *(
            _ANY + a + _ANY + b + _ANY + c
            for a, b, c in itertools.permutations((r"\d", "[A-Z]", "[a-z]"))
        ),
        r"[A-Za-z]*(?:[A-Z]{1,4}[a-z]{1,4}){5}",
        # one case, letters and digits alternating again and again: base36 (`NRAK-…`)
        "[0-9]*(?:[A-Z]+[0-9]+){3}",
        "[0-9]*(?:[a-z]+[0-9]+){3}",
        "[0-9a-f]{32}",
        "[0-9A-F]{32}",
    ]
)
PREFIXED_SCREEN = (
    r"(?:^|[\s\"'`=:(,{\[])[A-Za-z0-9]+(?:[_.\-][A-Za-z0-9]+)*[_.:\-](?:" + _TAIL_SCREEN + ")"
)
_SEPARATORS = "_.:-"
_PREFIX = re.compile(r"[A-Za-z0-9]{2,12}(?:[_.\-][A-Za-z0-9]{1,12}){0,2}")
_HEX_TAIL = re.compile(r"[0-9a-f]{32,}|[0-9A-F]{32,}")
_HEX_GROUPS = re.compile(r"[0-9a-f]+(?:-[0-9a-f]+)+")  # `PMAK-<24 hex>-<34 hex>`
# a digest's or an id's label before hex is not an issuer's prefix (`sha256-…`, `git-…`)
_DIGEST_LABEL = re.compile(
    r"(?i:sha\d*|md5|blake\w*|xxh\w*|crc\d*|git|commit|rev|build|hash|digest|sum|id|uuid|guid"
    r"|diff)"
)
_UUID_TAIL = re.compile(r"[0-9a-fA-F]{8}(?:-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}")
PREFIXED_TOKEN_DETECTOR = "prefixed_token"


def _random_tail(tail: str) -> bool:
    if len(tail) < 20 or _UUID_TAIL.search(tail) or identifier_like(tail):
        return False
    if _HEX_TAIL.fullmatch(tail) or (
        _HEX_GROUPS.fullmatch(tail) and sum(c != "-" for c in tail) >= 32
    ):
        return shannon_entropy(tail.replace("-", "")) >= 3.3
    letters = [c for c in tail if c.isalpha()]
    upper = sum(c.isupper() for c in letters)
    if not letters:
        return False
    if upper in (0, len(letters)):  # one case: base36, if digits run all through it
        digits = sum(c.isdigit() for c in tail)
        return "_" not in tail and digits >= 3 and shannon_entropy(tail) >= 3.7
    if any(c.isdigit() for c in tail):
        return shannon_entropy(tail) >= 3.8
    # letters only (Hugging Face's `hf_…`): random case, not camelCase words, whose
    # capitals are a fifth of the letters at most
    return 0.3 <= upper / len(letters) <= 0.7 and shannon_entropy(tail) >= 4.2


# a C++ number (`0x1.19ae7cc6c0211df5e417p-1`, a hex float) is not a token
_NUMBER_LITERAL = re.compile(
    r"0[xX][0-9a-fA-F.']+(?:[pP][-+]?\d+)?[fFlLuU]*|\d[\d.']*(?:[eE][-+]?\d+)?[fFlLuU]*"
)


def _prefixed_token(token: str) -> bool:
    """Some split of the token into a short prefix and a random tail."""
    if not 23 <= len(token) <= 256 or _UUID_TAIL.search(token):
        return False
    if _NUMBER_LITERAL.fullmatch(token):
        return False
    for i, c in enumerate(token[:40]):
        if c in _SEPARATORS and i >= 2 and _PREFIX.fullmatch(token, 0, i):
            prefix, tail = token[:i], token[i + 1 :]
            if c != ":" and not any(ch.isalpha() for ch in prefix):
                continue  # an issuer names itself (`00-<trace id>-...` is W3C's traceparent)
            if _DIGEST_LABEL.fullmatch(prefix.split("-")[-1]):
                return False  # `SHA256:…` (an ssh fingerprint), `sha512-…` (SRI)
            if _random_tail(tail):
                return True
    return False


_TOKEN_BYTES = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.:-")


_DIGEST_KEY = re.compile(rb"(?i)(?:sha\d*|md5|blake\w*|hash|digest|checksum|integrity)[=:][ \t]*\Z")
_COMMENT_LINE = re.compile(rb"\s*(?:/[/*]|\*|#(?!\s*(?:define|if|ifn?def|include|undef)\b))")


# How far back a token's context is read: copying everything before it (or its whole line)
# for each candidate made a 1 MB file of name lists take 4-46 s
_LOOK_BACK = 1024


def _line_head(data: bytes, pos: int) -> tuple[bytes, bool]:
    """The line's text before `pos`, at most _LOOK_BACK bytes of it, and whether that is
    all of it (the line starts there)."""
    newline = data.rfind(b"\n", max(0, pos - _LOOK_BACK), pos)
    if newline >= 0 or pos <= _LOOK_BACK:
        return data[newline + 1 : pos], True
    return data[pos - _LOOK_BACK : pos], False


def _token_position(data: bytes, start: int, end: int) -> bool:
    """Where a token of unknown issuer can be told from a name: a string literal's edge, a
    key-value's value, or a comment (an unbroken tail there); a bare word in code is a name
    (`ETHTOOL_LINK_MODE_10baseT_Half_BIT`, `Iop_QNarrowBin32Sto16Sx4`)."""
    if _DIGEST_KEY.search(data, max(0, start - 32), start):
        return False  # `sha256=<base64url>` (a wheel's RECORD, SRI): a digest, not a token
    before, after = data[start - 1 : start], data[end : end + 1]
    if before in (b'"', b"'", b"`", b"=", b":") or after in (b'"', b"'", b"`"):
        return True
    if after == b")" and data[end + 1 : end + 2] == b'"':
        return True  # a raw string's content: `R"(token)"`
    if data[max(0, start - _LOOK_BACK) : start].rstrip(b" \t")[-1:] in (b"=", b":"):
        return True
    head, whole = _line_head(data, start)
    in_comment = b"//" in head or b"/*" in head or (whole and _COMMENT_LINE.match(head) is not None)
    tail = re.split(rb"[_.:\-]", data[start:end], maxsplit=1)[-1]
    return in_comment and tail.isalnum() and len(tail) >= 20


@functools.cache
def _prefixed_screen() -> BytesRegex:
    return BytesRegex(PREFIXED_SCREEN)


def prefixed_tokens(text: str, data: bytes, literal: bool = False) -> Iterator[tuple[int, int]]:
    """Tokens where the strict screen pattern starts (few), each read whole by the token
    regex anchored there."""
    offsets = ByteOffsets(text, data)
    pos = 0
    for hit in _prefixed_screen().spans(data):
        if hit[0][0] < pos:
            continue
        # the screen may start inside a longer token (`123:AA…_x9…`): read it whole
        start = hit[0][0]
        while start > 0 and data[start - 1] in _TOKEN_BYTES:
            start -= 1
        spans = _PREFIXED_TOKEN.program.Match(ANCHOR_START, data, max(0, start - 1), len(data))
        if spans[0][0] < 0:
            spans = _PREFIXED_TOKEN.program.Match(ANCHOR_START, data, hit[0][0], len(data))
        if spans[0][0] < 0:
            continue
        s_b, e_b = spans[1]
        pos = e_b
        # on a preprocessor line only a quoted token is data (`#ifndef GUARD_<hex>` is a name)
        head, whole = _line_head(data, s_b)
        if whole and head.lstrip().startswith(b"#") and data[s_b - 1 : s_b] not in (b'"', b"'"):
            continue
        if (literal or _token_position(data, s_b, e_b)) and _prefixed_token(data[s_b:e_b].decode()):
            yield offsets.char(s_b), offsets.char(e_b)
