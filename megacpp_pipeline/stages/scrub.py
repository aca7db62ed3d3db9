"""scrubbed_files: emails, public IPs, keys and tokens, private keys and machine-local paths
replaced by stable placeholders before tokenization; an audit table of salted hashes (never
the values); the check re-runs every detector over the output (but over text this run's gate
already inspected, byte for byte: pipeline/checks.py, note_gate_scan)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pyarrow as pa

from megacpp_pipeline.core.ledger import DropReason
from megacpp_pipeline.core.schemas import SCRUBBED_FILES
from megacpp_pipeline.gates import scrub
from megacpp_pipeline.pipeline.checks import RowCheck, rescan_content
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
    config = inputs.config
    return PreparedGate(lambda table: scrub.run(table, config))


def _report(ctx: StageContext, manifest: Manifest, stats: Mapping[str, float]) -> dict[str, Any]:
    """Replacements per kind, and redacted lines in context (placeholders, never values)."""
    config = ctx.config(ctx.registry.get(manifest.asset))
    samples: list[str] = []
    for t in ctx.store.iter_tables(manifest, columns=["path", "text", "scrub_replacements"]):
        samples.append(scrub.markdown_sample(t, config))
        break  # one shard's worth is a sample
    kinds = {k: int(v) for k, v in sorted(stats.items()) if k.startswith("kind:")}
    return {**kinds, "redacted_sample": Markdown("\n".join(samples) or "none")}


def _residual(config: Any, rows: pa.Table) -> list[str]:
    hits = scrub.residual_table(rows, config)
    return [
        f"{p}: {k} at byte {b}"
        for p, k, b in zip(
            hits["path"].to_pylist(),
            hits["kind"].to_pylist(),
            hits["start_byte"].to_pylist(),
            strict=True,
        )
    ]


_RESCAN = RowCheck(("source_id", "path", "text"), _residual)


NO_DETECTOR_FIRES = "no_detector_fires_on_output"


def _no_detector_fires(ctx: StageContext, stage: Stage, source: str | None) -> CheckOutcome:
    manifest = ctx.latest(stage.name, source)
    scan = rescan_content(
        ctx,
        stage,
        NO_DETECTOR_FIRES,
        manifest,
        source,
        _RESCAN,
        ctx.config(stage),
        gate_scans=True,  # scrub.run's detectors are this check's, over every text it keeps
    )
    residual = scan.problems
    return CheckOutcome(
        passed=not residual,
        metadata={
            "files_rescanned": scan.rows,
            "residual_findings": len(residual),
            "first": "; ".join(residual[:5]),
            **scan.metadata(),
        },
        description=f"{source}: {residual[0]}" if residual else None,
    )


STAGE = Stage(
    name=names.SCRUBBED_FILES,
    grain=Grain.PER_SOURCE,
    group="gates",
    description="PII and secrets replaced by exact placeholders (<EMAIL>, <IP_ADDRESS>, "
    "<API_KEY>, <PASSWORD>, <PRIVATE_KEY>, <SSH_KEY>, <LOCAL_PATH>); every replacement audited "
    "by a salted hash, never the value.",
    input=names.REMOVED_FILES,
    config_key="scrub",
    config=scrub.ScrubConfig,
    code=(scrub.__name__, __name__),
    schema=SCRUBBED_FILES,
    content_column="content_sha256",
    side_tables={"audit": scrub.AUDIT_SCHEMA},
    drop_reasons=(DropReason.SCRUB_FAILED,),
    writes_ledger=True,
    gate=_gate,
    summarize=scrub.summary,
    report=_report,
    checks=(
        Check(
            NO_DETECTOR_FIRES,
            "Re-runs every detector over the scrubbed text: nothing but placeholders (a text "
            "that a recorded pass of this check inspected, byte for byte, is not inspected "
            "again, nor a shard whose texts hash to what this run's gate inspected with the "
            "same detectors in this process; every text is still read and hashed).",
            _no_detector_fires,
            verdicts=True,
        ),
    ),
)
