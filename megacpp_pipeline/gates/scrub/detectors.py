"""The detector registry: which finders run on a text, the cheap prefilter that wakes each one
up, and which hit wins when two detectors claim the same characters (lower priority number)."""

from __future__ import annotations

import bisect
import functools
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from detect_secrets.plugins.private_key import PrivateKeyDetector

from megacpp_pipeline.gates.scrub.credentials import (
    PGPASS_TRIGGER,
    TRIGGERS,
    URL_USERINFO_TRIGGER,
    USER_COLON_TRIGGER,
    USER_PASS_FLAGS_TRIGGER,
    find_assigned_secret,
    find_flag_password,
    find_pgpass_password,
    find_url_password,
    find_user_colon_password,
)
from megacpp_pipeline.gates.scrub.hits import Finder, Hit, Kind
from megacpp_pipeline.gates.scrub.keys import (
    BASE64_PEM_TRIGGER,
    PUTTY_TRIGGER,
    find_base64_private_key,
    find_private_key,
    find_ssh_key,
)
from megacpp_pipeline.gates.scrub.personal import find_email, find_ip, find_local_path
from megacpp_pipeline.gates.scrub.plausibility import folded
from megacpp_pipeline.gates.scrub.screen import Screen, Screened, ScreenEntry
from megacpp_pipeline.gates.scrub.vendor_rules import (
    default_rules,
    find_screened_vendor_secrets,
    find_vendor_rule_secrets,
    screen_entries,
)
from megacpp_pipeline.gates.scrub.vendor_tokens import (
    DISCORD_TOKEN_TRIGGER,
    VENDOR_KEYS,
    find_discord_token,
    vendor_finder,
)

if TYPE_CHECKING:
    from megacpp_pipeline.gates.scrub.config import ScrubConfig


@dataclass(frozen=True)
class Detector:
    """A finder plus its cheap prefilter: the finder only runs on a text that contains one
    of `triggers` (lowercase, compared case-folded if `ignore_case`) or matches one of
    `trigger_regexes` (each starts with a literal, so `re` skips ahead fast).

    Rare triggers (vendor prefixes, PEM headers, secret-sounding names, structural
    `trigger_pattern`s) go into the one-pass screen (screen.py) with the vendor rules'
    keywords; `common` detectors (`@`, `://`, dotted numbers are in most C++ files) are
    checked in Python; a `screened` finder reads the screen's result itself."""

    name: str
    priority: int  # lower wins when two detectors claim overlapping text
    find: Finder
    triggers: tuple[str, ...] = ()
    ignore_case: bool = False
    trigger_regexes: tuple[re.Pattern[str], ...] = ()
    # a regex RE2 and `re` both read: the column-wise prefilter of a rare detector whose
    # wake-up is a structure, not a word (compiled for `re` into trigger_regexes)
    trigger_pattern: str = ""
    common: bool = False
    screened: Callable[[str, ScrubConfig, Screened], Iterator[Hit]] | None = None

    def triggered(self, text: str, folded: Callable[[], str]) -> bool:
        if any(r.search(text) for r in self.trigger_regexes):
            return True
        haystack = folded() if self.ignore_case else text
        return any(t in haystack for t in self.triggers)

    def screen_entries(self) -> list[ScreenEntry]:
        tag = f"det:{self.name}"
        entries = [
            ScreenEntry(tag, t, literal=True, ignore_case=self.ignore_case) for t in self.triggers
        ]
        if self.trigger_pattern:
            entries.append(ScreenEntry(tag, self.trigger_pattern))
        return entries


def _structural(name: str, priority: int, find: Finder, pattern: str) -> Detector:
    return Detector(
        name, priority, find, trigger_regexes=(re.compile(pattern),), trigger_pattern=pattern
    )


DETECTORS: tuple[Detector, ...] = (
    Detector(
        "private_key",
        0,
        find_private_key,
        # detect-secrets knows only version 2 of PuTTY's format
        triggers=(*(p.pattern for p in PrivateKeyDetector.denylist), "PRIVATE KEY", PUTTY_TRIGGER),
    ),
    Detector("base64_private_key", 0, find_base64_private_key, triggers=(BASE64_PEM_TRIGGER,)),
    Detector("ssh_key", 1, find_ssh_key, triggers=("ssh-", "ecdsa-sha2-")),
    *(
        Detector(pats[0].name, 2, vendor_finder(pats), triggers=trig, ignore_case=ic)
        for trig, ic, pats in VENDOR_KEYS
    ),
    _structural("discord_token", 2, find_discord_token, DISCORD_TOKEN_TRIGGER),
    # URLs and dotted numbers are in most C++ files; the screen's RE2 pass finds them
    # cheaper than `re` per file
    _structural("url_password", 3, find_url_password, URL_USERINFO_TRIGGER),
    # provider rules rank with the vendor tokens (2); the generic rule after the name-bound
    # finders (GENERIC_RULE_PRIORITY), whose C++-aware value spans it must not cut short
    Detector("vendor_rules", 2, find_vendor_rule_secrets, screened=find_screened_vendor_secrets),
    Detector("assigned_secret", 4, find_assigned_secret, TRIGGERS, ignore_case=True),
    _structural("pgpass_line", 4, find_pgpass_password, PGPASS_TRIGGER),
    _structural("user_password_flags", 4, find_flag_password, USER_PASS_FLAGS_TRIGGER),
    _structural("user_flag", 4, find_user_colon_password, USER_COLON_TRIGGER),
    Detector("email", 6, find_email, triggers=("@",), common=True),
    Detector(
        "local_path",
        7,
        find_local_path,
        triggers=("/home/", "/tmp/", "users/", "users\\", "documents and settings"),
        ignore_case=True,
    ),
    _structural("ip", 8, find_ip, r"\.\d{1,3}\.\d{1,3}\.\d|[23][0-9A-Fa-f]{3}:[0-9A-Fa-f]{0,4}:"),
)


@functools.cache
def screen() -> Screen:
    """Every rare detector's triggers and the vendor rule set's keywords and probes, in one
    RE2 Set (built once per process)."""
    entries = [
        e for d in DETECTORS if not d.common and d.screened is None for e in d.screen_entries()
    ]
    return Screen([*entries, *screen_entries(default_rules())])


def _placeholder_spans(text: str, config: ScrubConfig) -> list[tuple[int, int]]:
    spans = []
    for kind in Kind:
        ph = config.placeholders.for_kind(kind)
        pos = text.find(ph)
        while pos >= 0:
            spans.append((pos, pos + len(ph)))
            pos = text.find(ph, pos + 1)
    return spans


@dataclass(frozen=True)
class _Waking:
    """Which of a detector list a text's screen tags wake: the ones that always look (a
    screened finder, a common detector's own prefilter) and, by tag, the rare ones."""

    detectors: Sequence[Detector]
    always: tuple[int, ...]
    by_tag: dict[str, tuple[int, ...]]


_WAKING: dict[int, _Waking] = {}


def _woken(detectors: Sequence[Detector], tags: frozenset[str]) -> list[Detector]:
    """The detectors to run on a text whose screen found `tags`, in the list's order (which
    breaks ties between equal hits): a text's few tags, not every detector, are visited."""
    waking = _WAKING.get(id(detectors)) if isinstance(detectors, tuple) else None
    if waking is None or waking.detectors is not detectors:  # (a list may change: not kept)
        by_tag: dict[str, list[int]] = {}
        for i, det in enumerate(detectors):
            if det.screened is None and not det.common:
                by_tag.setdefault(f"det:{det.name}", []).append(i)
        waking = _Waking(
            detectors,
            tuple(i for i, d in enumerate(detectors) if d.screened is not None or d.common),
            {tag: tuple(ix) for tag, ix in by_tag.items()},
        )
        if isinstance(detectors, tuple):
            if len(_WAKING) >= 64:  # tuples made on the fly (tests, a finder of one detector)
                _WAKING.clear()
            _WAKING[id(detectors)] = waking
    woken = [i for tag in tags for i in waking.by_tag.get(tag, ())]
    if not woken:
        return [detectors[i] for i in waking.always]
    return [detectors[i] for i in sorted({*waking.always, *woken})]


def detect(
    text: str,
    config: ScrubConfig,
    detectors: Sequence[Detector],
    ignore_placeholders: bool = True,
) -> list[Hit]:
    """Non-overlapping hits sorted by position; on overlap the stronger detector wins.
    Rare detectors run where the screen saw their triggers, common ones where their own
    prefilter fires."""
    lowered: list[str] = []  # computed once, only if a case-insensitive trigger asks

    def fold() -> str:
        if not lowered:
            lowered.append(folded(text))
        return lowered[0]

    screened = screen().screen(text)
    ranked: list[tuple[int, int, int, Hit]] = []
    for det in _woken(detectors, screened.tags):
        if det.screened is not None:
            found = det.screened(text, config, screened)
        elif det.common:
            if not det.triggered(text, fold):
                continue
            found = det.find(text, config)
        else:
            found = det.find(text, config)
        for hit in found:
            if hit.end > hit.start:
                priority = det.priority if hit.priority is None else hit.priority
                ranked.append((priority, hit.start, -hit.end, hit))
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
