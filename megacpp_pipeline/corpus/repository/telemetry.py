"""What repository documents change, measured the same way in both modes: how long documents
are (a log2 histogram and quantiles) and how many packed rows hold one document end to end.

"Holds one document end to end" is read strictly: every valid token of the row belongs to one
document, and that document is not cut (its BOS and EOS are both in the row). A looser figure
sits beside it: rows where one uncut document fills at least half of the row.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np
import pyarrow as pa
from pydantic import BaseModel, ConfigDict, computed_field

from megacpp_pipeline.corpus.packing import PackedBatch

# Lower bounds of the length buckets: 0, then powers of two from 2**4 to 2**20; the last
# bucket is open-ended.
LENGTH_BUCKETS: tuple[int, ...] = (0, *(1 << k for k in range(4, 21)))


class LengthDistribution(BaseModel):
    model_config = ConfigDict(extra="forbid")

    documents: int
    tokens: int
    mean: float
    p50: int
    p90: int
    p99: int
    max: int
    bucket_lower: list[int]  # a document of n tokens counts in the last bucket with lower <= n
    counts: list[int]
    token_counts: list[int]  # tokens of the documents in each bucket


def length_counts(
    num_tokens: Sequence[int] | np.ndarray | pa.Array | pa.ChunkedArray,
) -> dict[int, int]:
    """How many documents have each length: what a slice's task returns, and what sums
    over slices to the corpus's exact distribution (bounded by the longest document, not
    by the number of documents)."""
    if isinstance(num_tokens, pa.Array | pa.ChunkedArray):
        n = num_tokens.to_numpy(zero_copy_only=False).astype(np.int64)
    else:
        n = np.asarray(num_tokens, dtype=np.int64)
    values, counts = np.unique(n, return_counts=True)
    return dict(zip(values.tolist(), counts.tolist(), strict=True))


def length_distribution(
    num_tokens: Sequence[int] | np.ndarray | pa.Array | pa.ChunkedArray,
) -> LengthDistribution:
    """Documents' lengths (their own tokens, as documents.num_tokens counts them)."""
    return distribution_of_counts(length_counts(num_tokens))


def distribution_of_counts(counts: dict[int, int]) -> LengthDistribution:
    """The distribution of documents whose lengths occur as often as `counts` says; the
    quantiles are exact (numpy's "lower" method over every document)."""
    values = np.array(sorted(counts), dtype=np.int64)
    freq = np.array([counts[v] for v in values.tolist()], dtype=np.int64)
    total = int(freq.sum())
    lower = np.array(LENGTH_BUCKETS, dtype=np.int64)
    bucket = np.searchsorted(lower, values, side="right") - 1
    bucket_counts = np.bincount(bucket, weights=freq, minlength=lower.size).astype(np.int64)
    tokens = np.bincount(bucket, weights=freq * values, minlength=lower.size)
    q = [0, 0, 0]
    if total:
        cum = np.cumsum(freq)
        ranks = np.floor(np.array([0.5, 0.9, 0.99]) * (total - 1)).astype(np.int64)
        q = values[np.searchsorted(cum, ranks, side="right")].tolist()
    return LengthDistribution(
        documents=total,
        tokens=int((freq * values).sum()),
        mean=float((freq * values).sum() / total) if total else 0.0,
        p50=int(q[0]),
        p90=int(q[1]),
        p99=int(q[2]),
        max=int(values[-1]) if total else 0,
        bucket_lower=lower.tolist(),
        counts=[int(c) for c in bucket_counts],
        token_counts=[int(t) for t in tokens],
    )


class WholeDocumentRows(BaseModel):
    """Counts over packed rows (one split, or all); shares are derived. A document's pieces
    all come from one packing window, so counts of separate batches add up (merge)."""

    model_config = ConfigDict(extra="forbid")

    rows: int = 0
    valid_tokens: int = 0
    seq_len: int = 0
    one_whole_document: int = 0  # rows whose tokens are one uncut document, nothing else
    half_whole_document: int = 0  # rows where one uncut document fills >= half the row
    whole_document_tokens: int = 0  # tokens of uncut documents (BOS and EOS included)

    def merge(self, other: WholeDocumentRows) -> WholeDocumentRows:
        if self.rows and other.rows and self.seq_len != other.seq_len:
            raise ValueError("row figures of different seq_len do not add up")
        return WholeDocumentRows(
            rows=self.rows + other.rows,
            valid_tokens=self.valid_tokens + other.valid_tokens,
            seq_len=self.seq_len or other.seq_len,
            one_whole_document=self.one_whole_document + other.one_whole_document,
            half_whole_document=self.half_whole_document + other.half_whole_document,
            whole_document_tokens=self.whole_document_tokens + other.whole_document_tokens,
        )

    @computed_field  # type: ignore[prop-decorator]
    @property
    def one_whole_document_share(self) -> float:
        return self.one_whole_document / self.rows if self.rows else 0.0

    @computed_field  # type: ignore[prop-decorator]
    @property
    def half_whole_document_share(self) -> float:
        return self.half_whole_document / self.rows if self.rows else 0.0

    @computed_field  # type: ignore[prop-decorator]
    @property
    def utilization(self) -> float:
        return self.valid_tokens / (self.rows * self.seq_len) if self.rows else 0.0


def whole_document_rows(batches: Iterable[PackedBatch], seq_len: int) -> WholeDocumentRows:
    """The row figures of any packing output (file or repository mode alike): read from each
    batch's rows and pieces tables, nothing else."""
    doc_parts: list[np.ndarray] = []
    row_parts: list[np.ndarray] = []
    len_parts: list[np.ndarray] = []
    row_ids: list[np.ndarray] = []
    valid: list[np.ndarray] = []
    for batch in batches:
        pieces = batch.pieces
        doc_parts.append(pieces.column("doc_id").to_numpy().astype(np.int64))
        row_parts.append(pieces.column("pack_id").to_numpy().astype(np.int64))
        len_parts.append(pieces.column("length").to_numpy().astype(np.int64))
        row_ids.append(batch.rows.column("pack_id").to_numpy().astype(np.int64))
        valid.append(batch.rows.column("valid_token_count").to_numpy().astype(np.int64))
    if not row_ids:
        return WholeDocumentRows(seq_len=seq_len)
    doc = np.concatenate(doc_parts)
    row = np.concatenate(row_parts)
    length = np.concatenate(len_parts)
    rows = np.concatenate(row_ids)
    valid_tokens = np.concatenate(valid)
    # A document is uncut when it is a single piece (validation and train documents never
    # share ids, so a doc id alone names a document).
    _, doc_index, doc_pieces = np.unique(doc, return_inverse=True, return_counts=True)
    whole = doc_pieces[doc_index] == 1
    row_index = np.searchsorted(np.sort(rows), row)
    order_valid = valid_tokens[np.argsort(rows)]
    pieces_in_row = np.bincount(row_index, minlength=rows.size)
    longest_whole = np.zeros(rows.size, dtype=np.int64)
    np.maximum.at(longest_whole, row_index[whole], length[whole])
    one = (pieces_in_row == 1) & (longest_whole == order_valid) & (order_valid > 0)
    half = 2 * longest_whole >= seq_len
    return WholeDocumentRows(
        rows=int(rows.size),
        valid_tokens=int(valid_tokens.sum()),
        seq_len=seq_len,
        one_whole_document=int(one.sum()),
        half_whole_document=int(half.sum()),
        whole_document_tokens=int(length[whole].sum()),
    )
