"""Plausibility rules: decides whether a value a pattern matched is a secret or one of the
look-alikes C++ is full of (identifiers, format strings, paths, versions, hash test vectors,
COM interface ids, `#include` lines), and reads the text around a match to tell."""

from __future__ import annotations

import ipaddress
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
)
_TEST_VECTOR_WORDS = re.compile(
    r"test.?vector|expected|golden|known.?answer"
    # a standard's published vectors (`// RFC 8032 TEST 1`, NIST / FIPS known answers)
    r"|rfc\s*\d+|nist|fips|wycheproof|test\s*(?:case|\d)|\bkat\b"
)
# a password hash or salt in crypt(3)'s modular format (`$6$salt$...`, bcrypt's `$2b$10$...`)
_MODULAR_CRYPT = re.compile(
    r"\$(?:1|2[abxy]?|5|6|7|y|gy|md5|sha1|argon2(?:id|i|d)|scrypt|pbkdf2[\w-]*)\$"
)
_UUID_WORDS = re.compile(r"uuid|guid|__declspec|midl_interface|clsid|iid_|interface_id")
_HEX = re.compile(r"(?:0x)?[0-9A-Fa-f]{16,}")
_UUID = re.compile(
    r"\{?[0-9A-Fa-f]{8}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{12}\}?"
)


def is_hash_or_uuid(value: str, text: str, start: int, end: int, key_named: bool = False) -> bool:
    """Hash test vectors, CRC tables, COM interface ids and crypt(3) hashes are high-entropy
    but public (a password hash in a test is what the test checks, not a secret). Hex under
    a name that holds a key (`key_named`: `hmac_key`, `kSigningKey`) is that key, however
    many hash words are near (an HMAC key sits beside `HMAC-SHA256`); only a standard's
    test vector is public there."""
    if _MODULAR_CRYPT.match(value):
        return True
    if _HEX.fullmatch(value):
        around = context(text, start, end)
        if _TEST_VECTOR_WORDS.search(around):
            return True
        return not key_named and _HASH_WORDS.search(around) is not None
    if _UUID.fullmatch(value):
        return _UUID_WORDS.search(context(text, start, end)) is not None
    return False


def shannon_entropy(value: str) -> float:
    n = len(value)
    if not n:
        return 0.0
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
_SNAKE_NAME = re.compile(
    r"[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+|[a-z][a-z0-9]*(?:_[a-z0-9]+)+"
    r"|[A-Za-z][a-z0-9]*(?:-[A-Za-z][a-z0-9]*)+"  # kebab: `Access-Control-Allow-Headers`
)
_VERSION_VALUE = re.compile(r"[vV]?\d+(?:\.\d+)+")
# a part of a snake or kebab name: a word, maybe with a number after it (`sha256`, `int64`,
# `ed25519`, `v2`), or a number. `river7546-S`, `tundra0764_d`, `Hmv-Y127y` are shaped like
# names but are passwords: a word and a year, digits inside a word.
_NAME_PART = re.compile(r"[A-Za-z]+(?:\d{1,3}|\d{5,})?|\d+")
_NAME_SEPARATOR = re.compile(r"[-_]")
_CODE_WORD = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+")
# printf / std::format / Qt conversions: `%s`, `%08x`, `%.*s`, `{}`, `{0}`, `{:>8}`, `%1`
# (Qt's `%1` only where a word cannot run into it: `Eckrwvp%9` is a password, `user=%1` not)
_FORMAT = re.compile(
    r"%[-+ #0-9.*]*(?:hh|ll|[hlLzjtq])?[diouxXeEfFgGaAcspn]|%%|(?<![A-Za-z])%\d"
    r"|\{\d*(?::[^{}]*)?\}"
)
# a template or variable in the value's place: ${X}, $(cmd), {{ x }}, %(x)s, <x>, [x]
_ONE_WORD = re.compile(r"[A-Z]?[a-z]+|[A-Z]+")
_TEMPLATE = re.compile(r"\$[({]|\{\{|\}\}|%\(|<[^<>]*>|^\[.*\]$")
_PLACEHOLDER = re.compile(
    r"\$[A-Za-z_]\w*|%[A-Za-z_]\w*%|@[A-Za-z_]\w*@|__[A-Za-z]\w*__|\{[A-Za-z_][\w.\- ]*\}"
    r"|(.)\1{2,}|\.\.\.+|…"  # `****`, `xxxxxxxx`, `...`
)
_PLACEHOLDER_WORDS = frozenset(
    {"password", "passwd", "secret", "token", "changeme", "changeit", "example", "placeholder"}
    | {"redacted", "hidden", "dummy", "none", "null", "nil", "undefined", "todo", "fixme"}
    | {"default", "empty", "sample", "notset", "unset", "required", "optional"}
    # what a form, a schema or a test puts in a password's place (`"password": "string"`)
    | {"string", "text", "masked", "unknown", "invalid", "missing", "blank", "anonymous"}
    | {"foobar"}
)
# `your_password`, `YOUR-TOKEN`, `YourApiKey`, `insert-key-here`
_PLACEHOLDER_LEAD = re.compile(
    r"(?i:your|insert|enter|replace)(?:[-_]|$)|(?:Your|Insert|Enter|Replace)[A-Z]"
)
_EXPRESSION = re.compile(r"[()\[\]]|->|::")
_NUMBER = re.compile(
    r"[-+]?(?:0[xX][0-9A-Fa-f']+|0[bB][01']+|\d[\d']*(?:\.\d*)?(?:[eE][-+]?\d+)?)[uUlLfFzZ]*"
)
_KEY_CHARS = re.compile(r"[A-Za-z0-9+/=_\-.~:!#$%&*?^@()]+")  # Django keys hold ( )
# where a path starts (`/`, `./`, `../`, `~/`, `C:\`), and the segments a path is made of:
# lowercase or Capitalized words, where base64 mixes cases at random (`/K7MDENG/bPxRf`)
_PATH_START = re.compile(r"(?:\.{1,2}|~)?/|[A-Za-z]:[\\/]")
_PATH_SEGMENT = re.compile(r"[a-z0-9_.\-]*|[A-Z][a-z0-9_.\-]*|[A-Z0-9_.\-]*")
_FILE_NAME = re.compile(
    r"(?P<stem>[\w.\-]+)\.(?:pem|key|json|txt|ya?ml|h|hpp|cpp|crt|cfg|ini|env|conf|p12|pfx|der|jks)"
)
_PATH_SEP = re.compile(r"[\\/]+")


def _looks_like_code_name(value: str) -> bool:
    """`ApplicationDefaultCredentials`, `HTTPServerConfig`, `kw_static_cast`: letters forming
    words. Random letters-only tokens split into many one- and two-letter camelCase words."""
    if any(c.isdigit() for c in value) or not _CODE_NAME.fullmatch(value):
        return False
    words = _CODE_WORD.findall(value)
    short = sum(len(w) <= 2 for w in words)
    return short <= max(1, len(words) // 4)


def _looks_like_path(value: str) -> bool:
    if "://" in value:
        return True
    file = _FILE_NAME.fullmatch(value)
    if file and (_PATH_SEGMENT.fullmatch(stem := file.group("stem")) or _names_something(stem)):
        return True  # `secret.json`, `MyKey.pem`; not `SpKKiow9CYT.h`
    start = _PATH_START.match(value)
    if start is None:
        return False
    return all(_PATH_SEGMENT.fullmatch(s) for s in _PATH_SEP.split(value[start.end() :]))


def _is_placeholder(value: str) -> bool:
    """`<password>`, `${DB_PASSWORD}`, `$TOKEN`, `%API_KEY%`, `@DB_PASS@`, `****`, `changeme`,
    `YourPassword`: a value to fill in, not a value."""
    if _PLACEHOLDER.fullmatch(value):
        return True
    if _TEMPLATE.search(value) and not _random_blob(value):  # `$(` in a Django key is noise
        return True
    if "".join(c for c in value.lower() if c.isalnum()) in _PLACEHOLDER_WORDS:
        return True
    return _PLACEHOLDER_LEAD.match(value) is not None


# `CRMFEncryptedKey*`, `uint8_t*` (not `Quartz2050*`: a word and a number is a password's)
_POINTER_TYPE = re.compile(r"[A-Za-z_](?:[A-Za-z_:]|\d(?!\d))*[*&]+")


def _random_blob(value: str) -> bool:
    """Long, dense and symbol-rich (a Django `SECRET_KEY` holds `(` and `)`): no call or
    subscript reads like this."""
    symbols = sum(not c.isalnum() for c in value)
    return len(value) >= 32 and symbols >= 4 and shannon_entropy(value) >= 4.3


def _names_something(value: str) -> bool:
    """Identifiers (`user_password_field`, `MEGACPP_API_KEY_2`, `kw_static_cast`), calls and
    subscripts, versions, paths and URLs: what a name is assigned when it holds no secret."""
    return bool(
        (
            _SNAKE_NAME.fullmatch(value)
            and all(_NAME_PART.fullmatch(p) for p in _NAME_SEPARATOR.split(value))
        )
        or _VERSION_VALUE.fullmatch(value)
        or (_EXPRESSION.search(value) and not _random_blob(value))
        or _POINTER_TYPE.fullmatch(value)
        or _looks_like_code_name(value)
        or _looks_like_path(value)
    )


# a word run into two or more digits (`maple297`, `Falcon01`), as a policy makes people pick
_WORD_AND_NUMBER = re.compile(r"[A-Za-z]{3,}\d{2,}[A-Za-z]{0,3}|\d{2,}[A-Za-z]{3,}")


def _password_shaped(value: str) -> bool:
    """`Summer2024`, `maple297_xw`, `tundra14-X`: a word run into a number of two or more
    digits: a name's shape, but a password's (identifiers put digits in a word as `utf8`,
    `v2`, `x86`, rarely as a word and a number)."""
    return any(_WORD_AND_NUMBER.fullmatch(p) for p in _NAME_SEPARATOR.split(value) if p)


_LOWER_WORD = re.compile(r"[a-z]+")


def plausible_secret(
    value: str, kind: Kind, config: ScrubConfig, bare: bool = False, named_password: bool = False
) -> bool:
    """False for values that name something rather than being a secret, for placeholders and
    for format strings; `bare` (unquoted) values must not be plain numbers either. A literal
    a password's own name binds (`named_password`) may be one lowercase word: `"letmein"` is
    shaped like an identifier, but nobody names a thing in a password variable."""
    if not value or "\\" in value or any(c.isspace() for c in value):
        return False
    if _is_placeholder(value):
        return False
    password_shaped = kind is Kind.PASSWORD and (
        _password_shaped(value) or (named_password and _LOWER_WORD.fullmatch(value) is not None)
    )
    if _names_something(value) and not password_shaped:
        return False
    if bare and identifier_like(value) and not password_shaped:
        return False  # `#define hmac_set_key nettle_hmac_set_key`: an alias, not a key
    if _FORMAT.search(value):
        # `%s`, `user=%s`, `v%d.%d`, `{}:{}` hold nothing but a word around the conversions;
        # a password that happens to hold `%d` (`x9%dQm!`) still has more than a word left
        rest = "".join(c for c in _FORMAT.sub("", value) if c.isalnum())
        if not rest or rest.isdigit() or _ONE_WORD.fullmatch(rest):
            return False
    if bare and _NUMBER.fullmatch(value):
        return False  # `#define PASSWORD_MAX 0x7fffffffUL`: a number, not a password
    if kind is Kind.PASSWORD:
        return len(value) >= config.min_password_length
    if len(value) < config.min_key_length or not _KEY_CHARS.fullmatch(value):
        return False
    return shannon_entropy(value) >= config.min_key_entropy


_WORD_RUN = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|\d{1,4}")
_WORD_SEPARATORS = re.compile(r"[_-]+")


def _single_letters(segment: str) -> int | None:
    """One-letter pieces of a segment read as words and numbers, or None if it does not
    read so: not made of such pieces, or a third number in it (`BuiltIn2BuiltIn`, `32x2`
    read as words; `4lye4qk8igs` is random)."""
    runs = _WORD_RUN.findall(segment)
    if "".join(runs) != segment or sum(r.isdigit() for r in runs) > 2:
        return None
    return sum(len(r) == 1 and r.isalpha() for r in runs)


def identifier_like(value: str) -> bool:
    """`TYPEOF_MAKE_OBJ_unsignedchar`, `__boost_threefry_engine_32x2`,
    `IndexedBidirectional1DIteratorConcept`: words and numbers, where random text falls
    apart into one-letter pieces and digits everywhere."""
    segments = [x for x in _WORD_SEPARATORS.split(value) if x]
    singles = [_single_letters(x) for x in segments]
    if not segments or any(n is None or n > 1 for n in singles):
        return False
    runs = [r for x in segments for r in _WORD_RUN.findall(x) if r.isalpha()]
    letters = sum(len(r) for r in runs)
    vowels = sum(c in "aeiouAEIOU" for r in runs for c in r)
    # words are long (`unsignedchar`, `Iterator`; random text's letter runs average ~2)
    # and pronounceable (a quarter or more vowels; random letters have a fifth)
    return (
        sum(n or 0 for n in singles) <= 1
        and bool(runs)
        and letters >= 3.5 * len(runs)
        and vowels >= 0.25 * letters
    )


_ALL_HEX = re.compile(r"[0-9a-fA-F]+")
# what sits where a random value might and is none: `postgres:16`, `db.local:5432`, an
# address (`2a01:4f8::2`, `36.44.40.54`)
_HOST_PORT_OR_TAG = re.compile(r"[a-z][a-z0-9._/-]*:(?:\d[\w.-]*|latest|stable|alpine|slim)")


def _is_address(value: str) -> bool:
    try:
        ipaddress.ip_address(value.strip("[]"))
    except ValueError:
        return False
    return True


def character_classes(value: str) -> int:
    """How many of lowercase, uppercase, digits and symbols the value mixes."""
    return (
        any(c.islower() for c in value)
        + any(c.isupper() for c in value)
        + any(c.isdigit() for c in value)
        + any(not c.isalnum() for c in value)
    )


def random_looking(value: str, kind: Kind, config: ScrubConfig) -> bool:
    """A secret with nothing around it to vouch for it (a positional argument, `password X`
    in prose, a name that only says `key`): plausible, and random on its own account. Hex
    is left out for keys: hashes, ids and test vectors are hex, and a hex key bound to a
    credential name is still caught there."""
    if not plausible_secret(value, kind, config, bare=True):
        return False
    if _HOST_PORT_OR_TAG.fullmatch(value) or _is_address(value):
        return False
    if identifier_like(value) and not (kind is Kind.PASSWORD and _password_shaped(value)):
        return False
    if kind is Kind.PASSWORD:
        return (
            len(value) >= config.min_random_password_length
            and character_classes(value) >= config.min_random_password_classes
        )
    return (
        len(value) >= config.min_random_key_length
        and (any(c.isdigit() for c in value) or character_classes(value) >= 3)
        and character_classes(value) >= 2
        and not _ALL_HEX.fullmatch(value)
        and shannon_entropy(value) >= config.min_random_key_entropy
    )


def folded(text: str) -> str:
    """Lowercase with one character per character, so offsets carry over to `text`."""
    lowered = text.lower()
    if len(lowered) == len(text):
        return lowered
    return "".join(c if len(c.lower()) != 1 else c.lower() for c in text)
