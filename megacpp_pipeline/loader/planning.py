"""Which rows each batch of an epoch holds, decided with numpy before any is read: a seeded
order of whole row groups (the unit of shuffling), disjoint per-rank slices of every global
batch of `batch_size * world_size` rows, and the runs each block of batches is cut from."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from megacpp_pipeline.loader.manifest import Shard


@dataclass(frozen=True)
class EpochPlan:
    """This rank's batches of one epoch as row ranges of the shuffled row-group stream."""

    epoch: int
    first_batch: int
    order: np.ndarray  # plan position -> row-group unit
    offsets: np.ndarray  # first stream row of each plan position, plus the total
    starts: np.ndarray  # per batch: first stream row
    stops: np.ndarray
    first_unit: np.ndarray  # per batch: plan positions it spans
    last_unit: np.ndarray


@dataclass(slots=True)
class BlockLayout:
    """Where the rows of a stretch of blocks come from, as plain lists: the producer's inner
    loop reads them once per batch. A run is the rows of one batch inside one row group; a
    batch is one run unless it straddles row groups."""

    first_batch: int  # counted from the plan's first batch
    block_edges: list[int]  # first batch of each block (from first_batch), plus the end
    batch_runs: list[int]  # first run of each batch, plus the end
    batch_plain: list[bool]  # one run and no defaulted column: a slice of one row group
    batch_rows: list[int]
    batch_row_groups: list[int]
    batch_defaulted: list[tuple[str, ...]] | None  # None: no batch has a defaulted column
    run_unit: list[int]  # plan position the run reads
    run_shard: list[int]
    run_group: list[int]
    run_lo: list[int]  # rows lo..hi of that row group
    run_hi: list[int]
    run_row: list[int]  # the batch row it starts at


def within(counts: np.ndarray) -> np.ndarray:
    """0, 1, ..., count - 1 for each count, concatenated."""
    return np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts)


def block_edges(batches: int, largest: int) -> np.ndarray:
    """First batch of every block, plus the end: blocks of 1, 2, 4, ... then `largest`."""
    ramp = [0]
    while ramp[-1] < batches and 1 << (len(ramp) - 1) < largest:
        ramp.append(ramp[-1] + (1 << (len(ramp) - 1)))
    rest = np.arange(ramp[-1] + largest, batches, largest)
    return np.unique(np.minimum(np.concatenate([ramp, rest, [batches]]), batches))


class EpochPlanner:
    """One rank's share of a split, epoch by epoch.

    The split's non-empty row groups, in manifest order, are the units; an epoch reads them
    in `row_group_order(epoch)` as one stream of rows. Global batch g is stream rows
    `[g * B * W, (g + 1) * B * W)` (B = batch_size, W = world_size); rank r takes the B rows
    starting at `g * B * W + r * B`. So ranks are disjoint, and a rank's batch g depends
    only on (seed, epoch, g): resuming at any batch needs nothing but its index.
    """

    def __init__(
        self,
        shards: Sequence[Shard],
        columns: Sequence[str],
        *,
        batch_size: int,
        rank: int,
        world_size: int,
        drop_last: bool,
        shuffle: bool,
        seed: int,
    ) -> None:
        self._shards = shards
        self._columns = tuple(columns)
        self._batch_size = batch_size
        self._rank = rank
        self._world_size = world_size
        self._shuffle = shuffle
        self._seed = seed
        # per shard: the requested columns it lacks, which then get their defaults
        self._defaulted = [
            tuple(name for name in self._columns if name not in shard.columns) for shard in shards
        ]
        unit_shard, unit_group, unit_rows = [], [], []
        for index, shard in enumerate(shards):
            for group, group_rows in enumerate(shard.row_group_rows):
                if group_rows:
                    unit_shard.append(index)
                    unit_group.append(group)
                    unit_rows.append(group_rows)
        self._unit_shard = np.array(unit_shard, dtype=np.int64)
        self._unit_group = np.array(unit_group, dtype=np.int64)
        self._unit_rows = np.array(unit_rows, dtype=np.int64)
        # (shard sha256, row group) of every unit: the row-group cache's keys
        self.unit_keys = [
            (shards[shard].sha256, group)
            for shard, group in zip(unit_shard, unit_group, strict=True)
        ]
        self.total_rows = int(self._unit_rows.sum())
        global_batch = batch_size * world_size
        full, rest = divmod(self.total_rows, global_batch)
        # with drop_last=False the last global batch is short, and reaches only some ranks
        self.batches = full if drop_last else full + (1 if rest > rank * batch_size else 0)

    def row_group_order(self, epoch: int) -> np.ndarray:
        """Indices of the split's row groups in the order this epoch reads them."""
        if not self._shuffle:
            return np.arange(len(self._unit_rows))
        return np.random.default_rng([self._seed, epoch]).permutation(len(self._unit_rows))

    def plan(self, epoch: int, first_batch: int) -> EpochPlan:
        """This rank's batches `first_batch..` of `epoch`."""
        order = self.row_group_order(epoch)
        offsets = np.concatenate([[0], np.cumsum(self._unit_rows[order])])
        starts = (
            np.arange(first_batch, self.batches, dtype=np.int64)
            * self._batch_size
            * self._world_size
            + self._rank * self._batch_size
        )
        stops = np.minimum(starts + self._batch_size, self.total_rows)
        return EpochPlan(
            epoch=epoch,
            first_batch=first_batch,
            order=order,
            offsets=offsets,
            starts=starts,
            stops=stops,
            first_unit=np.searchsorted(offsets, starts, side="right") - 1,
            last_unit=np.searchsorted(offsets, stops - 1, side="right") - 1,
        )

    def warm_targets(self, plan: EpochPlan) -> list[tuple[Shard, int, int]]:
        """(shard, row group, plan position) of every row group this rank reads, in order."""
        counts = plan.last_unit - plan.first_unit + 1
        positions = np.unique(np.repeat(plan.first_unit, counts) + within(counts))
        chosen = plan.order[positions]
        return [
            (self._shards[shard], group, position)
            for shard, group, position in zip(
                self._unit_shard[chosen].tolist(),
                self._unit_group[chosen].tolist(),
                positions.tolist(),
                strict=True,
            )
        ]

    def lay_out(self, plan: EpochPlan, edges: np.ndarray) -> BlockLayout:
        """The runs of the batches between `edges`, found with numpy for all of them at once."""
        first_batch, end_batch = int(edges[0]), int(edges[-1])
        batches = slice(first_batch, end_batch)
        starts, stops = plan.starts[batches], plan.stops[batches]
        first, last = plan.first_unit[batches], plan.last_unit[batches]
        counts = last - first + 1  # row groups per batch
        run_batch = np.repeat(np.arange(len(starts)), counts)
        unit = np.repeat(first, counts) + within(counts)
        base = plan.offsets[unit]
        lo = np.maximum(starts[run_batch], base) - base
        hi = np.minimum(stops[run_batch], plan.offsets[unit + 1]) - base
        batch_runs = np.concatenate([[0], np.cumsum(counts)])
        run_row = np.concatenate([[0], np.cumsum(hi - lo)])[:-1]
        run_row -= run_row[batch_runs[:-1]][run_batch]
        defaulted = None
        if any(self._defaulted):
            shards = self._unit_shard[plan.order].tolist()
            defaulted = []
            for a, b in zip(first.tolist(), last.tolist(), strict=True):
                lacking = {n for u in range(a, b + 1) for n in self._defaulted[shards[u]]}
                defaulted.append(tuple(n for n in self._columns if n in lacking))
        units = plan.order[unit]
        plain = counts == 1
        if defaulted is not None:
            plain &= np.array([not d for d in defaulted], dtype=bool)
        return BlockLayout(
            first_batch=first_batch,
            block_edges=(edges - first_batch).tolist(),
            batch_runs=batch_runs.tolist(),
            batch_plain=plain.tolist(),
            batch_rows=(stops - starts).tolist(),
            batch_row_groups=counts.tolist(),
            batch_defaulted=defaulted,
            run_unit=unit.tolist(),
            run_shard=self._unit_shard[units].tolist(),
            run_group=self._unit_group[units].tolist(),
            run_lo=lo.tolist(),
            run_hi=hi.tolist(),
            run_row=run_row.tolist(),
        )
