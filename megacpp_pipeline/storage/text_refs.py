"""Text written once (issue 29): a per-file gate that keeps a file's text as it found it
(language, quality, licence, removals, scrub on a file with nothing to redact, the gates
after dedup) does not write that text again. Its shard leaves the row's `text` null and
puts in `TEXT_AT` the row's place among the shards that hold the text, which its manifest
entry lists (`ShardInfo.text_from`, always shards that hold those rows' text themselves, so
a read is one hop). `ShardStore.read_shard` puts the text back, read and verified from
those shards, so no reader sees the difference.

Whether a kept row's text is its input row's: the same `content_sha256` and the same
length in bytes. The schema's rule that `content_sha256` is always the sha256 of `text`
makes that exact; comparing the bytes would cost a copy of every text per gate, which is
what this saves."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from megacpp_pipeline.storage.versions import TEXT, TEXT_AT, TextHolder

KEY = "path"  # a kept row is matched to its input row by this, then checked by its text's hash
CONTENT_HASH = "content_sha256"


@dataclass(frozen=True)
class TextPlaces:
    """Where the text of each row of a table read from the store is held: `at[i]` is row
    i's place among `holders` (their rows one after another), -1 where no stored shard holds
    it (the table has no text, or was not read from a version)."""

    holders: tuple[TextHolder, ...]
    at: np.ndarray  # int64, one per row

    @classmethod
    def nowhere(cls, rows: int) -> TextPlaces:
        return cls((), np.full(rows, -1, dtype=np.int64))

    @classmethod
    def rows_of(cls, holder: TextHolder, lo: int, hi: int) -> TextPlaces:
        """Rows [lo, hi) of a shard that holds their text itself."""
        return cls((holder,), np.arange(lo, hi, dtype=np.int64))

    def slice(self, offset: int, length: int) -> TextPlaces:
        return TextPlaces(self.holders, self.at[offset : offset + length])

    def starts(self) -> np.ndarray:
        return np.cumsum([0, *(h.rows for h in self.holders)], dtype=np.int64)


def concat(parts: Sequence[TextPlaces]) -> TextPlaces:
    """The places of tables read one after another, over one list of holders."""
    if len(parts) == 1:
        return parts[0]
    holders: list[TextHolder] = []
    index: dict[tuple[str, str], int] = {}
    for part in parts:
        for h in part.holders:
            index.setdefault((h.dir, h.path), len(holders))
            if len(holders) == index[(h.dir, h.path)]:
                holders.append(h)
    bases = np.cumsum([0, *(h.rows for h in holders)], dtype=np.int64)
    out = []
    for part in parts:
        at = part.at.copy()
        placed = at >= 0
        if placed.any():
            starts = part.starts()
            k = np.searchsorted(starts, at[placed], side="right") - 1
            moved = np.array([bases[index[(h.dir, h.path)]] for h in part.holders], np.int64)
            at[placed] = moved[k] + (at[placed] - starts[k])
        out.append(at)
    return TextPlaces(tuple(holders), np.concatenate(out) if out else np.empty(0, np.int64))


def compact(holders: Sequence[TextHolder], at: np.ndarray) -> tuple[list[TextHolder], np.ndarray]:
    """Only the holders some row of `at` is in, and `at` over them (-1 stays -1)."""
    placed = at >= 0
    if not placed.any():
        return [], at
    starts = np.cumsum([0, *(h.rows for h in holders)], dtype=np.int64)
    k = np.searchsorted(starts, at[placed], side="right") - 1
    used = np.unique(k)
    kept = [holders[i] for i in used]
    bases = np.cumsum([0, *(h.rows for h in kept)], dtype=np.int64)
    new_k = np.searchsorted(used, k)
    out = at.copy()
    out[placed] = bases[new_k] + (at[placed] - starts[k])
    return kept, out


def held_bytes(holders: Sequence[TextHolder], at: np.ndarray) -> int:
    """The holders' parquet bytes that the rows placed by `at` take, each holder's bytes
    shared evenly among its rows (what a reader of their text reads besides the shard)."""
    placed = at[at >= 0]
    if not len(placed):
        return 0
    starts = np.cumsum([0, *(h.rows for h in holders)], dtype=np.int64)
    k = np.searchsorted(starts, placed, side="right") - 1
    counts = np.bincount(k, minlength=len(holders))
    shares = (h.bytes * int(c) // max(1, h.rows) for h, c in zip(holders, counts, strict=True))
    return int(sum(shares))


def resolve(
    table: pa.Table,
    holders: Sequence[TextHolder],
    read_text: Callable[[TextHolder, int, int], pa.ChunkedArray | pa.Array],
    what: str,
) -> tuple[pa.Table, np.ndarray]:
    """`table` (read with its `TEXT_AT` column) with every row's text in place and
    `TEXT_AT` gone, and the rows' places among `holders` (-1: the shard holds it).
    `read_text(holder, lo, hi)` reads rows [lo, hi) of a holder's text, verified."""
    at = np.asarray(pc.fill_null(table[TEXT_AT], -1)).astype(np.int64)
    table = table.drop_columns([TEXT_AT])
    i = table.schema.get_field_index(TEXT)
    field = table.schema.field(i)
    placed = at >= 0
    if placed.any():
        starts = np.cumsum([0, *(h.rows for h in holders)], dtype=np.int64)
        if at[placed].max() >= starts[-1]:
            raise ValueError(f"{what}: a row's text is at {at.max()}, past its holders' rows")
        k = np.searchsorted(starts, at[placed], side="right") - 1
        rows = np.flatnonzero(placed)
        pieces: list[pa.ChunkedArray] = []  # each holder's rows, in the order k lists them
        for h in np.unique(k):
            local = at[placed][k == h] - starts[h]
            lo, hi = int(local.min()), int(local.max()) + 1
            got = read_text(holders[h], lo, hi)
            got = got if isinstance(got, pa.ChunkedArray) else pa.chunked_array([got])
            pieces.append(_rows_of(got, local - lo))
        chunks = [c for piece in pieces for c in piece.chunks]
        if placed.all() and np.all(np.diff(k) >= 0):  # the holders' rows one after another
            text = pa.chunked_array(chunks, type=field.type)
        else:  # rows held here among them: each row taken from where it is
            take = np.arange(table.num_rows, dtype=np.int64)
            order = np.argsort(k, kind="stable")  # the pieces' rows, in the pieces' order
            take[rows[order]] = table.num_rows + np.arange(len(order), dtype=np.int64)
            own = list(table[TEXT].chunks)
            text = _rows_of(pa.chunked_array([*own, *chunks], type=field.type), take)
        if text.null_count:
            raise ValueError(f"{what}: a row's text is null in the shard it names as holding it")
        table = table.set_column(i, field.with_nullable(False), text)
    else:
        table = table.set_column(i, field.with_nullable(False), table[TEXT])
    return table, at


# a holder's rows are sliced (no copy) while they fall in at most one run per this many rows,
# else taken (one copy): a gate that drops a few rows leaves a few long runs
_ROWS_PER_RUN = 16


def _rows_of(text: pa.ChunkedArray, rows: np.ndarray) -> pa.ChunkedArray:
    """`text`'s `rows`, in that order: its slices where the rows come in long runs (the rows
    of a holder that later gates dropped a few from), else one take."""
    if len(rows) == len(text) and not np.any(np.diff(rows) != 1):
        return text
    breaks = np.flatnonzero(np.diff(rows) != 1) + 1
    if (len(breaks) + 1) * _ROWS_PER_RUN > len(rows):
        return text.take(pa.array(rows))
    starts = np.concatenate(([0], breaks))
    ends = np.concatenate((breaks, [len(rows)]))
    runs = [text.slice(int(rows[a]), int(b - a)) for a, b in zip(starts, ends, strict=True)]
    return pa.chunked_array([c for run in runs for c in run.chunks], type=text.type)


def by_reference(
    out: pa.Table, source: pa.Table, places: TextPlaces
) -> tuple[pa.Table, list[TextHolder], np.ndarray]:
    """A gate's kept rows `out` as they are written: the text of each row whose text is its
    input row's (in `source`, held where `places` says) left null, and `TEXT_AT` added with
    its place; with the holders those places are in and each row's place (-1: written)."""
    n = out.num_rows
    at = np.full(n, -1, dtype=np.int64)
    if n and TEXT in source.column_names and (places.at >= 0).any():
        idx = pc.index_in(out[KEY], value_set=source[KEY])
        found = np.asarray(pc.is_valid(idx)).astype(bool)
        if found.any():
            rows = np.flatnonzero(found)
            src = np.asarray(pc.fill_null(idx, 0)).astype(np.int64)[rows]
            mine, theirs = pa.array(rows), pa.array(src)
            same = pc.and_(
                pc.equal(out[CONTENT_HASH].take(mine), source[CONTENT_HASH].take(theirs)),
                pc.equal(
                    pc.binary_length(out[TEXT]).take(mine),
                    pc.binary_length(source[TEXT]).take(theirs),
                ),
            )
            same_rows = np.asarray(pc.fill_null(same, False)).astype(bool)
            at[rows[same_rows]] = places.at[src[same_rows]]
    holders, at = compact(places.holders, at)
    placed = at >= 0
    i = out.schema.get_field_index(TEXT)
    field = out.schema.field(i).with_nullable(True)
    text = out[TEXT]
    if placed.any():
        text = pc.if_else(pa.array(placed), pa.nulls(n, field.type), text)
    written = out.set_column(i, field, text).append_column(
        pa.field(TEXT_AT, pa.int64()), pa.array(np.where(placed, at, 0), mask=~placed)
    )
    return written, holders, at


def after_write(holders: Sequence[TextHolder], at: np.ndarray, written: TextHolder) -> TextPlaces:
    """The places of rows just written as one shard (`by_reference`'s holders and places;
    `written`: that shard), for the next gate of a pass to reference."""
    whole = [*holders, written]
    base = sum(h.rows for h in holders)
    own = base + np.arange(len(at), dtype=np.int64)
    return TextPlaces(tuple(whole), np.where(at >= 0, at, own))
