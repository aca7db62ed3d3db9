"""enriched_files: tree-sitter-cpp chunk spans for every kept file (syntax lane), and a
sanitized build-context record where the source ships a compile_commands.json (build lane);
its check proves every span lies inside its text and no build context holds a local path."""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Mapping
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from megacpp_pipeline.core.gate import GateResult
from megacpp_pipeline.core.ledger import DropReason
from megacpp_pipeline.core.schemas import ENRICHED_FILES
from megacpp_pipeline.gates import build_context, enrich
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


def _gate(inputs: SourceInputs) -> PreparedGate:
    spec, config = inputs.source, inputs.config
    build, error, db_bytes = None, None, None
    if spec.compile_commands:
        found = inputs.metadata_files(lambda path: path == spec.compile_commands)
        db_bytes = found.get(spec.compile_commands)
        if db_bytes is None:
            error = f"{spec.id}: {spec.compile_commands} not found in the source"
        else:
            known = {
                p
                for t in inputs.tables(names.RAW_FILES, columns=["path"])
                for p in t["path"].to_pylist()
            }
            try:
                build = build_context.parse_compile_commands(db_bytes, known)
            except build_context.CompileDatabaseError as e:
                error = str(e)  # the build lane fails alone; the syntax lane keeps working
        if error:
            inputs.ctx.log(error)
    return PreparedGate(
        lambda table: enrich.run(table, config, build),
        salt=hashlib.sha256(db_bytes).hexdigest()[:16] if db_bytes else "",
        extra={
            "chunk_kinds": dict(enrich.CHUNK_KINDS),
            "chunk_kinds_version": enrich.CHUNK_KINDS_VERSION,
            "build_lane_error": error,
        },
    )


_KIND_NAMES = {v: k for k, v in enrich.CHUNK_KINDS.items()}


def kind_bytes(result: GateResult) -> Counter[str]:
    """Bytes under each chunk kind and files per structure source, over a gate result."""
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


def kind_coverage(stats: Mapping[str, float]) -> str:
    """Bytes and share per chunk kind, most first, as a markdown table."""
    total = sum(v for k, v in stats.items() if k.startswith("kind_bytes:")) or 1
    return "\n".join(
        ["| kind | bytes | share |", "|---|---:|---:|"]
        + [
            f"| {k.removeprefix('kind_bytes:')} | {int(v)} | {v / total:.1%} |"
            for k, v in sorted(stats.items(), key=lambda kv: -kv[1])
            if k.startswith("kind_bytes:")
        ]
    )


def _report(ctx: StageContext, manifest: Manifest, stats: Mapping[str, float]) -> dict[str, Any]:
    return {
        "kind_coverage": Markdown(kind_coverage(stats)),
        "build_files": int(stats.get("structure_source:build", 0)),
        "build_lane_error": manifest.extra.get("build_lane_error") or "none",
    }


def span_problems(table: pa.Table) -> list[str]:
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
    for path, build in zip(
        table["path"].to_pylist(), table["build_context"].to_pylist(), strict=True
    ):
        roots = (build or {}).get("include_roots") or []
        if any(root.startswith(("/", "~")) or ":\\" in root for root in roots):
            problems.append(f"{path}: an absolute path in the build context")
    return problems


def _span_problems(state: None, rows: pa.Table) -> list[str]:
    return span_problems(rows)


_SPANS = RowCheck(None, _span_problems)


SPANS_INSIDE_TEXT = "spans_inside_text_and_no_local_paths"


def _spans_inside_text(ctx: StageContext, stage: Stage, source: str | None) -> CheckOutcome:
    manifest = ctx.latest(stage.name, source)
    # the verdict is the spans' and build contexts' as much as the text's
    scan = rescan_content(
        ctx, stage, SPANS_INSIDE_TEXT, manifest, source, _SPANS, None, by_text=False
    )
    problems = scan.problems
    return CheckOutcome(
        passed=not problems,
        metadata={
            "files": scan.rows,
            "problems": "; ".join(problems[:5]) or "none",
            **scan.metadata(),
        },
        description=f"{source}: {problems[0]}" if problems else None,
    )


STAGE = Stage(
    name=names.ENRICHED_FILES,
    grain=Grain.PER_SOURCE,
    group="gates",
    description="Chunk spans (func_signature, func_body, class_decl, comment, ...) from "
    "tree-sitter-cpp; build context from compile_commands.json where it exists; "
    "structure_source records which lane produced each file's structure.",
    input=names.DECONTAMINATED_FILES,
    # the compile database is read from raw_files; declaring it also gives the UI's
    # "Materialize all" backfill a partition-to-partition path down to this asset
    reads=(names.RAW_FILES,),
    config_key="enrich",
    config=enrich.EnrichConfig,
    code=(enrich.__name__, build_context.__name__, __name__),
    schema=ENRICHED_FILES,
    content_column="content_sha256",
    drop_reasons=(DropReason.PARSE_ERROR_RATIO, DropReason.PARSE_TIMEOUT),
    writes_ledger=True,
    metadata_files=lambda spec, path: path == spec.compile_commands,
    gate=_gate,
    summarize=kind_bytes,
    report=_report,
    checks=(
        Check(
            SPANS_INSIDE_TEXT,
            "Every chunk span lies inside its file's text; no build context carries an "
            "absolute or home path (over the very version a recorded pass of this check "
            "read, its verdict stands while the version's objects hash to its manifest).",
            _spans_inside_text,
            verdicts=True,
        ),
    ),
)
