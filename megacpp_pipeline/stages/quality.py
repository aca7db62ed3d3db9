"""quality_files: the per-language quality rules of published code pipelines (more than one
`main`, mostly preprocessor lines, mostly print statements, no-logic lines, repeated 5-gram
text, embedded data tables, comment ratio bounds); a file that breaks one is dropped as
low_quality with the rule and its measured value."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Any

from megacpp_pipeline.core.gate import GateResult
from megacpp_pipeline.core.ledger import DropReason
from megacpp_pipeline.core.schemas import CLASSIFIED_FILES
from megacpp_pipeline.gates import quality
from megacpp_pipeline.pipeline.context import SourceInputs, StageContext
from megacpp_pipeline.pipeline.registry import Grain, Markdown, PreparedGate, Stage
from megacpp_pipeline.stages import names
from megacpp_pipeline.storage.store import Manifest


def _gate(inputs: SourceInputs) -> PreparedGate:
    config = inputs.config
    return PreparedGate(lambda table: quality.run(table, config))


def rule_counts(result: GateResult) -> Counter[str]:
    """Files dropped per rule (the detail starts with the rule's name), cached rows too."""
    return Counter(
        f"rule:{(detail or '').split(':', 1)[0]}" for detail in result.dropped["detail"].to_pylist()
    )


def _report(ctx: StageContext, manifest: Manifest, stats: Mapping[str, float]) -> dict[str, Any]:
    rows = [
        f"| {k.removeprefix('rule:')} | {int(v)} |"
        for k, v in sorted(stats.items(), key=lambda kv: -kv[1])
        if k.startswith("rule:")
    ]
    return {"rules": Markdown("\n".join(["| rule | files dropped |", "|---|---:|", *rows]))}


STAGE = Stage(
    name=names.QUALITY_FILES,
    grain=Grain.PER_SOURCE,
    group="gates",
    description="C++ quality rules (multiple main, preprocessor / print / no-logic line "
    "fractions, repeated 5-grams, data tables, comment ratio); each drop names its rule and "
    "measured value.",
    input=names.CLASSIFIED_FILES,
    config_key="quality",
    config=quality.QualityConfig,
    code=(quality.__name__, "megacpp_pipeline.gates.cpp_text", __name__),
    schema=CLASSIFIED_FILES,
    content_column="content_sha256",
    drop_reasons=(DropReason.LOW_QUALITY,),
    writes_ledger=True,
    gate=_gate,
    summarize=rule_counts,
    report=_report,
)
