"""What the UI shows of a stage's version: the standard summary every asset reports (rows,
shards, bytes, drops, the manifest's path) and, for a per-file stage, its drops by reason
and whatever its registry entry adds."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from megacpp_pipeline.pipeline.context import StageContext
from megacpp_pipeline.pipeline.registry import Markdown, PathValue, Stage
from megacpp_pipeline.storage.store import Manifest, ShardStore


def summary_metadata(store: ShardStore, manifest: Manifest, **extra: Any) -> dict[str, Any]:
    data = [s for name in manifest.data_tables() for s in manifest.tables[name].shards]
    meta: dict[str, Any] = {
        "rows": manifest.rows,
        "shards": len(data),
        "bytes": sum(s.bytes for s in data),
        "dropped_files": int(manifest.stats.get("dropped_files", 0)),
        "manifest": PathValue(store.manifest_path(manifest)),
        "version": manifest.version,
    }
    meta.update(extra)
    return meta


def drop_reasons_table(stats: Mapping[str, float]) -> Markdown:
    """The stage's drops by reason, most first, as a markdown table."""
    rows = sorted(
        ((k.removeprefix("ledger:"), int(v)) for k, v in stats.items() if k.startswith("ledger:")),
        key=lambda kv: (-kv[1], kv[0]),
    )
    if not rows:
        return Markdown("no file dropped")
    return Markdown(
        "\n".join(["| reason | files |", "|---|---:|", *(f"| {r} | {n} |" for r, n in rows)])
    )


def file_stage_metadata(
    ctx: StageContext, manifest: Manifest, stage: Stage, stats: Mapping[str, float]
) -> dict[str, Any]:
    extra: dict[str, Any] = {
        "input_files": int(stats["input_files"]),
        "cached_files": int(stats["cached_files"]),
        "drop_reasons": drop_reasons_table(stats),
    }
    if stage.report is not None:
        extra.update(stage.report(ctx, manifest, stats))
    return summary_metadata(ctx.store, manifest, **extra)
