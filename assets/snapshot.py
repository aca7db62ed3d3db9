"""Snapshot: promotion. The packed rows, tokenizer, documents, pieces and the ledger of every
stage become one snapshot directory, promoted only when all seven checks pass; each check
also runs as its own blocking asset check with its metrics, so the UI's check history is a
time series per gate."""

from pathlib import Path

import dagster as dg

from assets.shell import CODE_VERSION, upstream_hashes
from megacpp_pipeline.snapshot import verify
from megacpp_pipeline.snapshot.promote import (
    SnapshotConfig,
    SnapshotParts,
    build_snapshot,
    read_manifest,
)
from megacpp_pipeline.storage.store import ShardStore, config_hash
from resources.pipeline import CatalogResource, ShardStoreResource

LEDGER_STAGES = [
    "raw_files",
    "normalized_files",
    "licensed_files",
    "scrubbed_files",
    "enriched_files",
    "tokenized_docs",
]


def _ledger_tables(st: ShardStore, sources: list[str]):  # type: ignore[no-untyped-def]
    for stage in LEDGER_STAGES:
        for source in sources:
            yield from st.iter_tables(st.latest(stage, source), "ledger")
        if stage == "scrubbed_files":
            yield from st.iter_tables(st.latest("deduped_files", None), "ledger")


def snapshot_dir_of(st: ShardStore) -> Path:
    return Path(st.latest("snapshot", None).extra["snapshot_dir"])


@dg.asset(
    deps=["packed_rows", "tokenizer"],
    group_name="snapshot",
    kinds={"parquet"},
    owners=["team:data"],
    code_version=CODE_VERSION,
    description="The promoted training snapshot: manifest.json, tokenizer.json, documents, "
    "pieces, ledger, train/ and validation/ packed rows, _COMPLETE last. Built beside its "
    "final place and renamed in only when schema, token range, document consistency, "
    "round-trip, ledger, loader and Megatron checks all pass.",
)
def snapshot(
    context: dg.AssetExecutionContext, catalog: CatalogResource, store: ShardStoreResource
) -> dg.MaterializeResult:
    cat = catalog.load()
    cfg = cat.stage_config("snapshot", SnapshotConfig)
    st = store.open()
    packed = st.latest("packed_rows", None)
    tok = st.latest("tokenizer", None)
    sources = [s.id for s in cat.operational]
    vdir = st.version_dir(packed)
    info = tok.extra["tokenizer"]
    parts = SnapshotParts(
        name=cat.snapshot,
        seq_len=int(packed.extra["seq_len"]),
        vocab_size=int(info["vocab_size"]),
        tokenizer_json=st.read_bytes(f"{st.version_dir(tok)}/tokenizer.json"),
        tokenizer_info=info,
        rows={
            split: [Path(st.local_path(f"{vdir}/{s.path}")) for s in packed.tables[name].shards]
            for split in ("train", "validation")
            if (name := f"data:{split}") in packed.tables
        },
        documents=st.read_table(packed, "documents"),
        pieces=st.iter_tables(packed, "pieces"),
        ledger=_ledger_tables(st, sources),
        inputs=upstream_hashes(st, [packed, tok]),
        code_version=CODE_VERSION,
        config_hash=config_hash(cat),
    )

    def gate(build_dir: Path) -> list[str]:
        failures = []
        for name in verify.ALL_CHECKS:
            outcome = verify.run_check(name, build_dir, cfg)
            context.log.info(f"promotion check {name}: {'pass' if outcome.passed else 'FAIL'}")
            if not outcome.passed:
                failures.append(f"{name}: {outcome.problems[0]}")
        return failures

    root = Path(st.local_path(st.root))
    snap = build_snapshot(root, parts, keep=cfg.keep_snapshots, gate=gate)
    manifest = read_manifest(snap)
    version = st.begin(
        "snapshot", None, code_version=CODE_VERSION, config=cfg, run_id=context.run_id
    )
    version.commit(
        upstream=parts.inputs,
        extra={"snapshot_dir": str(snap), "snapshot_id": manifest.snapshot_id},
    )
    return dg.MaterializeResult(
        metadata={
            "snapshot_dir": dg.MetadataValue.path(str(snap)),
            "snapshot_id": manifest.snapshot_id,
            "documents": manifest.documents,
            "dagster/row_count": sum(s.rows for s in manifest.splits.values()),
            **{f"{k}_rows": v.rows for k, v in manifest.splits.items()},
            **{f"{k}_tokens": v.tokens for k, v in manifest.splits.items()},
        }
    )


def _promotion_check(name: str, description: str) -> dg.AssetChecksDefinition:
    @dg.asset_check(asset=snapshot, name=name, blocking=True, description=description)
    def _check(catalog: CatalogResource, store: ShardStoreResource) -> dg.AssetCheckResult:
        cfg = catalog.load().stage_config("snapshot", SnapshotConfig)
        outcome = verify.run_check(name, snapshot_dir_of(store.open()), cfg)
        return dg.AssetCheckResult(
            passed=outcome.passed,
            metadata={
                **{k: v for k, v in outcome.metrics.items() if isinstance(v, (int, float, str))},
                "problems": dg.MetadataValue.md(
                    "\n".join(f"- {p}" for p in outcome.problems) or "none"
                ),
            },
            description=outcome.problems[0] if outcome.problems else None,
        )

    return _check


_DESCRIPTIONS = {
    "file_checksums": "Every file of the snapshot has the sha256 and size its manifest lists.",
    "schema_contract": "The seven required packed-row columns with their exact Arrow types and "
    "length seq_len; optional columns known to the schema version.",
    "token_range_and_pads": "Every id in [0, vocab_size); pads only after valid_token_count.",
    "document_consistency": "doc_ids match documents.parquet and pieces.parquet; every "
    "document's pieces are present, in order.",
    "round_trip_decode": "Documents rebuilt from their pieces decode to exactly the scrubbed text.",
    "ledger_completeness": "Per source: collected == kept + dropped; kept == documents.",
    "consumer_smoke_read": "The static-shape loader reads batches from each split.",
    "megatron_read_back": "The .bin/.idx export read back by an independent reader has the "
    "snapshot's document count and tokens.",
}

snapshot_checks = [_promotion_check(name, _DESCRIPTIONS[name]) for name in verify.ALL_CHECKS]


@dg.asset(
    deps=[snapshot],
    group_name="snapshot",
    kinds={"numpy"},
    owners=["team:training"],
    code_version=CODE_VERSION,
    description="Megatron MMIDIDX .bin/.idx export of the promoted snapshot, one sequence "
    "per document, for trainers that read Megatron indexed datasets.",
)
def megatron_dataset(store: ShardStoreResource) -> dg.MaterializeResult:
    from megacpp_pipeline.snapshot import megatron

    st = store.open()
    snap = snapshot_dir_of(st)
    manifest = read_manifest(snap)
    out = Path(st.local_path(st.root)) / "megatron" / manifest.snapshot_id
    out.mkdir(parents=True, exist_ok=True)
    meta: dict[str, object] = {"snapshot_id": manifest.snapshot_id}
    for split, entry in manifest.splits.items():
        if entry.rows:
            megatron.export_snapshot(snap, out / split, split=split)
            meta[f"{split}_prefix"] = dg.MetadataValue.path(str(out / split))
    return dg.MaterializeResult(metadata=meta)  # type: ignore[arg-type]


@dg.asset_check(
    asset=megatron_dataset,
    name="document_count_and_tokens_match_snapshot",
    blocking=True,
    description="The project's own reader sees exactly the snapshot's documents and tokens.",
)
def megatron_matches_snapshot(store: ShardStoreResource) -> dg.AssetCheckResult:
    from megacpp_pipeline.snapshot import megatron

    st = store.open()
    snap = snapshot_dir_of(st)
    manifest = read_manifest(snap)
    out = Path(st.local_path(st.root)) / "megatron" / manifest.snapshot_id
    problems, meta = [], {}
    for split, entry in manifest.splits.items():
        if not entry.rows:
            continue
        reader = megatron.IndexedDatasetReader(out / split)
        docs = len(reader)
        tokens = int(sum(len(reader[i]) for i in range(docs)))
        meta[f"{split}_documents"], meta[f"{split}_tokens"] = docs, tokens
        if (docs, tokens) != (entry.documents, entry.tokens):
            problems.append(
                f"{split}: {docs} docs/{tokens} tokens vs {entry.documents}/{entry.tokens}"
            )
    return dg.AssetCheckResult(
        passed=not problems, metadata={**meta, "problems": "; ".join(problems)}
    )
