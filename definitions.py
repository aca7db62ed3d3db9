"""The one Definitions object: every gate's asset and blocking checks, the resources, the
executor sized for 2 cores, and the schedules. `workspace.yaml` loads this for `dagster dev`."""

from __future__ import annotations

import dagster as dg

from assets import (
    collect,
    dedup,
    enrich,
    license,
    normalize,
    report,
    schedules,
    scrub,
    snapshot,
    tokens,
)
from resources.pipeline import default_resources

ASSET_MODULES = [collect, normalize, license, scrub, dedup, enrich, tokens, snapshot, report]

# The order a person (or `megacpp run`) materializes the DAG in: per-source groups run once
# per partition, global groups once, each run in a process of its own (so each reports its
# own peak memory). Dagster's own backfills derive the same order.
STAGE_PLAN: list[tuple[str, list[str]]] = [
    ("global", ["source_catalog"]),
    ("per_source", ["raw_files", "normalized_files", "licensed_files", "scrubbed_files"]),
    ("global", ["deduped_files"]),
    ("per_source", ["enriched_files"]),
    ("global", ["tokenizer"]),
    ("per_source", ["tokenized_docs"]),
    ("global", ["packed_rows"]),
    ("global", ["snapshot"]),
    ("global", ["megatron_dataset"]),
    ("global", ["quality_report"]),
]

all_assets = dg.load_assets_from_modules(ASSET_MODULES)
all_checks = dg.load_asset_checks_from_modules(ASSET_MODULES)

defs = dg.Definitions(
    assets=all_assets,
    asset_checks=all_checks,
    resources=default_resources(),
    jobs=[schedules.per_source_refresh],
    schedules=[schedules.nightly_refresh],
    sensors=[schedules.nightly_cascade],
    executor=dg.multiprocess_executor.configured({"max_concurrent": 2}),
)
