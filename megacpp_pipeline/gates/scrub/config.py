"""The scrub gate's config: the placeholder each kind becomes, and every threshold and
keep-list the detectors read; nothing else in the package is tunable. A placeholder that
would itself trip a detector is refused here, before any work starts."""

from __future__ import annotations

import ipaddress

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from megacpp_pipeline.gates.scrub.detectors import DETECTORS, detect
from megacpp_pipeline.gates.scrub.hits import Kind

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
    # names no person has: placeholders, and the accounts of CI runners, cloud images,
    # boards and containers (`/home/runner/work/...`, `/home/ubuntu`, `/home/pi`)
    generic_users: tuple[str, ...] = (
        *("user", "username", "yourname", "your_name", "me", "foo"),
        *("runner", "runneradmin", "ubuntu", "pi", "node", "linuxbrew", "vagrant", "ec2-user"),
        *("travis", "appveyor", "circleci", "jenkins", "builder", "buildbot", "vscode"),
        *("codespace", "gitpod", "docker", "admin", "administrator", "root", "git", "www-data"),
    )
    min_password_length: int = Field(default=6, ge=1)
    min_key_length: int = Field(default=12, ge=1)
    min_key_entropy: float = Field(default=3.0, ge=0.0)  # bits per character
    # a value with no credential name to vouch for it (a positional argument, `password X`
    # in prose, a weak name like `kModelHubKey`) must look random on its own: this long,
    # this many of lower / upper / digit / symbol, and (keys) this entropy, never all hex
    min_random_password_length: int = Field(default=8, ge=1)
    min_random_password_classes: int = Field(default=3, ge=1, le=4)
    min_random_key_length: int = Field(default=16, ge=1)
    min_random_key_entropy: float = Field(default=3.5, ge=0.0)
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
            hits = detect(value, self, DETECTORS, ignore_placeholders=False)
            if hits:
                raise ValueError(
                    f"placeholders.{kind.value}: {value!r} itself looks like a {hits[0].kind}"
                )
        return self
