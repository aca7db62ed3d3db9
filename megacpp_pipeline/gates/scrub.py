"""Scrub gate: decides which spans of a file's text are personal data or secrets and replaces
them with stable placeholders. Seed rule: "normalize emails, IP addresses, API keys, SSH keys,
and machine-local paths into stable placeholders before the shard is tokenized".

Regex PII over-fires on code (BigCode measured 69.8% precision for a naive email regex), so
every detector pairs a pattern with C++-aware filters; vendor key patterns are imported from
detect-secrets' plugins (its scanner is far too slow for the hot path, its regexes are not).
"""

from __future__ import annotations

import bisect
import hashlib
import hmac
import ipaddress
import math
import re
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from enum import StrEnum

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from detect_secrets.plugins.aws import AWSKeyDetector
from detect_secrets.plugins.azure_storage_key import AzureStorageKeyDetector
from detect_secrets.plugins.basic_auth import BasicAuthDetector
from detect_secrets.plugins.github_token import GitHubTokenDetector
from detect_secrets.plugins.gitlab_token import GitLabTokenDetector
from detect_secrets.plugins.ip_public import IPPublicDetector
from detect_secrets.plugins.jwt import JwtTokenDetector
from detect_secrets.plugins.keyword import DENYLIST as DETECT_SECRETS_KEYWORDS
from detect_secrets.plugins.mailchimp import MailchimpDetector
from detect_secrets.plugins.npm import NpmDetector
from detect_secrets.plugins.openai import OpenAIDetector
from detect_secrets.plugins.private_key import PrivateKeyDetector
from detect_secrets.plugins.pypi_token import PypiTokenDetector
from detect_secrets.plugins.sendgrid import SendGridDetector
from detect_secrets.plugins.slack import SlackDetector
from detect_secrets.plugins.square_oauth import SquareOAuthDetector
from detect_secrets.plugins.stripe import StripeDetector
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from megacpp_pipeline.core import schemas
from megacpp_pipeline.core.gate import GateResult
from megacpp_pipeline.core.ledger import DropReason, drops


class Kind(StrEnum):
    EMAIL = "email"
    IP_ADDRESS = "ip_address"
    API_KEY = "api_key"
    PASSWORD = "password"
    PRIVATE_KEY = "private_key"
    SSH_KEY = "ssh_key"
    LOCAL_PATH = "local_path"


# Resolvers that are public infrastructure, not anybody's machine (kept like BigCode did).
WELL_KNOWN_DNS: tuple[str, ...] = (
    "8.8.8.8",
    "8.8.4.4",
    "1.1.1.1",
    "1.0.0.1",
    "9.9.9.9",
    "149.112.112.112",
    "208.67.222.222",
    "208.67.220.220",
    "4.2.2.1",
    "4.2.2.2",
    "64.6.64.6",
    "64.6.65.6",
    "2001:4860:4860::8888",
    "2001:4860:4860::8844",
    "2606:4700:4700::1111",
    "2606:4700:4700::1001",
    "2620:fe::fe",
    "2620:fe::9",
)


class Placeholders(BaseModel):
    """The exact strings that replace each kind (documented; renameable in config)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    email: str = "<EMAIL>"
    ip_address: str = "<IP_ADDRESS>"
    api_key: str = "<API_KEY>"
    password: str = "<PASSWORD>"
    private_key: str = "<PRIVATE_KEY>"
    ssh_key: str = "<SSH_KEY>"
    local_path: str = "<LOCAL_PATH>"

    def for_kind(self, kind: Kind) -> str:
        return str(getattr(self, kind.value))


class ScrubConfig(BaseModel):
    """Every threshold and keep-list of the scrub gate; nothing else in the module is tunable."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    placeholders: Placeholders = Placeholders()
    # keep `/proj/src/a.cpp` of `/home/alice/proj/src/a.cpp` (replacing only `/home/alice`)
    keep_path_tail: bool = False
    # HMAC key for the audit's value hashes; set a private one in production so a short
    # password cannot be recovered from the audit by brute force.
    audit_salt: str = Field(default="megacpp-scrub-audit-v1", min_length=8)
    keep_ips: tuple[str, ...] = (*WELL_KNOWN_DNS, "1.2.3.4")  # and the textbook example
    # local parts of addresses that are service accounts, not people (git@github.com:org/x)
    role_email_users: tuple[str, ...] = ("git", "hg", "svn", "anonymous", "noreply", "no-reply")
    # home directories of documentation examples (`/home/user/.cache`), not of a person
    generic_users: tuple[str, ...] = ("user", "username", "yourname", "your_name", "me", "foo")
    min_password_length: int = Field(default=6, ge=1)
    min_key_length: int = Field(default=12, ge=1)
    min_key_entropy: float = Field(default=3.0, ge=0.0)  # bits per character
    # BigCode's version rule, generalized: a dotted quad whose every number is at most this
    # (`1.2.3.4`, `18.11.2.7` section numbers) is a version unless network words are near
    version_like_max_octet: int = Field(default=99, ge=0, le=255)
    sample_lines: int = Field(default=20, ge=0)

    @field_validator("keep_ips")
    @classmethod
    def _keep_ips_are_addresses(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for ip in value:
            ipaddress.ip_address(ip)  # ValueError names the bad entry
        return tuple(str(ipaddress.ip_address(ip)) for ip in value)

    @model_validator(mode="after")
    def _placeholders_are_inert(self) -> ScrubConfig:
        values = [self.placeholders.for_kind(k) for k in Kind]
        if len(set(values)) != len(values):
            raise ValueError(f"placeholders: must be distinct, got {values}")
        for kind in Kind:
            value = self.placeholders.for_kind(kind)
            if not value or "\n" in value:
                raise ValueError(f"placeholders.{kind.value}: must be one non-empty line")
            hits = _detect(value, self, _DETECTORS, ignore_placeholders=False)
            if hits:
                raise ValueError(
                    f"placeholders.{kind.value}: {value!r} itself looks like a {hits[0].kind}"
                )
        return self


@dataclass(frozen=True)
class Finding:
    kind: Kind
    detector: str
    start_byte: int  # UTF-8 byte offsets in the scrubbed function's input text
    end_byte: int
    value_hash: str  # HMAC-SHA256(audit_salt, value); the value itself is never kept


AUDIT_SCHEMA = pa.schema(
    [
        pa.field("source_id", pa.string(), nullable=False),
        pa.field("path", pa.string(), nullable=False),
        pa.field("kind", pa.string(), nullable=False),
        pa.field("detector", pa.string(), nullable=False),
        pa.field("start_byte", pa.int64(), nullable=False),  # in the gate's input text
        pa.field("end_byte", pa.int64(), nullable=False),
        pa.field("value_hash", pa.string(), nullable=False),
    ],
    metadata={"megacpp.table": "scrub_audit", "megacpp.schema_version": schemas.SCHEMA_VERSION},
)


class ScrubError(ValueError):
    """A file whose scrubbed text still trips a detector (names the file and the detector)."""

    def __init__(self, path: str, finding: Finding) -> None:
        super().__init__(
            f"{path}: {finding.kind} still detected by {finding.detector} "
            f"at bytes {finding.start_byte}-{finding.end_byte} after scrubbing"
        )
        self.path = path
        self.finding = finding


# --------------------------------------------------------------------------- detectors


@dataclass(frozen=True)
class _Hit:
    start: int  # character offsets of the replaced span
    end: int
    kind: Kind
    detector: str


_Finder = Callable[[str, ScrubConfig], Iterator[_Hit]]


@dataclass(frozen=True)
class _Detector:
    """A finder plus its cheap prefilter: the finder only runs on a text that contains one
    of `triggers` (lowercase, compared case-folded if `ignore_case`) or matches one of
    `trigger_regexes` (each starts with a literal, so `re` skips ahead fast).

    Rare triggers (vendor prefixes, PEM headers, secret-sounding names) are ORed by run()
    into one RE2 pattern that Arrow evaluates over the whole column; `common` detectors
    (`@`, `://`, dotted numbers are in most C++ files) are checked per row in Python."""

    name: str
    priority: int  # lower wins when two detectors claim overlapping text
    find: _Finder
    triggers: tuple[str, ...] = ()
    ignore_case: bool = False
    trigger_regexes: tuple[re.Pattern[str], ...] = ()
    common: bool = False

    def triggered(self, text: str, folded: Callable[[], str]) -> bool:
        if any(r.search(text) for r in self.trigger_regexes):
            return True
        haystack = folded() if self.ignore_case else text
        return any(t in haystack for t in self.triggers)

    def re2_prefilter(self) -> str:
        return "|".join(
            f"(?i:{re.escape(t)})" if self.ignore_case else re.escape(t) for t in self.triggers
        )


def _line_bounds(text: str, pos: int) -> tuple[int, int]:
    start = text.rfind("\n", 0, pos) + 1
    end = text.find("\n", pos)
    return start, len(text) if end < 0 else end


_INCLUDE_LINE = re.compile(r"[ \t]*#[ \t]*(?:include|import|include_next)\b")


def _on_include_line(text: str, pos: int) -> bool:
    """`#include "mirror/151.101.1.69/x.h"` names a file, not a host or a person."""
    start, _ = _line_bounds(text, pos)
    return _INCLUDE_LINE.match(text, start) is not None


def _context(
    text: str, start: int, end: int, before: int = 160, after: int = 40, lower: bool = True
) -> str:
    """The value's line plus the previous one (test vectors often label the line above)."""
    line_start, line_end = _line_bounds(text, start)
    prev_start = text.rfind("\n", 0, max(line_start - 1, 0)) + 1 if line_start else 0
    lo = max(prev_start, start - before)
    context = text[lo:start] + " " + text[end : min(line_end, end + after)]
    return context.lower() if lower else context


_HASH_WORDS = re.compile(
    r"sha|md5|md4|hash|digest|crc|checksum|hmac|fingerprint|blake|siphash|murmur|fnv|xxh"
    r"|test.?vector|expected|golden|known.?answer"
)
_UUID_WORDS = re.compile(r"uuid|guid|__declspec|midl_interface|clsid|iid_|interface_id")
_HEX = re.compile(r"(?:0x)?[0-9A-Fa-f]{16,}")
_UUID = re.compile(
    r"\{?[0-9A-Fa-f]{8}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{12}\}?"
)


def _is_hash_or_uuid(value: str, text: str, start: int, end: int) -> bool:
    """Hash test vectors, CRC tables and COM interface ids are high-entropy but public."""
    if _HEX.fullmatch(value):
        return _HASH_WORDS.search(_context(text, start, end)) is not None
    if _UUID.fullmatch(value):
        return _UUID_WORDS.search(_context(text, start, end)) is not None
    return False


def _shannon_entropy(value: str) -> float:
    n = len(value)
    return -sum(c / n * math.log2(c / n) for c in Counter(value).values())


_WORD_CHAR = re.compile(r"[A-Za-z0-9_]")


def _bounded(text: str, start: int, end: int) -> bool:
    """A token glued to identifier characters is part of a longer identifier, not a key."""
    if start > 0 and _WORD_CHAR.match(text[start - 1]):
        return False
    return not (end < len(text) and _WORD_CHAR.match(text[end]))


# ---- vendor keys: detect-secrets' plugin regexes, reused as compiled there


@dataclass(frozen=True)
class _VendorPattern:
    name: str
    pattern: re.Pattern[str]
    group: int = 0
    bounded: bool = True
    trim: re.Pattern[str] | None = None  # keep only this prefix of an over-greedy match
    valid: Callable[[str], bool] | None = None


_NPM_TOKEN_CHARS = re.compile(r"[A-Za-z0-9_\-]+")
# detect-secrets ends its JWT pattern lazily (`*?`), which stops before the signature.
_JWT = re.compile(JwtTokenDetector.denylist[0].pattern.replace("*?", "*"))
_AZURE = re.compile(
    "AccountKey=(" + AzureStorageKeyDetector.denylist[0].pattern[len("AccountKey=") :] + ")"
)


def _valid_jwt(token: str) -> bool:
    return bool(JwtTokenDetector.is_formally_valid(token.rstrip(".")))


_GITLAB_PREFIXES: tuple[str, ...] = (
    "glpat-",
    "gldt-",
    "glft-",
    "glsoat-",
    "glrt-",
    "GR1348941",
    "glcbt-",
)
_GITLAB_PREFIXES += ("glimt-", "glptt-", "glagent-", "gloas-")
_VENDOR_KEYS: tuple[tuple[tuple[str, ...], bool, tuple[_VendorPattern, ...]], ...] = (
    (
        ("AKIA", "ASIA", "ABIA", "ACCA", "A3T"),
        False,
        (_VendorPattern("aws_access_key_id", AWSKeyDetector.denylist[0]),),
    ),
    (
        ("aws",),
        True,
        (_VendorPattern("aws_secret_access_key", AWSKeyDetector.denylist[1], group=1),),
    ),
    (
        ("ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_"),
        False,
        (
            _VendorPattern("github_token", GitHubTokenDetector.denylist[0]),
            # fine-grained tokens, which detect-secrets 1.5 does not know yet
            _VendorPattern("github_token", re.compile(r"github_pat_[A-Za-z0-9_]{82}")),
        ),
    ),
    (
        _GITLAB_PREFIXES,
        False,
        tuple(_VendorPattern("gitlab_token", p) for p in GitLabTokenDetector.denylist),
    ),
    (
        ("xox", "hooks.slack.com"),
        True,
        tuple(_VendorPattern("slack_token", p) for p in SlackDetector.denylist),
    ),
    (("k_live_",), False, (_VendorPattern("stripe_key", StripeDetector.denylist[0]),)),
    (("T3BlbkFJ",), False, (_VendorPattern("openai_key", OpenAIDetector.denylist[0]),)),
    (
        ("_authToken", "npm_"),
        False,
        (
            _VendorPattern(
                "npm_token", NpmDetector.denylist[0], group=1, bounded=False, trim=_NPM_TOKEN_CHARS
            ),
            _VendorPattern("npm_token", re.compile(r"npm_[A-Za-z0-9]{36}")),
        ),
    ),
    (
        ("pypi-Ag",),
        False,
        tuple(_VendorPattern("pypi_token", p) for p in PypiTokenDetector.denylist),
    ),
    (("eyJ",), False, (_VendorPattern("jwt", _JWT, valid=_valid_jwt),)),
    (
        ("AIza",),
        False,
        (_VendorPattern("google_api_key", re.compile(r"AIza[0-9A-Za-z_\-]{35}")),),
    ),
    (("SG.",), False, (_VendorPattern("sendgrid_key", SendGridDetector.denylist[0]),)),
    (("-us",), False, (_VendorPattern("mailchimp_key", MailchimpDetector.denylist[0]),)),
    (
        ("AccountKey=",),
        False,
        (_VendorPattern("azure_storage_key", _AZURE, group=1, bounded=False),),
    ),
    (("sq0csp-",), False, (_VendorPattern("square_oauth", SquareOAuthDetector.denylist[0]),)),
)


def _vendor_finder(patterns: tuple[_VendorPattern, ...]) -> _Finder:
    def find(text: str, config: ScrubConfig) -> Iterator[_Hit]:
        for vp in patterns:
            for m in vp.pattern.finditer(text):
                start, end = m.span(vp.group)
                if vp.trim is not None:
                    t = vp.trim.match(text, start, end)
                    if t is None:
                        continue
                    end = t.end()
                if vp.bounded and not _bounded(text, start, end):
                    continue
                value = text[start:end]
                if vp.valid is not None and not vp.valid(value):
                    continue
                if _on_include_line(text, start) or _is_hash_or_uuid(value, text, start, end):
                    continue
                yield _Hit(start, end, Kind.API_KEY, vp.name)

    return find


# ---- passwords in URLs (user:password@host), detect-secrets' basic-auth pattern


def _find_basic_auth(text: str, config: ScrubConfig) -> Iterator[_Hit]:
    for m in BasicAuthDetector.denylist[0].finditer(text):
        start, end = m.span(1)
        if not _on_include_line(text, start):
            yield _Hit(start, end, Kind.PASSWORD, "basic_auth_url")


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


def _plausible_secret(value: str, kind: Kind, config: ScrubConfig) -> bool:
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


def _keyword_literals() -> tuple[str, ...]:
    """detect-secrets' keyword regexes spelled out as plain lowercase words (`api_?key` gives
    `api_key` and `apikey`), so they can be found with str.find instead of a case-insensitive
    alternation, which Python's `re` scans at a few MB/s."""
    out: list[str] = []
    for k in _KEYWORDS:
        out += [k.replace("_?", "_"), k.replace("_?", "")] if "_?" in k else [k]
    return tuple(dict.fromkeys(out))


_KEYWORD_LITERALS = _keyword_literals()


def _folded(text: str) -> str:
    """Lowercase with one character per character, so offsets carry over to `text`."""
    lowered = text.lower()
    if len(lowered) == len(text):
        return lowered
    return "".join(c if len(c.lower()) != 1 else c.lower() for c in text)


def _find_assigned_secret(text: str, config: ScrubConfig) -> Iterator[_Hit]:
    lowered = _folded(text)
    seen: set[tuple[int, int]] = set()
    for word in _KEYWORD_LITERALS:
        pos = lowered.find(word)
        while pos >= 0:
            for pattern in (_ASSIGNED_QUOTED, _ASSIGNED_BARE):
                m = pattern.match(text, pos)
                if m is None or m.span("value") in seen:
                    continue
                seen.add(m.span("value"))
                yield from _assigned_hit(text, m, config)
            pos = lowered.find(word, pos + 1)


def _assigned_hit(text: str, m: re.Match[str], config: ScrubConfig) -> Iterator[_Hit]:
    start, end = m.span("value")
    value = m.group("value")
    kind = Kind.PASSWORD if _PASSWORD_NAME.search(m.group("name")) else Kind.API_KEY
    if not _plausible_secret(value, kind, config):
        return
    if _on_include_line(text, start) or _is_hash_or_uuid(value, text, start, end):
        return
    yield _Hit(start, end, kind, "assigned_secret")


# ---- private keys (PEM / OpenSSH / PGP / PuTTY) and ssh public keys with user@host

_PEM_BEGIN = re.compile(r"-{4,5} ?BEGIN (?P<label>[A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?) ?-{4,5}")
_BASE64_LINE = re.compile(r"[^\S\n]*[\"'(]?[A-Za-z0-9+/=:\-, ]{16,}(?:\\n)?[\"']?[^\S\n]*(?:\n|$)")
_PUTTY = re.compile(r"PuTTY-User-Key-File-\d+:.*?Private-MAC: ?[0-9a-fA-F]+", re.DOTALL)


def _find_private_key(text: str, config: ScrubConfig) -> Iterator[_Hit]:
    pos = 0
    while (m := _PEM_BEGIN.search(text, pos)) is not None:
        end_re = re.compile(r"-{4,5} ?END " + re.escape(m.group("label")) + r" ?-{4,5}")
        e = end_re.search(text, m.end())
        if e is not None:
            end = e.end()
        else:
            # truncated block: redact the base64 lines that follow the header
            end = m.end()
            nl = text.find("\n", end)
            cursor = len(text) if nl < 0 else nl + 1
            while (
                cursor < len(text) and (b := _BASE64_LINE.match(text, cursor)) and b.end() > cursor
            ):
                end = cursor + len(b.group(0).rstrip())
                cursor = b.end()
        yield _Hit(m.start(), end, Kind.PRIVATE_KEY, "pem_private_key")
        pos = end
    for m in _PUTTY.finditer(text):
        yield _Hit(m.start(), m.end(), Kind.PRIVATE_KEY, "putty_private_key")


_SSH_PUBLIC_KEY = re.compile(
    r"(?<![\w-])(?:ssh-(?:rsa|dss|ed25519)|ecdsa-sha2-nistp(?:256|384|521)"
    r"|sk-(?:ssh-ed25519|ecdsa-sha2-nistp256)@openssh\.com)"
    r" AAAA[0-9A-Za-z+/]{16,}={0,3}(?: [^\s\"'<>\\@]+@[^\s\"'<>\\]*[^\s\"'<>\\.,;])?"
)


def _find_ssh_key(text: str, config: ScrubConfig) -> Iterator[_Hit]:
    for m in _SSH_PUBLIC_KEY.finditer(text):
        yield _Hit(m.start(), m.end(), Kind.SSH_KEY, "ssh_public_key")


# ---- emails: anchored on '@' (a literal, so the search is fast), local part read backwards

_EMAIL_DOMAIN = re.compile(
    r"@(?P<domain>[A-Za-z0-9](?:[A-Za-z0-9-]{0,62})(?:\.[A-Za-z0-9-]{1,63})+)"
)
_EMAIL_LOCAL = re.compile(r"[A-Za-z0-9._%+-]{1,64}\Z")
# `icon@2x.png`, `lib@1.2/api.hpp`: a file name, not a mailbox
_FILE_EXTENSION = re.compile(
    r"png|jpe?g|gif|svg|bmp|ico|webp|tga|css|m?js|ts|map|json|ya?ml|xml|html?|md|rst|txt|cmake"
    r"|[ch]|hh|[ch]pp|[ch]xx|cc|ipp|inl|tcc|py|rs|sh|so|dll|dylib|exe|lib|obj|pdf|zip|gz|tar"
    r"|bz2|xz|whl|ttf|woff2?",
    re.IGNORECASE,
)


def _find_email(text: str, config: ScrubConfig) -> Iterator[_Hit]:
    for m in _EMAIL_DOMAIN.finditer(text):
        at = m.start()
        local = _EMAIL_LOCAL.search(text, max(0, at - 64), at)
        if local is None:
            continue
        start = local.start()
        while start < at and text[start] in ".%+-":
            start += 1
        if start == at:
            continue
        domain = m.group("domain").rstrip("-")
        tld = domain.rsplit(".", 1)[-1]
        if not (tld.isalpha() and 2 <= len(tld) <= 24) or _FILE_EXTENSION.fullmatch(tld):
            continue
        if text[start:at].lower() in config.role_email_users:
            continue
        if _on_include_line(text, start):
            continue
        yield _Hit(start, at + 1 + len(domain), Kind.EMAIL, "email")


# ---- IP addresses: detect-secrets' public-IPv4 pattern, then ipaddress decides what is public

_IPV4 = IPPublicDetector.denylist[0]
# global unicast IPv6 is 2000::/3, so the first hextet is four hex digits starting 2 or 3
_IPV6 = re.compile(r"(?<![\w:.])[23][0-9A-Fa-f]{3}:[0-9A-Fa-f:]*[0-9A-Fa-f](?![\w:.])")
_VERSION_CONTEXT = re.compile(
    r"version|(?<![a-z])ver(?![a-z])|release|since|revision|(?<![a-z])rev(?![a-z])|\bv\s*$"
)
# no "http": URLs in comments are everywhere in C++ (`index.html?path=4.1.1.4`); the host
# right after `://` or `@` is checked on its own
# words start after a non-letter or at a camelCase hump (`kServer`, `TELEMETRY_HOST`), so
# `observers` does not read as `server`
_NETWORK_CONTEXT = re.compile(
    r"(?:(?<![A-Za-z])|(?<=[a-z])(?=[A-Z]))(?i:dns|server|host|ip(?![a-z])|addr|connect|proxy"
    r"|endpoint|socket|inet|peer|mirror|upstream|remote|gateway|route|ping(?![a-z])|firewall"
    r"|subnet|listen|bind(?![a-z]))"
)


def _is_network_context(text: str, start: int, end: int) -> bool:
    """Host position in a URL, a string literal holding nothing but the address, or
    network words on the line or the line above."""
    if text.endswith("://", 0, start) or text.endswith("@", 0, start):
        return True
    if start and text[start - 1] in "\"'" and text.startswith(text[start - 1], end):
        return True
    return _NETWORK_CONTEXT.search(_context(text, start, end, lower=False)) is not None


# C++ standard citations look like dotted quads: `[20.10.7.6]`, `§13.3.3.2/4`, `section 27.4.4.1`
_SECTION_BEFORE = re.compile(
    r"(?:§|\[)\s*$|\[[a-z_.]+\]|section|clause|paragraph|\bpara\b|standard|\biso\b"
    r"|c\+\+\s*\d\d|\bn\d{4}"
)
_SECTION_AFTER = re.compile(r"\]|/\d{1,2}(?!\d)")


def _is_public(value: str, config: ScrubConfig) -> bool:
    try:
        addr = ipaddress.ip_address(value)
    except ValueError:
        return False
    return addr.is_global and not addr.is_multicast and str(addr) not in config.keep_ips


def _find_ip(text: str, config: ScrubConfig) -> Iterator[_Hit]:
    for m in _IPV4.finditer(text):
        start = m.start(1)
        value = m.group(1).split(":", 1)[0]
        end = start + len(value)
        if not _is_public(value, config) or _on_include_line(text, start):
            continue
        line_start, _ = _line_bounds(text, start)
        before = text[max(line_start, start - 40) : start].lower()
        if _VERSION_CONTEXT.search(before):
            continue
        if "://" not in before and (
            _SECTION_BEFORE.search(before) or _SECTION_AFTER.match(text, end)
        ):
            continue
        small = all(int(octet) <= config.version_like_max_octet for octet in value.split("."))
        if small and not _is_network_context(text, start, end):
            continue
        yield _Hit(start, end, Kind.IP_ADDRESS, "ipv4")
    for m in _IPV6.finditer(text):
        value = m.group(0)
        if value.count(":") < 2 or not _is_public(value, config):
            continue
        if _on_include_line(text, m.start()):
            continue
        yield _Hit(m.start(), m.end(), Kind.IP_ADDRESS, "ipv6")


# ---- machine-local paths: a user's home directory or a per-user /tmp build directory

_PATH_TAIL = r"(?P<tail>(?:[/\\]{1,2}[^\s\"'<>|*?,;:()\[\]{}\\/`]*)*)"
# Each pattern starts with a literal (so `re` can skip ahead fast); the character before the
# path is checked separately (`/usr/home`, `~/home` and `x/home` are not a home directory).
_POSIX_HOME = re.compile(
    r"(?P<root>/(?:home|Users|usr/home)/(?P<user>[A-Za-z0-9_][A-Za-z0-9._-]*))" + _PATH_TAIL
)
_WINDOWS_HOME = re.compile(
    r"(?P<root>:(?:\\\\|\\|/)(?:[Uu]sers|USERS|Documents and Settings)(?:\\\\|\\|/)"
    r"(?P<user>[A-Za-z0-9_][A-Za-z0-9._-]*))" + _PATH_TAIL
)
_TMP_USER = re.compile(
    r"(?P<root>/tmp/(?P<user>[A-Za-z][A-Za-z0-9._]*)-[A-Za-z0-9._-]*)" + _PATH_TAIL
)
_SHARED_HOMES = frozenset({"shared", "public", "default", "default user", "all users"})


def _find_local_path(text: str, config: ScrubConfig) -> Iterator[_Hit]:
    for pattern in (_POSIX_HOME, _WINDOWS_HOME, _TMP_USER):
        for m in pattern.finditer(text):
            user = m.group("user").lower()
            if user in _SHARED_HOMES or user in config.generic_users:
                continue
            start = m.start()
            if pattern is _WINDOWS_HOME:
                start -= 1  # the drive letter
                if (
                    start < 0
                    or not text[start].isalpha()
                    or (start and _WORD_CHAR.match(text[start - 1]))
                ):
                    continue
            elif start and (_WORD_CHAR.match(text[start - 1]) or text[start - 1] in ".~-"):
                continue
            end = m.end("root") if config.keep_path_tail else m.end()
            while end > m.end("root") and text[end - 1] in ".\\":
                end -= 1  # a sentence's full stop or a dangling escape is not the path's
            yield _Hit(start, end, Kind.LOCAL_PATH, "local_path")


_DETECTORS: tuple[_Detector, ...] = (
    _Detector(
        "private_key",
        0,
        _find_private_key,
        triggers=(*(p.pattern for p in PrivateKeyDetector.denylist), "PRIVATE KEY"),
    ),
    _Detector("ssh_key", 1, _find_ssh_key, triggers=("ssh-", "ecdsa-sha2-")),
    *(
        _Detector(pats[0].name, 2, _vendor_finder(pats), triggers=trig, ignore_case=ic)
        for trig, ic, pats in _VENDOR_KEYS
    ),
    _Detector(
        "basic_auth_url",
        3,
        _find_basic_auth,
        trigger_regexes=(BasicAuthDetector.denylist[0],),
        common=True,
    ),
    _Detector("assigned_secret", 4, _find_assigned_secret, _KEYWORD_LITERALS, ignore_case=True),
    _Detector("email", 5, _find_email, triggers=("@",), common=True),
    _Detector(
        "local_path",
        6,
        _find_local_path,
        triggers=("/home/", "/tmp/", "users/", "users\\", "documents and settings"),
        ignore_case=True,
    ),
    _Detector(
        "ip",
        7,
        _find_ip,
        trigger_regexes=(
            re.compile(r"\.\d{1,3}\.\d{1,3}\.\d"),
            re.compile(r":(?<=[23][0-9A-Fa-f]{3}:)[0-9A-Fa-f]{0,4}:"),
        ),
        common=True,
    ),
)
_COMMON_DETECTORS = tuple(d for d in _DETECTORS if d.common)
_RARE_DETECTORS = tuple(d for d in _DETECTORS if not d.common)
# run()'s column-wise prefilter: a file that matches none of it can only hold what the
# common detectors find.
_RARE_TRIGGERS_RE2 = "|".join(d.re2_prefilter() for d in _DETECTORS if not d.common)


def _placeholder_spans(text: str, config: ScrubConfig) -> list[tuple[int, int]]:
    spans = []
    for kind in Kind:
        ph = config.placeholders.for_kind(kind)
        pos = text.find(ph)
        while pos >= 0:
            spans.append((pos, pos + len(ph)))
            pos = text.find(ph, pos + 1)
    return spans


def _detect(
    text: str,
    config: ScrubConfig,
    detectors: Sequence[_Detector],
    ignore_placeholders: bool = True,
    pretriggered: Sequence[_Detector] = (),
) -> list[_Hit]:
    """Non-overlapping hits sorted by position; on overlap the stronger detector wins.
    `pretriggered` detectors run without their prefilter (run() evaluated it in Arrow)."""
    folded: list[str] = []

    def fold() -> str:
        if not folded:
            folded.append(_folded(text))
        return folded[0]

    ranked: list[tuple[int, int, int, _Hit]] = []
    for det in (*pretriggered, *detectors):
        if det not in pretriggered and not det.triggered(text, fold):
            continue
        for hit in det.find(text, config):
            if hit.end > hit.start:
                ranked.append((det.priority, hit.start, -hit.end, hit))
    if not ranked:
        return []
    ranked.sort(key=lambda r: r[:3])
    # Taken spans as sorted, disjoint intervals: each overlap test is a bisect, not a scan
    # over every earlier hit (a file of 40k emails made the scan quadratic: minutes a file).
    starts: list[int] = []
    ends: list[int] = []
    for s, e in sorted(_placeholder_spans(text, config) if ignore_placeholders else []):
        if ends and s < ends[-1]:
            ends[-1] = max(ends[-1], e)
        else:
            starts.append(s)
            ends.append(e)
    hits = []
    for *_, hit in ranked:
        i = bisect.bisect_right(starts, hit.start)
        if (i and ends[i - 1] > hit.start) or (i < len(starts) and starts[i] < hit.end):
            continue
        starts.insert(i, hit.start)
        ends.insert(i, hit.end)
        hits.append(hit)
    hits.sort(key=lambda h: h.start)
    return hits


def _value_hash(value: str, config: ScrubConfig) -> str:
    return hmac.new(config.audit_salt.encode(), value.encode(), hashlib.sha256).hexdigest()


def _findings(text: str, hits: list[_Hit], config: ScrubConfig) -> list[Finding]:
    findings = []
    ascii_only = text.isascii()
    char_pos = byte_pos = 0
    for hit in hits:
        if ascii_only:
            start_byte, end_byte = hit.start, hit.end
        else:
            byte_pos += len(text[char_pos : hit.start].encode())
            char_pos = hit.start
            start_byte = byte_pos
            end_byte = start_byte + len(text[hit.start : hit.end].encode())
        value = text[hit.start : hit.end]
        findings.append(
            Finding(hit.kind, hit.detector, start_byte, end_byte, _value_hash(value, config))
        )
    return findings


def _replace(text: str, hits: list[_Hit], config: ScrubConfig) -> str:
    parts = []
    pos = 0
    for hit in hits:
        parts.append(text[pos : hit.start])
        parts.append(config.placeholders.for_kind(hit.kind))
        pos = hit.end
    parts.append(text[pos:])
    return "".join(parts)


def _scrub(
    text: str,
    config: ScrubConfig,
    detectors: Sequence[_Detector],
    pretriggered: Sequence[_Detector] = (),
) -> tuple[str, list[Finding]]:
    hits = _detect(text, config, detectors, pretriggered=pretriggered)
    if not hits:
        return text, []
    return _replace(text, hits, config), _findings(text, hits, config)


# --------------------------------------------------------------------------- public surface


def scrub_text(text: str, config: ScrubConfig) -> tuple[str, list[Finding]]:
    """The text with every detected value replaced by its kind's placeholder, and what was
    replaced (byte spans in `text`). Deterministic; text already scrubbed comes back as is."""
    return _scrub(text, config, _DETECTORS)


def residual_findings(text: str, config: ScrubConfig) -> list[Finding]:
    """What the detectors still find in (scrubbed) text, placeholders excepted: the blocking
    check's evidence, empty for every kept file."""
    return _findings(text, _detect(text, config, _DETECTORS), config)


def _bool_mask(texts: pa.Array | pa.ChunkedArray, re2_pattern: str) -> np.ndarray:
    hits = pc.match_substring_regex(texts, re2_pattern)
    return np.asarray(hits.to_numpy(zero_copy_only=False), dtype=bool)


def _rare_detectors_by_row(texts: pa.Array | pa.ChunkedArray) -> dict[int, list[_Detector]]:
    """Rare triggers, column-wise: one RE2 pass over the shard, then one per detector over
    the few rows that matched, so no row pays for ~80 substring searches in Python."""
    rows = np.flatnonzero(_bool_mask(texts, _RARE_TRIGGERS_RE2))
    by_row: dict[int, list[_Detector]] = {int(r): [] for r in rows}
    if len(rows):
        subset = texts.take(pa.array(rows, pa.int64()))
        for det in _RARE_DETECTORS:
            for i in np.flatnonzero(_bool_mask(subset, det.re2_prefilter())):
                by_row[int(rows[i])].append(det)
    return by_row


def _scan(
    texts: pa.Array | pa.ChunkedArray, config: ScrubConfig, replace: bool
) -> list[tuple[int, str, list[Finding]]]:
    """(row, text after replacement, findings) for every row where a detector fires."""
    rare = _rare_detectors_by_row(texts)
    out = []
    for row, text in enumerate(texts.to_pylist()):
        hits = _detect(text, config, _COMMON_DETECTORS, pretriggered=rare.get(row, ()))
        if hits:
            new_text = _replace(text, hits, config) if replace else text
            out.append((row, new_text, _findings(text, hits, config)))
    return out


def _audit_table(
    source_ids: Sequence[str], paths: Sequence[str], findings: Sequence[Sequence[Finding]]
) -> pa.Table:
    cols: dict[str, list[object]] = {name: [] for name in AUDIT_SCHEMA.names}
    for source_id, path, row_findings in zip(source_ids, paths, findings, strict=True):
        for f in row_findings:
            cols["source_id"].append(source_id)
            cols["path"].append(path)
            cols["kind"].append(str(f.kind))
            cols["detector"].append(f.detector)
            cols["start_byte"].append(f.start_byte)
            cols["end_byte"].append(f.end_byte)
            cols["value_hash"].append(f.value_hash)
    return pa.table(cols, schema=AUDIT_SCHEMA)


def residual_table(table: pa.Table, config: ScrubConfig) -> pa.Table:
    """Every detector hit left in a table's `text` (placeholders excepted) as AUDIT_SCHEMA
    rows, spans in that text: the scrubbed_files blocking check passes iff it is empty."""
    texts = table.column("text")
    hits = _scan(texts, config, replace=False)
    sources = table.column("source_id").to_pylist()
    paths = table.column("path").to_pylist()
    return _audit_table(
        [sources[r] for r, _, _ in hits], [paths[r] for r, _, _ in hits], [f for _, _, f in hits]
    )


def run(table: pa.Table, config: ScrubConfig) -> GateResult:
    """Scrub one shard of schemas.LICENSED_FILES into schemas.SCRUBBED_FILES, with the audit
    table in extra["audit"]. A file whose output still trips a detector is dropped as
    SCRUB_FAILED rather than kept with a secret in it."""
    table = table.select(schemas.LICENSED_FILES.names).cast(schemas.LICENSED_FILES)
    texts = table.column("text")
    n = table.num_rows
    source_ids = table.column("source_id").to_pylist()
    paths = table.column("path").to_pylist()

    scrubbed_rows = _scan(texts, config, replace=True)
    residual = _scan(pa.array([t for _, t, _ in scrubbed_rows], pa.string()), config, False)
    failed = {
        scrubbed_rows[i][0]: str(ScrubError(paths[scrubbed_rows[i][0]], findings[0]))
        for i, _, findings in residual
    }
    replaced = [(row, t, f) for row, t, f in scrubbed_rows if row not in failed]

    counts = np.zeros(n, dtype=np.int32)
    stats: Counter[str] = Counter()
    for row, _, findings in replaced:
        counts[row] = len(findings)
        stats.update(f"kind:{f.kind}" for f in findings)
    new_texts: pa.Array | pa.ChunkedArray = texts
    new_shas: pa.Array | pa.ChunkedArray = table.column("content_sha256")
    if replaced:
        changed = np.zeros(n, dtype=bool)
        changed[[row for row, _, _ in replaced]] = True
        mask = pa.array(changed)
        new_texts = pc.replace_with_mask(texts, mask, pa.array([t for _, t, _ in replaced]))
        shas = [schemas.text_sha256(t) for _, t, _ in replaced]
        new_shas = pc.replace_with_mask(new_shas, mask, pa.array(shas, pa.string()))

    columns = {name: table.column(name) for name in schemas.LICENSED_FILES.names}
    columns["text"] = new_texts
    columns["content_sha256"] = new_shas
    columns["scrub_replacements"] = pa.array(counts, pa.int32())
    scrubbed = pa.table(
        [columns[name] for name in schemas.SCRUBBED_FILES.names], schema=schemas.SCRUBBED_FILES
    )

    dropped_rows = sorted(failed)
    keep = np.ones(n, dtype=bool)
    keep[dropped_rows] = False
    kept = scrubbed.filter(pa.array(keep)) if dropped_rows else scrubbed
    licenses = table.column("license_expression")
    dropped = drops(
        [source_ids[i] for i in dropped_rows],
        [paths[i] for i in dropped_rows],
        [DropReason.SCRUB_FAILED] * len(dropped_rows),
        details=[failed[i] for i in dropped_rows],
        license_expressions=[licenses[i].as_py() for i in dropped_rows],
    )
    audit = _audit_table(
        [source_ids[row] for row, _, _ in replaced],
        [paths[row] for row, _, _ in replaced],
        [f for _, _, f in replaced],
    )
    stats["files_in"] += n
    stats["files_kept"] += kept.num_rows
    stats["files_scrubbed"] += len(replaced)
    stats["replacements"] += int(counts.sum())
    stats["scrub_failed"] += len(dropped_rows)
    return GateResult(kept=kept, dropped=dropped, stats=stats, extra={"audit": audit})


def _markdown_cell(value: str, limit: int = 160) -> str:
    value = value.strip()
    if len(value) > limit:
        value = value[: limit - 1] + "…"
    return value.replace("|", "\\|").replace("`", "'")


def markdown_sample(kept: pa.Table, config: ScrubConfig, max_lines: int | None = None) -> str:
    """A markdown table of redacted lines (after redaction) for the materialization's UI:
    what the placeholders look like in context, never what they replaced."""
    limit = config.sample_lines if max_lines is None else max_lines
    placeholders = [config.placeholders.for_kind(k) for k in Kind]
    rows = ["| file | line | redacted text |", "|---|---:|---|"]
    if kept.num_rows and limit > 0:
        touched = kept.filter(pc.greater(kept.column("scrub_replacements"), 0))
        for path, text in zip(
            touched.column("path").to_pylist(), touched.column("text").to_pylist(), strict=True
        ):
            for lineno, line in enumerate(text.splitlines(), start=1):
                if any(ph in line for ph in placeholders):
                    rows.append(
                        f"| `{_markdown_cell(path, 80)}` | {lineno} | `{_markdown_cell(line)}` |"
                    )
                    if len(rows) - 2 >= limit:
                        return "\n".join(rows)
    if len(rows) == 2:
        return "_no redactions in this partition_"
    return "\n".join(rows)
