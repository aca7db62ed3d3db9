"""licensed_files: each file's SPDX expression from its own metadata (SPDX line, REUSE, a
standard notice), else the source's declared licence; parsed, validated, decided by the
policy; only allowed files continue."""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Mapping
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from megacpp_pipeline.collect.source import RECORD_LICENSE_PREFIX, is_record_license_path
from megacpp_pipeline.core.gate import GateResult
from megacpp_pipeline.core.ledger import DropReason
from megacpp_pipeline.core.schemas import LICENSED_FILES
from megacpp_pipeline.gates import license
from megacpp_pipeline.gates.license.spdx import SPDX_DATA
from megacpp_pipeline.pipeline.checks import RowCheck, inspect_rows
from megacpp_pipeline.pipeline.context import SourceInputs, StageContext
from megacpp_pipeline.pipeline.registry import (
    Check,
    CheckOutcome,
    Grain,
    Markdown,
    PreparedGate,
    Stage,
)
from megacpp_pipeline.stages import names
from megacpp_pipeline.storage.store import Manifest


def _gate(inputs: SourceInputs) -> PreparedGate:
    config, spec = inputs.config, inputs.source
    reuse_files = inputs.metadata_files(license.is_reuse_metadata_path)
    records = {
        path.removeprefix(RECORD_LICENSE_PREFIX): declared.decode("utf-8")
        for path, declared in inputs.metadata_files(is_record_license_path).items()
    }
    return PreparedGate(
        lambda table: license.run(
            table,
            config,
            declared_license=spec.declared_license,
            reuse_files=reuse_files,
            record_licenses=records,
        ),
        salt=inputs_outside_the_file(spec.declared_license, reuse_files, records),
        # without REUSE metadata the gate reads a file's leading comment and decides its few
        # distinct expressions once: a row costs it no more than a cache hit does (0.66 CPU
        # s for the demo 16x's 62,832 files, 0.63-0.68 from a warm cache, 1.20 writing one);
        # REUSE's resolution, per covered file, is what the cache is worth keeping for
        cached=bool(reuse_files),
    )


def inputs_outside_the_file(
    declared_license: str | None,
    reuse_files: Mapping[str, bytes],
    record_licenses: Mapping[str, str] | None = None,
) -> str:
    """What a file's decision depends on besides its own text: the declared licence, the
    source's REUSE metadata and the licences its records declare (a JSONL export's)."""
    h = hashlib.sha256(str(declared_license).encode())
    for path in sorted(reuse_files):
        h.update(path.encode() + b"\0" + hashlib.sha256(reuse_files[path]).digest())
    for path in sorted(record_licenses or {}):
        h.update(b"\1" + path.encode() + b"\0" + (record_licenses or {})[path].encode())
    return h.hexdigest()[:16]


_REASON_DECISION = {
    DropReason.LICENSE_DENIED: "denied",
    DropReason.LICENSE_INVALID: "invalid",
    DropReason.LICENSE_UNKNOWN: "unknown",
}


def decision_counts(result: GateResult) -> Counter[str]:
    """Decision, licence-source and expression counts of one gate result (kept and
    dropped files alike), as `decision:`, `source:` and `expr:` counters."""
    out: Counter[str] = Counter()
    kept, dropped = result.kept, result.dropped
    out["decision:allowed"] = kept.num_rows
    out.update(f"source:{s}" for s in kept["license_source"].to_pylist())
    out.update(f"expr:{e}" for e in kept["license_expression"].to_pylist() if e)
    for reason, detail, expr in zip(
        dropped["reason"].to_pylist(),
        dropped["detail"].to_pylist(),
        dropped["license_expression"].to_pylist(),
        strict=True,
    ):
        if reason in _REASON_DECISION:
            out[f"decision:{_REASON_DECISION[reason]}"] += 1
            out[f"source:{(detail or 'none').split(':', 1)[0]}"] += 1
            if expr:
                out[f"expr:{expr}"] += 1
    return out


def _report(ctx: StageContext, manifest: Manifest, stats: Mapping[str, float]) -> dict[str, Any]:
    counts = {k: int(v) for k, v in sorted(stats.items()) if k.startswith(("decision:", "source:"))}
    summary = license.markdown_summary({k: int(v) for k, v in stats.items()})
    return {**counts, "licence_summary": Markdown(summary)}


def _not_allowed(config: Any, rows: pa.Table) -> list[str]:
    keep = pc.not_equal(rows["license_decision"], "allowed").to_numpy(zero_copy_only=False)
    bad = rows.filter(keep)
    return [
        f"{p}: {d}"
        for p, d in zip(bad["path"].to_pylist(), bad["license_decision"].to_pylist(), strict=True)
    ]


# a rescan of the kept rows, a task per slice (the driver reads no shard of the version)
_ALLOWED = RowCheck(("path", "license_decision"), _not_allowed)


def _only_allowed(ctx: StageContext, stage: Stage, source: str | None) -> CheckOutcome:
    manifest = ctx.latest(stage.name, source)
    _, not_allowed = inspect_rows(ctx, manifest, _ALLOWED, None)
    invalid_in_ledger = 0
    for t in ctx.store.iter_tables(manifest, "ledger", columns=["reason"]):
        invalid_in_ledger += int(pc.sum(pc.equal(t["reason"], "license_invalid")).as_py() or 0)
    return CheckOutcome(
        passed=not not_allowed,
        metadata={
            "kept_not_allowed": len(not_allowed),
            "invalid_in_ledger": invalid_in_ledger,
            "kept": manifest.rows,
        },
        description=f"{source}: {not_allowed[0]}" if not_allowed else None,
    )


STAGE = Stage(
    name=names.LICENSED_FILES,
    grain=Grain.PER_SOURCE,
    group="gates",
    description="File-level licence decision: SPDX-License-Identifier lines, REUSE metadata, "
    "standard notices, then the source's declared licence; expressions validated against the "
    "SPDX lists; only `allowed` files continue.",
    input=names.QUALITY_FILES,
    reads=(names.RAW_FILES,),
    config_key="license",
    config=license.LicenseConfig,
    # the SPDX lists the gate validates ids against are data beside it, not in its package
    code=(license.__name__, SPDX_DATA, __name__),
    schema=LICENSED_FILES,
    content_column="content_sha256",
    drop_reasons=tuple(_REASON_DECISION),
    writes_ledger=True,
    metadata_files=lambda spec, path: license.is_reuse_metadata_path(path),
    gate=_gate,
    summarize=decision_counts,
    report=_report,
    checks=(
        Check(
            "only_allowed_files_continue",
            "Every kept file has an `allowed` decision; every invalid expression is in the "
            "ledger, not in the shards.",
            _only_allowed,
        ),
    ),
)
