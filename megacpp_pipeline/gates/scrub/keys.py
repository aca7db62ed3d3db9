"""Key material: private keys (PEM, OpenSSH, PGP, PuTTY blocks, truncated ones included, and
a PEM block base64-encoded whole as kubeconfig's `client-key-data` and CI variables carry
it) and ssh public keys with their `user@host` comment, each replaced as one span."""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Iterator
from typing import TYPE_CHECKING

from megacpp_pipeline.gates.scrub.hits import Hit, Kind

if TYPE_CHECKING:
    from megacpp_pipeline.gates.scrub.config import ScrubConfig


# three dashes too: hand-copied and Markdown-mangled blocks lose some (`---BEGIN ...---`)
_PEM_BEGIN = re.compile(r"-{3,5} ?BEGIN (?P<label>[A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?) ?-{3,5}")
_BASE64_LINE = re.compile(r"[^\S\n]*[\"'(]?[A-Za-z0-9+/=:\-, ]{16,}(?:\\n)?[\"']?[^\S\n]*(?:\n|$)")
# the last line of a truncated block is shorter; taken only right after full ones
_BASE64_LAST_LINE = re.compile(
    r"[^\S\n]*[\"'(]?[A-Za-z0-9+/]{1,63}={0,2}(?:\\n)?[\"']?[^\S\n]*(?:\n|$)"
)
# a .ppk file, version 2 or 3 (PuTTY 0.75+: Argon2 fields before the key): header to MAC,
# within a .ppk's size, so a parser's header string never reaches a key much further on
PUTTY_TRIGGER = "PuTTY-User-Key-File-"
_PUTTY = re.compile(PUTTY_TRIGGER + r"\d+: ?[\w@.-]+[\s\S]{0,16384}?Private-MAC: ?[0-9a-fA-F]+")


# a line of key material: base64 (16+ in a run) or an RFC 1421 field (`Proc-Type: 4,...`);
# prose (`// followed by base64 data`) is neither, though made of the same characters
_BODY_RUN = re.compile(r"[A-Za-z0-9+/]{16,}")
_PEM_FIELD = re.compile(r"[^\S\n]*[\"']?[A-Za-z]+(?:-[A-Za-z]+)+: ")
# A block is a key only with key material near its header (within _BODY_WITHIN characters:
# room for fields, a blank line, comment marks or quotes): a header alone (a parser's
# `line == "-----BEGIN RSA PRIVATE KEY-----"`, a `<your key here>` template) is not one.
_KEY_BODY = re.compile(r"[A-Za-z0-9+/]{40,}")
_BODY_WITHIN = 400


def has_key_material(block: str) -> bool:
    """Whether a matched key block holds key material, not only its header and footer."""
    return _KEY_BODY.search(block) is not None


def find_private_key(text: str, config: ScrubConfig) -> Iterator[Hit]:
    pos = 0
    while (m := _PEM_BEGIN.search(text, pos)) is not None:
        if not _KEY_BODY.search(text, m.end(), m.end() + _BODY_WITHIN):
            pos = m.end()
            continue
        end_re = re.compile(r"-{3,5} ?END " + re.escape(m.group("label")) + r" ?-{3,5}")
        # the END must come before the next BEGIN: else this block was cut short, and the
        # END belongs to a later key (replacing everything in between would erase code)
        next_begin = text.find("BEGIN ", m.end())
        e = end_re.search(text, m.end(), len(text) if next_begin < 0 else next_begin)
        if e is not None:
            end = e.end()
        else:
            # truncated block: redact the lines of key material that follow the header
            end = m.end()
            nl = text.find("\n", end)
            cursor = len(text) if nl < 0 else nl + 1
            while (
                cursor < len(text)
                and (b := _BASE64_LINE.match(text, cursor))
                and b.end() > cursor
                and (_BODY_RUN.search(b.group(0)) or _PEM_FIELD.match(b.group(0)))
            ):
                end = cursor + len(b.group(0).rstrip())
                cursor = b.end()
            if end > m.end() and (b := _BASE64_LAST_LINE.match(text, cursor)):
                end = cursor + len(b.group(0).rstrip())
        yield Hit(m.start(), end, Kind.PRIVATE_KEY, "pem_private_key")
        pos = end
    for m in _PUTTY.finditer(text):
        yield Hit(m.start(), m.end(), Kind.PRIVATE_KEY, "putty_private_key")


# base64 of "-----BEGIN ": the rest of the header decides whether the block is a private key
BASE64_PEM_TRIGGER = "LS0tLS1CRUdJTi"
_BASE64_PEM = re.compile(r"LS0tLS1CRUdJTi[A-Za-z0-9+/]{40,}={0,2}")


def find_base64_private_key(text: str, config: ScrubConfig) -> Iterator[Hit]:
    for m in _BASE64_PEM.finditer(text):
        head = m.group(0)[:96]
        head = head[: len(head) - len(head) % 4]
        try:
            decoded = base64.b64decode(head).decode("ascii", "replace")
        except (binascii.Error, ValueError):
            continue
        if _PEM_BEGIN.match(decoded):
            yield Hit(m.start(), m.end(), Kind.PRIVATE_KEY, "base64_pem_private_key")


_SSH_PUBLIC_KEY = re.compile(
    r"(?<![\w-])(?:ssh-(?:rsa|dss|ed25519)|ecdsa-sha2-nistp(?:256|384|521)"
    r"|sk-(?:ssh-ed25519|ecdsa-sha2-nistp256)@openssh\.com)"
    r" AAAA[0-9A-Za-z+/]{16,}={0,3}(?: [^\s\"'<>\\@]+@[^\s\"'<>\\()]*[^\s\"'<>\\.,;()])?"
)


def find_ssh_key(text: str, config: ScrubConfig) -> Iterator[Hit]:
    for m in _SSH_PUBLIC_KEY.finditer(text):
        yield Hit(m.start(), m.end(), Kind.SSH_KEY, "ssh_public_key")
