"""Credentials found by the name they are given: a value assigned to `password`, `api_key`,
`secret`, `token` and the like (quoted, or bare in connection strings and command lines), and
the password in a URL's `user:password@`. Whether the value is a secret or a name, format or
hash is plausibility's call."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import TYPE_CHECKING

from detect_secrets.plugins.basic_auth import BasicAuthDetector
from detect_secrets.plugins.keyword import DENYLIST as DETECT_SECRETS_KEYWORDS

from megacpp_pipeline.gates.scrub.hits import Hit, Kind
from megacpp_pipeline.gates.scrub.plausibility import (
    folded,
    is_hash_or_uuid,
    on_include_line,
    plausible_secret,
)

if TYPE_CHECKING:
    from megacpp_pipeline.gates.scrub.config import ScrubConfig


# ---- passwords in URLs (user:password@host), detect-secrets' basic-auth pattern


def find_basic_auth(text: str, config: ScrubConfig) -> Iterator[Hit]:
    for m in BasicAuthDetector.denylist[0].finditer(text):
        start, end = m.span(1)
        if not on_include_line(text, start):
            yield Hit(start, end, Kind.PASSWORD, "basic_auth_url")


# ---- generic secrets assigned to names like password / secret / token / api_key

_PASSWORD_NAMES = ("db_?pass", "database_?pass", "key_?pass", "password", "passwd", "pwd")
_PASSWORD_NAME = re.compile("|".join(_PASSWORD_NAMES) + "|contrase", re.IGNORECASE)
_KEYWORDS = (
    *DETECT_SECRETS_KEYWORDS,
    "token",
    "access_?key",
    "secret_?key",
    "credential",
    "bearer",
)
_KEYWORD_ALT = "|".join(_KEYWORDS)
_ASSIGNED_QUOTED = re.compile(
    rf"(?P<name>(?:{_KEYWORD_ALT})\w*+)"  # possessive: no O(line) backtrack per keyword
    r"(?:[^\S\n]*\[[^\S\n]*\w*[^\S\n]*\])?[\"'\]]{0,2}[^\S\n]*(?:=|:=|==|!=|:|\(|\{|,|->|=>)?"
    r"[^\S\n]*\(?[^\S\n]*"
    r"(?:L|u8|u|U)?(?P<q>[\"'`])(?P<value>[^\"'`\n\\]{1,256})(?P=q)",
    re.IGNORECASE,
)
# `host=db;password=S3cr3t!;`, `export DB_PASSWORD=x`, `--token=abc`: only after ; & ? " '
# whitespace or --, with no spaces around `=`, so that C++ assignments such as
# `password = read_password();` stay out.
_ASSIGNED_BARE = re.compile(
    rf"(?:(?<=[;&?\"'\s])|(?<=--))(?P<name>(?:{_KEYWORD_ALT})\w*+)=(?P<value>[^\s\"'`;&,)]{{4,128}})",
    re.IGNORECASE,
)


def _keyword_literals() -> tuple[str, ...]:
    """detect-secrets' keyword regexes spelled out as plain lowercase words (`api_?key` gives
    `api_key` and `apikey`), so they can be found with str.find instead of a case-insensitive
    alternation, which Python's `re` scans at a few MB/s."""
    out: list[str] = []
    for k in _KEYWORDS:
        out += [k.replace("_?", "_"), k.replace("_?", "")] if "_?" in k else [k]
    return tuple(dict.fromkeys(out))


KEYWORD_LITERALS = _keyword_literals()


def find_assigned_secret(text: str, config: ScrubConfig) -> Iterator[Hit]:
    lowered = folded(text)
    seen: set[tuple[int, int]] = set()
    for word in KEYWORD_LITERALS:
        pos = lowered.find(word)
        while pos >= 0:
            for pattern in (_ASSIGNED_QUOTED, _ASSIGNED_BARE):
                m = pattern.match(text, pos)
                if m is None or m.span("value") in seen:
                    continue
                seen.add(m.span("value"))
                yield from _assigned_hit(text, m, config)
            pos = lowered.find(word, pos + 1)


def _assigned_hit(text: str, m: re.Match[str], config: ScrubConfig) -> Iterator[Hit]:
    start, end = m.span("value")
    value = m.group("value")
    kind = Kind.PASSWORD if _PASSWORD_NAME.search(m.group("name")) else Kind.API_KEY
    if not plausible_secret(value, kind, config):
        return
    if on_include_line(text, start) or is_hash_or_uuid(value, text, start, end):
        return
    yield Hit(start, end, kind, "assigned_secret")
