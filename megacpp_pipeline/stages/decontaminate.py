"""decontaminated_files: every kept file checked against an n-gram index of the pinned
`benchmarks:` (prompts, canonical solutions, tests); a file that shares a sequence with a
task is dropped (or has the match cut out, `action: excise`) with the benchmark and task ids
in its ledger row. A corpus-wide gate: the index is built once and every slice of every
source is checked against it in its own task (cached per file like any gate, the index's
fingerprint in the key); each source's rows stay in a table of their own."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping
from functools import partial
from typing import Any

import pyarrow as pa

from megacpp_pipeline.core.catalog import Catalog
from megacpp_pipeline.core.gate import GateResult
from megacpp_pipeline.core.ledger import DropReason
from megacpp_pipeline.core.schemas import DEDUPED_FILES
from megacpp_pipeline.corpus import decontaminate
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

_INDEXES: dict[str, decontaminate.BenchmarkIndex] = {}  # per process, by what builds it


def benchmark_index(
    catalog: Catalog, config: decontaminate.DecontaminateConfig
) -> decontaminate.BenchmarkIndex:
    """The n-gram index of the catalog's pinned benchmarks, built once per process for a
    given catalog and config (every source's gate, and the check, share it)."""
    key = json.dumps(
        [
            str(catalog.base_dir),
            [b.model_dump(mode="json") for b in catalog.benchmarks],
            config.model_dump(mode="json"),
        ],
        sort_keys=True,
    )
    if key not in _INDEXES:
        tasks = [
            t
            for spec in catalog.benchmarks
            for t in decontaminate.load_benchmark(spec, catalog.base_dir)
        ]
        _INDEXES.clear()
        _INDEXES[key] = decontaminate.BenchmarkIndex.build(tasks, config)
    return _INDEXES[key]


def _gate(inputs: SourceInputs) -> PreparedGate:
    config = inputs.config
    index = benchmark_index(inputs.catalog, config)
    return PreparedGate(
        partial(decontaminate.run, index=index, config=config),
        salt=index.fingerprint,
        extra={
            "benchmarks": [b.id for b in inputs.catalog.benchmarks],
            "index": index.fingerprint,
            "index_stats": dict(index.stats),
        },
    )


def _summarize(result: GateResult) -> Counter[str]:
    """The per-benchmark counters over a whole output, cached files included: one per
    (file, benchmark) match, as the gate counts them."""
    out: Counter[str] = Counter()
    matches = result.extra.get("matches")
    if matches is None:
        return out
    excised: dict[tuple[str, str], int] = {}
    for row in matches.to_pylist():
        out[f"benchmark:{row['benchmark_id']}:files_{row['action']}"] += 1
        if row["action"] == "excised":
            excised[(row["source_id"], row["path"])] = int(row["excised_bytes"] or 0)
    out["excised_files"] = len(excised)
    out["excised_bytes"] = sum(excised.values())
    return out


def _report(ctx: StageContext, manifest: Manifest, stats: Mapping[str, float]) -> dict[str, Any]:
    config = ctx.config(ctx.registry.get(manifest.asset))
    found = (
        ctx.store.read_table(manifest, "matches")
        if manifest.tables.get("matches") is not None and manifest.tables["matches"].rows
        else decontaminate.MATCHES_SCHEMA.empty_table()
    )
    return {
        "benchmarks": len(ctx.catalog.benchmarks),
        "per_benchmark": Markdown(
            decontaminate.markdown_table(found, benchmark_index(ctx.catalog, config))
            if ctx.catalog.benchmarks
            else "no benchmarks in the catalog"
        ),
    }


def _contaminated(index: decontaminate.BenchmarkIndex, rows: pa.Table) -> list[str]:
    return [str(f) for f in decontaminate.rescan(rows, index)]


_RESCAN = RowCheck(("source_id", "path", "text"), _contaminated)
RESCAN_CLEAN = "kept_files_rescan_clean"


def _kept_files_rescan_clean(
    ctx: StageContext, stage: Stage, partition: str | None
) -> CheckOutcome:
    manifest = ctx.latest(stage.name, None)
    index = benchmark_index(ctx.catalog, ctx.config(stage))
    scan = rescan_content(
        ctx,
        stage,
        RESCAN_CLEAN,
        manifest,
        None,
        _RESCAN,
        index,
        gate_scans=True,  # the gate's index match over every text it keeps unexcised
    )
    rescanned, findings = scan.rows, scan.problems
    files_in = int(manifest.stats["input_files"])
    dropped = manifest.tables["ledger"].rows if "ledger" in manifest.tables else 0
    accounted = files_in == manifest.rows + dropped
    return CheckOutcome(
        passed=not findings and accounted,
        metadata={
            "files_rescanned": rescanned,
            "still_contaminated": len(findings),
            "accounted": accounted,
            **scan.metadata(),
        },
        description=findings[0]
        if findings
        else None
        if accounted
        else f"{files_in} files in, {manifest.rows} kept + {dropped} in the ledger",
    )


STAGE = Stage(
    name=names.DECONTAMINATED_FILES,
    grain=Grain.GLOBAL,
    group="gates",
    description="Files that share an n-gram (C++ tokens, comments ignored) with a pinned "
    "benchmark task dropped or excised; the ledger names the benchmark and task ids.",
    input=names.DEDUPED_FILES,
    config_key="decontaminate",
    config=decontaminate.DecontaminateConfig,
    code=(decontaminate.__name__, __name__),
    version_data=lambda catalog: [b.model_dump(mode="json") for b in catalog.benchmarks],
    schema=DEDUPED_FILES,
    content_column="text",
    side_tables={"matches": decontaminate.MATCHES_SCHEMA},
    drop_reasons=(DropReason.BENCHMARK_CONTAMINATION,),
    writes_ledger=True,
    gate=_gate,
    summarize=_summarize,
    report=_report,
    checks=(
        Check(
            RESCAN_CLEAN,
            "The kept files, scanned against the benchmark index again, share no sequence "
            "with any task (a text that a recorded pass of this check inspected, byte for "
            "byte, is not inspected again, nor an unexcised text this run's gate matched in "
            "this process); every input file is kept or in the ledger.",
            _kept_files_rescan_clean,
            verdicts=True,
        ),
    ),
)
