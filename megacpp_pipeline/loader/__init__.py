"""Static-shape reader of a promoted snapshot's packed rows (DESIGN section 6, issue 8).

Decides what a trainer sees per step: a seeded row-group order, disjoint per-rank slices of
each global batch, a block of batches built ahead while the trainer is busy, and a staged
receipt per batch. Seed rule: the fixed-length row is the performance contract, and parquet
decoding alone cannot keep up, so each row group is decoded once into an uncompressed Arrow
IPC file and every batch after that is a slice of it, memory-mapped.

Where each part lives:
    packed_rows_loader.py  PackedRowsLoader: options, iteration, resume (state_dict)
    manifest.py            `_COMPLETE`, the manifest, the split's shards and their schema
    cache.py               RowGroupCache: parquet row group -> memory-mapped Arrow IPC file
    planning.py            EpochPlanner: row-group order, per-rank batches, block layout
    batches.py             BatchBuilder: the batches a layout describes, a block at a time
    prefetch.py            the thread that builds blocks ahead, the cold-cache warmer
    receipts.py            per-batch timings, kept as columns, summarized on demand
    errors.py              LoaderError and the specific errors under it
"""

from megacpp_pipeline.loader.cache import CACHE_FORMAT, RowGroupCache, default_cache_dir
from megacpp_pipeline.loader.errors import (
    LoaderConfigError,
    LoaderError,
    LoaderStateError,
    ShardChecksumError,
    ShardSchemaError,
    SnapshotIncompleteError,
    SnapshotManifestError,
)
from megacpp_pipeline.loader.manifest import (
    COMPLETE_MARKER,
    MANIFEST_NAME,
    check_packed_schema,
    file_sha256,
    read_snapshot_manifest,
    split_shards,
    verify_files_sha256,
)
from megacpp_pipeline.loader.packed_rows_loader import PackedRowsLoader
from megacpp_pipeline.loader.receipts import (
    BatchReceipt,
    ReceiptSummary,
    StageSummary,
    summarize_receipts,
)

__all__ = [
    "CACHE_FORMAT",
    "COMPLETE_MARKER",
    "MANIFEST_NAME",
    "BatchReceipt",
    "LoaderConfigError",
    "LoaderError",
    "LoaderStateError",
    "PackedRowsLoader",
    "ReceiptSummary",
    "RowGroupCache",
    "ShardChecksumError",
    "ShardSchemaError",
    "SnapshotIncompleteError",
    "SnapshotManifestError",
    "StageSummary",
    "check_packed_schema",
    "default_cache_dir",
    "file_sha256",
    "read_snapshot_manifest",
    "split_shards",
    "summarize_receipts",
    "verify_files_sha256",
]
