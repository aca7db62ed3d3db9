"""Credentials found by the name they are given: a value assigned to a name like `password`,
`db_pass`, `client_secret`, `auth_token` or `X-Api-Key`, in code, comments, embedded config
(INI, YAML, JSON, .env), command lines, connection strings and HTTP headers, and the password
in a URL's `user:password@`. Whether the value is a secret or a name, placeholder, format or
hash is plausibility's call; whether an unquoted value may be taken at all depends on where
the name sits (see `_unquoted_context`).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator
from enum import Enum
from typing import TYPE_CHECKING

from megacpp_pipeline.gates.scrub.hits import Hit, Kind
from megacpp_pipeline.gates.scrub.plausibility import (
    folded,
    is_hash_or_uuid,
    on_include_line,
    plausible_secret,
    random_looking,
)
from megacpp_pipeline.gates.scrub.re2_bytes import BytesRegex, chars_in

if TYPE_CHECKING:
    from megacpp_pipeline.gates.scrub.config import ScrubConfig


# ---- which names hold a credential
#
# A name is split into words at `_ - .` and camelCase humps (`kDbPass` -> k, db, pass).
# Words that end in one of the long words count too (`dbpassword`, `authtoken`); the short
# ones must stand alone (`bypass` and `renderpass` are not passwords).

PASSWORD_WORDS = frozenset(
    {"password", "passwd", "pwd", "pass", "pw", "passphrase", "passcode", "psk"}
    # in other languages (German, Spanish, French, Portuguese, Dutch, Polish, Russian and
    # its transliteration, Chinese and its pinyin); a word spelled in parts counts
    # (`mot_de_passe`, `motDePasse`). Not Italian `parola`: it is also just "word".
    | {"passwort", "kennwort", "contrasena", "contraseña", "motdepasse", "senha", "wachtwoord"}
    | {"haslo", "hasło", "пароль", "parol", "密码", "mima"}
)
# `rootpw`, `adminpwd`, `dbkennwort` end in one too (`STAPSK`: the ESP8266 examples' Wi-Fi
# pre-shared key); these few must stand alone: `bypass`, `compass`, `mimalloc`
_PASSWORD_ENDINGS = tuple(sorted(PASSWORD_WORDS - {"pass", "passcode", "parol", "mima"}))
SECRET_WORDS = frozenset(
    {"secret", "token", "credential", "cred", "creds", "apikey", "bearer", "auth", "authorization"}
)
_SECRET_ENDINGS = ("secret", "token", "apikey", "credential", "secretkey", "accesskey")
# `key` alone is a map key; after one of these it is a credential (detect-secrets' list)
KEY_QUALIFIERS = frozenset(
    {"api", "access", "secret", "auth", "client", "service", "account", "db", "database"}
    | {"priv", "private", "encryption", "signing", "hmac", "master", "session", "shared"}
    | {"subscription", "app", "bot", "webhook", "consumer", "deploy", "license", "storage"}
)
_KEY_COMPOUNDS = frozenset(q + "key" for q in KEY_QUALIFIERS)
# a last word that says the name is about the credential, not the credential itself
# (`password_field`, `token_type`, `secret_key_env_var`, `MAX_PASSWORD_LEN`)
NOT_A_VALUE = frozenset(
    {"name", "names", "type", "kind", "field", "label", "prompt", "hint", "len", "length"}
    | {"size", "count", "num", "max", "min", "file", "path", "dir", "env", "var", "format"}
    | {"fmt", "pattern", "regex", "policy", "hash", "digest", "salt", "url", "uri", "id"}
    | {"index", "idx", "prefix", "suffix", "char", "chars", "mask", "flag", "mode", "error"}
    | {"message", "msg", "timeout", "ttl", "expiry", "expires", "endpoint", "callback"}
    | {"method", "scheme", "mechanism", "algorithm", "alg", "cipher", "provider", "version"}
)

_KEY_SPELLINGS = sorted(
    q + sep + "key" for q in KEY_QUALIFIERS - {"secret", "auth"} for sep in ("_", "-", "")
)
# what wakes the finder up (the gate's column-wise RE2 prefilter, case-insensitive): every
# credential word and `key` compound a name can hold, and the two commands with a `-p` flag.
# `auth` and `pass` are spelled out to what a name ends with: `Author:` heads most files and
# `passed`, `bypass`, `pass_through` are everywhere.
_PASS_ENDS = (*(f"pass{c}" for c in " \t=:\"'({[,)"), "--pass", "pass\\")
_PASS_ENDS += tuple(f"pass_{c}" for c in " \t=:{")  # a member's trailing underscore: `pass_ =`
_AUTH_ENDS = (*(f"auth{c}" for c in "_-. \t=:\"'([,\\"), "authtoken", "authkey", "authoriz")
# a name ending in `key` right before what binds it (`key = "`, `Key{"`, `KEY "`, `key: x`)
_KEY_ENDS = tuple(f"key{c}" for c in " \t=:\"'({[\\")
# the password words that wake nothing else (`kennwort`, `senha`, `пароль`; `passwort` has
# `passw`): every word of the vocabulary finds its names
_OTHER_PASSWORD_ANCHORS = tuple(
    sorted(w for w in PASSWORD_WORDS if not any(a in w for a in ("pass", "pw", "psk")))
)
TRIGGERS: tuple[str, ...] = (
    *("passw", "passp", "passc", *_PASS_ENDS, *_AUTH_ENDS),
    *("pw", "secret", "token", "cred", "bearer", *_OTHER_PASSWORD_ANCHORS),
    *("depasse", "de_passe", "de-passe"),  # `mot_de_passe`'s `passe` wakes nothing above
    *_KEY_SPELLINGS,
    *_KEY_ENDS,
    *("mysql", "sshpass", "login", "logon", "signin", "connect("),
    *("psk", "wifi."),
)
# what the finder then looks for with str.find in the lowercased text: few, since each is a
# pass over the file (a case-insensitive regex alternation is a few MB/s in Python's `re`);
# `key` stands for every `api_key`, `accesskey`, `x-api-key` and is checked on the spot
ANCHORS: tuple[str, ...] = ("pass", "pw", "secret", "token", "cred", "auth", "bearer", "key")
ANCHORS += ("mysql", "login", "logon", "signin", "connect", "psk", "wifi")
ANCHORS += _OTHER_PASSWORD_ANCHORS
_QUALIFIER_LAST = frozenset("_-" + "".join(q[-1] for q in KEY_QUALIFIERS))
_KEY_QUALIFIED = re.compile(
    "(?:" + "|".join(sorted(KEY_QUALIFIERS - {"secret", "auth"})) + r")[_-]?\Z"
)

_NAME_CONTINUES = re.compile(r"s?[a-z0-9_]")  # `key_type`, `keyboard`: `key` is not the end
_WORD = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|[a-z]+|\d+|[^\x00-\x7f]+")


# the words a password word spelled in parts can start with (`mot`, `contrase`, `pass`)
_PASSWORD_WORD_HEADS = frozenset(w[:i] for w in PASSWORD_WORDS for i in range(2, len(w)))


def _words(name: str) -> list[str]:
    words = [w.lower() for w in _WORD.findall(name)]
    words = [w[:-1] if len(w) > 4 and w.endswith("s") else w for w in words]
    if len(words) > 1 and not _PASSWORD_WORD_HEADS.isdisjoint(words[:-1]):
        return _joined_password_words(words)
    return words


def _joined_password_words(words: list[str]) -> list[str]:
    """Two or three words that spell a password word become it: `mot_de_passe` and
    `contraseña` (split at the `ñ`) are one word, as `motdepasse` is."""
    out: list[str] = []
    i = 0
    while i < len(words):
        for n in (3, 2):
            joined = "".join(words[i : i + n])
            if i + n <= len(words) and joined in PASSWORD_WORDS:
                out.append(joined)
                i += n
                break
        else:
            out.append(words[i])
            i += 1
    return out


@functools.lru_cache(maxsize=8192)  # the same few names (`token`, `m_pass`) come back often
def credential_kind(name: str) -> Kind | None:
    """PASSWORD or API_KEY if `name` names a credential, else None."""
    words = _words(name)
    if not words or words[-1] in NOT_A_VALUE:
        return None
    if any(w in PASSWORD_WORDS or w.endswith(_PASSWORD_ENDINGS) for w in words):
        return Kind.PASSWORD
    if any(w in SECRET_WORDS or w in _KEY_COMPOUNDS or w.endswith(_SECRET_ENDINGS) for w in words):
        return Kind.API_KEY
    if "key" in words and KEY_QUALIFIERS.intersection(words[: words.index("key")]):
        return Kind.API_KEY
    return None


@functools.lru_cache(maxsize=8192)
def holds_a_secret(name: str) -> bool:
    """A key or secret name that ends in the credential (`hmac_key`, `kSigningKey`,
    `webhook_secret`): what it holds is the key itself, not a digest of one, as a name
    ending elsewhere may be (`token_sha256`). (A password in hex beside `sha1` is more
    likely the hash a test checks.)"""
    if credential_kind(name) is not Kind.API_KEY:
        return False
    last = _words(name)[-1]
    return (
        last in SECRET_WORDS
        or last in _KEY_COMPOUNDS
        or last == "key"
        or last.endswith(_SECRET_ENDINGS)
    )


# whose password a bare `pass` or `pw` holds (`db_pass`, `kWifiPw`): alone or after other
# words they are a compiler's or a renderer's pass, a `passwd` entry, a pixel width
_ACCOUNT_WORDS = frozenset(
    {"db", "database", "sql", "mysql", "user", "admin", "root", "login", "account", "app"}
    | {"wifi", "ap", "sta", "mqtt", "ftp", "smtp", "mail", "email", "proxy", "ssh", "ota"}
)
_SHORT_PASSWORD_WORDS = frozenset({"pass", "pw"})
# a word holding one of these names the credential or is its example (`"testpass"`)
_CREDENTIAL_STEMS = tuple(w for w in PASSWORD_WORDS | SECRET_WORDS if len(w) >= 4)


@functools.lru_cache(maxsize=8192)
def names_a_password(name: str, called: bool) -> bool:
    """A name that is a password and nothing else, enough to vouch for a value that reads as
    a word (`password = "letmein"`): its last word is a password word, `pass` and `pw` only
    after whose they are (`db_pass`). Called or given arguments (`m_password("x")`,
    `{"password", "x"}`), only the variable itself or its setter vouches: `getPassword("smtp")`
    looks one up and `IsValidPassword("abcdefgh")` tests a rule."""
    words = _words(name)
    if credential_kind(name) is not Kind.PASSWORD:
        return False
    *head, last = words
    if last in _SHORT_PASSWORD_WORDS:
        if not head or head[-1] not in _ACCOUNT_WORDS:
            return False
    elif not (last in PASSWORD_WORDS or last.endswith(_PASSWORD_ENDINGS)):
        return False
    if not called:
        return True
    own = _words(name.rpartition(".")[2])[:-1]  # `conn.setPassword`: the object says nothing
    return all(len(w) == 1 or w in _ACCOUNT_WORDS or w == "set" for w in own)


@functools.lru_cache(maxsize=8192)
def weak_key_name(name: str) -> bool:
    """A name that ends in `key` without saying which (`key`, `kModelHubKey`, `REPO_KEY`):
    maybe a map key, maybe a credential; only a value random on its own account decides."""
    words = _words(name)
    return bool(words) and words[-1].endswith("key") and not _NOT_SECRET_KEY.intersection(words)


# a key these words qualify is public by design or no credential (`public_key`, `kPubKey`,
# `verify_key`, `Sec-WebSocket-Key`'s nonce, `cache_key`)
_NOT_SECRET_KEY = frozenset({"public", "pub", "verify", "verifying", "verification", "socket"})
_NOT_SECRET_KEY |= {"cache", "sort", "primary", "foreign", "lookup", "partition"}


# the callee of a call that takes a credential by position (`client.login("u", "p")`,
# `mysql_real_connect(c, host, user, "p", db, ...)`, `AWSCredentials creds("id", "s")`)
_LOGIN_CALLS = frozenset({"login", "logon", "signin", "connect", "authenticate", "bind"})
_KEY_CALLS = frozenset({"credential", "cred", "creds", "auth"})


@functools.lru_cache(maxsize=8192)
def positional_kind(name: str) -> Kind | None:
    words = _words(name)
    if not words:
        return None
    if wifi_call(name):
        return Kind.PASSWORD
    if words[-1] in _LOGIN_CALLS:
        return Kind.PASSWORD
    if words[-1] in _KEY_CALLS:
        return Kind.API_KEY
    return None


@functools.lru_cache(maxsize=8192)
def wifi_call(name: str) -> bool:
    """`WiFi.begin(ssid, pass)`, `WiFi.softAP(ssid, pass)` (Arduino, ESP32, ESP8266): the
    second argument is the network's password by the API, whatever it looks like."""
    words = _words(name)
    return "wifi" in "".join(words[:-1]) and words[-1] in ("begin", "ap")


# ---- where a name sits

_NAME_CHARS = re.compile(r"[\w.\-]{0,64}")
_ESCAPE_LETTERS = frozenset("nrt0")
_COMMENT_START = re.compile(r"[ \t]*(?:/\*|\*|#(?![ \t]*(?:define|include|if|undef|pragma)\b))")
# a line that is a config entry on its own: `password = x`, `  db_pass: x`, `export X=y`,
# `- DB_PASSWORD=x` (in a raw string, a block comment, a heredoc)
_CONFIG_LINE_HEAD = re.compile(r"[ \t]*+(?:[-*#;][ \t]*+)?(?:(?:export|set|setenv)[ \t]++)?\Z")
_CONFIG_LINE_TAIL = re.compile(r"(?:[ \t]+[#;].*)?[ \t]*\Z")  # `x = y;` is C++, `x = y ; c` INI


def _name_span(text: str, pos: int) -> tuple[int, int]:
    """The identifier around text[pos] (letters, digits, `_ . -`), at most 64 each side."""
    before = _NAME_CHARS.match(text[max(0, pos - 64) : pos][::-1])
    start = pos - (before.end() if before else 0)
    # `"host=db\npassword=x"`: the `n` of an escape is not part of the name
    if start and text[start - 1] == "\\" and text[start] in _ESCAPE_LETTERS:
        start += 1
    after = _NAME_CHARS.match(text, pos)
    end = after.end() if after else pos
    while start < end and text[start] in ".-":
        start += 1
    while end > start and text[end - 1] in ".-":
        end -= 1
    return start, end


def _in_string(line_head: str) -> bool:
    """An odd number of unescaped double quotes before the name on its line."""
    return (line_head.count('"') - line_head.count('\\"')) % 2 == 1


_LINE_WINDOW = 1024  # how far a value's line is read either side: long lines cost no more


def _line_around(text: str, start: int, end: int) -> tuple[int, int]:
    """The start of the line holding text[start] and the end of the one holding text[end],
    each at most _LINE_WINDOW away (a longer line is cut there)."""
    lo = max(0, start - _LINE_WINDOW)
    line_start = text.rfind("\n", lo, start) + 1 or lo
    line_end = text.find("\n", end, end + _LINE_WINDOW)
    return line_start, (line_end if line_end >= 0 else min(len(text), end + _LINE_WINDOW))


def _unquoted_context(text: str, start: int, value_end: int) -> str | None:
    """Where an unquoted value may be taken, and how it ends: where C++ cannot put an
    expression (a comment, a string literal, a config line of its own, after `--`, `;`, `?`
    or `&`). In code, `password = read_password();` assigns a variable, not a secret."""
    if start and text[start - 1] in "?&":
        return "query"
    if text.startswith("--", start - 2) or (start and text[start - 1] == ";"):
        return "argument"
    line_start, line_end = _line_around(text, start, value_end)
    head = text[line_start:start]
    if "//" in head or "/*" in head or _COMMENT_START.match(head):
        return "comment"
    if _in_string(head):
        return "string"
    if _CONFIG_LINE_HEAD.fullmatch(head) and _CONFIG_LINE_TAIL.match(text, value_end, line_end):
        return "config"
    return None


# ---- what follows the name

_SCHEME = r"(?:(?i:bearer|basic|token|bot|digest|oauth)[ ]+)?"
# the key's closing quote(s) or bracket, an operator (or none: `#define NAME "x"`), maybe a
# wrapper call (`std::string(`, `QStringLiteral(`), then a quote: a quoted value follows
# (whitespace runs are possessive, `*+`: a name followed by a megabyte of blanks must not
# backtrack through every way of splitting them)
_QUOTED_AFTER = re.compile(
    r"(?:[^\S\n]*+\[[^\S\n]*+\w*[^\S\n]*+\])?(?:\\?[\"'`]|\]){0,2}[^\S\n]*+"
    # (after an operator, the literal may start on the next line: `kKey =\n    "ab" "cd"`)
    r"(?:(?P<op>=|:=|==|!=|:|\(|\{|,|->|=>|\bis\b|\bwas\b)[^\S\n]*+\n?)?[^\S\n]*+"
    r"(?:(?P<call>[A-Za-z_][\w:]*+)[^\S\n]*+[({][^\S\n]*+)?(?P<open>[({])?[^\S\n]*+"
    r"(?P<prefix>(?:L|u8|u|U)?R?)(?P<q>\\?[\"'`])"
)
# a call around the literal that only makes it a string (`std::string("x")`, `F("x")`)
_STRING_CALL = re.compile(r"(?:\w*::)*(?:\w*(?i:string)\w*|_T|TEXT|F|PSTR)")
_LITERAL_BODY = {
    '"': re.compile(r'(?:[^"\\\n]|\\.){1,256}(?=")'),
    "'": re.compile(r"(?:[^'\\\n]|\\.){1,256}(?=')"),
    "`": re.compile(r"[^`\\\n]{1,256}(?=`)"),
    '\\"': re.compile(r'[^"\\\n]{1,256}(?=\\")'),
    "\\'": re.compile(r"[^'\\\n]{1,256}(?=\\')"),
}
_RAW_OPEN = re.compile(r"(?P<delim>[^()\\\s\"]{0,16})\(")
_SCHEME_VALUE = re.compile(r"(?i:bearer|basic|token|bot|digest|oauth) +(?=\S+\Z)")
# `password=x`, `password = x`, `password: x`, `Authorization: Bearer x`, `PWD={x;y}`
_BARE_AFTER = re.compile(
    r"(?:\\?[\"'])?(?P<op>[^\S\n]*+(?:=|:(?![:/]))[^\S\n]*+|(?<=\w) (?=[^\s\-\"'`]))"
    + _SCHEME
    + r"(?P<value>\{[^{}\n]{1,256}\}|[^\s\"'`\\;,<>(){}\[\]|]{1,256})"
)


# the next piece of an adjacent-literal concatenation: `"ab" "cd"`, across a line break too
_NEXT_LITERAL = re.compile(r'"[ \t]*+(?:\n[ \t]*+){0,2}(?:L|u8|u|U)?"')


class Binding(Enum):
    """How a literal after a name belongs to it."""

    OWN = "own"  # assigned, initialized or defined: `x = "v"`, `#define X "v"`, `"x": "v"`
    ARGUMENT = "argument"  # the name is called: `x("v")`, `x{"v"}`
    NEXT = "next"  # the next item of a list: `{"x", "v"}`, `f(a, "x", "v")`
    WRAPPED = "wrapped"  # an argument of some other call: `x = getenv("v")`


def _binding(m: re.Match[str]) -> Binding:
    call = m.group("call")
    if call is not None and not _STRING_CALL.fullmatch(call):
        return Binding.WRAPPED
    if m.group("op") == ",":
        return Binding.NEXT
    if m.group("op") in ("(", "{") or (call is None and m.group("open")):
        return Binding.ARGUMENT
    return Binding.OWN


# a name that opens its list: `{"password", "v"}`, `setenv("DB_PASSWORD", "v", 1)`
_OPENS_LIST = re.compile(r"[({\[][^\S\n]*+[\"']?\Z")


def _quoted_value(text: str, pos: int) -> tuple[int, int, str, Binding] | None:
    """Span, value and binding of the literal after a name (prefix and quote matched from
    `pos`); raw strings `R"d(...)d"` on one line included; adjacent literals `"ab" "cd"` are
    one value, spanning all their pieces."""
    m = _QUOTED_AFTER.match(text, pos)
    if m is None:
        return None
    quote, start = m.group("q"), m.end()
    if "R" in m.group("prefix") and quote == '"':
        d = _RAW_OPEN.match(text, start)
        if d is None:
            return None
        close = text.find(")" + d.group("delim") + '"', d.end(), d.end() + 257)
        if close < 0 or "\n" in text[d.end() : close]:
            return None
        return d.end(), close, text[d.end() : close], _binding(m)
    body = _LITERAL_BODY[quote].match(text, start)
    if body is None:
        return None
    end, pieces = body.end(), [body.group(0)]
    while quote == '"' and (nxt := _NEXT_LITERAL.match(text, end)) is not None:
        more = _LITERAL_BODY['"'].match(text, nxt.end())
        if more is None:
            break
        end = more.end()
        pieces.append(more.group(0))
    return start, end, "".join(pieces), _binding(m)


_DEFINE_HEAD = re.compile(r"[ \t]*+#[ \t]*+define[ \t]++\Z")
_DEFINE_VALUE = re.compile(
    r"[ \t]++(?P<value>[^\s\"'`\\;,<>(){}\[\]|]{1,256})[ \t]*+(?:/[/*].*)?$", re.MULTILINE
)


def _define_value(text: str, start: int, end: int) -> tuple[int, int] | None:
    """`#define DB_PASSWORD S3cr3t!`: a macro whose whole body is one unquoted token."""
    if end >= len(text) or text[end] not in " \t":
        return None
    line_start, _ = _line_around(text, start, start)
    if not _DEFINE_HEAD.fullmatch(text, line_start, start):
        return None
    m = _DEFINE_VALUE.match(text, end)
    return m.span("value") if m else None


# One RE2 pass finds every anchor of an ASCII text (fourteen str.find passes cost 3-4x more):
# leftmost matches skip what overlaps them, so each match is also read for anchors that start
# inside it (`passecret`, `secretoken`, `mysqlogin`); no anchor contains another.
_ANCHOR_SCAN = BytesRegex("|".join(ANCHORS))
_ANCHORS_BY_FIRST = {c: tuple(a for a in ANCHORS if a[0] == c) for c in {a[0] for a in ANCHORS}}


def anchor_positions(lowered: str) -> dict[str, list[int]]:
    """Every occurrence of every anchor in `lowered` (folded text), ascending per anchor.
    A text that is not ASCII is scanned as its UTF-8 bytes too: an anchor is whole
    characters, and UTF-8 is self-synchronizing, so a match starts and ends on characters;
    its byte offsets are counted back to character offsets from the match before it."""
    found: dict[str, list[int]] = {anchor: [] for anchor in ANCHORS}
    data = lowered.encode("utf-8", "surrogatepass")
    ascii = len(data) == len(lowered)
    byte_at = char_at = 0
    for (start_b, end_b), *_ in _ANCHOR_SCAN.spans(data):
        if ascii:
            start, end = start_b, end_b
        else:
            char_at += chars_in(data, byte_at, start_b)
            byte_at, start = start_b, char_at
            end = start + chars_in(data, start_b, end_b)
        found[lowered[start:end]].append(start)
        for inner in range(start + 1, end):
            for anchor in _ANCHORS_BY_FIRST.get(lowered[inner], ()):
                if lowered.startswith(anchor, inner):
                    found[anchor].append(inner)
    for positions in found.values():
        positions.sort()
    return found


def find_assigned_secret(text: str, config: ScrubConfig) -> Iterator[Hit]:
    lowered = folded(text)
    names: set[int] = set()
    flags_read_to = 0  # `-p` flags after `mysql` are read once, however many `mysql`s a line has
    found = anchor_positions(lowered)
    for anchor in ANCHORS:
        for pos in found[anchor]:
            if anchor == "pass" and lowered.startswith("sshpass", pos - 3):
                yield from _sshpass_password(text, pos - 3, config)
            elif anchor == "mysql":
                if pos >= flags_read_to:
                    flags_read_to = _line_around(text, pos, pos)[1]
                    yield from _mysql_passwords(text, pos, flags_read_to, config)
            elif (
                anchor != "key"
                or (
                    lowered[pos - 1 : pos] in _QUALIFIER_LAST  # cheap: most `key`s are map keys
                    and _KEY_QUALIFIED.search(lowered, max(0, pos - 9), pos)
                )
                or not _NAME_CONTINUES.match(lowered, pos + 3)
            ):
                start, end = _name_span(text, pos)
                if start not in names:
                    names.add(start)
                    yield from _named_value(text, start, end, config)


_CALL_OPENS = re.compile(r"[ \t]*[({]")


def _named_value(text: str, start: int, end: int, config: ScrubConfig) -> Iterator[Hit]:
    name = text[start:end]
    kind = credential_kind(name)
    weak = kind is None and weak_key_name(name)
    found = False
    if kind is not None or weak:
        for hit in _bound_value(text, start, end, kind or Kind.API_KEY, config, weak):
            found = True
            yield hit
    if found and not _CALL_OPENS.match(text, end):
        return
    # a call or brace-init binds more than its first literal: `AWSCredentials creds("AKIA..",
    # "<secret>")` has its secret second
    call_kind = positional_kind(name)
    if call_kind is not None:
        yield from _positional_values(text, end, call_kind, config, by_position=wifi_call(name))
    if kind is not None or call_kind is not None:
        yield from _pair_password(text, start, end, config)


def _bound_value(
    text: str, start: int, end: int, kind: Kind, config: ScrubConfig, weak: bool
) -> Iterator[Hit]:
    """The value a credential name is bound to, in whichever way the text binds it. A weak
    name (`key`) vouches for nothing: its value must look random on its own."""
    name = text[start:end]
    if start and text[start - 1] == "<" and text.startswith(">", end):
        xml = _XML_VALUE.match(text, end + 1)  # `<password>x</password>`
        if xml is not None:
            yield from _hit(text, *xml.span("value"), kind, config, True, name, random_only=weak)
        return
    if name.lower() in _SCHEMES and (concat := _SCHEME_CONCAT.match(text, end)) is not None:
        literal = _literal_at(text, concat.end(), concat.group("q"))  # `"Bearer " + "x"`
        if literal is not None:
            yield from _hit(text, *literal, kind, config, False, name, random_only=weak)
        return
    quoted = _quoted_value(text, end)
    if quoted is not None:
        value_start, value_end, value, binding = quoted
        scheme = _SCHEME_VALUE.match(text, value_start, value_end)
        if scheme is not None:
            value = value[scheme.end() - value_start :]
            value_start = scheme.end()
        # a password name vouches for a word (`"letmein"`) where it owns the literal, unless
        # the word names a credential itself (`"password"`, `"testpass"`, `"kennwort"`)
        named_password = (
            binding is not Binding.WRAPPED
            and (
                binding is not Binding.NEXT
                or _OPENS_LIST.search(text, max(0, start - 8), start) is not None
            )
            and names_a_password(name, called=binding is not Binding.OWN)
            and not any(stem in value for stem in _CREDENTIAL_STEMS)
        )
        yield from _hit(
            text,
            value_start,
            value_end,
            kind,
            config,
            False,
            name,
            value=value,
            random_only=weak,
            named_password=named_password,
        )
        return
    unquoted = _unquoted_value(text, start, end)
    if unquoted is not None:
        value_start, value_end, prose = unquoted
        yield from _hit(
            text, value_start, value_end, kind, config, True, name, random_only=weak or prose
        )


def _unquoted_value(text: str, start: int, end: int) -> tuple[int, int, bool] | None:
    """(start, end, prose): prose is `password X` or `password is X` with nothing but
    whitespace or a word binding them, taken only where C++ cannot put an expression and
    only for a value that looks random on its own account."""
    m = _BARE_AFTER.match(text, end)
    if m is None or (m.group("op").isspace() and not text.startswith("--", start - 2)):
        define = _define_value(text, start, end)  # `name value`: flags only
        if define is not None:
            return (*define, False)
        return _prose_value(text, start, end)
    value_start, value_end = m.span("value")
    if text[value_end : value_end + 1] in _BRACKETS:
        # inside a string or on a config line of its own nothing in brackets is an
        # expression: a Django key's `(` and `)` are part of it
        wide = _WIDE_VALUE.match(text, value_start)
        if wide and _unquoted_context(text, start, wide.end()) in ("config", "string"):
            value_end = max(value_end, wide.end())
    where = _unquoted_context(text, start, value_end)
    if where is None:
        return None
    if text[value_start] == "{":
        return value_start + 1, value_end - 1, False  # ODBC's braces quote a value with `;`
    if where == "query":
        amp = text.find("&", value_start, value_end)  # the next parameter
        value_end = amp if amp >= 0 else value_end
    elif where == "comment" and text[value_end - 1] in ".:" and value_end - value_start > 1:
        value_end -= 1  # a sentence's full stop is not the password's
    return value_start, value_end, False


_BRACKETS = frozenset("(){}[]<>|")
_WIDE_VALUE = re.compile(r"[^\s\"'`\\;,]{1,256}")


# `password X`, `password is X`, `rootpw --plaintext X`, netrc's `machine h login u password X`
_PROSE_AFTER = re.compile(
    r"[^\S\n]++(?:(?:is|was|=|:|to|of)[^\S\n]++)?(?:--?[A-Za-z][\w-]*+[^\S\n]++){0,2}"
    r"(?P<value>[^\s\"'`\\;,<>(){}\[\]|]{1,256})"
)
# a netrc entry (or .pgpass-like keyword list) spelled on one line of a raw string or block
_NETRC_HEAD = re.compile(r"(?:^|[\s\"'])(?:machine|default|login|account)[ \t]")


# `pass` and `pw` alone are verbs and units in prose (`pass AddNull=false`, `pass %m/%d/%Y`)
_PROSE_NAME_TOO_SHORT = frozenset({"pass", "pw"})
# `AddNull=false`, `desiredCapacityHint=0`: an argument in prose, not a password
_KEY_VALUE = re.compile(r"[A-Za-z_]\w*=(?i:true|false|null|nullptr|none|yes|no|on|off|\d+)")


def _prose_value(text: str, start: int, end: int) -> tuple[int, int, bool] | None:
    if text[start:end].lower() in _PROSE_NAME_TOO_SHORT:
        return None
    m = _PROSE_AFTER.match(text, end)
    if m is None or _KEY_VALUE.fullmatch(m.group("value")):
        return None
    value_start, value_end = m.span("value")
    where = _unquoted_context(text, start, value_end)
    if where is None:
        line_start, _ = _line_around(text, start, start)
        if not _NETRC_HEAD.search(text, line_start, start):
            return None
    while value_end - value_start > 1 and text[value_end - 1] in ".:":
        value_end -= 1  # a sentence's full stop is not the password's
    return value_start, value_end, True


_XML_VALUE = re.compile(r"[^\S\n]*+(?P<value>[^<>\s\"'`\\]{1,256})[^\S\n]*+</")
_SCHEMES = frozenset({"bearer", "basic", "token", "digest"})
# `std::string("Bearer ") + "x"`, `"Bearer " + QString("x")`, `"Token " "x"`
_SCHEME_CONCAT = re.compile(
    r" ?\\?[\"'`][^\S\n]*+\)?[^\S\n]*+\+?[^\S\n]*+(?:[A-Za-z_][\w:]*+[^\S\n]*+[({][^\S\n]*+)?"
    r"(?:L|u8|u|U)?(?P<q>[\"'`])"
)


def _literal_at(text: str, pos: int, quote: str) -> tuple[int, int] | None:
    body = _LITERAL_BODY[quote].match(text, pos)
    return (pos, body.end()) if body else None


# a literal argument of the call right after a name, and the parentheses around it
_CALL_OPEN = re.compile(r"[^\S\n]*+[({]")
_CALL_TOKEN = re.compile(
    r'"(?P<body>(?:[^"\\\n]|\\.){0,256})"|(?P<open>[({\[])|(?P<close>[)}\]])|;'
)


def _positional_values(
    text: str, end: int, kind: Kind, config: ScrubConfig, by_position: bool = False
) -> Iterator[Hit]:
    """`client.login("svc", "p")`, `AWSCredentials creds("id", "s")`: a call whose callee
    says it takes a credential holds it in one of its literal arguments; the one that
    looks random on its own account (user names, hosts and database names do not)."""
    m = _CALL_OPEN.match(text, end)
    if m is None:
        return
    depth = 1
    literals = 0
    for t in _CALL_TOKEN.finditer(text, m.end(), min(len(text), m.end() + 512)):
        if t.group("open"):
            depth += 1
        elif t.group("close") or t.group(0) == ";":
            depth -= 1
            if depth == 0 or t.group(0) == ";":
                return
        elif depth == 1 and t.group("body") and by_position:
            if literals == 1:  # the password's place: judged as a named value
                yield from _hit(text, *t.span("body"), kind, config, False, "password")
            literals += 1
        elif depth == 1 and t.group("body"):
            hits = list(_hit(text, *t.span("body"), kind, config, False, random_only=True))
            if not hits and kind is Kind.API_KEY and literals:
                # a credential's later literal (`setCredentials("user", "Mq77pass!x")`,
                # `Credentials{"bob", "Tr0ub4dor&3"}`) may be a password, judged as one
                hits = list(
                    _hit(text, *t.span("body"), Kind.PASSWORD, config, False, random_only=True)
                )
            literals += 1
            yield from hits


# `login: admin / S3cr3t!`, `credentials are admin:S3cr3t!` (a user, then its password)
_PAIR = re.compile(
    r"[^\S\n]*+(?::|=|is|are)[^\S\n]*+[\w.@-]{1,64}[^\S\n]*+[/:][^\S\n]*+"
    r"(?P<value>[^\s\"'`\\]{1,128})"
)


def _pair_password(text: str, start: int, end: int, config: ScrubConfig) -> Iterator[Hit]:
    m = _PAIR.match(text, end)
    if m is None or _unquoted_context(text, start, m.end()) is None:
        return
    value_start, value_end = m.span("value")
    while value_end - value_start > 1 and text[value_end - 1] in ".:,;)":
        value_end -= 1
    yield from _hit(text, value_start, value_end, Kind.PASSWORD, config, True, random_only=True)


def _spells_name(value: str, name: str) -> bool:
    """`#define SN_setct_AuthResTBS "setct-AuthResTBS"` (OpenSSL's object names): a value
    spelled inside its own name names a thing. (Not the other way round: `Password1!` is a
    password, if a weak one.)"""
    v = "".join(c for c in value.lower() if c.isalnum())
    return len(v) >= 4 and v in "".join(c for c in name.lower() if c.isalnum())


def _hit(
    text: str,
    start: int,
    end: int,
    kind: Kind,
    config: ScrubConfig,
    bare: bool,
    name: str = "",
    detector: str = "assigned_secret",
    value: str | None = None,  # when the span holds more than the value (`"ab" "cd"`)
    random_only: bool = False,  # nothing vouches for the value but its own look
    named_password: bool = False,  # a password's own name binds it (see names_a_password)
) -> Iterator[Hit]:
    value = text[start:end] if value is None else value
    if random_only:
        if not random_looking(value, kind, config):
            return
    elif not plausible_secret(value, kind, config, bare=bare, named_password=named_password):
        return
    if _spells_name(value, name):
        return
    if on_include_line(text, start) or is_hash_or_uuid(
        value, text, start, end, key_named=bool(name) and holds_a_secret(name)
    ):
        return
    yield Hit(start, end, kind, detector)


# `mysql -u root -pS3cr3t`, `mysqldump -uroot -p'x'`, `sshpass -p 'x' ssh host`
_P_VALUE = r"(?:(?P<q>['\"])(?P<quoted>[^'\"\s]{1,128})(?P=q)|(?P<glued>[^\s'\"`;|<>]{1,128}))"
_P_FLAG = re.compile(r"(?<=\s)-p" + _P_VALUE)
_SSHPASS_P = re.compile(r"sshpass[ \t]+-p[ \t]*" + _P_VALUE)


def _mysql_passwords(text: str, start: int, end: int, config: ScrubConfig) -> Iterator[Hit]:
    for m in _P_FLAG.finditer(text, start, end):
        group = "quoted" if m.group("quoted") else "glued"
        yield from _hit(text, *m.span(group), Kind.PASSWORD, config, bare=True)


def _sshpass_password(text: str, start: int, config: ScrubConfig) -> Iterator[Hit]:
    m = _SSHPASS_P.match(text, start, _line_around(text, start, start)[1])
    if m is not None:
        group = "quoted" if m.group("quoted") else "glued"
        yield from _hit(text, *m.span(group), Kind.PASSWORD, config, bare=True)


# ---- passwords in URLs: `scheme://user:password@host`, the user may be empty

_URL_USERINFO = re.compile(
    r"://[^\s:/?#\[\]@\"'<>`\\]*:(?P<password>[^\s/?#\[\]@\"'<>`\\]{1,256})@(?=[\w\[])"
)


# `https://<token>@github.com/org/repo.git` (.git-credentials, CI clone URLs): a user that is
# a token; `git@`, `user@` are names, a random one is the credential itself
_URL_TOKEN_USER = re.compile(r"://(?P<token>[^\s:/?#\[\]@\"'<>`\\]{16,256})@(?=[\w\[])")


def find_url_password(text: str, config: ScrubConfig) -> Iterator[Hit]:
    for m in _URL_USERINFO.finditer(text):
        start, end = m.span("password")
        if not on_include_line(text, start):
            yield from _hit(text, start, end, Kind.PASSWORD, config, True, "", "url_password")
    for m in _URL_TOKEN_USER.finditer(text):
        start, end = m.span("token")
        if not on_include_line(text, start):
            yield from _hit(
                text, start, end, Kind.API_KEY, config, True, "", "url_token", random_only=True
            )


# the URL finder's prefilter (the screen's, an RE2 pattern)
URL_USERINFO_TRIGGER = r"://[^\s/@]*@"


# ---- credentials by the structure of the line that holds them, whatever it is called

# a .pgpass line, `host:port:database:user:password`, pasted into a comment or a string
PGPASS_TRIGGER = r":(?:\d{1,5}|\*):[\w.*-]+:[\w.@*-]+:"
_PGPASS_LINE = re.compile(
    r"^[ \t]*+(?:(?://++|#|\*|;|\")[ \t]*+)?[\w.*-]++:(?:\d{1,5}|\*):[\w.*-]++:[\w.@*-]++:"
    r"(?P<value>[^\s\"'`\\]{1,128})(?=\\n|\"|[ \t]*$)",
    re.MULTILINE,
)


def find_pgpass_password(text: str, config: ScrubConfig) -> Iterator[Hit]:
    for m in _PGPASS_LINE.finditer(text):
        yield from _hit(text, *m.span("value"), Kind.PASSWORD, config, True, "", "pgpass_line")


# `curl -u admin:X`, `--user admin:X`: the password half of a user flag's value
USER_COLON_TRIGGER = r"(?:^|\s)(?:-u|--user)[ \t=]+['\"]?[^\s:'\"]+:"
_USER_COLON = re.compile(
    r"(?<!\S)(?:-u|--user)(?:[ \t]++|=)(?P<q>['\"]?)[^\s:'\"]{1,64}:"
    r"(?P<value>[^\s'\"`]{1,128})(?P=q)(?=[\s\"']|\\[nr]|$)"
)


def find_user_colon_password(text: str, config: ScrubConfig) -> Iterator[Hit]:
    for m in _USER_COLON.finditer(text):
        yield from _hit(text, *m.span("value"), Kind.PASSWORD, config, True, "", "user_flag")


# `docker login -u ci -p X`, `mysqladmin -u root -p X`: a user flag, then a password flag
USER_PASS_FLAGS_TRIGGER = r"(?:^|\s)-u[ \t]*[^\s-]\S*[ \t]+(?:\S+[ \t]+){0,6}-p"
_USER_PASS_FLAGS = re.compile(
    r"(?<!\S)-u[ \t]*+[^\s'\"`-][^\s'\"`]*+[ \t]++(?:--?[A-Za-z][\w-]*+[ \t]++){0,4}?"
    r"-p[ \t]*+(?:(?P<q>['\"])(?P<quoted>[^'\"\s]{1,128})(?P=q)|(?P<bare>[^\s'\"`;|<>]{1,128}))"
)


def find_flag_password(text: str, config: ScrubConfig) -> Iterator[Hit]:
    for m in _USER_PASS_FLAGS.finditer(text):
        group = "quoted" if m.group("quoted") else "bare"
        yield from _hit(
            text, *m.span(group), Kind.PASSWORD, config, True, "", "user_password_flags"
        )
