"""The one shape every per-file gate has (after datatrove's uniform step shape):
a pure function over one shard's Arrow table that returns the kept rows, the dropped rows
as ledger entries with reasons, and stats. Nothing here knows about Dagster or the store.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import pyarrow as pa

from megacpp_pipeline.core.ledger import empty_ledger


@dataclass
class GateResult:
    kept: pa.Table
    dropped: pa.Table = field(default_factory=empty_ledger)  # ledger.LEDGER_SCHEMA rows
    stats: Counter[str] = field(default_factory=Counter)  # additive counters
    extra: dict[str, pa.Table] = field(default_factory=dict)  # side tables, e.g. scrub audit
    # The hex sha256 of each kept row's text, in kept order, as the gate's own pass inspected
    # it and found it clean, when that inspection is the stage's content check (scrub runs
    # its detectors over every text it keeps); None for a kept row it does not vouch for. It
    # travels to the process that commits the version, in memory, and lets the check of that
    # version in the same process skip the texts that hash the same (pipeline/checks.py,
    # note_gate_scan). Never stored or cached: a row served from the result cache has none.
    scanned_clean: list[str | None] | None = None


def merge_stats(total: Counter[str], part: Counter[str]) -> Counter[str]:
    total.update(part)
    return total
