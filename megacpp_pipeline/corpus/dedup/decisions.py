"""What dedup decided, as tables: one decisions row per file (kept, or dropped as an exact or
near copy of the representative it names), the ledger rows of the dropped ones, the
clusters summary the UI shows, and the kept rows of a shard."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from megacpp_pipeline.core.ledger import LEDGER_SCHEMA, DropReason
from megacpp_pipeline.corpus import minhash
from megacpp_pipeline.corpus.dedup.config import CLUSTERS_SCHEMA, DECISIONS_SCHEMA, MEMBERS_SAMPLE


def decision_rows(
    rows: pa.Table,
    first_doc: int,
    member_doc: minhash.I64,
    member_rep: minhash.I64,
    member_exact: npt.NDArray[np.bool_],
    similarity: npt.NDArray[np.float32],
    names: Mapping[int, str],
) -> pa.Table:
    """DECISIONS_SCHEMA rows of one slice (`rows`: its source_id and path, docs from
    `first_doc`). `member_*`: the slice's files that are in a cluster (doc, representative
    doc, whether an earlier-ranked file has its exact key); `similarity`: estimated Jaccard
    of each member to its representative; `names`: "source:path" of each representative."""
    n = rows.num_rows
    doc = np.arange(first_doc, first_doc + n, dtype=np.int64)
    rep = doc.copy()
    local = member_doc - first_doc
    rep[local] = member_rep
    exact = np.zeros(n, dtype=bool)
    exact[local] = member_exact
    sim = np.full(n, np.nan, dtype=np.float32)
    sim[local] = similarity
    in_cluster = np.zeros(n, dtype=bool)
    in_cluster[local] = True
    dropped = rep != doc
    # A file identical to an earlier one is an exact duplicate even when that earlier copy
    # is itself a near duplicate; dup_of always names the file that is kept.
    reason = pa.array(
        np.where(exact, str(DropReason.EXACT_DUPLICATE), str(DropReason.NEAR_DUPLICATE)),
        pa.string(),
        mask=~dropped,
    )
    dup_of = pa.array(
        [names[r] if d else None for r, d in zip(rep.tolist(), dropped.tolist(), strict=True)],
        pa.string(),
    )
    return pa.table(
        {
            "source_id": rows["source_id"].combine_chunks().cast(pa.string()),
            "path": rows["path"].combine_chunks().cast(pa.string()),
            "doc_index": doc,
            "status": pa.array(np.where(dropped, "dropped", "kept"), pa.string()),
            "reason": reason,
            "dup_of": dup_of,
            "cluster_id": pa.array(rep, pa.int64(), mask=~in_cluster),
            "similarity": pa.array(sim, pa.float32(), mask=~dropped),
        },
        schema=DECISIONS_SCHEMA,
    )


def cluster_samples(member_doc: minhash.I64, member_rep: minhash.I64) -> minhash.I64:
    """The docs a clusters summary names: every representative, and the first
    MEMBERS_SAMPLE of each cluster's other members in doc order (its dropped copies: the
    representative is not always its first member, a vendored copy listed earlier say)."""
    copies = member_doc != member_rep
    order = np.lexsort((member_doc[copies], member_rep[copies]))
    rep, doc = member_rep[copies][order], member_doc[copies][order]
    first = np.ones(len(rep), dtype=bool)
    first[1:] = rep[1:] != rep[:-1]
    position = np.arange(len(rep)) - np.flatnonzero(first)[np.cumsum(first) - 1]
    sampled = doc[position < MEMBERS_SAMPLE]
    return np.unique(np.concatenate([sampled, member_rep]))


def clusters_table(
    member_doc: minhash.I64,
    member_rep: minhash.I64,
    member_exact: npt.NDArray[np.bool_],
    names: Mapping[int, str],
) -> pa.Table:
    """CLUSTERS_SCHEMA rows, biggest cluster first (then lowest id): size, exact and near
    copies, the representative and a sample of members, by name."""
    if len(member_doc) == 0:
        return CLUSTERS_SCHEMA.empty_table()
    order = np.lexsort((member_doc, member_rep))
    rep, doc, exact = member_rep[order], member_doc[order], member_exact[order]
    first = np.ones(len(rep), dtype=bool)
    first[1:] = rep[1:] != rep[:-1]
    starts = np.flatnonzero(first)
    ends = np.append(starts[1:], len(rep))
    rows = []
    for lo, hi in zip(starts.tolist(), ends.tolist(), strict=True):
        cluster = int(rep[lo])
        dropped = doc[lo:hi] != cluster
        n_exact = int(np.count_nonzero(exact[lo:hi] & dropped))
        rows.append(
            {
                "cluster_id": cluster,
                "size": hi - lo,
                "exact": n_exact,
                "near": int(np.count_nonzero(dropped)) - n_exact,
                "representative": names[cluster],
                "members_sample": [
                    names[int(d)] for d in doc[lo:hi][dropped][:MEMBERS_SAMPLE]
                ],  # its dropped copies, in doc order, never past its own rows
            }
        )
    rows.sort(key=lambda r: (-r["size"], r["cluster_id"]))
    return pa.Table.from_pylist(rows, schema=CLUSTERS_SCHEMA)


def markdown_top_clusters(clusters: pa.Table, exact: int, near: int, n: int = 10) -> str:
    """The n biggest clusters as a markdown table (for the asset's UI metadata)."""
    top = clusters.slice(0, n).to_pylist()
    lines = [
        f"{exact} exact and {near} near duplicates in {clusters.num_rows} clusters; "
        f"the {len(top)} biggest:",
        "",
        "| cluster | files | exact | near | kept | sample of dropped |",
        "|---:|---:|---:|---:|---|---|",
    ]
    for row in top:
        sample = "<br>".join(f"`{m}`" for m in row["members_sample"])
        more = row["size"] - 1 - len(row["members_sample"])
        if more > 0:
            sample += f"<br>… and {more} more"
        lines.append(
            f"| {row['cluster_id']} | {row['size']} | {row['exact']} | {row['near']} "
            f"| `{row['representative']}` | {sample} |"
        )
    return "\n".join(lines)


def ledger_rows(decisions: pa.Table, include_kept: bool = False) -> pa.Table:
    """Ledger rows (ledger.LEDGER_SCHEMA; the runner stamps the stage) for the dropped
    files, with dup_of, and for every file when `include_kept`. Cluster id and estimated
    similarity ride in `detail` ("cluster 12; estimated jaccard 0.91")."""
    rows = decisions
    if not include_kept:
        rows = decisions.filter(pc.equal(decisions["status"], "dropped"))
    cluster = pc.cast(rows["cluster_id"], pa.string())
    dropped_detail = pc.binary_join_element_wise(
        "cluster ",
        cluster,
        "; estimated jaccard ",
        pc.cast(pc.round(rows["similarity"], 3), pa.string()),
        "",
    )
    kept_detail = pc.binary_join_element_wise("representative of cluster ", cluster, "")
    detail = pc.if_else(pc.equal(rows["status"], "dropped"), dropped_detail, kept_detail)
    return pa.table(
        {
            "source_id": rows["source_id"],
            "path": rows["path"],
            "stage": pa.array([""] * rows.num_rows, pa.string()),
            "status": rows["status"],
            "reason": rows["reason"],
            "detail": detail,
            "dup_of": rows["dup_of"],
            "license_expression": pa.nulls(rows.num_rows, pa.string()),
            "sha256": pa.nulls(rows.num_rows, pa.string()),
        },
        schema=LEDGER_SCHEMA,
    )


def kept_rows(shard: pa.Table, decisions: pa.Table) -> pa.Table:
    """The rows of one shard that dedup keeps, in their original order."""
    kept = decisions.filter(pc.equal(decisions["status"], "kept"))
    kept_keys = pc.binary_join_element_wise(kept["source_id"], kept["path"], "\x00")
    shard_keys = pc.binary_join_element_wise(shard["source_id"], shard["path"], "\x00")
    return shard.filter(pc.is_in(shard_keys, value_set=kept_keys))
