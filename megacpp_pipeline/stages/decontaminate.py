"""decontaminated_files: every kept file checked against an n-gram index of the pinned
`benchmarks:` (prompts, canonical solutions, tests); a file that shares a sequence with a
task is dropped (or has the match cut out, `action: excise`) with the benchmark and task ids
in its ledger row. Corpus-wide, because the index is built once; each source's rows stay
in a table of their own."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from megacpp_pipeline.core import ledger
from megacpp_pipeline.core.catalog import Catalog
from megacpp_pipeline.core.ledger import LEDGER_SCHEMA, DropReason
from megacpp_pipeline.core.schemas import DEDUPED_FILES
from megacpp_pipeline.corpus import decontaminate
from megacpp_pipeline.pipeline.context import StageContext
from megacpp_pipeline.pipeline.registry import (
    Check,
    CheckOutcome,
    Grain,
    Markdown,
    Materialized,
    Stage,
)
from megacpp_pipeline.pipeline.runner import drop_reasons_table, summary_metadata


def benchmark_index(
    catalog: Catalog, config: decontaminate.DecontaminateConfig
) -> decontaminate.BenchmarkIndex:
    tasks = [
        t
        for spec in catalog.benchmarks
        for t in decontaminate.load_benchmark(spec, catalog.base_dir)
    ]
    return decontaminate.BenchmarkIndex.build(tasks, config)


def _body(ctx: StageContext, stage: Stage, partition: str | None) -> Materialized:
    assert stage.input is not None
    config = ctx.config(stage)
    index = benchmark_index(ctx.catalog, config)
    upstream = ctx.latest(stage.input)
    version = ctx.store.begin(
        stage.name, None, code_version=ctx.code_version(stage), config=config, run_id=ctx.run_id
    )
    stats: Counter[str] = Counter(input_files=0, kept_files=0, dropped_files=0)
    drops = version.table("ledger", LEDGER_SCHEMA)
    matches = version.table("matches", decontaminate.MATCHES_SCHEMA)
    all_matches: list[pa.Table] = []
    for source in ctx.sources():
        out = version.table(f"data:{source}", DEDUPED_FILES)
        for t in ctx.store.iter_tables(upstream, ctx.input_table(stage, source)):
            result = decontaminate.run(t, index, config)
            out.write(result.kept)
            drops.write(ledger.stamp(result.dropped, stage.name))
            matches.write(result.extra["matches"])
            all_matches.append(result.extra["matches"])
            stats.update(result.stats)
            stats["input_files"] += t.num_rows
            stats["input_bytes"] += int(pc.sum(pc.binary_length(t["text"])).as_py() or 0)
            stats["kept_files"] += result.kept.num_rows
            stats["dropped_files"] += result.dropped.num_rows
    stats[f"ledger:{DropReason.BENCHMARK_CONTAMINATION}"] = stats["dropped_files"]
    manifest = version.commit(
        upstream=ctx.upstream_hashes([upstream]),
        stats=stats,
        extra={
            "benchmarks": [b.id for b in ctx.catalog.benchmarks],
            "index": index.fingerprint,
            "index_stats": dict(index.stats),
        },
    )
    found = (
        pa.concat_tables(all_matches) if all_matches else decontaminate.MATCHES_SCHEMA.empty_table()
    )
    return Materialized(
        None,
        summary_metadata(
            ctx.store,
            manifest,
            input_files=stats["input_files"],
            benchmarks=len(ctx.catalog.benchmarks),
            drop_reasons=drop_reasons_table(stats),
            per_benchmark=Markdown(
                decontaminate.markdown_table(found, index)
                if ctx.catalog.benchmarks
                else "no benchmarks in the catalog"
            ),
        ),
        stats,
    )


def _kept_files_rescan_clean(
    ctx: StageContext, stage: Stage, partition: str | None
) -> CheckOutcome:
    manifest = ctx.store.latest(stage.name, None)
    index = benchmark_index(ctx.catalog, ctx.config(stage))
    findings: list[Any] = []
    for name in manifest.data_tables():
        for t in ctx.store.iter_tables(manifest, name, ["source_id", "path", "text"]):
            findings += decontaminate.rescan(t, index)
    files_in = int(manifest.stats["input_files"])
    dropped = manifest.tables["ledger"].rows if "ledger" in manifest.tables else 0
    accounted = files_in == manifest.rows + dropped
    return CheckOutcome(
        passed=not findings and accounted,
        metadata={
            "files_rescanned": manifest.rows,
            "still_contaminated": len(findings),
            "accounted": accounted,
        },
        description=str(findings[0])
        if findings
        else None
        if accounted
        else f"{files_in} files in, {manifest.rows} kept + {dropped} in the ledger",
    )


STAGE = Stage(
    name="decontaminated_files",
    grain=Grain.GLOBAL,
    group="gates",
    description="Files that share an n-gram (C++ tokens, comments ignored) with a pinned "
    "benchmark task dropped or excised; the ledger names the benchmark and task ids.",
    input="deduped_files",
    config_key="decontaminate",
    config=decontaminate.DecontaminateConfig,
    code=(decontaminate.__name__, __name__),
    version_data=lambda catalog: [b.model_dump(mode="json") for b in catalog.benchmarks],
    schema=DEDUPED_FILES,
    drop_reasons=(DropReason.BENCHMARK_CONTAMINATION,),
    writes_ledger=True,
    body=_body,
    checks=(
        Check(
            "kept_files_rescan_clean",
            "The kept files, scanned against the benchmark index again, share no sequence "
            "with any task; every input file is kept or in the ledger.",
            _kept_files_rescan_clean,
        ),
    ),
)
