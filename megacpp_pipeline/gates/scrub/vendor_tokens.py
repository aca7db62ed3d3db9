"""Vendor tokens: API keys and tokens recognized by their issuer's format (AWS, GitHub, GitLab,
Slack, Stripe, OpenAI, npm, PyPI, JWT, Google, SendGrid, Mailchimp, Azure, Square). The
patterns are detect-secrets' plugin regexes, reused as compiled there; its scanner is far too
slow for the hot path, its regexes are not."""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from detect_secrets.plugins.aws import AWSKeyDetector
from detect_secrets.plugins.azure_storage_key import AzureStorageKeyDetector
from detect_secrets.plugins.github_token import GitHubTokenDetector
from detect_secrets.plugins.gitlab_token import GitLabTokenDetector
from detect_secrets.plugins.jwt import JwtTokenDetector
from detect_secrets.plugins.mailchimp import MailchimpDetector
from detect_secrets.plugins.npm import NpmDetector
from detect_secrets.plugins.openai import OpenAIDetector
from detect_secrets.plugins.pypi_token import PypiTokenDetector
from detect_secrets.plugins.sendgrid import SendGridDetector
from detect_secrets.plugins.slack import SlackDetector
from detect_secrets.plugins.square_oauth import SquareOAuthDetector
from detect_secrets.plugins.stripe import StripeDetector

from megacpp_pipeline.gates.scrub.hits import Finder, Hit, Kind
from megacpp_pipeline.gates.scrub.plausibility import bounded, is_hash_or_uuid, on_include_line

if TYPE_CHECKING:
    from megacpp_pipeline.gates.scrub.config import ScrubConfig


@dataclass(frozen=True)
class _VendorPattern:
    name: str
    pattern: re.Pattern[str]
    group: int = 0
    bounded: bool = True
    trim: re.Pattern[str] | None = None  # keep only this prefix of an over-greedy match
    valid: Callable[[str], bool] | None = None
    # where a match can start: the non-overlapping matches of this prefix, each run tried
    # once (searched from every position, a long run without the rest is quadratic)
    lead: re.Pattern[str] | None = None

    def finditer(self, text: str) -> Iterator[re.Match[str]]:
        if self.lead is None:
            yield from self.pattern.finditer(text)
            return
        pos = 0
        for run in self.lead.finditer(text):
            if run.start() >= pos and (m := self.pattern.match(text, run.start())) is not None:
                pos = m.end()
                yield m


_NPM_TOKEN_CHARS = re.compile(r"[A-Za-z0-9_\-]+")
# detect-secrets ends its JWT pattern lazily (`*?`), which stops before the signature.
_JWT = re.compile(JwtTokenDetector.denylist[0].pattern.replace("*?", "*"))
# its header: a run of these characters is where a JWT may start (450 KB of `eyJeyJ...`
# took 54 s searched from every `eyJ`)
_JWT_LEAD = re.compile(r"eyJ[A-Za-z0-9\-_=]*")
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
VENDOR_KEYS: tuple[tuple[tuple[str, ...], bool, tuple[_VendorPattern, ...]], ...] = (
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
    (("eyJ",), False, (_VendorPattern("jwt", _JWT, valid=_valid_jwt, lead=_JWT_LEAD),)),
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


def vendor_finder(patterns: tuple[_VendorPattern, ...]) -> Finder:
    def find(text: str, config: ScrubConfig) -> Iterator[Hit]:
        for vp in patterns:
            for m in vp.finditer(text):
                start, end = m.span(vp.group)
                if vp.trim is not None:
                    t = vp.trim.match(text, start, end)
                    if t is None:
                        continue
                    end = t.end()
                if vp.bounded and not bounded(text, start, end):
                    continue
                value = text[start:end]
                if vp.valid is not None and not vp.valid(value):
                    continue
                if on_include_line(text, start) or is_hash_or_uuid(value, text, start, end):
                    continue
                yield Hit(start, end, Kind.API_KEY, vp.name)

    return find


# A Discord bot token: the bot's snowflake id (17-20 digits) in base64url, a timestamp, an
# HMAC (`dpp::cluster bot("MTA4...")`, D++'s examples). No literal prefix to wake on, so
# the screen matches its shape's tail (the whole shape, counted runs each side, made the
# screen's automaton three to nine times slower); the id part decoding to digits tells it
# from three names joined by dots (`MainWindowControllerImpl.update.someLongFunctionName`).
DISCORD_TOKEN_TRIGGER = r"\.[A-Za-z0-9_-]{6}\.[A-Za-z0-9_-]{27}"
_DISCORD_TOKEN = re.compile(r"[MNO][A-Za-z0-9_-]{23,27}\.[A-Za-z0-9_-]{6}\.[A-Za-z0-9_-]{27,40}")


def _snowflake(part: str) -> bool:
    try:
        decoded = base64.urlsafe_b64decode(part + "=" * (-len(part) % 4))
    except (binascii.Error, ValueError):
        return False
    return 17 <= len(decoded) <= 20 and decoded.isdigit()


def find_discord_token(text: str, config: ScrubConfig) -> Iterator[Hit]:
    for m in _DISCORD_TOKEN.finditer(text):
        start, end = m.span()
        if bounded(text, start, end) and _snowflake(m.group(0).split(".", 1)[0]):
            yield Hit(start, end, Kind.API_KEY, "discord_bot_token")
