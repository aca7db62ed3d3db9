"""Test-only fault injection: a CrashPlan SIGKILLs the converter the nth time it passes one
named commit step, so tests can prove resume at each exact crash point. Only the CLI builds
one (from MEGACPP_JSONL_CRASH_AT); a library caller of `convert` passes none.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Mapping
from dataclasses import dataclass

CRASH_ENV = "MEGACPP_JSONL_CRASH_AT"  # "after_promote:2": die the 2nd time past that step

# The converter's commit steps, in the order one shard passes them (the manifest's last).
CRASH_POINTS = ("after_shard_tmp", "after_promote", "after_state", "before_complete")


class CrashPlanError(ValueError):
    """MEGACPP_JSONL_CRASH_AT names no commit step, or its count is not a number."""


@dataclass
class CrashPlan:
    point: str  # one of CRASH_POINTS
    remaining: int  # passes of `point` still to go; the one that brings it to 0 is killed

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> CrashPlan | None:
        """The plan MEGACPP_JSONL_CRASH_AT asks for, or None when it is unset or empty."""
        spec = environ.get(CRASH_ENV)
        if not spec:
            return None
        point, _, nth = spec.partition(":")
        if point not in CRASH_POINTS:
            raise CrashPlanError(
                f"{CRASH_ENV}={spec!r}: {point!r} is not one of {', '.join(CRASH_POINTS)}"
            )
        try:
            count = int(nth or "1")
        except ValueError:
            raise CrashPlanError(f"{CRASH_ENV}={spec!r}: {nth!r} is not a count") from None
        return cls(point, count)

    def passed(self, point: str) -> None:
        """Called by the converter at each commit step; kills the process on the nth pass."""
        if point != self.point:
            return
        self.remaining -= 1
        if self.remaining <= 0:
            os.kill(os.getpid(), signal.SIGKILL)
