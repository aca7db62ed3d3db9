"""Enrich: tree-sitter-cpp chunk spans for every kept file (syntax lane), and a sanitized
build-context record where the source ships a compile_commands.json (build lane)."""

import hashlib
from collections import Counter

import dagster as dg
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from assets.partitions import SOURCES
from assets.shell import (
    CODE_VERSION,
    FileCaching,
    accounting_check_from,
    file_cache,
    manifest_check,
    partition_of,
    run_file_gate,
    summary_metadata,
    upstream_hashes,
)
from megacpp_pipeline.core.gate import GateResult
from megacpp_pipeline.core.schemas import ENRICHED_FILES
from megacpp_pipeline.gates import build_context, enrich
from resources.pipeline import CatalogResource, ShardStoreResource


@dg.asset(
    partitions_def=SOURCES,
    # raw_files is read too (the source's compile_commands.json); declaring it also gives the
    # UI's "Materialize all" backfill a partition-to-partition path down to this asset.
    deps=["deduped_files", "raw_files"],
    group_name="gates",
    kinds={"parquet"},
    owners=["team:data"],
    code_version=CODE_VERSION,
    description="Chunk spans (func_signature, func_body, class_decl, comment, ...) from "
    "tree-sitter-cpp; build context from compile_commands.json where it exists; "
    "structure_source records which lane produced each file's structure.",
)
def enriched_files(
    context: dg.AssetExecutionContext, catalog: CatalogResource, store: ShardStoreResource
) -> dg.MaterializeResult:
    cat = catalog.load()
    spec = cat.source(context.partition_key)
    cfg = cat.stage_config("enrich", enrich.EnrichConfig)
    st = store.open()
    deduped = st.latest("deduped_files", None)
    raw = st.latest("raw_files", spec.id)
    build, build_error = None, None
    db_bytes: bytes | None = None
    if spec.compile_commands:
        for t in st.iter_tables(raw, "metadata"):
            for path, content in zip(t["path"].to_pylist(), t["content"].to_pylist(), strict=True):
                if path == spec.compile_commands:
                    db_bytes = content
        known = {p for t in st.iter_tables(raw, columns=["path"]) for p in t["path"].to_pylist()}
        if db_bytes is None:
            build_error = f"{spec.id}: {spec.compile_commands} not found in the source"
        else:
            try:
                build = build_context.parse_compile_commands(db_bytes, known)
            except build_context.CompileDatabaseError as e:
                build_error = str(e)  # the build lane fails alone; syntax keeps working
        if build_error:
            context.log.warning(build_error)
    version = st.begin(
        "enriched_files", spec.id, code_version=CODE_VERSION, config=cfg, run_id=context.run_id
    )
    stats = run_file_gate(
        st,
        version,
        st.iter_tables(deduped, f"data:{spec.id}"),
        lambda t: enrich.run(t, cfg, build),
        ENRICHED_FILES,
        caching=FileCaching(
            file_cache(store, "enrich", enrich, cfg, salt=_build_salt(db_bytes)), "content_sha256"
        ),
        summarize=_kind_bytes,
    )
    manifest = version.commit(
        upstream=upstream_hashes(st, [deduped, raw]),
        stats=stats,
        extra={
            "chunk_kinds": dict(enrich.CHUNK_KINDS),
            "chunk_kinds_version": enrich.CHUNK_KINDS_VERSION,
            "build_lane_error": build_error,
        },
    )
    total = sum(v for k, v in stats.items() if k.startswith("kind_bytes:")) or 1
    coverage = "\n".join(
        ["| kind | bytes | share |", "|---|---:|---:|"]
        + [
            f"| {k.removeprefix('kind_bytes:')} | {int(v)} | {v / total:.1%} |"
            for k, v in sorted(stats.items(), key=lambda kv: -kv[1])
            if k.startswith("kind_bytes:")
        ]
    )
    return dg.MaterializeResult(
        metadata=summary_metadata(
            st,
            manifest,
            kind_coverage=dg.MetadataValue.md(coverage),
            build_files=int(stats.get("structure_source:build", 0)),
            build_lane_error=build_error or "none",
        )
    )


def _build_salt(db_bytes: bytes | None) -> str:
    return hashlib.sha256(db_bytes).hexdigest()[:16] if db_bytes else ""


_KIND_NAMES = {v: k for k, v in enrich.CHUNK_KINDS.items()}


def _kind_bytes(result: GateResult) -> Counter[str]:
    """Bytes under each chunk kind and files per structure source, over the whole output."""
    kept = result.kept
    out: Counter[str] = Counter()
    if kept.num_rows:
        kinds = pc.list_flatten(kept["chunk_kinds"]).to_numpy(zero_copy_only=False)
        sizes = pc.subtract(
            pc.list_flatten(kept["chunk_ends"]), pc.list_flatten(kept["chunk_starts"])
        ).to_numpy(zero_copy_only=False)
        for kind, nbytes in enumerate(np.bincount(kinds, weights=sizes)):
            if nbytes:
                out[f"kind_bytes:{_KIND_NAMES.get(kind, kind)}"] = int(nbytes)
    out.update(f"structure_source:{s}" for s in kept["structure_source"].to_pylist())
    return out


enriched_files_verifies = manifest_check(enriched_files, partitioned=True)
enriched_files_accounted = accounting_check_from(enriched_files, "deduped_files", table="data:{p}")


@dg.asset_check(
    asset=enriched_files,
    name="spans_inside_text_and_no_local_paths",
    blocking=True,
    partitions_def=SOURCES,
    description="Every chunk span lies inside its file's text; no build context carries an "
    "absolute or home path.",
)
def spans_inside_text(
    context: dg.AssetCheckExecutionContext, store: ShardStoreResource
) -> dg.AssetCheckResult:
    st = store.open()
    manifest = st.latest("enriched_files", partition_of(context))
    problems: list[str] = []
    for t in st.iter_tables(manifest):
        problems.extend(_span_problems(t))
    return dg.AssetCheckResult(
        passed=not problems,
        metadata={"files": manifest.rows, "problems": "; ".join(problems[:5]) or "none"},
    )


def _span_problems(table: pa.Table) -> list[str]:
    """Spans outside [0, len(text bytes)], ends before starts, or a local path in the build
    context; each problem names the file."""
    problems: list[str] = []
    text_bytes = pc.binary_length(pc.cast(table["text"], pa.binary())).to_numpy()
    starts = table["chunk_starts"].combine_chunks()
    ends = table["chunk_ends"].combine_chunks()
    offsets = starts.offsets.to_numpy()
    flat_s = starts.values.to_numpy()
    flat_e = ends.values.to_numpy()
    limit = np.repeat(text_bytes, np.diff(offsets))
    bad = (flat_s < 0) | (flat_e > limit) | (flat_e < flat_s)
    if bad.any():
        rows = np.unique(np.searchsorted(offsets, np.flatnonzero(bad), side="right") - 1)
        paths = table["path"].to_pylist()
        problems.extend(f"{paths[r]}: a chunk span lies outside the text" for r in rows[:10])
    for path, ctx in zip(
        table["path"].to_pylist(), table["build_context"].to_pylist(), strict=True
    ):
        if ctx and any(
            root.startswith(("/", "~")) or ":\\" in root for root in ctx.get("include_roots") or []
        ):
            problems.append(f"{path}: an absolute path in the build context")
    return problems
