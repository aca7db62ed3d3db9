"""raw_files: every file of a source at its pinned revision (git commit, verified archive
sha256, directory tree hash, JSONL export), each one seen in the ledger; the non-corpus
files the later stages read (REUSE metadata, the compile database) in a metadata table. The
one size policy (`max_file_bytes`) is applied here: no later stage sees a larger file."""

from __future__ import annotations

from collections import Counter
from functools import partial
from pathlib import Path

import pyarrow.compute as pc

from megacpp_pipeline import collect
from megacpp_pipeline.core import ledger
from megacpp_pipeline.core.catalog import Catalog
from megacpp_pipeline.core.ledger import LEDGER_SCHEMA, DropReason
from megacpp_pipeline.core.schemas import RAW_FILES
from megacpp_pipeline.pipeline.context import StageContext
from megacpp_pipeline.pipeline.metadata import drop_reasons_table, summary_metadata
from megacpp_pipeline.pipeline.registry import Check, CheckOutcome, Grain, Materialized, Stage
from megacpp_pipeline.snapshot import layout
from megacpp_pipeline.stages import names


def _body(ctx: StageContext, stage: Stage, source: str | None) -> Materialized:
    assert source is not None
    cat = ctx.catalog
    spec = cat.source(source)
    pinned = ctx.pins.get(source)
    if spec.track and pinned:
        # the refresh resolved the tracked branch when it launched this run: pin exactly that
        spec = spec.model_copy(update={"revision": pinned, "track": None})
    is_metadata = partial(ctx.registry.is_metadata_file, spec)
    files = collect.open_source(
        spec,
        cat.resolve_uri(spec),
        cache_dir=ctx.cache_dir,
        limits=cat.collect,
        max_file_bytes=cat.file_limit(spec),
        keep_also=is_metadata,
    )
    version = ctx.store.begin(
        stage.name, spec.id, code_version=ctx.code_version(stage), config=spec, run_id=ctx.run_id
    )
    data = version.table(layout.DATA, RAW_FILES)
    seen = version.table("ledger", LEDGER_SCHEMA)
    meta = version.table("metadata", collect.METADATA_FILES)
    stats: Counter[str] = Counter(files_seen=0, kept_files=0, dropped_files=0, kept_bytes=0)
    for batch in collect.collect_batches(spec, files, is_metadata=is_metadata):
        data.write(batch.kept)
        seen.write(ledger.stamp(batch.ledger, stage.name))
        meta.write(batch.metadata)
        stats["files_seen"] += batch.ledger.num_rows
        stats["kept_files"] += batch.kept.num_rows
        stats["dropped_files"] += batch.ledger.num_rows - batch.kept.num_rows
        stats["kept_bytes"] += int(pc.sum(batch.kept["size"]).as_py() or 0)
        for reason in batch.ledger["reason"].drop_null().to_pylist():
            stats[f"ledger:{reason}"] += 1
    manifest = version.commit(
        stats=stats,
        extra={"revision": files.revision, "kind": spec.kind, "uri": cat.resolve_uri(spec)},
    )
    ctx.log(
        f"{stage.name} [{source}]: {stats['files_seen']} files seen, {stats['kept_files']} kept"
    )
    meta_out = summary_metadata(
        ctx.store,
        manifest,
        revision=files.revision,
        files_seen=stats["files_seen"],
        kept_bytes=stats["kept_bytes"],
        drop_reasons=drop_reasons_table(stats),
    )
    return Materialized(source, meta_out, stats)


def _every_seen_file_in_ledger(ctx: StageContext, stage: Stage, source: str | None) -> CheckOutcome:
    manifest = ctx.latest(stage.name, source)
    seen = kept_in_ledger = 0
    for t in ctx.store.iter_tables(manifest, "ledger", columns=["status"]):
        seen += t.num_rows
        kept_in_ledger += int(pc.sum(pc.equal(t["status"], "kept")).as_py() or 0)
    revision = manifest.extra.get("revision")
    passed = manifest.rows == kept_in_ledger and bool(revision) and seen >= manifest.rows
    return CheckOutcome(
        passed=passed,
        metadata={"files_seen": seen, "kept": manifest.rows, "revision": str(revision)},
        description=None
        if passed
        else f"{source}: {manifest.rows} rows kept but {kept_in_ledger} kept in the ledger"
        + ("" if revision else "; no revision recorded"),
    )


STAGE = Stage(
    name=names.RAW_FILES,
    grain=Grain.PER_SOURCE,
    group="collect",
    description="Every file of the source at its pinned revision (git commit, verified archive "
    "sha256 or directory tree hash); every file seen is in the ledger.",
    reads=(names.SOURCE_CATALOG,),
    code=(collect.__name__, __name__),
    schema=RAW_FILES,
    # the one size policy is applied here, before a file is read past it
    version_data=lambda catalog: {"max_file_bytes": catalog.size_policy()},
    drop_reasons=(
        DropReason.NOT_INCLUDED,
        DropReason.UNSAFE_PATH,
        DropReason.SYMLINK,
        DropReason.POINTER_FILE,
        DropReason.ARCHIVE_LIMIT,
        DropReason.UNREADABLE,
        DropReason.TOO_LARGE,
        DropReason.MALFORMED_RECORD,
    ),
    writes_ledger=True,
    body=_body,
    checks=(
        Check(
            "every_seen_file_in_ledger",
            "Every file seen in the source has a ledger row; the kept ones are the data rows; "
            "the revision is recorded.",
            _every_seen_file_in_ledger,
        ),
    ),
    kinds=("git", "parquet"),
)


def current_revisions(catalog: Catalog, cache_dir: Path) -> dict[str, str]:
    """source id -> the revision a collection would read now (a tracked git branch
    resolves to the commit it points at; other sources to their pin or content hash)."""
    out = {}
    for spec in catalog.operational:
        files = collect.open_source(
            spec,
            catalog.resolve_uri(spec),
            cache_dir=cache_dir,
            limits=catalog.collect,
            max_file_bytes=catalog.file_limit(spec),
        )
        out[spec.id] = files.revision
    return out
