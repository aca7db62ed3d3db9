"""megatron_dataset: the Megatron MMIDIDX .bin/.idx export of the promoted snapshot, one
sequence per document, for trainers that read Megatron indexed datasets; its check reads it
back with the project's own reader."""

from __future__ import annotations

from typing import Any

from megacpp_pipeline.pipeline.context import StageContext
from megacpp_pipeline.pipeline.registry import (
    Check,
    CheckOutcome,
    Grain,
    Materialized,
    PathValue,
    Stage,
)
from megacpp_pipeline.snapshot import megatron
from megacpp_pipeline.snapshot.promote import read_manifest
from megacpp_pipeline.stages import names
from megacpp_pipeline.stages.snapshot import (
    megatron_dir,
    snapshot_dir_of,
    upload_beside_snapshot,
)


def _body(ctx: StageContext, stage: Stage, partition: str | None) -> Materialized:
    snap = snapshot_dir_of(ctx)
    manifest = read_manifest(snap)
    out = megatron_dir(ctx, manifest.snapshot_id)
    host = ctx.host_executor()  # the export is a folder of this host
    # the promotion check's export of this very snapshot, when it is there; made here else
    exported = megatron.export_once(snap, out, host.map)
    meta: dict[str, Any] = {"snapshot_id": manifest.snapshot_id, "exported_here": exported}
    for split, entry in manifest.splits.items():
        if entry.rows:
            meta[f"{split}_prefix"] = PathValue(str(out / split))
    # on an object store, the export goes beside the snapshot: <data dir>/megatron/<id>/
    if uri := upload_beside_snapshot(ctx, out, "megatron", manifest.snapshot_id):
        meta["export_uri"] = uri
    return Materialized(None, meta)


def _matches_snapshot(ctx: StageContext, stage: Stage, partition: str | None) -> CheckOutcome:
    snap = snapshot_dir_of(ctx)
    manifest = read_manifest(snap)
    out = megatron_dir(ctx, manifest.snapshot_id)
    problems: list[str] = []
    meta: dict[str, Any] = {}
    for split, entry in manifest.splits.items():
        if not entry.rows:
            continue
        reader = megatron.IndexedDatasetReader(out / split)
        # the reader proved at open that the .bin holds exactly the lengths' total
        docs, tokens = len(reader), reader.total_tokens
        meta[f"{split}_documents"], meta[f"{split}_tokens"] = docs, tokens
        # one sequence per copy of a document in the rows (source weights)
        want = entry.sequences if entry.sequences is not None else entry.documents
        if (docs, tokens) != (want, entry.tokens):
            problems.append(f"{split}: {docs} sequences/{tokens} tokens vs {want}/{entry.tokens}")
    return CheckOutcome(
        passed=not problems,
        metadata={**meta, "problems": "; ".join(problems)},
        description=problems[0] if problems else None,
    )


STAGE = Stage(
    name=names.MEGATRON_DATASET,
    grain=Grain.GLOBAL,
    group="snapshot",
    description="Megatron MMIDIDX .bin/.idx export of the promoted snapshot, one sequence "
    "per document, for trainers that read Megatron indexed datasets.",
    input=names.SNAPSHOT,
    code=(megatron.__name__, __name__),
    body=_body,
    checks=(
        Check(
            "document_count_and_tokens_match_snapshot",
            "The project's own reader sees exactly the snapshot's sequences (every copy of "
            "every document in the rows) and tokens.",
            _matches_snapshot,
        ),
    ),
    manifest_check=False,
    kinds=("numpy",),
    owners=("team:training",),
)
