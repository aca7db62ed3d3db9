"""Pre-chunk dedup across all sources: decides which files are exact or near duplicates of
an earlier file, so a repeated file is judged whole, with its provenance, before chunking
(seed: "exact duplicates should be removed before chunking; near-duplicate handling is
valuable for vendored and lightly modified code").

Representative rule, for exact and near clusters alike: the member of lowest rank, where a
file that is not vendored ranks before every vendored one, then by doc_index, the position
in the canonical stream (sources in catalog order, then path). So the upstream copy of a
library wins over a project's vendored copy of it, whatever their catalog order, and among
copies of the same kind the earliest operational source's is kept.

config.py: the thresholds and tables; signing.py: the per-file work (cached by content);
grouping.py: exact groups, candidate pairs and union-find over integers; decisions.py: the
tables it writes; work.py: the map and reduce steps on any executor.
"""

from megacpp_pipeline.corpus.dedup.config import (
    CLUSTERS_SCHEMA,
    DECISIONS_SCHEMA,
    DedupConfig,
    DedupInputError,
    DedupOrderError,
    StreamOrder,
    band_partition_count,
)
from megacpp_pipeline.corpus.dedup.decisions import (
    kept_rows,
    ledger_rows,
    markdown_top_clusters,
)
from megacpp_pipeline.corpus.dedup.grouping import bucket_pairs, components, exact_edges
from megacpp_pipeline.corpus.dedup.signing import band_partitions, band_rows, sign_files
from megacpp_pipeline.corpus.dedup.work import (
    DedupOutcome,
    DedupResult,
    SliceOfSource,
    WorkArea,
    deduplicate,
    find_duplicates,
)

__all__ = [
    "CLUSTERS_SCHEMA",
    "DECISIONS_SCHEMA",
    "DedupConfig",
    "DedupInputError",
    "DedupOrderError",
    "DedupOutcome",
    "DedupResult",
    "SliceOfSource",
    "StreamOrder",
    "WorkArea",
    "band_partition_count",
    "band_partitions",
    "band_rows",
    "bucket_pairs",
    "components",
    "deduplicate",
    "exact_edges",
    "find_duplicates",
    "kept_rows",
    "ledger_rows",
    "markdown_top_clusters",
    "sign_files",
]
