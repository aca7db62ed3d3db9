"""Builds the batches an epoch plan lays out, a block at a time: a batch inside one mapped
row group is a slice of it (copied unless `copy=False`); one that straddles row groups or
lacks a column is filled run by run. Each block carries its receipts as columns."""

from __future__ import annotations

import itertools
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from megacpp_pipeline.loader.cache import RowGroupCache
from megacpp_pipeline.loader.manifest import Shard
from megacpp_pipeline.loader.planning import BlockLayout, EpochPlan, EpochPlanner, block_edges
from megacpp_pipeline.loader.prefetch import Blocks, Progress
from megacpp_pipeline.loader.receipts import BlockReceipts
from megacpp_pipeline.snapshot.packed_rows import OPTIONAL_TOKEN_COLUMNS, packed_rows_schema

# Batches are built and handed over in blocks: one hand-off between threads costs two
# thread switches (tens of microseconds), as much as building a whole 8 x 2048 batch. A
# block holds up to _BLOCK_BYTES of batches (at most _BLOCK_BATCHES): larger blocks keep more
# freshly written memory alive at once, and copying into memory that is no longer in the
# CPU cache costs more than the hand-offs saved. Blocks start at one batch and double, so
# the first batch of a pass is not held back.
_BLOCK_BYTES = 512 << 10
_BLOCK_BATCHES = 64
_CHUNK_BATCHES = 4096  # batches laid out per numpy pass: bounds the plain lists on long epochs


def column_layout(column: pa.DataType, seq_len: int) -> tuple[np.dtype[Any], tuple[int, ...]]:
    """numpy dtype and per-row shape of a packed-row column."""
    if pa.types.is_fixed_size_list(column):
        return np.dtype(column.value_type.to_pandas_dtype()), (seq_len,)
    return np.dtype(column.to_pandas_dtype()), ()


class BatchBuilder:
    """This rank's batches, as dicts column -> array, built from the row-group cache in
    blocks of 1, 2, 4, ... up to `block_batches` batches (`_BLOCK_BYTES` at most)."""

    def __init__(
        self,
        planner: EpochPlanner,
        cache: RowGroupCache,
        shards: Sequence[Shard],
        columns: Sequence[str],
        *,
        seq_len: int,
        batch_size: int,
        copy: bool,
        torch: Any,  # the torch module when tensors are asked for, else None
        pin: bool,
    ) -> None:
        self._planner = planner
        self._cache = cache
        self._shards = shards
        self._columns = tuple(columns)
        self._copy = copy
        self._torch = torch
        self._pin = pin
        self._defaults = {
            name: np.full(seq_len, default, dtype=dtype.to_pandas_dtype())
            for name, (dtype, default) in OPTIONAL_TOKEN_COLUMNS.items()
        }
        schema = packed_rows_schema(seq_len)
        self._layouts = [column_layout(schema.field(name).type, seq_len) for name in self._columns]
        row_bytes = sum(dtype.itemsize * int(np.prod(tail)) for dtype, tail in self._layouts)
        self.block_batches = max(
            1, min(_BLOCK_BATCHES, _BLOCK_BYTES // max(1, row_bytes * batch_size))
        )

    def blocks(self, plan: EpochPlan, progress: Progress | None) -> Blocks:
        """This rank's batches of the plan, in blocks of 1, 2, 4, ... up to `block_batches`.

        If building a block fails, the batches completed before the failure are handed out
        first and the error follows them.
        """
        edges = block_edges(len(plan.starts), self.block_batches)
        # blocks are laid out a chunk at a time, so a long epoch never becomes long lists
        chunk_edges = edges[:: max(1, _CHUNK_BATCHES // self.block_batches)].tolist()
        if chunk_edges[-1] != edges[-1]:
            chunk_edges.append(int(edges[-1]))
        for lo, hi in itertools.pairwise(chunk_edges):
            layout = self._planner.lay_out(plan, edges[(edges >= lo) & (edges <= hi)])
            for index in range(len(layout.block_edges) - 1):
                batches, block, error = self._build_block(plan, layout, index, progress)
                if batches:
                    yield batches, block
                if error is not None:
                    raise error

    def _build_block(
        self, plan: EpochPlan, layout: BlockLayout, index: int, progress: Progress | None
    ) -> tuple[list[dict[str, Any]], BlockReceipts, Exception | None]:
        """One block of batches: a slice of the mapped row group, copied unless `copy=False`,
        for a batch inside one row group (nearly all of them); a fresh buffer filled run by
        run for one that straddles row groups or lacks a column. Also returns the error that
        stopped it early, if any: the batches before it are complete."""
        clock = time.perf_counter
        first, end = layout.block_edges[index], layout.block_edges[index + 1]
        count = end - first
        block = BlockReceipts(
            epoch=plan.epoch,
            first_batch=plan.first_batch + layout.first_batch + first,
            rows=layout.batch_rows[first:end],
            row_groups=layout.batch_row_groups[first:end],
            read_s=[0.0] * count,
            decode_s=[0.0] * count,
            normalize_s=[0.0] * count,
            stage_s=[0.0] * count,
            cache_misses=[0] * count,
            defaulted=layout.batch_defaulted[first:end] if layout.batch_defaulted else None,
        )
        copy, to_tensors, columns = self._copy, self._torch is not None, self._columns
        # plain Python locals from here: the loop runs once per batch
        plain, batch_runs = layout.batch_plain, layout.batch_runs
        run_unit, run_lo, run_hi = layout.run_unit, layout.run_lo, layout.run_hi
        read_s, decode_s, stage_s = block.read_s, block.decode_s, block.stage_s
        single = columns[0] if len(columns) == 1 else None
        batches: list[dict[str, Any]] = []
        open_unit = -1
        named: list[tuple[str, np.ndarray]] = []
        array = np.empty(0)
        for k in range(count):
            batch = first + k
            try:
                if not plain[batch]:
                    started = clock()
                    out = self._filled(plan, layout, batch, block, k, progress)
                    open_unit = -1
                else:
                    run = batch_runs[batch]
                    if run_unit[run] != open_unit:
                        started = clock()
                        views, decoded, missed = self._cache.views(
                            self._shards[layout.run_shard[run]], layout.run_group[run]
                        )
                        read_s[k] = clock() - started - decoded
                        decode_s[k] = decoded
                        block.cache_misses[k] = int(missed)
                        named = [(name, views[name]) for name in columns]
                        array = named[0][1]
                        open_unit = run_unit[run]
                        if progress is not None:
                            progress.advance(open_unit)
                    lo, hi = run_lo[run], run_hi[run]
                    started = clock()
                    if single is not None:
                        out = {single: array[lo:hi].copy() if copy else array[lo:hi]}
                    elif copy:
                        out = {name: source[lo:hi].copy() for name, source in named}
                    else:
                        out = {name: source[lo:hi] for name, source in named}
                if to_tensors:
                    out = self._tensors(out)
                stage_s[k] += clock() - started
            except Exception as exc:
                return batches, block, exc
            batches.append(out)
        return batches, block, None

    def _filled(
        self,
        plan: EpochPlan,
        layout: BlockLayout,
        batch: int,
        block: BlockReceipts,
        k: int,
        progress: Progress | None,
    ) -> dict[str, np.ndarray]:
        """A batch copied run by run into fresh arrays, defaults where a shard lacks a column.

        The read, decode and default-fill time go to their own receipt fields; the caller
        counts the whole call as staging, so those are taken back out here.
        """
        clock = time.perf_counter
        rows = layout.batch_rows[batch]
        out = {
            name: np.empty((rows, *tail), dtype)
            for name, (dtype, tail) in zip(self._columns, self._layouts, strict=True)
        }
        for run in range(layout.batch_runs[batch], layout.batch_runs[batch + 1]):
            lo, hi = layout.run_lo[run], layout.run_hi[run]
            started = clock()
            views, decode_s, missed = self._cache.views(
                self._shards[layout.run_shard[run]], layout.run_group[run]
            )
            read_s = clock() - started
            block.read_s[k] += read_s - decode_s
            block.decode_s[k] += decode_s
            block.cache_misses[k] += missed
            block.stage_s[k] -= read_s
            if progress is not None:
                progress.advance(layout.run_unit[run])
            into = slice(layout.run_row[run], layout.run_row[run] + hi - lo)
            for name, array in out.items():
                source = views.get(name)
                if source is None:
                    started = clock()
                    array[into] = self._defaults[name]
                    filling = clock() - started
                    block.normalize_s[k] += filling
                    block.stage_s[k] -= filling
                else:
                    array[into] = source[lo:hi]
        return out

    def _tensors(self, batch: dict[str, Any]) -> dict[str, Any]:
        tensors = {name: self._torch.from_numpy(array) for name, array in batch.items()}
        if self._pin:
            tensors = {name: tensor.pin_memory() for name, tensor in tensors.items()}
        return tensors
