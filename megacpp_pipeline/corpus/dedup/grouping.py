"""Dedup's reduce side, over integers only: exact groups per exact-key partition, candidate
pairs per band-hash partition, and connected components over the pairs that clear the
similarity check. Every function here holds what one partition or the pair list holds,
never a row per file of the corpus; numpy and scipy, no polars (these run in forked
workers)."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from megacpp_pipeline.corpus import minhash


def exact_edges(rows: pa.Table) -> tuple[minhash.I64, minhash.I64]:
    """(member rank, group representative rank) for every file whose exact key an earlier
    ranked file shares: exact rows of one partition, (exact_key, rank)."""
    if rows.num_rows == 0:
        return np.empty(0, np.int64), np.empty(0, np.int64)
    ordered = rows.sort_by([("exact_key", "ascending"), ("rank", "ascending")])
    keys = ordered["exact_key"].combine_chunks()
    rank = ordered["rank"].to_numpy().astype(np.int64)
    first = np.ones(len(rank), dtype=bool)
    if len(rank) > 1:
        first[1:] = pc.not_equal(keys[1:], keys[:-1]).to_numpy(zero_copy_only=False)
    rep = rank[np.flatnonzero(first)][np.cumsum(first) - 1]
    members = ~first
    return rank[members], rep[members]


def in_sorted(values: minhash.I64, sorted_set: minhash.I64) -> npt.NDArray[np.bool_]:
    """Whether each value is in `sorted_set` (ascending)."""
    if len(sorted_set) == 0:
        return np.zeros(len(values), dtype=bool)
    pos = np.minimum(np.searchsorted(sorted_set, values), len(sorted_set) - 1)
    return sorted_set[pos] == values


def bucket_pairs(
    rows: pa.Table, exact_members: minhash.I64, n_docs: int
) -> tuple[minhash.I64, minhash.I64]:
    """(rank, bucket root rank) for every file in a bucket that is not the bucket's lowest
    doc_index, distinct, sorted by (doc, root doc): band rows of one partition, (band,
    band_hash, rank). Exact members follow their representative through the exact edges,
    so only representatives meet in buckets (`exact_members`: sorted ranks to leave out)."""
    band = rows["band"].to_numpy().astype(np.int64)
    band_hash = rows["band_hash"].to_numpy()
    rank = rows["rank"].to_numpy().astype(np.int64)
    keep = ~in_sorted(rank, exact_members)
    band, band_hash, rank = band[keep], band_hash[keep], rank[keep]
    if len(rank) == 0:
        return np.empty(0, np.int64), np.empty(0, np.int64)
    doc = rank % n_docs
    order = np.lexsort((doc, band_hash, band))
    band, band_hash, rank, doc = band[order], band_hash[order], rank[order], doc[order]
    first = np.ones(len(rank), dtype=bool)
    first[1:] = (band[1:] != band[:-1]) | (band_hash[1:] != band_hash[:-1])
    start = np.flatnonzero(first)[np.cumsum(first) - 1]
    members = ~first
    u, root = rank[members], rank[start[members]]
    keys = doc[members] * n_docs + doc[start[members]]
    _, pick = np.unique(keys, return_index=True)
    return u[pick], root[pick]


def pair_keys(u: minhash.I64, v: minhash.I64, n_docs: int) -> minhash.I64:
    """One int64 per pair of ranks, ordered as (doc, doc) pairs sort."""
    return (u % n_docs) * n_docs + (v % n_docs)


def components(u: minhash.I64, v: minhash.I64) -> tuple[minhash.I64, minhash.I64]:
    """Union-find over the edges (u, v) of ranks: every rank that is in an edge, ascending,
    with its component's lowest rank (its representative). Ranks in no edge are their own
    representatives and are not listed: memory follows the edges, not the corpus."""
    if len(u) == 0:
        return np.empty(0, np.int64), np.empty(0, np.int64)
    # here, not at the top: scipy costs about 0.3 CPU s to import, and every process that
    # imports the stages (a Ray worker, each job) would pay it for this one call
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components

    nodes, index = np.unique(np.concatenate([u, v]), return_inverse=True)
    m = len(nodes)
    graph = coo_matrix(
        (np.ones(len(u), dtype=np.int8), (index[: len(u)], index[len(u) :])), shape=(m, m)
    )
    _, label = connected_components(graph, directed=False)
    lowest = np.full(label.max() + 1, np.iinfo(np.int64).max, dtype=np.int64)
    np.minimum.at(lowest, label, nodes)
    return nodes, lowest[label]
