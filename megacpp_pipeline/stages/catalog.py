"""source_catalog: sources.yaml as validated, one row per source with its kind, uri, pin,
declared licence and role; its check proves every operational source is pinned and found."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa

from megacpp_pipeline.collect import commit_exists
from megacpp_pipeline.core.schemas import SOURCE_CATALOG
from megacpp_pipeline.pipeline.context import StageContext
from megacpp_pipeline.pipeline.metadata import summary_metadata
from megacpp_pipeline.pipeline.registry import Check, CheckOutcome, Grain, Materialized, Stage
from megacpp_pipeline.snapshot import layout
from megacpp_pipeline.stages import names


def _body(ctx: StageContext, stage: Stage, partition: str | None) -> Materialized:
    cat = ctx.catalog
    version = ctx.begin(stage, None, cat)
    rows = [
        {
            "id": s.id,
            "kind": s.kind,
            "uri": cat.resolve_uri(s),
            "pin": s.revision or s.sha256 or (f"track:{s.track}" if s.track else "content-hash"),
            "declared_license": s.declared_license,
            "role": s.role,
        }
        for s in cat.sources
    ]
    version.table(layout.DATA, SOURCE_CATALOG).write(
        pa.Table.from_pylist(rows, schema=SOURCE_CATALOG)
    )
    manifest = version.commit(extra={"snapshot": cat.snapshot, "seq_len": cat.seq_len})
    meta = summary_metadata(
        ctx.store,
        manifest,
        operational=len(cat.operational),
        catalog_only=len(cat.sources) - len(cat.operational),
    )
    return Materialized(None, meta)


def _pinned_and_resolvable(ctx: StageContext, stage: Stage, partition: str | None) -> CheckOutcome:
    cat = ctx.catalog
    problems = []
    for s in cat.operational:
        if s.kind == "git" and not (s.revision or s.track):
            problems.append(f"{s.id}: no revision")
        if s.kind == "archive" and not s.sha256:
            problems.append(f"{s.id}: no sha256")
        uri = cat.resolve_uri(s)
        if "://" not in uri and not Path(uri).exists():
            problems.append(f"{s.id}: {uri} does not exist")
        elif (
            s.kind == "git"
            and s.revision
            and "://" not in uri
            and not commit_exists(uri, s.revision)
        ):
            # a local repository: a missing pin stops the run before any source is collected
            problems.append(f"{s.id}: revision {s.revision} does not exist in {uri}")
    return CheckOutcome(
        passed=not problems,
        metadata={"operational_sources": len(cat.operational), "problems": "; ".join(problems)},
        description=problems[0] if problems else None,
    )


STAGE = Stage(
    name=names.SOURCE_CATALOG,
    grain=Grain.GLOBAL,
    group="collect",
    description="sources.yaml validated: every source with its kind, uri, pin, declared "
    "license and role (operational sources are materialized, catalog ones are metadata).",
    code=(__name__,),
    version_data=lambda cat: cat.model_dump(mode="json"),
    body=_body,
    checks=(
        Check(
            "operational_sources_pinned_and_resolvable",
            "Every operational source is pinned (git commit or tracked branch, archive sha256) "
            "and its uri exists.",
            _pinned_and_resolvable,
        ),
    ),
    kinds=("yaml",),
)
