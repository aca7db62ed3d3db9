"""License: each file's SPDX expression from its own metadata (SPDX line, REUSE, a standard
notice), falling back to the source's declared licence; parsed, validated, decided."""

import hashlib
from collections import Counter

import dagster as dg
import pyarrow.compute as pc

from assets.partitions import SOURCES
from assets.shell import (
    CODE_VERSION,
    FileCaching,
    accounting_check,
    file_cache,
    manifest_check,
    partition_of,
    run_file_gate,
    summary_metadata,
    upstream_hashes,
)
from megacpp_pipeline.core.catalog import SourceSpec
from megacpp_pipeline.core.gate import GateResult
from megacpp_pipeline.core.schemas import LICENSED_FILES
from megacpp_pipeline.gates import license
from resources.pipeline import CatalogResource, ShardStoreResource


@dg.asset(
    partitions_def=SOURCES,
    deps=["normalized_files"],
    group_name="gates",
    kinds={"parquet"},
    owners=["team:data"],
    code_version=CODE_VERSION,
    description="File-level licence decision: SPDX-License-Identifier lines, REUSE metadata, "
    "standard notices, then the source's declared licence; expressions validated against the "
    "SPDX lists; only `allowed` files continue.",
)
def licensed_files(
    context: dg.AssetExecutionContext, catalog: CatalogResource, store: ShardStoreResource
) -> dg.MaterializeResult:
    cat = catalog.load()
    spec = cat.source(context.partition_key)
    cfg = cat.stage_config("license", license.LicenseConfig)
    st = store.open()
    upstream = st.latest("normalized_files", spec.id)
    raw = st.latest("raw_files", spec.id)
    reuse_files: dict[str, bytes] = {}
    for t in st.iter_tables(raw, "metadata"):
        for path, content in zip(t["path"].to_pylist(), t["content"].to_pylist(), strict=True):
            if license.is_reuse_metadata_path(path):
                reuse_files[path] = content
    version = st.begin(
        "licensed_files", spec.id, code_version=CODE_VERSION, config=cfg, run_id=context.run_id
    )
    stats = run_file_gate(
        st,
        version,
        st.iter_tables(upstream),
        lambda t: license.run(
            t, cfg, declared_license=spec.declared_license, reuse_files=reuse_files
        ),
        LICENSED_FILES,
        caching=FileCaching(
            file_cache(
                store, "license", license, cfg, salt=_inputs_outside_the_file(spec, reuse_files)
            ),
            "content_sha256",
        ),
        summarize=_decisions,
    )
    manifest = version.commit(upstream=upstream_hashes(st, [upstream, raw]), stats=stats)
    return dg.MaterializeResult(
        metadata=summary_metadata(
            st,
            manifest,
            **{
                k: int(v)
                for k, v in sorted(stats.items())
                if k.startswith(("decision:", "source:"))
            },
            licence_summary=dg.MetadataValue.md(license.markdown_summary(stats)),
        )
    )


def _inputs_outside_the_file(spec: SourceSpec, reuse_files: dict[str, bytes]) -> str:
    """What a file's decision depends on besides its own text: the declared licence and
    the source's REUSE metadata."""
    h = hashlib.sha256(str(spec.declared_license).encode())
    for path in sorted(reuse_files):
        h.update(path.encode() + b"\0" + hashlib.sha256(reuse_files[path]).digest())
    return h.hexdigest()[:16]


_REASON_DECISION = {
    "license_denied": "denied",
    "license_invalid": "invalid",
    "license_unknown": "unknown",
}


def _decisions(result: GateResult) -> Counter[str]:
    """Decision, source and expression counts over the whole output (cached rows too)."""
    out: Counter[str] = Counter()
    kept, dropped = result.kept, result.dropped
    out["decision:allowed"] = kept.num_rows
    out.update(f"source:{s}" for s in kept["license_source"].to_pylist())
    out.update(f"expr:{e}" for e in kept["license_expression"].to_pylist() if e)
    for reason, detail, expr in zip(
        dropped["reason"].to_pylist(),
        dropped["detail"].to_pylist(),
        dropped["license_expression"].to_pylist(),
        strict=True,
    ):
        if reason in _REASON_DECISION:
            out[f"decision:{_REASON_DECISION[reason]}"] += 1
            out[f"source:{(detail or 'none').split(':', 1)[0]}"] += 1
            if expr:
                out[f"expr:{expr}"] += 1
    return out


licensed_files_verifies = manifest_check(licensed_files, partitioned=True)
licensed_files_accounted = accounting_check(licensed_files, "normalized_files")


@dg.asset_check(
    asset=licensed_files,
    name="only_allowed_files_continue",
    blocking=True,
    partitions_def=SOURCES,
    description="Every kept file has an `allowed` decision; every invalid expression is in the "
    "ledger, not in the shards.",
)
def only_allowed_files_continue(
    context: dg.AssetCheckExecutionContext, store: ShardStoreResource
) -> dg.AssetCheckResult:
    st = store.open()
    manifest = st.latest("licensed_files", partition_of(context))
    not_allowed = 0
    for t in st.iter_tables(manifest, columns=["license_decision"]):
        not_allowed += int(pc.sum(pc.not_equal(t["license_decision"], "allowed")).as_py() or 0)
    invalid_in_ledger = 0
    for t in st.iter_tables(manifest, "ledger", columns=["reason"]):
        invalid_in_ledger += int(pc.sum(pc.equal(t["reason"], "license_invalid")).as_py() or 0)
    return dg.AssetCheckResult(
        passed=not_allowed == 0,
        metadata={
            "kept_not_allowed": not_allowed,
            "invalid_in_ledger": invalid_in_ledger,
            "kept": manifest.rows,
        },
    )
