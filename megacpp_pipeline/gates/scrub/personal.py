"""Personal data: email addresses, public IP addresses and machine-local paths (a home
directory or a per-user /tmp build directory). Each finder pairs a fast pattern with the C++
look-alikes it must keep: file names, symbol versions, version numbers, standard citations."""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterator
from typing import TYPE_CHECKING

from detect_secrets.plugins.ip_public import IPPublicDetector

from megacpp_pipeline.gates.scrub.hits import Hit, Kind
from megacpp_pipeline.gates.scrub.plausibility import (
    WORD_CHAR,
    context,
    line_bounds,
    on_include_line,
)

if TYPE_CHECKING:
    from megacpp_pipeline.gates.scrub.config import ScrubConfig


# ---- emails: anchored on '@' (a literal, so the search is fast), local part read backwards

# letters and digits of any script: `jörg.müller@müller-bau.de` is one address, not a
# `jörg.mü` left beside a placeholder
_EMAIL_DOMAIN = re.compile(r"@(?P<domain>[^\W_](?:[^\W_]|-){0,62}(?:\.(?:[^\W_]|-){1,63})+)")
_EMAIL_LOCAL = re.compile(r"[\w.%+-]{1,64}\Z")
# RFC 2606 / 6761 names for documentation and tests: no mailbox is anyone's there
# (`user@example.com` is in every doc comment). The `.example` TLD is left out: it is rare
# in code, and this project's own evaluation writes its stand-in real domains with it.
_RESERVED_DOMAINS = ("example.com", "example.net", "example.org")
_RESERVED_TLDS = frozenset({"test", "invalid", "localhost"})
# `icon@2x.png`, `lib@1.2/api.hpp`: a file name, not a mailbox
_FILE_EXTENSION = re.compile(
    r"png|jpe?g|gif|svg|bmp|ico|webp|tga|css|m?js|ts|map|json|ya?ml|xml|html?|md|rst|txt|cmake"
    r"|[ch]|hh|[ch]pp|[ch]xx|cc|ipp|inl|tcc|py|rs|sh|so|dll|dylib|exe|lib|obj|pdf|zip|gz|tar"
    r"|bz2|xz|whl|ttf|woff2?",
    re.IGNORECASE,
)


_URL_PASSWORD_BEFORE = re.compile(r"://[^\s:/?#\[\]@\"'<>`\\]*:[^\s/?#\[\]@\"'<>`\\]*\Z")


def _reserved(domain: str) -> bool:
    d = domain.lower()
    return d.rsplit(".", 1)[-1] in _RESERVED_TLDS or any(
        d == r or d.endswith("." + r) for r in _RESERVED_DOMAINS
    )


def find_email(text: str, config: ScrubConfig) -> Iterator[Hit]:
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
        if _reserved(domain):
            continue
        if text[start:at].lower() in config.role_email_users:
            continue
        if _URL_PASSWORD_BEFORE.search(text, max(0, start - 256), start):
            continue  # `scheme://user:changeme@host`: a password's place, the URL finder's call
        if on_include_line(text, start):
            continue
        yield Hit(start, at + 1 + len(domain), Kind.EMAIL, "email")


# ---- IP addresses: detect-secrets' public-IPv4 pattern, then ipaddress decides what is public

# detect-secrets' public-IPv4 pattern with its 172.16.0.0/12 exclusion closed by a dot: as
# published, `172\.(?:1[6-9]|2[0-9]|3[01])` also skips every public 172.160-172.255 address
# (it matches the `172.24` of `172.240.1.9`). ipaddress decides what is private anyway.
_IPV4 = re.compile(
    IPPublicDetector.denylist[0].pattern.replace(
        r"172\.(?:1[6-9]|2[0-9]|3[01])", r"172\.(?:1[6-9]|2[0-9]|3[01])\."
    ),
    IPPublicDetector.denylist[0].flags,
)
# global unicast IPv6 is 2000::/3, so the first hextet is four hex digits starting 2 or 3
_IPV6 = re.compile(r"(?<![\w:.])[23][0-9A-Fa-f]{3}:[0-9A-Fa-f:]*[0-9A-Fa-f](?![\w:.])")
# an object identifier (`GNUTLS_OID_X520_NAME "2.5.4.41"`) is dotted numbers, not an address
_VERSION_CONTEXT = re.compile(
    r"version|(?<![a-z])ver(?![a-z])|release|since|revision|(?<![a-z])rev(?![a-z])|\bv\s*$"
    r"|(?<![a-z])oid(?![a-z])|firmware|(?<![a-z])fw(?![a-z])|(?<![a-z])build(?![a-z])"
)
# `linux-2.6.16.60`, `gcc-4.8.5.2`: a release's number glued to its name
_NAME_DASH = re.compile(r"[a-z]-\Z")
# no "http": URLs in comments are everywhere in C++ (`index.html?path=4.1.1.4`); the host
# right after `://` or `@` is checked on its own
# words start after a non-letter or at a camelCase hump (`kServer`, `TELEMETRY_HOST`), so
# `observers` does not read as `server`
_NETWORK_CONTEXT = re.compile(
    r"(?:(?<![A-Za-z])|(?<=[a-z])(?=[A-Z]))(?i:dns|server|host|ip(?![a-z])|addr|connect|proxy"
    r"|endpoint|socket|inet|peer|mirror|upstream|remote|gateway|route|ping(?![a-z])|firewall"
    r"|subnet|listen|bind(?![a-z])|egress|ingress|vpn(?![a-z])|nat(?![a-z])|cidr|netmask"
    r"|(?:allow|deny|block|white|black)list|iptables"
    r"|(?:allow|deny)(?=\s*:)"  # a YAML allow / deny list
    # a network command's operand: `nc -zv 36.44.40.54 5432`, `ssh 5.6.7.8`
    r"|(?:nc|netcat|telnet|nmap|traceroute|tracert|dig|nslookup|ssh|scp|curl|wget)(?=\s))"
)


def _is_network_context(text: str, start: int, end: int) -> bool:
    """Host position in a URL, a string literal holding nothing but the address, or
    network words on the line or the line above."""
    if text.endswith("://", 0, start) or text.endswith("@", 0, start):
        return True
    if start and text[start - 1] in "\"'" and text.startswith(text[start - 1], end):
        return True
    return _NETWORK_CONTEXT.search(context(text, start, end, lower=False)) is not None


# C++ standard citations look like dotted quads: `[20.10.7.6]`, `§13.3.3.2/4`, `section 27.4.4.1`
_SECTION_BEFORE = re.compile(
    r"(?:§|\[)\s*$|\[[a-z_.]+\]|section|clause|paragraph|\bpara\b|standard|\biso\b"
    r"|c\+\+\s*\d\d|\bn\d{4}"
)
_SECTION_AFTER = re.compile(r"\]|/\d{1,2}(?!\d)")
# `(43.4.2.2 in the 802.3ad standard)`: a clause of a standard named after it
_SECTION_LATER = re.compile(r"(?i)\b(?:standard|spec(?:ification)?|clause|section)\b")


def _is_public(value: str, config: ScrubConfig) -> bool:
    try:
        addr = ipaddress.ip_address(value)
    except ValueError:
        return False
    return addr.is_global and not addr.is_multicast and str(addr) not in config.keep_ips


# a dotted quad's core: found 4x faster than detect-secrets' pattern (a lookbehind, then an
# alternation of excluded ranges at every position), which then reads only those lines
_QUAD = re.compile(r"\d\.\d{1,3}\.\d{1,3}\.\d")


def _ipv4_matches(text: str) -> Iterator[re.Match[str]]:
    """_IPV4's matches in `text`, searched only on lines that hold a dotted quad (a match
    never spans lines; the line's break is in the window, so its lookarounds see what they
    would in the whole text)."""
    end = 0
    while (q := _QUAD.search(text, end)) is not None:
        start = text.rfind("\n", end, q.start()) + 1 or end
        end = text.find("\n", q.end())
        end = len(text) if end < 0 else end + 1
        yield from _IPV4.finditer(text, start, end)


def find_ip(text: str, config: ScrubConfig) -> Iterator[Hit]:
    for m in _ipv4_matches(text):
        start = m.start(1)
        value = m.group(1).split(":", 1)[0]
        end = start + len(value)
        if not _is_public(value, config) or on_include_line(text, start):
            continue
        if text.endswith("://", 0, start) or text.endswith("@", 0, start):
            # a URL's host (`http://52.14.88.201/builds`): an address whatever words
            # (`build`, `release`) are near it
            yield Hit(start, end, Kind.IP_ADDRESS, "ipv4")
            continue
        line_start, _ = line_bounds(text, start)
        before = text[max(line_start, start - 40) : start].lower()
        if _VERSION_CONTEXT.search(before) or _NAME_DASH.search(before):
            continue
        if "://" not in before and (
            _SECTION_BEFORE.search(before)
            or _SECTION_AFTER.match(text, end)
            or _SECTION_LATER.search(text, end, min(end + 40, line_bounds(text, end)[1]))
        ):
            continue
        octets = [int(octet) for octet in value.split(".")]
        # the standard's clause numbers (`18.11.2.7`) start below 40; a quad that starts
        # higher and has no version word before it is an address (BigCode's rule, kept
        # below 40: `{17.23.96.54, 53}` stays a version, the price of keeping clauses)
        small = octets[0] < 40 and all(o <= config.version_like_max_octet for o in octets)
        if small and not _is_network_context(text, start, end):
            continue
        yield Hit(start, end, Kind.IP_ADDRESS, "ipv4")
    for m in _IPV6.finditer(text):
        value = m.group(0)
        if value.count(":") < 2 or not _is_public(value, config):
            continue
        if on_include_line(text, m.start()):
            continue
        yield Hit(m.start(), m.end(), Kind.IP_ADDRESS, "ipv6")


# ---- machine-local paths: a user's home directory or a per-user /tmp build directory

_PATH_TAIL = r"(?P<tail>(?:[/\\]{1,2}[^\s\"'<>|*?,;:()\[\]{}\\/`]*)*)"
# a POSIX path has no backslash separators: `\n` after it is a string's escape, not a folder
_POSIX_TAIL = _PATH_TAIL.replace("[/\\\\]{1,2}", "/{1,2}")
# Each pattern starts with a literal (so `re` can skip ahead fast); the character before the
# path is checked separately (`/usr/home`, `~/home` and `x/home` are not a home directory).
_POSIX_HOME = re.compile(
    r"(?P<root>/(?:home|Users|usr/home)/(?P<user>[A-Za-z0-9_][A-Za-z0-9._-]*))" + _POSIX_TAIL
)
_WINDOWS_HOME = re.compile(
    r"(?P<root>:(?:\\\\|\\|/)(?:[Uu]sers|USERS|Documents and Settings)(?:\\\\|\\|/)"
    r"(?P<user>[A-Za-z0-9_][A-Za-z0-9._-]*))" + _PATH_TAIL
)
_TMP_USER = re.compile(
    r"(?P<root>/tmp/(?P<user>[A-Za-z][A-Za-z0-9._]*)-[A-Za-z0-9._-]*)" + _POSIX_TAIL
)
_SHARED_HOMES = frozenset({"shared", "public", "default", "default user", "all users"})
# a home directory below another root: `/mnt/c/Users/x` (WSL), `/export/home/x` (Solaris),
# `/net/nas/home/x`, `/cygdrive/c/Users/x`: the path must start at a filesystem root
_MOUNT_ROOTS = frozenset(
    {"mnt", "media", "export", "exports", "net", "nfs", "afs", "data", "srv", "opt", "var"}
    | {"private", "volumes", "cygdrive", "auto", "space", "scratch", "gpfs", "lustre", "storage"}
    | {"vol", "shared", "u"}
)
_PATH_RUN_BACK = re.compile(r"[A-Za-z0-9_.\-/]{1,200}\Z")


def _under_mount_root(text: str, start: int) -> int | None:
    """Where the absolute path that `/home/...` (at `start`) continues starts, if it starts
    at a filesystem root like `/mnt/` (not `src/home/`, not a URL's path)."""
    run = _PATH_RUN_BACK.search(text, max(0, start - 200), start)
    if run is None or text[run.start()] != "/" or text.startswith("//", run.start()):
        return None
    before = text[run.start() - 1] if run.start() else ""
    if before and (WORD_CHAR.match(before) or before in ":~.-"):
        return None
    first = text[run.start() + 1 : start].split("/", 1)[0].lower()
    return run.start() if first in _MOUNT_ROOTS else None


def _after_short_flag(text: str, start: int) -> bool:
    """`-I/home/alice/include`, `-L/Users/bob/lib`: a compiler flag glued to the path."""
    return (
        start >= 2
        and text[start - 2] == "-"
        and text[start - 1].isalpha()
        and (start < 3 or not (WORD_CHAR.match(text[start - 3]) or text[start - 3] == "-"))
    )


# `/tmp/<word>-...` names a tool's or a test's file as often as a user's folder
_TMP_NOT_USERS = frozenset(
    {"test", "tests", "gtest", "tmp", "temp", "cache", "ccache", "build", "builds", "out"}
    | {"output", "app", "core", "debug", "release", "bazel", "cmake", "ci", "docker", "my"}
    | {"clang", "gcc", "llvm", "cargo", "npm", "pip", "conda", "go", "ssh", "tmux", "dbus"}
    | {"systemd", "pulse", "lock", "socket", "sock", "run", "data", "log", "logs", "foo"}
)


def _per_user_tmp(text: str, m: re.Match[str], user: str) -> bool:
    """`/tmp/<user>-<suffix>/...`: a folder (a path goes on below it) whose first word is no
    tool's or test's, its suffix no mkstemp template (`XXXXXX`) or core pattern (`%e`)."""
    root = m.group("root")
    return (
        text.startswith("/", m.end("root"))
        and user not in _TMP_NOT_USERS
        and "XXXXXX" not in root
        and "%" not in root
    )


def find_local_path(text: str, config: ScrubConfig) -> Iterator[Hit]:
    for pattern in (_POSIX_HOME, _WINDOWS_HOME, _TMP_USER):
        for m in pattern.finditer(text):
            user = m.group("user").lower()
            if user in _SHARED_HOMES or user in config.generic_users:
                continue
            if pattern is _TMP_USER and not _per_user_tmp(text, m, user):
                continue
            start = m.start()
            if pattern is _WINDOWS_HOME:
                start -= 1  # the drive letter
                if (
                    start < 0
                    or not text[start].isalpha()
                    or (start and WORD_CHAR.match(text[start - 1]))
                ):
                    continue
            elif (
                start
                and (WORD_CHAR.match(text[start - 1]) or text[start - 1] in ".~-")
                and not _after_short_flag(text, start)
            ):
                root = _under_mount_root(text, start)
                if root is None:
                    continue
                start = root
            end = m.end("root") if config.keep_path_tail else m.end()
            while end > m.end("root") and text[end - 1] in ".\\":
                end -= 1  # a sentence's full stop or a dangling escape is not the path's
            yield Hit(start, end, Kind.LOCAL_PATH, "local_path")
