"""Dedup's per-file work, the part a refresh caches by content: each file's exact key and
MinHash signature over C++ lexical-token shingles (minhash.py), and the rows the shuffles
carry from them: exact rows (exact key, rank) and band rows (band, band_hash, rank), each
split into partitions by hash so one task per partition sees whole groups and buckets.

A file's rank is its place in the representative rule: every file that is not vendored
ranks before every vendored one, then canonical order (catalog, then path), i.e.
rank = vendored * n_docs + doc_index. The lowest rank of a group or cluster is kept.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from megacpp_pipeline.corpus import minhash
from megacpp_pipeline.corpus.dedup.config import DedupConfig

BAND_SCHEMA = pa.schema(
    [
        pa.field("band", pa.int16(), nullable=False),
        pa.field("band_hash", pa.uint64(), nullable=False),
        pa.field("rank", pa.int64(), nullable=False),
    ]
)
EXACT_SCHEMA = pa.schema(
    [pa.field("exact_key", pa.string(), nullable=False), pa.field("rank", pa.int64(), False)]
)


def signed_schema(config: DedupConfig) -> pa.Schema:
    """One row per file: what dedup needs of its text, cached by the file's content."""
    return pa.schema(
        [
            pa.field("source_id", pa.string(), nullable=False),
            pa.field("path", pa.string(), nullable=False),
            pa.field("exact_key", pa.string(), nullable=False),
            pa.field("n_tokens", pa.int64(), nullable=False),
            pa.field("n_shingles", pa.int64(), nullable=False),
            pa.field("sig", pa.binary(config.num_perm * 8), nullable=False),
            # every shingle hash, only when candidates are verified on true Jaccard
            pa.field("shingles", pa.large_list(pa.uint64())),
        ]
    )


def _batches(texts: pa.ChunkedArray) -> list[tuple[int, int]]:
    """Row ranges of about minhash.TOKEN_BATCH_BYTES of text (at least one row each), so
    signing's working memory is bounded by that, not by the size of its input."""
    sizes = pc.binary_length(texts).to_numpy(zero_copy_only=False).astype(np.int64)
    bounds, start, acc = [], 0, 0
    for i, size in enumerate(sizes.tolist()):
        if i > start and acc + size > minhash.TOKEN_BATCH_BYTES:
            bounds.append((start, i))
            start, acc = i, 0
        acc += size
    if start < len(sizes):
        bounds.append((start, len(sizes)))
    return bounds


def sign_files(table: pa.Table, config: DedupConfig) -> pa.Table:
    """signed_schema rows for the files of `table` (SCRUBBED_FILES rows), in input order."""
    schema = signed_schema(config)
    parts = [_sign(table.slice(lo, hi - lo), config, schema) for lo, hi in _batches(table["text"])]
    return pa.concat_tables(parts) if parts else schema.empty_table()


def _sign(piece: pa.Table, config: DedupConfig, schema: pa.Schema) -> pa.Table:
    tokens = minhash.token_hashes(piece["text"].to_pylist())
    shingles = minhash.shingle_hashes(tokens, config.shingle_size)
    if config.exact_mode == "content":
        exact_key = piece["content_sha256"].combine_chunks()
    else:
        keys = minhash.token_sequence_keys(tokens)
        exact_key = pa.array([k.tobytes().hex() for k in keys], pa.string())
    if config.scheme == "affine64":
        sig = minhash.signatures(shingles, *minhash.permutations(config.num_perm, config.seed))
    else:
        sig = minhash.one_permutation_signatures(shingles, config.num_perm, config.seed)
    n_shingles = np.diff(shingles.offsets)
    # Too few shingles: an empty signature keeps the file out of the bands.
    sig[n_shingles < config.min_shingles] = minhash.EMPTY_HASH
    width = config.num_perm * 8
    sig_column = pa.FixedSizeBinaryArray.from_buffers(
        pa.binary(width), len(sig), [None, pa.py_buffer(np.ascontiguousarray(sig).tobytes())]
    )
    shingle_column = (
        pa.LargeListArray.from_arrays(
            pa.array(shingles.offsets.astype(np.int64)), pa.array(shingles.hashes, pa.uint64())
        )
        if config.verify_candidates
        else pa.nulls(piece.num_rows, pa.large_list(pa.uint64()))
    )
    return pa.table(
        [
            piece["source_id"].combine_chunks(),
            piece["path"].combine_chunks(),
            exact_key,
            pa.array(np.diff(tokens.offsets), pa.int64()),
            pa.array(n_shingles, pa.int64()),
            sig_column,
            shingle_column,
        ],
        schema=schema,
    )


def signatures(signed: pa.Table, num_perm: int) -> minhash.U64:
    """The signed rows' signatures as an array (files, num_perm), without a copy per row."""
    column = signed["sig"].combine_chunks()
    width = num_perm * 8
    data = column.buffers()[1]
    if data is None or len(column) == 0:
        return np.empty((0, num_perm), dtype=np.uint64)
    raw = np.frombuffer(
        data, dtype=np.uint8, count=len(column) * width, offset=column.offset * width
    )
    return raw.view(np.uint64).reshape(len(column), num_perm)


def band_rows(config: DedupConfig, sig: minhash.U64, rank: minhash.I64) -> pa.Table | None:
    """(band, band_hash, rank) rows of the files that have shingles, band by band."""
    live = ~np.all(sig == minhash.EMPTY_HASH, axis=1)
    if not config.near or not live.any():
        return None
    hashes = minhash.band_hashes(sig[live], config.bands, config.rows)  # (files, bands)
    n_live = hashes.shape[0]
    return pa.table(
        {
            "band": np.repeat(np.arange(config.bands, dtype=np.int16), n_live),
            "band_hash": hashes.T.reshape(-1),
            "rank": np.tile(rank[live], config.bands),
        },
        schema=BAND_SCHEMA,
    )


def exact_rows(exact_key: pa.Array | pa.ChunkedArray, rank: minhash.I64) -> pa.Table:
    return pa.table({"exact_key": exact_key, "rank": rank}, schema=EXACT_SCHEMA)


def key_partitions(keys: pa.Array | pa.ChunkedArray, partitions: int) -> minhash.I64:
    """The exact-key partition of each key (keys are hex digests: their first 15 digits)."""
    heads = pc.utf8_slice_codeunits(keys, 0, 15).to_pylist()
    return np.fromiter((int(h, 16) % partitions for h in heads), np.int64, count=len(heads))


def band_partitions(rows: pa.Table, partitions: int) -> Iterator[tuple[int, pa.Table]]:
    """The rows of each non-empty partition `band_hash % partitions`: a bucket (band,
    band_hash) lies in one partition, so partitions find their candidates independently."""
    part = np.asarray(rows["band_hash"].to_numpy() % np.uint64(partitions), dtype=np.int64)
    yield from split_partitions(rows, part, partitions)


def split_partitions(
    rows: pa.Table, part: minhash.I64, partitions: int
) -> Iterator[tuple[int, pa.Table]]:
    """`rows` cut by their partition number `part`, each partition's rows in input order."""
    order = np.argsort(part, kind="stable")
    cuts = np.searchsorted(part[order], np.arange(partitions + 1))
    for p in range(partitions):
        if cuts[p + 1] > cuts[p]:
            yield p, rows.take(pa.array(order[cuts[p] : cuts[p + 1]]))
