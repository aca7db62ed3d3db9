"""Provider token rules as data: gitleaks' MIT rule file (vendor/gitleaks.toml, pinned by
sha256), compiled with RE2, woken by the rules' own keywords, each hit named by its rule id.
gitleaks' semantics are kept where they decide what a hit is: the secret group, the entropy
floor, the global and per-rule allowlists (regex targets, stopwords, AND conditions). The
gate's finder runs them with issuer_tokens.py, in the text and across adjacent literals."""

from __future__ import annotations

import functools
import hashlib
import re
import tomllib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from re2 import _re2

from megacpp_pipeline.core.errors import FieldedError
from megacpp_pipeline.gates.scrub.hits import Hit, Kind
from megacpp_pipeline.gates.scrub.issuer_tokens import (
    PREFIXED_SCREEN,
    PREFIXED_TOKEN_DETECTOR,
    prefixed_tokens,
)
from megacpp_pipeline.gates.scrub.keys import has_key_material
from megacpp_pipeline.gates.scrub.plausibility import (
    is_hash_or_uuid,
    on_include_line,
    plausible_secret,
    shannon_entropy,
)
from megacpp_pipeline.gates.scrub.re2_bytes import (
    UNANCHORED,
    ByteOffsets,
    BytesRegex,
    probe_pattern,
)
from megacpp_pipeline.gates.scrub.screen import Screen, Screened, ScreenEntry

if TYPE_CHECKING:
    from megacpp_pipeline.gates.scrub.config import ScrubConfig

VENDOR_DIR = Path(__file__).parent / "vendor"
GITLEAKS_FILE = VENDOR_DIR / "gitleaks.toml"
# the pin: a rule file that is not byte-for-byte this one is refused (see LICENSE.gitleaks
# for its origin commit); updating the rules means updating this hash in the same commit
GITLEAKS_SHA256 = "e163e53b9e7e8a8511e77271e2b323ed057759542a6d988258afe3a1fa329caf"
DETECTOR_PREFIX = "gitleaks:"
GENERIC_RULE_PRIORITY = 5  # see detectors.DETECTORS
# a guess from shape alone: after every finder that read a name or a structure
PREFIXED_TOKEN_PRIORITY = 5


class VendorRulesError(FieldedError, ValueError):
    """The vendored rule file is not the pinned one or does not parse (names the file and,
    where one is at fault, the rule)."""

    def __init__(self, path: Path, message: str, rule: str | None = None) -> None:
        where = f"{path}: rule {rule!r}" if rule else str(path)
        super().__init__(f"{where}: {message}")
        self.path = path
        self.rule = rule


@dataclass(frozen=True)
class Allowlist:
    """A gitleaks allowlist as far as content can decide it: a path or commit condition
    never holds on text alone, so under AND it makes the allowlist inapplicable."""

    regexes: tuple[BytesRegex, ...]
    target: str  # secret | match | line
    stopwords: tuple[str, ...]
    requires_path: bool  # AND condition with a path or commit list

    def allows(self, secret: str, match: str, line: str) -> bool:
        if self.requires_path:
            return False
        target = {"match": match, "line": line}.get(self.target, secret).encode()
        by_regex = any(r.search(target) for r in self.regexes)
        lowered = secret.lower()
        by_stopword = any(w in lowered for w in self.stopwords)
        return by_regex or by_stopword


@dataclass(frozen=True)
class VendorRule:
    id: str
    regex: BytesRegex
    keywords: tuple[str, ...]
    entropy: float
    secret_group: int
    allowlists: tuple[Allowlist, ...]
    kind: Kind
    generic: bool  # names a credential by what it is called, not by its issuer's format
    # woken by a word C++ is full of (`key`, `ey`, `s.`): the screen asks for the rule's own
    # probe too, so it runs only where it can match
    screened: bool = False
    # gitleaks runs this rule only on files whose path matches; the gate applies it to any
    # text, since what it scans is C++ and such content (a .tf block, a nuget.config entry,
    # a Kubernetes Secret) only ever reaches it pasted into a C++ file
    path_condition: str | None = None

    @property
    def detector(self) -> str:
        return DETECTOR_PREFIX + self.id


@dataclass(frozen=True)
class RuleSet:
    rules: tuple[VendorRule, ...]
    skipped: tuple[tuple[str, str], ...]  # (rule id, why it cannot run on file content)
    global_allowlist: Allowlist
    keywords: tuple[str, ...]
    rules_by_keyword: tuple[tuple[int, ...], ...]  # keyword index -> rule indices
    unkeyed: tuple[int, ...]  # rules without keywords run on every text
    keyword_set: Any  # re2 Set over the keywords, matched on the lowercased text
    sha256: str


def _kind(rule_id: str) -> Kind:
    if rule_id == "private-key":
        return Kind.PRIVATE_KEY
    if rule_id.endswith("-password") or rule_id == "curl-auth-user":
        return Kind.PASSWORD
    return Kind.API_KEY


def _allowlist(path: Path, rule: str | None, raw: dict[str, Any]) -> Allowlist:
    target = raw.get("regexTarget", "secret")
    if target not in ("secret", "match", "line"):
        raise VendorRulesError(path, f"allowlist regexTarget {target!r} is unknown", rule)
    regexes = []
    for pattern in raw.get("regexes", []):
        try:
            regexes.append(BytesRegex(pattern))
        except ValueError as exc:
            raise VendorRulesError(path, f"allowlist regex does not compile: {exc}", rule) from exc
    and_condition = str(raw.get("condition", "OR")).upper() == "AND"
    return Allowlist(
        tuple(regexes),
        target,
        tuple(w.lower() for w in raw.get("stopwords", [])),
        and_condition and bool(raw.get("paths") or raw.get("commits")),
    )


def load_rules(path: Path = GITLEAKS_FILE, sha256: str = GITLEAKS_SHA256) -> RuleSet:
    """The rule file at `path`, verified against `sha256` and compiled. A rule whose regex
    RE2 cannot compile, or that has no content regex at all, is listed in `skipped` with the
    reason (the bench prints them; a test pins the list), never dropped without a word."""
    data = path.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    if digest != sha256:
        raise VendorRulesError(path, f"sha256 {digest} is not the pinned {sha256}")
    try:
        doc = tomllib.loads(data.decode())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise VendorRulesError(path, f"does not parse: {exc}") from exc
    rules: list[VendorRule] = []
    skipped: list[tuple[str, str]] = []
    for raw in doc.get("rules", []):
        rule_id = raw.get("id")
        if not rule_id:
            raise VendorRulesError(path, "a [[rules]] entry has no id")
        if "regex" not in raw:
            skipped.append((rule_id, "path-only rule: it matches file names, not content"))
            continue
        try:
            regex = BytesRegex(raw["regex"])
        except ValueError as exc:
            skipped.append((rule_id, f"RE2 cannot compile its regex: {exc}"))
            continue
        allowlists = [_allowlist(path, rule_id, a) for a in raw.get("allowlists", [])]
        if "allowlist" in raw:  # the older single-table spelling
            allowlists.append(_allowlist(path, rule_id, raw["allowlist"]))
        rules.append(
            VendorRule(
                rule_id,
                regex,
                tuple(k.lower() for k in raw.get("keywords", [])),
                float(raw.get("entropy", 0.0)),
                int(raw.get("secretGroup", 0)),
                tuple(allowlists),
                _kind(rule_id),
                rule_id.startswith("generic"),
                path_condition=raw.get("path"),
            )
        )
    # the generic rule's keywords are the ordinary words credentials are called by; those and
    # keywords of three characters or fewer are in most C++ files
    common_words = {k for r in rules if r.generic for k in r.keywords}
    rules = [
        replace(r, screened=any(k in common_words or len(k) <= 3 for k in r.keywords))
        for r in rules
    ]
    keywords = sorted({k for r in rules for k in r.keywords})
    index = {k: i for i, k in enumerate(keywords)}
    by_keyword: list[list[int]] = [[] for _ in keywords]
    for i, rule in enumerate(rules):
        for k in rule.keywords:
            by_keyword[index[k]].append(i)
    options = _re2.RE2.Options()
    options.literal = True
    options.case_sensitive = False  # keywords are lowercase; gitleaks lowercases the text
    keyword_set = _re2.Set(UNANCHORED, options)
    for k in keywords:
        keyword_set.Add(k.encode())
    keyword_set.Compile()
    return RuleSet(
        tuple(rules),
        tuple(skipped),
        _allowlist(path, None, doc.get("allowlist", {})),
        tuple(keywords),
        tuple(tuple(ix) for ix in by_keyword),
        tuple(i for i, r in enumerate(rules) if not r.keywords),
        keyword_set,
        digest,
    )


@functools.cache
def default_rules() -> RuleSet:
    """The pinned rule file, loaded once per process."""
    return load_rules()


def candidate_rules(data: bytes, rules: RuleSet) -> list[VendorRule]:
    """The rules whose keywords occur in the UTF-8 text (case-insensitive), in file order:
    the prefilter that keeps a rule set of hundreds of regexes at the cost of one pass."""
    hits = rules.keyword_set.Match(data)
    chosen = set(rules.unkeyed)
    for k in hits:
        chosen.update(rules.rules_by_keyword[k])
    return [rules.rules[i] for i in sorted(chosen)]


def _secret_span(rule: VendorRule, spans: Sequence[tuple[int, int]]) -> tuple[int, int]:
    if len(spans) < 2:
        return spans[0]
    if rule.secret_group:
        return spans[rule.secret_group] if rule.secret_group < len(spans) else (-1, -1)
    for s, e in spans[1:]:
        if e > s >= 0:
            return s, e
    return spans[0]


def rule_matches(
    text: str, rule: VendorRule, rules: RuleSet, data: bytes | None = None
) -> Iterator[tuple[int, int]]:
    """Character spans of `rule`'s secrets in `text` after gitleaks' own filters (entropy,
    global and rule allowlists): what gitleaks itself would report for this rule."""
    data = text.encode() if data is None else data
    offsets = ByteOffsets(text, data)
    for spans in rule.regex.spans(data):
        m_start, m_end = spans[0]
        # gitleaks trims newlines off the match (its issue 1352)
        match = data[m_start:m_end].strip(b"\n").decode()
        s_b, e_b = _secret_span(rule, spans)
        if e_b <= s_b:
            continue
        secret = data[s_b:e_b].decode()
        if rule.entropy and shannon_entropy(secret) <= rule.entropy:
            continue
        line_start = data.rfind(b"\n", 0, m_start) + 1
        line_end = data.find(b"\n", m_end)
        line = data[line_start : len(data) if line_end < 0 else line_end].decode()
        if rules.global_allowlist.allows(secret, match, line):
            continue
        if any(a.allows(secret, match, line) for a in rule.allowlists):
            continue
        yield offsets.char(s_b), offsets.char(e_b)


# ---- adjacent literals: `"sk-ant-api03-" "Xy…"` is one token to the compiler and to a reader

# (token characters on both sides: `<< " " <<` is a literal space, not a joint)
_JOINT = re.compile(r'"[ \t]*+(?:\r?\n[ \t]*+){0,2}(?:L|u8|u|U)?"(?=[A-Za-z0-9_\-+/])')
_TOKEN_END = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-+/=.")
_LITERAL_BEFORE = re.compile(r'"((?:[^"\\\n]|\\.){0,300})\Z')
_LITERAL_AFTER = re.compile(r'(?:[^"\\\n]|\\.){0,300}(?=")')


def _joined_literals(text: str) -> Iterator[tuple[str, list[tuple[int, int]]]]:
    """Each chain of adjacent literals as (joined content, the pieces' spans in text)."""
    pos = 0
    while (joint := _JOINT.search(text, pos)) is not None:
        if not joint.start() or text[joint.start() - 1] not in _TOKEN_END:
            pos = joint.start() + 1
            continue
        before = _LITERAL_BEFORE.search(text, max(0, joint.start() - 302), joint.start())
        if before is None:
            pos = joint.end()
            continue
        pieces = [before.span(1)]
        cursor = joint
        while True:
            after = _LITERAL_AFTER.match(text, cursor.end())
            if after is None:
                break
            pieces.append(after.span())
            nxt = _JOINT.match(text, after.end())
            if nxt is None:
                break
            cursor = nxt
        pos = max(pieces[-1][1], joint.end())
        if len(pieces) > 1:
            yield "".join(text[a:b] for a, b in pieces), pieces


def _to_text(pieces: list[tuple[int, int]], start: int, end: int) -> tuple[int, int] | None:
    """A span of the joined content back in text, if it crosses a joint (else the main pass
    already saw it)."""
    bounds, at = [], 0
    for a, b in pieces:
        bounds.append((at, at + b - a, a))
        at += b - a
    first = next(i for i, (lo, hi, _) in enumerate(bounds) if lo <= start < hi)
    last = next(i for i, (lo, hi, _) in enumerate(bounds) if lo < end <= hi)
    if first == last:
        return None
    return bounds[first][2] + start - bounds[first][0], bounds[last][2] + end - bounds[last][0]


PREFIXED_TAG = "prefixed"


def screen_entries(rules: RuleSet) -> list[ScreenEntry]:
    """What the one-pass screen must look for on the rule set's behalf: every keyword, the
    probe of every screened rule, and the issuer-shaped token."""
    entries = [ScreenEntry(f"kw:{k}", k, literal=True, ignore_case=True) for k in rules.keywords]
    entries += [
        ScreenEntry(f"probe:{r.id}", probe_pattern(r.regex.pattern))
        for r in rules.rules
        if r.screened
    ]
    entries.append(ScreenEntry(PREFIXED_TAG, PREFIXED_SCREEN))
    return entries


@functools.cache
def _own_screen() -> Screen:
    return Screen(screen_entries(default_rules()))


@functools.cache
def _rules_by_tag() -> dict[str, tuple[int, ...]]:
    rules = default_rules()
    return {f"kw:{k}": rules.rules_by_keyword[i] for i, k in enumerate(rules.keywords)}


# Rules the rule engine runs (and tests hold to their examples) but the gate does not: the
# generic rule names a credential by what it is called, which credentials.py does with
# C++-aware plausibility; on 113 MB of Debian's /usr/include it replaced only identifiers
# and comment text (`__NFTA_TUNNEL_KEY_IP6_MAX`, `kApiInt32Size`, `src1Length+src2Length`)
# and added nothing on the labelled sets.
GATE_EXCLUDED_RULES: dict[str, str] = {
    "generic-api-key": "superseded by the name-bound finder (credentials.py), C++-aware",
}


@functools.lru_cache(maxsize=1 << 12)
def _screened_rules(tags: frozenset[str]) -> tuple[VendorRule, ...]:
    """The default rules a text whose screen found `tags` needs (texts share a few thousand
    tag sets at most: kept per set)."""
    rules = default_rules()
    by_tag = _rules_by_tag()
    chosen = set(rules.unkeyed)
    for tag in tags:
        chosen.update(by_tag.get(tag, ()))
    picked = [rules.rules[i] for i in sorted(chosen)]
    return tuple(
        r
        for r in picked
        if (not r.screened or f"probe:{r.id}" in tags) and r.id not in GATE_EXCLUDED_RULES
    )


@functools.cache
def _out_of_place(rules: RuleSet) -> frozenset[str]:
    """The detectors of rules written for other files than C++ (a `path` condition: `.tf`,
    kubeconfig, NuGet.config): matched in C++, their values are judged as the generic
    rule's are (`password = "changeme"` is a placeholder wherever it is)."""
    return frozenset(r.detector for r in rules.rules if r.path_condition is not None)


def _raw_hits(
    text: str,
    data: bytes,
    candidates: Sequence[VendorRule],
    prefixed: bool,
    literal: bool = False,  # `text` is a string literal's content (joined pieces)
) -> Iterator[Hit]:
    rules = default_rules()
    for rule in candidates:
        for start, end in rule_matches(text, rule, rules, data):
            priority = GENERIC_RULE_PRIORITY if rule.generic else None
            yield Hit(start, end, rule.kind, rule.detector, priority)
    if prefixed:
        for start, end in prefixed_tokens(text, data, literal):
            yield Hit(start, end, Kind.API_KEY, PREFIXED_TOKEN_DETECTOR, PREFIXED_TOKEN_PRIORITY)


def find_vendor_rule_secrets(text: str, config: ScrubConfig) -> Iterator[Hit]:
    """The finder on its own (screening the text itself); the gate calls
    find_screened_vendor_secrets with the shared screen's result."""
    yield from find_screened_vendor_secrets(text, config, _own_screen().screen(text))


def find_screened_vendor_secrets(
    text: str, config: ScrubConfig, screened: Screened
) -> Iterator[Hit]:
    """Every rule's secrets, and tokens of an issuer's shape no rule knows, in the text and
    across adjacent literals, minus the C++ look-alikes the gate keeps whoever found them
    (`#include` lines, hashes and interface ids in their context); the generic rule's
    values must also pass the same plausibility as a value bound to a credential name."""
    rules = default_rules()
    candidates = _screened_rules(screened.tags)
    prefixed = PREFIXED_TAG in screened.tags
    for hit in _raw_hits(text, screened.data, candidates, prefixed):
        start, end = hit.start, hit.end
        if end - start > 2 and text[start] in "\"'`" and text[end - 1] == text[start]:
            start, end = start + 1, end - 1  # a rule whose group takes the quotes too
        if hit.kind is Kind.PASSWORD and 0 < text.find(":", start, end) < end - 1:
            start = text.find(":", start, end) + 1  # `user:password`: the user stays
        value = text[start:end]
        if on_include_line(text, start) or is_hash_or_uuid(value, text, start, end):
            continue
        if hit.kind is Kind.PRIVATE_KEY and not has_key_material(value):
            continue  # headers only (a parser's list of them), no key between
        if (
            hit.priority == GENERIC_RULE_PRIORITY or hit.detector in _out_of_place(rules)
        ) and not plausible_secret(value, hit.kind, config):
            continue
        yield Hit(start, end, hit.kind, hit.detector, hit.priority)
    for joined, pieces in _joined_literals(text):
        data = joined.encode()
        in_literal = [r for r in candidate_rules(data, rules) if r.id not in GATE_EXCLUDED_RULES]
        for hit in _raw_hits(joined, data, in_literal, True, literal=True):
            span = _to_text(pieces, hit.start, hit.end)
            if hit.kind is Kind.PRIVATE_KEY and not has_key_material(joined[hit.start : hit.end]):
                continue
            if span is not None and not on_include_line(text, span[0]):
                yield Hit(*span, hit.kind, hit.detector, hit.priority)
