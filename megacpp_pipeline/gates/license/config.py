"""The license gate's configuration: the policy and how far into a file's head the gate
looks for tags and notices. Every threshold of the gate lives here.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from megacpp_pipeline.gates.license.policy import LicensePolicy


class LicenseConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    policy: LicensePolicy = Field(default_factory=LicensePolicy)
    tag_scan_chars: int = Field(4096, gt=0)  # REUSE reads SPDX tags from the file's head
    recognise_notices: bool = True
    notice_scan_chars: int = Field(8192, gt=0)  # a full BSD/MIT text fits comfortably
