"""removed_files: drops what `removals:` in sources.yaml names (a source, a path glob in it,
the sha256 of a collected file, or the entries of a request file) right after the licence
gate, so nothing removed is ever scrubbed, enriched or tokenized; each drop names the entry.
The `removed` side table (hashes and a near-dup signature, never text) feeds the promotion
check that no removed content reached the snapshot."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pyarrow as pa

from megacpp_pipeline.core.catalog import Catalog, RemovalSpec
from megacpp_pipeline.core.ledger import DropReason
from megacpp_pipeline.core.schemas import LICENSED_FILES
from megacpp_pipeline.gates import removals
from megacpp_pipeline.pipeline.checks import RowCheck, rescan_content
from megacpp_pipeline.pipeline.context import SourceInputs, StageContext
from megacpp_pipeline.pipeline.registry import Check, CheckOutcome, Grain, PreparedGate, Stage
from megacpp_pipeline.stages import names
from megacpp_pipeline.storage.store import Manifest, config_hash


@functools.lru_cache(maxsize=4)
def _loaded(
    specs: tuple[RemovalSpec, ...],
    base_dir: Path,
    sources: frozenset[str],
    contents: tuple[bytes | None, ...],
) -> list[removals.Removal]:
    return removals.load_removals(list(specs), base_dir, known_sources=sources)


def _request_bytes(spec: RemovalSpec, base_dir: Path) -> bytes | None:
    """A request file's bytes (None for an inline entry or a file that cannot be read:
    load_removals names it)."""
    if spec.file is None:
        return None
    path = Path(spec.file).expanduser()
    try:
        return (path if path.is_absolute() else base_dir / path).read_bytes()
    except OSError:
        return None


def loaded_removals(catalog: Catalog) -> list[removals.Removal]:
    """The catalog's entries with request files expanded: expanded again when a request
    file's bytes changed, else taken from the last expansion (a long-lived process sees
    every edit)."""
    specs = tuple(catalog.removals)
    contents = tuple(_request_bytes(s, catalog.base_dir) for s in specs)
    return _loaded(specs, catalog.base_dir, frozenset(s.id for s in catalog.sources), contents)


def _near_config(ctx: StageContext) -> Any:
    return ctx.config(names.DEDUPED_FILES)


def _gate(inputs: SourceInputs) -> PreparedGate:
    entries = loaded_removals(inputs.catalog)
    source = inputs.source.id
    near = _near_config(inputs.ctx)
    return PreparedGate(
        lambda table: removals.run(table, entries, source, near),
        salt=removals.fingerprint(entries, source) + config_hash(near),
        # with no request naming the source the gate keeps every row untouched: cheaper
        # than keying, writing and proving a cache entry for each
        cached=any(r.applies_to(source) for r in entries),
    )


def _report(ctx: StageContext, manifest: Manifest, stats: Mapping[str, float]) -> dict[str, Any]:
    return {k.replace(":", "_"): int(v) for k, v in stats.items() if k.startswith("removed_by:")}


def _still_matching(state: tuple[Any, str, Any], rows: pa.Table) -> list[str]:
    entries, source, near = state
    again = removals.run(rows, entries, source, near)
    return [
        f"{p}: {d}"
        for p, d in zip(
            again.dropped["path"].to_pylist(), again.dropped["detail"].to_pylist(), strict=True
        )
    ]


# the kept rows through the removal entries again, a task per slice
_AGAIN = RowCheck(None, _still_matching)
NOTHING_REMOVED_CONTINUES = "nothing_removed_continues"


def _nothing_removed_continues(ctx: StageContext, stage: Stage, source: str | None) -> CheckOutcome:
    """The kept output, run through the removal entries again, loses nothing."""
    assert source is not None
    manifest = ctx.latest(stage.name, source)
    entries, near = loaded_removals(ctx.catalog), _near_config(ctx)
    scan = rescan_content(
        ctx,
        stage,
        NOTHING_REMOVED_CONTINUES,
        manifest,
        source,
        _AGAIN,
        (entries, source, near),
        by_text=False,  # an entry names paths and sources as well as content
        # the entries as expanded from their request files, which the code version names
        # by path only
        material=removals.fingerprint(entries, source) + config_hash(near),
    )
    left = scan.problems
    return CheckOutcome(
        passed=not left,
        metadata={
            "kept": manifest.rows,
            "still_matching": len(left),
            "first": "; ".join(left[:5]),
            **scan.metadata(),
        },
        description=f"{source}: {left[0]}" if left else None,
    )


def removed_table(ctx: StageContext) -> pa.Table:
    """Every source's removed files (hashes and signatures), for the promotion check."""
    parts = [
        t
        for s in ctx.sources()
        for t in ctx.store.iter_tables(ctx.latest(STAGE.name, s), "removed")
    ]
    return pa.concat_tables(parts) if parts else removals.REMOVED_FILES_SCHEMA.empty_table()


STAGE = Stage(
    name=names.REMOVED_FILES,
    grain=Grain.PER_SOURCE,
    group="gates",
    description="Files named by `removals:` (a source, a path glob, a collected file's sha256, "
    "a request file) dropped before scrub; each ledger row names the entry that matched.",
    input=names.LICENSED_FILES,
    config_reads=(names.DEDUPED_FILES,),
    code=(removals.__name__, __name__),
    version_data=lambda catalog: [r.model_dump(mode="json") for r in catalog.removals],
    schema=LICENSED_FILES,
    content_column="content_sha256",
    side_tables={"removed": removals.REMOVED_FILES_SCHEMA},
    drop_reasons=(DropReason.REMOVED_ON_REQUEST,),
    writes_ledger=True,
    gate=_gate,
    summarize=removals.summary,
    report=_report,
    checks=(
        Check(
            NOTHING_REMOVED_CONTINUES,
            "Run through the removal entries again, the kept files lose none: every file "
            "an entry names is in the ledger, not in the shards (over the very version a "
            "recorded pass of this check read, with the same entries, its verdict stands "
            "while the version's objects hash to its manifest).",
            _nothing_removed_continues,
            verdicts=True,
        ),
    ),
)
