"""What a detector reports: a character span of the scanned text and the Kind of personal data
or secret it holds. The gate turns hits into placeholders and audit rows."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from megacpp_pipeline.gates.scrub.config import ScrubConfig


class Kind(StrEnum):
    EMAIL = "email"
    IP_ADDRESS = "ip_address"
    API_KEY = "api_key"
    PASSWORD = "password"
    PRIVATE_KEY = "private_key"
    SSH_KEY = "ssh_key"
    LOCAL_PATH = "local_path"


@dataclass(frozen=True)
class Hit:
    start: int  # character offsets of the replaced span
    end: int
    kind: Kind
    detector: str
    # overrides the detector's priority for this hit (a rule set whose rules rank apart)
    priority: int | None = None


# a finder reads the text and the config and reports every span it claims
Finder = Callable[[str, "ScrubConfig"], Iterator[Hit]]
